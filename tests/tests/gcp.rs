//! `type: gcp` end to end: the real broker and shim against local fakes of Google's token
//! endpoints (plain HTTP on 127.0.0.1, which the URLs in credential files allow). Every fake
//! checks what it receives: RS256 signatures against the key's public key, JWT claims,
//! scopes, subject tokens, bearer tokens, the `Metadata-Flavor` header. The fakes live in
//! the harness (`credbroker_tests::fakes::gce_metadata`).
//!
//! The broker runs with a controlled environment (no ambient Google credentials, `HOME` in a
//! temp dir, `GCE_METADATA_HOST` on a fake or a dead port), so nothing here can reach Google.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use credbroker_proto::v1::{Cluster, GetTokenResponse};
use credbroker_tests::fakes::dead_port;
use credbroker_tests::fakes::gce_metadata::{
    AUDIENCE, CLOUD_PLATFORM, DEFAULT_SCOPE_STRING, IAM_SCOPE, JWT_TYPE, METADATA_TOKEN_PATH,
    SA_EMAIL, TestKey, USERINFO_EMAIL, google, metadata_server, oauth_error, sts, token_body,
    token_endpoint,
};
use credbroker_tests::{
    Broker, V1, assert_credential, assert_shim_error, exec_info, provider, run_shim, tempdir,
    wait_until, yaml_str,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// A broker with a controlled environment
// ---------------------------------------------------------------------------------------

/// Variables the broker must not inherit: ambient Google credentials and proxies.
const SCRUBBED: &[&str] = &[
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "GOOGLE_CLOUD_QUOTA_PROJECT",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// `credbroker serve` with one gcp provider `gke` (`gcp_section` is its `gcp:` flow
/// mapping), none of [`SCRUBBED`], `HOME` in its temp dir, `NO_PROXY` for loopback and
/// `GCE_METADATA_HOST` on a dead port, then `env`.
fn gcp_broker(gcp_section: &str, env: &[(&str, String)]) -> Broker {
    let mut builder = Broker::builder().provider(provider("gke", "gcp", gcp_section, &[]));
    for var in SCRUBBED {
        builder = builder.env_remove(var);
    }
    builder
        .home()
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("GCE_METADATA_HOST", format!("127.0.0.1:{}", dead_port()))
        .envs(env)
        .start()
}

fn cluster(name: &str) -> Cluster {
    credbroker_tests::cluster(
        &format!("https://{name}.gke.example"),
        &json!({"clusterName": name}),
    )
}

async fn get_token(socket: &Path, name: &str) -> Result<GetTokenResponse, tonic::Status> {
    credbroker_tests::get_token(socket, "gke", cluster(name)).await
}

fn unix_now() -> u64 {
    credbroker_tests::fakes::unix_now()
}

fn shim_info(cluster: &str) -> String {
    exec_info(
        V1,
        &format!("https://{cluster}.gke.example"),
        json!({"clusterName": cluster}),
    )
}

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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );

    let calls: Vec<_> = (0..50)
        .map(|i| {
            let socket = broker.socket().to_path_buf();
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
        broker.socket(),
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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let out = run_shim(
        broker.socket(),
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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let out = run_shim(
        broker.socket(),
        &["--provider", "gke"],
        Some(&shim_info("a")),
    );
    assert_shim_error(&out, &["permission", "403", "service account disabled"]);
}

#[test]
fn key_file_problems_name_the_file_and_field() {
    let dir = tempdir();
    let missing = dir.path().join("missing.json");
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        json!({"type": "service_account", "client_email": SA_EMAIL, "private_key": "-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n"}).to_string(),
    )
    .expect("write");
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, "{\"type\": \"service_acc").expect("write");
    let credentials_file = |path: &Path| {
        format!(
            "{{credentialsFile: {}}}",
            yaml_str(path.to_str().expect("UTF-8"))
        )
    };
    let (missing_s, bad_s, truncated_s) = (
        missing.display().to_string(),
        bad.display().to_string(),
        truncated.display().to_string(),
    );
    // (gcp section, environment, what the shim's error line names)
    let cases = [
        (
            "{}".to_owned(),
            vec![("GOOGLE_APPLICATION_CREDENTIALS", missing_s.clone())],
            vec![
                "not_found",
                missing_s.as_str(),
                "GOOGLE_APPLICATION_CREDENTIALS",
            ],
        ),
        (
            credentials_file(&bad),
            vec![],
            vec![bad_s.as_str(), "field `private_key`"],
        ),
        (
            credentials_file(&truncated),
            vec![],
            vec![truncated_s.as_str(), "not valid json", "line 1"],
        ),
    ];
    for (section, env, needles) in &cases {
        let broker = gcp_broker(section, env);
        let out = run_shim(
            broker.socket(),
            &["--provider", "gke"],
            Some(&shim_info("a")),
        );
        assert_shim_error(&out, needles);
    }
}

#[test]
fn no_credentials_anywhere_lists_what_was_tried() {
    let broker = gcp_broker("{}", &[]);
    let out = run_shim(
        broker.socket(),
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
        let mut stream = std::net::TcpStream::connect(mds.addr()).expect("connect");
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

    let broker = gcp_broker("{}", &[("GCE_METADATA_HOST", mds.addr().to_string())]);
    for name in ["east", "west", "north"] {
        let response = get_token(broker.socket(), name)
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
    let iam = google(move |req| {
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
    let broker = gcp_broker(
        &format!(
            "{{impersonateServiceAccount: {target}, delegates: [{delegate}], iamCredentialsEndpoint: {}}}",
            yaml_str(iam.url())
        ),
        &[("GCE_METADATA_HOST", mds.addr().to_string())],
    );
    let response = get_token(broker.socket(), "a")
        .await
        .unwrap_or_else(|s| panic!("GetToken: {s:?}; log:\n{}", broker.logs()));
    assert_eq!(response.token, "ya29.impersonated");
    // The come-back time follows the impersonated token's own expiry (50 min → ~25 min).
    let left = (response.expiration_time.expect("exp").seconds as u64).saturating_sub(unix_now());
    assert!((1200..=1850).contains(&left), "come back in {left}s");
    assert_eq!(iam.seen().len(), 1);

    // Refused impersonation is PERMISSION_DENIED.
    let refusing = google(|_| {
        (
            403,
            json!({"error": {"status": "PERMISSION_DENIED", "message": "iam.serviceAccounts.getAccessToken denied"}}),
        )
    });
    let broker = gcp_broker(
        &format!(
            "{{impersonateServiceAccount: {target}, iamCredentialsEndpoint: {}}}",
            yaml_str(refusing.url())
        ),
        &[("GCE_METADATA_HOST", mds.addr().to_string())],
    );
    let status = get_token(broker.socket(), "a").await.expect_err("denied");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("getAccessToken denied"),
        "{status:?}"
    );
    assert!(status.message().contains(target), "{status:?}");
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
    let iam = google(move |req| {
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
    let broker = gcp_broker(
        "{}",
        &[(
            "GOOGLE_APPLICATION_CREDENTIALS",
            credentials.display().to_string(),
        )],
    );
    for name in ["a", "b", "c"] {
        let response = get_token(broker.socket(), name)
            .await
            .unwrap_or_else(|s| panic!("GetToken: {s:?}; log:\n{}", broker.logs()));
        assert_eq!(response.token, "ya29.federated-impersonated");
    }
    assert_eq!(sts.seen().len(), 1, "{:?}", sts.seen());
    assert_eq!(generate_calls.load(Ordering::SeqCst), 1);
    // The shim sees the same token.
    let out = run_shim(
        broker.socket(),
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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}, scopes: [{CLOUD_PLATFORM}]}}",
            yaml_str(credentials.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let response = get_token(broker.socket(), "a")
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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}, scopes: [{CLOUD_PLATFORM}]}}",
            yaml_str(credentials.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let status = get_token(broker.socket(), "a").await.expect_err("refused");
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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let t0 = Instant::now();
    let first = get_token(broker.socket(), "a").await.expect("first token");
    assert_eq!(first.token, "ya29.token-1");

    // With nothing cached (a second broker, same key), an outage is UNAVAILABLE.
    phase.store(1, Ordering::SeqCst);
    let cold = gcp_broker(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[],
    );
    let status = get_token(cold.socket(), "a").await.expect_err("outage");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("503"), "{status:?}");

    // Past the refresh point, during the outage: the cached token is still served, while
    // the background refresh fails.
    tokio::time::sleep(Duration::from_millis(12_500).saturating_sub(t0.elapsed())).await;
    let failures_before = fake.seen().len();
    let stale = get_token(broker.socket(), "a")
        .await
        .expect("stale token served");
    assert_eq!(stale.token, "ya29.token-1");
    assert!(
        wait_until(Duration::from_secs(3), || fake.seen().len()
            > failures_before),
        "a refresh was attempted"
    );
    let again = get_token(broker.socket(), "a").await.expect("still served");
    assert_eq!(again.token, "ya29.token-1");

    // Recovered: after the backoff (~1 s) the next request triggers a refresh.
    phase.store(2, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut latest = String::new();
    while Instant::now() < deadline {
        latest = get_token(broker.socket(), "a").await.expect("token").token;
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
    let broker = gcp_broker(
        &format!(
            "{{credentialsFile: {}}}",
            yaml_str(key_path.to_str().expect("UTF-8"))
        ),
        &[("RUST_LOG", "trace".to_owned())],
    );
    let out = run_shim(
        broker.socket(),
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
    let broker = gcp_broker("{}", &[("GCE_METADATA_HOST", mds.addr().to_string())]);
    let status = get_token(broker.socket(), "east")
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
