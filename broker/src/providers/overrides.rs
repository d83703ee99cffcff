//! Per-cluster keys that choose *who* the broker authenticates as or *which* secret it reads.
//!
//! A cluster's exec extension (`spec.cluster.config`) is written by whoever can write the
//! ClusterProfile's status, not by whoever configured the broker. Keys that only describe or
//! locate the target cluster (`clusterName`, `clusterId`, `region`, the server) are that
//! writer's to set. Keys that pick the identity (an AWS role, an Entra tenant or audience) or
//! the secret (a Secret's data key, context or name placeholder) would let that writer spend
//! the broker's credentials on anything they reach: a confused deputy. So each provider type
//! declares those keys here ([`AWS_KEYS`], [`AZURE_KEYS`], [`KUBERNETES_SECRET_KEYS`], plus
//! kubernetesSecret's name placeholders), and one check ([`check`]) runs on every request
//! before the provider sees it: a selector key is refused unless its value is the provider's
//! own or matches a glob of the provider entry's `allowOverrides`. The cache key, the fetch
//! and any future provider get the rule without doing anything.
//!
//! This module works from the config alone (not the built provider), so `check-config`
//! validates `allowOverrides` for every type, compiled in or not.

use std::borrow::Cow;

use crate::config::values::{ProviderKind, TemplatePart, template_parts};
use crate::config::{ProviderConfig, ProviderSpec};
use crate::providers::kubernetes_secret::config::SecretFormat;
use crate::request::TokenRequest;
use crate::text::quote;

/// A per-cluster key that selects an identity or a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectorKey {
    pub name: &'static str,
    /// What the key picks, for the refusal message.
    pub selects: &'static str,
    /// The value may be a secret (an AWS external id): never echoed in a message.
    pub secret: bool,
}

/// aws: each of these changes the principal the token is signed as.
pub const AWS_KEYS: &[SelectorKey] = &[
    SelectorKey {
        name: "roleArn",
        selects: "the IAM role the broker assumes with its own credentials",
        secret: false,
    },
    SelectorKey {
        name: "externalId",
        selects: "the ExternalId sent with AssumeRole (the role owner's guard against confused deputies)",
        secret: true,
    },
    SelectorKey {
        name: "sessionName",
        selects: "the role session name (trust policies and EKS username mappings can key on it)",
        secret: false,
    },
];

/// azure: the tenant picks the directory the identity signs into; the server id picks the
/// token's audience, and since the same ClusterProfile writer also picks the server the token
/// is sent to, an audience of their choosing hands them a token for any Entra application the
/// broker's identity can reach.
pub const AZURE_KEYS: &[SelectorKey] = &[
    SelectorKey {
        name: "tenantId",
        selects: "the Entra tenant the token is issued in",
        secret: false,
    },
    SelectorKey {
        name: "serverId",
        selects: "the token's audience (a token for that Entra application, sent to the server the ClusterProfile names)",
        secret: false,
    },
];

/// kubernetesSecret: which part of which Secret is served. Name placeholders other than
/// `clusterName` (see [`selector_keys`]) pick the Secret itself.
pub const KUBERNETES_SECRET_KEYS: &[SelectorKey] = &[
    SelectorKey {
        name: "key",
        selects: "the data key of the Secret that is read",
        secret: false,
    },
    SelectorKey {
        name: "context",
        selects: "the kubeconfig context whose user's credential is served",
        secret: false,
    },
];

/// What a name placeholder other than `clusterName` selects.
const PLACEHOLDER_SELECTS: &str = "part of the name of the Secret that is read";

/// The per-cluster keys of each type that only describe or locate the cluster: always
/// allowed, listed so that `allowOverrides` naming one gets a precise answer.
pub fn locating_keys(kind: ProviderKind) -> &'static [&'static str] {
    match kind {
        ProviderKind::Aws => &["clusterName", "clusterId", "region"],
        // The provider watches one namespace and refuses any other, so `namespace` cannot
        // select a Secret outside it.
        ProviderKind::KubernetesSecret => &["clusterName", "namespace"],
        ProviderKind::Gcp | ProviderKind::Azure | ProviderKind::File => &["clusterName"],
        // A wrapped plugin gets the cluster config as client-go would give it: what the
        // plugin makes of it is the plugin's policy, as it is without the broker.
        ProviderKind::Exec => &[],
    }
}

