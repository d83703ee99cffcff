//! `type: azure`: Entra ID (AAD) access tokens for AKS clusters with Entra ID integration,
//! from workload identity, managed identity, a service principal (secret or certificate) or
//! the Azure CLI, through `azure_identity`.
//!
//! The token's scope is `<serverId>/.default` (by default the AKS AAD server application), in
//! the tenant the cluster names or the provider's. Clusters that share the credential, the
//! tenant and the scope share one token: the cache key is exactly that.
//!
//! The broker's cache is the only token cache. `azure_identity`'s credentials keep their own
//! (refreshing only 5 minutes before expiry, which would defeat the cache's refresh at half
//! the lifetime and hide outages until the last minutes), so a credential object is built
//! for each upstream token request and dropped after it. Building one is cheap: the HTTP
//! client (and its connection pool) is built once and shared. A side effect the design wants:
//! the workload identity's federated token file is read at every upstream request, so a
//! rotated file is used by the next one (`azure_identity` alone would keep a read for up to
//! 10 minutes).
//!
//! Network setup is lazy (first fetch), so `build` stays cheap and infallible.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{Secret as AzureSecret, TokenCredential};
use azure_core::error::ErrorKind;
use azure_core::http::{
    AsyncRawResponse, ClientOptions, HttpClient, Method, Request, RetryOptions, Transport, Url,
};
use azure_identity::{
    AzureCliCredential, AzureCliCredentialOptions, ClientAssertionCredential,
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions,
    Executor, ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId,
    WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use tokio::sync::OnceCell;

use crate::config::values::ProviderKind;

use crate::config::providers::azure::{AzureCredential, Config as AzureConfig};
use crate::request::TokenRequest;

use super::upstream::{self, Route};
use super::{BoxFuture, Credential, Provider, ProviderError, Resolved};

mod aadsts;
mod certificate;
#[cfg(test)]
mod tests;

pub use crate::config::providers::azure::AKS_SERVER_ID;
/// Entra ID in the public cloud (what azure_identity uses without `AZURE_AUTHORITY_HOST`).
pub const PUBLIC_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";
/// The Azure Instance Metadata Service token endpoint (fixed, link-local, on every Azure VM).
pub const IMDS_TOKEN_URL: &str = "http://169.254.169.254/metadata/identity/oauth2/token";
/// How long `auto` waits for IMDS before deciding the host has no managed identity: the
/// Go and .NET SDKs' DefaultAzureCredential use 1 s for the same probe. IMDS answers in
/// milliseconds where it exists.
pub const IMDS_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// One `az account get-access-token` run; the CLI refreshes its own token, which can take a
/// few seconds, and must still finish well within the shim's default 30 s wait.
pub const AZ_CLI_TIMEOUT: Duration = Duration::from_secs(20);

// The environment azure_identity and the other Azure SDKs read.
const AZURE_CLIENT_ID: &str = "AZURE_CLIENT_ID";
const AZURE_TENANT_ID: &str = "AZURE_TENANT_ID";
const AZURE_FEDERATED_TOKEN_FILE: &str = "AZURE_FEDERATED_TOKEN_FILE";
const AZURE_AUTHORITY_HOST: &str = "AZURE_AUTHORITY_HOST";
const AZURE_CLIENT_SECRET: &str = "AZURE_CLIENT_SECRET";
const AZURE_CLIENT_CERTIFICATE_PATH: &str = "AZURE_CLIENT_CERTIFICATE_PATH";
const AZURE_CLIENT_CERTIFICATE_PASSWORD: &str = "AZURE_CLIENT_CERTIFICATE_PASSWORD";
const AZURE_CLIENT_SEND_CERTIFICATE_CHAIN: &str = "AZURE_CLIENT_SEND_CERTIFICATE_CHAIN";
const IDENTITY_ENDPOINT: &str = "IDENTITY_ENDPOINT";
const MSI_ENDPOINT: &str = "MSI_ENDPOINT";
const PATH: &str = "PATH";
const ENV_VARS: &[&str] = &[
    AZURE_CLIENT_ID,
    AZURE_TENANT_ID,
    AZURE_FEDERATED_TOKEN_FILE,
    AZURE_AUTHORITY_HOST,
    AZURE_CLIENT_SECRET,
    AZURE_CLIENT_CERTIFICATE_PATH,
    AZURE_CLIENT_CERTIFICATE_PASSWORD,
    AZURE_CLIENT_SEND_CERTIFICATE_CHAIN,
    IDENTITY_ENDPOINT,
    MSI_ENDPOINT,
    PATH,
];

/// Builds the provider for one config entry.
pub fn build(config: &AzureConfig) -> Arc<dyn Provider> {
    Arc::new(AzureProvider::new(config.clone(), Env::from_process()))
}

/// The process environment the provider reads, captured once (the environment of a running
/// process does not change) so tests can give their own.
#[derive(Clone, Default)]
pub(crate) struct Env {
    vars: BTreeMap<&'static str, String>,
}

impl Env {
    fn from_process() -> Self {
        let vars = ENV_VARS
            .iter()
            .filter_map(|&k| std::env::var(k).ok().map(|v| (k, v)))
            .collect();
        Self { vars }
    }

    /// A set value; an empty one counts as unset, as in the Azure SDKs.
    fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    #[cfg(test)]
    pub(crate) fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.vars.insert(key, value.into());
        self
    }
}

