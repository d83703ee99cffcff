//! The broker's YAML configuration: parsing (camelCase keys, unknown keys rejected with their
//! path), defaults, and validation. Nothing here touches the network or the socket.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod yaml;

pub use yaml::{MAX_CONFIG_BYTES, MAX_EXPANDED_BYTES};

/// Where the shim looks when neither `--socket` nor `CREDBROKER_SOCKET` is given (the design's
/// contract); the deploy manifests mount an `emptyDir` there in both containers.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/credbroker/broker.sock";
/// Owner and group may connect: the manager and the sidecar share a group in the pod.
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;
/// Linux's `sockaddr_un.sun_path` is 108 bytes, the last one the terminating NUL; a longer
/// path cannot be bound at all.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;
/// Connections held open on the socket at once: a Kueue manager restarting with 1 000 worker
/// clusters opens about 1 000 at once (one per shim), so twice that; well under the fd limit
/// the broker raises itself to. At the cap, the oldest connection without a call in flight is
/// closed to make room (see `conn.rs`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 2_048;
/// The design's default bound. One entry is a few hundred bytes, so this is a few MiB at most.
pub const DEFAULT_MAX_ENTRIES: u64 = 10_000;
/// Longer than the longest cloud token lifetime we serve (AKS tokens live 60–90 min), so an
/// entry that client-go still comes back to is not aged out between two of its visits.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);
/// Upstream calls one provider may run at once, sized for the 2-core sidecar: a call is
/// mostly waiting on the network (a Go plugin such as kubelogin uses ~50 ms of CPU in a
/// ~250 ms run; cloud token endpoints answer in 100–300 ms), so 16 in flight keep about two
/// cores busy at a plugin's start-up cost and ~100 fds, where 600 cold clusters used to start
/// 600 plugins at once. 1 000 cold clusters at 250 ms a call are served in about 16 s, inside
/// the shim's 30 s `--timeout`.
pub const DEFAULT_MAX_CONCURRENT_FETCHES: usize = 16;
/// Above this the cap stops meaning anything: each exec fetch holds a process and its pipes,
/// and 4 096 is already eight times a common soft fd limit.
pub const MAX_CONCURRENT_FETCHES_CEILING: usize = 4096;
/// client-go's own default wait for an exec plugin is none; 30 s matches the shim's default
/// `--timeout`, so a wrapped plugin never outlives the caller waiting for it.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// A wrapped plugin that prints no `expirationTimestamp` is run again after this long: the
/// lifetime of an EKS token, the shortest of the common cloud tokens.
pub const DEFAULT_EXEC_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// A file token that is not a JWT carries no expiry; it is re-read after this long (and
/// earlier whenever the file changes).
pub const DEFAULT_FILE_LIFETIME: Duration = Duration::from_secs(60 * 60);
/// A Secret token that is not a JWT carries no expiry; client-go is told to come back after
/// half of this (the cache's refresh rule). A rotated Secret is served at once through the
/// watch whatever this says, so it only bounds how long a caller keeps a token unasked.
pub const DEFAULT_SECRET_LIFETIME: Duration = Duration::from_secs(60 * 60);
/// cluster-inventory-api's secretreader plugin (KEP-5339) reads this key, and OCM's
/// managed-serviceaccount token Secrets hold the token under it too.
pub const DEFAULT_SECRET_KEY: &str = "token";
/// secretreader's layout: one Secret per cluster, named after the ClusterProfile.
pub const DEFAULT_SECRET_NAME_TEMPLATE: &str = "{clusterName}";
/// The ExecCredential version most plugins speak; older ones speak only v1beta1.
pub const DEFAULT_EXEC_API_VERSION: &str = EXEC_API_V1;
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
pub const EXEC_API_V1: &str = "client.authentication.k8s.io/v1";
pub const EXEC_API_V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// The configuration used by `credbroker serve` without `--config`: one provider per cloud on
/// that cloud's ambient credentials.
pub const EMBEDDED_DEFAULT: &str = include_str!("default-config.yaml");

