//! End-to-end tests of the `azure` provider: the real broker and shim against a fake Entra ID
//! token endpoint served over TLS with a test CA (trusted only through `SSL_CERT_FILE` given
//! to the broker; `AZURE_AUTHORITY_HOST` points at it). The fake checks what it receives:
//! the path `/<tenant>/oauth2/v2.0/token`, the grant type, the assertion type, the assertion
//! (equal to the federated token file's content at that moment, or a verified RS256 JWT for
//! a certificate), the client secret, the scope. It also serves the App Service managed
//! identity route (`IDENTITY_ENDPOINT`), checking its header and query.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest};
use credbroker_tests::{
    BROKER, BROKER_TIMEOUT, V1, assert_credential, assert_shim_error, bin, exec_info, parse_form,
    run_shim, serve_tls, tempdir, tls_config, unix_channel, yaml_str,
};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};
use tempfile::TempDir;

const AKS_SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";
const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const OTHER_TENANT: &str = "fabrikam.onmicrosoft.com";
const CLIENT: &str = "11111111-2222-3333-4444-555555555555";
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// A realistic Entra error body: the description carries CR LF and trace ids.
const AADSTS700213: &str = r#"{"error":"invalid_client","error_description":"AADSTS700213: No matching federated identity record found for presented assertion subject 'system:serviceaccount:kueue-system:other'. Please check your federated identity credential Subject, Audience and Issuer against the presented assertion.\r\nTrace ID: 7e1d Correlation ID: 9f2a Timestamp: 2025-06-01 10:00:00Z","error_codes":[700213],"timestamp":"2025-06-01 10:00:00Z","trace_id":"7e1d","correlation_id":"9f2a"}"#;
const CERT_PEM: &str = include_str!("../fixtures/azure/client-cert.pem");
const CERT_PUBLIC_DER: &[u8] = include_bytes!("../fixtures/azure/client-public.der");
const CERT_SHA1_HEX: &str = include_str!("../fixtures/azure/client-cert.sha1");

// ---------------------------------------------------------------------------------------
// Fake Entra ID (and App Service managed identity endpoint) over TLS
// ---------------------------------------------------------------------------------------

/// One request the fake answered.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    headers: BTreeMap<String, String>,
    form: BTreeMap<String, String>,
}

/// What the fake demands of token requests; a request that breaks a rule is answered with
/// an error and the rule recorded in `violations`.
#[derive(Debug, Clone, Default)]
struct Expect {
    client_id: Option<String>,
    /// The assertion must equal this file's content at the time of the request.
    assertion_file: Option<PathBuf>,
    client_secret: Option<String>,
    /// The assertion must be an RS256 JWT signed by the fixture certificate's key.
    certificate: bool,
    /// `X-IDENTITY-HEADER` the managed identity route demands.
    identity_header: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    seen: Vec<Seen>,
    violations: Vec<String>,
    /// Sticky failure: every token request gets this answer.
    fail_with: Option<(u16, String)>,
    expires_in: u64,
    issued: u64,
    expect: Expect,
}

struct FakeEntra {
    url: String,
    ca_file: PathBuf,
    _dir: TempDir,
    state: Arc<Mutex<State>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeEntra {
    fn start(expect: Expect, expires_in: u64) -> FakeEntra {
        let dir = tempdir();
        let (ca_pem, tls) = tls_config();
        let ca_file = dir.path().join("test-ca.pem");
        std::fs::write(&ca_file, ca_pem).expect("write CA");
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State {
            expires_in,
            expect,
            ..State::default()
        }));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread_state = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve_tls(listener, tls, rx, move |req| {
                let state = Arc::clone(&thread_state);
                async move { answer(&state, req).await }
            }));
        });
        FakeEntra {
            url,
            ca_file,
            _dir: dir,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().expect("lock").seen.clone()
    }

    fn token_requests(&self) -> usize {
        self.seen().iter().filter(|s| s.method == "POST").count()
    }

    fn fail_with(&self, answer: Option<(u16, &str)>) {
        self.state.lock().expect("lock").fail_with = answer.map(|(s, b)| (s, b.to_owned()));
    }

    fn assert_no_violations(&self) {
        let v = self.state.lock().expect("lock").violations.clone();
        assert!(v.is_empty(), "the fake Entra ID saw bad requests: {v:#?}");
    }

    /// Waits (bounded) until at least `n` token requests arrived.
    fn wait_for_token_requests(&self, n: usize, timeout: Duration) -> bool {
        credbroker_tests::wait_until(timeout, || self.token_requests() >= n)
    }
}

