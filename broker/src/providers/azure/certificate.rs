//! A service principal's certificate as a client assertion: a JWT signed with the
//! certificate's RSA key (RS256), as Entra ID's "certificate credentials" document describes.
//!
//! `azure_identity`'s own `ClientCertificateCredential` needs OpenSSL (PKCS#12 parsing and
//! signing); the broker links one crypto library, aws-lc-rs, so the assertion is built here
//! and handed to `azure_identity`'s `ClientAssertionCredential`. The file is a PEM with the
//! certificate (first, then any chain) and its unencrypted RSA key, PKCS#8 or PKCS#1: what
//! `AZURE_CLIENT_CERTIFICATE_PATH` holds for the other Azure SDKs in PEM form.

use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_lc_rs::digest;
use aws_lc_rs::signature::{KeyPair as _, RsaKeyPair};
use azure_core::http::ClientMethodOptions;
use azure_identity::ClientAssertion;
use base64::Engine as _;

use crate::providers::ProviderError;

/// Lifetime of one assertion: Entra ID accepts up to about an hour; MSAL uses 10 minutes.
/// Each token request signs a fresh one, so it only has to outlive the request.
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(10 * 60);
/// A certificate file is a few kilobytes; anything this large is not one.
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// Signs client assertions for one application and token endpoint.
pub struct CertificateAssertion {
    key: RsaKeyPair,
    client_id: String,
    audience: String,
    x5t: String,
    x5t_s256: String,
    chain: Option<Vec<String>>,
}

impl fmt::Debug for CertificateAssertion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAssertion")
            .field("client_id", &self.client_id)
            .field("audience", &self.audience)
            .field("x5t", &self.x5t)
            .finish_non_exhaustive()
    }
}

impl CertificateAssertion {
    /// Reads the PEM at `path`. `send_chain` adds the certificates as `x5c` (subject name +
    /// issuer authentication).
    pub fn load(
        path: &Path,
        client_id: &str,
        audience: &str,
        send_chain: bool,
    ) -> Result<Self, ProviderError> {
        let shown = path.display();
        let bad = |why: String| {
            ProviderError::Unimplemented(format!("client certificate file {shown}: {why}"))
        };
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                ProviderError::NotFound(format!("client certificate file {shown} does not exist"))
            }
            _ => ProviderError::Unavailable(format!(
                "cannot read client certificate file {shown}: {e}"
            )),
        })?;
        if meta.len() > MAX_PEM_BYTES {
            return Err(bad(format!("larger than {MAX_PEM_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            ProviderError::Unavailable(format!("cannot read client certificate file {shown}: {e}"))
        })?;
        let (certs, key) = parse_pem(&text).map_err(bad)?;
        let leaf = certs
            .first()
            .ok_or_else(|| bad("no CERTIFICATE block".into()))?;
        // The key must be the certificate's: its public key (RSAPublicKey DER) sits inside
        // the certificate's SubjectPublicKeyInfo.
        let public = key.public_key().as_ref();
        if !leaf.windows(public.len()).any(|w| w == public) {
            return Err(bad(
                "the private key does not belong to the first certificate".into(),
            ));
        }
        let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(Self {
            x5t: b64url.encode(digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, leaf)),
            x5t_s256: b64url.encode(digest::digest(&digest::SHA256, leaf)),
            chain: send_chain.then(|| certs.iter().map(|c| b64.encode(c)).collect()),
            key,
            client_id: client_id.to_owned(),
            audience: audience.to_owned(),
        })
    }

    /// A fresh signed assertion.
    pub fn sign(&self, now: SystemTime) -> Result<String, String> {
        let mut header = serde_json::json!({
            "alg": "RS256",
            "typ": "JWT",
            "x5t": self.x5t,
            "x5t#S256": self.x5t_s256,
        });
        if let Some(chain) = &self.chain {
            header["x5c"] = serde_json::json!(chain);
        }
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs();
        let claims = serde_json::json!({
            "aud": self.audience,
            "iss": self.client_id,
            "sub": self.client_id,
            "jti": format!("{:032x}", fastrand::u128(..)),
            "nbf": now,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME.as_secs(),
        });
        crate::providers::jwt::sign_rs256(&self.key, &header, &claims)
            .map_err(|_| "signing the client assertion failed".to_owned())
    }
}

#[tonic::async_trait]
impl ClientAssertion for CertificateAssertion {
    async fn secret(&self, _: Option<ClientMethodOptions<'_>>) -> azure_core::Result<String> {
        self.sign(SystemTime::now()).map_err(|why| {
            azure_core::Error::with_message(azure_core::error::ErrorKind::Credential, why)
        })
    }
}

/// The certificates (DER, in file order) and the RSA key of a PEM file.
fn parse_pem(text: &str) -> Result<(Vec<Vec<u8>>, RsaKeyPair), String> {
    let mut certs = Vec::new();
    let mut key = None;
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        loop {
            match lines.next() {
                Some(l) if l == end => break,
                Some(l) => body.push_str(l),
                None => return Err(format!("unterminated {label} block")),
            }
        }
        let der = base64::engine::general_purpose::STANDARD
            .decode(&body)
            .map_err(|_| format!("the {label} block is not valid base64"))?;
        match label {
            "CERTIFICATE" => certs.push(der),
            "PRIVATE KEY" => {
                key = Some(RsaKeyPair::from_pkcs8(&der).map_err(|e| {
                    format!("the PRIVATE KEY is not a usable RSA key ({e}); Entra ID needs RSA, 2048 bits or more")
                })?);
            }
            "RSA PRIVATE KEY" => {
                key = Some(
                    RsaKeyPair::from_der(&der)
                        .map_err(|e| format!("the RSA PRIVATE KEY is not usable ({e})"))?,
                );
            }
            "ENCRYPTED PRIVATE KEY" => {
                return Err(
                    "the key is encrypted; only unencrypted keys are supported (decrypt it with openssl pkey)"
                        .into(),
                );
            }
            "EC PRIVATE KEY" => {
                return Err("Entra ID client assertions need an RSA key, not EC".into());
            }
            _ => {}
        }
    }
    let key = key.ok_or("no PRIVATE KEY block (the file needs the certificate and its key)")?;
    Ok((certs, key))
}