impl fmt::Debug for Env {
    /// Names only: `AZURE_CLIENT_SECRET` is a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.vars.keys()).finish()
    }
}

/// The credential a provider resolved to (`auto` picks one of the first four).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    WorkloadIdentity,
    ManagedIdentity,
    ClientSecret,
    ClientCertificate,
    AzureCli,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Self::WorkloadIdentity => "workload identity",
            Self::ManagedIdentity => "managed identity",
            Self::ClientSecret => "service principal (client secret)",
            Self::ClientCertificate => "service principal (client certificate)",
            Self::AzureCli => "Azure CLI",
        }
    }
}

/// What one request asks for: the tenant (if any) and the scope.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    tenant: Option<String>,
    /// The tenant came from the cluster or the provider config, not `AZURE_TENANT_ID`.
    tenant_explicit: bool,
    scope: String,
}

/// HTTP clients, built on the first fetch.
#[derive(Debug, Clone)]
pub(crate) struct Clients {
    /// Entra ID and other remote endpoints: proxies from the environment.
    remote: Arc<dyn HttpClient>,
    /// Managed identity endpoints (IMDS, App Service's local endpoint): never proxied, they
    /// are link-local or on the host.
    local: Arc<dyn HttpClient>,
}

/// The remote (proxied) and local (never proxied) clients, with the rules every provider's
/// client shares ([`upstream::http_client`]).
fn build_clients() -> Result<Clients, String> {
    // Token endpoints do not redirect; following one would send the assertion on.
    let builder = |route| upstream::http_client(route).redirect(reqwest::redirect::Policy::none());
    let remote = builder(Route::Remote).build().map_err(|e| {
        format!(
            "cannot set up the HTTPS client: {}",
            upstream::error_chain(&e)
        )
    })?;
    let local = builder(Route::Local).build().map_err(|e| {
        format!(
            "cannot set up the HTTP client: {}",
            upstream::error_chain(&e)
        )
    })?;
    Ok(Clients {
        remote: Arc::new(remote),
        local: Arc::new(local),
    })
}

/// A `type: azure` provider.
#[derive(Debug)]
pub struct AzureProvider {
    config: AzureConfig,
    env: Env,
    clients: OnceCell<Clients>,
    /// What `auto` resolved to; kept once found (the environment does not change).
    auto: OnceCell<Kind>,
    imds_probe_url: String,
}

impl AzureProvider {
    pub(crate) fn new(config: AzureConfig, env: Env) -> Self {
        Self {
            config,
            env,
            clients: OnceCell::new(),
            auto: OnceCell::new(),
            imds_probe_url: IMDS_TOKEN_URL.to_owned(),
        }
    }

    #[cfg(test)]
    pub(crate) fn with_clients(self, clients: Clients, imds_probe_url: &str) -> Self {
        Self {
            clients: OnceCell::new_with(Some(clients)),
            imds_probe_url: imds_probe_url.to_owned(),
            ..self
        }
    }

    fn credential(&self) -> AzureCredential {
        self.config.credential.unwrap_or_default()
    }

