//! The `file` section of a provider entry (`type: file`): the token file's path template
//! and the lifetime of a token that carries none, their defaults and checks.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::config::values::ConfigDuration;

/// The per-cluster keys that only describe or locate the cluster: always allowed.
pub const LOCATING_KEYS: &[&str] = &["clusterName"];

/// A file token that is not a JWT carries no expiry; it is re-read after this long (and
/// earlier whenever the file changes).
pub const DEFAULT_FILE_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// A token kept in a file, e.g. a projected ServiceAccount token per cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// May contain `{clusterName}`, taken from the cluster's exec extension.
    pub path: String,
    #[serde(default = "default_file_lifetime")]
    pub lifetime: ConfigDuration,
}

fn default_file_lifetime() -> ConfigDuration {
    ConfigDuration(DEFAULT_FILE_LIFETIME)
}

impl Config {
    /// Checks the fields; the returned path is relative to the `file` section.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if !Path::new(&self.path).is_absolute() {
            return Err((
                "path".into(),
                format!("must be an absolute path, got {:?}", self.path),
            ));
        }
        let mut rest = self.path.as_str();
        while let Some(start) = rest.find('{') {
            let Some(len) = rest[start..].find('}') else {
                return Err(("path".into(), format!("unclosed '{{' in {:?}", self.path)));
            };
            let name = &rest[start + 1..start + len];
            if name != "clusterName" {
                return Err((
                    "path".into(),
                    format!(
                        "unknown placeholder {{{name}}} in {:?}; only {{clusterName}} is supported",
                        self.path
                    ),
                ));
            }
            rest = &rest[start + len + 1..];
        }
        if self.lifetime.0 < Duration::from_secs(1) {
            return Err(("lifetime".into(), "must be at least 1s".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config as BrokerConfig;

    #[test]
    fn every_field_is_validated() {
        let cases = [
            (
                "providers:\n  - {name: a, type: file, file: {path: \"/x/{cluster}\"}}\n",
                "providers[0].file.path: unknown placeholder {cluster}",
            ),
            (
                "providers:\n  - {name: a, type: file, file: {path: x}}\n",
                "providers[0].file.path: must be an absolute",
            ),
        ];
        for (text, want) in cases {
            let e = BrokerConfig::parse(text, "test.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }
}
