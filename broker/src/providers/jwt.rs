//! The little of JSON Web Tokens the providers need: a bearer token's `exp` (so it is never
//! served past it) and, for the GCP and Azure client assertions, RS256 signing.

use std::time::{Duration, SystemTime};

use base64::Engine as _;

use super::ProviderError;

/// The latest second RFC 3339 can write, 9999-12-31T23:59:59Z: client-go's
/// `expirationTimestamp`, protobuf's `Timestamp` and Kubernetes' times all end there, so a
/// later `exp` is no time at all (an issuer writing milliseconds, or a forged token). Near
/// `i64::MAX` it would not even fit a `SystemTime`.
pub const LATEST_EXP: u64 = 253_402_300_799;

/// The `exp` claim of a JWT, read without verifying it: the issuer verifies, we only need
/// to know when to stop serving it. `None` when the token is not a JWT or has no numeric
/// `exp`; `Some(Err(claim))`, the claim as written, when it is negative or past
/// [`LATEST_EXP`].
pub fn expiry(token: &str) -> Option<Result<SystemTime, String>> {
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
    let claim = claims.get("exp")?;
    let exp = claim.as_f64()?;
    // Checked before any arithmetic: `Duration::from_secs_f64` and `SystemTime + Duration`
    // panic on values this large.
    if !(0.0..=LATEST_EXP as f64).contains(&exp) {
        return Some(Err(claim.to_string()));
    }
    Some(Ok(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(exp)))
}

/// How long a bearer token read from `source` may be served: to its JWT `exp` (an expired
/// one is refused, naming `source` and the time; an `exp` that is no time is refused too),
/// else `lifetime` from now.
pub fn bearer_expiry(
    token: &str,
    lifetime: Duration,
    source: &str,
) -> Result<SystemTime, ProviderError> {
    match expiry(token) {
        Some(Err(claim)) => Err(ProviderError::Unavailable(format!(
            "the token in {source} has an exp claim ({claim}) that is not a time: it must be \
             seconds since 1970 up to 9999-12-31T23:59:59Z (does the issuer write milliseconds?)"
        ))),
        Some(Ok(exp)) if exp <= SystemTime::now() => Err(ProviderError::Unavailable(format!(
            "the token in {source} expired at {}",
            humantime::format_rfc3339_seconds(exp)
        ))),
        Some(Ok(exp)) => Ok(exp),
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
            Some(Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(5)))
        );
    }

    #[test]
    fn an_exp_past_year_9999_is_a_clear_error_not_a_panic() {
        let hour = Duration::from_secs(3600);
        // i64::MAX overflowed SystemTime (a panic); 5e18 and 1e300 are no time either.
        for exp in [
            serde_json::json!(i64::MAX),
            serde_json::json!(5e18),
            serde_json::json!(1e300),
            serde_json::json!(253_402_300_800_u64),
            serde_json::json!(-1),
        ] {
            let token = unsigned(&serde_json::json!({ "exp": exp }));
            let err = bearer_expiry(&token, hour, "f").unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, ProviderError::Unavailable(_)),
                "{exp}: {err:?}"
            );
            assert!(
                text.starts_with(&format!("the token in f has an exp claim ({exp})"))
                    && text.contains("9999-12-31T23:59:59Z"),
                "{text}"
            );
        }
        // The latest expressible second is still a time (the cache bounds how long it is
        // scheduled for).
        let last = unsigned(&serde_json::json!({"exp": LATEST_EXP}));
        assert_eq!(
            bearer_expiry(&last, hour, "f").unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(LATEST_EXP)
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
