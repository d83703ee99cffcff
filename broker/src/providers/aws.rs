//! `type: aws`: EKS bearer tokens, the same ones `aws eks get-token` and
//! aws-iam-authenticator's generator make: a SigV4-presigned STS `GetCallerIdentity` URL
//! bound to one cluster by the signed `x-k8s-aws-id` header.
//!
//! Credentials come from the AWS SDK's default chain (environment, profile, web identity /
//! IRSA, EKS Pod Identity and ECS, IMDSv2), optionally through an assumed role. They are
//! held per source ([`creds::HeldCredentials`]) and renewed only near their expiry, so
//! signing a token (and re-signing it when the cache refreshes it) is a local computation:
//! one AssumeRole per role per session, whatever the number of clusters and tokens.
//!
//! The cache key is region + cluster + role: each cluster needs its own token (the header
//! is signed), while all clusters of one role share its credentials.
mod creds;
mod token;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use aws_config::sts::AssumeRoleProvider;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::provider::error::CredentialsError;

use crate::config::values::ProviderKind;

use crate::config::providers::aws::{AwsStsEndpoint, Config as AwsConfig};
use crate::request::TokenRequest;

use super::upstream::{self, CertEnv};
use super::{BoxFuture, Credential, Provider, ProviderError, Resolved};
use creds::{Failure, HeldCredentials};

pub use crate::config::providers::aws::DEFAULT_SESSION_NAME;
/// EKS cluster names are at most 100 characters and local-cluster ids are UUIDs; anything
/// this long is not a cluster.
const MAX_CLUSTER_ID_LEN: usize = 255;

/// Builds the provider for one config entry; the SDK is set up on the first fetch.
pub fn build(name: &str, config: &AwsConfig) -> Arc<dyn Provider> {
    Arc::new(AwsProvider::new(name, config.clone()))
}

pub struct AwsProvider {
    name: String,
    config: AwsConfig,
    sdk: tokio::sync::OnceCell<Sdk>,
}

/// What the first fetch sets up: the SDK config (region, credential chain, HTTP client) and
/// the held credentials, one for the chain and one per role.
struct Sdk {
    config: SdkConfig,
    chain: Option<Arc<HeldCredentials>>,
    roles: Mutex<HashMap<RoleKey, Arc<HeldCredentials>>>,
}

/// One assumed-role session: role, external id, session name, and the STS region when the
/// SDK has no default region of its own.
#[derive(Clone, PartialEq, Eq, Hash)]
struct RoleKey {
    role: Role,
    sts_region: Option<String>,
}

impl fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsProvider")
            .field("name", &self.name)
            .field("region", &self.config.region)
            .field("role_arn", &self.config.role_arn)
            .field("sts_endpoint", &self.config.sts_endpoint)
            .field("sdk_loaded", &self.sdk.initialized())
            .finish_non_exhaustive()
    }
}

/// The role a request signs as.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Role {
    arn: String,
    external_id: Option<String>,
    session_name: String,
}

impl fmt::Debug for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The external id may be a secret shared with the role's owner.
        f.debug_struct("Role")
            .field("arn", &self.arn)
            .field(
                "external_id",
                &self.external_id.as_ref().map(|_| "[redacted]"),
            )
            .field("session_name", &self.session_name)
            .finish()
    }
}

/// What one request asks for, once the cluster's keys have overridden the provider's.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    /// The `x-k8s-aws-id` value: `clusterId` (EKS local clusters) else `clusterName`.
    cluster_id: String,
    /// `None`: the SDK's default region, known once the SDK config is loaded.
    region: Option<String>,
    role: Option<Role>,
}

