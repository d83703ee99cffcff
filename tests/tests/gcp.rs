//! `type: gcp` end to end: the real broker and shim against local fakes of Google's token
//! endpoints (plain HTTP on 127.0.0.1, which the URLs in credential files allow). Every fake
//! checks what it receives: RS256 signatures against the key's public key, JWT claims,
//! scopes, subject tokens, bearer tokens, the `Metadata-Flavor` header.
//!
//! The broker runs with a controlled environment (no ambient Google credentials, `HOME` in a
//! temp dir, `GCE_METADATA_HOST` on a fake or a dead port), so nothing here can reach Google.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest, GetTokenResponse};
use credbroker_tests::{
    BROKER, BROKER_TIMEOUT, COMMAND_TIMEOUT, V1, assert_credential, assert_shim_error, bin,
    describe, exec_info, parse_form, run, run_shim, tempdir, unix_channel, wait_until, yaml_str,
};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tempfile::TempDir;

const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
const USERINFO_EMAIL: &str = "https://www.googleapis.com/auth/userinfo.email";
const IAM_SCOPE: &str = "https://www.googleapis.com/auth/iam";
const SA_EMAIL: &str = "kueue@test-project.iam.gserviceaccount.com";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

// ---------------------------------------------------------------------------------------
// A fake HTTP endpoint
// ---------------------------------------------------------------------------------------

/// One request a fake received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    /// Header names lower-cased.
    headers: BTreeMap<String, String>,
    body: String,
}

