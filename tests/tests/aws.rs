//! The `aws` provider end to end: the real broker and shim, moto's server standing in for
//! STS (IRSA, AssumeRole counting), a TLS fake STS for the failures moto cannot produce,
//! botocore (the AWS CLI's `aws eks get-token` code) as the reference signer, and kubectl
//! against an EKS-shaped TLS API server that decodes and checks every token it receives.
//!
//! The broker runs with a cleared environment plus exactly the AWS variables each test sets
//! (HOME in a temp dir, instance metadata disabled), so nothing on the machine leaks in.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest};
use credbroker_tests::{
    BROKER, Kubeconfig, V1, V1BETA1, assert_credential, assert_shim_error, bin, describe,
    exec_info, kubectl, run, run_shim, serve_tls, tempdir, tls_config, unix_channel, wait_until,
    write_kubeconfig, yaml_str,
};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use tempfile::TempDir;

const ACCOUNT: &str = "123456789012";
const STATIC_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
const STATIC_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
/// aws-iam-authenticator's allow-list of query keys in a token's URL.
const ALLOWED_QUERY_KEYS: [&str; 9] = [
    "Action",
    "Version",
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-Security-Token",
    "X-Amz-Signature",
    "X-Amz-SignedHeaders",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/aws")
        .join(name)
}

fn python3() -> &'static str {
    "python3"
}

// ---------------------------------------------------------------------------------------
// A broker with a controlled environment
// ---------------------------------------------------------------------------------------

/// `credbroker serve` with a cleared environment plus `env`; killed on drop.
struct AwsBroker {
    _dir: TempDir,
    socket: PathBuf,
    log: PathBuf,
    child: Child,
}