impl Drop for FakeEntra {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn reply(status: u16, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("response")
}

async fn answer(state: &Mutex<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let query = parse_form(req.uri().query().unwrap_or(""));
    let headers: BTreeMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body_form = parse_form(&String::from_utf8_lossy(&body));
    let mut st = state.lock().expect("lock");
    st.seen.push(Seen {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        headers: headers.clone(),
        form: body_form.clone(),
    });
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    let expect = st.expect.clone();
    if method == "GET" && path == "/msi/token" {
        // App Service managed identity (IDENTITY_ENDPOINT) route.
        check(
            headers.get("x-identity-header") == expect.identity_header.as_ref(),
            format!("x-identity-header {:?}", headers.get("x-identity-header")),
        );
        check(
            query.get("api-version").map(String::as_str) == Some("2019-08-01"),
            format!("api-version {:?}", query.get("api-version")),
        );
        check(
            query.get("resource").map(String::as_str) == Some(AKS_SERVER_ID),
            format!("resource {:?}", query.get("resource")),
        );
        check(
            query.get("client_id") == expect.client_id.as_ref(),
            format!("client_id {:?}", query.get("client_id")),
        );
        if !problems.is_empty() {
            st.violations.extend(problems);
            return reply(400, json!({"error": "invalid_request"}).to_string());
        }
        st.issued += 1;
        let expires_on = unix_now() + st.expires_in;
        return reply(
            200,
            json!({"access_token": format!("msi-token-{}", st.issued),
                   "expires_on": expires_on.to_string(), "resource": AKS_SERVER_ID,
                   "token_type": "Bearer"})
            .to_string(),
        );
    }
    // Entra ID token endpoint: POST /<tenant>/oauth2/v2.0/token.
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let tenant = match parts.as_slice() {
        [tenant, "oauth2", "v2.0", "token"] if method == "POST" => (*tenant).to_owned(),
        _ => {
            st.violations.push(format!("unexpected {method} {path}"));
            return reply(404, "{}".into());
        }
    };
    let field = |k: &str| body_form.get(k).cloned().unwrap_or_default();
    check(
        headers
            .get("content-type")
            .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded")),
        format!("content-type {:?}", headers.get("content-type")),
    );
    check(
        field("grant_type") == "client_credentials",
        format!("grant_type {:?}", field("grant_type")),
    );
    let scope = field("scope");
    check(
        scope.ends_with("/.default") && !scope.contains(' '),
        format!("scope {scope:?}"),
    );
    if let Some(id) = &expect.client_id {
        check(
            field("client_id") == *id,
            format!("client_id {:?}", field("client_id")),
        );
    }
    if let Some(file) = &expect.assertion_file {
        let current = std::fs::read_to_string(file).unwrap_or_default();
        check(
            field("client_assertion_type") == JWT_BEARER,
            format!("client_assertion_type {:?}", field("client_assertion_type")),
        );
        check(
            field("client_assertion") == current,
            format!(
                "client_assertion {:?} is not the federated token file's content {current:?}",
                field("client_assertion")
            ),
        );
    }
    if let Some(secret) = &expect.client_secret {
        check(
            field("client_secret") == *secret,
            "client_secret differs".into(),
        );
        check(
            !body_form.contains_key("client_assertion"),
            "an assertion with a secret".into(),
        );
    }
    if expect.certificate {
        check(
            field("client_assertion_type") == JWT_BEARER,
            format!("client_assertion_type {:?}", field("client_assertion_type")),
        );
        if let Err(why) = check_certificate_assertion(
            &field("client_assertion"),
            &format!(
                "{}{path}",
                headers
                    .get("host")
                    .map_or(String::new(), |h| format!("https://{h}"))
            ),
        ) {
            check(false, why);
        }
    }
    if !problems.is_empty() {
        st.violations.extend(problems.clone());
        return reply(
            400,
            json!({"error": "invalid_request", "error_description": format!("fake Entra ID: {}", problems.join("; ")), "error_codes": [90014]}).to_string(),
        );
    }
    if let Some((status, body)) = st.fail_with.clone() {
        return reply(status, body);
    }
    st.issued += 1;
    let server = scope.trim_end_matches("/.default");
    let short = &server[..server.len().min(8)];
    reply(
        200,
        json!({"token_type": "Bearer", "expires_in": st.expires_in, "ext_expires_in": st.expires_in,
               "access_token": format!("entra-{tenant}-{short}-{}", st.issued)})
        .to_string(),
    )
}

/// Checks an RS256 client assertion signed by the fixture certificate's key, for `audience`.
fn check_certificate_assertion(jwt: &str, audience: &str) -> Result<(), String> {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [h, c, s] = parts.as_slice() else {
        return Err(format!("assertion is not a JWT: {} parts", parts.len()));
    };
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let decode = |p: &str| b64url.decode(p).map_err(|e| format!("base64url: {e}"));
    let header: Value = serde_json::from_slice(&decode(h)?).map_err(|e| e.to_string())?;
    let claims: Value = serde_json::from_slice(&decode(c)?).map_err(|e| e.to_string())?;
    let sha1: Vec<u8> = (0..CERT_SHA1_HEX.trim().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&CERT_SHA1_HEX.trim()[i..i + 2], 16).unwrap_or(0))
        .collect();
    if header["alg"] != "RS256" || header["x5t"] != b64url.encode(sha1) {
        return Err(format!("assertion header {header}"));
    }
    let now = unix_now();
    let exp = claims["exp"].as_u64().unwrap_or(0);
    if claims["aud"] != audience
        || claims["iss"] != CLIENT
        || claims["sub"] != CLIENT
        || exp <= now
        || claims["jti"].as_str().is_none_or(str::is_empty)
    {
        return Err(format!("assertion claims {claims} (audience {audience})"));
    }
    let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
    let rs256 = algs
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == rustls::SignatureScheme::RSA_PKCS1_SHA256)
        .map(|(_, a)| a[0])
        .ok_or("no RS256 verifier")?;
    rs256
        .verify_signature(CERT_PUBLIC_DER, format!("{h}.{c}").as_bytes(), &decode(s)?)
        .map_err(|_| "assertion signature does not verify with the certificate's key".to_owned())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