/// A selector key of one provider entry (a placeholder's name is not `'static`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub name: Cow<'static, str>,
    pub selects: &'static str,
    pub secret: bool,
}

/// The selector keys of one provider entry: its type's, and for kubernetesSecret its name
/// placeholders other than `clusterName` (and `context` only with `format: kubeconfig`, the
/// only format that reads it).
pub fn selector_keys(config: &ProviderConfig) -> Vec<Selector> {
    let fixed = |keys: &[SelectorKey]| -> Vec<Selector> {
        keys.iter()
            .map(|k| Selector {
                name: Cow::Borrowed(k.name),
                selects: k.selects,
                secret: k.secret,
            })
            .collect()
    };
    match &config.spec {
        ProviderSpec::Aws(_) => fixed(AWS_KEYS),
        ProviderSpec::Azure(_) => fixed(AZURE_KEYS),
        ProviderSpec::KubernetesSecret(section) => {
            let mut keys = fixed(KUBERNETES_SECRET_KEYS);
            if section.format != SecretFormat::Kubeconfig {
                keys.retain(|k| k.name != "context");
            }
            for part in template_parts(&section.name_template).unwrap_or_default() {
                if let TemplatePart::Placeholder(name) = part
                    && name != "clusterName"
                    && !keys.iter().any(|k| k.name == name)
                {
                    keys.push(Selector {
                        name: Cow::Owned(name),
                        selects: PLACEHOLDER_SELECTS,
                        secret: false,
                    });
                }
            }
            keys
        }
        ProviderSpec::Gcp(_) | ProviderSpec::Exec(_) | ProviderSpec::File(_) => Vec::new(),
    }
}

/// What the provider uses for `key` when the cluster does not say: a cluster repeating it is
/// not an override.
fn provider_value<'a>(config: &'a ProviderConfig, key: &str) -> Option<&'a str> {
    match &config.spec {
        ProviderSpec::Aws(aws) => match key {
            "roleArn" => aws.role_arn.as_deref(),
            "externalId" => aws.external_id.as_deref(),
            "sessionName" => aws.session_name.as_deref().or(DEFAULT_AWS_SESSION_NAME),
            _ => None,
        },
        ProviderSpec::Azure(azure) => match key {
            "tenantId" => azure.tenant_id.as_deref(),
            "serverId" => azure.server_id.as_deref().or(DEFAULT_AZURE_SERVER_ID),
            _ => None,
        },
        ProviderSpec::KubernetesSecret(section) => match key {
            "key" => Some(&section.key),
            "context" => section.context.as_deref(),
            placeholder => section
                .template_defaults
                .get(placeholder)
                .map(String::as_str),
        },
        ProviderSpec::Gcp(_) | ProviderSpec::Exec(_) | ProviderSpec::File(_) => None,
    }
}

#[cfg(feature = "aws")]
const DEFAULT_AWS_SESSION_NAME: Option<&str> = Some(super::aws::DEFAULT_SESSION_NAME);
#[cfg(not(feature = "aws"))]
const DEFAULT_AWS_SESSION_NAME: Option<&str> = None;
#[cfg(feature = "azure")]
const DEFAULT_AZURE_SERVER_ID: Option<&str> = Some(super::azure::AKS_SERVER_ID);
#[cfg(not(feature = "azure"))]
const DEFAULT_AZURE_SERVER_ID: Option<&str> = None;

/// A per-cluster key that would change who the broker is, refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum OverrideError {
    /// The message starts `override refused:` (stable, for grepping logs) and ends with the
    /// config that would allow the value.
    #[error(
        "override refused: the cluster's exec config sets {key}{shown}, which selects {selects}; {why}"
    )]
    Refused {
        key: String,
        /// ` "value"` (quoted, truncated) or ` (value not shown)` for a secret.
        shown: String,
        selects: &'static str,
        /// Why it is refused and what to add, naming the provider.
        why: String,
    },
}

