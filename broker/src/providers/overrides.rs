//! Per-cluster keys that choose *who* the broker authenticates as or *which* secret it reads.
//!
//! A cluster's exec extension (`spec.cluster.config`) is written by whoever can write the
//! ClusterProfile's status, not by whoever configured the broker. Keys that only describe or
//! locate the target cluster (`clusterName`, `clusterId`, `region`, the server) are that
//! writer's to set. Keys that pick the identity (an AWS role, an Entra tenant or audience) or
//! the secret (a Secret's data key, context or name placeholder) would let that writer spend
//! the broker's credentials on anything they reach: a confused deputy. So each provider type
//! declares those keys in its config module (`OVERRIDE_KEYS` of `providers::aws::config`,
//! `providers::azure::config`, `providers::kubernetes_secret::config`, plus kubernetesSecret's
//! name placeholders; gathered by [`ProviderSpec::selector_keys`], and `allowOverrides` is
//! checked against them when the config is loaded), and one check ([`check`]) runs on every
//! request before the provider sees it: a selector key is refused unless its value is the
//! provider's own or matches a glob of the provider entry's `allowOverrides`. The cache key,
//! the fetch and any future provider get the rule without doing anything.
//!
//! This module works from the config alone (not the built provider), so the rule is the same
//! for every type, compiled in or not.

use crate::base::text::quote;
pub use crate::config::values::{Selector, SelectorKey};
use crate::config::{ProviderConfig, ProviderSpec};
use crate::request::TokenRequest;

/// The selector keys of one provider entry ([`ProviderSpec::selector_keys`]).
pub fn selector_keys(config: &ProviderConfig) -> Vec<Selector> {
    config.spec.selector_keys()
}

/// What the provider uses for `key` when the cluster does not say (each type's config
/// module knows its own): a cluster repeating it is not an override.
fn provider_value<'a>(config: &'a ProviderConfig, key: &str) -> Option<&'a str> {
    match &config.spec {
        ProviderSpec::Aws(aws) => aws.provider_value(key),
        ProviderSpec::Azure(azure) => azure.provider_value(key),
        ProviderSpec::KubernetesSecret(section) => section.provider_value(key),
        ProviderSpec::Gcp(_) | ProviderSpec::Exec(_) | ProviderSpec::File(_) => None,
    }
}

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

/// Whole-value glob match: `*` matches any run of characters other than `/` (including
/// none), `?` exactly one character other than `/`; everything else matches itself. No
/// escapes, no classes: allowed values are ARNs, GUIDs and names, none of which needs more.
/// `/` is matched only by itself, as in shell globs over paths, so `role/kueue-*` cannot let
/// `role/kueue-x/../../admin` through (an IAM path role needs `role/*/kueue-*`); and a value
/// with a control character (a newline that would end a header or a log line) matches no
/// pattern at all. Linear backtracking on the last `*`, so a hostile value costs at most
/// `pattern × value` steps.
pub fn glob_match(pattern: &str, value: &str) -> bool {
    if value.chars().any(char::is_control) {
        return false;
    }
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
            Some(&c) if c == v[vi] || (c == '?' && v[vi] != '/') => {
                pi += 1;
                vi += 1;
            }
            _ => match star {
                // The `*` swallows one more character, unless that is a `/`.
                Some((sp, sv)) if v[sv] != '/' => {
                    star = Some((sp, sv + 1));
                    pi = sp + 1;
                    vi = sv + 1;
                }
                _ => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests;
