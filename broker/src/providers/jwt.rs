//! The little of JSON Web Tokens the providers need: a bearer token's `exp` (so it is never
//! served past it) and, for the GCP and Azure client assertions, RS256 signing.

use std::time::{Duration, SystemTime};

use base64::Engine as _;

use super::ProviderError;

/// The `exp` claim of a JWT, read without verifying it: the issuer verifies, we only need
/// to know when to stop serving it. `None` when the token is not a JWT or has no `exp`.
pub fn expiry(token: &str) -> Option<SystemTime> {
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(payload).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    (exp.is_finite() && exp >= 0.0).then(|| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(exp))
}

/// How long a bearer token read from `source` may be served: to its JWT `exp` (an expired
/// one is refused, naming `source` and the time), else `lifetime` from now.
pub fn bearer_expiry(
    token: &str,
    lifetime: Duration,
    source: &str,
) -> Result<SystemTime, ProviderError> {
    match expiry(token) {
        Some(exp) if exp <= SystemTime::now() => Err(ProviderError::Unavailable(format!(
            "the token in {source} expired at {}",
            humantime::format_rfc3339_seconds(exp)
        ))),
        Some(exp) => Ok(exp),
        None => Ok(SystemTime::now() + lifetime),
    }
}

/// `header.claims.signature`, RS256 with `key` (aws-lc-rs, the broker's one crypto
/// provider). The error says nothing of the key.
#[cfg(any(feature = "gcp", feature = "azure"))]
pub fn sign_rs256(
    key: &aws_lc_rs::signature::RsaKeyPair,
    header: &serde_json::Value,
    claims: &serde_json::Value,
) -> Result<String, String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signing_input = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let mut signature = vec![0; key.public_modulus_len()];
    key.sign(
        &aws_lc_rs::signature::RSA_PKCS1_SHA256,
        &aws_lc_rs::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| "RS256 signing failed".to_owned())?;
    Ok(format!("{signing_input}.{}", b64.encode(signature)))
}

/// An unsigned JWT-shaped token with these claims, for tests.
#[cfg(test)]
pub fn unsigned(claims: &serde_json::Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.sig",
        b64.encode(r#"{"alg":"RS256"}"#),
        b64.encode(claims.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_strict_about_shape() {
        assert_eq!(expiry("not-a-jwt"), None);
        assert_eq!(expiry("a.b"), None);
        assert_eq!(expiry("a.b.c.d"), None);
        assert_eq!(expiry("a.!!!.c"), None);
        assert_eq!(expiry(&unsigned(&serde_json::json!({"sub": "x"}))), None);
        assert_eq!(
            expiry(&unsigned(&serde_json::json!({"exp": 5}))),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(5))
        );
    }

    #[test]
    fn bearer_expiry_refuses_an_expired_jwt_and_defaults_otherwise() {
        let hour = Duration::from_secs(3600);
        let err =
            bearer_expiry(&unsigned(&serde_json::json!({"exp": 1000})), hour, "f").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the token in f expired at 1970-01-01T00:16:40Z"
        );
        let later = bearer_expiry("opaque", hour, "f").unwrap();
        assert!(later > SystemTime::now() + hour - Duration::from_secs(5));
    }
}
