//! The broker's YAML configuration: the top level (socket, cache, limits, metrics, rate
//! limit), loading, and errors that name the YAML path. Camel-case keys; unknown keys are
//! rejected with their path. Each provider type's section, its defaults and its checks live
//! in [`providers`], one module per type (this module names each: a registry); value types
//! both sides use are in [`values`]. Nothing here touches the network or the socket.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod providers;
pub mod values;
mod yaml;

use providers::{aws, azure, exec, file, gcp, kubernetes_secret};
pub use values::{ConfigDuration, ProviderKind, Selector};
pub use yaml::{MAX_CONFIG_BYTES, MAX_EXPANDED_BYTES};

/// Where the shim looks when neither `--socket` nor `CREDBROKER_SOCKET` is given (the design's
/// contract); the deploy manifests mount an `emptyDir` there in both containers.
pub use credbroker_proto::DEFAULT_SOCKET_PATH;
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
/// The design's default bound on entries. A typical entry is 1–2 KiB (an EKS entry measured
/// 1 615 bytes, BENCHMARKS.md), so this is 10–20 MiB; [`DEFAULT_MAX_BYTES`] bounds entries
/// that carry the largest requests `limits.*` admits (about 60 KiB each).
pub const DEFAULT_MAX_ENTRIES: u64 = 10_000;
/// The bound on what entries weigh together (their requests, credentials, identities and
/// listed clusters, plus a fixed overhead each; see `cache.rs`). A quarter of the shipped
/// sidecar's 256 Mi memory limit: the rest is the runtime, connections and the requests in
/// flight. 10 000 typical entries fit with room to spare.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Below this an entry carrying the largest admitted request (about 60 KiB) would not fit
/// beside a few others.
pub const MIN_MAX_BYTES: u64 = 1024 * 1024;
/// Longer than the longest cloud token lifetime we serve (AKS tokens live 60–90 min), so an
/// entry that client-go still comes back to is not aged out between two of its visits.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);
/// Upstream calls one provider may run at once, sized for the 2-core sidecar: a call is
/// mostly waiting on the network (a Go plugin such as kubelogin uses ~50 ms of CPU in a
/// ~250 ms run; cloud token endpoints answer in 100–300 ms), so 16 in flight keep about two
/// cores busy at a plugin's start-up cost and ~100 fds, where 600 cold clusters used to start
/// 600 plugins at once. Misses may take 14 of them (2 are kept for refreshes of held
/// credentials, `gate::reserve_of`): 1 000 cold clusters at 250 ms a call are served in about
/// 18 s, inside the shim's 30 s `--timeout`.
pub const DEFAULT_MAX_CONCURRENT_FETCHES: usize = 16;
/// Above this the cap stops meaning anything: each exec fetch holds a process and its pipes,
/// and 4 096 is already eight times a common soft fd limit.
pub const MAX_CONCURRENT_FETCHES_CEILING: usize = 4096;

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

/// The whole configuration, validated ([`Config::parse`], [`Config::load`]).
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: SocketConfig,
    pub cache: CacheConfig,
    pub metrics: Option<MetricsConfig>,
    pub rate_limit: RateLimitConfig,
    pub limits: LimitsConfig,
    pub providers: Vec<ProviderConfig>,
}

/// The file as written: [`Config`] with its provider entries not yet checked
/// ([`ProviderEntry`]); [`ConfigFile::validate`] turns it into a `Config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default)]
    socket: SocketConfig,
    #[serde(default)]
    cache: CacheConfig,
    #[serde(default)]
    metrics: Option<MetricsConfig>,
    #[serde(default)]
    rate_limit: RateLimitConfig,
    #[serde(default)]
    limits: LimitsConfig,
    #[serde(default)]
    providers: Vec<ProviderEntry>,
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
    /// What entries may weigh together, in bytes ([`DEFAULT_MAX_BYTES`]).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
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
            max_bytes: DEFAULT_MAX_BYTES,
            idle_timeout: default_idle_timeout(),
            max_concurrent_fetches: DEFAULT_MAX_CONCURRENT_FETCHES,
        }
    }
}

