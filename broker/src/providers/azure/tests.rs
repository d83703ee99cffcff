//! The azure provider against a recording test transport (azure_core's `HttpClient`): what
//! each credential sends, how answers and failures are classified, and which identities
//! share a cache entry. The end-to-end tests (tests/tests/azure.rs) repeat the main flows
//! over real TLS against fake endpoints.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use azure_core::http::headers::Headers;
use azure_core::http::{AsyncRawResponse, Body, StatusCode};
use base64::Engine as _;
use serde_json::{Value, json};

use super::*;
use crate::providers::CredentialSecret;
use crate::providers::ProviderTestExt as _;
use crate::request::ClusterInfo;

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "11111111-2222-3333-4444-555555555555";
const AUTHORITY: &str = "https://login.test.example";
const CERT_PEM: &str = include_str!("../../../../tests/fixtures/azure/client-cert.pem");
const SCOPE: &str = "6dae42f8-4368-4678-94ff-3960e28e3630/.default";

/// One request the transport saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    url: Url,
    headers: BTreeMap<String, String>,
    form: BTreeMap<String, String>,
}

/// A recording transport: answers with queued (status, body) pairs, else a one-hour token;
/// requests to a URL containing "unreachable" fail like a refused connection.
#[derive(Default)]
struct Mock {
    seen: Mutex<Vec<Seen>>,
    replies: Mutex<VecDeque<(u16, String)>>,
}

impl std::fmt::Debug for Mock {
    /// Not what it recorded: that holds the secrets the tests send.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mock")
    }
}

impl Mock {
    fn reply(&self, status: u16, body: Value) {
        self.replies
            .lock()
            .unwrap()
            .push_back((status, body.to_string()));
    }
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl HttpClient for Mock {
    async fn execute_request(&self, req: &Request) -> azure_core::Result<AsyncRawResponse> {
        if req.url().as_str().contains("unreachable") {
            return Err(azure_core::Error::with_message(
                ErrorKind::Connection,
                "connection refused",
            ));
        }
        let body = match req.body() {
            Body::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            Body::SeekableStream(_) => String::new(),
        };
        self.seen.lock().unwrap().push(Seen {
            method: format!("{:?}", req.method()),
            url: req.url().clone(),
            headers: req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.as_str().to_owned()))
                .collect(),
            form: url_form(&body),
        });
        let (status, body) = self.replies.lock().unwrap().pop_front().unwrap_or_else(|| {
            (
                200,
                json!({"access_token": "entra-token", "expires_in": 3600, "token_type": "Bearer"})
                    .to_string(),
            )
        });
        Ok(AsyncRawResponse::from_bytes(
            StatusCode::from(status),
            Headers::new(),
            body.into_bytes(),
        ))
    }
}