    /// The tenant and scope for a request: the cluster's `tenantId`/`serverId` first, then
    /// the provider's, then `AZURE_TENANT_ID` / the AKS server application.
    fn target(&self, req: &TokenRequest) -> Result<Target, ProviderError> {
        let cluster_value = |key: &str, check: fn(&str) -> Result<(), String>| {
            req.config_str(key)
                .map(|v| {
                    check(&v).map(|()| v).map_err(|why| {
                        ProviderError::InvalidRequest(format!(
                            "the cluster's exec config has an invalid {key}: {why}"
                        ))
                    })
                })
                .transpose()
        };
        let server_id = cluster_value("serverId", AzureConfig::check_server_id)?
            .or_else(|| self.config.server_id.clone())
            .unwrap_or_else(|| AKS_SERVER_ID.to_owned());
        let explicit = cluster_value("tenantId", AzureConfig::check_tenant_id)?
            .or_else(|| self.config.tenant_id.clone());
        let tenant_explicit = explicit.is_some();
        let tenant = match explicit {
            Some(t) => Some(t),
            None => self.env_tenant()?,
        };
        Ok(Target {
            tenant,
            tenant_explicit,
            scope: format!("{server_id}/.default"),
        })
    }

    fn env_tenant(&self) -> Result<Option<String>, ProviderError> {
        self.env
            .get(AZURE_TENANT_ID)
            .map(|t| {
                AzureConfig::check_tenant_id(t)
                    .map(|()| t.to_owned())
                    .map_err(|why| misconfigured(format!("{AZURE_TENANT_ID}: {why}")))
            })
            .transpose()
    }

    /// The client id a credential of `kind` uses, from the config or `AZURE_CLIENT_ID`.
    fn client_id(&self) -> Option<&str> {
        self.config
            .client_id
            .as_deref()
            .or_else(|| self.env.get(AZURE_CLIENT_ID))
    }

    fn federated_token_file(&self) -> Option<PathBuf> {
        self.config
            .federated_token_file
            .clone()
            .or_else(|| self.env.get(AZURE_FEDERATED_TOKEN_FILE).map(PathBuf::from))
    }

    fn certificate_path(&self) -> Option<PathBuf> {
        self.config.client_certificate_path.clone().or_else(|| {
            self.env
                .get(AZURE_CLIENT_CERTIFICATE_PATH)
                .map(PathBuf::from)
        })
    }

    fn authority_host(&self) -> Result<String, ProviderError> {
        let host = match (
            &self.config.authority_host,
            self.env.get(AZURE_AUTHORITY_HOST),
        ) {
            (Some(h), _) => h.clone(),
            (None, Some(h)) => {
                AzureConfig::check_authority_host(h)
                    .map_err(|why| misconfigured(format!("{AZURE_AUTHORITY_HOST}: {why}")))?;
                h.to_owned()
            }
            (None, None) => PUBLIC_AUTHORITY_HOST.to_owned(),
        };
        Ok(host.trim_end_matches('/').to_owned())
    }

    fn clients(&self) -> Result<&Clients, ProviderError> {
        if let Some(c) = self.clients.get() {
            return Ok(c);
        }
        let built = build_clients().map_err(ProviderError::Unavailable)?;
        // Another fetch may have won the race; either client is as good.
        let _ = self.clients.set(built);
        self.clients
            .get()
            .ok_or_else(|| ProviderError::Unavailable("HTTP client not initialised".into()))
    }

    /// The credential kind: the configured one, or what `auto` finds.
    async fn kind(&self, clients: &Clients) -> Result<Kind, ProviderError> {
        Ok(match self.credential() {
            AzureCredential::WorkloadIdentity => Kind::WorkloadIdentity,
            AzureCredential::ManagedIdentity => Kind::ManagedIdentity,
            AzureCredential::ClientSecret => Kind::ClientSecret,
            AzureCredential::ClientCertificate => Kind::ClientCertificate,
            AzureCredential::AzureCli => Kind::AzureCli,
            AzureCredential::Auto => {
                *self
                    .auto
                    .get_or_try_init(|| self.resolve_auto(clients))
                    .await?
            }
        })
    }

