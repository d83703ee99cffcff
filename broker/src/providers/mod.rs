//! Credential providers behind one trait. A provider resolves a request once into what it
//! asks for (the cache key and a typed target), fetches a credential for that target, and
//! classifies its failures so the cache knows whether to retry (transient) or to drop what it
//! holds (denied).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::values::ProviderKind;
use crate::config::{ProviderConfig, ProviderSpec};
use crate::request::TokenRequest;

// A type behind a Cargo feature is built only with the feature; its section
// (`crate::config::providers`) is in every build, so a slim build still parses and explains an
// entry of that type and serves it with [`unbuilt::Unbuilt`].
#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "azure")]
pub mod azure;
pub mod exec;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod file;
#[cfg(feature = "gcp")]
pub mod gcp;
pub mod jwt;
#[cfg(feature = "kubernetes-secret")]
pub mod kubernetes_secret;
pub mod overrides;
pub mod unbuilt;
/// Always built (its error-chain printer has no dependency); its trust roots and HTTP client
/// only with a cloud provider's feature.
pub mod upstream;

/// A boxed future, so providers stay object-safe behind `Arc<dyn Provider>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A secret string: kept in memory only, printed as `[redacted]` by Debug and Display.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The secret itself; call only to put it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// What a provider hands back: a bearer token or a client certificate and key.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    pub secret: CredentialSecret,
    /// The credential's real expiry as the issuer states it.
    pub expires_at: SystemTime,
    /// Opaque version of the source (e.g. a file's inode and mtime); lets a provider tell
    /// the cache that what it holds is out of date without fetching.
    pub source_version: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CredentialSecret {
    Token(Secret),
    ClientCertificate {
        certificate_pem: String,
        key_pem: Secret,
    },
}

impl Credential {
    pub fn token(token: impl Into<String>, expires_at: SystemTime) -> Self {
        Self {
            secret: CredentialSecret::Token(Secret::new(token)),
            expires_at,
            source_version: None,
        }
    }

    /// The bytes it holds on the heap (what `cache.maxBytes` counts).
    pub fn heap_bytes(&self) -> usize {
        match &self.secret {
            CredentialSecret::Token(t) => t.0.len(),
            CredentialSecret::ClientCertificate {
                certificate_pem,
                key_pem,
            } => certificate_pem.len() + key_pem.0.len(),
        }
    }
}

/// How a provider failed. The variant decides the gRPC status (mapped in `status`) and
/// what the cache does next; messages name the provider's input, never a secret.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProviderError {
    /// The request lacks something this provider needs (e.g. `clusterName`).
    #[error("{0}")]
    InvalidRequest(String),
    /// The source of the credential does not exist (e.g. a token file).
    #[error("{0}")]
    NotFound(String),
    /// The upstream refused this identity: the cache drops what it holds for it.
    #[error("{0}")]
    Denied(String),
    /// The upstream failed or could not be reached: retried with backoff, while a cached
    /// credential is still served.
    #[error("{0}")]
    Unavailable(String),
    /// The upstream did not answer in time: treated like `Unavailable`.
    #[error("{0}")]
    Timeout(String),
    /// The provider type is not compiled into this broker, or is misconfigured.
    #[error("{0}")]
    Unimplemented(String),
}

impl ProviderError {
    /// Whether the cache should retry with backoff and keep serving what it holds.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Timeout(_))
    }
}

/// Why a token a source handed over was refused. Describes the token's shape only, never
/// its text: the messages end up in logs and in the caller's error.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("is empty")]
    Empty,
    #[error(
        "contains a control character (U+{code:04X}) at byte {at}: a bearer token is one line of printable text"
    )]
    ControlCharacter { code: u32, at: usize },
    #[error("has whitespace inside (at byte {at}): a bearer token is a single word")]
    Whitespace { at: usize },
    #[error(
        "holds a character that is not ASCII (U+{code:04X}) at byte {at}: a bearer token is printable ASCII (RFC 6750)"
    )]
    NotAscii { code: u32, at: usize },
}