fn default_max_entries() -> u64 {
    DEFAULT_MAX_ENTRIES
}
fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
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
///
/// Not `Deserialize` itself: an entry is read as written (`ProviderEntry`: `type:` and one
/// optional section per type) and turned into a [`ProviderSpec`] while the file is validated.
/// serde's tagged enums cannot keep the config's messages: a section of another type would
/// be reported as an unknown field instead of "a exec section on a provider of type aws",
/// a missing section would not be named at `providers[0].exec`, and errors inside an
/// internally tagged or flattened entry lose their YAML path (`providers[0].exec.timeout`)
/// because serde buffers the entry before it picks the variant.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub name: String,
    /// Per-cluster keys that select an identity or a secret, and the glob patterns of the
    /// values a cluster's exec extension may set them to; any other value is refused
    /// (`providers::overrides`). Empty: every such per-cluster key is refused.
    pub allow_overrides: BTreeMap<String, Vec<String>>,
    /// The type and its section.
    pub spec: ProviderSpec,
}

impl ProviderConfig {
    /// The provider's `type:`.
    pub fn kind(&self) -> ProviderKind {
        self.spec.kind()
    }
}

/// A provider's type and its section, owned by the provider's own config module
/// (`config::providers::<type>`). Those modules compile in every build, so a broker built
/// without a type still parses, checks and explains an entry of that type.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderSpec {
    Exec(exec::Config),
    File(file::Config),
    /// A missing `aws:` section is the default one (the SDK's chain, regional STS).
    Aws(aws::Config),
    /// A missing `gcp:` section is the default one (ADC, the default scopes).
    Gcp(gcp::Config),
    /// A missing `azure:` section is the default one (`credential: auto`, AKS's server id).
    Azure(azure::Config),
    KubernetesSecret(kubernetes_secret::Config),
}

impl ProviderSpec {
    /// The `type:` this section belongs to.
    pub fn kind(&self) -> ProviderKind {
        match self {
            Self::Exec(_) => ProviderKind::Exec,
            Self::File(_) => ProviderKind::File,
            Self::Aws(_) => ProviderKind::Aws,
            Self::Gcp(_) => ProviderKind::Gcp,
            Self::Azure(_) => ProviderKind::Azure,
            Self::KubernetesSecret(_) => ProviderKind::KubernetesSecret,
        }
    }

    /// The per-cluster keys of this entry that select an identity or a secret, as each type's
    /// config module declares them (`OVERRIDE_KEYS`, and kubernetesSecret's name
    /// placeholders): what `allowOverrides` may name and `providers::overrides` checks.
    pub fn selector_keys(&self) -> Vec<Selector> {
        match self {
            Self::Aws(_) => aws::OVERRIDE_KEYS.iter().map(Selector::from).collect(),
            Self::Azure(_) => azure::OVERRIDE_KEYS.iter().map(Selector::from).collect(),
            Self::KubernetesSecret(secret) => secret.selector_keys(),
            Self::Gcp(_) | Self::Exec(_) | Self::File(_) => Vec::new(),
        }
    }

    /// The per-cluster keys of this type that only describe or locate the cluster: always
    /// allowed, listed so that `allowOverrides` naming one gets a precise answer.
    pub fn locating_keys(&self) -> &'static [&'static str] {
        match self {
            Self::Aws(_) => aws::LOCATING_KEYS,
            Self::Azure(_) => azure::LOCATING_KEYS,
            Self::KubernetesSecret(_) => kubernetes_secret::LOCATING_KEYS,
            Self::Gcp(_) => gcp::LOCATING_KEYS,
            Self::Exec(_) => exec::LOCATING_KEYS,
            Self::File(_) => file::LOCATING_KEYS,
        }
    }

    /// Checks the section; the returned path is relative to the provider entry.
    fn validate(&self) -> Result<(), (String, String)> {
        let checked = match self {
            Self::Exec(exec) => exec.validate(),
            Self::File(file) => file.validate(),
            Self::Aws(aws) => aws.validate(),
            Self::Gcp(gcp) => gcp.validate(),
            Self::Azure(azure) => azure.validate(),
            Self::KubernetesSecret(secret) => secret.validate(),
        };
        checked.map_err(|(field, message)| (format!("{}.{field}", self.kind()), message))
    }
}