impl AwsProvider {
    pub fn new(name: &str, config: AwsConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
            sdk: tokio::sync::OnceCell::new(),
        }
    }

    fn endpoint(&self) -> AwsStsEndpoint {
        self.config.sts_endpoint.unwrap_or_default()
    }

    /// Reads the request: cluster id, region (cluster → provider → EKS server host → SDK
    /// default) and role (cluster → provider). Checks every value the cluster supplies.
    fn target(&self, req: &TokenRequest) -> Result<Target, ProviderError> {
        let label = req.cluster_label();
        let invalid = |key: &str, why: String| {
            ProviderError::InvalidRequest(format!(
                "cluster {label}: {key} in the cluster's exec config: {why}"
            ))
        };
        let cluster_id = req
            .config_str("clusterId")
            .or_else(|| req.config_str("clusterName"))
            .ok_or_else(|| {
                ProviderError::InvalidRequest(format!(
                    "cluster {label}: the cluster's exec config has neither clusterName nor clusterId; \
                     an EKS token is signed for one of them (add {{\"clusterName\": \"<EKS cluster name>\"}} \
                     to the ClusterProfile's client.authentication.k8s.io/exec extension)"
                ))
            })?;
        let id_ok = cluster_id.len() <= MAX_CLUSTER_ID_LEN
            && cluster_id.bytes().all(|b| b.is_ascii_graphic());
        if !id_ok {
            let key = if req.config_str("clusterId").is_some() {
                "clusterId"
            } else {
                "clusterName"
            };
            return Err(invalid(
                key,
                format!("{cluster_id:?} is not an EKS cluster name or id"),
            ));
        }

        let region = match req.config_str("region") {
            Some(region) => {
                AwsConfig::check_region(&region).map_err(|why| invalid("region", why))?;
                Some(region)
            }
            None => self.config.region.clone().or_else(|| {
                req.cluster
                    .as_ref()
                    .and_then(|c| token::region_from_server(&c.server))
            }),
        };

        let role_arn = req
            .config_str("roleArn")
            .map(|arn| {
                AwsConfig::check_role_arn(&arn)
                    .map(|()| arn)
                    .map_err(|why| invalid("roleArn", why))
            })
            .transpose()?
            .or_else(|| self.config.role_arn.clone());
        let role = match role_arn {
            None => None,
            Some(arn) => {
                let external_id = match req.config_str("externalId") {
                    Some(id) => {
                        AwsConfig::check_external_id(&id)
                            .map_err(|why| invalid("externalId", why))?;
                        Some(id)
                    }
                    None => self.config.external_id.clone(),
                };
                let session_name = match req.config_str("sessionName") {
                    Some(name) => {
                        AwsConfig::check_session_name(&name)
                            .map_err(|why| invalid("sessionName", why))?;
                        name
                    }
                    None => self
                        .config
                        .session_name
                        .clone()
                        .unwrap_or_else(|| DEFAULT_SESSION_NAME.to_owned()),
                };
                Some(Role {
                    arn,
                    external_id,
                    session_name,
                })
            }
        };
        Ok(Target {
            cluster_id,
            region,
            role,
        })
    }

    /// The SDK config and held chain credentials, set up once. `load()` reads the
    /// environment and profile files; the first credentials are fetched on first use.
    async fn sdk(&self) -> &Sdk {
        self.sdk
            .get_or_init(|| async {
                let mut loader =
                    aws_config::defaults(BehaviorVersion::latest()).http_client(sdk_http_client());
                if let Some(region) = &self.config.region {
                    loader = loader.region(Region::new(region.clone()));
                }
                let config = loader.load().await;
                tracing::info!(
                    provider = %self.name,
                    region = config.region().map(|r| r.as_ref()).unwrap_or("(none)"),
                    "AWS SDK configuration loaded"
                );
                let chain = config
                    .credentials_provider()
                    .map(|p| Arc::new(HeldCredentials::new(p)));
                Sdk {
                    config,
                    chain,
                    roles: Mutex::new(HashMap::new()),
                }
            })
            .await
    }

    async fn fetch_token(
        &self,
        req: &TokenRequest,
        target: &Target,
    ) -> Result<Credential, ProviderError> {
        let label = req.cluster_label();
        let sdk = self.sdk().await;
        let region = match target.region.clone() {
            Some(region) => region,
            None => {
                let region = sdk.config.region().map(|r| r.as_ref().to_owned()).ok_or_else(|| {
                    ProviderError::InvalidRequest(format!(
                        "no AWS region for cluster {label}: set \"region\" in the cluster's exec config \
                         or in the provider, use the EKS server URL (https://….<region>.eks.amazonaws.com), \
                         or set AWS_REGION for the broker"
                    ))
                })?;
                AwsConfig::check_region(&region).map_err(|why| {
                    ProviderError::InvalidRequest(format!(
                        "cluster {label}: the AWS SDK's default region: {why}"
                    ))
                })?;
                region
            }
        };

        let creds = match &target.role {
            None => {
                let chain = sdk.chain.as_ref().ok_or_else(|| {
                    ProviderError::Unavailable(format!(
                        "the AWS SDK has no credential chain; sources: {}",
                        creds::CHAIN_SOURCES
                    ))
                })?;
                chain.get().await.map_err(|e| self.failure(&e, None))?
            }
            Some(role) => {
                let held = self.role(sdk, role, &region).await?;
                held.get().await.map_err(|e| self.failure(&e, Some(role)))?
            }
        };
        let signed = token::presign(
            &creds,
            &region,
            self.endpoint(),
            &target.cluster_id,
            SystemTime::now(),
        )
        .map_err(|why| ProviderError::Unavailable(format!("cluster {label}: {why}")))?;
        Ok(Credential::token(signed.token, signed.expires_at))
    }

    /// The held credentials of one role, created on first use. Its STS calls use the SDK's
    /// region (or the token's region when the SDK has none) and the held chain credentials.
    async fn role(
        &self,
        sdk: &Sdk,
        role: &Role,
        region: &str,
    ) -> Result<Arc<HeldCredentials>, ProviderError> {
        let key = RoleKey {
            role: role.clone(),
            sts_region: match sdk.config.region() {
                Some(_) => None,
                None => Some(region.to_owned()),
            },
        };
        if let Some(held) = sdk.lock_roles().get(&key) {
            return Ok(Arc::clone(held));
        }
        let chain = sdk.chain.as_ref().ok_or_else(|| {
            ProviderError::Unavailable(format!(
                "the AWS SDK has no credential chain to assume role {} with; sources: {}",
                role.arn,
                creds::CHAIN_SOURCES
            ))
        })?;
        let mut builder = AssumeRoleProvider::builder(&role.arn)
            .session_name(&role.session_name)
            .configure(&sdk.config);
        if let Some(external_id) = &role.external_id {
            builder = builder.external_id(external_id);
        }
        if let Some(region) = &key.sts_region {
            builder = builder.region(Region::new(region.clone()));
        }
        // Building makes no call: STS is asked on the first `get`.
        let provider = builder
            .build_from_provider(creds::Shared(Arc::clone(chain)))
            .await;
        let held = Arc::new(HeldCredentials::new(SharedCredentialsProvider::new(
            provider,
        )));
        // Two first requests may both build one; the first inserted wins, the other is dropped
        // before it made any call.
        Ok(Arc::clone(sdk.lock_roles().entry(key).or_insert(held)))
    }

    /// An SDK credential failure as the broker reports it: which source, what to check.
    fn failure(&self, error: &CredentialsError, role: Option<&Role>) -> ProviderError {
        // The SDK's errors carry codes, messages, request ids and paths, never keys or tokens.
        let detail = upstream::error_chain(error);
        let source = match role {
            Some(role) => format!("assuming role {}", role.arn),
            None => "getting credentials from the AWS default chain".to_owned(),
        };
        match creds::classify(error) {
            Failure::NoCredentials => ProviderError::Unavailable(format!(
                "no AWS credentials found{}; tried: {} ({detail})",
                role.map(|r| format!(" to assume role {} with", r.arn))
                    .unwrap_or_default(),
                creds::CHAIN_SOURCES
            )),
            Failure::Denied(why) => ProviderError::Denied(match role {
                Some(role) => format!(
                    "STS denied AssumeRole of {} ({why}); check that the role's trust policy allows \
                     the broker's identity{}",
                    role.arn,
                    if role.external_id.is_some() {
                        " and its externalId"
                    } else {
                        ""
                    }
                ),
                None => format!(
                    "STS denied the broker's AWS identity ({why}); check the IRSA / Pod Identity role \
                     and its trust policy"
                ),
            }),
            Failure::Timeout => ProviderError::Timeout(format!("{source} timed out: {detail}")),
            Failure::Transient => ProviderError::Unavailable(format!("{source} failed: {detail}")),
        }
    }
}

