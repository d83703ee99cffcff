//! The `ExecCredential` a plugin prints on stdout: rendered by the shim for client-go, parsed
//! by the broker from a wrapped plugin.

use std::fmt;
use std::time::SystemTime;

use serde_json::{Map, Value};

use crate::{ApiVersion, Error, KIND, rfc3339_utc};

/// A plugin's ExecCredential, parsed. Its Debug output never shows the secret.
#[derive(Clone, PartialEq)]
pub struct ExecCredential {
    pub api_version: ApiVersion,
    pub credential: Credential,
    /// `status.expirationTimestamp`; `None` when the plugin gave none (client-go then keeps
    /// the credential until a request is refused).
    pub expiration: Option<SystemTime>,
}

/// What `status` holds. A token wins over a key pair, as in client-go.
#[derive(Clone, PartialEq)]
pub enum Credential {
    /// `status.token`, as printed (not trimmed or checked: that is the caller's rule).
    Token(String),
    ClientCertificate {
        certificate_pem: String,
        key_pem: String,
    },
}

impl fmt::Debug for ExecCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecCredential")
            .field("api_version", &self.api_version)
            .field("credential", &self.credential)
            .field("expiration", &self.expiration)
            .finish()
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Token(_) => f.write_str("Token([redacted])"),
            Credential::ClientCertificate { .. } => {
                f.write_str("ClientCertificate { certificate_pem: .., key_pem: [redacted] }")
            }
        }
    }
}

/// Parses an ExecCredential (v1 or v1beta1). Errors describe the structure only: the output
/// holds a secret, so no value of `status` is ever quoted but `expirationTimestamp`.
pub fn parse(stdout: &[u8]) -> Result<ExecCredential, Error> {
    let value: Value = serde_json::from_slice(stdout).map_err(Error::CredentialNotJson)?;
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(ApiVersion::parse)
        .ok_or(Error::CredentialApiVersion)?;
    if value.get("kind").and_then(Value::as_str) != Some(KIND) {
        return Err(Error::CredentialKind);
    }
    let status = value
        .get("status")
        .and_then(Value::as_object)
        .ok_or(Error::NoStatus)?;
    let field = |path: &'static str| -> Result<Option<String>, Error> {
        let name = path.strip_prefix("status.").unwrap_or(path);
        match status.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Error::NotAString(path)),
        }
    };
    let credential = match (
        field("status.token")?,
        field("status.clientCertificateData")?,
        field("status.clientKeyData")?,
    ) {
        (Some(token), _, _) => Credential::Token(token),
        (None, Some(certificate_pem), Some(key_pem)) => Credential::ClientCertificate {
            certificate_pem,
            key_pem,
        },
        (None, Some(_), None) | (None, None, Some(_)) => {
            return Err(Error::HalfAKeyPair);
        }
        (None, None, None) => {
            return Err(Error::NoCredential);
        }
    };
    let expiration = match field("status.expirationTimestamp")? {
        Some(text) => Some(
            crate::rfc3339::parse(&text).map_err(|reason| Error::Expiration { text, reason })?,
        ),
        None => None,
    };
    Ok(ExecCredential {
        api_version,
        credential,
        expiration,
    })
}

/// What the shim prints: the broker's answer, borrowed.
#[derive(Clone, Copy)]
pub struct Status<'a> {
    pub token: &'a str,
    pub client_certificate_data: &'a str,
    pub client_key_data: &'a str,
    /// When client-go should come back, in Unix seconds.
    pub expiration_unix: Option<i64>,
}

impl fmt::Debug for Status<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Status")
            .field("token", &"[redacted]")
            .field("client_key_data", &"[redacted]")
            .field("expiration_unix", &self.expiration_unix)
            .finish_non_exhaustive()
    }
}

/// Renders the ExecCredential client-go reads, on one line. Refuses answers client-go could
/// not use well: no credential, half a key pair, or a come-back time that is missing or not
/// after `now_unix` (client-go would re-run the plugin on every request).
pub fn render(
    api_version: ApiVersion,
    status: &Status<'_>,
    now_unix: i64,
) -> Result<String, Error> {
    let mut out = Map::new();
    if !status.token.is_empty() {
        out.insert("token".into(), status.token.into());
    }
    match (
        status.client_certificate_data.is_empty(),
        status.client_key_data.is_empty(),
    ) {
        (false, false) => {
            out.insert(
                "clientCertificateData".into(),
                status.client_certificate_data.into(),
            );
            out.insert("clientKeyData".into(), status.client_key_data.into());
        }
        (true, true) if status.token.is_empty() => {
            return Err(Error::NothingToRender);
        }
        (true, true) => {}
        _ => {
            return Err(Error::HalfAKeyPairToRender);
        }
    }
    let expiry = status.expiration_unix.ok_or(Error::NoExpiration)?;
    if expiry <= now_unix {
        return Err(Error::ExpirationPassed(expiry));
    }
    let stamp = rfc3339_utc(expiry).ok_or(Error::ExpirationPastYear9999(expiry))?;
    out.insert("expirationTimestamp".into(), stamp.into());

    let doc = serde_json::json!({
        "apiVersion": api_version.as_str(),
        "kind": KIND,
        "status": out,
    });
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests;
