//! The `kubernetesSecret` section of a provider entry (`type: kubernetesSecret`): the
//! namespace watched, the Secret name template, the data key and format, their defaults and
//! checks. Compiled in every build (serde only), so a build without the
//! `kubernetes-secret` feature still explains it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

mod label_selector;

use crate::config::values::{
    ConfigDuration, Selector, SelectorKey, TemplatePart, is_dns_label, is_placeholder_name,
    is_secret_key, template_parts,
};

/// A Secret token that is not a JWT carries no expiry; client-go is told to come back after
/// half of this (the cache's refresh rule). A rotated Secret is served at once through the
/// watch whatever this says, so it only bounds how long a caller keeps a token unasked.
pub const DEFAULT_SECRET_LIFETIME: Duration = Duration::from_secs(60 * 60);
/// cluster-inventory-api's secretreader plugin (KEP-5339) reads this key, and OCM's
/// managed-serviceaccount token Secrets hold the token under it too.
pub const DEFAULT_SECRET_KEY: &str = "token";
/// secretreader's layout: one Secret per cluster, named after the ClusterProfile.
pub const DEFAULT_SECRET_NAME_TEMPLATE: &str = "{clusterName}";

/// The per-cluster keys that select which part of which Secret is served (see
/// `providers::overrides`). Name placeholders other than `clusterName` (see
/// [`Config::selector_keys`]) pick the Secret itself.
pub const OVERRIDE_KEYS: &[SelectorKey] = &[
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

/// The per-cluster keys that only describe or locate the cluster: always allowed. The
/// provider watches one namespace and refuses any other, so `namespace` cannot select a
/// Secret outside it.
pub const LOCATING_KEYS: &[&str] = &["clusterName", "namespace"];

/// The label selector the docs and error messages suggest: a label of credbroker's own, set on
/// the Secrets that hold worker credentials.
pub const EXAMPLE_LABEL_SELECTOR: &str = "credbroker.dev/credential=true";

/// Credentials kept in Secrets of one namespace of the cluster the broker runs in (or the
/// one a development kubeconfig points at), one Secret per worker cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The one namespace watched: RBAC grants get/list/watch on Secrets there and nowhere else.
    pub namespace: String,
    /// The Secret's name; each `{key}` is filled from the cluster's exec config key of that
    /// name, else from `templateDefaults`.
    #[serde(default = "default_secret_name_template")]
    pub name_template: String,
    /// Values for placeholders the cluster's exec config does not carry, e.g. OCM's
    /// ManagedServiceAccount name, which is the same for every cluster.
    #[serde(default)]
    pub template_defaults: BTreeMap<String, String>,
    /// The Secret's data key holding the token or kubeconfig; a cluster's exec config key
    /// `key` overrides it.
    #[serde(default = "default_secret_key")]
    pub key: String,
    #[serde(default)]
    pub format: SecretFormat,
    /// For `format: kubeconfig`: the context whose user is taken (default: the kubeconfig's
    /// current-context); a cluster's exec config key `context` overrides it.
    #[serde(default)]
    pub context: Option<String>,
    /// Only Secrets matching this label selector are listed, watched, held and served.
    /// Required (checked by [`Config::validate`], so the error names the key): without it
    /// the broker would hold every Secret of the namespace in memory, Kueue's webhook key
    /// among them when the namespace is `kueue-system`.
    #[serde(default)]
    pub label_selector: Option<String>,
    /// A kubeconfig file for reaching the API server during development; unset means the
    /// in-cluster ServiceAccount.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// Expiry of a token that is not a JWT with an `exp` claim.
    #[serde(default = "default_secret_lifetime")]
    pub lifetime: ConfigDuration,
}

/// What the Secret's key holds.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum SecretFormat {
    /// A bearer token (secretreader, OCM managed-serviceaccount).
    #[default]
    Token,
    /// A kubeconfig whose selected user has a token or a client certificate and key
    /// (cluster-inventory-api's kubeconfig-secretreader).
    Kubeconfig,
}

fn default_secret_name_template() -> String {
    DEFAULT_SECRET_NAME_TEMPLATE.to_owned()
}
fn default_secret_key() -> String {
    DEFAULT_SECRET_KEY.to_owned()
}
fn default_secret_lifetime() -> ConfigDuration {
    ConfigDuration(DEFAULT_SECRET_LIFETIME)
}

impl Config {
    /// What the provider uses for a selector key when the cluster does not say: a cluster
    /// repeating it is not an override.
    pub fn provider_value(&self, key: &str) -> Option<&str> {
        match key {
            "key" => Some(&self.key),
            "context" => self.context.as_deref(),
            placeholder => self.template_defaults.get(placeholder).map(String::as_str),
        }
    }