fn url_form(body: &str) -> BTreeMap<String, String> {
    Url::parse(&format!("http://x/?{body}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

fn provider(config: AzureConfig, env: Env) -> (AzureProvider, Arc<Mock>) {
    let mock = Arc::new(Mock::default());
    let clients = Clients {
        remote: mock.clone(),
        local: mock.clone(),
    };
    let p = AzureProvider::new(config, env).with_clients(clients, "http://imds.test/probe");
    (p, mock)
}

fn base_env() -> Env {
    Env::default()
        .with(AZURE_CLIENT_ID, CLIENT)
        .with(AZURE_TENANT_ID, TENANT)
        .with(AZURE_AUTHORITY_HOST, AUTHORITY)
}

fn with_credential(kind: AzureCredential) -> AzureConfig {
    AzureConfig {
        credential: Some(kind),
        ..AzureConfig::default()
    }
}

fn req(config: Value) -> TokenRequest {
    let Value::Object(config) = config else {
        panic!("cluster config must be an object")
    };
    TokenRequest {
        provider: "aks".into(),
        cluster: Some(ClusterInfo {
            server: "https://aks.example:443".into(),
            config: config.into(),
            ..Default::default()
        }),
        interactive: false,
    }
}

fn token_of(c: &Credential) -> &str {
    match &c.secret {
        CredentialSecret::Token(t) => t.expose(),
        CredentialSecret::ClientCertificate { .. } => "",
    }
}

fn token_file(dir: &tempfile::TempDir, content: &str) -> PathBuf {
    let path = dir.path().join("azure-identity-token");
    // Rotate the way kubelet's atomic writer does: write aside, rename over.
    let tmp = dir.path().join("..new");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

#[tokio::test]
async fn workload_identity_sends_the_federated_token_and_rereads_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(&dir, "federated-jwt-1");
    let env = base_env().with(AZURE_FEDERATED_TOKEN_FILE, file.display().to_string());
    let (p, mock) = provider(AzureConfig::default(), env);
    let before = SystemTime::now();
    let cred = p
        .fetch_for(&req(json!({"clusterName": "a"})))
        .await
        .unwrap();
    assert_eq!(token_of(&cred), "entra-token");
    let lifetime = cred.expires_at.duration_since(before).unwrap();
    assert!(lifetime > Duration::from_secs(3590) && lifetime <= Duration::from_secs(3601));

    let seen = mock.seen();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(r.method, "Post");
    assert_eq!(
        r.url.as_str(),
        format!("{AUTHORITY}/{TENANT}/oauth2/v2.0/token")
    );
    assert_eq!(r.form["grant_type"], "client_credentials");
    assert_eq!(
        r.form["client_assertion_type"],
        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    );
    assert_eq!(r.form["client_assertion"], "federated-jwt-1");
    assert_eq!(r.form["client_id"], CLIENT);
    assert_eq!(r.form["scope"], SCOPE);

    // kubelet rotated the token: the very next upstream request sends the new one.
    token_file(&dir, "federated-jwt-2");
    p.fetch_for(&req(json!({"clusterName": "a"})))
        .await
        .unwrap();
    assert_eq!(mock.seen()[1].form["client_assertion"], "federated-jwt-2");
}

#[test]
fn identity_is_credential_client_tenant_and_scope() {
    let (p, _) = provider(AzureConfig::default(), base_env());
    let a = p.key_for(&req(json!({"clusterName": "a"}))).unwrap();
    let b = p.key_for(&req(json!({"clusterName": "b"}))).unwrap();
    assert_eq!(a, b, "clusters with the same identity share one entry");
    assert_eq!(
        a,
        format!("credential=auto client={CLIENT} tenant={TENANT} scope={SCOPE}")
    );
    let other_tenant = p
        .key_for(&req(
            json!({"clusterName": "c", "tenantId": "contoso.onmicrosoft.com"}),
        ))
        .unwrap();
    assert!(
        other_tenant.contains("tenant=contoso.onmicrosoft.com"),
        "{other_tenant}"
    );
    let other_server = p
        .key_for(&req(json!({"serverId": "api://aks-private"})))
        .unwrap();
    assert!(
        other_server.contains("scope=api://aks-private/.default"),
        "{other_server}"
    );
    assert_ne!(a, other_tenant);
    assert_ne!(a, other_server);
    // Provider defaults apply when the cluster names nothing.
    let (q, _) = provider(
        AzureConfig {
            server_id: Some("app-x".into()),
            tenant_id: Some("t2".into()),
            client_id: Some("c2".into()),
            ..AzureConfig::default()
        },
        base_env(),
    );
    assert_eq!(
        q.key_for(&req(json!({}))).unwrap(),
        "credential=auto client=c2 tenant=t2 scope=app-x/.default"
    );
    // Values from the cluster are checked before they reach a URL.
    for bad in [
        json!({"tenantId": "../x"}),
        json!({"serverId": "a b"}),
        json!({"serverId": "x/.default"}),
    ] {
        let err = p.key_for(&req(bad.clone())).unwrap_err();
        assert!(
            matches!(err, ProviderError::InvalidRequest(_)),
            "{bad}: {err:?}"
        );
    }
}

#[tokio::test]
async fn per_cluster_tenant_and_server_reach_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(&dir, "fed");
    let env = base_env().with(AZURE_FEDERATED_TOKEN_FILE, file.display().to_string());
    let (p, mock) = provider(AzureConfig::default(), env);
    p.fetch_for(&req(
        json!({"tenantId": "fabrikam.onmicrosoft.com", "serverId": "app-y"}),
    ))
    .await
    .unwrap();
    let r = &mock.seen()[0];
    assert_eq!(r.url.path(), "/fabrikam.onmicrosoft.com/oauth2/v2.0/token");
    assert_eq!(r.form["scope"], "app-y/.default");
}

#[tokio::test]
async fn client_secret_flow_and_its_errors_never_show_the_secret() {
    let env = base_env().with(AZURE_CLIENT_SECRET, "s3cr3t-value");
    let (p, mock) = provider(with_credential(AzureCredential::ClientSecret), env);
    p.fetch_for(&req(json!({}))).await.unwrap();
    let r = &mock.seen()[0];
    assert_eq!(r.form["grant_type"], "client_credentials");
    assert_eq!(r.form["client_secret"], "s3cr3t-value");
    assert_eq!(r.form["client_id"], CLIENT);
    assert!(!r.form.contains_key("client_assertion"));

    mock.reply(
        401,
        json!({"error": "invalid_client",
               "error_description": "AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID.\r\nTrace ID: 0a Correlation ID: 0b Timestamp: 2025-01-01",
               "error_codes": [7000215]}),
    );
    let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
    let ProviderError::Denied(msg) = &err else {
        panic!("want Denied, got {err:?}")
    };
    assert!(
        msg.contains("AADSTS7000215 (invalid client secret"),
        "{msg}"
    );
    assert!(msg.contains("HTTP 401 invalid_client"), "{msg}");
    assert!(msg.contains(CLIENT) && msg.contains(TENANT), "{msg}");
    assert!(!msg.contains("Trace ID") && !msg.contains('\n'), "{msg}");
    assert!(
        !format!("{err:?} {p:?}").contains("s3cr3t"),
        "{err:?} {p:?}"
    );
}

#[tokio::test]
async fn managed_identity_uses_imds_with_the_user_assigned_client_id() {
    if std::env::var_os(IDENTITY_ENDPOINT).is_some() || std::env::var_os(MSI_ENDPOINT).is_some() {
        // azure_identity picks the route from the process environment itself.
        return;
    }
    let (p, mock) = provider(
        AzureConfig {
            credential: Some(AzureCredential::ManagedIdentity),
            client_id: Some("mi-client".into()),
            ..AzureConfig::default()
        },
        Env::default(),
    );
    let expires = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    mock.reply(
        200,
        json!({"access_token": "mi-token", "expires_on": expires.to_string(),
               "resource": "6dae42f8-4368-4678-94ff-3960e28e3630", "token_type": "Bearer"}),
    );
    let cred = p.fetch_for(&req(json!({}))).await.unwrap();
    assert_eq!(token_of(&cred), "mi-token");
    assert_eq!(
        cred.expires_at,
        SystemTime::UNIX_EPOCH + Duration::from_secs(expires)
    );
    let r = &mock.seen()[0];
    assert_eq!(r.url.host_str(), Some("169.254.169.254"));
    assert_eq!(r.url.path(), "/metadata/identity/oauth2/token");
    let query: BTreeMap<String, String> = r.url.query_pairs().into_owned().collect();
    assert_eq!(query["resource"], "6dae42f8-4368-4678-94ff-3960e28e3630");
    assert_eq!(query["client_id"], "mi-client");
    assert_eq!(r.headers.get("metadata").map(String::as_str), Some("true"));

    // A managed identity cannot get a token in another tenant: refused before any request.
    let err = p
        .fetch_for(&req(json!({"tenantId": "other-tenant"})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidRequest(m) if m.contains("managed identity")),
        "{err:?}"
    );
    assert_eq!(mock.seen().len(), 1);
}

#[tokio::test]
async fn client_certificate_assertion_is_signed_and_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sp.pem");
    std::fs::write(&path, CERT_PEM).unwrap();
    let env = base_env().with(AZURE_CLIENT_CERTIFICATE_PATH, path.display().to_string());
    let (p, mock) = provider(with_credential(AzureCredential::ClientCertificate), env);
    p.fetch_for(&req(json!({}))).await.unwrap();
    let r = &mock.seen()[0];
    assert_eq!(r.form["grant_type"], "client_credentials");
    assert_eq!(
        r.form["client_assertion_type"],
        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    );
    let jwt = &r.form["client_assertion"];
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3);
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Value = serde_json::from_slice(&b64url.decode(parts[0]).unwrap()).unwrap();
    let claims: Value = serde_json::from_slice(&b64url.decode(parts[1]).unwrap()).unwrap();
    assert_eq!(header["alg"], "RS256");
    let sha1_hex = include_str!("../../../../tests/fixtures/azure/client-cert.sha1").trim();
    let sha1: Vec<u8> = (0..sha1_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&sha1_hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(header["x5t"], b64url.encode(sha1));
    assert_eq!(
        claims["aud"],
        format!("{AUTHORITY}/{TENANT}/oauth2/v2.0/token")
    );
    assert_eq!(claims["iss"], CLIENT);
    assert_eq!(claims["sub"], CLIENT);
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["nbf"].as_u64().unwrap(),
        600
    );
    let public = include_bytes!("../../../../tests/fixtures/azure/client-public.der");
    aws_lc_rs::signature::UnparsedPublicKey::new(
        &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
        &public[..],
    )
    .verify(
        format!("{}.{}", parts[0], parts[1]).as_bytes(),
        &b64url.decode(parts[2]).unwrap(),
    )
    .expect("the assertion's signature verifies with the certificate's key");

    // A key that is not the certificate's, an encrypted key, no key: clear errors.
    let (cert_block, key_block) =
        CERT_PEM.split_at(CERT_PEM.find("-----BEGIN PRIVATE KEY").unwrap());
    let cases = [
        (cert_block.to_owned(), "no PRIVATE KEY block"),
        (
            format!(
                "{cert_block}-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"
            ),
            "encrypted",
        ),
        (key_block.to_owned(), "no CERTIFICATE block"),
    ];
    for (pem, want) in cases {
        std::fs::write(&path, pem).unwrap();
        let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
        assert!(err.to_string().contains(want), "want {want:?}: {err}");
        assert!(err.to_string().contains("sp.pem"), "{err}");
    }
    std::fs::remove_file(&path).unwrap();
    let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
    assert!(matches!(err, ProviderError::NotFound(_)), "{err:?}");
}

