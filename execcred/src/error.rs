//! The crate's one error type.

use crate::{API_V1, API_V1BETA1, KIND, rfc3339_utc};

/// Why `KUBERNETES_EXEC_INFO` or a plugin's ExecCredential was refused, or why an answer cannot
/// be rendered for client-go. Its text is what the shim prints after "cannot use
/// KUBERNETES_EXEC_INFO" or "unusable answer from the broker", and what the broker's exec
/// provider reports of a plugin's output: it names the field that is wrong and never quotes a
/// value but `kind`, `apiVersion` and `expirationTimestamp`, so no credential reaches a log.
/// Each message is whole (an underlying parser's error is part of its text), so no variant
/// has a `source`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `KUBERNETES_EXEC_INFO` is not JSON at all (serde_json says where it stopped).
    #[error("not valid JSON: {0}")]
    ExecInfoNotJson(serde_json::Error),
    /// `KUBERNETES_EXEC_INFO` is JSON but not an object.
    #[error("not a JSON object")]
    ExecInfoNotAnObject,
    /// `KUBERNETES_EXEC_INFO`'s `kind` is not `ExecCredential` (the kind it had).
    #[error("kind is {0:?}, expected \"{KIND}\"")]
    ExecInfoKind(String),
    /// `KUBERNETES_EXEC_INFO`'s `apiVersion` is neither v1 nor v1beta1 (the version it had;
    /// v1alpha1 was removed from client-go in 1.24).
    #[error("apiVersion {0:?} is not supported (expected {API_V1} or {API_V1BETA1})")]
    ExecInfoApiVersion(String),
    /// A field that must be a string holds something else (the field's path, such as
    /// `spec.cluster.server` or `status.token`).
    #[error("{0} must be a string")]
    NotAString(&'static str),
    /// A field that must be a boolean holds something else (the field's path).
    #[error("{0} must be true or false")]
    NotABool(&'static str),
    /// A field that must be an object holds something else (the field's path: `spec`,
    /// `spec.cluster` or `spec.cluster.config`).
    #[error("{0} must be a JSON object")]
    NotAnObject(&'static str),
    /// `spec.cluster.certificate-authority-data` is not base64.
    #[error("spec.cluster.certificate-authority-data is not valid base64: {0}")]
    CertificateAuthorityNotBase64(base64::DecodeError),
    /// `spec.cluster.config` is an object serde_json read but whose text could not be found
    /// again (it is passed on as that text, so it cannot be passed on at all).
    #[error("spec.cluster.config could not be located in the text")]
    ConfigNotLocated,
    /// A plugin's ExecCredential is not JSON (serde_json says where it stopped).
    #[error("not JSON ({0})")]
    CredentialNotJson(serde_json::Error),
    /// A plugin's ExecCredential has no supported `apiVersion`.
    #[error("apiVersion must be {API_V1} or {API_V1BETA1}")]
    CredentialApiVersion,
    /// A plugin's ExecCredential has another `kind`.
    #[error("kind must be {KIND}")]
    CredentialKind,
    /// A plugin's ExecCredential has no `status` object.
    #[error("no status object")]
    NoStatus,
    /// A plugin's `status` has a certificate without its key or a key without its
    /// certificate (and no token).
    #[error("status.clientCertificateData and status.clientKeyData go together")]
    HalfAKeyPair,
    /// A plugin's `status` has neither a token nor a key pair.
    #[error("status has neither token nor clientCertificateData")]
    NoCredential,
    /// A plugin's `status.expirationTimestamp` is not an RFC 3339 time (the text it had:
    /// a time, never a secret).
    #[error("status.expirationTimestamp {text:?}: not an RFC 3339 time ({reason})")]
    Expiration {
        text: String,
        reason: time::error::Parse,
    },
    /// A time that is not RFC 3339 ([`crate::parse_rfc3339`]).
    #[error("not an RFC 3339 time ({0})")]
    NotRfc3339(time::error::Parse),
    /// The answer to render has neither a token nor a client certificate and key.
    #[error("neither a token nor a client certificate and key")]
    NothingToRender,
    /// The answer to render has a certificate without its key, or a key without its
    /// certificate.
    #[error("a client certificate without its key, or a key without its certificate")]
    HalfAKeyPairToRender,
    /// The answer to render has no come-back time: client-go would keep the credential until
    /// a request is refused.
    #[error("no expiration_time")]
    NoExpiration,
    /// The answer's come-back time (Unix seconds) is not after now: client-go would re-run
    /// the plugin for every request.
    #[error("expiration_time {} is not in the future", unix_shown(*.0))]
    ExpirationPassed(i64),
    /// The answer's come-back time (Unix seconds) is past what RFC 3339 can write.
    #[error("expiration_time {0} (unix seconds) is past year 9999")]
    ExpirationPastYear9999(i64),
}

/// Unix seconds as RFC 3339 where they fit, else as the number.
fn unix_shown(unix: i64) -> String {
    rfc3339_utc(unix).unwrap_or_else(|| format!("{unix} (unix seconds)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts users see, word for word as they were when each function returned a String.
    #[test]
    fn messages_are_the_ones_users_know() {
        let json = || serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let base64 = || base64::DecodeError::InvalidByte(0, b'*');
        let time = || {
            time::OffsetDateTime::parse("soon", &time::format_description::well_known::Rfc3339)
                .unwrap_err()
        };
        let cases = [
            (
                Error::ExecInfoNotJson(json()),
                format!("not valid JSON: {}", json()),
            ),
            (Error::ExecInfoNotAnObject, "not a JSON object".to_owned()),
            (
                Error::ExecInfoKind("Pod".into()),
                "kind is \"Pod\", expected \"ExecCredential\"".to_owned(),
            ),
            (
                Error::ExecInfoApiVersion("v9".into()),
                "apiVersion \"v9\" is not supported (expected client.authentication.k8s.io/v1 \
                 or client.authentication.k8s.io/v1beta1)"
                    .to_owned(),
            ),
            (
                Error::NotAString("spec.cluster.server"),
                "spec.cluster.server must be a string".to_owned(),
            ),
            (
                Error::NotABool("spec.interactive"),
                "spec.interactive must be true or false".to_owned(),
            ),
            (
                Error::NotAnObject("spec.cluster"),
                "spec.cluster must be a JSON object".to_owned(),
            ),
            (
                Error::CertificateAuthorityNotBase64(base64()),
                format!(
                    "spec.cluster.certificate-authority-data is not valid base64: {}",
                    base64()
                ),
            ),
            (
                Error::ConfigNotLocated,
                "spec.cluster.config could not be located in the text".to_owned(),
            ),
            (
                Error::CredentialNotJson(json()),
                format!("not JSON ({})", json()),
            ),
            (
                Error::CredentialApiVersion,
                "apiVersion must be client.authentication.k8s.io/v1 or \
                 client.authentication.k8s.io/v1beta1"
                    .to_owned(),
            ),
            (
                Error::CredentialKind,
                "kind must be ExecCredential".to_owned(),
            ),
            (Error::NoStatus, "no status object".to_owned()),
            (
                Error::HalfAKeyPair,
                "status.clientCertificateData and status.clientKeyData go together".to_owned(),
            ),
            (
                Error::NoCredential,
                "status has neither token nor clientCertificateData".to_owned(),
            ),
            (
                Error::Expiration {
                    text: "soon".into(),
                    reason: time(),
                },
                format!(
                    "status.expirationTimestamp \"soon\": not an RFC 3339 time ({})",
                    time()
                ),
            ),
            (
                Error::NotRfc3339(time()),
                format!("not an RFC 3339 time ({})", time()),
            ),
            (
                Error::NothingToRender,
                "neither a token nor a client certificate and key".to_owned(),
            ),
            (
                Error::HalfAKeyPairToRender,
                "a client certificate without its key, or a key without its certificate".to_owned(),
            ),
            (Error::NoExpiration, "no expiration_time".to_owned()),
            (
                Error::ExpirationPassed(0),
                "expiration_time 1970-01-01T00:00:00Z is not in the future".to_owned(),
            ),
            (
                Error::ExpirationPassed(i64::MIN),
                format!(
                    "expiration_time {} (unix seconds) is not in the future",
                    i64::MIN
                ),
            ),
            (
                Error::ExpirationPastYear9999(i64::MAX),
                format!(
                    "expiration_time {} (unix seconds) is past year 9999",
                    i64::MAX
                ),
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.to_string(), want, "{error:?}");
        }
    }
}