    /// `auto`: workload identity, then managed identity, then a service principal from the
    /// environment. Nothing interactive, and not the Azure CLI (a developer's login has no
    /// place in a controller's sidecar; ask for it with `credential: azureCli`).
    async fn resolve_auto(&self, clients: &Clients) -> Result<Kind, ProviderError> {
        if self.federated_token_file().is_some() {
            return Ok(Kind::WorkloadIdentity);
        }
        if self.env.get(IDENTITY_ENDPOINT).is_some() || self.env.get(MSI_ENDPOINT).is_some() {
            return Ok(Kind::ManagedIdentity);
        }
        if self.imds_answers(&clients.local).await {
            return Ok(Kind::ManagedIdentity);
        }
        if self.env.get(AZURE_CLIENT_SECRET).is_some() {
            return Ok(Kind::ClientSecret);
        }
        if self.certificate_path().is_some() {
            return Ok(Kind::ClientCertificate);
        }
        Err(misconfigured(format!(
            "credential auto found no Azure identity: workload identity needs \
             {AZURE_FEDERATED_TOKEN_FILE} (with {AZURE_CLIENT_ID} and {AZURE_TENANT_ID}); no managed \
             identity ({IDENTITY_ENDPOINT} is not set and IMDS at {} did not answer within {}s); \
             a service principal needs {AZURE_TENANT_ID}, {AZURE_CLIENT_ID} and {AZURE_CLIENT_SECRET} \
             or {AZURE_CLIENT_CERTIFICATE_PATH}",
            self.imds_probe_url,
            IMDS_PROBE_TIMEOUT.as_secs()
        )))
    }

    /// Whether IMDS answers at all: any HTTP answer (it refuses a request without the
    /// `Metadata` header) means there is one.
    async fn imds_answers(&self, client: &Arc<dyn HttpClient>) -> bool {
        let Ok(url) = Url::parse(&self.imds_probe_url) else {
            return false;
        };
        let req = Request::new(url, Method::Get);
        matches!(
            tokio::time::timeout(IMDS_PROBE_TIMEOUT, client.execute_request(&req)).await,
            Ok(Ok(_))
        )
    }

    fn client_options(&self, http: &Arc<dyn HttpClient>, authority: &str) -> ClientOptions {
        let mut cloud = CustomConfiguration::default();
        cloud.authority_host = authority.to_owned();
        ClientOptions {
            transport: Some(Transport::new(Arc::clone(http))),
            // The cache retries with jittered backoff while it serves what it holds;
            // retries here would only hold the caller longer.
            retry: RetryOptions::none(),
            cloud: Some(Arc::new(CloudConfiguration::Custom(cloud))),
            ..ClientOptions::default()
        }
    }

