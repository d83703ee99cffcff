//! End-to-end tests of the `azure` provider: the real broker and shim against a fake Entra ID
//! token endpoint served over TLS with a test CA (trusted only through `SSL_CERT_FILE` given
//! to the broker; `AZURE_AUTHORITY_HOST` points at it). The fake
//! (`credbroker_tests::fakes::entra`) checks what it receives: the path
//! `/<tenant>/oauth2/v2.0/token`, the grant type, the assertion type, the assertion (equal to
//! the federated token file's content at that moment, or a verified RS256 JWT for a
//! certificate), the client secret, the scope. It also serves the App Service managed
//! identity route (`IDENTITY_ENDPOINT`), checking its header and query.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use credbroker_tests::fakes::entra::{
    AKS_SERVER_ID, CERT_PEM, CLIENT, Expect, FakeEntra, JWT_BEARER,
};
use credbroker_tests::{
    Broker, V1, assert_credential, assert_shim_error, cluster, exec_info, get_token_blocking,
    provider, run_shim, tempdir, yaml_str,
};
use serde_json::{Value, json};
use tempfile::TempDir;

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const OTHER_TENANT: &str = "fabrikam.onmicrosoft.com";
/// A realistic Entra error body: the description carries CR LF and trace ids.
const AADSTS700213: &str = r#"{"error":"invalid_client","error_description":"AADSTS700213: No matching federated identity record found for presented assertion subject 'system:serviceaccount:kueue-system:other'. Please check your federated identity credential Subject, Audience and Issuer against the presented assertion.\r\nTrace ID: 7e1d Correlation ID: 9f2a Timestamp: 2025-06-01 10:00:00Z","error_codes":[700213],"timestamp":"2025-06-01 10:00:00Z","trace_id":"7e1d","correlation_id":"9f2a"}"#;

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

/// The broker's `engine::cache::DENIAL_RETRY_AFTER`: how long a denied identity stays denied.
const DENIAL_RETRY_AFTER: Duration = Duration::from_secs(5);

/// `credbroker serve` with an `azure` provider named `aks` (`azure_section` is its `azure:`
/// flow mapping), none of [`SCRUBBED`], `RUST_LOG=info`, then `env`.
fn azure_broker(azure_section: &str, env: &[(&str, String)]) -> Broker {
    azure_broker_allowing(azure_section, "{}", env)
}

/// Like [`azure_broker`], with the provider's `allowOverrides` (a flow mapping).
fn azure_broker_allowing(
    azure_section: &str,
    allow_overrides: &str,
    env: &[(&str, String)],
) -> Broker {
    let allow = format!("allowOverrides: {allow_overrides}");
    let mut builder = Broker::builder()
        .provider(provider("aks", "azure", azure_section, &[&allow]))
        .env("RUST_LOG", "info");
    for var in SCRUBBED {
        builder = builder.env_remove(var);
    }
    builder.envs(env).start()
}

/// The calls these tests make of a broker with the `aks` provider.
trait AksCalls {
    /// One shim call for a cluster whose exec extension is `config`; returns the token.
    fn token(&self, config: Value) -> String;
    /// One shim call expected to fail; returns its stderr line.
    fn shim_error(&self, config: Value, needles: &[&str]) -> String;
    /// One GetToken over gRPC: the token, or the status a failure carries.
    fn grpc(&self, config: Value) -> Result<String, tonic::Status>;
}

impl AksCalls for Broker {
    fn token(&self, config: Value) -> String {
        let info = exec_info(V1, "https://aks.example:443", config);
        let out = run_shim(self.socket(), &["--provider", "aks"], Some(&info));
        if !out.status.success() {
            panic!(
                "shim failed: {}\nbroker log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.logs()
            );
        }
        assert_credential(&out, V1).token
    }

    fn shim_error(&self, config: Value, needles: &[&str]) -> String {
        let info = exec_info(V1, "https://aks.example:443", config);
        let out = run_shim(self.socket(), &["--provider", "aks"], Some(&info));
        assert_shim_error(&out, needles)
    }