// ---------------------------------------------------------------------------------------
// A broker with its own environment
// ---------------------------------------------------------------------------------------

/// Variables the broker must not inherit from whoever runs the tests.
const SCRUBBED: &[&str] = &[
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_AUTHORITY_HOST",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "AZURE_CLIENT_SEND_CERTIFICATE_CHAIN",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "IMDS_ENDPOINT",
    "MSI_ENDPOINT",
    "MSI_SECRET",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// `credbroker serve` with an `azure` provider named `aks` and the given environment;
/// killed on drop.
struct AzureBroker {
    dir: TempDir,
    socket: PathBuf,
    child: Child,
}

impl AzureBroker {
    fn start(azure_section: &str, env: &[(&str, String)]) -> AzureBroker {
        Self::start_allowing(azure_section, "{}", env)
    }

    /// Like [`AzureBroker::start`], with the provider's `allowOverrides` (a flow mapping).
    fn start_allowing(
        azure_section: &str,
        allow_overrides: &str,
        env: &[(&str, String)],
    ) -> AzureBroker {
        let dir = tempdir();
        let socket = dir.path().join("broker.sock");
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "socket: {{path: {}}}\nproviders:\n  - name: aks\n    type: azure\n    allowOverrides: {allow_overrides}\n    azure: {azure_section}\n",
                yaml_str(socket.to_str().expect("UTF-8"))
            ),
        )
        .expect("config");
        let log = std::fs::File::create(dir.path().join("broker.log")).expect("log");
        let mut cmd = Command::new(bin(BROKER));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .env("RUST_LOG", "info");
        for var in SCRUBBED {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn credbroker");
        let mut broker = AzureBroker { dir, socket, child };
        let deadline = Instant::now() + BROKER_TIMEOUT;
        while UnixStream::connect(&broker.socket).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!("credbroker exited ({status}): {}", broker.logs());
            }
            assert!(
                Instant::now() < deadline,
                "credbroker did not listen: {}",
                broker.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        broker
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// One shim call for a cluster whose exec extension is `config`; returns the token.
    fn token(&self, config: Value) -> String {
        let info = exec_info(V1, "https://aks.example:443", config);
        let out = run_shim(&self.socket, &["--provider", "aks"], Some(&info));
        if !out.status.success() {
            panic!(
                "shim failed: {}\nbroker log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.logs()
            );
        }
        assert_credential(&out, V1).token
    }

    /// One shim call expected to fail; returns its stderr line.
    fn shim_error(&self, config: Value, needles: &[&str]) -> String {
        let info = exec_info(V1, "https://aks.example:443", config);
        let out = run_shim(&self.socket, &["--provider", "aks"], Some(&info));
        assert_shim_error(&out, needles)
    }

    /// One GetToken over gRPC: the status code a failure carries.
    fn grpc(&self, config: Value) -> Result<String, tonic::Status> {
        use prost_types::value::Kind;
        let Value::Object(map) = config else {
            panic!("config must be an object")
        };
        let fields = map
            .into_iter()
            .map(|(k, v)| {
                let s = v.as_str().expect("string values only").to_owned();
                (
                    k,
                    prost_types::Value {
                        kind: Some(Kind::StringValue(s)),
                    },
                )
            })
            .collect();
        let socket = self.socket.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut client = TokenServiceClient::new(unix_channel(&socket).await);
            client
                .get_token(GetTokenRequest {
                    provider: "aks".into(),
                    cluster: Some(Cluster {
                        server: "https://aks.example:443".into(),
                        config: Some(prost_types::Struct { fields }),
                        ..Cluster::default()
                    }),
                    interactive: false,
                })
                .await
                .map(|r| r.into_inner().token)
        })
    }
}

