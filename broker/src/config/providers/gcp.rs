//! The `gcp` section of a provider entry (`type: gcp`): its fields and their checks. Compiled
//! in every build (serde only), so a build without the `gcp` feature still explains it.

use std::path::PathBuf;

use serde::Deserialize;

/// The per-cluster keys that only describe or locate the cluster: always allowed.
pub const LOCATING_KEYS: &[&str] = &["clusterName"];

/// `type: gcp`. Every field is optional: with none, Application Default Credentials and the
/// scopes `gke-gcloud-auth-plugin` asks for.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// OAuth2 scopes of the token; default cloud-platform and userinfo.email.
    pub scopes: Option<Vec<String>>,
    /// Service account whose token is handed out, bought with the ADC identity's token
    /// (IAM Credentials `generateAccessToken`).
    pub impersonate_service_account: Option<String>,
    /// Impersonation chain between the ADC identity and `impersonateServiceAccount`.
    pub delegates: Option<Vec<String>>,
    /// A credentials JSON file (service-account key, external_account, ...) used instead of
    /// the ADC search; e.g. a mounted Secret.
    pub credentials_file: Option<PathBuf>,
    /// Base URL of IAM Credentials for `impersonateServiceAccount` (Private Service Connect,
    /// sovereign clouds); default `https://iamcredentials.googleapis.com`.
    pub iam_credentials_endpoint: Option<String>,
}

impl Config {
    /// Checks the fields; the returned path is relative to the `gcp` section.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if let Some(scopes) = &self.scopes {
            if scopes.is_empty() {
                return Err((
                    "scopes".into(),
                    "must list at least one scope, or be left out for the defaults".into(),
                ));
            }
            for (i, scope) in scopes.iter().enumerate() {
                if scope.is_empty() || scope.chars().any(char::is_whitespace) {
                    return Err((
                        format!("scopes[{i}]"),
                        format!(
                            "{scope:?} is not a scope: one non-empty word without spaces, like https://www.googleapis.com/auth/cloud-platform"
                        ),
                    ));
                }
            }
        }
        let is_sa_email = |s: &str| {
            let parts: Vec<&str> = s.split('@').collect();
            parts.len() == 2
                && !parts[0].is_empty()
                && parts[1].contains('.')
                && !s.contains(['/', ':', ' '])
        };
        if let Some(target) = &self.impersonate_service_account
            && !is_sa_email(target)
        {
            return Err((
                "impersonateServiceAccount".into(),
                format!(
                    "{target:?} is not a service account email like kueue@my-project.iam.gserviceaccount.com"
                ),
            ));
        }
        if let Some(delegates) = &self.delegates {
            if self.impersonate_service_account.is_none() {
                return Err((
                    "delegates".into(),
                    "delegates only apply with impersonateServiceAccount".into(),
                ));
            }
            for (i, d) in delegates.iter().enumerate() {
                let email = d.strip_prefix("projects/-/serviceAccounts/").unwrap_or(d);
                if !is_sa_email(email) {
                    return Err((
                        format!("delegates[{i}]"),
                        format!("{d:?} is not a service account email"),
                    ));
                }
            }
        }
        if let Some(path) = &self.credentials_file
            && !path.is_absolute()
        {
            return Err((
                "credentialsFile".into(),
                format!("must be an absolute path, got {path:?}"),
            ));
        }
        if let Some(url) = &self.iam_credentials_endpoint {
            let rest = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains(['?', '#', ' '])) {
                return Err((
                    "iamCredentialsEndpoint".into(),
                    format!("{url:?} is not a base URL like https://iamcredentials.googleapis.com"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config as BrokerConfig, ProviderSpec};

    fn gcp(section: &str) -> Result<BrokerConfig, String> {
        let text = format!("providers:\n  - name: gke\n    type: gcp\n    gcp: {section}\n");
        BrokerConfig::parse(&text, "t.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn gcp_fields_parse() {
        let config = gcp(
            "{scopes: [a, b], impersonateServiceAccount: kueue@p.iam.gserviceaccount.com, \
             delegates: [d@p.iam.gserviceaccount.com], credentialsFile: /var/run/gcp/key.json, \
             iamCredentialsEndpoint: \"http://127.0.0.1:8080\"}",
        )
        .unwrap();
        let ProviderSpec::Gcp(g) = config.providers[0].spec.clone() else {
            panic!("{:?}", config.providers[0]);
        };
        assert_eq!(g.scopes.unwrap(), ["a", "b"]);
        assert_eq!(
            g.credentials_file.unwrap(),
            Path::new("/var/run/gcp/key.json")
        );
        assert_eq!(g.iam_credentials_endpoint.unwrap(), "http://127.0.0.1:8080");
        // No section at all is fine: ADC with the default scopes.
        BrokerConfig::parse("providers:\n  - {name: gke, type: gcp}\n", "t").unwrap();
    }

    #[test]
    fn gcp_fields_are_validated() {
        let cases = [
            ("{scopes: []}", "providers[0].gcp.scopes: must list"),
            ("{scopes: [\"a b\"]}", "providers[0].gcp.scopes[0]"),
            (
                "{impersonateServiceAccount: kueue}",
                "providers[0].gcp.impersonateServiceAccount",
            ),
            (
                "{delegates: [d@p.iam.gserviceaccount.com]}",
                "providers[0].gcp.delegates: delegates only apply",
            ),
            (
                "{impersonateServiceAccount: a@p.iam.gserviceaccount.com, delegates: [nope]}",
                "providers[0].gcp.delegates[0]",
            ),
            (
                "{credentialsFile: key.json}",
                "providers[0].gcp.credentialsFile: must be an absolute path",
            ),
            (
                "{iamCredentialsEndpoint: iam.example}",
                "providers[0].gcp.iamCredentialsEndpoint",
            ),
            ("{scope: [a]}", "providers[0].gcp.scope"),
        ];
        for (section, want) in cases {
            let e = gcp(section).unwrap_err();
            assert!(e.contains(want), "{section}: got {e:?}, want {want:?}");
        }
        // Delegates may be written as resource names too.
        gcp("{impersonateServiceAccount: a@p.iam.gserviceaccount.com, delegates: [\"projects/-/serviceAccounts/d@p.iam.gserviceaccount.com\"]}").unwrap();
    }
}
