//! Local stand-ins for the cloud endpoints, each answering after a fixed delay (the issue's
//! 200 ms) and counting the credential calls it serves: AWS STS `AssumeRole` (plain HTTP at
//! `AWS_ENDPOINT_URL_STS`), the GCE metadata server's token (plain HTTP at
//! `GCE_METADATA_HOST`), and Entra ID's token endpoint (HTTPS at `AZURE_AUTHORITY_HOST`, with a
//! throwaway CA the broker trusts through `SSL_CERT_FILE`). Token lifetimes are adjustable
//! while running, so one fake serves both the cold-start and the fast-clock steady-state runs.
//!
//! The scenarios see only [`Clouds`]: the three fakes, their call counts and the broker
//! environment that points at them. What listens is [`server`], behind the one `use` below.

mod server;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

// The listener under the fakes: the test harness's `FakeHttps` is to replace it (server.rs).
use server::{Handler, Listening, Reply, Scheme, Seen, spawn};

/// The three fake clouds a run's brokers are pointed at.
#[derive(Debug)]
pub struct Clouds {
    pub sts: Fake,
    pub metadata: Fake,
    pub entra: Fake,
}

impl Clouds {
    /// Starts all three on the current tokio runtime, answering after `delay` with
    /// credentials that live `lifetime`.
    pub async fn start(delay: Duration, lifetime: Duration) -> Clouds {
        Clouds {
            sts: Fake::start(Kind::Sts, delay, lifetime).await,
            metadata: Fake::start(Kind::Metadata, delay, lifetime).await,
            entra: Fake::start(Kind::Entra, delay, lifetime).await,
        }
    }

    /// Zeroes the call counts; credentials issued from now on live `lifetime`.
    pub fn reset(&self, lifetime: Duration) {
        for f in [&self.sts, &self.metadata, &self.entra] {
            f.reset_calls();
            f.set_lifetime(lifetime);
        }
    }

    /// Credential calls served: (AssumeRole, metadata token, Entra token).
    pub fn calls(&self) -> (u64, u64, u64) {
        (self.sts.calls(), self.metadata.calls(), self.entra.calls())
    }

    /// The CAs the broker must trust to reach the TLS fakes, as one PEM bundle.
    pub fn ca_bundle(&self) -> String {
        [&self.sts, &self.metadata, &self.entra]
            .iter()
            .filter_map(|f| f.listening.ca_pem.as_deref())
            .collect()
    }

    /// The variables that point each cloud's client at its fake; `ca_file` holds
    /// [`Clouds::ca_bundle`].
    pub fn endpoint_env(&self, ca_file: &Path) -> [(&'static str, String); 4] {
        [
            ("AWS_ENDPOINT_URL_STS", self.sts.url()),
            ("GCE_METADATA_HOST", self.metadata.host()),
            ("AZURE_AUTHORITY_HOST", self.entra.url()),
            ("SSL_CERT_FILE", ca_file.display().to_string()),
        ]
    }
}

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
    listening: Listening,
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
        let state = Arc::new(State {
            kind,
            calls: AtomicU64::new(0),
            delay_ms: AtomicU64::new(delay.as_millis() as u64),
            lifetime_s: AtomicU64::new(lifetime.as_secs()),
        });
        let scheme = match kind {
            Kind::Entra => Scheme::Https,
            Kind::Sts | Kind::Metadata => Scheme::Http,
        };
        let st = Arc::clone(&state);
        let handler: Handler = Arc::new(move |seen| {
            let st = Arc::clone(&st);
            Box::pin(async move { st.answer(&seen).await })
        });
        Fake {
            listening: spawn(scheme, handler).await,
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
        self.listening.url()
    }

    /// `host:port`, as `GCE_METADATA_HOST` takes it.
    pub fn host(&self) -> String {
        self.listening.addr.to_string()
    }
}

impl State {
    async fn answer(&self, req: &Seen) -> Reply {
        let is_credential_call = match self.kind {
            Kind::Sts => req.method == "POST" && req.body.contains("Action=AssumeRole"),
            Kind::Metadata => {
                req.method == "GET"
                    && req.path == "/computeMetadata/v1/instance/service-accounts/default/token"
                    && req.headers.get("metadata-flavor").map(String::as_str) == Some("Google")
            }
            Kind::Entra => req.method == "POST" && req.path.ends_with("/oauth2/v2.0/token"),
        };
        if !is_credential_call {
            return (404, "text/plain", "not found".into());
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))).await;
        let life = self.lifetime_s.load(Ordering::SeqCst);
        match self.kind {
            Kind::Sts => (200, "text/xml", assume_role_ok(n, life)),
            Kind::Metadata => (
                200,
                "application/json",
                serde_json::json!({"access_token": format!("ya29.bench-{n}"), "expires_in": life, "token_type": "Bearer"})
                    .to_string(),
            ),
            Kind::Entra => (
                200,
                "application/json",
                serde_json::json!({"token_type": "Bearer", "expires_in": life, "ext_expires_in": life,
                                   "access_token": format!("entra-bench-{n}")})
                .to_string(),
            ),
        }
    }
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