impl Drop for AzureBroker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A federated token file, rotated the way kubelet's atomic writer does it.
struct TokenFile {
    dir: TempDir,
}

impl TokenFile {
    fn new(content: &str) -> TokenFile {
        let file = TokenFile { dir: tempdir() };
        file.write(content);
        file
    }
    fn path(&self) -> PathBuf {
        self.dir.path().join("azure-identity-token")
    }
    fn write(&self, content: &str) {
        let tmp = self.dir.path().join("..data_tmp");
        std::fs::write(&tmp, content).expect("write token");
        std::fs::rename(&tmp, self.path()).expect("rotate token");
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("UTF-8 path").to_owned()
}

/// The workload identity environment the AKS webhook injects, pointed at the fake.
fn workload_env(entra: &FakeEntra, file: &TokenFile) -> Vec<(&'static str, String)> {
    vec![
        ("AZURE_CLIENT_ID", CLIENT.to_owned()),
        ("AZURE_TENANT_ID", TENANT.to_owned()),
        ("AZURE_FEDERATED_TOKEN_FILE", path_str(&file.path())),
        ("AZURE_AUTHORITY_HOST", entra.url.clone()),
        ("SSL_CERT_FILE", path_str(&entra.ca_file)),
    ]
}

fn workload_expect(file: &TokenFile) -> Expect {
    Expect {
        client_id: Some(CLIENT.into()),
        assertion_file: Some(file.path()),
        ..Expect::default()
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[test]
fn workload_identity_over_tls_three_clusters_share_one_token_request() {
    let file = TokenFile::new("federated-sa-token-1");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    // `credential: auto`: the workload identity environment decides.
    let broker = AzureBroker::start("{}", &workload_env(&entra, &file));
    let tokens: Vec<String> = ["east", "west", "north"]
        .iter()
        .map(|c| broker.token(json!({"clusterName": c})))
        .collect();
    entra.assert_no_violations();
    assert_eq!(
        entra.token_requests(),
        1,
        "3 clusters, one identity: one request"
    );
    assert!(tokens.iter().all(|t| t == &tokens[0]), "{tokens:?}");
    assert!(
        tokens[0].starts_with(&format!("entra-{TENANT}-6dae42f8-")),
        "{}",
        tokens[0]
    );
    let r = &entra.seen()[0];
    assert_eq!(r.path, format!("/{TENANT}/oauth2/v2.0/token"));
    assert_eq!(r.form["grant_type"], "client_credentials");
    assert_eq!(r.form["client_assertion_type"], JWT_BEARER);
    assert_eq!(r.form["client_assertion"], "federated-sa-token-1");
    assert_eq!(r.form["scope"], format!("{AKS_SERVER_ID}/.default"));
}

#[test]
fn a_rotated_federated_token_is_used_by_the_next_upstream_request() {
    let file = TokenFile::new("federated-sa-token-A");
    // A 6 s token: the cache serves it ~4.5 s, then the next call goes upstream.
    let entra = FakeEntra::start(workload_expect(&file), 6);
    let broker = AzureBroker::start(
        "{credential: workloadIdentity}",
        &workload_env(&entra, &file),
    );
    let first = broker.token(json!({"clusterName": "a"}));
    file.write("federated-sa-token-B");
    // While the token is fresh the cache answers; no upstream request, no file read.
    assert_eq!(broker.token(json!({"clusterName": "b"})), first);
    assert_eq!(entra.token_requests(), 1);
    std::thread::sleep(Duration::from_secs(5));
    let second = broker.token(json!({"clusterName": "a"}));
    assert_ne!(first, second);
    entra.assert_no_violations();
    let assertions: Vec<String> = entra
        .seen()
        .iter()
        .map(|s| s.form["client_assertion"].clone())
        .collect();
    assert_eq!(
        &assertions[..2],
        ["federated-sa-token-A", "federated-sa-token-B"],
        "the request after the rotation must carry the new file content"
    );
}

#[test]
fn per_cluster_tenant_and_server_id_get_their_own_entries_and_requests() {
    let file = TokenFile::new("federated");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    let broker = AzureBroker::start_allowing(
        "{}",
        &format!("{{tenantId: [{OTHER_TENANT}], serverId: [\"api://aks-*\"]}}"),
        &workload_env(&entra, &file),
    );
    let default = broker.token(json!({"clusterName": "a"}));
    let tenant2 = broker.token(json!({"clusterName": "b", "tenantId": OTHER_TENANT}));
    let server2 = broker.token(json!({"clusterName": "c", "serverId": "api://aks-private-app"}));
    // Same overrides again: served from their entries.
    assert_eq!(
        broker.token(json!({"clusterName": "d", "tenantId": OTHER_TENANT})),
        tenant2
    );
    assert_eq!(broker.token(json!({"clusterName": "e"})), default);
    // An audience allowOverrides does not match is refused before Entra is asked.
    let status = broker
        .grpc(json!({"clusterName": "f", "serverId": "https://graph.microsoft.com"}))
        .expect_err("an audience outside allowOverrides");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("override refused")
            && status.message().contains("allowOverrides.serverId"),
        "{}",
        status.message()
    );
    entra.assert_no_violations();
    let seen = entra.seen();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert_eq!(seen[0].path, format!("/{TENANT}/oauth2/v2.0/token"));
    assert_eq!(seen[1].path, format!("/{OTHER_TENANT}/oauth2/v2.0/token"));
    assert_eq!(seen[1].form["scope"], format!("{AKS_SERVER_ID}/.default"));
    assert_eq!(seen[2].path, format!("/{TENANT}/oauth2/v2.0/token"));
    assert_eq!(seen[2].form["scope"], "api://aks-private-app/.default");
    assert!(
        tenant2.starts_with(&format!("entra-{OTHER_TENANT}-")),
        "{tenant2}"
    );
    assert_ne!(default, server2);
}

#[test]
fn client_secret_service_principal() {
    let entra = FakeEntra::start(
        Expect {
            client_id: Some(CLIENT.into()),
            client_secret: Some("sp-secret-value".into()),
            ..Expect::default()
        },
        3600,
    );
    let broker = AzureBroker::start(
        &format!(
            "{{credential: clientSecret, tenantId: {TENANT}, authorityHost: {}}}",
            yaml_str(&entra.url)
        ),
        &[
            ("AZURE_CLIENT_ID", CLIENT.to_owned()),
            ("AZURE_CLIENT_SECRET", "sp-secret-value".to_owned()),
            ("SSL_CERT_FILE", path_str(&entra.ca_file)),
        ],
    );
    let token = broker.token(json!({"clusterName": "a"}));
    assert!(token.starts_with(&format!("entra-{TENANT}-")), "{token}");
    entra.assert_no_violations();
    assert_eq!(entra.token_requests(), 1);
    assert!(!broker.logs().contains("sp-secret-value"));
}

#[test]
fn client_certificate_service_principal_signs_a_verified_assertion() {
    let entra = FakeEntra::start(
        Expect {
            client_id: Some(CLIENT.into()),
            certificate: true,
            ..Expect::default()
        },
        3600,
    );
    let dir = tempdir();
    let pem = dir.path().join("sp.pem");
    std::fs::write(&pem, CERT_PEM).expect("write pem");
    let broker = AzureBroker::start(
        &format!(
            "{{credential: clientCertificate, clientCertificatePath: {}}}",
            yaml_str(path_str(&pem))
        ),
        &[
            ("AZURE_CLIENT_ID", CLIENT.to_owned()),
            ("AZURE_TENANT_ID", TENANT.to_owned()),
            ("AZURE_AUTHORITY_HOST", entra.url.clone()),
            ("SSL_CERT_FILE", path_str(&entra.ca_file)),
        ],
    );
    broker.token(json!({"clusterName": "a"}));
    entra.assert_no_violations();
    assert_eq!(entra.token_requests(), 1);
}

#[test]
fn managed_identity_through_the_identity_endpoint() {
    let entra = FakeEntra::start(
        Expect {
            client_id: Some("mi-client-id".into()),
            identity_header: Some("identity-header-value".into()),
            ..Expect::default()
        },
        3600,
    );
    // `auto` with no workload identity: IDENTITY_ENDPOINT says there is a managed identity.
    let broker = AzureBroker::start_allowing(
        "{clientId: mi-client-id}",
        "{tenantId: [\"*\"]}",
        &[
            ("IDENTITY_ENDPOINT", format!("{}/msi/token", entra.url)),
            ("IDENTITY_HEADER", "identity-header-value".to_owned()),
            ("SSL_CERT_FILE", path_str(&entra.ca_file)),
        ],
    );
    let a = broker.token(json!({"clusterName": "a"}));
    let b = broker.token(json!({"clusterName": "b"}));
    assert_eq!(a, "msi-token-1");
    assert_eq!(b, a);
    entra.assert_no_violations();
    let seen = entra.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].query["resource"], AKS_SERVER_ID);
    assert_eq!(
        seen[0].headers["x-identity-header"],
        "identity-header-value"
    );
    // A per-cluster tenant cannot be honoured by a managed identity: a clear refusal.
    let status = broker
        .grpc(json!({"clusterName": "c", "tenantId": OTHER_TENANT}))
        .expect_err("tenantId with a managed identity");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("managed identity"),
        "{}",
        status.message()
    );
}