    /// Names what is missing for `kind`, or returns the client id and tenant it needs.
    fn app_identity<'t>(
        &self,
        kind: Kind,
        target: &'t Target,
        extra: &[(&str, bool)],
    ) -> Result<(String, &'t str), ProviderError> {
        let client_id = self.client_id();
        let mut missing = Vec::new();
        if client_id.is_none() {
            missing.push(format!("{AZURE_CLIENT_ID} (or azure.clientId)"));
        }
        if target.tenant.is_none() {
            missing.push(format!(
                "{AZURE_TENANT_ID} (or azure.tenantId, or the cluster's tenantId)"
            ));
        }
        for (name, present) in extra {
            if !present {
                missing.push((*name).to_owned());
            }
        }
        match (client_id, target.tenant.as_deref(), missing.is_empty()) {
            (Some(c), Some(t), true) => {
                AzureConfig::check_client_id(c)
                    .map_err(|why| misconfigured(format!("{AZURE_CLIENT_ID}: {why}")))?;
                Ok((c.to_owned(), t))
            }
            _ => Err(misconfigured(format!(
                "{} is missing {}",
                kind.describe(),
                missing.join(", ")
            ))),
        }
    }

    /// Builds the credential for one upstream request (see the module docs for why not once).
    fn build_credential(
        &self,
        kind: Kind,
        target: &Target,
        clients: &Clients,
    ) -> Result<(Arc<dyn TokenCredential>, String), ProviderError> {
        let authority = self.authority_host()?;
        let sdk = |e: azure_core::Error| misconfigured(format!("{}: {e}", kind.describe()));
        match kind {
            Kind::WorkloadIdentity => {
                let file = self.federated_token_file();
                let (client_id, tenant) = self.app_identity(
                    kind,
                    target,
                    &[(
                        "AZURE_FEDERATED_TOKEN_FILE (or azure.federatedTokenFile)",
                        file.is_some(),
                    )],
                )?;
                let file = file.unwrap_or_default();
                check_token_file(&file)?;
                let options = WorkloadIdentityCredentialOptions {
                    credential_options: ClientAssertionCredentialOptions {
                        client_options: self.client_options(&clients.remote, &authority),
                    },
                    client_id: Some(client_id.clone()),
                    tenant_id: Some(tenant.to_owned()),
                    token_file_path: Some(file),
                };
                let cred = WorkloadIdentityCredential::new(Some(options)).map_err(sdk)?;
                Ok((
                    cred,
                    format!("workload identity {client_id} in tenant {tenant}"),
                ))
            }
            Kind::ClientSecret => {
                let secret = self.env.get(AZURE_CLIENT_SECRET);
                let (client_id, tenant) =
                    self.app_identity(kind, target, &[(AZURE_CLIENT_SECRET, secret.is_some())])?;
                let options = ClientSecretCredentialOptions {
                    client_options: self.client_options(&clients.remote, &authority),
                };
                let cred = ClientSecretCredential::new(
                    tenant,
                    client_id.clone(),
                    AzureSecret::new(secret.unwrap_or_default().to_owned()),
                    Some(options),
                )
                .map_err(sdk)?;
                Ok((
                    cred,
                    format!("service principal {client_id} in tenant {tenant}"),
                ))
            }
            Kind::ClientCertificate => {
                let path = self.certificate_path();
                let (client_id, tenant) = self.app_identity(
                    kind,
                    target,
                    &[(
                        "AZURE_CLIENT_CERTIFICATE_PATH (or azure.clientCertificatePath)",
                        path.is_some(),
                    )],
                )?;
                if self.env.get(AZURE_CLIENT_CERTIFICATE_PASSWORD).is_some() {
                    return Err(misconfigured(format!(
                        "{AZURE_CLIENT_CERTIFICATE_PASSWORD} is set, but only unencrypted PEM \
                         certificates are supported; decrypt the key (openssl pkey) into the file"
                    )));
                }
                let path = path.unwrap_or_default();
                let send_chain = self
                    .env
                    .get(AZURE_CLIENT_SEND_CERTIFICATE_CHAIN)
                    .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
                let assertion = certificate::CertificateAssertion::load(
                    &path,
                    &client_id,
                    &format!("{authority}/{tenant}/oauth2/v2.0/token"),
                    send_chain,
                )?;
                let options = ClientAssertionCredentialOptions {
                    client_options: self.client_options(&clients.remote, &authority),
                };
                let cred = ClientAssertionCredential::new(
                    tenant.to_owned(),
                    client_id.clone(),
                    assertion,
                    Some(options),
                )
                .map_err(sdk)?;
                Ok((
                    cred,
                    format!("service principal {client_id} (certificate) in tenant {tenant}"),
                ))
            }
            Kind::ManagedIdentity => {
                if let (true, Some(tenant)) = (target.tenant_explicit, &target.tenant) {
                    return Err(ProviderError::InvalidRequest(format!(
                        "tenantId {tenant} cannot be used with a managed identity, which always \
                         gets tokens from its own tenant; remove tenantId or use \
                         workloadIdentity, clientSecret or clientCertificate"
                    )));
                }
                let (user_assigned, label) =
                    match (&self.config.managed_identity_resource_id, self.client_id()) {
                        (Some(id), _) => (
                            Some(UserAssignedId::ResourceId(id.clone())),
                            format!("managed identity {id}"),
                        ),
                        (None, Some(id)) => (
                            Some(UserAssignedId::ClientId(id.to_owned())),
                            format!("managed identity {id}"),
                        ),
                        (None, None) => (None, "system-assigned managed identity".to_owned()),
                    };
                let options = ManagedIdentityCredentialOptions {
                    user_assigned_id: user_assigned,
                    client_options: self.client_options(&clients.local, &authority),
                };
                let cred = ManagedIdentityCredential::new(Some(options)).map_err(sdk)?;
                Ok((cred, label))
            }
            Kind::AzureCli => {
                let options = AzureCliCredentialOptions {
                    tenant_id: target.tenant.clone(),
                    executor: Some(Arc::new(CliExecutor {
                        path: self.env.get(PATH).map(str::to_owned),
                    })),
                    ..Default::default()
                };
                let cred = AzureCliCredential::new(Some(options)).map_err(sdk)?;
                let label = match &target.tenant {
                    Some(t) => format!("Azure CLI login in tenant {t}"),
                    None => "Azure CLI login".to_owned(),
                };
                Ok((cred, label))
            }
        }
    }

    async fn get(&self, target: &Target) -> Result<Credential, ProviderError> {
        let clients = self.clients()?.clone();
        let kind = self.kind(&clients).await?;
        // This request's transport notes the error answer, if any, for `classify`.
        let remote = Arc::new(Answers::new(&clients.remote));
        let local = Arc::new(Answers::new(&clients.local));
        let recording = Clients {
            remote: remote.clone(),
            local: local.clone(),
        };
        let (credential, label) = self.build_credential(kind, target, &recording)?;
        let scopes = [target.scope.as_str()];
        let token = credential.get_token(&scopes, None).await.map_err(|e| {
            let answer = remote.failed().or_else(|| local.failed());
            classify(&e, answer, &label, &target.scope)
        })?;
        let expires_at = SystemTime::from(token.expires_on);
        let token = super::bearer_token(token.token.secret()).map_err(|e| {
            ProviderError::Unavailable(format!(
                "{label}: Entra ID returned an access token that {e}"
            ))
        })?;
        Ok(Credential::token(token, expires_at))
    }
}