impl AwsBroker {
    /// `providers` is the YAML list body (entries of [`aws_provider`]).
    fn start(providers: &[String], env: &[(&str, String)]) -> AwsBroker {
        let dir = tempdir();
        let socket = dir.path().join("broker.sock");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home dir");
        let mut yaml = format!(
            "socket: {{path: {}}}\nproviders:\n",
            yaml_str(socket.to_str().expect("UTF-8"))
        );
        for p in providers {
            yaml.push_str(p);
        }
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, yaml).expect("write config");
        let log = dir.path().join("broker.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin(BROKER));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .env_clear()
            .env("HOME", &home)
            .env("AWS_CONFIG_FILE", home.join("no-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", home.join("no-credentials"))
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup"))
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn credbroker");
        let mut broker = AwsBroker {
            _dir: dir,
            socket,
            log,
            child,
        };
        let ready = wait_until(Duration::from_secs(15), || {
            std::os::unix::net::UnixStream::connect(&broker.socket).is_ok()
        });
        if !ready {
            let _ = broker.child.kill();
            panic!("broker did not listen within 15s; log:\n{}", broker.logs());
        }
        broker
    }

    fn socket(&self) -> &Path {
        &self.socket
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AwsBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `type: aws` provider entry; `aws` is the inside of the `aws:` flow mapping.
fn aws_provider(name: &str, aws: &str) -> String {
    format!("  - name: {name}\n    type: aws\n    aws: {{{aws}}}\n")
}

fn static_keys(session_token: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("AWS_ACCESS_KEY_ID", STATIC_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", STATIC_SECRET.to_owned()),
    ];
    if let Some(t) = session_token {
        env.push(("AWS_SESSION_TOKEN", t.to_owned()));
    }
    env
}

/// One shim run for `cluster_config` (and `server`), asserting success; the token.
fn token_for(
    broker: &AwsBroker,
    server: &str,
    cluster_config: Value,
) -> credbroker_tests::Credential {
    let info = exec_info(V1, server, cluster_config);
    let out = run_shim(broker.socket(), &["--provider", "eks"], Some(&info));
    if !out.status.success() {
        panic!(
            "shim failed: {}\nbroker log:\n{}",
            describe(&out),
            broker.logs()
        );
    }
    assert_credential(&out, V1)
}

fn shim_fails(broker: &AwsBroker, server: &str, cluster_config: Value) -> Output {
    let info = exec_info(V1, server, cluster_config);
    run_shim(broker.socket(), &["--provider", "eks"], Some(&info))
}

// ---------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------

/// A decoded token: host and query (percent-decoded values).
#[derive(Debug)]
struct Decoded {
    host: String,
    path: String,
    query: Vec<(String, String)>,
}

impl Decoded {
    fn get(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Decodes `k8s-aws-v1.<base64url without padding>` into its presigned URL, or says why not.
fn decode_token(token: &str) -> Result<Decoded, String> {
    let b64 = token
        .strip_prefix("k8s-aws-v1.")
        .ok_or("no k8s-aws-v1. prefix")?;
    if b64.contains('=') {
        return Err("padded base64".into());
    }
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(b64)
        .map_err(|e| format!("not base64url: {e}"))?;
    let url = String::from_utf8(url).map_err(|_| "URL is not UTF-8")?;
    let rest = url.strip_prefix("https://").ok_or("not an https URL")?;
    let (host, rest) = rest.split_once('/').ok_or("no path")?;
    let (path, query) = rest.split_once('?').ok_or("no query")?;
    let mut pairs = Vec::new();
    for kv in query.split('&') {
        let (k, v) = kv.split_once('=').ok_or("query pair without =")?;
        pairs.push((k.to_owned(), percent_decode(v)?));
    }
    Ok(Decoded {
        host: host.to_owned(),
        path: format!("/{path}"),
        query: pairs,
    })
}

fn percent_decode(s: &str) -> Result<String, String> {
    let mut out = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("truncated %-escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad %-escape")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "escape is not UTF-8".into())
}

/// What aws-iam-authenticator checks before it calls STS: host, path, the query key
/// allow-list, Action, X-Amz-Expires, that x-k8s-aws-id is signed, and a fresh X-Amz-Date.
fn check_shape(token: &str, host: &str) -> Result<Decoded, String> {
    let d = decode_token(token)?;
    if d.host != host {
        return Err(format!("host {} (want {host})", d.host));
    }
    if d.path != "/" {
        return Err(format!("path {}", d.path));
    }
    let mut seen = std::collections::HashSet::new();
    for (k, _) in &d.query {
        if !ALLOWED_QUERY_KEYS.contains(&k.as_str()) {
            return Err(format!("query key {k} is not allowed"));
        }
        if !seen.insert(k.clone()) {
            return Err(format!("query key {k} repeated"));
        }
    }
    let want = [
        ("Action", "GetCallerIdentity"),
        ("Version", "2011-06-15"),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Expires", "60"),
    ];
    for (k, v) in want {
        if d.get(k) != Some(v) {
            return Err(format!("{k}={:?} (want {v})", d.get(k)));
        }
    }
    let signed = d.get("X-Amz-SignedHeaders").unwrap_or_default();
    if !signed.split(';').any(|h| h == "x-k8s-aws-id") || !signed.split(';').any(|h| h == "host") {
        return Err(format!(
            "signed headers {signed:?} lack host or x-k8s-aws-id"
        ));
    }
    let date = d.get("X-Amz-Date").ok_or("no X-Amz-Date")?;
    let signed_at = amz_date(date)?;
    let age = SystemTime::now()
        .duration_since(signed_at)
        .unwrap_or_default();
    if age > Duration::from_secs(15 * 60) {
        return Err(format!("signed {age:?} ago: expired for the authenticator"));
    }
    let sig = d.get("X-Amz-Signature").unwrap_or_default();
    if sig.len() != 64 || !sig.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("signature {sig:?}"));
    }
    Ok(d)
}

/// `20240501T123456Z` → a time.
fn amz_date(date: &str) -> Result<SystemTime, String> {
    if date.len() != 16 {
        return Err(format!("X-Amz-Date {date:?}"));
    }
    let t = time::OffsetDateTime::parse(
        &rfc3339_of_amz_date(date),
        &time::format_description::well_known::Rfc3339,
    )
    .map_err(|e| format!("X-Amz-Date {date:?}: {e}"))?;
    Ok(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(t.unix_timestamp()).unwrap_or(0)),
    )
}

fn rfc3339_of_amz_date(date: &str) -> String {
    format!(
        "{}-{}-{}T{}:{}:{}Z",
        &date[0..4],
        &date[4..6],
        &date[6..8],
        &date[9..11],
        &date[11..13],
        &date[13..15]
    )
}

/// What `aws eks get-token` (botocore) prints for the same inputs and signing time.
fn botocore_token(case: &Value) -> String {
    let out = run(
        Command::new(python3())
            .arg(fixture("botocore_token.py"))
            .arg("token")
            .arg(case.to_string()),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "botocore_token.py failed (is the AWS CLI / botocore installed?): {}",
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// ---------------------------------------------------------------------------------------
// moto
// ---------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `python3 -m moto.server` on 127.0.0.1; killed on drop.
struct Moto {
    child: Child,
    url: String,
    _log_dir: TempDir,
}

impl Moto {
    fn start() -> Moto {
        let port = free_port();
        let log_dir = tempdir();
        let log = std::fs::File::create(log_dir.path().join("moto.log")).expect("moto log");
        let child = Command::new(python3())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("spawn moto (pip install 'moto[server]')");
        let mut moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _log_dir: log_dir,
        };
        let up = wait_until(Duration::from_secs(30), || {
            matches!(
                http_get(&moto.url, "/moto-api/data.json", &[]),
                Ok((200, _))
            )
        });
        if !up {
            let _ = moto.child.kill();
            let log =
                std::fs::read_to_string(moto._log_dir.path().join("moto.log")).unwrap_or_default();
            panic!("moto did not answer within 30s (pip install 'moto[server]'):\n{log}");
        }
        moto
    }

    /// How many assumed-role sessions moto has issued (AssumeRole and
    /// AssumeRoleWithWebIdentity both create one).
    fn assumed_roles(&self) -> Vec<Value> {
        let (status, body) = http_get(&self.url, "/moto-api/data.json", &[]).expect("moto data");
        assert_eq!(status, 200, "{body}");
        let data: Value = serde_json::from_str(&body).expect("moto data JSON");
        data["sts"]["AssumedRole"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// moto's GetCallerIdentity for the key a token was signed with: the ARN it maps to.
    fn caller_arn(&self, token: &Decoded) -> String {
        let credential = token.get("X-Amz-Credential").expect("credential");
        // moto reads the key id from an Authorization header only (not from a presigned
        // query), so hand it the token's credential scope that way.
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders=host, Signature={}",
            token.get("X-Amz-Signature").unwrap_or_default()
        );
        let (status, body) = http_get(
            &self.url,
            "/?Action=GetCallerIdentity&Version=2011-06-15",
            &[("Authorization", &auth)],
        )
        .expect("moto GetCallerIdentity");
        assert_eq!(status, 200, "{body}");
        between(&body, "<Arn>", "</Arn>").unwrap_or_else(|| panic!("no Arn in {body}"))
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn between(text: &str, start: &str, end: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let to = text[from..].find(end)? + from;
    Some(text[from..to].to_owned())
}

/// A plain HTTP/1.1 GET to `base` (http://127.0.0.1:port); (status, body).
fn http_get(base: &str, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    let addr = base.strip_prefix("http://").expect("http URL");
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

// ---------------------------------------------------------------------------------------
// A TLS server for fakes (STS, the Kubernetes API)
// ---------------------------------------------------------------------------------------

/// One request a fake received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path_and_query: String,
    headers: BTreeMap<String, String>,
    body: String,
}

type Handler = dyn Fn(&Seen) -> (u16, String) + Send + Sync;

/// HTTPS on 127.0.0.1 with a fresh CA; answers with `handler`, records every request.
struct FakeHttps {
    url: String,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeHttps {
    fn start(handler: Arc<Handler>) -> FakeHttps {
        let (ca_pem, tls) = tls_config();
        let listener =
            std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread_seen = Arc::clone(&seen);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve_tls(
                listener,
                tls,
                rx,
                move |req: hyper::Request<hyper::body::Incoming>| {
                    let handler = Arc::clone(&handler);
                    let seen = Arc::clone(&thread_seen);
                    async move {
                        let method = req.method().to_string();
                        let path_and_query = req
                            .uri()
                            .path_and_query()
                            .map(|p| p.to_string())
                            .unwrap_or_default();
                        let headers = req
                            .headers()
                            .iter()
                            .map(|(k, v)| {
                                (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())
                            })
                            .collect();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                            .unwrap_or_default();
                        let request = Seen {
                            method,
                            path_and_query,
                            headers,
                            body,
                        };
                        let (status, body) = handler(&request);
                        seen.lock().expect("lock").push(request);
                        let content_type = if body.starts_with('<') {
                            "text/xml"
                        } else {
                            "application/json"
                        };
                        hyper::Response::builder()
                            .status(status)
                            .header("content-type", content_type)
                            .body(Full::new(Bytes::from(body)))
                            .expect("response")
                    }
                },
            ));
        });
        FakeHttps {
            url,
            ca_pem,
            seen,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// The CA as a file, for the broker's SSL_CERT_FILE or a kubeconfig.
    fn ca_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("fake-ca.pem");
        std::fs::write(&path, &self.ca_pem).expect("write CA");
        path
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

// ---------------------------------------------------------------------------------------
// A fake STS
// ---------------------------------------------------------------------------------------

/// Form fields of an STS query-protocol POST body.
fn form(body: &str) -> BTreeMap<String, String> {
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let v = percent_decode(&v.replace('+', " ")).unwrap_or_default();
            (k.to_owned(), v)
        })
        .collect()
}

fn assume_role_ok(n: usize, life: Duration) -> String {
    let expiration = time::OffsetDateTime::now_utc() + life;
    let expiration = expiration
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format");
    format!(
        r#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <AssumedRoleId>AROAEXAMPLE:credbroker</AssumedRoleId>
      <Arn>arn:aws:sts::{ACCOUNT}:assumed-role/kueue/credbroker</Arn>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIAFAKESTS{n:09}</AccessKeyId>
      <SecretAccessKey>fake-secret-{n}</SecretAccessKey>
      <SessionToken>fake-session-token-{n}</SessionToken>
      <Expiration>{expiration}</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>req-{n}</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#
    )
}

fn sts_error(code: &str, message: &str) -> String {
    format!(
        r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>
  <RequestId>err-1</RequestId>
</ErrorResponse>"#
    )
}

/// Checks with botocore that every request was SigV4-signed with the static test key.
fn assert_signed_with_static_key(requests: &[Seen], base_url: &str) {
    let dir = tempdir();
    let spec = json!({
        "accessKeyId": STATIC_KEY,
        "secretAccessKey": STATIC_SECRET,
        "requests": requests.iter().map(|r| json!({
            "method": r.method,
            "url": format!("{base_url}{}", r.path_and_query),
            "headers": r.headers,
            "body": r.body,
        })).collect::<Vec<_>>(),
    });
    let path = dir.path().join("requests.json");
    std::fs::write(&path, spec.to_string()).expect("write requests");
    let out = run(
        Command::new(python3())
            .arg(fixture("verify_sigv4.py"))
            .arg(&path),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "SigV4 signatures of the STS requests do not verify: {}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Same credentials, cluster, region and signing time: the broker's token is byte for byte
/// the one `aws eks get-token`'s code (botocore) makes, with and without a session token.
#[test]
fn token_is_what_aws_eks_get_token_signs() {
    for session in [None, Some("FwoGZXIvYXdzEJr//////////wEaDH+session/token==")] {
        let broker = AwsBroker::start(
            &[aws_provider("eks", "region: eu-west-1")],
            &static_keys(session),
        );
        let cred = token_for(&broker, "https://10.1.2.3", json!({"clusterName": "alpha"}));
        let d = check_shape(&cred.token, "sts.eu-west-1.amazonaws.com").unwrap();
        assert_eq!(
            d.get("X-Amz-Credential")
                .unwrap_or_default()
                .split('/')
                .next(),
            Some(STATIC_KEY)
        );
        assert_eq!(d.get("X-Amz-Security-Token"), session);
        let date = d.get("X-Amz-Date").expect("date");
        let mut case = json!({
            "accessKeyId": STATIC_KEY,
            "secretAccessKey": STATIC_SECRET,
            "region": "eu-west-1",
            "clusterId": "alpha",
            "time": rfc3339_of_amz_date(date),
            "stsEndpoint": "regional",
        });
        if let Some(s) = session {
            case["sessionToken"] = json!(s);
        }
        let want = botocore_token(&case);
        let theirs = decode_token(&want).unwrap();
        assert_eq!(d.get("X-Amz-Signature"), theirs.get("X-Amz-Signature"));
        assert_eq!(cred.token, want);
        // Static keys have no expiry: the token's own 14 minutes, and the shim is told to
        // come back before that.
        let signed_at = amz_date(date).unwrap();
        let come_back = SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(cred.expiration.unix_timestamp()).unwrap());
        assert!(
            come_back <= signed_at + Duration::from_secs(14 * 60),
            "{cred:?}"
        );
    }
}

/// IRSA: AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, with moto answering the SDK's
/// AssumeRoleWithWebIdentity at AWS_ENDPOINT_URL_STS. The token is signed with the session
/// moto issued (ASIA… key + X-Amz-Security-Token) and names the real regional STS host.
#[test]
fn irsa_web_identity_through_moto() {
    let moto = Moto::start();
    let dir = tempdir();
    let token_file = dir.path().join("token");
    // A JWT-shaped projected ServiceAccount token (moto does not verify it).
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(br#"{"sub":"system:serviceaccount:kueue-system:kueue-controller-manager","aud":"sts.amazonaws.com"}"#);
    std::fs::write(&token_file, format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2ln")).expect("token");
    let role = format!("arn:aws:iam::{ACCOUNT}:role/kueue-irsa");
    let broker = AwsBroker::start(
        &[aws_provider("eks", "")],
        &[
            ("AWS_REGION", "us-west-2".to_owned()),
            ("AWS_ROLE_ARN", role.clone()),
            ("AWS_ROLE_SESSION_NAME", "kueue-irsa-session".to_owned()),
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token_file.display().to_string(),
            ),
            ("AWS_ENDPOINT_URL_STS", moto.url.clone()),
        ],
    );
    let cred = token_for(
        &broker,
        "https://10.0.0.1",
        json!({"clusterName": "workers-1"}),
    );
    let d = check_shape(&cred.token, "sts.us-west-2.amazonaws.com").unwrap();
    let key = d
        .get("X-Amz-Credential")
        .and_then(|c| c.split('/').next())
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("ASIA"), "session key expected, got {key}");
    assert!(d.get("X-Amz-Security-Token").is_some_and(|t| !t.is_empty()));
    assert_eq!(
        moto.caller_arn(&d),
        format!("arn:aws:sts::{ACCOUNT}:assumed-role/kueue-irsa/kueue-irsa-session")
    );
    assert_eq!(
        moto.assumed_roles().len(),
        1,
        "one AssumeRoleWithWebIdentity"
    );
    // A second cluster signs with the same held session: no new STS call.
    let other = token_for(
        &broker,
        "https://10.0.0.2",
        json!({"clusterName": "workers-2"}),
    );
    let d2 = check_shape(&other.token, "sts.us-west-2.amazonaws.com").unwrap();
    assert_eq!(
        d2.get("X-Amz-Credential").map(|c| c.split('/').next()),
        Some(Some(key.as_str()))
    );
    assert_eq!(moto.assumed_roles().len(), 1);
}

/// `roleArn` on the provider: 20 clusters, 100 tokens, one AssumeRole (counted at moto),
/// and every token maps (through moto's GetCallerIdentity) to the assumed role.
#[test]
fn one_assume_role_for_twenty_clusters_and_a_hundred_tokens() {
    let moto = Moto::start();
    let role = format!("arn:aws:iam::{ACCOUNT}:role/kueue");
    let mut env = static_keys(None);
    env.push(("AWS_ENDPOINT_URL_STS", moto.url.clone()));
    let broker = AwsBroker::start(
        &[aws_provider(
            "eks",
            &format!(
                "region: us-west-2, roleArn: {}, sessionName: kueue-mgr",
                yaml_str(&role)
            ),
        )],
        &env,
    );
    let mut keys = std::collections::HashSet::new();
    let mut tokens = 0;
    for round in 0..5 {
        for i in 0..20 {
            let cred = token_for(
                &broker,
                &format!("https://10.0.0.{i}"),
                json!({"clusterName": format!("cluster-{i:02}")}),
            );
            tokens += 1;
            let d = check_shape(&cred.token, "sts.us-west-2.amazonaws.com").unwrap();
            keys.insert(
                d.get("X-Amz-Credential")
                    .unwrap_or_default()
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            );
            if round == 0 && i % 7 == 0 {
                assert_eq!(
                    moto.caller_arn(&d),
                    format!("arn:aws:sts::{ACCOUNT}:assumed-role/kueue/kueue-mgr")
                );
            }
        }
    }
    assert_eq!(tokens, 100);
    assert_eq!(
        keys.len(),
        1,
        "every token signed with the one session: {keys:?}"
    );
    let roles = moto.assumed_roles();
    assert_eq!(roles.len(), 1, "AssumeRole calls seen by moto: {roles:?}");
}

/// kubectl → shim → broker → token, against a TLS API server for an EKS-shaped cluster that
/// decodes each bearer token and accepts it only if aws-iam-authenticator would pass it on
/// to STS (shape, host for the cluster's region, fresh date, signed x-k8s-aws-id).
#[test]
fn kubectl_reaches_an_eks_shaped_cluster() {
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let api = FakeHttps::start(Arc::new(move |req: &Seen| {
        let token = req
            .headers
            .get("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        match check_shape(token, "sts.eu-north-1.amazonaws.com") {
            Ok(d) if d.get("X-Amz-Credential").is_some_and(|c| c.starts_with(STATIC_KEY)) => {
                count.fetch_add(1, Ordering::SeqCst);
                (200, json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}).to_string())
            }
            Ok(_) | Err(_) => (
                401,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized", "code": 401}).to_string(),
            ),
        }
    }));
    let broker = AwsBroker::start(
        &[aws_provider("eks", "")],
        &static_keys(Some("kubectl-session")),
    );
    let dir = tempdir();
    let mut first_tokens = Vec::new();
    for (file, cluster, api_version) in [("a.json", "alpha", V1), ("b.json", "beta", V1BETA1)] {
        let kubeconfig = dir.path().join(file);
        write_kubeconfig(
            &kubeconfig,
            &Kubeconfig {
                server: &api.url,
                ca_pem: &api.ca_pem,
                // The ClusterProfile extension: {clusterName, region}.
                cluster_config: json!({"clusterName": cluster, "region": "eu-north-1"}),
                api_version,
                provider: "eks",
                socket: broker.socket(),
            },
        );
        for _ in 0..2 {
            let out = kubectl(&kubeconfig, &["get", "--raw", "/api"]);
            assert!(
                out.status.success(),
                "kubectl failed: {}\nbroker log:\n{}",
                describe(&out),
                broker.logs()
            );
            let body: Value = serde_json::from_slice(&out.stdout).expect("kubectl JSON");
            assert_eq!(body["kind"], "APIVersions");
        }
        let seen = api.seen();
        let last = seen.last().expect("requests");
        first_tokens.push(
            last.headers
                .get("authorization")
                .cloned()
                .unwrap_or_default(),
        );
    }
    assert!(accepted.load(Ordering::SeqCst) >= 4);
    assert!(
        api.seen()
            .iter()
            .all(|r| r.headers.contains_key("authorization"))
    );
    // One token per cluster (the signed x-k8s-aws-id differs), reused across kubectl runs.
    assert_ne!(first_tokens[0], first_tokens[1]);
}

/// Region: cluster key → provider key → EKS server host → AWS_REGION; none → an error that
/// names the cluster.
#[test]
fn region_selection_end_to_end() {
    let broker = AwsBroker::start(
        &[
            aws_provider("eks", ""),
            aws_provider("eks-pinned", "region: ap-northeast-1"),
        ],
        &static_keys(None),
    );
    let eks_server = "https://0123ABCD.gr7.ca-central-1.eks.amazonaws.com";
    let host = |provider: &str, server: &str, config: Value| {
        let info = exec_info(V1, server, config);
        let out = run_shim(broker.socket(), &["--provider", provider], Some(&info));
        let cred = assert_credential(&out, V1);
        decode_token(&cred.token).unwrap().host
    };
    let cluster = json!({"clusterName": "c", "region": "sa-east-1"});
    assert_eq!(
        host("eks-pinned", eks_server, cluster),
        "sts.sa-east-1.amazonaws.com"
    );
    assert_eq!(
        host("eks-pinned", eks_server, json!({"clusterName": "c"})),
        "sts.ap-northeast-1.amazonaws.com"
    );
    assert_eq!(
        host("eks", eks_server, json!({"clusterName": "c"})),
        "sts.ca-central-1.amazonaws.com"
    );
    let out = shim_fails(&broker, "https://10.9.9.9", json!({"clusterName": "gamma"}));
    assert_shim_error(&out, &["no AWS region for cluster gamma", "region"]);

    // With AWS_REGION the SDK default fills in.
    let mut env = static_keys(None);
    env.push(("AWS_REGION", "eu-south-1".to_owned()));
    let broker = AwsBroker::start(&[aws_provider("eks", "")], &env);
    let cred = token_for(&broker, "https://10.9.9.9", json!({"clusterName": "gamma"}));
    assert_eq!(
        decode_token(&cred.token).unwrap().host,
        "sts.eu-south-1.amazonaws.com"
    );
    // The global endpoint on request.
    let broker = AwsBroker::start(
        &[aws_provider(
            "eks",
            "region: us-west-2, stsEndpoint: global",
        )],
        &static_keys(None),
    );
    let cred = token_for(&broker, "https://10.9.9.9", json!({"clusterName": "g"}));
    let d = check_shape(&cred.token, "sts.amazonaws.com").unwrap();
    assert!(
        d.get("X-Amz-Credential")
            .unwrap_or_default()
            .contains("/us-east-1/sts/")
    );
}

/// No credential source at all: UNAVAILABLE, naming every source the chain tried.
#[test]
fn no_credentials_says_which_sources_were_tried() {
    let broker = AwsBroker::start(&[aws_provider("eks", "region: us-west-2")], &[]);
    let out = shim_fails(&broker, "https://10.0.0.1", json!({"clusterName": "alpha"}));
    let line = assert_shim_error(
        &out,
        &[
            "no AWS credentials found",
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "IMDSv2",
            "alpha",
        ],
    );
    assert!(!line.contains(STATIC_SECRET));
}

/// An instance metadata endpoint that refuses everything with 403 and a multi-kilobyte body,
/// as IMDS does when disabled on the instance, and as sandboxes' metadata proxies do.
struct RefusingImds {
    url: String,
    requests: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The body of every refusal: large, and marked, to find it if it reaches a log.
const IMDS_REFUSAL_MARK: &str = "imds-refusal-body";

impl RefusingImds {
    fn start() -> RefusingImds {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let body = format!(
            "<html><body>{}</body></html>",
            IMDS_REFUSAL_MARK.repeat(400)
        );
        let (count, stopped) = (Arc::clone(&requests), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let _ = write!(
                    stream,
                    "HTTP/1.1 403 Forbidden\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        RefusingImds {
            url,
            requests,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for RefusingImds {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// No credentials, and instance metadata refusing (403) rather than absent: the error still
/// lists every source the chain tried, in one line (it named only IMDS, the last), and the
/// SDK's WARN dumps of the raw refusals stay out of the log (they ran to kilobytes).
#[test]
fn refusing_instance_metadata_still_lists_every_source_and_logs_no_dump() {
    let imds = RefusingImds::start();
    let broker = AwsBroker::start(
        &[aws_provider("eks", "")],
        &[
            ("AWS_EC2_METADATA_DISABLED", "false".to_owned()),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url.clone()),
        ],
    );
    let out = shim_fails(
        &broker,
        "https://abc.gr7.us-west-2.eks.amazonaws.com",
        json!({"clusterName": "alpha"}),
    );
    let line = assert_shim_error(
        &out,
        &[
            "UNAVAILABLE",
            "no AWS credentials found",
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "IMDSv2",
            "alpha",
        ],
    );
    assert!(!line.contains(IMDS_REFUSAL_MARK), "{line}");
    assert!(
        imds.requests.load(Ordering::SeqCst) > 0,
        "the chain reached instance metadata"
    );
    let logs = broker.logs();
    for log_line in logs.lines() {
        assert!(
            log_line.len() < 2048 && !log_line.contains(IMDS_REFUSAL_MARK),
            "a {}-byte log line: {}",
            log_line.len(),
            &log_line[..log_line.len().min(600)]
        );
    }
    assert!(
        logs.contains("no AWS credentials found"),
        "the broker's own line says what failed:\n{logs}"
    );
}

/// A fake STS over TLS (trusted through SSL_CERT_FILE, on top of the system store): AccessDenied
/// on AssumeRole → PERMISSION_DENIED naming the role; the request it got was a correctly
/// signed AssumeRole for that role, session name and external id.
#[tokio::test(flavor = "multi_thread")]
async fn assume_role_denied_is_permission_denied() {
    let role = format!("arn:aws:iam::{ACCOUNT}:role/denied");
    let sts = FakeHttps::start(Arc::new(|_req: &Seen| {
        (
            403,
            sts_error(
                "AccessDenied",
                "User: arn:aws:iam::123456789012:user/base is not authorized to perform: sts:AssumeRole",
            ),
        )
    }));
    let dir = tempdir();
    let mut env = static_keys(None);
    env.push(("AWS_ENDPOINT_URL_STS", sts.url.clone()));
    env.push((
        "SSL_CERT_FILE",
        sts.ca_file(dir.path()).display().to_string(),
    ));
    let broker = AwsBroker::start(
        &[aws_provider(
            "eks",
            &format!(
                "region: us-west-2, roleArn: {}, externalId: ext-1234, sessionName: kueue",
                yaml_str(&role)
            ),
        )],
        &env,
    );
    let mut client = TokenServiceClient::new(unix_channel(broker.socket()).await);
    let status = client
        .get_token(GetTokenRequest {
            provider: "eks".into(),
            cluster: Some(cluster_with_name("alpha")),
            interactive: false,
        })
        .await
        .expect_err("denied");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(&role), "{}", status.message());
    assert!(
        status.message().contains("AccessDenied"),
        "{}",
        status.message()
    );
    assert!(
        !status.message().contains("ext-1234"),
        "{}",
        status.message()
    );
    assert!(!broker.logs().contains(STATIC_SECRET));

    let seen = sts.seen();
    assert_eq!(seen.len(), 1, "a denial is not retried: {seen:?}");
    let fields = form(&seen[0].body);
    assert_eq!(fields.get("Action").map(String::as_str), Some("AssumeRole"));
    assert_eq!(fields.get("RoleArn"), Some(&role));
    assert_eq!(
        fields.get("RoleSessionName").map(String::as_str),
        Some("kueue")
    );
    assert_eq!(
        fields.get("ExternalId").map(String::as_str),
        Some("ext-1234")
    );
    assert!(seen[0].headers["authorization"].contains(&format!("Credential={STATIC_KEY}/")));
    assert_signed_with_static_key(&seen, &sts.url);
}

/// Throttling and 5xx on renewal: the SDK retries with backoff, the broker backs off, and
/// the cached token is served meanwhile; once STS recovers a new token is served.
#[test]
fn throttling_and_5xx_are_retried_while_the_cached_token_is_served() {
    /// Short sessions make the broker renew within seconds (a token never outlives its
    /// session, and the cache refreshes at about half the token's life).
    const SESSION: Duration = Duration::from_secs(50);
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let (f, c, e) = (
        Arc::clone(&failing),
        Arc::clone(&calls),
        Arc::clone(&failures),
    );
    let sts = FakeHttps::start(Arc::new(move |_req: &Seen| {
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        if f.load(Ordering::SeqCst) {
            let k = e.fetch_add(1, Ordering::SeqCst);
            if k % 2 == 0 {
                (400, sts_error("Throttling", "Rate exceeded"))
            } else {
                (503, sts_error("ServiceUnavailable", "try again"))
            }
        } else {
            (200, assume_role_ok(n, SESSION))
        }
    }));
    let dir = tempdir();
    let mut env = static_keys(None);
    env.push(("AWS_ENDPOINT_URL_STS", sts.url.clone()));
    env.push((
        "SSL_CERT_FILE",
        sts.ca_file(dir.path()).display().to_string(),
    ));
    let role = format!("arn:aws:iam::{ACCOUNT}:role/kueue");
    let broker = AwsBroker::start(
        &[aws_provider(
            "eks",
            &format!("region: us-west-2, roleArn: {}", yaml_str(&role)),
        )],
        &env,
    );
    let cluster = json!({"clusterName": "alpha"});
    let first = token_for(&broker, "https://10.0.0.1", cluster.clone());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The token lives no longer than its 24 s session.
    let remaining = first.expiration - time::OffsetDateTime::now_utc();
    assert!(remaining <= time::Duration::seconds(51), "{remaining}");

    failing.store(true, Ordering::SeqCst);
    // The broker re-signs the token with the held session (no STS call) until that session
    // is half spent, then renews it: STS now fails (the SDK retries with backoff, then the
    // broker backs off), and every call is still answered with a token of the first session
    // until it nearly expires. Asked over gRPC: the shim's whole-second expiry check is not
    // what this test is about.
    let first_key = key_of(&first.token);
    let deadline = Instant::now() + SESSION - Duration::from_secs(2);
    while failures.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "no failing renewals seen; broker log:\n{}",
            broker.logs()
        );
        let again = grpc_token(broker.socket(), "alpha")
            .unwrap_or_else(|s| panic!("{s:?}; broker log:\n{}", broker.logs()));
        assert_eq!(
            key_of(&again),
            first_key,
            "served from the first session during the outage"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let failed_calls = calls.load(Ordering::SeqCst) - 1;
    failing.store(false, Ordering::SeqCst);
    let renewed = wait_until(Duration::from_secs(30), || {
        grpc_token(broker.socket(), "alpha").is_ok_and(|t| key_of(&t) != first_key)
    });
    assert!(
        renewed,
        "no token of a new session after STS recovered; log:\n{}",
        broker.logs()
    );
    assert!(failed_calls >= 2, "{failed_calls}");
    let requests = sts.seen();
    assert!(
        requests
            .iter()
            .all(|r| form(&r.body).get("Action").map(String::as_str) == Some("AssumeRole"))
    );
    assert_signed_with_static_key(&requests, &sts.url);
}

/// The access key a token was signed with.
fn key_of(token: &str) -> String {
    let d = decode_token(token).expect("token");
    let credential = d.get("X-Amz-Credential").expect("credential");
    credential.split('/').next().unwrap_or_default().to_owned()
}

/// One GetToken over gRPC for cluster `name` of provider `eks`: the token.
fn grpc_token(socket: &Path, name: &str) -> Result<String, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = TokenServiceClient::new(unix_channel(socket).await);
        client
            .get_token(GetTokenRequest {
                provider: "eks".into(),
                cluster: Some(cluster_with_name(name)),
                interactive: false,
            })
            .await
            .map(|r| r.into_inner().token)
    })
}

fn cluster_with_name(name: &str) -> Cluster {
    use prost_types::value::Kind;
    let mut fields = BTreeMap::new();
    fields.insert(
        "clusterName".to_owned(),
        prost_types::Value {
            kind: Some(Kind::StringValue(name.to_owned())),
        },
    );
    Cluster {
        server: "https://10.0.0.1".into(),
        config: Some(prost_types::Struct { fields }),
        ..Cluster::default()
    }
}

/// The whole IRSA flow at `RUST_LOG=trace` (the SDK's own trace output included): no token,
/// session token, secret key or web identity token in any log line.
#[test]
fn trace_logs_hold_no_secret() {
    // Asking for the signer's trace explicitly does not lift the cap either.
    for rust_log in ["trace", "trace,aws_sigv4=trace"] {
        irsa_flow_logs_no_secret(rust_log);
    }
}

fn irsa_flow_logs_no_secret(rust_log: &str) {
    let moto = Moto::start();
    let dir = tempdir();
    let token_file = dir.path().join("token");
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(br#"{"sub":"system:serviceaccount:kueue-system:trace","aud":"sts.amazonaws.com"}"#);
    let web_identity = format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2ln");
    std::fs::write(&token_file, &web_identity).expect("token");
    let broker = AwsBroker::start(
        &[aws_provider("eks", "")],
        &[
            ("RUST_LOG", rust_log.to_owned()),
            ("AWS_REGION", "us-west-2".to_owned()),
            (
                "AWS_ROLE_ARN",
                format!("arn:aws:iam::{ACCOUNT}:role/kueue-trace"),
            ),
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token_file.display().to_string(),
            ),
            ("AWS_ENDPOINT_URL_STS", moto.url.clone()),
        ],
    );
    let cred = token_for(
        &broker,
        "https://10.0.0.1",
        json!({"clusterName": "trace-1"}),
    );
    let d = check_shape(&cred.token, "sts.us-west-2.amazonaws.com").expect("an EKS-shaped token");
    let session = d.get("X-Amz-Security-Token").unwrap_or_default().to_owned();
    let signature = d.get("X-Amz-Signature").unwrap_or_default().to_owned();
    assert!(!session.is_empty() && !signature.is_empty());
    let logs = broker.logs();
    assert!(logs.lines().count() > 20, "trace logging is on:\n{logs}");
    for (what, secret) in [
        ("token", cred.token.as_str()),
        ("session token", session.as_str()),
        // Also as it would appear percent-encoded: its first characters are plain.
        ("session token prefix", &session[..20.min(session.len())]),
        ("signature", signature.as_str()),
        ("web identity token", web_identity.as_str()),
        ("secret key field", "SecretAccessKey"),
    ] {
        assert!(
            !logs.contains(secret),
            "the {what} is in the trace log:\n{logs}"
        );
    }
}