#[test]
fn aadsts_errors_are_permission_denied_with_code_and_meaning() {
    let file = TokenFile::new("federated");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    entra.fail_with(Some((400, AADSTS700213)));
    let broker = AzureBroker::start("{}", &workload_env(&entra, &file));
    let status = broker
        .grpc(json!({"clusterName": "a"}))
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    let msg = status.message();
    assert!(
        msg.contains(
            "AADSTS700213 (no federated credential on the application matches the token's subject"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("system:serviceaccount:kueue-system:other"),
        "{msg}"
    );
    assert!(msg.contains(CLIENT) && msg.contains(TENANT), "{msg}");
    assert!(!msg.contains("Trace ID") && !msg.contains('\n'), "{msg}");
    assert!(
        !msg.contains("federated\""),
        "the assertion must not be echoed: {msg}"
    );
    // Through the shim: one line, PERMISSION_DENIED, the code.
    broker.shim_error(
        json!({"clusterName": "b"}),
        &["PERMISSION_DENIED", "AADSTS700213"],
    );
    // Denied is not cached: once the federated credential is fixed, the next call works.
    entra.fail_with(None);
    broker.token(json!({"clusterName": "a"}));
    entra.assert_no_violations();
}

#[test]
fn endpoint_down_is_unavailable_with_backoff_while_the_cached_token_is_served() {
    let file = TokenFile::new("federated");
    // 14 s tokens: refresh is due after 5.6–8.4 s (half the lifetime ± 10 %), the cached
    // one is served until 10.5 s (three quarters, for a token this short).
    let entra = FakeEntra::start(workload_expect(&file), 14);
    let broker = AzureBroker::start_allowing(
        "{}",
        &format!("{{tenantId: [{OTHER_TENANT}]}}"),
        &workload_env(&entra, &file),
    );
    let cached = broker.token(json!({"clusterName": "a"}));
    entra.fail_with(Some((503, r#"{"error":"temporarily_unavailable","error_description":"AADSTS90033: A transient error has occurred. Please try again.","error_codes":[90033]}"#)));
    std::thread::sleep(Duration::from_millis(8_500));
    // Past the refresh time: the caller still gets the cached token at once, and a
    // background refresh goes upstream (and fails).
    assert_eq!(broker.token(json!({"clusterName": "b"})), cached);
    assert!(entra.wait_for_token_requests(2, Duration::from_secs(10)));
    assert_eq!(broker.token(json!({"clusterName": "c"})), cached);
    // An identity with nothing cached: UNAVAILABLE.
    let other = json!({"clusterName": "d", "tenantId": OTHER_TENANT});
    let status = broker.grpc(other.clone()).expect_err("down");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("HTTP 503"),
        "{}",
        status.message()
    );
    let before = entra.token_requests();
    // Right after a failure the entry backs off: no new upstream request.
    let status = broker.grpc(other.clone()).expect_err("backing off");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("retrying in"),
        "{}",
        status.message()
    );
    assert_eq!(entra.token_requests(), before);
    // The endpoint comes back: after the backoff, a new token.
    entra.fail_with(None);
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        broker
            .token(other)
            .starts_with(&format!("entra-{OTHER_TENANT}-"))
    );
    entra.assert_no_violations();
}

#[test]
fn an_unreachable_authority_is_unavailable() {
    let file = TokenFile::new("federated");
    let closed = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let entra = FakeEntra::start(Expect::default(), 3600);
    let mut env = workload_env(&entra, &file);
    env.retain(|(k, _)| *k != "AZURE_AUTHORITY_HOST");
    env.push(("AZURE_AUTHORITY_HOST", format!("https://{closed}")));
    let broker = AzureBroker::start("{}", &env);
    let status = broker.grpc(json!({"clusterName": "a"})).expect_err("down");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&closed.to_string()),
        "{}",
        status.message()
    );
}

