//! A fake Kubernetes API server for Secrets of one namespace: HTTPS on 127.0.0.1, JSON
//! `list` and `watch` (`?watch=1|true`, newline-delimited WatchEvents replayed from the
//! requested `resourceVersion`, BOOKMARKs only when `allowWatchBookmarks` asks), label
//! selectors, bearer-token check. Every request is recorded, so tests can count lists and
//! check paths, selectors and the Authorization header, and so is the name of every Secret
//! it sends, so tests can show a Secret never reached the client. It can be stopped (every
//! connection dropped) and started again on the same port, like an API server restart.
//!
//! It shares the other fakes' CA ([`tls_config`](super::tls_config)) but not
//! [`FakeHttps`](super::FakeHttps): it streams watch responses and restarts on its port.
//!
//! Why a fake beside the real one: the provider's watch runs against the real hub API server
//! in the real-cluster suite (`e2e/`, `TestDispatchKubernetesSecret`), which needs root and
//! Go. This fake stays for what a real server cannot be made to do on demand and on time: an
//! exact count of list calls, the selector and path of every request, a stop that drops every
//! connection mid-watch and a start on the same port, all inside a plain `cargo test`.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// Upper bound on one watch request, whatever `timeoutSeconds` asks: tests are short.
const MAX_WATCH: Duration = Duration::from_secs(300);

/// What one request to the fake was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeCall {
    List,
    Watch,
    Other,
}

/// One request the fake answered.
#[derive(Debug, Clone)]
pub struct KubeRequest {
    pub call: KubeCall,
    pub path: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// The bearer token sent, if any.
    pub token: Option<String>,
    pub status: u16,
}

#[derive(Debug, Default)]
struct Data {
    rv: u64,
    /// name → Secret JSON, as stored.
    secrets: BTreeMap<String, Value>,
    /// Every change: (resourceVersion, event type, object).
    events: Vec<(u64, &'static str, Value)>,
}

#[derive(Debug)]
struct Shared {
    namespace: String,
    token: String,
    data: Mutex<Data>,
    changed: tokio::sync::broadcast::Sender<()>,
    requests: Mutex<Vec<KubeRequest>>,
    /// The name of every Secret sent to a client, in a list or a watch event.
    sent: Mutex<BTreeSet<String>>,
}

/// The fake API server; stops on drop.
#[derive(Debug)]
pub struct FakeKubeApi {
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
    ca_pem: String,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
    /// The accept loop and every connection task, aborted by [`FakeKubeApi::stop`].
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl FakeKubeApi {
    /// Serves the Secrets of `namespace` to callers that present `Bearer <token>`.
    pub fn start(namespace: &str, token: &str) -> FakeKubeApi {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (ca_pem, tls) = super::tls_config();
        let (changed, _) = tokio::sync::broadcast::channel(1024);
        let shared = Arc::new(Shared {
            namespace: namespace.to_owned(),
            token: token.to_owned(),
            data: Mutex::new(Data::default()),
            changed,
            requests: Mutex::new(Vec::new()),
            sent: Mutex::new(BTreeSet::new()),
        });
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(SocketAddr::from((
                Ipv4Addr::LOCALHOST,
                0,
            ))))
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let api = FakeKubeApi {
            runtime,
            addr,
            ca_pem,
            tls,
            shared,
            tasks: Arc::new(Mutex::new(Vec::new())),
        };
        api.serve(listener);
        api
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&self.tls));
        let shared = Arc::clone(&self.shared);
        let tasks = Arc::clone(&self.tasks);
        let handle = self.runtime.spawn({
            let tasks = Arc::clone(&tasks);
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let acceptor = acceptor.clone();
                    let shared = Arc::clone(&shared);
                    let conn = tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(stream).await else {
                            return;
                        };
                        let service = hyper::service::service_fn(move |req| {
                            let shared = Arc::clone(&shared);
                            async move { Ok::<_, Infallible>(answer(&shared, &req)) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                    tasks.lock().expect("lock").push(conn.abort_handle());
                }
            }
        });
        tasks.lock().expect("lock").push(handle.abort_handle());
    }

    /// Stops listening and drops every connection (open watches end abruptly).
    pub fn stop(&self) {
        for task in self.tasks.lock().expect("lock").drain(..) {
            task.abort();
        }
        // Let the aborted tasks drop their sockets before a restart binds the port again.
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Listens again on the same address, with the same Secrets and history.
    pub fn restart(&self) {
        let listener = self
            .runtime
            .block_on(tokio::net::TcpListener::bind(self.addr))
            .unwrap_or_else(|e| panic!("rebind {}: {e}", self.addr));
        self.serve(listener);
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// PEM of the CA that signed the server certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Writes a kubeconfig for reaching this server with `Bearer <token>` (what the
    /// broker's `kubernetesSecret.kubeconfig` points at in tests).
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "hub", "cluster": {
                "server": self.url(),
                "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
            }}],
            "users": [{"name": "broker", "user": {"token": token}}],
            "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "broker"}}],
            "current-context": "hub",
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc).expect("JSON"))
            .expect("write hub kubeconfig");
    }

    /// Creates or replaces Secret `name` with `data` (raw values; stored base64-encoded)
    /// and `labels`.
    pub fn put_secret(&self, name: &str, labels: &[(&str, &str)], data: &[(&str, &[u8])]) {
        let mut d = self.shared.data.lock().expect("lock");
        d.rv += 1;
        let rv = d.rv;
        let existed = d.secrets.contains_key(name);
        let uid = d
            .secrets
            .get(name)
            .and_then(|s| s["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("uid-{name}-{rv}"));
        let encoded: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect();
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": self.shared.namespace,
                "uid": uid,
                "resourceVersion": rv.to_string(),
                "labels": labels,
            },
            "type": "Opaque",
            "data": encoded,
        });
        d.secrets.insert(name.to_owned(), secret.clone());
        d.events
            .push((rv, if existed { "MODIFIED" } else { "ADDED" }, secret));
        drop(d);
        let _ = self.shared.changed.send(());
    }

    /// Deletes Secret `name` (no-op if absent).
    pub fn delete_secret(&self, name: &str) {
        let mut d = self.shared.data.lock().expect("lock");
        let Some(mut secret) = d.secrets.remove(name) else {
            return;
        };
        d.rv += 1;
        secret["metadata"]["resourceVersion"] = Value::String(d.rv.to_string());
        let rv = d.rv;
        d.events.push((rv, "DELETED", secret));
        drop(d);
        let _ = self.shared.changed.send(());
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<KubeRequest> {
        self.shared.requests.lock().expect("lock").clone()
    }

    /// The names of the Secrets this server ever sent a client (list items and watch
    /// events; bookmarks carry no Secret): what a client can have held.
    pub fn sent_names(&self) -> BTreeSet<String> {
        self.shared.sent.lock().expect("lock").clone()
    }

    /// How many list / watch requests were answered.
    pub fn count(&self, call: KubeCall) -> usize {
        self.requests().iter().filter(|r| r.call == call).count()
    }
}