#[tokio::test]
async fn upstream_failures_are_classified() {
    let env = base_env().with(AZURE_CLIENT_SECRET, "x");
    let (p, mock) = provider(with_credential(AzureCredential::ClientSecret), env);
    let cases = [
        (
            400,
            json!({"error": "unauthorized_client", "error_description": "AADSTS700016: Application with identifier 'x' was not found in the directory 'y'.", "error_codes": [700016]}),
            "denied",
            "AADSTS700016 (the application (client id) was not found",
        ),
        (
            400,
            json!({"error": "invalid_request", "error_description": "AADSTS90002: Tenant 'z' not found.", "error_codes": [90002]}),
            "denied",
            "AADSTS90002 (the tenant was not found",
        ),
        (
            400,
            json!({"error": "invalid_resource", "error_description": "AADSTS500011: The resource principal named x was not found in the tenant named y.", "error_codes": [500011]}),
            "denied",
            "AADSTS500011 (the resource (serverId) was not found",
        ),
        (
            503,
            json!({"error": "temporarily_unavailable", "error_description": "AADSTS90033: A transient error has occurred.", "error_codes": [90033]}),
            "unavailable",
            "HTTP 503",
        ),
        (429, json!({}), "unavailable", "HTTP 429"),
        (408, json!({}), "timeout", "HTTP 408"),
    ];
    for (status, body, want, text) in cases {
        mock.reply(status, body);
        let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
        let kind = match &err {
            ProviderError::Denied(_) => "denied",
            ProviderError::Unavailable(_) => "unavailable",
            ProviderError::Timeout(_) => "timeout",
            _ => "other",
        };
        assert_eq!(kind, want, "HTTP {status}: {err:?}");
        assert!(
            err.to_string().contains(text),
            "HTTP {status}: want {text:?} in {err}"
        );
    }

    // Endpoint down: Unavailable, naming the endpoint.
    let env = base_env()
        .with(AZURE_CLIENT_SECRET, "x")
        .with(AZURE_AUTHORITY_HOST, "https://unreachable.test");
    let (down, _) = provider(with_credential(AzureCredential::ClientSecret), env);
    let err = down.fetch_for(&req(json!({}))).await.unwrap_err();
    assert!(matches!(err, ProviderError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn a_refused_connection_over_the_real_client_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = base_env()
        .with(AZURE_CLIENT_SECRET, "x")
        .with(AZURE_AUTHORITY_HOST, format!("https://127.0.0.1:{port}"));
    let p = AzureProvider::new(with_credential(AzureCredential::ClientSecret), env);
    let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
    let ProviderError::Unavailable(msg) = &err else {
        panic!("want Unavailable, got {err:?}")
    };
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[tokio::test]
async fn missing_environment_is_named() {
    let cases = [
        (
            AzureCredential::WorkloadIdentity,
            Env::default(),
            vec![AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE],
        ),
        (
            AzureCredential::WorkloadIdentity,
            Env::default().with(AZURE_CLIENT_ID, CLIENT),
            vec![AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE],
        ),
        (
            AzureCredential::ClientSecret,
            Env::default().with(AZURE_TENANT_ID, TENANT),
            vec![AZURE_CLIENT_ID, AZURE_CLIENT_SECRET],
        ),
        (
            AzureCredential::ClientCertificate,
            base_env(),
            vec![AZURE_CLIENT_CERTIFICATE_PATH],
        ),
    ];
    for (kind, env, want) in cases {
        let (p, mock) = provider(with_credential(kind), env);
        let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
        let ProviderError::Unimplemented(msg) = &err else {
            panic!("{kind}: want a configuration error, got {err:?}")
        };
        for var in &want {
            assert!(msg.contains(var), "{kind}: {var} not named in {msg}");
        }
        for var in [
            AZURE_CLIENT_ID,
            AZURE_TENANT_ID,
            AZURE_FEDERATED_TOKEN_FILE,
            AZURE_CLIENT_SECRET,
        ] {
            if !want.contains(&var) {
                assert!(
                    !msg.contains(&format!("{var} (")) && !msg.ends_with(var),
                    "{kind}: {var} wrongly named in {msg}"
                );
            }
        }
        assert!(mock.seen().is_empty());
    }
    // The variable is set but the file is not there.
    let env = base_env().with(
        AZURE_FEDERATED_TOKEN_FILE,
        "/nonexistent/azure-identity-token",
    );
    let (p, _) = provider(with_credential(AzureCredential::WorkloadIdentity), env);
    let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::NotFound(m) if m.contains("/nonexistent/azure-identity-token")),
        "{err:?}"
    );
}

#[tokio::test]
async fn auto_tries_workload_then_managed_then_service_principal() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(&dir, "fed");
    let probe_ok = "http://imds.test/probe";
    let probe_down = "http://unreachable.test/probe";
    let cases = [
        (
            base_env()
                .with(AZURE_FEDERATED_TOKEN_FILE, file.display().to_string())
                .with(AZURE_CLIENT_SECRET, "x"),
            probe_ok,
            Some(Kind::WorkloadIdentity),
        ),
        (
            base_env()
                .with(IDENTITY_ENDPOINT, "http://127.0.0.1:1/msi")
                .with(AZURE_CLIENT_SECRET, "x"),
            probe_down,
            Some(Kind::ManagedIdentity),
        ),
        (
            base_env().with(AZURE_CLIENT_SECRET, "x"),
            probe_ok,
            Some(Kind::ManagedIdentity),
        ),
        (
            base_env().with(AZURE_CLIENT_SECRET, "x"),
            probe_down,
            Some(Kind::ClientSecret),
        ),
        (
            base_env().with(AZURE_CLIENT_CERTIFICATE_PATH, "/c.pem"),
            probe_down,
            Some(Kind::ClientCertificate),
        ),
        (base_env(), probe_down, None),
    ];
    for (env, probe, want) in cases {
        let mock = Arc::new(Mock::default());
        let clients = Clients {
            remote: mock.clone(),
            local: mock.clone(),
        };
        let p = AzureProvider::new(AzureConfig::default(), env.clone())
            .with_clients(clients.clone(), probe);
        match (p.resolve_auto(&clients).await, want) {
            (Ok(kind), Some(want)) => assert_eq!(kind, want, "{env:?}"),
            (Err(ProviderError::Unimplemented(msg)), None) => {
                for var in [
                    AZURE_FEDERATED_TOKEN_FILE,
                    IDENTITY_ENDPOINT,
                    AZURE_CLIENT_SECRET,
                    AZURE_CLIENT_CERTIFICATE_PATH,
                ] {
                    assert!(msg.contains(var), "{var} not named in {msg}");
                }
            }
            (got, want) => panic!("{env:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[tokio::test]
async fn azure_cli_runs_az_with_scope_and_tenant() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let az = dir.path().join("az");
    let args = dir.path().join("args");
    let expires = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1800;
    let write_az = |body: &str| {
        std::fs::write(
            &az,
            format!("#!/bin/sh\necho \"$@\" > '{}'\n{body}\n", args.display()),
        )
        .unwrap();
        std::fs::set_permissions(&az, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write_az(&format!(
        "echo '{{\"accessToken\": \"cli-token\", \"expires_on\": {expires}, \"tokenType\": \"Bearer\"}}'"
    ));
    let env = Env::default().with(PATH, dir.path().display().to_string());
    let (p, _) = provider(with_credential(AzureCredential::AzureCli), env);
    let cred = p
        .fetch_for(&req(json!({"tenantId": "t-cli"})))
        .await
        .unwrap();
    assert_eq!(token_of(&cred), "cli-token");
    let ran = std::fs::read_to_string(&args).unwrap();
    assert!(ran.contains(&format!("--scope {SCOPE}")), "{ran}");
    assert!(ran.contains("--tenant t-cli"), "{ran}");

    write_az("echo \"ERROR: Please run 'az login' to setup account.\" >&2\nexit 1");
    let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Denied(m) if m.contains("az login")),
        "{err:?}"
    );

    std::fs::remove_file(&az).unwrap();
    let err = p.fetch_for(&req(json!({}))).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::NotFound(m) if m.contains("PATH")),
        "{err:?}"
    );
}

#[test]
fn env_debug_shows_names_only() {
    let env = base_env().with(AZURE_CLIENT_SECRET, "s3cr3t");
    let shown = format!("{env:?}");
    assert!(
        shown.contains(AZURE_CLIENT_SECRET) && !shown.contains("s3cr3t"),
        "{shown}"
    );
}
