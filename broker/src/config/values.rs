//! Value types and checks shared by the top-level configuration (`config`) and the providers'
//! own sections (`config::providers::<type>`). It sits below both and imports neither, so a
//! provider's section can use a duration or a name check without reaching back into the
//! module that names it.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Twice the shim's default wait: a slow upstream still fills the cache for the next caller,
/// a stuck one frees its entry for a new attempt. The cache stops waiting for any upstream
/// call after this long; provider sections (an exec plugin's `timeout`) are checked against
/// it, so it lives here rather than in `cache` (which re-exports it).
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// The provider types, as `type:` names them.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ProviderKind {
    Aws,
    Gcp,
    Azure,
    Exec,
    File,
    KubernetesSecret,
}

impl ProviderKind {
    /// Whether this build can serve the type (cloud types are Cargo features).
    pub fn built_in(self) -> bool {
        match self {
            Self::Exec | Self::File => true,
            Self::Aws => cfg!(feature = "aws"),
            Self::Gcp => cfg!(feature = "gcp"),
            Self::Azure => cfg!(feature = "azure"),
            Self::KubernetesSecret => cfg!(feature = "kubernetes-secret"),
        }
    }

    /// The name used in the config (`type:`) and in the section key.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Aws => "aws",
            Self::Gcp => "gcp",
            Self::Azure => "azure",
            Self::Exec => "exec",
            Self::File => "file",
            Self::KubernetesSecret => "kubernetesSecret",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A duration written the human way: `30s`, `5m`, `1h30m`, `500ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim())
            .map(ConfigDuration)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {text:?} ({e}); write it like 30s, 5m or 1h30m"
                ))
            })
    }
}

/// A piece of a `nameTemplate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Literal(String),
    Placeholder(String),
}

/// Splits a template like `{clusterName}-{msaName}` into literals and placeholders.
pub fn template_parts(template: &str) -> Result<Vec<TemplatePart>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                parts.push(TemplatePart::Literal(rest.to_owned()));
                break;
            }
            Some(at) if rest[at..].starts_with('}') => {
                return Err(format!("unmatched '}}' in {template:?}"));
            }
            Some(at) => {
                if at > 0 {
                    parts.push(TemplatePart::Literal(rest[..at].to_owned()));
                }
                let Some(len) = rest[at..].find('}') else {
                    return Err(format!("unclosed '{{' in {template:?}"));
                };
                let name = &rest[at + 1..at + len];
                if !is_placeholder_name(name) {
                    return Err(format!(
                        "placeholder {{{name}}} in {template:?} is not a name (letters, digits, '_')"
                    ));
                }
                parts.push(TemplatePart::Placeholder(name.to_owned()));
                rest = &rest[at + len + 1..];
            }
        }
    }
    if parts.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(parts)
}

/// What a template placeholder (and a `templateDefaults` key) may be called.
pub fn is_placeholder_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// RFC 1123 label: what a namespace name must be.
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && is_dns_subdomain(name) && !name.contains('.')
}

/// RFC 1123 subdomain: what a Secret name must be.
pub fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || matches!(c, '-' | '.'))
}

/// What Kubernetes accepts as a key of a Secret's `data`.
pub fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A per-cluster key that selects an identity or a secret (see `providers::overrides`): each
/// provider type's config module lists its own (`OVERRIDE_KEYS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectorKey {
    pub name: &'static str,
    /// What the key picks, for the refusal message.
    pub selects: &'static str,
    /// The value may be a secret (an AWS external id): never echoed in a message.
    pub secret: bool,
}

/// A selector key of one provider entry (a placeholder's name is not `'static`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub name: Cow<'static, str>,
    pub selects: &'static str,
    pub secret: bool,
}

impl From<&SelectorKey> for Selector {
    fn from(key: &SelectorKey) -> Self {
        Self {
            name: Cow::Borrowed(key.name),
            selects: key.selects,
            secret: key.secret,
        }
    }
}