#[test]
fn missing_environment_names_the_variables() {
    let broker = AzureBroker::start("{credential: workloadIdentity}", &[]);
    let line = broker.shim_error(
        json!({"clusterName": "a"}),
        &[
            "AZURE_CLIENT_ID",
            "AZURE_TENANT_ID",
            "AZURE_FEDERATED_TOKEN_FILE",
        ],
    );
    assert!(line.contains("workload identity"), "{line}");
    let broker = AzureBroker::start(
        "{credential: clientSecret, tenantId: t}",
        &[("AZURE_CLIENT_ID", CLIENT.to_owned())],
    );
    let status = broker
        .grpc(json!({"clusterName": "a"}))
        .expect_err("no secret");
    assert!(
        status.message().contains("AZURE_CLIENT_SECRET"),
        "{}",
        status.message()
    );
    assert!(
        !status.message().contains("AZURE_CLIENT_ID"),
        "{}",
        status.message()
    );
}

#[test]
fn the_test_ca_is_trusted_only_through_ssl_cert_file() {
    let file = TokenFile::new("federated");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    let mut env = workload_env(&entra, &file);
    env.retain(|(k, _)| *k != "SSL_CERT_FILE");
    let broker = AzureBroker::start("{}", &env);
    let status = broker
        .grpc(json!({"clusterName": "a"}))
        .expect_err("untrusted");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().to_lowercase().contains("certificate"),
        "{}",
        status.message()
    );
    assert_eq!(entra.token_requests(), 0);
}

