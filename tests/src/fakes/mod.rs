//! Local stand-ins for the upstreams the broker reaches, each checking what it receives.
//!
//! [`FakeHttps`] is the one server they share: HTTPS on 127.0.0.1 with a CA generated per
//! fake (or plain HTTP, for endpoints clients reach over `http://`), every request recorded
//! as a [`Seen`] and answered by a handler's [`Reply`]. On it:
//!
//! - [`sts`]: AWS STS replies, moto's STS server, botocore's SigV4 check, EKS token checks;
//! - [`gce_metadata`]: the GCE metadata server and Google's OAuth2 token, STS and IAM
//!   endpoints, with RS256 assertions verified against the key;
//! - [`entra`]: Entra ID's token endpoint and the App Service managed identity route;
//! - [`apiserver`]: a Kubernetes API server that checks bearer tokens.
//!
//! [`kube_api`] (list and watch of Secrets, stopped and restarted on its port) streams its
//! watch responses, so it keeps an accept loop of its own on the same [`tls_config`].
//!
//! None of this is test-only: the bench drives its fakes through the same API.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

pub mod apiserver;
pub mod entra;
pub mod gce_metadata;
pub mod kube_api;
pub mod sts;

/// A CA and a server certificate for 127.0.0.1/localhost signed by it: (CA PEM, TLS config)
/// for the tests' fake HTTPS endpoints (ring: the tests' own crypto, not the broker's).
pub fn tls_config() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "credbroker e2e CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("server params");
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params
        .distinguished_name
        .push(DnType::CommonName, "fake-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = params
        .signed_by(&server_key, &issuer)
        .expect("sign server cert");

    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        server_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![server_cert.der().clone()], key)
    .expect("server cert");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca_cert.pem(), Arc::new(config))
}

/// Serves HTTPS (HTTP/1.1) on `listener` until `shutdown` fires, answering every request
/// with `handler`: the accept loop of every TLS fake.
pub async fn serve_tls<H, F>(
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: tokio::sync::oneshot::Receiver<()>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    serve(listener, Some(tls), shutdown, handler).await;
}

/// [`serve_tls`], or plain HTTP/1.1 when `tls` is `None`.
async fn serve<H, F>(
    listener: std::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match acceptor {
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let _ = http.serve_connection(TokioIo::new(tls), service).await;
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------
// FakeHttps
// ---------------------------------------------------------------------------------------

/// One request a [`FakeHttps`] received, and the status it answered.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The path and the query, as sent.
    pub path_and_query: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// Headers, names lower-cased (a repeated header keeps its last value).
    pub headers: BTreeMap<String, String>,
    /// The body, as text.
    pub body: String,
    /// The status the handler answered.
    pub status: u16,
}

impl Seen {
    /// The body as `application/x-www-form-urlencoded` fields.
    pub fn form(&self) -> BTreeMap<String, String> {
        parse_form(&self.body)
    }

    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// Header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The token of an `Authorization: Bearer` header.
    pub fn bearer(&self) -> Option<&str> {
        self.header("authorization")?.strip_prefix("Bearer ")
    }
}

/// What a [`FakeHttps`] handler answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body text.
    pub body: String,
    /// Extra headers; without a `content-type` among them, a body starting with `<` is
    /// `text/xml`, any other `application/json`.
    pub headers: Vec<(String, String)>,
    /// Answer after this long (asynchronously: other requests are served meanwhile).
    pub delay: Duration,
}