/// Why a configuration was refused. Every message names the file and the YAML path.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {path}: {message}")]
    Invalid {
        file: String,
        path: String,
        message: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    #[serde(default)]
    pub socket: SocketConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    #[serde(default)]
    pub rate_limit: RateLimitConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SocketConfig {
    #[serde(default = "default_socket_path")]
    pub path: PathBuf,
    #[serde(default)]
    pub mode: FileMode,
    /// When this or `allowedGids` is set, only callers whose uid (from SO_PEERCRED) is in
    /// `allowedUids` or whose gid is in `allowedGids` may ask for tokens.
    #[serde(default)]
    pub allowed_uids: Option<Vec<u32>>,
    #[serde(default)]
    pub allowed_gids: Option<Vec<u32>>,
    /// Who may call AdminService; unset means the broker's own uid and root.
    #[serde(default)]
    pub admin_uids: Option<Vec<u32>>,
    /// Cap on connections held open at once on the socket.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}

impl SocketConfig {
    /// A warning when `mode` lets every local user connect (o+w) and no allow list narrows
    /// who gets tokens: then any process on the node may ask for any cluster's credential.
    pub fn open_to_everyone_warning(&self) -> Option<String> {
        let open = self.mode.0 & 0o002 != 0;
        (open && self.allowed_uids.is_none() && self.allowed_gids.is_none()).then(|| {
            format!(
                "socket.mode {:04o} lets every local user connect and neither socket.allowedUids nor socket.allowedGids is set: any process on the node can get tokens; narrow socket.mode (e.g. \"0660\") or set an allow list",
                self.mode.0
            )
        })
    }
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self {
            path: default_socket_path(),
            mode: FileMode::default(),
            allowed_uids: None,
            allowed_gids: None,
            admin_uids: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// A Kueue manager restarting with 1 000 worker clusters runs 1 000 shims at once, all
/// under one uid: twice that fits in the bucket.
pub const DEFAULT_RATE_LIMIT_BURST: u32 = 2_000;
/// In steady state client-go runs the plugin per cluster about once per token lifetime
/// (≥ 15 min): 1 000 clusters make about one call per second. 200/s leaves room for
/// re-authentication storms (every cluster answering 401) and still stops a runaway loop.
pub const DEFAULT_RATE_LIMIT_PER_SECOND: u32 = 200;

/// Per-caller (uid) token bucket for TokenService and AdminService calls; health is exempt.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitConfig {
    #[serde(default = "default_rate_per_second")]
    pub per_second: u32,
    #[serde(default = "default_rate_burst")]
    pub burst: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_second: DEFAULT_RATE_LIMIT_PER_SECOND,
            burst: DEFAULT_RATE_LIMIT_BURST,
        }
    }
}

fn default_rate_per_second() -> u32 {
    DEFAULT_RATE_LIMIT_PER_SECOND
}
fn default_rate_burst() -> u32 {
    DEFAULT_RATE_LIMIT_BURST
}

/// A whole GetToken request on the wire. What client-go sends is a few hundred bytes plus the
/// cluster's CA bundle (below); 64 KiB leaves room for both, where tonic's own default (4 MiB)
/// let a caller park megabytes per call in the cache.
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 64 * 1024;
/// A provider name: configured names are short identifiers; 253 is the longest Kubernetes
/// object name, far more than any sensible name.
pub const DEFAULT_MAX_PROVIDER_NAME_BYTES: u32 = 253;
/// The cluster's exec extension (`spec.cluster.config`) as JSON text: the keys the providers
/// read (`clusterName`, `region`, `roleArn` …) take a few hundred bytes.
pub const DEFAULT_MAX_CLUSTER_CONFIG_BYTES: u32 = 16 * 1024;
/// Nesting of the exec extension: the providers read flat keys; a few levels for plugins that
/// take structured input. prost's decoder stops at 100 nested messages, about
/// [`MAX_CLUSTER_CONFIG_DEPTH_CEILING`] levels of the extension, whatever this says.
pub const DEFAULT_MAX_CLUSTER_CONFIG_DEPTH: u32 = 8;
/// Keys (and list items) in the whole exec extension, all levels together.
pub const DEFAULT_MAX_CLUSTER_CONFIG_KEYS: u32 = 256;
/// `server`, `tlsServerName`, `proxyUrl`, and each key and string value of the exec
/// extension: URLs past 2 KiB are refused by many proxies; twice that is generous.
pub const DEFAULT_MAX_FIELD_BYTES: u32 = 4 * 1024;
/// `certificate-authority-data`: a PEM certificate is 1–2 KiB; 48 KiB holds a bundle of about
/// 30 and still fits in [`DEFAULT_MAX_REQUEST_BYTES`] with the rest of the request.
pub const DEFAULT_MAX_CERTIFICATE_AUTHORITY_BYTES: u32 = 48 * 1024;
/// The deepest exec extension prost can decode (its recursion limit of 100 nested messages,
/// three per level of a `google.protobuf.Struct`, less the request's own two levels).
pub const MAX_CLUSTER_CONFIG_DEPTH_CEILING: u32 = 30;

/// Bounds on what a caller sends, checked when a request is parsed, before anything is
/// stored, logged or counted (`limits:`; all sizes in bytes). Bound at start-up.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LimitsConfig {
    pub max_request_bytes: u32,
    pub max_provider_name_bytes: u32,
    pub max_cluster_config_bytes: u32,
    pub max_cluster_config_depth: u32,
    pub max_cluster_config_keys: u32,
    pub max_field_bytes: u32,
    pub max_certificate_authority_bytes: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_provider_name_bytes: DEFAULT_MAX_PROVIDER_NAME_BYTES,
            max_cluster_config_bytes: DEFAULT_MAX_CLUSTER_CONFIG_BYTES,
            max_cluster_config_depth: DEFAULT_MAX_CLUSTER_CONFIG_DEPTH,
            max_cluster_config_keys: DEFAULT_MAX_CLUSTER_CONFIG_KEYS,
            max_field_bytes: DEFAULT_MAX_FIELD_BYTES,
            max_certificate_authority_bytes: DEFAULT_MAX_CERTIFICATE_AUTHORITY_BYTES,
        }
    }
}

impl LimitsConfig {
    /// Each limit's config key and value, for validation and for messages.
    pub fn entries(&self) -> [(&'static str, u32); 7] {
        [
            ("limits.maxRequestBytes", self.max_request_bytes),
            ("limits.maxProviderNameBytes", self.max_provider_name_bytes),
            (
                "limits.maxClusterConfigBytes",
                self.max_cluster_config_bytes,
            ),
            (
                "limits.maxClusterConfigDepth",
                self.max_cluster_config_depth,
            ),
            ("limits.maxClusterConfigKeys", self.max_cluster_config_keys),
            ("limits.maxFieldBytes", self.max_field_bytes),
            (
                "limits.maxCertificateAuthorityBytes",
                self.max_certificate_authority_bytes,
            ),
        ]
    }

    fn validate(&self) -> Result<(), (String, String)> {
        for (key, value) in self.entries() {
            if value == 0 {
                return Err((key.into(), "must be at least 1".into()));
            }
        }
        if self.max_cluster_config_depth > MAX_CLUSTER_CONFIG_DEPTH_CEILING {
            return Err((
                "limits.maxClusterConfigDepth".into(),
                format!(
                    "must be at most {MAX_CLUSTER_CONFIG_DEPTH_CEILING}: the gRPC decoder refuses deeper messages anyway"
                ),
            ));
        }
        Ok(())
    }
}

fn default_socket_path() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET_PATH)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CacheConfig {
    #[serde(default = "default_max_entries")]
    pub max_entries: u64,
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: ConfigDuration,
    /// Per provider: callers, background refreshes and AdminService refreshes share it.
    #[serde(default = "default_max_concurrent_fetches")]
    pub max_concurrent_fetches: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            idle_timeout: default_idle_timeout(),
            max_concurrent_fetches: DEFAULT_MAX_CONCURRENT_FETCHES,
        }
    }
}