impl Seen {
    fn form(&self) -> BTreeMap<String, String> {
        parse_form(&self.body)
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
    fn bearer(&self) -> Option<&str> {
        self.headers.get("authorization")?.strip_prefix("Bearer ")
    }
}

type Handler = Arc<dyn Fn(&Seen) -> (u16, Value) + Send + Sync>;

/// Plain HTTP/1.1 on 127.0.0.1; answers each request with `handler` and records it.
struct Fake {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Fake {
    fn start(handler: impl Fn(&Seen) -> (u16, Value) + Send + Sync + 'static) -> Fake {
        let handler: Handler = Arc::new(handler);
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread_seen = Arc::clone(&seen);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let stream = tokio::select! {
                        _ = &mut rx => return,
                        accepted = listener.accept() => match accepted {
                            Ok((s, _)) => s,
                            Err(_) => continue,
                        },
                    };
                    let handler = Arc::clone(&handler);
                    let seen = Arc::clone(&thread_seen);
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let handler = Arc::clone(&handler);
                            let seen = Arc::clone(&seen);
                            async move { Ok::<_, Infallible>(answer(req, &handler, &seen).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Fake {
            addr,
            seen,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    fn host(&self) -> String {
        self.addr.to_string()
    }
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for Fake {
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
    req: hyper::Request<Incoming>,
    handler: &Handler,
    seen: &Mutex<Vec<Seen>>,
) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let request = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
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
    };
    // The handler may block (it runs openssl): keep it off the runtime's async threads.
    let h = Arc::clone(handler);
    let r = request.clone();
    let (status, body) = tokio::task::spawn_blocking(move || h(&r))
        .await
        .unwrap_or((500, json!({"error": "handler panicked"})));
    seen.lock().expect("lock").push(request);
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("metadata-flavor", "Google")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

fn oauth_error(status: u16, error: &str, description: &str) -> (u16, Value) {
    (
        status,
        json!({"error": error, "error_description": description}),
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A 127.0.0.1 port nothing listens on (connections are refused at once).
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

// ---------------------------------------------------------------------------------------
// A broker with a controlled environment
// ---------------------------------------------------------------------------------------

/// `credbroker serve` with one gcp provider `gke`, no ambient Google credentials, `HOME` in
/// its temp dir and `GCE_METADATA_HOST` set (a dead port unless `env` says otherwise).
/// Killed on drop.
struct GcpBroker {
    dir: TempDir,
    socket: PathBuf,
    log: PathBuf,
    child: Child,
}

impl GcpBroker {
    fn start(gcp_section: &str, env: &[(&str, String)]) -> GcpBroker {
        let dir = tempdir();
        let socket = dir.path().join("broker.sock");
        let home = dir.path().join("home");
        std::fs::create_dir(&home).expect("home dir");
        let config = format!(
            "socket: {{path: {}}}\nproviders:\n  - name: gke\n    type: gcp\n    gcp: {gcp_section}\n",
            yaml_str(socket.to_str().expect("UTF-8"))
        );
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config).expect("write config");
        let log = dir.path().join("broker.log");
        let log_file = std::fs::File::create(&log).expect("log");
        let mut cmd = Command::new(bin(BROKER));
        cmd.arg("serve").arg("--config").arg(&config_path);
        for var in [
            "GOOGLE_APPLICATION_CREDENTIALS",
            "CLOUDSDK_CONFIG",
            "GOOGLE_CLOUD_QUOTA_PROJECT",
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("HOME", &home)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("GCE_METADATA_HOST", format!("127.0.0.1:{}", dead_port()));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup"))
            .stderr(log_file)
            .spawn()
            .expect("spawn credbroker");
        let mut broker = GcpBroker {
            dir,
            socket,
            log,
            child,
        };
        let ready = wait_until(BROKER_TIMEOUT, || {
            UnixStream::connect(&broker.socket).is_ok()
                || !matches!(broker.child.try_wait(), Ok(None))
        });
        assert!(
            ready && matches!(broker.child.try_wait(), Ok(None)),
            "broker did not start; log:\n{}",
            broker.logs()
        );
        broker
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for GcpBroker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn cluster(name: &str) -> Cluster {
    use prost_types::value::Kind;
    Cluster {
        server: format!("https://{name}.gke.example"),
        config: Some(prost_types::Struct {
            fields: [(
                "clusterName".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::StringValue(name.to_owned())),
                },
            )]
            .into_iter()
            .collect(),
        }),
        ..Cluster::default()
    }
}

async fn get_token(socket: &Path, name: &str) -> Result<GetTokenResponse, tonic::Status> {
    let mut client = TokenServiceClient::new(unix_channel(socket).await);
    client
        .get_token(GetTokenRequest {
            provider: "gke".to_owned(),
            cluster: Some(cluster(name)),
            interactive: false,
        })
        .await
        .map(tonic::Response::into_inner)
}

fn shim_info(cluster: &str) -> String {
    exec_info(
        V1,
        &format!("https://{cluster}.gke.example"),
        json!({"clusterName": cluster}),
    )
}

// ---------------------------------------------------------------------------------------
// Service-account keys: a throwaway RSA key made with openssl at test time
// ---------------------------------------------------------------------------------------

fn openssl(args: &[&str]) {
    let openssl = credbroker_tests::require_tool("openssl", "apt-get install openssl");
    let out = run(Command::new(openssl).args(args), COMMAND_TIMEOUT);
    assert!(out.status.success(), "openssl {args:?}: {}", describe(&out));
}

/// A fresh RSA key in `dir` (key.pem, pub.pem). Test-only: never used outside this process.
struct TestKey {
    dir: TempDir,
}

impl TestKey {
    fn generate() -> TestKey {
        let dir = tempdir();
        let key = dir.path().join("key.pem");
        let public = dir.path().join("pub.pem");
        openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            key.to_str().expect("UTF-8"),
        ]);
        openssl(&[
            "pkey",
            "-in",
            key.to_str().expect("UTF-8"),
            "-pubout",
            "-out",
            public.to_str().expect("UTF-8"),
        ]);
        TestKey { dir }
    }

    fn private_pem(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("key.pem")).expect("key.pem")
    }

    fn public_pem(&self) -> PathBuf {
        self.dir.path().join("pub.pem")
    }

    /// A service_account key file for it, exchanged at `token_uri`.
    fn key_file(&self, path: &Path, token_uri: &str) {
        let json = json!({
            "type": "service_account",
            "project_id": "test-project",
            "private_key_id": "test-key-1",
            "private_key": self.private_pem(),
            "client_email": SA_EMAIL,
            "client_id": "1234567890",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
        });
        std::fs::write(path, json.to_string()).expect("write key file");
    }
}

/// Verifies an RS256 JWT with `public_pem` (openssl) and returns its claims; `Err` says why not.
fn verify_rs256(jwt: &str, public_pem: &Path) -> Result<Value, String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = jwt.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err(format!("not a JWT ({} parts)", parts.len()));
    };
    let header: Value = serde_json::from_slice(&b64.decode(header).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if header["alg"] != "RS256" || header["kid"] != "test-key-1" {
        return Err(format!("unexpected header {header}"));
    }
    let dir = tempdir();
    let data = dir.path().join("data");
    let sig = dir.path().join("sig");
    std::fs::write(&data, format!("{}.{}", parts[0], parts[1])).map_err(|e| e.to_string())?;
    std::fs::write(&sig, b64.decode(signature).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let out = run(
        Command::new("openssl")
            .args(["dgst", "-sha256", "-verify"])
            .arg(public_pem)
            .arg("-signature")
            .arg(&sig)
            .arg(&data),
        COMMAND_TIMEOUT,
    );
    if !out.status.success() {
        return Err("signature does not verify with the key's public key".into());
    }
    serde_json::from_slice(&b64.decode(claims).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())
}

/// A fake OAuth2 token endpoint for the JWT-bearer grant: verifies the assertion with
/// `public_pem` and its claims (`iss`, `aud` = its own URL, `scope`, `iat`/`exp`), then
/// answers `next()` (a status and a body) or an RFC 6749 error.
fn token_endpoint(
    public_pem: PathBuf,
    want_scope: &'static str,
    next: impl Fn() -> (u16, Value) + Send + Sync + 'static,
) -> Fake {
    let own_url: Arc<Mutex<String>> = Arc::new(Mutex::new(String::new()));
    let url_for_handler = Arc::clone(&own_url);
    let fake = Fake::start(move |req| {
        if req.method != "POST" || req.path != "/token" {
            return oauth_error(404, "not_found", "POST /token only");
        }
        let form = req.form();
        if form.get("grant_type").map(String::as_str) != Some(JWT_BEARER) {
            return oauth_error(400, "unsupported_grant_type", "want the jwt-bearer grant");
        }
        let Some(assertion) = form.get("assertion") else {
            return oauth_error(400, "invalid_request", "no assertion");
        };
        let claims = match verify_rs256(assertion, &public_pem) {
            Ok(c) => c,
            Err(why) => return oauth_error(400, "invalid_grant", &why),
        };
        let aud = format!("{}/token", url_for_handler.lock().expect("lock"));
        let now = unix_now();
        let iat = claims["iat"].as_u64().unwrap_or(0);
        let exp = claims["exp"].as_u64().unwrap_or(0);
        let problem = if claims["iss"] != SA_EMAIL {
            Some(format!("iss {}", claims["iss"]))
        } else if claims["aud"] != aud.as_str() {
            Some(format!("aud {} is not {aud}", claims["aud"]))
        } else if claims["scope"] != want_scope {
            Some(format!("scope {}", claims["scope"]))
        } else if iat.abs_diff(now) > 60 || exp != iat + 3600 {
            Some(format!("iat {iat} / exp {exp} (now {now})"))
        } else {
            None
        };
        match problem {
            Some(why) => oauth_error(400, "invalid_grant", &why),
            None => next(),
        }
    });
    *own_url.lock().expect("lock") = fake.url();
    fake
}

fn token_body(token: &str, expires_in: u64) -> (u16, Value) {
    (
        200,
        json!({"access_token": token, "expires_in": expires_in, "token_type": "Bearer"}),
    )
}

const DEFAULT_SCOPE_STRING: &str =
    "https://www.googleapis.com/auth/cloud-platform https://www.googleapis.com/auth/userinfo.email";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_key_fifty_calls_five_clusters_one_exchange() {
    let key = TestKey::generate();
    let fake = token_endpoint(key.public_pem(), DEFAULT_SCOPE_STRING, || {
        // Slow enough that the 50 calls overlap the one exchange.
        std::thread::sleep(Duration::from_millis(300));
        token_body("ya29.sa-token-1", 3600)
    });
    let dir = tempdir();
    let key_path = dir.path().join("key.json");
    key.key_file(&key_path, &format!("{}/token", fake.url()));
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );

    let calls: Vec<_> = (0..50)
        .map(|i| {
            let socket = broker.socket.clone();
            tokio::spawn(async move { get_token(&socket, &format!("cluster-{}", i % 5)).await })
        })
        .collect();
    let mut tokens = std::collections::BTreeSet::new();
    for call in calls {
        let response = call
            .await
            .expect("join")
            .unwrap_or_else(|s| panic!("GetToken failed: {s:?}; broker log:\n{}", broker.logs()));
        tokens.insert(response.token);
    }
    assert_eq!(tokens.into_iter().collect::<Vec<_>>(), ["ya29.sa-token-1"]);
    let seen = fake.seen();
    assert_eq!(seen.len(), 1, "one exchange for 50 calls: {seen:?}");

    // The shim path: a sixth cluster gets the same token from the cache, with an expiry
    // about half the token's lifetime away (the cache's refresh point).
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("cluster-6")),
    );
    let cred = assert_credential(&out, V1);
    assert_eq!(cred.token, "ya29.sa-token-1");
    let left = cred.expiration - time::OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::minutes(20) && left < time::Duration::minutes(40),
        "come back in {left}"
    );
    assert_eq!(fake.seen().len(), 1);
    assert!(
        !broker.logs().contains("ya29.sa-token-1"),
        "token in the broker log"
    );
}

#[test]
fn invalid_grant_and_403_are_permission_denied() {
    // The fake verifies with another key's public key: the real signature must fail there.
    let key = TestKey::generate();
    let other = TestKey::generate();
    let fake = token_endpoint(other.public_pem(), DEFAULT_SCOPE_STRING, || {
        token_body("never", 3600)
    });
    let dir = tempdir();
    let key_path = dir.path().join("key.json");
    key.key_file(&key_path, &format!("{}/token", fake.url()));
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    let line = assert_shim_error(
        &out,
        &["permission", "invalid_grant", "signature does not verify"],
    );
    assert!(!line.contains("BEGIN"), "{line}");
    assert_eq!(fake.seen().len(), 1);

    // The right key but a service account the endpoint refuses (403).
    let fake = token_endpoint(key.public_pem(), DEFAULT_SCOPE_STRING, || {
        oauth_error(403, "access_denied", "service account disabled")
    });
    key.key_file(&key_path, &format!("{}/token", fake.url()));
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    assert_shim_error(&out, &["permission", "403", "service account disabled"]);
}

#[test]
fn key_file_problems_name_the_file_and_field() {
    let dir = tempdir();
    let missing = dir.path().join("missing.json");
    let broker = GcpBroker::start(
        "{}",
        &[(
            "GOOGLE_APPLICATION_CREDENTIALS",
            missing.display().to_string(),
        )],
    );
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    assert_shim_error(
        &out,
        &[
            "not_found",
            &missing.display().to_string(),
            "GOOGLE_APPLICATION_CREDENTIALS",
        ],
    );

    let bad = broker.path("bad.json");
    std::fs::write(
        &bad,
        json!({"type": "service_account", "client_email": SA_EMAIL, "private_key": "-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n"}).to_string(),
    )
    .expect("write");
    let broker2 = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(bad.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let out = run_shim(
        &broker2.socket,
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    assert_shim_error(&out, &[&bad.display().to_string(), "field `private_key`"]);

    let unreadable = broker.path("truncated.json");
    std::fs::write(&unreadable, "{\"type\": \"service_acc").expect("write");
    let broker3 = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(unreadable.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let out = run_shim(
        &broker3.socket,
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    assert_shim_error(
        &out,
        &[
            &unreadable.display().to_string(),
            "not valid json",
            "line 1",
        ],
    );
}

#[test]
fn no_credentials_anywhere_lists_what_was_tried() {
    let broker = GcpBroker::start("{}", &[]);
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    assert_shim_error(
        &out,
        &[
            "unavailable",
            "no google credentials found",
            "GOOGLE_APPLICATION_CREDENTIALS is not set",
            "no gcloud ADC file at",
            "metadata server at 127.0.0.1:",
        ],
    );
}

// ---------------------------------------------------------------------------------------
// The metadata server (GKE Workload Identity) via GCE_METADATA_HOST
// ---------------------------------------------------------------------------------------

const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// A fake metadata server: 403 without `Metadata-Flavor: Google` (like the real one), the
/// default service account's token with `scopes` checked, 404 elsewhere.
fn metadata_server(want_scopes: &'static str, token: &'static str, expires_in: u64) -> Fake {
    Fake::start(move |req| {
        if req.headers.get("metadata-flavor").map(String::as_str) != Some("Google") {
            return (403, json!({"error": "missing Metadata-Flavor: Google"}));
        }
        if req.method != "GET" || req.path != METADATA_TOKEN_PATH {
            return (404, json!({"error": "not found"}));
        }
        if req.query.get("scopes").map(String::as_str) != Some(want_scopes) {
            return (
                400,
                json!({"error": format!("scopes {:?}", req.query.get("scopes"))}),
            );
        }
        token_body(token, expires_in)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_server_via_gce_metadata_host() {
    let mds = metadata_server(
        "https://www.googleapis.com/auth/cloud-platform,https://www.googleapis.com/auth/userinfo.email",
        "ya29.metadata-token",
        1800,
    );
    // The fake really refuses requests without the header (so the broker's pass means it sent it).
    let status_line = {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(mds.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            stream,
            "GET {METADATA_TOKEN_PATH} HTTP/1.1\r\nHost: metadata\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text.lines().next().unwrap_or_default().to_owned()
    };
    assert!(status_line.contains(" 403 "), "{status_line:?}");

    let broker = GcpBroker::start("{}", &[("GCE_METADATA_HOST", mds.host())]);
    for name in ["east", "west", "north"] {
        let response = get_token(&broker.socket, name)
            .await
            .unwrap_or_else(|s| panic!("GetToken: {s:?}; log:\n{}", broker.logs()));
        assert_eq!(response.token, "ya29.metadata-token");
        // Half the lifetime ± jitter: between 12 and 18 minutes from now.
        let at = response.expiration_time.expect("expiration").seconds as u64;
        let left = at.saturating_sub(unix_now());
        assert!((600..=1100).contains(&left), "come back in {left}s");
    }
    let seen: Vec<_> = mds
        .seen()
        .into_iter()
        .filter(|s| s.path == METADATA_TOKEN_PATH)
        .collect();
    assert_eq!(
        seen.len(),
        2,
        "curl's request and one from the broker: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_with_delegates_on_the_metadata_identity() {
    let mds = metadata_server(CLOUD_PLATFORM, "ya29.node-identity", 3600);
    let target = "gke-access@test-project.iam.gserviceaccount.com";
    let delegate = "hop@test-project.iam.gserviceaccount.com";
    let expire = time::OffsetDateTime::now_utc() + time::Duration::minutes(50);
    let expire_text = expire
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format");
    let iam = Fake::start(move |req| {
        let want_path = format!("/v1/projects/-/serviceAccounts/{target}:generateAccessToken");
        if req.method != "POST" || req.path != want_path {
            return (
                404,
                json!({"error": {"status": "NOT_FOUND", "message": req.path}}),
            );
        }
        if req.bearer() != Some("ya29.node-identity") {
            return (
                401,
                json!({"error": {"status": "UNAUTHENTICATED", "message": "bad bearer"}}),
            );
        }
        let body = req.json();
        let want = json!({
            "scope": [CLOUD_PLATFORM, USERINFO_EMAIL],
            "lifetime": "3600s",
            "delegates": [format!("projects/-/serviceAccounts/{delegate}")],
        });
        if body != want {
            return (
                400,
                json!({"error": {"status": "INVALID_ARGUMENT", "message": body.to_string()}}),
            );
        }
        (
            200,
            json!({"accessToken": "ya29.impersonated", "expireTime": expire_text}),
        )
    });
    let broker = GcpBroker::start(
        &format!(
            "{{impersonateServiceAccount: {target}, delegates: [{delegate}], iamCredentialsEndpoint: {}}}",
            yaml_str(iam.url())
        ),
        &[("GCE_METADATA_HOST", mds.host())],
    );
    let response = get_token(&broker.socket, "a")
        .await
        .unwrap_or_else(|s| panic!("GetToken: {s:?}; log:\n{}", broker.logs()));
    assert_eq!(response.token, "ya29.impersonated");
    // The come-back time follows the impersonated token's own expiry (50 min → ~25 min).
    let left = (response.expiration_time.expect("exp").seconds as u64).saturating_sub(unix_now());
    assert!((1200..=1850).contains(&left), "come back in {left}s");
    assert_eq!(iam.seen().len(), 1);

    // Refused impersonation is PERMISSION_DENIED.
    let refusing = Fake::start(|_| {
        (
            403,
            json!({"error": {"status": "PERMISSION_DENIED", "message": "iam.serviceAccounts.getAccessToken denied"}}),
        )
    });
    let broker = GcpBroker::start(
        &format!(
            "{{impersonateServiceAccount: {target}, iamCredentialsEndpoint: {}}}",
            yaml_str(refusing.url())
        ),
        &[("GCE_METADATA_HOST", mds.host())],
    );
    let status = get_token(&broker.socket, "a").await.expect_err("denied");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("getAccessToken denied"),
        "{status:?}"
    );
    assert!(status.message().contains(target), "{status:?}");
}

// ---------------------------------------------------------------------------------------
// Workload identity federation: external_account, file-sourced (the cross-cloud recipe)
// ---------------------------------------------------------------------------------------

const AUDIENCE: &str = "//iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/kueue-pool/providers/eks-cluster";
const JWT_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// A fake STS: checks the RFC 8693 exchange (grant, audience, subject token and its type,
/// requested scope) and answers a federated token.
fn sts(subject_token: String, want_scope: &'static str, federated: &'static str) -> Fake {
    Fake::start(move |req| {
        let form = req.form();
        let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
        let problem = if req.method != "POST" || req.path != "/v1/token" {
            Some(format!("{} {}", req.method, req.path))
        } else if field("grant_type") != TOKEN_EXCHANGE {
            Some(format!("grant_type {}", field("grant_type")))
        } else if field("audience") != AUDIENCE {
            Some(format!("audience {}", field("audience")))
        } else if field("subject_token_type") != JWT_TYPE {
            Some(format!(
                "subject_token_type {}",
                field("subject_token_type")
            ))
        } else if field("requested_token_type") != ACCESS_TOKEN_TYPE {
            Some(format!(
                "requested_token_type {}",
                field("requested_token_type")
            ))
        } else if field("subject_token") != subject_token {
            Some("subject_token is not the projected service account token".into())
        } else if field("scope") != want_scope {
            Some(format!("scope {}", field("scope")))
        } else {
            None
        };
        match problem {
            Some(why) => oauth_error(400, "invalid_grant", &why),
            None => (
                200,
                json!({"access_token": federated, "issued_token_type": ACCESS_TOKEN_TYPE,
                       "token_type": "Bearer", "expires_in": 3600}),
            ),
        }
    })
}

/// What the EKS/AKS/on-prem recipe mounts: a projected service account token (a JWT).
fn projected_token(dir: &Path) -> (PathBuf, String) {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = format!(
        "{}.{}.{}",
        b64.encode(r#"{"alg":"RS256","kid":"k"}"#),
        b64.encode(
            json!({"iss": "https://oidc.eks.us-west-2.amazonaws.com/id/EXAMPLE",
                   "sub": "system:serviceaccount:kueue-system:kueue-controller-manager",
                   "aud": [AUDIENCE], "exp": unix_now() + 3600})
            .to_string()
        ),
        b64.encode("signature-bytes-of-the-cluster-issuer")
    );
    let path = dir.join("gcp-token");
    std::fs::write(&path, &token).expect("write projected token");
    (path, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_account_file_sourced_with_impersonation() {
    let dir = tempdir();
    let (token_file, subject) = projected_token(dir.path());
    // With service_account_impersonation_url, STS is asked for the IAM scope only and the
    // configured scopes go to generateAccessToken.
    let sts = sts(subject, IAM_SCOPE, "federated-token-1");
    let target = "kueue-gke@test-project.iam.gserviceaccount.com";
    let expire = (time::OffsetDateTime::now_utc() + time::Duration::hours(1))
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format");
    let generate_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&generate_calls);
    let iam = Fake::start(move |req| {
        calls.fetch_add(1, Ordering::SeqCst);
        if req.path != format!("/v1/projects/-/serviceAccounts/{target}:generateAccessToken") {
            return (404, json!({"error": {"message": req.path}}));
        }
        if req.bearer() != Some("federated-token-1") {
            return (
                401,
                json!({"error": {"message": "bearer is not the STS token"}}),
            );
        }
        let body = req.json();
        if body["scope"] != json!([CLOUD_PLATFORM, USERINFO_EMAIL]) || body["lifetime"] != "3600s" {
            return (400, json!({"error": {"message": body.to_string()}}));
        }
        (
            200,
            json!({"accessToken": "ya29.federated-impersonated", "expireTime": expire}),
        )
    });
    let credentials = dir.path().join("credential-configuration.json");
    std::fs::write(
        &credentials,
        json!({
            "universe_domain": "googleapis.com",
            "type": "external_account",
            "audience": AUDIENCE,
            "subject_token_type": JWT_TYPE,
            "token_url": format!("{}/v1/token", sts.url()),
            "service_account_impersonation_url": format!(
                "{}/v1/projects/-/serviceAccounts/{target}:generateAccessToken", iam.url()),
            "credential_source": {"file": token_file, "format": {"type": "text"}},
        })
        .to_string(),
    )
    .expect("write credential configuration");
    let broker = GcpBroker::start(
        "{}",
        &[(
            "GOOGLE_APPLICATION_CREDENTIALS",
            credentials.display().to_string(),
        )],
    );
    for name in ["a", "b", "c"] {
        let response = get_token(&broker.socket, name)
            .await
            .unwrap_or_else(|s| panic!("GetToken: {s:?}; log:\n{}", broker.logs()));
        assert_eq!(response.token, "ya29.federated-impersonated");
    }
    assert_eq!(sts.seen().len(), 1, "{:?}", sts.seen());
    assert_eq!(generate_calls.load(Ordering::SeqCst), 1);
    // The shim sees the same token.
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("d")),
    );
    assert_eq!(
        assert_credential(&out, V1).token,
        "ya29.federated-impersonated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_account_direct_federation_and_a_rejected_subject_token() {
    let dir = tempdir();
    let (token_file, subject) = projected_token(dir.path());
    // Without impersonation STS gets the configured scopes (space-separated).
    let sts = sts(
        subject,
        "https://www.googleapis.com/auth/cloud-platform",
        "ya29.federated-direct",
    );
    let credentials = dir.path().join("direct.json");
    let write = |source: &Path| {
        std::fs::write(
            &credentials,
            json!({
                "type": "external_account",
                "audience": AUDIENCE,
                "subject_token_type": JWT_TYPE,
                "token_url": format!("{}/v1/token", sts.url()),
                "credential_source": {"file": source},
            })
            .to_string(),
        )
        .expect("write");
    };
    write(&token_file);
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}, scopes: [{CLOUD_PLATFORM}]}}",
            yaml_str(credentials.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let response = get_token(&broker.socket, "a")
        .await
        .unwrap_or_else(|s| panic!("GetToken: {s:?}; log:\n{}", broker.logs()));
    assert_eq!(response.token, "ya29.federated-direct");
    // A lifetime the library does not report is assumed short (10 min → back in ~5).
    let left = (response.expiration_time.expect("exp").seconds as u64).saturating_sub(unix_now());
    assert!((200..=400).contains(&left), "come back in {left}s");

    // A subject token STS does not accept: PERMISSION_DENIED with STS's reason.
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "eyJ.not-the-right.token").expect("write");
    write(&wrong);
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}, scopes: [{CLOUD_PLATFORM}]}}",
            yaml_str(credentials.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let status = get_token(&broker.socket, "a").await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .contains("subject_token is not the projected"),
        "{status:?}"
    );
    assert!(
        !status.message().contains("not-the-right"),
        "subject token leaked: {status:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Outages: 5xx retried with backoff, the cached token served meanwhile, then refreshed
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_endpoint_fails_then_recovers() {
    // 0: healthy, 1: failing with 503, 2: recovered.
    let phase = Arc::new(AtomicUsize::new(0));
    let issued = Arc::new(AtomicUsize::new(0));
    let key = TestKey::generate();
    let (p, n) = (Arc::clone(&phase), Arc::clone(&issued));
    let fake = token_endpoint(key.public_pem(), DEFAULT_SCOPE_STRING, move || {
        if p.load(Ordering::SeqCst) == 1 {
            return oauth_error(503, "temporarily_unavailable", "backend down");
        }
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        // 20 s: refreshed after 8–12 s, served until 15 s.
        token_body(&format!("ya29.token-{i}"), 20)
    });
    let dir = tempdir();
    let key_path = dir.path().join("key.json");
    key.key_file(&key_path, &format!("{}/token", fake.url()));
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let t0 = Instant::now();
    let first = get_token(&broker.socket, "a").await.expect("first token");
    assert_eq!(first.token, "ya29.token-1");

    // With nothing cached (a second broker, same key), an outage is UNAVAILABLE.
    phase.store(1, Ordering::SeqCst);
    let cold = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let status = get_token(&cold.socket, "a").await.expect_err("outage");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("503"), "{status:?}");

    // Past the refresh point, during the outage: the cached token is still served, while
    // the background refresh fails.
    tokio::time::sleep(Duration::from_millis(12_500).saturating_sub(t0.elapsed())).await;
    let failures_before = fake.seen().len();
    let stale = get_token(&broker.socket, "a")
        .await
        .expect("stale token served");
    assert_eq!(stale.token, "ya29.token-1");
    assert!(
        wait_until(Duration::from_secs(3), || fake.seen().len()
            > failures_before),
        "a refresh was attempted"
    );
    let again = get_token(&broker.socket, "a").await.expect("still served");
    assert_eq!(again.token, "ya29.token-1");

    // Recovered: after the backoff (~1 s) the next request triggers a refresh.
    phase.store(2, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut latest = String::new();
    while Instant::now() < deadline {
        latest = get_token(&broker.socket, "a").await.expect("token").token;
        if latest == "ya29.token-2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(latest, "ya29.token-2", "log:\n{}", broker.logs());
    drop(cold);
}

/// A service-account exchange at `RUST_LOG=trace` (dependencies included): no access token,
/// assertion or private key in any log line.
#[test]
fn trace_logs_hold_no_secret() {
    let key = TestKey::generate();
    let fake = token_endpoint(key.public_pem(), DEFAULT_SCOPE_STRING, || {
        token_body("ya29.trace-secret-token", 3600)
    });
    let dir = tempdir();
    let key_path = dir.path().join("key.json");
    key.key_file(&key_path, &format!("{}/token", fake.url()));
    let broker = GcpBroker::start(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[("RUST_LOG", "trace".to_owned())],
    );
    let out = run_shim(
        &broker.socket,
        &["--provider", "gke"],
        Some(&shim_info("trace-1")),
    );
    assert_eq!(assert_credential(&out, V1).token, "ya29.trace-secret-token");
    let assertion = fake.seen()[0]
        .form()
        .get("assertion")
        .cloned()
        .expect("assertion");
    let private_line = key
        .private_pem()
        .lines()
        .nth(1)
        .expect("a PEM body line")
        .to_owned();
    let logs = broker.logs();
    assert!(logs.lines().count() > 20, "trace logging is on:\n{logs}");
    for (what, secret) in [
        ("access token", "ya29.trace-secret-token"),
        ("assertion", assertion.as_str()),
        (
            "assertion signature",
            assertion.rsplit('.').next().unwrap_or_default(),
        ),
        ("private key", private_line.as_str()),
    ] {
        assert!(
            !logs.contains(secret),
            "the {what} is in the trace log:\n{logs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_control_characters_from_google_is_refused_like_any_provider_s() {
    let mds = metadata_server(
        "https://www.googleapis.com/auth/cloud-platform,https://www.googleapis.com/auth/userinfo.email",
        "ya29.sekrit\r\nX-Injected: 1",
        1800,
    );
    let broker = GcpBroker::start("{}", &[("GCE_METADATA_HOST", mds.host())]);
    let status = get_token(&broker.socket, "east")
        .await
        .expect_err("a token with CR/LF must not be served");
    assert!(
        status.message().contains("control character"),
        "{status:?}; log:\n{}",
        broker.logs()
    );
    assert!(!status.message().contains("sekrit"), "{status:?}");
    assert!(!broker.logs().contains("sekrit"), "{}", broker.logs());
}