impl Provider for AzureProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Azure
    }

    /// Credential + client + tenant + scope: every cluster that shares them shares a token.
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        let target = self.target(req)?;
        let client = self
            .config
            .managed_identity_resource_id
            .as_deref()
            .or_else(|| self.client_id())
            .unwrap_or("-");
        let key = format!(
            "credential={} client={client} tenant={} scope={}",
            self.credential(),
            target.tenant.as_deref().unwrap_or("-"),
            target.scope
        );
        Ok(Resolved::new(key, target))
    }

    fn fetch<'a>(
        &'a self,
        _req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move { self.get(target.target()?).await })
    }
}

/// The broker is missing configuration or environment it needs.
fn misconfigured(message: String) -> ProviderError {
    ProviderError::Unimplemented(message)
}

/// A clear error for a federated token file that is not there (azure_identity's own says
/// only "failed to read").
fn check_token_file(path: &Path) -> Result<(), ProviderError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => Err(ProviderError::Unavailable(format!(
            "the federated token file {} is empty (kubelet writes it when the pod starts)",
            path.display()
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ProviderError::NotFound(format!(
                "the federated token file {} does not exist; is the pod labelled \
             azure.workload.identity/use: \"true\" with a service account annotated \
             azure.workload.identity/client-id?",
                path.display()
            )))
        }
        Err(e) => Err(ProviderError::Unavailable(format!(
            "cannot read the federated token file {}: {e}",
            path.display()
        ))),
    }
}

/// Most of an upstream error message is kept; beyond this it is noise (trace ids, links).
const MAX_DETAIL: usize = 300;

/// Turns an `azure_identity` error into the broker's classification: Entra ID refusing the
/// identity is `Denied` (with the AADSTS code and what it means), an endpoint that is down
/// or overloaded is `Unavailable` (the cache backs off and serves what it holds), a slow one
/// `Timeout`.
fn classify(
    err: &azure_core::Error,
    answer: Option<(u16, Vec<u8>)>,
    label: &str,
    scope: &str,
) -> ProviderError {
    // The error answer as the transport saw it: azure_identity 1.0 fails to parse Entra's
    // error body when its description holds escapes (as real ones do: "\r\nTrace ID: ..."),
    // and reports a JSON error instead of the HTTP answer.
    if let Some((status, body)) = answer {
        return http_error(status, &body, &err.to_string(), label, scope);
    }
    // Else the credential wraps the pipeline's error; the HTTP answer, if any, is inside.
    let mut current = err;
    loop {
        if let ErrorKind::HttpResponse {
            status,
            raw_response,
            ..
        } = current.kind()
        {
            let status = u16::from(*status);
            let body = raw_response
                .as_ref()
                .map(|r| r.body().as_ref().to_vec())
                .unwrap_or_default();
            return http_error(status, &body, &current.to_string(), label, scope);
        }
        match current.downcast_ref::<azure_core::Error>() {
            Some(inner) => current = inner,
            None => break,
        }
    }
    // Transport failures: find the reqwest or I/O error underneath.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(re) = e.downcast_ref::<reqwest::Error>() {
            let what = format!("{label}: {}", upstream::error_chain(re));
            return if re.is_timeout() {
                ProviderError::Timeout(what)
            } else {
                ProviderError::Unavailable(what)
            };
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return ProviderError::Timeout(format!("{label}: {io}"));
        }
        source = e.source();
    }
    let text = one_line(&err.to_string());
    if label.starts_with("Azure CLI") {
        return cli_error(&text, label);
    }
    if let Some((code, _)) = aadsts::find_code(&text) {
        return ProviderError::Denied(format!("{label}: {}", aadsts::describe(code, &text)));
    }
    ProviderError::Unavailable(format!("{label}: {}", shorten(&text)))
}

