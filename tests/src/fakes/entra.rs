//! Entra ID's token endpoint as the `azure` provider meets it, on a TLS [`FakeHttps`] whose CA
//! the broker trusts only through `SSL_CERT_FILE` ([`FakeEntra::ca_file`]). It checks what it
//! receives: the path `/<tenant>/oauth2/v2.0/token`, the grant type, the assertion type, the
//! assertion (equal to the federated token file's content at that moment, or an RS256 JWT
//! verified with the fixture certificate's key), the client secret, the scope. It also
//! serves the App Service managed identity route (`IDENTITY_ENDPOINT`), checking its header
//! and query. A request that breaks a rule gets an error and the rule is recorded.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tempfile::TempDir;

use super::{FakeHttps, Reply, Seen, unix_now};
use crate::tempdir;

/// The AKS AAD server application id: the default audience (`<id>/.default`).
pub const AKS_SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";
/// The client id certificate assertions must name (`iss`, `sub`).
pub const CLIENT: &str = "11111111-2222-3333-4444-555555555555";
/// RFC 7523's client assertion type.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The fixture certificate and its private key (PEM), for `clientCertificatePath`.
pub const CERT_PEM: &str = include_str!("../../fixtures/azure/client-cert.pem");
const CERT_PUBLIC_DER: &[u8] = include_bytes!("../../fixtures/azure/client-public.der");
const CERT_SHA1_HEX: &str = include_str!("../../fixtures/azure/client-cert.sha1");

/// What the fake demands of token requests; a request that breaks a rule is answered with
/// an error and the rule recorded (see [`FakeEntra::assert_no_violations`]).
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// The `client_id` every request must carry.
    pub client_id: Option<String>,
    /// The assertion must equal this file's content at the time of the request.
    pub assertion_file: Option<PathBuf>,
    /// The `client_secret` a request must carry (and then no assertion).
    pub client_secret: Option<String>,
    /// The assertion must be an RS256 JWT signed by the fixture certificate's key.
    pub certificate: bool,
    /// `X-IDENTITY-HEADER` the managed identity route demands.
    pub identity_header: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    violations: Vec<String>,
    /// Sticky failure: every token request gets this answer.
    fail_with: Option<(u16, String)>,
    expires_in: u64,
    issued: u64,
    expect: Expect,
}

/// The fake Entra ID; stops on drop.
#[derive(Debug)]
pub struct FakeEntra {
    server: FakeHttps,
    ca_file: PathBuf,
    _dir: TempDir,
    state: Arc<Mutex<State>>,
}

impl FakeEntra {
    /// Starts it, demanding `expect` of token requests and issuing tokens valid for
    /// `expires_in` seconds.
    pub fn start(expect: Expect, expires_in: u64) -> FakeEntra {
        let state = Arc::new(Mutex::new(State {
            expires_in,
            expect,
            ..State::default()
        }));
        let handler_state = Arc::clone(&state);
        let server = FakeHttps::spawn(move |req: &Seen| answer(&handler_state, req));
        let dir = tempdir();
        let ca_file = server.ca_file(dir.path());
        FakeEntra {
            server,
            ca_file,
            _dir: dir,
            state,
        }
    }

    /// `https://127.0.0.1:<port>`, for `AZURE_AUTHORITY_HOST`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// The CA of its certificate as a file, for the broker's `SSL_CERT_FILE`.
    pub fn ca_file(&self) -> &std::path::Path {
        &self.ca_file
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.server.seen()
    }

    /// How many token requests (POSTs) arrived.
    pub fn token_requests(&self) -> usize {
        self.seen().iter().filter(|s| s.method == "POST").count()
    }

    /// From now on, answer every valid token request with `answer` (status, body); `None`
    /// goes back to issuing tokens.
    pub fn fail_with(&self, answer: Option<(u16, &str)>) {
        self.state.lock().expect("lock").fail_with = answer.map(|(s, b)| (s, b.to_owned()));
    }

    /// Fails the test if any request broke a rule of its [`Expect`].
    pub fn assert_no_violations(&self) {
        let v = self.state.lock().expect("lock").violations.clone();
        assert!(v.is_empty(), "the fake Entra ID saw bad requests: {v:#?}");
    }

    /// Waits (bounded) until at least `n` token requests arrived.
    pub fn wait_for_token_requests(&self, n: usize, timeout: Duration) -> bool {
        crate::wait_until(timeout, || self.token_requests() >= n)
    }
}

fn reply(status: u16, body: String) -> Reply {
    Reply::new(status, body)
}

fn answer(state: &Mutex<State>, req: &Seen) -> Reply {
    let method = req.method.clone();
    let path = req.path.clone();
    let query = &req.query;
    let headers = &req.headers;
    let body_form = req.form();
    let mut st = state.lock().expect("lock");
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
    token_reply(
        &format!("entra-{tenant}-{short}-{}", st.issued),
        st.expires_in,
    )
}

/// Entra ID's answer to a token request: `token`, valid `expires_in` seconds.
pub fn token_reply(token: &str, expires_in: u64) -> Reply {
    Reply::json(
        200,
        &json!({"token_type": "Bearer", "expires_in": expires_in, "ext_expires_in": expires_in,
                "access_token": token}),
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
