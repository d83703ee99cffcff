//! Local stand-ins for the cloud endpoints, each answering after a fixed delay (the issue's
//! 200 ms) and counting the credential calls it serves: AWS STS `AssumeRole` (plain HTTP at
//! `AWS_ENDPOINT_URL_STS`), the GCE metadata server's token (plain HTTP at
//! `GCE_METADATA_HOST`), and Entra ID's token endpoint (HTTPS at `AZURE_AUTHORITY_HOST`, with a
//! throwaway CA the broker trusts through `SSL_CERT_FILE`). Token lifetimes are adjustable
//! while running, so one fake serves both the cold-start and the fast-clock steady-state runs.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;

/// Which cloud endpoint a fake plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sts,
    Metadata,
    Entra,
}

/// A running fake; stops when the runtime it was started on shuts down.
#[derive(Debug)]
pub struct Fake {
    pub addr: SocketAddr,
    /// PEM of the CA that signed the fake's certificate (Entra only).
    pub ca_pem: Option<String>,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    kind: Kind,
    calls: AtomicU64,
    delay_ms: AtomicU64,
    lifetime_s: AtomicU64,
}

impl Fake {
    /// Starts on 127.0.0.1 (an ephemeral port) on the current tokio runtime.
    pub async fn start(kind: Kind, delay: Duration, lifetime: Duration) -> Fake {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("bind a fake upstream on 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            kind,
            calls: AtomicU64::new(0),
            delay_ms: AtomicU64::new(delay.as_millis() as u64),
            lifetime_s: AtomicU64::new(lifetime.as_secs()),
        });
        let (ca_pem, tls) = if kind == Kind::Entra {
            let (ca, config) = credbroker_tests::tls_config();
            (Some(ca), Some(tokio_rustls::TlsAcceptor::from(config)))
        } else {
            (None, None)
        };
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = Arc::clone(&st);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let st = Arc::clone(&st);
                        async move { Ok::<_, Infallible>(st.answer(req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Fake {
            addr,
            ca_pem,
            state,
        }
    }

    /// Credential calls answered so far (AssumeRole, metadata token, Entra token).
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::SeqCst)
    }

    pub fn reset_calls(&self) {
        self.state.calls.store(0, Ordering::SeqCst);
    }

    /// Lifetime of the credentials issued from now on.
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.state
            .lifetime_s
            .store(lifetime.as_secs(), Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }
}

type Response = hyper::Response<Full<Bytes>>;

impl State {
    async fn answer(&self, req: hyper::Request<hyper::body::Incoming>) -> Response {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let flavor = req
            .headers()
            .get("metadata-flavor")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        let is_credential_call = match self.kind {
            Kind::Sts => method == hyper::Method::POST && body.contains("Action=AssumeRole"),
            Kind::Metadata => {
                method == hyper::Method::GET
                    && path == "/computeMetadata/v1/instance/service-accounts/default/token"
                    && flavor.as_deref() == Some("Google")
            }
            Kind::Entra => method == hyper::Method::POST && path.ends_with("/oauth2/v2.0/token"),
        };
        if !is_credential_call {
            return reply(404, "text/plain", "not found".into());
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))).await;
        let life = self.lifetime_s.load(Ordering::SeqCst);
        match self.kind {
            Kind::Sts => reply(200, "text/xml", assume_role_ok(n, life)),
            Kind::Metadata => reply(
                200,
                "application/json",
                serde_json::json!({"access_token": format!("ya29.bench-{n}"), "expires_in": life, "token_type": "Bearer"})
                    .to_string(),
            ),
            Kind::Entra => reply(
                200,
                "application/json",
                serde_json::json!({"token_type": "Bearer", "expires_in": life, "ext_expires_in": life,
                                   "access_token": format!("entra-bench-{n}")})
                .to_string(),
            ),
        }
    }
}

fn reply(status: u16, content_type: &str, body: String) -> Response {
    hyper::Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("response")
}

fn assume_role_ok(n: u64, life_s: u64) -> String {
    let expiration = time::OffsetDateTime::now_utc() + Duration::from_secs(life_s);
    let expiration = expiration
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format");
    format!(
        r#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <AssumedRoleId>AROABENCH:credbroker</AssumedRoleId>
      <Arn>arn:aws:sts::111122223333:assumed-role/kueue/credbroker</Arn>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIABENCH{n:011}</AccessKeyId>
      <SecretAccessKey>bench-secret-{n}</SecretAccessKey>
      <SessionToken>bench-session-token-{n}</SessionToken>
      <Expiration>{expiration}</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>req-{n}</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#
    )
}