impl TokenError {
    /// What is wrong, without the character or where it is: for a source whose content is
    /// not the broker's to reveal (a file path may lead, through a symlink, to any file the
    /// broker can read; the offset of the first control character says where its first line
    /// ends).
    pub fn shape(&self) -> &'static str {
        match self {
            Self::Empty => "is empty",
            Self::ControlCharacter { .. } => {
                "contains a control character: a bearer token is one line of printable text"
            }
            Self::Whitespace { .. } => "has whitespace inside: a bearer token is a single word",
            Self::NotAscii { .. } => {
                "holds a character that is not ASCII: a bearer token is printable ASCII (RFC 6750)"
            }
        }
    }
}

/// The one rule every provider applies to a bearer token before it is cached or served:
/// surrounding ASCII whitespace (a file's trailing newline, a plugin's `"token": "x\n"`) and a
/// leading UTF-8 byte-order mark (a token file saved by a Windows editor) are trimmed; what
/// remains must be non-empty, printable ASCII, with no whitespace. A CR/LF inside a token
/// would split the `Authorization` header client-go builds from it, an ESC would reach
/// terminals through `kubectl`, a space means two tokens or a kubeconfig, and anything beyond
/// ASCII (a byte-order mark, a zero-width or bidi character) is invisible when a person
/// compares tokens and is no part of any token RFC 6750 allows, so none of them is passed on.
pub fn bearer_token(raw: &str) -> Result<&str, TokenError> {
    let token = raw.trim_ascii();
    let token = token.strip_prefix('\u{feff}').unwrap_or(token).trim_ascii();
    if token.is_empty() {
        return Err(TokenError::Empty);
    }
    match token
        .char_indices()
        .find(|(_, c)| c.is_control() || c.is_whitespace() || !c.is_ascii())
    {
        None => Ok(token),
        Some((at, c)) if c.is_control() => Err(TokenError::ControlCharacter {
            code: u32::from(c),
            at,
        }),
        Some((at, c)) if c.is_whitespace() => Err(TokenError::Whitespace { at }),
        Some((at, c)) => Err(TokenError::NotAscii {
            code: u32::from(c),
            at,
        }),
    }
}

/// A request as one provider resolved it, once per call: the identity text the cache keys
/// on, and the provider's own typed target (which Secret, which role and region, which file)
/// that the cache hands back to [`Provider::fetch`] and [`Provider::is_current`], so neither
/// derives it again.
///
/// The target is an `Arc<dyn Any + Send + Sync>` that only its provider downcasts, rather
/// than an enum of every provider's target: each target type stays private to its provider
/// module (no central list that every new provider must edit, no variants that appear and
/// disappear with the cargo features), and the cache stays ignorant of what it carries. The
/// price is one checked downcast per fetch, which can fail only if the broker handed a target
/// to a provider of another type; that is reported as an error, never a panic. A generic
/// `Provider<Target = T>` would catch that at compile time, but would not be object-safe
/// behind `Arc<dyn Provider>` without a second, type-erased trait doing the same downcast.
#[derive(Clone)]
pub struct Resolved {
    key: String,
    target: Arc<dyn Any + Send + Sync>,
}

impl Resolved {
    /// `key`: requests with the same key, within one provider, share one credential and one
    /// upstream call. `target`: what the provider's `fetch` needs to get it.
    pub fn new(key: impl Into<String>, target: impl Any + Send + Sync) -> Self {
        Self {
            key: key.into(),
            target: Arc::new(target),
        }
    }

    /// The identity text the cache keys on (shown by AdminService's ListEntries).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The provider's typed target.
    pub fn target<T: Any>(&self) -> Result<&T, ProviderError> {
        self.target.downcast_ref::<T>().ok_or_else(|| {
            ProviderError::Unimplemented(format!(
                "internal error: identity {:?} was resolved by another provider type than the one \
                 asked to fetch it (expected a {})",
                self.key,
                std::any::type_name::<T>()
            ))
        })
    }
}

/// The key only: a target may hold values (an external id) that the key shows hashed.
impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// One configured provider.
pub trait Provider: Send + Sync + fmt::Debug {
    fn kind(&self) -> ProviderKind;

    /// Reads the request once: the identity it maps to within this provider (requests with
    /// the same identity share one credential and one upstream call) and the typed target
    /// `fetch` and `is_current` get back. Checks every value the cluster supplies.
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError>;