    fn grpc(&self, config: Value) -> Result<String, tonic::Status> {
        get_token_blocking(
            self.socket(),
            "aks",
            cluster("https://aks.example:443", &config),
        )
        .map(|r| r.token)
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
        ("AZURE_AUTHORITY_HOST", entra.url().to_owned()),
        ("SSL_CERT_FILE", path_str(entra.ca_file())),
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
    let broker = azure_broker("{}", &workload_env(&entra, &file));
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
    assert_eq!(r.form()["grant_type"], "client_credentials");
    assert_eq!(r.form()["client_assertion_type"], JWT_BEARER);
    assert_eq!(r.form()["client_assertion"], "federated-sa-token-1");
    assert_eq!(r.form()["scope"], format!("{AKS_SERVER_ID}/.default"));
}

#[test]
fn a_rotated_federated_token_is_used_by_the_next_upstream_request() {
    let file = TokenFile::new("federated-sa-token-A");
    // A 6 s token: the cache serves it ~4.5 s, then the next call goes upstream.
    let entra = FakeEntra::start(workload_expect(&file), 6);
    let broker = azure_broker(
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
        .map(|s| s.form()["client_assertion"].clone())
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
    let broker = azure_broker_allowing(
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
    assert_eq!(seen[1].form()["scope"], format!("{AKS_SERVER_ID}/.default"));
    assert_eq!(seen[2].path, format!("/{TENANT}/oauth2/v2.0/token"));
    assert_eq!(seen[2].form()["scope"], "api://aks-private-app/.default");
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
    let broker = azure_broker(
        &format!(
            "{{credential: clientSecret, tenantId: {TENANT}, authorityHost: {}}}",
            yaml_str(entra.url())
        ),
        &[
            ("AZURE_CLIENT_ID", CLIENT.to_owned()),
            ("AZURE_CLIENT_SECRET", "sp-secret-value".to_owned()),
            ("SSL_CERT_FILE", path_str(entra.ca_file())),
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
    let broker = azure_broker(
        &format!(
            "{{credential: clientCertificate, clientCertificatePath: {}}}",
            yaml_str(path_str(&pem))
        ),
        &[
            ("AZURE_CLIENT_ID", CLIENT.to_owned()),
            ("AZURE_TENANT_ID", TENANT.to_owned()),
            ("AZURE_AUTHORITY_HOST", entra.url().to_owned()),
            ("SSL_CERT_FILE", path_str(entra.ca_file())),
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
    let broker = azure_broker_allowing(
        "{clientId: mi-client-id}",
        "{tenantId: [\"*\"]}",
        &[
            ("IDENTITY_ENDPOINT", format!("{}/msi/token", entra.url())),
            ("IDENTITY_HEADER", "identity-header-value".to_owned()),
            ("SSL_CERT_FILE", path_str(entra.ca_file())),
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
    let broker = azure_broker("{}", &workload_env(&entra, &file));
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
    // The denial stands for the broker's 5 s (`DENIAL_RETRY_AFTER`), whoever asks: one
    // Entra request per identity, not one per cluster. Once the federated credential is
    // fixed, the first call after it asks Entra again and works.
    let requests = entra.seen().len();
    entra.fail_with(None);
    broker.shim_error(
        json!({"clusterName": "c"}),
        &["PERMISSION_DENIED", "AADSTS700213", "retrying in"],
    );
    assert_eq!(entra.seen().len(), requests, "asked Entra again at once");
    std::thread::sleep(DENIAL_RETRY_AFTER);
    broker.token(json!({"clusterName": "a"}));
    assert_eq!(entra.seen().len(), requests + 1);
    entra.assert_no_violations();
}

#[test]
fn endpoint_down_is_unavailable_with_backoff_while_the_cached_token_is_served() {
    let file = TokenFile::new("federated");
    // 14 s tokens: refresh is due after 5.6–8.4 s (half the lifetime ± 10 %), the cached
    // one is served until 10.5 s (three quarters, for a token this short).
    let entra = FakeEntra::start(workload_expect(&file), 14);
    let broker = azure_broker_allowing(
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
    let broker = azure_broker("{}", &env);
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
    let broker = azure_broker("{credential: workloadIdentity}", &[]);
    let line = broker.shim_error(
        json!({"clusterName": "a"}),
        &[
            "AZURE_CLIENT_ID",
            "AZURE_TENANT_ID",
            "AZURE_FEDERATED_TOKEN_FILE",
        ],
    );
    assert!(line.contains("workload identity"), "{line}");
    let broker = azure_broker(
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
    let broker = azure_broker("{}", &env);
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
    let port = entra.url().rsplit(':').next().expect("port").to_owned();
    // `localhost`: hosts on loopback addresses may be exempt from proxying by convention.
    let mut env = workload_env(&entra, &file);
    env.retain(|(k, _)| *k != "AZURE_AUTHORITY_HOST");
    env.push(("AZURE_AUTHORITY_HOST", format!("https://localhost:{port}")));
    env.push(("HTTPS_PROXY", proxy.url.clone()));
    let broker = azure_broker("{}", &env);
    broker.token(json!({"clusterName": "a"}));
    assert_eq!(proxy.targets(), [format!("localhost:{port}")]);
    drop(broker);

    env.push(("NO_PROXY", "localhost".to_owned()));
    let broker = azure_broker("{}", &env);
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
    let broker = azure_broker("{}", &env);
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
    let broker = azure_broker("{}", &workload_env(&entra, &file));
    let line = broker.shim_error(json!({"clusterName": "a"}), &["control character"]);
    assert!(!line.contains("sekrit"), "{line}");
    assert!(!broker.logs().contains("sekrit"), "{}", broker.logs());
}