/// A `providers[]` entry as written: `type:` and a section per type, each optional, so a
/// misplaced or missing section gets its own message at its own path (see [`ProviderConfig`]).
/// The field order is the one serde lists in "expected one of" messages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProviderEntry {
    name: String,
    #[serde(rename = "type")]
    kind: ProviderKind,
    #[serde(default)]
    aws: Option<aws::Config>,
    #[serde(default)]
    gcp: Option<gcp::Config>,
    #[serde(default)]
    azure: Option<azure::Config>,
    #[serde(default)]
    exec: Option<exec::Config>,
    #[serde(default)]
    file: Option<file::Config>,
    #[serde(default)]
    kubernetes_secret: Option<kubernetes_secret::Config>,
    #[serde(default)]
    allow_overrides: BTreeMap<String, Vec<String>>,
}

impl ProviderEntry {
    /// Checks one entry and keeps the section its type uses; the returned path is relative
    /// to the entry.
    fn into_config(self) -> Result<ProviderConfig, (String, String)> {
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
        let spec = match self.kind {
            ProviderKind::Exec => ProviderSpec::Exec(self.exec.ok_or_else(|| {
                (
                    "exec".into(),
                    "type exec needs an exec section with a command".into(),
                )
            })?),
            ProviderKind::File => ProviderSpec::File(self.file.ok_or_else(|| {
                (
                    "file".into(),
                    "type file needs a file section with a path".into(),
                )
            })?),
            ProviderKind::Aws => ProviderSpec::Aws(self.aws.unwrap_or_default()),
            ProviderKind::Gcp => ProviderSpec::Gcp(self.gcp.unwrap_or_default()),
            ProviderKind::Azure => ProviderSpec::Azure(self.azure.unwrap_or_default()),
            ProviderKind::KubernetesSecret => {
                ProviderSpec::KubernetesSecret(self.kubernetes_secret.ok_or_else(|| {
                    (
                        "kubernetesSecret".into(),
                        "type kubernetesSecret needs a kubernetesSecret section with a namespace"
                            .into(),
                    )
                })?)
            }
        };
        spec.validate()?;
        let config = ProviderConfig {
            name: self.name,
            allow_overrides: self.allow_overrides,
            spec,
        };
        config.validate_allow_overrides()?;
        Ok(config)
    }
}