    /// Gets a new credential from upstream for `target`, which this provider's `resolve`
    /// made. `req` is the request that caused the fetch, for providers that pass the
    /// caller's input on as it came (exec: `KUBERNETES_EXEC_INFO`) or name its cluster in
    /// messages.
    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>>;

    /// Whether a cached credential still reflects its source; checked on every hit, so it
    /// must be cheap (a `stat`, not a read). Most sources cannot change under a credential.
    fn is_current(&self, _target: &Resolved, _cached: &Credential) -> bool {
        true
    }

    /// Whether a fetch that failed may be tried again at the next call instead of after a
    /// back-off: true for a source that costs a local read (a file being rewritten in place
    /// is read again the moment it is whole), false for an upstream that must not be asked
    /// again and again while it fails.
    fn retries_at_once(&self) -> bool {
        false
    }

    /// True when `fetch` passes the cluster's CA data on (a wrapped exec plugin is shown
    /// `spec.cluster`). Otherwise the cache keeps no copy of it for refreshes without a
    /// caller: it is the largest part of a request (up to `limits.maxCertificateAuthorityBytes`).
    fn reads_certificate_authority(&self) -> bool {
        false
    }

    /// False when this build cannot serve the provider's type at all, or the provider knows
    /// its source is unreachable right now (kubernetesSecret: the watch is down, calls are
    /// served from the last state seen). AdminService's ListProviders shows it as `ready`.
    fn available(&self) -> bool {
        true
    }
}

/// Resolve-then-fetch in one call, for the providers' unit tests.
#[cfg(test)]
pub(crate) trait ProviderTestExt: Provider {
    /// The cache key `resolve` derives.
    fn key_for(&self, req: &TokenRequest) -> Result<String, ProviderError> {
        self.resolve(req).map(|r| r.key().to_owned())
    }

    /// `resolve`, then `fetch` with what it resolved.
    fn fetch_for<'a>(
        &'a self,
        req: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move {
            let target = self.resolve(req)?;
            self.fetch(req, &target).await
        })
    }

    /// `resolve`, then `is_current` (false when the request does not resolve).
    fn is_current_for(&self, req: &TokenRequest, cached: &Credential) -> bool {
        self.resolve(req)
            .is_ok_and(|target| self.is_current(&target, cached))
    }
}

#[cfg(test)]
impl<P: Provider + ?Sized> ProviderTestExt for P {}

