//! Service-account keys: an RS256 assertion signed here and exchanged at the key's
//! `token_uri` with the JWT-bearer grant (RFC 7523 §2.1), for an OAuth2 access token.
//!
//! Done here rather than with `google-cloud-auth`, whose service-account credentials send
//! self-signed JWTs instead (and ignore `token_uri`): GKE is not documented to accept those.
//! Signing uses aws-lc-rs, the broker's one crypto provider.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rsa::KeyPair;
use base64::Engine as _;
use serde_json::{Value, json};

use super::http::{self, CallError};
use super::{DEFAULT_TOKEN_URI, Token, json_str};

/// The grant type of RFC 7523 §2.1.
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Google accepts assertions valid for at most one hour (`exp` − `iat` ≤ 3600 s).
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);

/// The parts of a `service_account` key file the exchange needs.
pub struct ServiceAccountKey {
    pub client_email: String,
    pub private_key_id: Option<String>,
    pub token_uri: String,
    key: KeyPair,
}

impl fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("private_key_id", &self.private_key_id)
            .field("token_uri", &self.token_uri)
            .field("key", &"[redacted]")
            .finish()
    }
}

impl ServiceAccountKey {
    /// Reads a key file's JSON; the error names the field at fault (never its value).
    pub fn from_json(json: &Value) -> Result<Self, String> {
        let field = |name: &str| -> Result<&str, String> {
            match json.get(name) {
                None => Err(format!("field `{name}` is missing")),
                Some(v) => match v.as_str().map(str::trim) {
                    Some(s) if !s.is_empty() => Ok(s),
                    Some(_) => Err(format!("field `{name}` is empty")),
                    None => Err(format!("field `{name}` is not a string")),
                },
            }
        };
        let client_email = field("client_email")?.to_owned();
        if !client_email.contains('@') {
            return Err(format!(
                "field `client_email` ({client_email:?}) is not a service account email"
            ));
        }
        let key = parse_private_key(field("private_key")?)
            .map_err(|why| format!("field `private_key`: {why}"))?;
        let token_uri = match json.get("token_uri") {
            None | Some(Value::Null) => DEFAULT_TOKEN_URI.to_owned(),
            Some(_) => {
                let uri = field("token_uri")?;
                if !(uri.starts_with("https://") || uri.starts_with("http://")) {
                    return Err(format!("field `token_uri` ({uri:?}) is not an http(s) URL"));
                }
                uri.to_owned()
            }
        };
        Ok(Self {
            client_email,
            private_key_id: json_str(json, "private_key_id").map(str::to_owned),
            token_uri,
            key,
        })
    }

    /// The signed assertion: `iss` the service account, `aud` the token URI, `scope` the
    /// space-separated scopes, valid from `now` for [`ASSERTION_LIFETIME`].
    pub fn assertion(&self, scopes: &[String], now: SystemTime) -> Result<String, String> {
        let iat = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| "the system clock is before 1970".to_owned())?
            .as_secs();
        let mut header = json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.private_key_id {
            header["kid"] = Value::String(kid.clone());
        }
        let claims = json!({
            "iss": self.client_email,
            "scope": scopes.join(" "),
            "aud": self.token_uri,
            "iat": iat,
            "exp": iat + ASSERTION_LIFETIME.as_secs(),
        });
        crate::providers::jwt::sign_rs256(&self.key, &header, &claims)
            .map_err(|_| "signing the assertion failed".to_owned())
    }
}

/// PEM (PKCS#8, as Google issues keys, or PKCS#1) → an RSA key pair.
fn parse_private_key(pem: &str) -> Result<KeyPair, String> {
    let (label, der) = pem_decode(pem)?;
    let parsed = match label.as_str() {
        "PRIVATE KEY" => KeyPair::from_pkcs8(&der),
        "RSA PRIVATE KEY" => KeyPair::from_der(&der),
        other => {
            return Err(format!(
                "a PEM block of type {other:?}, expected \"PRIVATE KEY\" (PKCS#8)"
            ));
        }
    };
    parsed.map_err(|e| format!("not a usable RSA private key ({e})"))
}

/// The label and bytes of the first PEM block.
fn pem_decode(pem: &str) -> Result<(String, Vec<u8>), String> {
    let begin = pem
        .find("-----BEGIN ")
        .ok_or("not PEM: no \"-----BEGIN\" line")?;
    let rest = &pem[begin + "-----BEGIN ".len()..];
    let label_end = rest.find("-----").ok_or("not PEM: malformed BEGIN line")?;
    let label = rest[..label_end].to_owned();
    let body = &rest[label_end + 5..];
    let end_marker = format!("-----END {label}-----");
    let end = body
        .find(&end_marker)
        .ok_or_else(|| format!("not PEM: no \"{end_marker}\" line"))?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| "not PEM: the body is not base64".to_owned())?;
    Ok((label, der))
}

/// Exchanges a fresh assertion at the key's `token_uri`.
pub async fn exchange(
    client: &http::Clients,
    key: &ServiceAccountKey,
    scopes: &[String],
) -> Result<Token, CallError> {
    let started = SystemTime::now();
    let assertion = key.assertion(scopes, started).map_err(CallError::Local)?;
    let form = [("grant_type", JWT_BEARER_GRANT), ("assertion", &assertion)];
    let request = client.upstream.post(&key.token_uri).form(&form);
    http::oauth_token(request, &key.token_uri, started).await
}
