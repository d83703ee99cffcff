//! The `azure` section of a provider entry (`type: azure`): its fields, their checks, and the
//! value checks the provider applies to the same keys when a cluster sets them. Compiled in
//! every build (serde only), so a build without the `azure` feature still explains it.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::values::SelectorKey;

/// The per-cluster keys that select who the broker is (see `providers::overrides`): the
/// tenant picks the directory the identity signs into; the server id picks the
/// token's audience, and since the same ClusterProfile writer also picks the server the token
/// is sent to, an audience of their choosing hands them a token for any Entra application the
/// broker's identity can reach.
pub const OVERRIDE_KEYS: &[SelectorKey] = &[
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

/// The per-cluster keys that only describe or locate the cluster: always allowed.
pub const LOCATING_KEYS: &[&str] = &["clusterName"];

/// The AKS AAD server application: the audience every AKS cluster with AKS-managed Entra ID
/// integration accepts (AKS documentation; kubelogin's default `--server-id`).
pub const AKS_SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";

/// `type: azure`: Entra ID (AAD) tokens for AKS clusters with Entra ID integration. Every
/// key is optional: with none, `credential: auto` on the pod's environment and the AKS AAD
/// server application as the audience. `serverId` and `tenantId` are defaults a cluster's
/// exec extension may override.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Application id of the cluster's API server; the token's scope is `<serverId>/.default`.
    /// Default: the AKS AAD server application shared by every AKS-managed Entra ID cluster.
    pub server_id: Option<String>,
    /// Tenant the token is issued in; default `AZURE_TENANT_ID`.
    pub tenant_id: Option<String>,
    /// Where the identity comes from; default `auto`.
    pub credential: Option<AzureCredential>,
    /// Application (client) id of the workload identity or service principal, or the client
    /// id of a user-assigned managed identity; default `AZURE_CLIENT_ID`.
    pub client_id: Option<String>,
    /// Azure resource id of a user-assigned managed identity (instead of `clientId`).
    pub managed_identity_resource_id: Option<String>,
    /// Entra ID host for sovereign and private clouds, e.g. `https://login.microsoftonline.us`;
    /// default `AZURE_AUTHORITY_HOST`, else the public cloud.
    pub authority_host: Option<String>,
    /// Projected service account token for workload identity; default `AZURE_FEDERATED_TOKEN_FILE`.
    pub federated_token_file: Option<PathBuf>,
    /// PEM file with the service principal's certificate and unencrypted RSA key; default
    /// `AZURE_CLIENT_CERTIFICATE_PATH`.
    pub client_certificate_path: Option<PathBuf>,
}

/// Which Azure credential a provider uses.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum AzureCredential {
    /// Workload identity when its environment is there, else managed identity when the host
    /// has one, else a service principal from the environment (DefaultAzureCredential's
    /// non-interactive sources, in the order that suits a pod).
    #[default]
    Auto,
    WorkloadIdentity,
    ManagedIdentity,
    ClientSecret,
    ClientCertificate,
    AzureCli,
}

impl AzureCredential {
    /// The name used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::WorkloadIdentity => "workloadIdentity",
            Self::ManagedIdentity => "managedIdentity",
            Self::ClientSecret => "clientSecret",
            Self::ClientCertificate => "clientCertificate",
            Self::AzureCli => "azureCli",
        }
    }
}

impl fmt::Display for AzureCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Config {
    /// What the provider uses for a selector key when the cluster does not say: a cluster
    /// repeating it is not an override.
    pub fn provider_value(&self, key: &str) -> Option<&str> {
        match key {
            "tenantId" => self.tenant_id.as_deref(),
            "serverId" => Some(self.server_id.as_deref().unwrap_or(AKS_SERVER_ID)),
            _ => None,
        }
    }