impl Reply {
    /// `status` with `body`.
    pub fn new(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            body: body.into(),
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// `status` with a JSON body.
    pub fn json(status: u16, body: &Value) -> Reply {
        Reply::new(status, body.to_string())
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Answers after `delay`.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

impl From<(u16, String)> for Reply {
    fn from((status, body): (u16, String)) -> Reply {
        Reply::new(status, body)
    }
}

impl From<(u16, Value)> for Reply {
    fn from((status, body): (u16, Value)) -> Reply {
        Reply::json(status, &body)
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// An HTTPS endpoint on 127.0.0.1 with a CA of its own, answering every request with a
/// handler and recording it; stops (and joins its thread) on drop.
///
/// The handler runs on a blocking thread, so it may block (run openssl, read files); a
/// [`Reply::after`] delay is waited asynchronously. The server runs on a thread and runtime
/// of its own, so it serves synchronous tests, `#[tokio::test]`s and the bench alike.
pub struct FakeHttps {
    addr: SocketAddr,
    url: String,
    ca_pem: Option<String>,
    seen: Arc<Mutex<Vec<Seen>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeHttps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeHttps")
            .field("url", &self.url())
            .field("requests", &self.seen.lock().map(|s| s.len()).unwrap_or(0))
            .finish_non_exhaustive()
    }
}

impl FakeHttps {
    /// HTTPS on 127.0.0.1 (an ephemeral port), certificate for `127.0.0.1` and `localhost`
    /// signed by a fresh CA ([`FakeHttps::ca_pem`]).
    pub fn spawn<R: Into<Reply>>(
        handler: impl Fn(&Seen) -> R + Send + Sync + 'static,
    ) -> FakeHttps {
        let (ca_pem, tls) = tls_config();
        FakeHttps::start(Some((ca_pem, tls)), handler)
    }

    /// The same fake over plain HTTP, for endpoints clients reach with `http://` (the GCE
    /// metadata server, loopback token URLs in credential files, STS for the bench).
    pub fn spawn_plain<R: Into<Reply>>(
        handler: impl Fn(&Seen) -> R + Send + Sync + 'static,
    ) -> FakeHttps {
        FakeHttps::start(None, handler)
    }

    fn start<R: Into<Reply>>(
        tls: Option<(String, Arc<rustls::ServerConfig>)>,
        handler: impl Fn(&Seen) -> R + Send + Sync + 'static,
    ) -> FakeHttps {
        let handler: Handler = Arc::new(move |seen| handler(seen).into());
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let (ca_pem, tls) = match tls {
            Some((ca, config)) => (Some(ca), Some(config)),
            None => (None, None),
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread_seen = Arc::clone(&seen);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(serve(listener, tls, rx, move |req| {
                let handler = Arc::clone(&handler);
                let seen = Arc::clone(&thread_seen);
                async move { answer(req, handler, &seen).await }
            }));
        });
        let url = format!(
            "{}://{addr}",
            if ca_pem.is_some() { "https" } else { "http" }
        );
        FakeHttps {
            addr,
            url,
            ca_pem,
            seen,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// `https://127.0.0.1:<port>` (`http://` for [`FakeHttps::spawn_plain`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM of the CA that signed the server certificate (empty for a plain fake).
    pub fn ca_pem(&self) -> &str {
        self.ca_pem.as_deref().unwrap_or_default()
    }

    /// The CA as `<dir>/fake-ca.pem`, for a client's `SSL_CERT_FILE` or a kubeconfig.
    pub fn ca_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("fake-ca.pem");
        std::fs::write(&path, self.ca_pem()).expect("write the fake's CA");
        path
    }

    /// Every request answered so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for FakeHttps {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn answer(
    req: Request<Incoming>,
    handler: Handler,
    seen: &Mutex<Vec<Seen>>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let mut request = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default(),
        query: parse_form(parts.uri.query().unwrap_or("")),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    v.to_str().unwrap_or("").to_owned(),
                )
            })
            .collect(),
        body,
        status: 0,
    };
    // The handler may block (it runs openssl): keep it off the runtime's thread.
    let r = request.clone();
    let reply = tokio::task::spawn_blocking(move || handler(&r))
        .await
        .unwrap_or_else(|_| Reply::json(500, &serde_json::json!({"error": "handler panicked"})));
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    request.status = reply.status;
    seen.lock().expect("lock").push(request);
    let mut response = Response::builder().status(reply.status);
    if !reply
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        let content_type = if reply.body.starts_with('<') {
            "text/xml"
        } else {
            "application/json"
        };
        response = response.header("content-type", content_type);
    }
    for (k, v) in &reply.headers {
        response = response.header(k, v);
    }
    response
        .body(Full::new(Bytes::from(reply.body)))
        .expect("response")
}

/// `application/x-www-form-urlencoded` → map.
pub fn parse_form(text: &str) -> std::collections::BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// A 127.0.0.1 port nothing listens on (connections are refused at once).
pub fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}