impl ProviderConfig {
    /// Checks `allowOverrides` against the type's selector keys; the returned path is
    /// relative to the entry. Works from the config alone (not the built provider), so
    /// `check-config` validates it for every type, compiled in or not.
    fn validate_allow_overrides(&self) -> Result<(), (String, String)> {
        if self.allow_overrides.is_empty() {
            return Ok(());
        }
        let keys = self.spec.selector_keys();
        let kind = self.kind();
        for (name, patterns) in &self.allow_overrides {
            let at = format!("allowOverrides.{name}");
            if !keys.iter().any(|k| k.name == name.as_str()) {
                let message = if self.spec.locating_keys().contains(&name.as_str()) {
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
}

/// A pattern to suggest for `allowOverrides.<key>` in an error.
fn example_pattern(key: &str) -> &'static str {
    match key {
        "roleArn" => "arn:aws:iam::111122223333:role/kueue-*",
        "tenantId" => "11111111-2222-3333-4444-555555555555",
        "serverId" => "6dae42f8-4368-4678-94ff-3960e28e3630",
        _ => "team-*",
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
        use std::os::unix::fs::OpenOptionsExt as _;
        // Never more than the size limit plus one byte, and only from a regular file (a FIFO
        // put in its place blocked a SIGHUP reload, and then shutdown, forever).
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(crate::base::files::OPEN_FLAGS)
            .open(path)
            .map_err(read_error)?;
        let meta = opened.metadata().map_err(read_error)?;
        if !meta.is_file() {
            return Err(read_error(std::io::Error::other(format!(
                "not a regular file (it is a {}); point --config at a file",
                crate::base::files::kind_of(&meta)
            ))));
        }
        let mut text = String::new();
        opened
            .take(yaml::MAX_CONFIG_BYTES as u64 + 1)
            .read_to_string(&mut text)
            .map_err(read_error)?;
        Self::parse(&text, &file)
    }

    /// The built-in configuration of `credbroker serve` without `--config`: the cloud
    /// providers this build has (a slim build offers only what it can serve).
    pub fn embedded_default() -> Result<Self, ConfigError> {
        const SOURCE: &str = "<embedded default>";
        let mut config = Self::parse(EMBEDDED_DEFAULT, SOURCE)?;
        config.providers.retain(|p| p.kind().built_in());
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
        // Anything but a mapping would be read as a tuple of the top-level sections, so a
        // `providers:` fragment pasted on its own (a list) was reported against `socket`.
        if !tree.is_object() {
            let (what, hint) = match &tree {
                serde_json::Value::Array(_) => (
                    "a list",
                    "; a list of provider entries goes under `providers:`",
                ),
                serde_json::Value::String(_) => ("a string", ""),
                _ => ("a scalar", ""),
            };
            return Err(invalid(
                "(top level)".to_owned(),
                format!(
                    "the document is {what}, but a credbroker config is a mapping with the \
                     keys socket, cache, metrics, rateLimit, limits and providers{hint}"
                ),
            ));
        }
        let written: ConfigFile = serde_path_to_error::deserialize(tree).map_err(|e| {
            let path = match e.path().to_string() {
                p if p == "." => "(top level)".to_owned(),
                p => p,
            };
            invalid(path, e.inner().to_string())
        })?;
        written
            .validate()
            .map_err(|(path, message)| invalid(path, message))
    }
}

impl ConfigFile {
    /// Checks what the types alone cannot and keeps each provider's own section; returns the
    /// YAML path and the reason.
    fn validate(self) -> Result<Config, (String, String)> {
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
        if self.cache.max_bytes < MIN_MAX_BYTES {
            return Err((
                "cache.maxBytes".into(),
                format!(
                    "must be at least {MIN_MAX_BYTES} (1 MiB), got {}: an entry with the largest request the limits admit weighs about 60 KiB",
                    self.cache.max_bytes
                ),
            ));
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
        let mut providers: Vec<ProviderConfig> = Vec::with_capacity(self.providers.len());
        let mut names = HashSet::new();
        for (i, entry) in self.providers.into_iter().enumerate() {
            let at = |field: &str| format!("providers[{i}].{field}");
            let provider = entry
                .into_config()
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
            if !names.insert(provider.name.clone()) {
                return Err((
                    at("name"),
                    format!("duplicate provider name {:?}", provider.name),
                ));
            }
            providers.push(provider);
        }
        Ok(Config {
            socket: self.socket,
            cache: self.cache,
            metrics: self.metrics,
            rate_limit: self.rate_limit,
            limits: self.limits,
            providers,
        })
    }
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
        let ProviderSpec::Exec(exec) = &config.providers[3].spec else {
            panic!("{:?}", config.providers[3]);
        };
        assert_eq!(exec.timeout.0, Duration::from_secs(10));
        let ProviderSpec::File(file) = &config.providers[4].spec else {
            panic!("{:?}", config.providers[4]);
        };
        assert_eq!(file.lifetime.0, Duration::from_secs(7200));
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
                "cache: {maxBytes: 1000}\n",
                "cache.maxBytes: must be at least 1048576 (1 MiB), got 1000",
            ),
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
}