    /// Checks the fields; the returned path is relative to the `azure` section.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        use AzureCredential as C;
        let credential = self.credential.unwrap_or_default();
        let checks = [
            (
                "serverId",
                self.server_id.as_deref(),
                Self::check_server_id as fn(&str) -> _,
            ),
            ("tenantId", self.tenant_id.as_deref(), Self::check_tenant_id),
            ("clientId", self.client_id.as_deref(), Self::check_client_id),
            (
                "authorityHost",
                self.authority_host.as_deref(),
                Self::check_authority_host,
            ),
        ];
        for (field, value, check) in checks {
            if let Some(value) = value {
                check(value).map_err(|m| (field.to_owned(), m))?;
            }
        }
        if let Some(id) = &self.managed_identity_resource_id {
            let ok = id.len() > "/subscriptions/".len()
                && id[.."/subscriptions/".len()].eq_ignore_ascii_case("/subscriptions/")
                && !id.chars().any(char::is_whitespace);
            if !ok {
                return Err((
                    "managedIdentityResourceId".into(),
                    format!(
                        "{id:?} is not an Azure resource id like /subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.ManagedIdentity/userAssignedIdentities/<name>"
                    ),
                ));
            }
            if !matches!(credential, C::Auto | C::ManagedIdentity) {
                return Err((
                    "managedIdentityResourceId".into(),
                    format!(
                        "only applies to credential managedIdentity (or auto), not {credential}"
                    ),
                ));
            }
            if self.client_id.is_some() {
                return Err((
                    "managedIdentityResourceId".into(),
                    "name a user-assigned identity by clientId or by managedIdentityResourceId, not both".into(),
                ));
            }
        }
        let files = [
            (
                "federatedTokenFile",
                &self.federated_token_file,
                C::WorkloadIdentity,
            ),
            (
                "clientCertificatePath",
                &self.client_certificate_path,
                C::ClientCertificate,
            ),
        ];
        for (field, path, owner) in files {
            let Some(path) = path else { continue };
            if !path.is_absolute() {
                return Err((
                    field.into(),
                    format!("must be an absolute path, got {path:?}"),
                ));
            }
            if credential != owner && credential != C::Auto {
                return Err((
                    field.into(),
                    format!("only applies to credential {owner} (or auto), not {credential}"),
                ));
            }
        }
        // A managed identity gets tokens from its own tenant only: a tenant here would be
        // silently ignored and the API server would refuse the token.
        if credential == C::ManagedIdentity && self.tenant_id.is_some() {
            return Err((
                "tenantId".into(),
                "a managed identity always gets tokens from its own tenant; remove tenantId or use workloadIdentity, clientSecret or clientCertificate".into(),
            ));
        }
        if credential == C::AzureCli && self.client_id.is_some() {
            return Err((
                "clientId".into(),
                "credential azureCli uses the account `az login` signed in; remove clientId".into(),
            ));
        }
        Ok(())
    }

    /// An application id (or app id URI) whose `/.default` scope the token is for.
    pub fn check_server_id(id: &str) -> Result<(), String> {
        if id.ends_with("/.default") {
            return Err(format!(
                "{id:?} is a scope; give the application id alone (the broker adds /.default)"
            ));
        }
        // azure_identity's scope rule: letters, digits and `.-_:/`.
        let ok = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '/'));
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{id:?} is not an application id like 6dae42f8-4368-4678-94ff-3960e28e3630"
            ))
        }
    }

    /// A tenant id (GUID) or domain; it becomes part of the token endpoint's path.
    pub fn check_tenant_id(id: &str) -> Result<(), String> {
        let ok = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{id:?} is not a tenant id (a GUID) or a tenant domain like contoso.onmicrosoft.com"
            ))
        }
    }

    /// An application (client) id; goes into request bodies and query strings.
    pub fn check_client_id(id: &str) -> Result<(), String> {
        let ok = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{id:?} is not a client id like 00000000-0000-0000-0000-000000000000"
            ))
        }
    }

    /// `https://host[:port]` and nothing else: Entra ID's token path is appended to it.
    pub fn check_authority_host(url: &str) -> Result<(), String> {
        let host = url
            .strip_prefix("https://")
            .map(|r| r.trim_end_matches('/'));
        if host.is_some_and(|h| !h.is_empty() && !h.contains(['/', '?', '#', ' ', '@'])) {
            Ok(())
        } else {
            Err(format!(
                "{url:?} is not an https authority host like https://login.microsoftonline.com"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{Config as BrokerConfig, ProviderSpec};

    fn azure(section: &str) -> Result<Config, String> {
        let text = format!("providers:\n  - name: aks\n    type: azure\n    azure: {section}\n");
        BrokerConfig::parse(&text, "t.yaml")
            .map(|c| match &c.providers[0].spec {
                ProviderSpec::Azure(azure) => azure.clone(),
                other => panic!("{other:?}"),
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn azure_fields_parse() {
        let a = azure(
            "{serverId: 6dae42f8-4368-4678-94ff-3960e28e3630, tenantId: contoso.onmicrosoft.com, \
             credential: workloadIdentity, clientId: 11111111-2222-3333-4444-555555555555, \
             authorityHost: \"https://login.microsoftonline.us/\", federatedTokenFile: /var/run/t}",
        )
        .unwrap();
        assert_eq!(a.credential, Some(AzureCredential::WorkloadIdentity));
        assert_eq!(a.tenant_id.as_deref(), Some("contoso.onmicrosoft.com"));
        assert_eq!(a.federated_token_file.unwrap(), Path::new("/var/run/t"));
        for (name, want) in [
            ("auto", AzureCredential::Auto),
            ("managedIdentity", AzureCredential::ManagedIdentity),
            ("clientSecret", AzureCredential::ClientSecret),
            ("clientCertificate", AzureCredential::ClientCertificate),
            ("azureCli", AzureCredential::AzureCli),
        ] {
            assert_eq!(
                azure(&format!("{{credential: {name}}}"))
                    .unwrap()
                    .credential,
                Some(want)
            );
            assert_eq!(want.as_str(), name);
        }
        let mi = azure("{credential: managedIdentity, managedIdentityResourceId: /subscriptions/s/resourceGroups/g/providers/Microsoft.ManagedIdentity/userAssignedIdentities/kueue}").unwrap();
        assert!(mi.managed_identity_resource_id.is_some());
        // No section at all is fine: auto, the AKS server application.
        BrokerConfig::parse("providers:\n  - {name: aks, type: azure}\n", "t").unwrap();
    }

    #[test]
    fn azure_fields_are_validated() {
        let cases = [
            (
                "{credential: kubelogin}",
                "providers[0].azure.credential: unknown variant `kubelogin`",
            ),
            (
                "{serverId: \"x/.default\"}",
                "providers[0].azure.serverId: \"x/.default\" is a scope",
            ),
            ("{serverId: \"a b\"}", "providers[0].azure.serverId"),
            ("{tenantId: \"t/../x\"}", "providers[0].azure.tenantId"),
            ("{clientId: \"a&b=c\"}", "providers[0].azure.clientId"),
            (
                "{authorityHost: \"http://login.example\"}",
                "providers[0].azure.authorityHost",
            ),
            (
                "{authorityHost: \"https://login.example/tenant\"}",
                "providers[0].azure.authorityHost",
            ),
            (
                "{federatedTokenFile: token}",
                "providers[0].azure.federatedTokenFile: must be an absolute path",
            ),
            (
                "{credential: clientSecret, federatedTokenFile: /t}",
                "providers[0].azure.federatedTokenFile: only applies to credential workloadIdentity",
            ),
            (
                "{credential: workloadIdentity, clientCertificatePath: /c.pem}",
                "providers[0].azure.clientCertificatePath: only applies to credential clientCertificate",
            ),
            (
                "{managedIdentityResourceId: kueue}",
                "providers[0].azure.managedIdentityResourceId",
            ),
            (
                "{clientId: a, managedIdentityResourceId: /subscriptions/s/x}",
                "not both",
            ),
            (
                "{credential: clientSecret, managedIdentityResourceId: /subscriptions/s/x}",
                "only applies to credential managedIdentity",
            ),
            (
                "{credential: managedIdentity, tenantId: t}",
                "providers[0].azure.tenantId: a managed identity always gets tokens from its own tenant",
            ),
            (
                "{credential: azureCli, clientId: c}",
                "providers[0].azure.clientId",
            ),
            ("{scope: x}", "providers[0].azure.scope"),
        ];
        for (section, want) in cases {
            let e = azure(section).unwrap_err();
            assert!(e.contains(want), "{section}: got {e:?}, want {want:?}");
        }
    }
}
