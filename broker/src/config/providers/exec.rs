//! The `exec` section of a provider entry (`type: exec`): the wrapped plugin, its
//! environment and timeouts, their defaults and checks. Compiled in every build.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::values::{ConfigDuration, UPSTREAM_TIMEOUT};

/// None: a wrapped plugin gets the cluster config as client-go would give it, and what the
/// plugin makes of it is the plugin's policy, as it is without the broker. So no key is an
/// override either: every key passes.
pub const LOCATING_KEYS: &[&str] = &[];

/// client-go's own default wait for an exec plugin is none; 30 s matches the shim's default
/// `--timeout`, so a wrapped plugin never outlives the caller waiting for it.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// A wrapped plugin that prints no `expirationTimestamp` is run again after this long: the
/// lifetime of an EKS token, the shortest of the common cloud tokens.
pub const DEFAULT_EXEC_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// The ExecCredential version most plugins speak; older ones speak only v1beta1.
pub const DEFAULT_EXEC_API_VERSION: &str = credbroker_execcred::ApiVersion::DEFAULT.as_str();
/// What a wrapped plugin gets from the broker's environment unless `exec.passEnv` adds more
/// (or `exec.inheritEnv: true` passes everything): enough to run helpers (PATH, HOME, locale,
/// temp dir), to reach upstreams the way the broker does (proxies, extra CAs) and to find the
/// API server it runs in (what in-cluster config reads). Cloud credentials (AWS_*, AZURE_*,
/// GOOGLE_*) are not on it: a wrapped plugin is third-party code, and the broker's
/// environment can hold the secrets of its other providers.
pub const DEFAULT_EXEC_PASS_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
];
/// The ExecCredential versions client-go speaks (and the only ones a wrapped plugin may be
/// asked for).
pub use credbroker_execcred::{API_V1 as EXEC_API_V1, API_V1BETA1 as EXEC_API_V1BETA1};

/// Wraps an existing kubeconfig exec plugin, adding the cache and single-flight.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    pub command: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_exec_timeout")]
    pub timeout: ConfigDuration,
    #[serde(default = "default_exec_api_version")]
    pub api_version: String,
    #[serde(default = "default_exec_lifetime")]
    pub default_lifetime: ConfigDuration,
    /// Names (or `PREFIX*`) of the broker's environment variables passed to the plugin on top
    /// of [`DEFAULT_EXEC_PASS_ENV`].
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Pass the broker's whole environment (what credbroker did before `passEnv`).
    #[serde(default)]
    pub inherit_env: bool,
}

fn default_exec_timeout() -> ConfigDuration {
    ConfigDuration(DEFAULT_EXEC_TIMEOUT)
}
fn default_exec_api_version() -> String {
    DEFAULT_EXEC_API_VERSION.to_owned()
}
fn default_exec_lifetime() -> ConfigDuration {
    ConfigDuration(DEFAULT_EXEC_LIFETIME)
}

impl Config {
    /// Checks the fields; the returned path is relative to the `exec` section.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if !self.command.is_absolute() {
            return Err((
                "command".into(),
                format!(
                    "must be an absolute path (the broker does not search PATH), got {:?}",
                    self.command
                ),
            ));
        }
        if self.timeout.0.is_zero() {
            return Err(("timeout".into(), "must be longer than 0s".into()));
        }
        // One rule instead of two timers racing: the cache stops waiting at its upstream
        // timeout (and the plugin's process group is killed then), so a longer plugin timeout
        // could never be reached.
        let cap = UPSTREAM_TIMEOUT;
        if self.timeout.0 > cap {
            return Err((
                "timeout".into(),
                format!(
                    "{} is longer than the cache waits for any upstream call ({}), which would stop the plugin first; use at most {}",
                    humantime::format_duration(self.timeout.0),
                    humantime::format_duration(cap),
                    humantime::format_duration(cap),
                ),
            ));
        }
        if self.default_lifetime.0 < Duration::from_secs(1) {
            return Err(("defaultLifetime".into(), "must be at least 1s".into()));
        }
        if self.api_version != EXEC_API_V1 && self.api_version != EXEC_API_V1BETA1 {
            return Err((
                "apiVersion".into(),
                format!(
                    "unsupported {:?}; use {EXEC_API_V1} or {EXEC_API_V1BETA1}",
                    self.api_version
                ),
            ));
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err((
                    format!("env.{key}"),
                    "not a valid environment variable name".into(),
                ));
            }
        }
        for (i, name) in self.pass_env.iter().enumerate() {
            let bare = name.strip_suffix('*').unwrap_or(name);
            if bare.is_empty() || bare.contains(['=', '\0', '*']) {
                return Err((
                    format!("passEnv[{i}]"),
                    format!(
                        "\"{}\" is not a variable name or a NAME_PREFIX* pattern",
                        crate::base::text::quote(name)
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config as BrokerConfig, ProviderSpec};

    fn err(text: &str) -> String {
        BrokerConfig::parse(text, "test.yaml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults_apply() {
        let text =
            "providers:\n  - name: onprem\n    type: exec\n    exec: {command: /bin/plugin}\n";
        let config = BrokerConfig::parse(text, "t").unwrap();
        let ProviderSpec::Exec(exec) = &config.providers[0].spec else {
            panic!("{:?}", config.providers[0]);
        };
        assert_eq!(exec.timeout.0, DEFAULT_EXEC_TIMEOUT);
        assert_eq!(exec.api_version, EXEC_API_V1);
    }

    #[test]
    fn every_field_is_validated() {
        let cases = [
            (
                "providers:\n  - {name: a, type: exec, exec: {command: plugin}}\n",
                "providers[0].exec.command: must be an absolute path",
            ),
            (
                "providers:\n  - {name: a, type: exec, exec: {command: /p, timeout: 5 parsecs}}\n",
                "providers[0].exec.timeout: invalid duration",
            ),
            (
                "providers:\n  - {name: a, type: exec, exec: {command: /p, passEnv: [A, \"*\"]}}\n",
                "providers[0].exec.passEnv[1]: \"*\" is not a variable name",
            ),
            (
                "providers:\n  - {name: a, type: exec, exec: {command: /p, passEnv: [\"A*B\"]}}\n",
                "providers[0].exec.passEnv[0]",
            ),
            (
                "providers:\n  - {name: a, type: exec, exec: {command: /p, timeout: 90s}}\n",
                "providers[0].exec.timeout: 1m 30s is longer than the cache waits for any upstream call (1m)",
            ),
            (
                "providers:\n  - {name: a, type: exec, exec: {command: /p, apiVersion: v2}}\n",
                "providers[0].exec.apiVersion: unsupported",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }
}