impl Sdk {
    fn lock_roles(&self) -> std::sync::MutexGuard<'_, HashMap<RoleKey, Arc<HeldCredentials>>> {
        // Every map state is valid: a panic elsewhere cannot leave it half-updated.
        self.roles.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Provider for AwsProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Aws
    }

    /// Region + cluster + role (+ a hash of the external id, which may be a secret): each
    /// cluster's token is its own, signed for its `x-k8s-aws-id`.
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        let target = self.target(req)?;
        let mut id = format!(
            "region={} cluster={} sts={}",
            target.region.as_deref().unwrap_or("(sdk default)"),
            target.cluster_id,
            match self.endpoint() {
                AwsStsEndpoint::Regional => "regional",
                AwsStsEndpoint::Global => "global",
            }
        );
        if let Some(role) = &target.role {
            id.push_str(&format!(" role={} session={}", role.arn, role.session_name));
            if let Some(external_id) = &role.external_id {
                let mut h = DefaultHasher::new();
                external_id.hash(&mut h);
                id.push_str(&format!(" externalId#{:016x}", h.finish()));
            }
        }
        Ok(Resolved::new(id, target))
    }

    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move { self.fetch_token(req, target.target()?).await })
    }
}

/// The client for the SDK's own calls (STS AssumeRole and AssumeRoleWithWebIdentity,
/// container credentials, instance metadata): the SDK's default hyper + rustls client on
/// aws-lc-rs, with `HTTPS_PROXY` / `NO_PROXY` from the environment, trusting
/// [`upstream::trust_roots`] like every other provider. The SDK's default would read
/// `SSL_CERT_FILE` / `SSL_CERT_DIR` *instead of* the system store, which breaks real STS the
/// moment a private CA is added for a proxy or a test fake.
fn sdk_http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::proxy::ProxyConfig;
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    use aws_smithy_http_client::{Builder, ConnectorBuilder};

    let roots = upstream::trust_roots(&CertEnv::from_process());
    roots.log();
    let store = TrustStore::empty().with_pem_certificate(to_pem(&roots.certs).into_bytes());
    let context = TlsContext::builder()
        .with_trust_store(store)
        .build()
        .unwrap_or_default();
    // What the SDK's `default_https_client` does for behavior version 2025-08-07 and later,
    // with our trust store.
    Builder::new().build_with_connector_fn(move |settings, components| {
        let mut builder = ConnectorBuilder::default().tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ));
        builder.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            builder.set_sleep_impl(components.sleep_impl());
        }
        builder.set_proxy_config(Some(ProxyConfig::from_env()));
        builder.tls_context(context.clone()).build()
    })
}

/// Certificates as one PEM bundle (what the SDK's trust store takes).
fn to_pem(certs: &[rustls_pki_types::CertificateDer<'_>]) -> String {
    use base64::Engine as _;
    let mut pem = String::new();
    for cert in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem
}