impl Drop for FakeKubeApi {
    fn drop(&mut self) {
        for task in self.tasks.lock().expect("lock").drain(..) {
            task.abort();
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn answer(shared: &Arc<Shared>, req: &Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let token = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let secrets_path = format!("/api/v1/namespaces/{}/secrets", shared.namespace);
    let watching = matches!(query.get("watch").map(String::as_str), Some("1" | "true"));
    let call = match (path == secrets_path, watching) {
        (true, true) => KubeCall::Watch,
        (true, false) => KubeCall::List,
        _ => KubeCall::Other,
    };
    let (status, response) = if token.as_deref() != Some(shared.token.as_str()) {
        (
            401,
            full(401, &status_body(401, "Unauthorized", "Unauthorized")),
        )
    } else if req.method() != hyper::Method::GET || call == KubeCall::Other {
        (
            404,
            full(
                404,
                &status_body(
                    404,
                    "NotFound",
                    "the fake serves only Secrets of its namespace",
                ),
            ),
        )
    } else {
        let selector = query.get("labelSelector").cloned().unwrap_or_default();
        match call {
            KubeCall::List => (200, list(shared, &selector)),
            _ => (200, watch(shared, &query, &selector)),
        }
    };
    shared.requests.lock().expect("lock").push(KubeRequest {
        call,
        path,
        query,
        token,
        status,
    });
    response
}

fn list(shared: &Shared, selector: &str) -> Response<Body> {
    let d = shared.data.lock().expect("lock");
    let items: Vec<&Value> = d
        .secrets
        .values()
        .filter(|s| matches_selector(s, selector))
        .collect();
    shared.sent.lock().expect("lock").extend(
        items
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_owned)),
    );
    full(
        200,
        &json!({"kind": "SecretList", "apiVersion": "v1",
                "metadata": {"resourceVersion": d.rv.to_string()}, "items": items}),
    )
}

fn watch(shared: &Arc<Shared>, query: &BTreeMap<String, String>, selector: &str) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    // Subscribe before reading the history, so no change falls between the two.
    let mut changed = shared.changed.subscribe();
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0);
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let limit = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .map_or(MAX_WATCH, Duration::from_secs)
        .min(MAX_WATCH);
    let shared = Arc::clone(shared);
    let selector = selector.to_owned();
    tokio::spawn(async move {
        let line = |kind: &str, object: &Value| {
            Ok(Frame::data(Bytes::from(format!(
                "{}\n",
                json!({"type": kind, "object": object})
            ))))
        };
        let pending = |after: u64| -> Vec<(u64, &'static str, Value)> {
            let d = shared.data.lock().expect("lock");
            d.events
                .iter()
                .filter(|(rv, _, obj)| *rv > after && matches_selector(obj, &selector))
                .cloned()
                .collect()
        };
        let mut sent = from;
        let deadline = tokio::time::Instant::now() + limit;
        let mut first = true;
        loop {
            for (rv, kind, object) in pending(sent) {
                if let Some(name) = object["metadata"]["name"].as_str() {
                    shared.sent.lock().expect("lock").insert(name.to_owned());
                }
                if tx.send(line(kind, &object)).await.is_err() {
                    return;
                }
                sent = rv;
            }
            if first && bookmarks {
                let rv = shared.data.lock().expect("lock").rv;
                let mark = json!({"kind": "Secret", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": rv.to_string()}});
                if tx.send(line("BOOKMARK", &mark)).await.is_err() {
                    return;
                }
            }
            first = false;
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                got = changed.recv() => if let Err(tokio::sync::broadcast::error::RecvError::Closed) = got {
                    return;
                },
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .status(200)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(body.boxed())
        .expect("response")
}

/// Equality-based selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-separated.
fn matches_selector(secret: &Value, selector: &str) -> bool {
    let labels = &secret["metadata"]["labels"];
    selector
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .all(|req| {
            if let Some((k, v)) = req.split_once("!=") {
                labels[k.trim()].as_str() != Some(v.trim())
            } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
                labels[k.trim()].as_str() == Some(v.trim())
            } else if let Some(k) = req.strip_prefix('!') {
                labels[k.trim()].is_null()
            } else {
                !labels[req].is_null()
            }
        })
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