/// A CONNECT proxy on 127.0.0.1 that records each tunnel's target; stops on drop.
struct ConnectProxy {
    url: String,
    targets: Arc<Mutex<Vec<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ConnectProxy {
    fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, s) = (Arc::clone(&targets), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let t = Arc::clone(&t);
                        std::thread::spawn(move || tunnel(client, &t));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        ConnectProxy {
            url,
            targets,
            stop,
            thread: Some(thread),
        }
    }

    fn targets(&self) -> Vec<String> {
        self.targets.lock().expect("lock").clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn tunnel(mut client: TcpStream, targets: &Mutex<Vec<String>>) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let Some(target) = head
        .strip_prefix("CONNECT ")
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_owned)
    else {
        let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n");
        return;
    };
    targets.lock().expect("lock").push(target.clone());
    let Ok(upstream) = TcpStream::connect(&target) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
        return;
    };
    let _ = client.set_read_timeout(None);
    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    let (mut c2, mut u2) = (
        client.try_clone().expect("clone"),
        upstream.try_clone().expect("clone"),
    );
    let (mut c1, mut u1) = (client, upstream);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c1, &mut u1);
        let _ = u1.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut u2, &mut c2);
    let _ = c2.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

#[test]
fn https_proxy_is_used_and_no_proxy_is_honoured() {
    let file = TokenFile::new("federated");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    let proxy = ConnectProxy::start();
    let port = entra.url.rsplit(':').next().expect("port").to_owned();
    // `localhost`: hosts on loopback addresses may be exempt from proxying by convention.
    let mut env = workload_env(&entra, &file);
    env.retain(|(k, _)| *k != "AZURE_AUTHORITY_HOST");
    env.push(("AZURE_AUTHORITY_HOST", format!("https://localhost:{port}")));
    env.push(("HTTPS_PROXY", proxy.url.clone()));
    let broker = AzureBroker::start("{}", &env);
    broker.token(json!({"clusterName": "a"}));
    assert_eq!(proxy.targets(), [format!("localhost:{port}")]);
    drop(broker);

    env.push(("NO_PROXY", "localhost".to_owned()));
    let broker = AzureBroker::start("{}", &env);
    broker.token(json!({"clusterName": "a"}));
    assert_eq!(
        proxy.targets().len(),
        1,
        "NO_PROXY=localhost must bypass the proxy"
    );
    entra.assert_no_violations();
    assert_eq!(entra.token_requests(), 2);
}