fn default_max_entries() -> u64 {
    DEFAULT_MAX_ENTRIES
}
fn default_max_concurrent_fetches() -> usize {
    DEFAULT_MAX_CONCURRENT_FETCHES
}
fn default_idle_timeout() -> ConfigDuration {
    ConfigDuration(DEFAULT_IDLE_TIMEOUT)
}

/// Prometheus endpoint (served by the operations work; accepted and validated here).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsConfig {
    pub address: String,
}

/// One named provider: what the shim's `--provider` names.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderConfig {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ProviderKind,
    #[serde(default)]
    pub aws: Option<AwsConfig>,
    #[serde(default)]
    pub gcp: Option<GcpConfig>,
    #[serde(default)]
    pub azure: Option<AzureConfig>,
    #[serde(default)]
    pub exec: Option<ExecConfig>,
    #[serde(default)]
    pub file: Option<FileConfig>,
    #[serde(default)]
    pub kubernetes_secret: Option<KubernetesSecretConfig>,
    /// Per-cluster keys that select an identity or a secret, and the glob patterns of the
    /// values a cluster's exec extension may set them to; any other value is refused
    /// (`providers::overrides`). Empty: every such per-cluster key is refused.
    #[serde(default)]
    pub allow_overrides: BTreeMap<String, Vec<String>>,
}

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

/// `type: aws`: EKS tokens signed with credentials from the AWS SDK's default chain,
/// optionally through an assumed role. Every key is a default a cluster's exec extension
/// may override (`region`, `roleArn`, `externalId`, `sessionName`), except `stsEndpoint`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AwsConfig {
    /// Region of the clusters' STS endpoint, when a cluster names none.
    pub region: Option<String>,
    /// Role to assume (with the chain's credentials) before signing.
    pub role_arn: Option<String>,
    /// `ExternalId` for AssumeRole, when the role's trust policy requires one.
    pub external_id: Option<String>,
    /// `RoleSessionName` for AssumeRole (shows up in CloudTrail).
    pub session_name: Option<String>,
    /// Which STS host the token names (default regional).
    pub sts_endpoint: Option<AwsStsEndpoint>,
}

/// Which STS endpoint an EKS token is presigned for.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum AwsStsEndpoint {
    /// `sts.<region>.amazonaws.com`: what `aws eks get-token` uses, and the only kind that
    /// works in opt-in regions.
    #[default]
    Regional,
    /// `sts.amazonaws.com` (signed for us-east-1), for authenticators configured for it only.
    Global,
}

/// IAM's limits for `RoleSessionName` and `ExternalId` (AssumeRole API reference).
const AWS_SESSION_NAME_LEN: std::ops::RangeInclusive<usize> = 2..=64;
const AWS_EXTERNAL_ID_LEN: std::ops::RangeInclusive<usize> = 2..=1224;
/// Longest region name in use is 14 characters (ap-southeast-1); room for future ones.
const AWS_REGION_MAX_LEN: usize = 32;

impl AwsConfig {
    fn validate(&self) -> Result<(), (String, String)> {
        let checks = [
            (
                "region",
                self.region.as_deref(),
                Self::check_region as fn(&str) -> _,
            ),
            ("roleArn", self.role_arn.as_deref(), Self::check_role_arn),
            (
                "externalId",
                self.external_id.as_deref(),
                Self::check_external_id,
            ),
            (
                "sessionName",
                self.session_name.as_deref(),
                Self::check_session_name,
            ),
        ];
        for (field, value, check) in checks {
            if let Some(value) = value {
                check(value).map_err(|m| (field.to_owned(), m))?;
            }
        }
        Ok(())
    }

    /// A region name such as `us-west-2`. It becomes part of a host name, so nothing else.
    pub fn check_region(region: &str) -> Result<(), String> {
        let ok = !region.is_empty()
            && region.len() <= AWS_REGION_MAX_LEN
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !region.starts_with('-')
            && !region.ends_with('-');
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{region:?} is not an AWS region name like us-west-2"
            ))
        }
    }

    /// An IAM role ARN: `arn:<partition>:iam::<12-digit account>:role/<path/name>`.
    pub fn check_role_arn(arn: &str) -> Result<(), String> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let ok = parts.len() == 6
            && parts[0] == "arn"
            && !parts[1].is_empty()
            && parts[2] == "iam"
            && parts[3].is_empty()
            && parts[4].len() == 12
            && parts[4].bytes().all(|b| b.is_ascii_digit())
            && parts[5].len() > "role/".len()
            && parts[5].starts_with("role/");
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{arn:?} is not an IAM role ARN like arn:aws:iam::111122223333:role/name"
            ))
        }
    }

    /// IAM's rule for `ExternalId`: 2–1224 of `[\w+=,.@:/-]`.
    pub fn check_external_id(id: &str) -> Result<(), String> {
        if AWS_EXTERNAL_ID_LEN.contains(&id.len()) && id.bytes().all(|b| iam_char(b, b":/")) {
            Ok(())
        } else {
            // The value may be a shared secret with the role's owner: never echo it.
            Err("must be 2 to 1224 characters of letters, digits and +=,.@:/-_".into())
        }
    }

    /// IAM's rule for `RoleSessionName`: 2–64 of `[\w+=,.@-]`.
    pub fn check_session_name(name: &str) -> Result<(), String> {
        if AWS_SESSION_NAME_LEN.contains(&name.len()) && name.bytes().all(|b| iam_char(b, b"")) {
            Ok(())
        } else {
            Err(format!(
                "{name:?} is not a session name: 2 to 64 characters of letters, digits and +=,.@-_"
            ))
        }
    }
}