/// Refuses a request whose cluster config sets a selector key of this provider to a value
/// other than the provider's own, unless `allowOverrides` has a matching pattern. Values are
/// read as the providers read them ([`TokenRequest::config_str`]).
pub fn check(config: &ProviderConfig, req: &TokenRequest) -> Result<(), OverrideError> {
    for key in selector_keys(config) {
        let Some(value) = req.config_str(&key.name) else {
            continue;
        };
        if provider_value(config, &key.name) == Some(value.as_str()) {
            continue;
        }
        let patterns = config.allow_overrides.get(key.name.as_ref());
        if patterns.is_some_and(|ps| ps.iter().any(|p| glob_match(p, &value))) {
            continue;
        }
        let provider = &config.name;
        let suggested = if key.secret {
            "\"<pattern>\"".to_owned()
        } else {
            format!("\"{}\"", quote(&value))
        };
        let why = match patterns {
            None => format!(
                "provider {provider:?} allows no per-cluster {name}; to allow it, add to provider {provider:?}: allowOverrides: {{{name}: [{suggested}]}} (glob patterns, * and ?)",
                name = key.name
            ),
            Some(ps) => format!(
                "it matches none of the {} pattern(s) in allowOverrides.{name} of provider {provider:?}; to allow it, add a pattern such as {suggested} there",
                ps.len(),
                name = key.name
            ),
        };
        return Err(OverrideError::Refused {
            shown: if key.secret {
                " (value not shown)".to_owned()
            } else {
                format!(" \"{}\"", quote(&value))
            },
            key: key.name.into_owned(),
            selects: key.selects,
            why,
        });
    }
    Ok(())
}

/// Checks a provider entry's `allowOverrides`; the returned path is relative to the entry.
pub fn validate(config: &ProviderConfig) -> Result<(), (String, String)> {
    if config.allow_overrides.is_empty() {
        return Ok(());
    }
    let keys = selector_keys(config);
    let kind = config.kind();
    for (name, patterns) in &config.allow_overrides {
        let at = format!("allowOverrides.{name}");
        if !keys.iter().any(|k| k.name == name.as_str()) {
            let message = if locating_keys(kind).contains(&name.as_str()) {
                format!(
                    "{name} only locates the cluster and is always allowed; remove it from allowOverrides"
                )
            } else if keys.is_empty() {
                format!(
                    "type {kind} has no per-cluster keys that select an identity or a secret, so nothing can be allowed; remove allowOverrides"
                )
            } else {
                let list: Vec<&str> = keys.iter().map(|k| k.name.as_ref()).collect();
                format!(
                    "{name:?} is not a per-cluster key that provider type {kind} lets a cluster override{}; the overridable keys are: {}",
                    if kind == ProviderKind::KubernetesSecret {
                        " (its keys are key, context with format: kubeconfig, and the nameTemplate's placeholders other than clusterName)"
                    } else {
                        ""
                    },
                    list.join(", ")
                )
            };
            return Err((at, message));
        }
        if patterns.is_empty() {
            return Err((
                at,
                format!(
                    "must list at least one glob pattern (* and ?), like [\"{}\"]; leave {name} out to refuse every per-cluster value",
                    example_pattern(name)
                ),
            ));
        }
        for (i, pattern) in patterns.iter().enumerate() {
            if pattern.is_empty() || pattern.chars().any(char::is_control) {
                return Err((
                    format!("{at}[{i}]"),
                    "a pattern is a non-empty line of text (no control characters)".into(),
                ));
            }
        }
    }
    Ok(())
}

fn example_pattern(key: &str) -> &'static str {
    match key {
        "roleArn" => "arn:aws:iam::111122223333:role/kueue-*",
        "tenantId" => "11111111-2222-3333-4444-555555555555",
        "serverId" => "6dae42f8-4368-4678-94ff-3960e28e3630",
        _ => "team-*",
    }
}

/// Whole-value glob match: `*` matches any run of characters (including none), `?` exactly
/// one; everything else matches itself. No escapes, no classes: allowed values are ARNs,
/// GUIDs and names, none of which needs more. Linear backtracking on the last `*`, so a
/// hostile value costs at most `pattern × value` steps.
pub fn glob_match(pattern: &str, value: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    let (mut pi, mut vi) = (0, 0);
    // Where the last `*` was and how much of the value it has swallowed so far.
    let mut star: Option<(usize, usize)> = None;
    while vi < v.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, vi));
                pi += 1;
            }
            Some(&c) if c == '?' || c == v[vi] => {
                pi += 1;
                vi += 1;
            }
            _ => match star {
                Some((sp, sv)) => {
                    star = Some((sp, sv + 1));
                    pi = sp + 1;
                    vi = sv + 1;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests;