#[test]
fn check_config_rejects_bad_azure_sections() {
    let dir = tempdir();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "providers:\n  - name: aks\n    type: azure\n    azure: {credential: managedIdentity, tenantId: t}\n",
    )
    .expect("write");
    let out = credbroker_tests::run_broker_cli(&["check-config".to_owned(), path_str(&config)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("providers[0].azure.tenantId"), "{err}");
}

/// Workload identity at `RUST_LOG=trace` (dependencies included): neither the access token
/// nor the federated token appears in any log line.
#[test]
fn trace_logs_hold_no_secret() {
    let file = TokenFile::new("federated-trace-secret-token");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    let mut env = workload_env(&entra, &file);
    env.push(("RUST_LOG", "trace".to_owned()));
    let broker = AzureBroker::start("{}", &env);
    let token = broker.token(json!({"clusterName": "trace"}));
    entra.assert_no_violations();
    let logs = broker.logs();
    assert!(logs.lines().count() > 20, "trace logging is on:\n{logs}");
    for (what, secret) in [
        ("access token", token.as_str()),
        ("federated token", "federated-trace-secret-token"),
    ] {
        assert!(
            !logs.contains(secret),
            "the {what} is in the trace log:\n{logs}"
        );
    }
}

#[test]
fn a_token_with_control_characters_from_entra_is_refused_like_any_provider_s() {
    let file = TokenFile::new("federated");
    let entra = FakeEntra::start(workload_expect(&file), 3600);
    entra.fail_with(Some((
        200,
        r#"{"token_type":"Bearer","expires_in":3600,"ext_expires_in":3600,"access_token":"entra-sekrit\r\nX-Injected: 1"}"#,
    )));
    let broker = AzureBroker::start("{}", &workload_env(&entra, &file));
    let line = broker.shim_error(json!({"clusterName": "a"}), &["control character"]);
    assert!(!line.contains("sekrit"), "{line}");
    assert!(!broker.logs().contains("sekrit"), "{}", broker.logs());
}