    /// The selector keys of this entry: [`OVERRIDE_KEYS`] (`context` only with
    /// `format: kubeconfig`, the only format that reads it) and the name placeholders other
    /// than `clusterName`.
    pub fn selector_keys(&self) -> Vec<Selector> {
        let mut keys: Vec<Selector> = OVERRIDE_KEYS.iter().map(Selector::from).collect();
        if self.format != SecretFormat::Kubeconfig {
            keys.retain(|k| k.name != "context");
        }
        for part in template_parts(&self.name_template).unwrap_or_default() {
            if let TemplatePart::Placeholder(name) = part
                && name != "clusterName"
                && !keys.iter().any(|k| k.name == name)
            {
                keys.push(Selector {
                    name: name.into(),
                    selects: PLACEHOLDER_SELECTS,
                    secret: false,
                });
            }
        }
        keys
    }

    /// Checks the fields; the returned path is relative to the `kubernetesSecret` section.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if !is_dns_label(&self.namespace) {
            return Err((
                "namespace".into(),
                format!(
                    "{:?} is not a namespace name (lowercase letters, digits and '-', at most 63)",
                    self.namespace
                ),
            ));
        }
        let parts = template_parts(&self.name_template).map_err(|m| ("nameTemplate".into(), m))?;
        for part in &parts {
            if let TemplatePart::Literal(text) = part
                && !text
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
            {
                return Err((
                    "nameTemplate".into(),
                    format!(
                        "{:?} has {text:?} outside placeholders: a Secret name has only lowercase letters, digits, '-' and '.'",
                        self.name_template
                    ),
                ));
            }
        }
        if !parts
            .iter()
            .any(|p| matches!(p, TemplatePart::Placeholder(_)))
        {
            return Err((
                "nameTemplate".into(),
                format!(
                    "{:?} has no placeholder such as {{clusterName}}: every cluster would get the same Secret",
                    self.name_template
                ),
            ));
        }
        for name in self.template_defaults.keys() {
            if !is_placeholder_name(name) {
                return Err((
                    format!("templateDefaults.{name}"),
                    "a placeholder name has only letters, digits and '_'".into(),
                ));
            }
        }
        if !is_secret_key(&self.key) {
            return Err((
                "key".into(),
                format!(
                    "{:?} is not a Secret data key (letters, digits, '-', '_', '.')",
                    self.key
                ),
            ));
        }
        if self.context.is_some() && self.format != SecretFormat::Kubeconfig {
            return Err((
                "context".into(),
                "a context only applies to format: kubeconfig".into(),
            ));
        }
        if self.context.as_deref() == Some("") {
            return Err(("context".into(), "must not be empty".into()));
        }
        match self.label_selector.as_deref().map(str::trim) {
            None => {
                return Err((
                    "labelSelector".into(),
                    format!(
                        "required: the provider lists, watches and holds only the Secrets this \
                         selects, never the rest of namespace {:?} (in kueue-system, Kueue's \
                         own webhook key); label the Secrets that hold worker credentials and \
                         select them, e.g. labelSelector: {EXAMPLE_LABEL_SELECTOR}",
                        self.namespace
                    ),
                ));
            }
            Some("") => {
                return Err((
                    "labelSelector".into(),
                    format!("must not be empty, e.g. {EXAMPLE_LABEL_SELECTOR}"),
                ));
            }
            Some(_) => {
                // As the API server gets it: untrimmed (its lexer decides what is whitespace).
                let selector = self.label_selector.as_deref().unwrap_or_default();
                let requirements = label_selector::parse(selector).map_err(|why| {
                    (
                        "labelSelector".to_owned(),
                        format!(
                            "{selector:?} is not a label selector the API server accepts: {why}"
                        ),
                    )
                })?;
                if label_selector::matches_unlabelled(&requirements) {
                    let read: Vec<String> = requirements.iter().map(ToString::to_string).collect();
                    return Err((
                        "labelSelector".into(),
                        format!(
                            "{selector:?} selects Secrets without a label: Kubernetes reads it \
                             as {:?}, whose every requirement a Secret meets by lacking a label \
                             (!key, key!=value, key notin (...)), so it matches every unlabelled \
                             Secret of the namespace; add one the credential Secrets meet by \
                             carrying a label (key=value, key in (...), or key), e.g. \
                             {EXAMPLE_LABEL_SELECTOR}",
                            read.join(",")
                        ),
                    ));
                }
            }
        }
        if let Some(path) = &self.kubeconfig
            && !path.is_absolute()
        {
            return Err((
                "kubeconfig".into(),
                format!("must be an absolute path, got {path:?}"),
            ));
        }
        if self.lifetime.0 < Duration::from_secs(1) {
            return Err(("lifetime".into(), "must be at least 1s".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config as BrokerConfig, ProviderSpec};

    const HOUR: Duration = Duration::from_secs(3600);

    /// `yaml_section` with the required labelSelector added.
    fn config(yaml_section: &str) -> Config {
        let yaml_section = yaml_section.replacen('{', "{labelSelector: a=b, ", 1);
        let text = format!(
            "providers:\n  - name: s\n    type: kubernetesSecret\n    kubernetesSecret: {yaml_section}\n"
        );
        match BrokerConfig::parse(&text, "t")
            .unwrap()
            .providers
            .remove(0)
            .spec
        {
            ProviderSpec::KubernetesSecret(section) => section,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_selector_must_select_by_a_label_a_secret_carries() {
        for (selector, narrow) in [
            ("app=kueue", true),
            ("app==kueue", true),
            ("credbroker.dev/credential", true),
            ("tier in (a, b)", true),
            ("!app, env=prod", true),
            ("tier notin (a, b), app", true),
            ("!app", false),
            ("env!=prod", false),
            ("tier notin (a,b)", false),
            ("!a, b != c, d notin (x, y)", false),
            ("credbroker notin(x)", false),
            ("credbroker notin(x),app=kueue", true),
            ("x in(a)", true),
        ] {
            let requirements = label_selector::parse(selector).unwrap();
            assert_eq!(
                !label_selector::matches_unlabelled(&requirements),
                narrow,
                "{selector:?}"
            );
        }
        assert!(label_selector::parse(" , ").is_err());
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = config("{namespace: n}");
        assert_eq!(c.name_template, "{clusterName}");
        assert_eq!(c.key, "token");
        assert_eq!(c.format, SecretFormat::Token);
        assert_eq!(c.lifetime, ConfigDuration(HOUR));
        let err = |section: &str| {
            let section = if section.contains("labelSelector") || section == "{}" {
                section.to_owned()
            } else {
                section.replacen('{', "{labelSelector: a=b, ", 1)
            };
            let text = format!(
                "providers:\n  - name: s\n    type: kubernetesSecret\n    kubernetesSecret: {section}\n"
            );
            BrokerConfig::parse(&text, "t").unwrap_err().to_string()
        };
        for (section, want) in [
            ("{}", "kubernetesSecret: missing field `namespace`"),
            (
                "{namespace: Bad_NS}",
                "kubernetesSecret.namespace: \"Bad_NS\" is not a namespace",
            ),
            (
                "{namespace: n, nameTemplate: \"{clusterName\"}",
                "kubernetesSecret.nameTemplate: unclosed",
            ),
            ("{namespace: n, nameTemplate: fixed}", "has no placeholder"),
            (
                "{namespace: n, nameTemplate: \"{clusterName}_x\"}",
                "outside placeholders",
            ),
            (
                "{namespace: n, nameTemplate: \"{cluster-name}\"}",
                "is not a name",
            ),
            ("{namespace: n, key: \"a/b\"}", "kubernetesSecret.key"),
            (
                "{namespace: n, context: x}",
                "only applies to format: kubeconfig",
            ),
            ("{namespace: n, format: yaml}", "unknown variant `yaml`"),
            (
                "{namespace: n, kubeconfig: rel/kc}",
                "kubernetesSecret.kubeconfig: must be an absolute",
            ),
            (
                "{namespace: n, labelSelector: \" \"}",
                "kubernetesSecret.labelSelector: must not be empty",
            ),
            (
                "{namespace: n, labelSelector: \"!app, tier notin (a, b), env!=prod\"}",
                "kubernetesSecret.labelSelector: \"!app, tier notin (a, b), env!=prod\" selects \
                 Secrets without a label: Kubernetes reads it as \"!app,env!=prod,tier notin (a,b)\"",
            ),
            // No space before the parenthesis: still `notin`, as Kubernetes' lexer ends an
            // identifier at '(' (this passed as a selector by presence before).
            (
                "{namespace: n, labelSelector: \"credbroker notin(x)\"}",
                "\"credbroker notin(x)\" selects Secrets without a label: Kubernetes reads it as \
                 \"credbroker notin (x)\"",
            ),
            (
                "{namespace: n, labelSelector: \"a!=b,c notin(d)\"}",
                "reads it as \"a!=b,c notin (d)\"",
            ),
            // Text the API server would refuse at the first list, refused here with its reason.
            (
                "{namespace: n, labelSelector: \"app=kueue tier\"}",
                "kubernetesSecret.labelSelector: \"app=kueue tier\" is not a label selector the \
                 API server accepts: found 'tier', expected: ',' or 'end of string'",
            ),
            (
                "{namespace: n, labelSelector: \"App.io/x=y\"}",
                "is not a label selector the API server accepts: unable to parse requirement: \
                 Invalid value: \"App.io/x\": prefix part",
            ),
            ("{namespace: n, lifetime: 0s}", "kubernetesSecret.lifetime"),
            (
                "{namespace: n, bogus: 1}",
                "kubernetesSecret.bogus: unknown field",
            ),
        ] {
            let e = err(section);
            assert!(e.contains(want), "{section}: got {e:?}, want {want:?}");
        }
        let text = "providers:\n  - {name: s, type: kubernetesSecret, kubernetesSecret: {namespace: kueue-system}}\n";
        let e = BrokerConfig::parse(text, "t").unwrap_err().to_string();
        assert!(
            e.contains(
                "providers[0].kubernetesSecret.labelSelector: required: the provider lists, \
                 watches and holds only the Secrets this selects, never the rest of namespace \
                 \"kueue-system\""
            ),
            "{e}"
        );
        let text = "providers:\n  - {name: s, type: kubernetesSecret}\n";
        let e = BrokerConfig::parse(text, "t").unwrap_err().to_string();
        assert!(
            e.contains("providers[0].kubernetesSecret: type kubernetesSecret needs"),
            "{e}"
        );
    }
}