/// An HTTP error answer from Entra ID or a managed identity endpoint.
fn http_error(status: u16, body: &[u8], message: &str, label: &str, scope: &str) -> ProviderError {
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct EntraError {
        error: String,
        error_description: String,
        error_codes: Vec<u64>,
    }
    let entra: EntraError = serde_json::from_slice(body).unwrap_or_default();
    let detail = if let Some(code) = entra
        .error_codes
        .first()
        .copied()
        .or_else(|| aadsts::find_code(&entra.error_description).map(|(c, _)| c))
    {
        aadsts::describe(code, &entra.error_description)
    } else if !entra.error_description.is_empty() {
        shorten(&one_line(&entra.error_description))
    } else {
        match std::str::from_utf8(body).map(one_line) {
            Ok(text) if !text.is_empty() => shorten(&text),
            _ => shorten(&one_line(message)),
        }
    };
    let error = if entra.error.is_empty() {
        String::new()
    } else {
        format!(" {}", entra.error)
    };
    let what =
        format!("{label}: token request for {scope} answered HTTP {status}{error}: {detail}");
    match status {
        408 => ProviderError::Timeout(what),
        429 | 500..=599 => ProviderError::Unavailable(what),
        _ => ProviderError::Denied(what),
    }
}

/// `az` failed: not installed, not logged in, refused, or something transient.
fn cli_error(text: &str, label: &str) -> ProviderError {
    if text.contains("not found on PATH") || text.contains("wasn't found on PATH") {
        return ProviderError::NotFound(format!(
            "{label}: `az` is not on the broker's PATH; install the Azure CLI in the broker's image"
        ));
    }
    if let Some((code, _)) = aadsts::find_code(text) {
        return ProviderError::Denied(format!("{label}: {}", aadsts::describe(code, text)));
    }
    if text.contains("az login") {
        return ProviderError::Denied(format!("{label}: {}", shorten(text)));
    }
    ProviderError::Unavailable(format!("{label}: {}", shorten(text)))
}

/// A transport that keeps the last error answer (status and body) it passed on.
#[derive(Debug)]
struct Answers {
    inner: Arc<dyn HttpClient>,
    failed: std::sync::Mutex<Option<(u16, Vec<u8>)>>,
}

impl Answers {
    fn new(inner: &Arc<dyn HttpClient>) -> Self {
        Self {
            inner: Arc::clone(inner),
            failed: std::sync::Mutex::new(None),
        }
    }

    fn failed(&self) -> Option<(u16, Vec<u8>)> {
        self.failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

#[tonic::async_trait]
impl HttpClient for Answers {
    async fn execute_request(&self, req: &Request) -> azure_core::Result<AsyncRawResponse> {
        let rsp = self.inner.execute_request(req).await?;
        let status = rsp.status();
        if status.is_success() {
            return Ok(rsp);
        }
        let (status, headers, body) = rsp.deconstruct();
        let body = body.collect().await?;
        *self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((u16::from(status), body.to_vec()));
        Ok(AsyncRawResponse::from_bytes(status, headers, body))
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn shorten(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_DETAIL) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Runs `az` for azure_identity's CLI credential: in its own process group, bounded by
/// [`AZ_CLI_TIMEOUT`], everything it started killed afterwards (azure_identity's own
/// executor has no timeout and would leave a hung `az` behind).
#[derive(Debug)]
struct CliExecutor {
    path: Option<String>,
}

#[tonic::async_trait]
impl Executor for CliExecutor {
    async fn run(&self, program: &OsStr, args: &[&OsStr]) -> std::io::Result<Output> {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(path) = &self.path {
            cmd.env(PATH, path);
        }
        let child = cmd.spawn()?;
        let pgid = child.id().and_then(|p| i32::try_from(p).ok());
        let result = tokio::time::timeout(AZ_CLI_TIMEOUT, child.wait_with_output()).await;
        if let Some(pgid) = pgid {
            // ESRCH (nothing left in the group) is the normal case.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        result.unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("az did not finish within {}s", AZ_CLI_TIMEOUT.as_secs()),
            ))
        })
    }
}
