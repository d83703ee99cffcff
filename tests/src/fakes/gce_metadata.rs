//! Google's endpoints as the `gcp` provider meets them, on plain-HTTP [`FakeHttps`]es (the
//! URLs in credential files may be `http://` on loopback; `GCE_METADATA_HOST` is always
//! `http`): the GCE metadata server (GKE Workload Identity), the OAuth2 token endpoint for
//! service-account keys (RS256 assertions verified with the key's public half by openssl),
//! and STS's RFC 8693 token exchange for workload identity federation. Every reply carries
//! `Metadata-Flavor: Google`, like Google's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{Value, json};
use tempfile::TempDir;

use super::{FakeHttps, Reply, Seen, unix_now};
use crate::{COMMAND_TIMEOUT, describe, require_tool, run, tempdir};

/// The `cloud-platform` OAuth scope.
pub const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The `userinfo.email` OAuth scope.
pub const USERINFO_EMAIL: &str = "https://www.googleapis.com/auth/userinfo.email";
/// The `iam` OAuth scope (what STS is asked for before impersonation).
pub const IAM_SCOPE: &str = "https://www.googleapis.com/auth/iam";
/// The service account of [`TestKey::key_file`].
pub const SA_EMAIL: &str = "kueue@test-project.iam.gserviceaccount.com";
/// RFC 7523's grant type.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// RFC 8693's grant type.
pub const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The provider's default scopes, as a JWT-bearer assertion's `scope` claim.
pub const DEFAULT_SCOPE_STRING: &str =
    "https://www.googleapis.com/auth/cloud-platform https://www.googleapis.com/auth/userinfo.email";
/// The metadata server's path of the default service account's token.
pub const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// The workload identity pool provider [`sts`] accepts subject tokens for.
pub const AUDIENCE: &str = "//iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/kueue-pool/providers/eks-cluster";
/// RFC 8693's token type of a JWT subject token.
pub const JWT_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
/// RFC 8693's token type of an access token.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// A plain-HTTP fake answering JSON like Google's endpoints (`Metadata-Flavor: Google` on
/// every reply).
pub fn google(handler: impl Fn(&Seen) -> (u16, Value) + Send + Sync + 'static) -> FakeHttps {
    FakeHttps::spawn_plain(move |req: &Seen| {
        let (status, body) = handler(req);
        Reply::json(status, &body).header("metadata-flavor", "Google")
    })
}

/// An RFC 6749 error answer.
pub fn oauth_error(status: u16, error: &str, description: &str) -> (u16, Value) {
    (
        status,
        json!({"error": error, "error_description": description}),
    )
}

/// A token answer: `token`, valid `expires_in` seconds.
pub fn token_body(token: &str, expires_in: u64) -> (u16, Value) {
    (
        200,
        json!({"access_token": token, "expires_in": expires_in, "token_type": "Bearer"}),
    )
}

// ---------------------------------------------------------------------------------------
// Service-account keys: a throwaway RSA key made with openssl at test time
// ---------------------------------------------------------------------------------------

/// Runs `openssl ARGS`; fails the test if it fails.
pub fn openssl(args: &[&str]) {
    let openssl = require_tool("openssl", "apt-get install openssl");
    let out = run(Command::new(openssl).args(args), COMMAND_TIMEOUT);
    assert!(out.status.success(), "openssl {args:?}: {}", describe(&out));
}

/// A fresh RSA key in `dir` (key.pem, pub.pem). Test-only: never used outside this process.
#[derive(Debug)]
pub struct TestKey {
    dir: TempDir,
}

impl TestKey {
    /// Generates the key (2048-bit RSA).
    pub fn generate() -> TestKey {
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

    /// The private key, PKCS#8 PEM.
    pub fn private_pem(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("key.pem")).expect("key.pem")
    }

    /// Path of the public key, PEM.
    pub fn public_pem(&self) -> PathBuf {
        self.dir.path().join("pub.pem")
    }

    /// A service_account key file for it, exchanged at `token_uri`.
    pub fn key_file(&self, path: &Path, token_uri: &str) {
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
pub fn verify_rs256(jwt: &str, public_pem: &Path) -> Result<Value, String> {
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
pub fn token_endpoint(
    public_pem: PathBuf,
    want_scope: &'static str,
    next: impl Fn() -> (u16, Value) + Send + Sync + 'static,
) -> FakeHttps {
    let own_url: Arc<Mutex<String>> = Arc::new(Mutex::new(String::new()));
    let url_for_handler = Arc::clone(&own_url);
    let fake = google(move |req: &Seen| {
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
    *own_url.lock().expect("lock") = fake.url().to_owned();
    fake
}

// ---------------------------------------------------------------------------------------
// The metadata server (GKE Workload Identity), reached through GCE_METADATA_HOST
// ---------------------------------------------------------------------------------------

/// A fake metadata server: 403 without `Metadata-Flavor: Google` (like the real one), the
/// default service account's token with `scopes` checked, 404 elsewhere.
pub fn metadata_server(
    want_scopes: &'static str,
    token: &'static str,
    expires_in: u64,
) -> FakeHttps {
    google(move |req: &Seen| {
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

// ---------------------------------------------------------------------------------------
// STS: workload identity federation (external_account credentials)
// ---------------------------------------------------------------------------------------

/// A fake STS: checks the RFC 8693 exchange (grant, audience, subject token and its type,
/// requested scope) and answers a federated token.
pub fn sts(subject_token: String, want_scope: &'static str, federated: &'static str) -> FakeHttps {
    google(move |req: &Seen| {
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