/// A character IAM allows in names and ids: `[\w+=,.@-]` plus `extra`.
fn iam_char(b: u8, extra: &[u8]) -> bool {
    b.is_ascii_alphanumeric() || b"_+=,.@-".contains(&b) || extra.contains(&b)
}

/// `type: gcp`. Every field is optional: with none, Application Default Credentials and the
/// scopes `gke-gcloud-auth-plugin` asks for.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GcpConfig {
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

impl GcpConfig {
    /// Checks the fields; the returned path is relative to the `gcp` section.
    fn validate(&self) -> Result<(), (String, String)> {
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
mod gcp_config_tests {
    use super::*;

    fn gcp(section: &str) -> Result<Config, String> {
        let text = format!("providers:\n  - name: gke\n    type: gcp\n    gcp: {section}\n");
        Config::parse(&text, "t.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn gcp_fields_parse() {
        let config = gcp(
            "{scopes: [a, b], impersonateServiceAccount: kueue@p.iam.gserviceaccount.com, \
             delegates: [d@p.iam.gserviceaccount.com], credentialsFile: /var/run/gcp/key.json, \
             iamCredentialsEndpoint: \"http://127.0.0.1:8080\"}",
        )
        .unwrap();
        let g = config.providers[0].gcp.clone().unwrap();
        assert_eq!(g.scopes.unwrap(), ["a", "b"]);
        assert_eq!(
            g.credentials_file.unwrap(),
            Path::new("/var/run/gcp/key.json")
        );
        assert_eq!(g.iam_credentials_endpoint.unwrap(), "http://127.0.0.1:8080");
        // No section at all is fine: ADC with the default scopes.
        Config::parse("providers:\n  - {name: gke, type: gcp}\n", "t").unwrap();
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
/// `type: azure`: Entra ID (AAD) tokens for AKS clusters with Entra ID integration. Every
/// key is optional: with none, `credential: auto` on the pod's environment and the AKS AAD
/// server application as the audience. `serverId` and `tenantId` are defaults a cluster's
/// exec extension may override.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AzureConfig {
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

impl AzureConfig {
    /// Checks the fields; the returned path is relative to the `azure` section.
    fn validate(&self) -> Result<(), (String, String)> {
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
mod azure_config_tests {
    use super::*;

    fn azure(section: &str) -> Result<AzureConfig, String> {
        let text = format!("providers:\n  - name: aks\n    type: azure\n    azure: {section}\n");
        Config::parse(&text, "t.yaml")
            .map(|c| c.providers[0].azure.clone().unwrap_or_default())
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
        Config::parse("providers:\n  - {name: aks, type: azure}\n", "t").unwrap();
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

/// Wraps an existing kubeconfig exec plugin, adding the cache and single-flight.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecConfig {
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

/// A token kept in a file, e.g. a projected ServiceAccount token per cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    /// May contain `{clusterName}`, taken from the cluster's exec extension.
    pub path: String,
    #[serde(default = "default_file_lifetime")]
    pub lifetime: ConfigDuration,
}

fn default_file_lifetime() -> ConfigDuration {
    ConfigDuration(DEFAULT_FILE_LIFETIME)
}

/// Credentials kept in Secrets of one namespace of the cluster the broker runs in (or the
/// one a development kubeconfig points at), one Secret per worker cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSecretConfig {
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
    /// Only Secrets matching this label selector are watched (and served).
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

/// Unix permission bits written as a quoted octal string, e.g. "0660".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode(pub u32);

impl Default for FileMode {
    fn default() -> Self {
        Self(DEFAULT_SOCKET_MODE)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // YAML 1.1 and 1.2 disagree on whether an unquoted 0660 is octal (our parser keeps it
        // as the text "0660"); a plain number like 660 is refused rather than guessed at.
        let value = serde_json::Value::deserialize(d)?;
        let text = value.as_str().ok_or_else(|| {
            serde::de::Error::custom(format!(
                "file mode must be a quoted octal string like \"0660\", got {value}"
            ))
        })?;
        // Octal digits only: `from_str_radix` alone would take "+660", and a "0o" prefix is
        // Rust's spelling, not chmod's.
        let octal = (1..=4).contains(&text.len()) && text.bytes().all(|b| matches!(b, b'0'..=b'7'));
        match u32::from_str_radix(text, 8) {
            Ok(mode) if octal && mode <= 0o777 => Ok(Self(mode)),
            _ => Err(serde::de::Error::custom(format!(
                "invalid file mode {text:?}: expected octal permission bits from \"0000\" to \"0777\", like \"0660\""
            ))),
        }
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        use std::io::Read as _;
        let file = path.display().to_string();
        let read_error = |source| ConfigError::Read {
            file: file.clone(),
            source,
        };
        // Never more than the size limit plus one byte, from whatever the path names.
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| {
                f.take(yaml::MAX_CONFIG_BYTES as u64 + 1)
                    .read_to_string(&mut text)
            })
            .map_err(read_error)?;
        Self::parse(&text, &file)
    }

    /// The built-in configuration of `credbroker serve` without `--config`: the cloud
    /// providers this build has (a slim build offers only what it can serve).
    pub fn embedded_default() -> Result<Self, ConfigError> {
        const SOURCE: &str = "<embedded default>";
        let mut config = Self::parse(EMBEDDED_DEFAULT, SOURCE)?;
        config.providers.retain(|p| p.kind.built_in());
        if config.providers.is_empty() {
            return Err(ConfigError::Invalid {
                file: SOURCE.to_owned(),
                path: "providers".to_owned(),
                message: "this build has none of the cloud providers (Cargo features aws, gcp, azure); pass --config".to_owned(),
            });
        }
        Ok(config)
    }

    /// Parses and validates YAML text; `file` names the source in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        let invalid = |path: String, message: String| ConfigError::Invalid {
            file: file.to_owned(),
            path,
            message,
        };
        // YAML → a JSON tree first: syntax errors keep their line and column, and the typed
        // pass below reports plain messages at paths like `providers[0].exec.timeout`.
        let tree = yaml::parse(text).map_err(|e| invalid(e.path, e.message))?;
        let tree = if tree.is_null() {
            serde_json::json!({})
        } else {
            tree
        };
        let config: Self = serde_path_to_error::deserialize(tree).map_err(|e| {
            let path = match e.path().to_string() {
                p if p == "." => "(top level)".to_owned(),
                p => p,
            };
            invalid(path, e.inner().to_string())
        })?;
        config
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        Ok(config)
    }

    /// Checks what the types alone cannot; returns the YAML path and the reason.
    fn validate(&self) -> Result<(), (String, String)> {
        if !self.socket.path.is_absolute() {
            return Err((
                "socket.path".into(),
                format!("must be an absolute path, got {:?}", self.socket.path),
            ));
        }
        let path_bytes = self.socket.path.as_os_str().len();
        if path_bytes > MAX_SOCKET_PATH_BYTES {
            return Err((
                "socket.path".into(),
                format!(
                    "{path_bytes} bytes is longer than a Unix socket address allows ({MAX_SOCKET_PATH_BYTES}); choose a shorter path"
                ),
            ));
        }
        if self.socket.max_connections == 0 {
            return Err(("socket.maxConnections".into(), "must be at least 1".into()));
        }
        if self.cache.max_entries == 0 {
            return Err(("cache.maxEntries".into(), "must be at least 1".into()));
        }
        if !(1..=MAX_CONCURRENT_FETCHES_CEILING).contains(&self.cache.max_concurrent_fetches) {
            return Err((
                "cache.maxConcurrentFetches".into(),
                format!(
                    "must be between 1 and {MAX_CONCURRENT_FETCHES_CEILING} (upstream calls per provider at once), got {}",
                    self.cache.max_concurrent_fetches
                ),
            ));
        }
        if self.rate_limit.per_second == 0 {
            return Err(("rateLimit.perSecond".into(), "must be at least 1".into()));
        }
        if self.rate_limit.burst == 0 {
            return Err(("rateLimit.burst".into(), "must be at least 1".into()));
        }
        if self.cache.idle_timeout.0.is_zero() {
            return Err(("cache.idleTimeout".into(), "must be longer than 0s".into()));
        }
        self.limits.validate()?;
        if let Some(metrics) = &self.metrics {
            metrics
                .address
                .parse::<std::net::SocketAddr>()
                .map_err(|e| {
                    (
                        "metrics.address".into(),
                        format!(
                            "{:?} is not an address like 0.0.0.0:9090: {e}",
                            metrics.address
                        ),
                    )
                })?;
        }
        if self.providers.is_empty() {
            return Err(("providers".into(), "at least one provider is needed".into()));
        }
        let mut names = HashSet::new();
        for (i, provider) in self.providers.iter().enumerate() {
            let at = |field: &str| format!("providers[{i}].{field}");
            provider
                .validate()
                .map_err(|(field, msg)| (at(&field), msg))?;
            if provider.name.len() > self.limits.max_provider_name_bytes as usize {
                return Err((
                    at("name"),
                    format!(
                        "is {} bytes, longer than limits.maxProviderNameBytes ({}): callers could not name it",
                        provider.name.len(),
                        self.limits.max_provider_name_bytes
                    ),
                ));
            }
            if !names.insert(provider.name.as_str()) {
                return Err((
                    at("name"),
                    format!("duplicate provider name {:?}", provider.name),
                ));
            }
        }
        Ok(())
    }
}

impl ProviderConfig {
    /// Validates one provider; the returned path is relative to the provider.
    fn validate(&self) -> Result<(), (String, String)> {
        let valid_name = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid_name {
            return Err((
                "name".into(),
                format!(
                    "{:?} is not a provider name: use letters, digits, '-', '_' or '.'",
                    self.name
                ),
            ));
        }
        let sections = [
            (ProviderKind::Aws, self.aws.is_some()),
            (ProviderKind::Gcp, self.gcp.is_some()),
            (ProviderKind::Azure, self.azure.is_some()),
            (ProviderKind::Exec, self.exec.is_some()),
            (ProviderKind::File, self.file.is_some()),
            (
                ProviderKind::KubernetesSecret,
                self.kubernetes_secret.is_some(),
            ),
        ];
        for (kind, present) in sections {
            if present && kind != self.kind {
                return Err((
                    kind.as_str().into(),
                    format!(
                        "a {kind} section on a provider of type {}; move it to a provider of type {kind} or remove it",
                        self.kind
                    ),
                ));
            }
        }
        let section = match self.kind {
            ProviderKind::Exec => {
                let exec = self.exec.as_ref().ok_or_else(|| {
                    (
                        "exec".into(),
                        "type exec needs an exec section with a command".into(),
                    )
                })?;
                exec.validate().map_err(|(f, m)| (format!("exec.{f}"), m))
            }
            ProviderKind::File => {
                let file = self.file.as_ref().ok_or_else(|| {
                    (
                        "file".into(),
                        "type file needs a file section with a path".into(),
                    )
                })?;
                file.validate().map_err(|(f, m)| (format!("file.{f}"), m))
            }
            ProviderKind::Aws => match &self.aws {
                Some(aws) => aws.validate().map_err(|(f, m)| (format!("aws.{f}"), m)),
                None => Ok(()),
            },
            ProviderKind::Gcp => match &self.gcp {
                Some(gcp) => gcp.validate().map_err(|(f, m)| (format!("gcp.{f}"), m)),
                None => Ok(()),
            },
            ProviderKind::Azure => match &self.azure {
                Some(azure) => azure.validate().map_err(|(f, m)| (format!("azure.{f}"), m)),
                None => Ok(()),
            },
            ProviderKind::KubernetesSecret => {
                let secret = self.kubernetes_secret.as_ref().ok_or_else(|| {
                    (
                        "kubernetesSecret".into(),
                        "type kubernetesSecret needs a kubernetesSecret section with a namespace"
                            .into(),
                    )
                })?;
                secret
                    .validate()
                    .map_err(|(f, m)| (format!("kubernetesSecret.{f}"), m))
            }
        };
        section?;
        crate::providers::overrides::validate(self)
    }
}

impl ExecConfig {
    fn validate(&self) -> Result<(), (String, String)> {
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
        let cap = crate::cache::UPSTREAM_TIMEOUT;
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
                        crate::text::quote(name)
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl FileConfig {
    fn validate(&self) -> Result<(), (String, String)> {
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

impl KubernetesSecretConfig {
    fn validate(&self) -> Result<(), (String, String)> {
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
        if let Some(selector) = &self.label_selector
            && selector.trim().is_empty()
        {
            return Err((
                "labelSelector".into(),
                "must not be empty; leave it out to watch every Secret of the namespace".into(),
            ));
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

fn is_placeholder_name(name: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text, "test.yaml").unwrap_err().to_string()
    }

    const EXEC: &str =
        "providers:\n  - name: onprem\n    type: exec\n    exec: {command: /bin/plugin}\n";

    #[test]
    fn embedded_default_follows_the_features() {
        let built: Vec<&str> = [
            ("aws", cfg!(feature = "aws")),
            ("gcp", cfg!(feature = "gcp")),
            ("azure", cfg!(feature = "azure")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        match Config::embedded_default() {
            Ok(config) => {
                let names: Vec<_> = config.providers.iter().map(|p| p.name.as_str()).collect();
                assert_eq!(names, built);
                assert_eq!(config.socket.path, Path::new(DEFAULT_SOCKET_PATH));
            }
            Err(e) => {
                assert!(built.is_empty(), "{e}");
                assert!(e.to_string().contains("pass --config"), "{e}");
            }
        }
        // The full default, whatever this build has, is valid.
        assert_eq!(
            Config::parse(EMBEDDED_DEFAULT, "t")
                .unwrap()
                .providers
                .len(),
            3
        );
    }

    #[test]
    fn defaults_apply() {
        let config = Config::parse(EXEC, "t").unwrap();
        assert_eq!(config.socket.mode, FileMode(0o660));
        assert_eq!(config.cache.max_entries, DEFAULT_MAX_ENTRIES);
        assert_eq!(
            config.cache.max_concurrent_fetches,
            DEFAULT_MAX_CONCURRENT_FETCHES
        );
        let exec = config.providers[0].exec.as_ref().unwrap();
        assert_eq!(exec.timeout.0, DEFAULT_EXEC_TIMEOUT);
        assert_eq!(exec.api_version, EXEC_API_V1);
    }

    #[test]
    fn full_example_parses() {
        let text = r#"
socket: {path: /run/cb.sock, mode: "0600", allowedUids: [65532]}
cache: {maxEntries: 5, idleTimeout: 30m, maxConcurrentFetches: 4}
metrics: {address: "0.0.0.0:9090"}
providers:
  - name: eks
    type: aws
    aws: {region: us-west-2, roleArn: "arn:aws:iam::111122223333:role/kueue", stsEndpoint: regional}
  - name: gke
    type: gcp
    gcp: {scopes: [https://www.googleapis.com/auth/cloud-platform]}
  - name: aks
    type: azure
    azure: {serverId: 6dae42f8-4368-4678-94ff-3960e28e3630}
  - name: onprem
    type: exec
    exec: {command: /plugins/bin/kubelogin, args: [get-token], env: {A: b}, timeout: 10s, apiVersion: client.authentication.k8s.io/v1beta1}
  - name: static
    type: file
    file: {path: "/var/run/secrets/clusters/{clusterName}/token", lifetime: 2h}
"#;
        let config = Config::parse(text, "t").unwrap();
        assert_eq!(config.socket.mode, FileMode(0o600));
        // Unquoted, a leading zero still reads as the octal the operator meant.
        let unquoted =
            Config::parse(&format!("socket: {{path: /a, mode: 0640}}\n{EXEC}"), "t").unwrap();
        assert_eq!(unquoted.socket.mode, FileMode(0o640));
        assert_eq!(config.socket.allowed_uids, Some(vec![65532]));
        assert_eq!(config.cache.idle_timeout.0, Duration::from_secs(1800));
        assert_eq!(config.cache.max_concurrent_fetches, 4);
        assert_eq!(config.providers.len(), 5);
        assert_eq!(
            config.providers[3].exec.as_ref().unwrap().timeout.0,
            Duration::from_secs(10)
        );
        assert_eq!(
            config.providers[4].file.as_ref().unwrap().lifetime.0,
            Duration::from_secs(7200)
        );
    }

    #[test]
    fn limits_have_defaults_and_are_validated() {
        let config = Config::parse(EXEC, "t").unwrap();
        assert_eq!(config.limits, LimitsConfig::default());
        assert_eq!(config.limits.max_request_bytes, 65_536);
        let config = Config::parse(
            &format!("limits: {{maxRequestBytes: 1048576, maxClusterConfigDepth: 3}}\n{EXEC}"),
            "t",
        )
        .unwrap();
        assert_eq!(config.limits.max_request_bytes, 1_048_576);
        assert_eq!(config.limits.max_cluster_config_depth, 3);
        assert_eq!(
            config.limits.max_field_bytes, DEFAULT_MAX_FIELD_BYTES,
            "unset keys keep their default"
        );
        for (body, want) in [
            ("limits: {maxBytes: 1}", "limits.maxBytes: unknown field"),
            (
                "limits: {maxFieldBytes: 0}",
                "limits.maxFieldBytes: must be at least 1",
            ),
            (
                "limits: {maxClusterConfigDepth: 31}",
                "limits.maxClusterConfigDepth: must be at most 30",
            ),
            (
                "limits: {maxRequestBytes: -1}",
                "limits.maxRequestBytes: invalid value",
            ),
            (
                "limits: {maxProviderNameBytes: 3}",
                "providers[0].name: is 6 bytes, longer than limits.maxProviderNameBytes (3)",
            ),
        ] {
            let e = err(&format!("{body}\n{EXEC}"));
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn unknown_key_names_its_path() {
        let e = err(
            "providers:\n  - name: x\n    type: exec\n    exec: {command: /bin/p, bogusKey: 1}\n",
        );
        assert!(e.contains("providers[0].exec.bogusKey"), "{e}");
        let e = err("bogus: 1\nproviders: []\n");
        assert!(
            e.starts_with("test.yaml: bogus: unknown field `bogus`"),
            "{e}"
        );
        let e = err("providers:\n  - name: x\n    type: file\n    file: {path: /t, lifetime: 5}\n");
        assert!(
            e.contains("providers[0].file.lifetime: invalid type: integer `5`"),
            "{e}"
        );
        let e = err("socket: {path: /a, color: red}\n");
        assert!(e.contains("socket.color"), "{e}");
    }

    #[test]
    fn every_field_is_validated() {
        let cases = [
            (
                "socket: {path: rel.sock}\n",
                "socket.path: must be an absolute path",
            ),
            (
                "socket: {path: /a, mode: \"0999\"}\n",
                "socket.mode: invalid file mode",
            ),
            ("socket: {path: /a, mode: 660}\n", "quoted octal string"),
            ("cache: {maxEntries: 0}\n", "cache.maxEntries"),
            (
                "cache: {maxConcurrentFetches: 0}\n",
                "cache.maxConcurrentFetches: must be between 1 and 4096",
            ),
            (
                "cache: {maxConcurrentFetches: 5000}\n",
                "cache.maxConcurrentFetches: must be between 1 and 4096",
            ),
            (
                "rateLimit: {perSecond: 0}\n",
                "rateLimit.perSecond: must be at least 1",
            ),
            (
                "rateLimit: {burst: 0}\n",
                "rateLimit.burst: must be at least 1",
            ),
            (
                "socket: {path: /a, adminUids: [-1]}\n",
                "socket.adminUids[0]: invalid value",
            ),
            (
                "cache: {idleTimeout: 5 parsecs}\n",
                "cache.idleTimeout: invalid duration",
            ),
            ("metrics: {address: nowhere}\n", "metrics.address"),
            ("providers: []\n", "providers: at least one provider"),
            (
                "providers:\n  - {name: a, type: cloud}\n",
                "providers[0].type: unknown variant `cloud`",
            ),
            (
                "providers:\n  - {name: a, type: exec}\n",
                "providers[0].exec: type exec needs",
            ),
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
            (
                "providers:\n  - {name: a, type: file, file: {path: \"/x/{cluster}\"}}\n",
                "providers[0].file.path: unknown placeholder {cluster}",
            ),
            (
                "providers:\n  - {name: a, type: file, file: {path: x}}\n",
                "providers[0].file.path: must be an absolute",
            ),
            (
                "providers:\n  - {name: a, type: aws, exec: {command: /p}}\n",
                "providers[0].exec: a exec section on a provider of type aws",
            ),
            (
                "providers:\n  - {name: 'a b', type: aws}\n",
                "providers[0].name",
            ),
            (
                "providers:\n  - {name: a, type: aws}\n  - {name: a, type: gcp}\n",
                "providers[1].name: duplicate provider name",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn socket_path_length_and_mode_syntax_are_checked() {
        for mode in ["+660", "0o660", "9999", "-0", " 660", "06600", "0x1b6", ""] {
            let e = err(&format!("socket: {{path: /a, mode: \"{mode}\"}}\n{EXEC}"));
            assert!(
                e.contains("socket.mode: invalid file mode"),
                "{mode:?}: {e}"
            );
        }
        for (mode, bits) in [("0660", 0o660), ("660", 0o660), ("0600", 0o600), ("0", 0)] {
            let c = Config::parse(
                &format!("socket: {{path: /a, mode: \"{mode}\"}}\n{EXEC}"),
                "t",
            )
            .unwrap();
            assert_eq!(c.socket.mode, FileMode(bits), "{mode}");
        }
        // sun_path holds 108 bytes with the terminating NUL.
        let longest = format!("/{}", "s".repeat(MAX_SOCKET_PATH_BYTES - 1));
        let c = Config::parse(&format!("socket: {{path: {longest}}}\n{EXEC}"), "t").unwrap();
        assert_eq!(c.socket.path.as_os_str().len(), 107);
        let e = err(&format!("socket: {{path: {longest}x}}\n{EXEC}"));
        assert!(
            e.contains("socket.path: 108 bytes is longer than a Unix socket address allows (107)"),
            "{e}"
        );
        let e = err(&format!("socket: {{maxConnections: 0}}\n{EXEC}"));
        assert!(
            e.contains("socket.maxConnections: must be at least 1"),
            "{e}"
        );
        let c = Config::parse(EXEC, "t").unwrap();
        assert_eq!(c.socket.max_connections, DEFAULT_MAX_CONNECTIONS);
    }

    #[test]
    fn a_world_writable_socket_without_allow_lists_is_warned_about() {
        let warning = |socket: &str| {
            Config::parse(&format!("socket: {socket}\n{EXEC}"), "t")
                .unwrap()
                .socket
                .open_to_everyone_warning()
        };
        let w = warning("{mode: \"0666\"}").unwrap();
        assert!(
            w.contains("socket.mode 0666") && w.contains("allowedUids"),
            "{w}"
        );
        assert!(warning("{mode: \"0662\"}").is_some());
        assert!(warning("{mode: \"0660\"}").is_none());
        assert!(warning("{mode: \"0666\", allowedUids: [1000]}").is_none());
        assert!(warning("{mode: \"0666\", allowedGids: [1000]}").is_none());
    }

    proptest::proptest! {
        /// Any text at all gets a parsed config or an error naming the file: never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "[ -~\n\t]{0,400}") {
            if let Err(e) = Config::parse(&text, "fuzz.yaml") {
                proptest::prop_assert!(e.to_string().starts_with("fuzz.yaml: "), "{e}");
            }
        }

        /// Every unknown key is reported at its own path.
        #[test]
        fn unknown_keys_are_named(key in "[a-z][a-zA-Z]{2,12}") {
            let known = ["name", "type", "command", "args", "env", "timeout", "apiVersion", "defaultLifetime"];
            proptest::prop_assume!(!known.contains(&key.as_str()));
            let text = format!("providers:\n  - name: x\n    type: exec\n    exec: {{command: /p, {key}: 1}}\n");
            let e = Config::parse(&text, "t").unwrap_err().to_string();
            let want = format!("providers[0].exec.{key}");
            proptest::prop_assert!(e.contains(&want), "{e}");
        }
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = err("providers: [\n");
        assert!(e.starts_with("test.yaml: "), "{e}");
        assert!(e.contains("line"), "{e}");
    }

    #[test]
    fn missing_file_names_it() {
        let e = Config::load(Path::new("/nonexistent/credbroker.yaml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/credbroker.yaml: cannot read"),
            "{e}"
        );
    }

    #[test]
    fn aws_section_is_validated() {
        let aws =
            |body: &str| format!("providers:\n  - name: eks\n    type: aws\n    aws: {{{body}}}\n");
        let config = Config::parse(
            &aws("region: us-west-2, roleArn: \"arn:aws:iam::111122223333:role/kueue\", externalId: \"ext-1\", sessionName: kueue-mgr, stsEndpoint: global"),
            "t",
        )
        .unwrap();
        let section = config.providers[0].aws.as_ref().unwrap();
        assert_eq!(section.sts_endpoint, Some(AwsStsEndpoint::Global));
        assert_eq!(section.region.as_deref(), Some("us-west-2"));
        let china = "roleArn: \"arn:aws-cn:iam::111122223333:role/path/to/r\"";
        assert!(Config::parse(&aws(china), "t").is_ok());
        // The embedded default (no section at all) is valid too.
        assert!(Config::parse("providers:\n  - {name: eks, type: aws}\n", "t").is_ok());

        let cases = [
            (
                "region: US_WEST",
                "providers[0].aws.region: \"US_WEST\" is not an AWS region",
            ),
            ("region: \"evil.com/x\"", "providers[0].aws.region"),
            ("region: \"\"", "providers[0].aws.region"),
            (
                "roleArn: kueue",
                "providers[0].aws.roleArn: \"kueue\" is not an IAM role ARN",
            ),
            (
                "roleArn: \"arn:aws:iam::1234:role/x\"",
                "providers[0].aws.roleArn",
            ),
            (
                "roleArn: \"arn:aws:iam::111122223333:user/x\"",
                "providers[0].aws.roleArn",
            ),
            (
                "roleArn: \"arn:aws:iam::111122223333:role/\"",
                "providers[0].aws.roleArn",
            ),
            (
                "externalId: \"a\"",
                "providers[0].aws.externalId: must be 2 to 1224",
            ),
            ("externalId: \"has space\"", "providers[0].aws.externalId"),
            ("sessionName: \"a b\"", "providers[0].aws.sessionName"),
            ("sessionName: x", "providers[0].aws.sessionName"),
            (
                "stsEndpoint: fips",
                "providers[0].aws.stsEndpoint: unknown variant `fips`, expected `regional` or `global`",
            ),
            ("bogus: 1", "providers[0].aws.bogus"),
        ];
        for (body, want) in cases {
            let e = err(&aws(body));
            assert!(e.contains(want), "{body:?}: got {e:?}, want {want:?}");
        }
        // An external id may be a shared secret: its value is never echoed.
        let e = err(&aws("externalId: \"secret value\""));
        assert!(!e.contains("secret value"), "{e}");
    }
}