/// Builds the provider a config entry describes. Cheap and infallible: providers that need
/// I/O to set up (cloud credential chains) do it on their first fetch, so a broker with a
/// cloud it cannot reach yet still starts and serves the others.
pub fn build(config: &ProviderConfig) -> Arc<dyn Provider> {
    let name = config.name.as_str();
    match &config.spec {
        ProviderSpec::Exec(section) => Arc::new(exec::ExecProvider::new(section.clone())),
        ProviderSpec::File(section) => Arc::new(file::FileProvider::new(section.clone())),
        #[cfg(feature = "aws")]
        ProviderSpec::Aws(section) => aws::build(name, section),
        #[cfg(feature = "gcp")]
        ProviderSpec::Gcp(section) => gcp::build(name, section),
        #[cfg(feature = "azure")]
        ProviderSpec::Azure(section) => azure::build(section),
        #[cfg(feature = "kubernetes-secret")]
        ProviderSpec::KubernetesSecret(section) => kubernetes_secret::build(name, section),
        // A type whose Cargo feature is off: accepted, and answered UNIMPLEMENTED.
        #[allow(unreachable_patterns)] // with every feature on, nothing lands here
        other => Arc::new(unbuilt::Unbuilt::new(name, other.kind())),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_target_is_only_handed_back_as_its_own_type() {
        let resolved = Resolved::new("ns/name key token", PathBuf::from("/x"));
        assert_eq!(resolved.key(), "ns/name key token");
        assert_eq!(resolved.target::<PathBuf>(), Ok(&PathBuf::from("/x")));
        let e = resolved.target::<String>().unwrap_err();
        assert!(matches!(e, ProviderError::Unimplemented(_)), "{e:?}");
        assert!(e.to_string().contains("ns/name key token"), "{e}");
        assert_eq!(
            format!("{resolved:?}"),
            r#"Resolved { key: "ns/name key token", .. }"#
        );
    }

    #[test]
    fn secrets_never_print() {
        let cred = Credential {
            secret: CredentialSecret::ClientCertificate {
                certificate_pem: "CERT".into(),
                key_pem: Secret::new("KEY-MATERIAL"),
            },
            expires_at: SystemTime::UNIX_EPOCH,
            source_version: None,
        };
        let token = Credential::token("TOKEN-MATERIAL", SystemTime::UNIX_EPOCH);
        let printed = format!("{cred:?} {token:?} {} {:#?}", Secret::new("s3"), token);
        assert!(!printed.contains("MATERIAL"), "{printed}");
        assert!(!printed.contains("s3"), "{printed}");
        assert!(printed.contains("[redacted]"));
    }

    #[test]
    fn one_rule_for_every_token() {
        assert_eq!(bearer_token(" \t tok.en-_~+/=\r\n"), Ok("tok.en-_~+/="));
        assert_eq!(bearer_token(" \n\t"), Err(TokenError::Empty));
        assert_eq!(
            bearer_token("ab\r\ncd"),
            Err(TokenError::ControlCharacter { code: 0x0d, at: 2 })
        );
        assert_eq!(
            bearer_token("a\u{1b}[2J"),
            Err(TokenError::ControlCharacter { code: 0x1b, at: 1 })
        );
        assert_eq!(
            bearer_token("a\u{0}"),
            Err(TokenError::ControlCharacter { code: 0, at: 1 })
        );
        assert_eq!(bearer_token("ab cd"), Err(TokenError::Whitespace { at: 2 }));
        assert_eq!(
            bearer_token("ab\u{a0}cd"),
            Err(TokenError::Whitespace { at: 2 })
        );
        let shown = TokenError::ControlCharacter { code: 0x0a, at: 6 }.to_string();
        assert!(shown.contains("U+000A"), "{shown}");
        // A byte-order mark in front (an editor's) is dropped; anywhere else, and any other
        // character beyond ASCII, refused.
        assert_eq!(bearer_token("\u{feff}tok-1\n"), Ok("tok-1"));
        assert_eq!(bearer_token(" \u{feff} tok-1"), Ok("tok-1"));
        assert_eq!(
            bearer_token("tok\u{feff}1"),
            Err(TokenError::NotAscii {
                code: 0xfeff,
                at: 3
            })
        );
        assert_eq!(
            bearer_token("tok\u{202e}1"),
            Err(TokenError::NotAscii {
                code: 0x202e,
                at: 3
            })
        );
        assert_eq!(
            bearer_token("t\u{200b}"),
            Err(TokenError::NotAscii {
                code: 0x200b,
                at: 1
            })
        );
        assert_eq!(
            bearer_token("ab\u{2028}cd"),
            Err(TokenError::Whitespace { at: 2 })
        );
    }

    /// The exec and file providers hold tokens to the same rule (the exec side is tested with
    /// the ExecCredential parser in `exec::tests`).
    #[tokio::test]
    async fn the_file_provider_trims_and_refuses_like_every_provider() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let yaml = format!(
            "providers:\n  - {{name: f, type: file, file: {{path: {:?}}}}}\n",
            path.display().to_string()
        );
        let config = crate::config::Config::parse(&yaml, "t").unwrap();
        let provider = build(&config.providers[0]);
        let req = TokenRequest {
            provider: "f".into(),
            cluster: None,
            interactive: false,
        };
        std::fs::write(&path, "  sekrit-token \r\n").unwrap();
        let cred = provider.fetch_for(&req).await.unwrap();
        assert_eq!(
            cred.secret,
            CredentialSecret::Token(Secret::new("sekrit-token"))
        );
        for bad in [
            "sekrit\r\nInjected: x",
            "sekrit\u{1b}[2J",
            "sekrit\u{0}x",
            "sekrit token",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = provider.fetch_for(&req).await.unwrap_err().to_string();
            assert!(e.contains(&path.display().to_string()), "{bad:?}: {e}");
            assert!(!e.contains("sekrit"), "{bad:?} quoted: {e}");
        }
    }
}
