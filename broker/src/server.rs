//! The gRPC side: `TokenService` over the Unix socket, with health and reflection, and the
//! one table that turns every error into a `tonic::Status`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use credbroker_proto::code_name;
use credbroker_proto::v1::admin_service_server::AdminServiceServer;
use credbroker_proto::v1::token_service_server::{TokenService, TokenServiceServer};
use credbroker_proto::v1::{GetTokenRequest, GetTokenResponse};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Code, Request, Response, Status};
use tonic_health::ServingStatus;

use crate::admin::{AdminApi, ProviderHealth};
use crate::cache::{
    Cache, CacheError, CacheKey, CacheObserver, CacheSettings, Served, UPSTREAM_TIMEOUT,
};
use crate::config::{Config, LimitsConfig, ProviderConfig};
use crate::conn::{self, ActivityLayer, ConnLimiter};
use crate::metrics::{self, Metrics, MetricsError};
use crate::providers::overrides::{self, OverrideError};
use crate::providers::{self, CredentialSecret, Provider, ProviderError};
use crate::ratelimit::RateLimitLayer;
use crate::request::{RequestError, TokenRequest, cluster_label_of};
use crate::socket::{self, SocketError};
use crate::text::{self, one_line, quote};
use crate::wire::WireErrors;

/// In-flight calls get this long to finish after SIGTERM: well inside Kubernetes' default
/// 30 s termination grace period, and far longer than a cache hit takes.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// A status message travels in an HTTP/2 trailer (clients refuse header lists past 16 KiB,
/// and grpc-message is percent-encoded, up to three bytes per byte): whatever a provider or
/// a caller put in it, the message is cut to this many bytes.
const MAX_STATUS_MESSAGE_BYTES: usize = 2048;
/// How many characters of an upstream error a log line quotes: a provider's error with its
/// quoted plugin or upstream output fits, a runaway one does not fill the log.
const MAX_LOGGED_ERROR_CHARS: usize = 1024;
/// Accepted connections waiting for the server: a Kueue restart opens a thousand at once,
/// and the server takes them off this queue in microseconds.
const ACCEPT_QUEUE: usize = 1024;
/// HTTP/2 PINGs on a connection quiet for this long, to find peers that vanished without
/// closing (a frozen process keeps its socket open): grpc-go's server pings every 2 h by
/// default; a minute frees a dead peer's connection well within the idle timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// A peer that does not answer a PING within this long is gone: grpc-go's default.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a `GetToken` call failed. Turned into a status in exactly one place, below.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("permission denied: caller uid {} is not in {list}", .uid.map_or_else(|| "(unknown)".to_owned(), |u| u.to_string()))]
    CallerNotAllowed {
        uid: Option<u32>,
        list: &'static str,
    },
    #[error("{0}")]
    BadSelection(String),
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error("unknown provider \"{}\" (configured: {known})", quote(.name))]
    UnknownProvider { name: String, known: String },
    #[error("provider \"{}\", cluster \"{}\": {source}", quote(.provider), quote(.cluster))]
    Provider {
        provider: String,
        cluster: String,
        source: CacheError,
    },
    /// The cluster's exec config picks an identity or a secret the provider does not allow.
    /// Refused before the cache: nothing cached is touched.
    #[error("provider {provider:?}, cluster \"{cluster}\": {source}")]
    OverrideRefused {
        provider: String,
        cluster: String,
        source: Box<OverrideError>,
    },
}

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Self {
        let code = match &e {
            BrokerError::CallerNotAllowed { .. } | BrokerError::OverrideRefused { .. } => {
                Code::PermissionDenied
            }
            BrokerError::BadRequest(_) | BrokerError::BadSelection(_) => Code::InvalidArgument,
            BrokerError::UnknownProvider { .. } => Code::NotFound,
            BrokerError::Provider { source, .. } => cache_code(source),
        };
        Status::new(code, cut(e.to_string(), MAX_STATUS_MESSAGE_BYTES))
    }
}

/// `text` cut to at most `max` bytes on a character boundary, saying how long it was.
fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("…({total} bytes)"));
    text
}

fn cache_code(e: &CacheError) -> Code {
    match e {
        CacheError::Provider(p) => match p {
            ProviderError::InvalidRequest(_) => Code::InvalidArgument,
            ProviderError::NotFound(_) => Code::NotFound,
            ProviderError::Denied(_) => Code::PermissionDenied,
            ProviderError::Unavailable(_) => Code::Unavailable,
            ProviderError::Timeout(_) => Code::DeadlineExceeded,
            ProviderError::Unimplemented(_) => Code::Unimplemented,
        },
        CacheError::BackingOff { last, .. } => cache_code(last),
        CacheError::UpstreamTimeout(_) => Code::DeadlineExceeded,
        CacheError::Expired | CacheError::ExpiresTooSoon(_) | CacheError::Busy { .. } => {
            Code::Unavailable
        }
        CacheError::Internal(_) => Code::Internal,
    }
}

/// Who is calling, from SO_PEERCRED on the Unix socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl Peer {
    /// The caller of a gRPC request (unknown when the transport is not a Unix socket).
    pub fn of<T>(request: &Request<T>) -> Self {
        let cred = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred);
        Self {
            uid: cred.map(|c| c.uid()),
            gid: cred.map(|c| c.gid()),
        }
    }
}

/// A configured provider and the config it was built from (to tell, on reload, whether
/// it changed).
#[derive(Debug, Clone)]
pub struct Configured {
    pub config: ProviderConfig,
    pub provider: Arc<dyn Provider>,
}

/// What a reload swaps atomically: requests hold a snapshot, so none fails mid-swap.
#[derive(Debug)]
struct Runtime {
    providers: BTreeMap<String, Configured>,
    allowed_uids: Option<Vec<u32>>,
    allowed_gids: Option<Vec<u32>>,
    admin_uids: Vec<u32>,
}

impl Runtime {
    fn new(config: &Config, providers: BTreeMap<String, Configured>) -> Self {
        let admin_uids = config
            .socket
            .admin_uids
            .clone()
            .unwrap_or_else(|| vec![nix::unistd::geteuid().as_raw(), 0]);
        Self {
            providers,
            allowed_uids: config.socket.allowed_uids.clone(),
            allowed_gids: config.socket.allowed_gids.clone(),
            admin_uids,
        }
    }

    fn may_get_tokens(&self, peer: Peer) -> bool {
        if self.allowed_uids.is_none() && self.allowed_gids.is_none() {
            return true;
        }
        let listed = |ids: &Option<Vec<u32>>, id: Option<u32>| {
            ids.as_ref()
                .is_some_and(|ids| id.is_some_and(|id| ids.contains(&id)))
        };
        listed(&self.allowed_uids, peer.uid) || listed(&self.allowed_gids, peer.gid)
    }
}

/// What a reload changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub kept: Vec<String>,
    pub replaced: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub invalidated: usize,
}

/// Answers token requests: authorises the caller, picks the provider, asks the cache.
#[derive(Debug)]
pub struct Broker {
    runtime: RwLock<Arc<Runtime>>,
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    health: Arc<ProviderHealth>,
    /// Bound at start-up, like the gRPC decoder's size limit they go with.
    limits: LimitsConfig,
}

impl Broker {
    pub fn new(config: &Config) -> Self {
        let providers = config
            .providers
            .iter()
            .map(|p| {
                let configured = Configured {
                    config: p.clone(),
                    provider: providers::build(p),
                };
                (p.name.clone(), configured)
            })
            .collect();
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(ProviderHealth::default());
        let telemetry = Arc::new(Telemetry {
            metrics: metrics.clone(),
            health: health.clone(),
        });
        let cache = Cache::new(CacheSettings {
            max_entries: config.cache.max_entries,
            idle_timeout: config.cache.idle_timeout.0,
            upstream_timeout: UPSTREAM_TIMEOUT,
            max_concurrent_fetches: config.cache.max_concurrent_fetches,
        })
        .with_observer(telemetry);
        Self {
            runtime: RwLock::new(Arc::new(Runtime::new(config, providers))),
            cache: Arc::new(cache),
            metrics,
            health,
            limits: config.limits,
        }
    }

    /// What callers may send.
    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// The `provider` label for `name` in metrics: a configured provider's name, else one
    /// fixed label, so that callers cannot mint label values.
    pub fn metric_label<'a>(&self, name: &'a str) -> &'a str {
        if self.runtime().providers.contains_key(name) {
            name
        } else {
            metrics::UNKNOWN_PROVIDER
        }
    }

    fn runtime(&self) -> Arc<Runtime> {
        self.runtime
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn health(&self) -> &ProviderHealth {
        &self.health
    }

    /// The configured providers, in name order.
    pub fn providers(&self) -> Vec<Configured> {
        self.runtime().providers.values().cloned().collect()
    }

    /// The provider currently configured under `name`.
    pub fn provider(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.runtime()
            .providers
            .get(name)
            .map(|c| c.provider.clone())
    }

    /// Refuses callers outside `socket.adminUids`.
    pub fn authorize_admin(&self, peer: Peer) -> Result<(), BrokerError> {
        let runtime = self.runtime();
        if peer
            .uid
            .is_some_and(|uid| runtime.admin_uids.contains(&uid))
        {
            Ok(())
        } else {
            Err(BrokerError::CallerNotAllowed {
                uid: peer.uid,
                list: "socket.adminUids",
            })
        }
    }

    /// One `GetToken`, from an already-identified caller.
    pub async fn get_token(
        &self,
        peer: Peer,
        msg: GetTokenRequest,
    ) -> Result<(Served, TokenRequest), BrokerError> {
        let runtime = self.runtime();
        if !runtime.may_get_tokens(peer) {
            return Err(BrokerError::CallerNotAllowed {
                uid: peer.uid,
                list: "socket.allowedUids/allowedGids",
            });
        }
        let req = TokenRequest::from_proto(msg, &self.limits)?;
        let provider = &runtime
            .providers
            .get(&req.provider)
            .ok_or_else(|| BrokerError::UnknownProvider {
                name: req.provider.clone(),
                known: runtime
                    .providers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?
            .provider;
        let failed = |source: CacheError| BrokerError::Provider {
            provider: req.provider.clone(),
            cluster: req.cluster_label(),
            source,
        };
        // Before the provider reads the request: its identity, the cache and the fetch only
        // ever see per-cluster keys the provider's config allows.
        if let Some(configured) = runtime.providers.get(&req.provider) {
            overrides::check(&configured.config, &req).map_err(|source| {
                BrokerError::OverrideRefused {
                    provider: req.provider.clone(),
                    cluster: text::quote(&req.cluster_label()),
                    source: Box::new(source),
                }
            })?;
        }
        let identity = provider.identity(&req).map_err(|e| failed(e.into()))?;
        let key = CacheKey {
            provider: req.provider.as_str().into(),
            identity,
        };
        match self.cache.get(key, provider, &req).await {
            Ok(served) => Ok((served, req)),
            Err(e) => Err(failed(e)),
        }
    }

    /// Applies a new config: providers whose config is unchanged keep their instance and
    /// cache entries; changed and removed ones lose their entries; access lists take
    /// effect at once. Settings bound at start-up (socket, cache size, metrics address,
    /// rate limit) need a restart: the caller warns about them.
    pub fn reload(&self, config: &Config) -> Reloaded {
        let old = self.runtime();
        let mut done = Reloaded::default();
        let mut providers = BTreeMap::new();
        for p in &config.providers {
            let configured = match old.providers.get(&p.name) {
                Some(current) if current.config == *p => {
                    done.kept.push(p.name.clone());
                    current.clone()
                }
                current => {
                    let list = if current.is_some() {
                        &mut done.replaced
                    } else {
                        &mut done.added
                    };
                    list.push(p.name.clone());
                    Configured {
                        config: p.clone(),
                        provider: providers::build(p),
                    }
                }
            };
            providers.insert(p.name.clone(), configured);
        }
        done.removed = old
            .providers
            .keys()
            .filter(|n| !providers.contains_key(*n))
            .cloned()
            .collect();
        *self.runtime.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Runtime::new(config, providers));
        done.invalidated = self.cache.invalidate(|key| {
            done.replaced
                .iter()
                .chain(&done.removed)
                .any(|name| **name == *key.provider)
        });
        done
    }
}

/// Feeds every upstream call the cache makes into the metrics and provider health, and
/// logs failures at warn.
struct Telemetry {
    metrics: Arc<Metrics>,
    health: Arc<ProviderHealth>,
}

impl CacheObserver for Telemetry {
    fn upstream_call(
        &self,
        provider: &str,
        elapsed: Duration,
        result: Result<(), &CacheError>,
        background: bool,
    ) {
        self.metrics
            .upstream(provider, elapsed, result.is_ok(), background);
        self.health.record(provider, result);
        if let Err(error) = result {
            let error = one_line(&error.to_string(), MAX_LOGGED_ERROR_CHARS);
            tracing::warn!(provider, background, ?elapsed, %error, "upstream call failed");
        }
    }
}

/// The tonic service over [`Broker`].
#[derive(Debug, Clone)]
pub struct TokenApi {
    broker: Arc<Broker>,
}

#[tonic::async_trait]
impl TokenService for TokenApi {
    async fn get_token(
        &self,
        request: Request<GetTokenRequest>,
    ) -> Result<Response<GetTokenResponse>, Status> {
        let started = std::time::Instant::now();
        let peer = Peer::of(&request);
        let msg = request.into_inner();
        // Caller text, bounded and escaped before it goes near a log line or a metric.
        let provider = quote(&msg.provider);
        let cluster = cluster_label_of(&msg);
        let label = self.broker.metric_label(&msg.provider).to_owned();
        let result = self.broker.get_token(peer, msg).await;
        let elapsed = started.elapsed();
        match result {
            Ok((served, _)) => {
                self.broker
                    .metrics
                    .request(&label, Code::Ok, Some(served.outcome));
                tracing::info!(provider, cluster, code = code_name(Code::Ok), outcome = ?served.outcome, ?elapsed, uid = ?peer.uid, "GetToken");
                Ok(Response::new(response(served)))
            }
            Err(e) => {
                let status = Status::from(e);
                self.broker.metrics.request(&label, status.code(), None);
                tracing::warn!(provider, cluster, code = code_name(status.code()), ?elapsed, uid = ?peer.uid, error = status.message(), "GetToken");
                Err(status)
            }
        }
    }
}

/// client-go's `expirationTimestamp` has whole seconds: a come-back time truncated to its
/// second could lie in the past when it is less than a second away, and client-go would run
/// the plugin again at once. Rounding up keeps it in the future; it stays under a second past
/// the end of the serving window, so still at least 59 s before the credential expires.
fn whole_second_after(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn response(served: Served) -> GetTokenResponse {
    let mut out = GetTokenResponse {
        expiration_time: Some(prost_types::Timestamp::from(whole_second_after(
            served.come_back,
        ))),
        ..Default::default()
    };
    match served.credential.secret {
        CredentialSecret::Token(token) => out.token = token.expose().to_owned(),
        CredentialSecret::ClientCertificate {
            certificate_pem,
            key_pem,
        } => {
            out.client_certificate_data = certificate_pem;
            out.client_key_data = key_pem.expose().to_owned();
        }
    }
    out
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("metrics.address {0:?} is not an address like 0.0.0.0:9090")]
    MetricsAddress(String),
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the gRPC server task ended abnormally: {0}")]
    Crashed(String),
}

/// What `credbroker serve` runs with.
#[derive(Debug)]
pub struct ServeOptions {
    pub config: Config,
    /// The file to read again on SIGHUP; `None` for the embedded default.
    pub config_path: Option<PathBuf>,
    pub socket: PathBuf,
}

/// Serves until `shutdown` resolves, then stops accepting, gives in-flight calls
/// [`SHUTDOWN_GRACE`] to finish, and removes the socket. SIGHUP reloads the config file.
pub async fn serve(
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let ServeOptions {
        config,
        config_path,
        socket: socket_path,
    } = options;
    let broker = Arc::new(Broker::new(&config));
    let sweeper = broker.cache().spawn_idle_sweeper();
    let (listener, socket_guard) = socket::bind(&socket_path, config.socket.mode.0)?;
    if let Some(warning) = config.socket.open_to_everyone_warning() {
        tracing::warn!(socket = %socket_path.display(), "{warning}");
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    let (conn_tx, conn_rx) = tokio::sync::mpsc::channel(ACCEPT_QUEUE);
    let keeper = {
        let health = health.clone();
        socket::SocketKeeper::start(
            socket_path.clone(),
            config.socket.mode.0,
            listener,
            socket_guard,
            conn_tx,
            move |back| {
                let health = health.clone();
                let status = if back {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                tokio::spawn(async move { health.set_service_status("", status).await });
            },
        )
    };
    let metrics_task = match &config.metrics {
        Some(m) => {
            let address = m
                .address
                .parse()
                .map_err(|_| ServeError::MetricsAddress(m.address.clone()))?;
            Some(metrics::serve(address, broker.metrics().clone(), broker.cache().clone()).await?)
        }
        None => None,
    };
    let reloader = tokio::spawn(reload_on_sighup(
        broker.clone(),
        config.clone(),
        config_path,
    ));

    health.set_serving::<TokenServiceServer<TokenApi>>().await;
    health.set_serving::<AdminServiceServer<AdminApi>>().await;
    health.set_service_status("", ServingStatus::Serving).await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(credbroker_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let cap = match conn::soft_fd_limit() {
        Some(fds) => conn::cap_for_fd_limit(config.socket.max_connections, fds),
        None => config.socket.max_connections,
    };
    if cap < config.socket.max_connections {
        tracing::warn!(
            configured = config.socket.max_connections,
            cap,
            "socket.maxConnections lowered to what the open files limit leaves room for; raise the limit (ulimit -n) to hold more"
        );
    }
    let limiter = ConnLimiter::new("socket", cap);
    let incoming = ReceiverStream::new(conn_rx).filter_map(move |accepted| match accepted {
        Ok(stream) => limiter.admit(stream).map(Ok),
        Err(e) => Some(Err(e)),
    });

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .layer(ActivityLayer)
        .layer(RateLimitLayer::new(
            &config.rate_limit,
            broker.metrics().rate_limited(),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(WireErrors::new(
            TokenServiceServer::new(TokenApi {
                broker: broker.clone(),
            })
            .max_decoding_message_size(config.limits.max_request_bytes as usize),
            broker.clone(),
        ))
        .add_service(WireErrors::new(
            AdminServiceServer::new(AdminApi::new(broker.clone()))
                .max_decoding_message_size(config.limits.max_request_bytes as usize),
            broker.clone(),
        ))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    let mut server = tokio::spawn(server);
    tracing::info!(
        socket = %socket_path.display(),
        providers = ?config.providers.iter().map(|p| format!("{} ({})", p.name, p.kind)).collect::<Vec<_>>(),
        "credbroker serving"
    );

    let result = tokio::select! {
        // The server only ends on its own when it fails.
        ended = &mut server => server_ended(ended),
        () = shutdown => {
            tracing::info!("shutting down: no new connections, in-flight calls get {}s", SHUTDOWN_GRACE.as_secs());
            health.set_service_status("", ServingStatus::NotServing).await;
            health.set_not_serving::<TokenServiceServer<TokenApi>>().await;
            health.set_not_serving::<AdminServiceServer<AdminApi>>().await;
            keeper.stop();
            let _ = stop_tx.send(());
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(ended) => server_ended(ended),
                Err(_) => {
                    tracing::warn!("in-flight calls did not finish within {}s; closing them", SHUTDOWN_GRACE.as_secs());
                    server.abort();
                    Ok(())
                }
            }
        }
    };
    reloader.abort();
    sweeper.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
    tracing::info!(socket = %socket_path.display(), "credbroker stopped; socket removed");
    result
}

/// Reads the config file again on every SIGHUP. A file that does not parse or validate
/// is logged and ignored: the broker keeps serving on what it has.
async fn reload_on_sighup(broker: Arc<Broker>, running: Config, path: Option<PathBuf>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGHUP ({e}); config reload is off");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        let Some(path) = &path else {
            tracing::warn!(
                "SIGHUP: running on the embedded default config; there is no file to reload"
            );
            continue;
        };
        // Reading and parsing is file I/O and bounded-but-real CPU work: off the runtime's
        // workers, so a large file never delays a GetToken.
        let next = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || Config::load(&path)).await
        };
        let next = match next {
            Ok(Ok(next)) => next,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: config not reloaded; still serving the previous one");
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: config not reloaded (the parser failed); still serving the previous one");
                continue;
            }
        };
        for what in restart_only_changes(&running, &next) {
            tracing::warn!("SIGHUP: changes to {what} take effect at the next restart");
        }
        let done = broker.reload(&next);
        tracing::info!(
            kept = ?done.kept, replaced = ?done.replaced, added = ?done.added, removed = ?done.removed,
            invalidated = done.invalidated, "SIGHUP: config reloaded"
        );
    }
}

/// The settings bound at start-up that `next` changes. Compared with the config the
/// process started with (what is really running), not the last file loaded: a change is
/// pending until the restart, however many reloads come between.
fn restart_only_changes(running: &Config, next: &Config) -> Vec<&'static str> {
    [
        (
            "socket.path, socket.mode and socket.maxConnections",
            next.socket.path != running.socket.path
                || next.socket.mode != running.socket.mode
                || next.socket.max_connections != running.socket.max_connections,
        ),
        (
            "cache.maxEntries, cache.idleTimeout and cache.maxConcurrentFetches",
            next.cache.max_entries != running.cache.max_entries
                || next.cache.idle_timeout != running.cache.idle_timeout
                || next.cache.max_concurrent_fetches != running.cache.max_concurrent_fetches,
        ),
        (
            "metrics.address",
            next.metrics.as_ref().map(|m| &m.address)
                != running.metrics.as_ref().map(|m| &m.address),
        ),
        ("rateLimit", next.rate_limit != running.rate_limit),
        ("limits", next.limits != running.limits),
    ]
    .into_iter()
    .filter_map(|(what, changed)| changed.then_some(what))
    .collect()
}

/// How the server task ended: its own error, or a panic (never a clean exit to hide).
fn server_ended(
    ended: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), ServeError> {
    ended
        .map_err(|e| ServeError::Crashed(e.to_string()))?
        .map_err(ServeError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(yaml: &str) -> Broker {
        Broker::new(&Config::parse(yaml, "t").unwrap())
    }

    fn msg(provider: &str) -> GetTokenRequest {
        GetTokenRequest {
            provider: provider.into(),
            ..Default::default()
        }
    }

    const FILE: &str = "providers:\n  - {name: f, type: file, file: {path: \"/nonexistent/{clusterName}\"}}\n  - {name: cloud, type: aws}\n";

    #[tokio::test]
    async fn errors_map_to_the_designed_codes() {
        let b = broker(FILE);
        let code = |r: Result<_, BrokerError>| Status::from(r.unwrap_err()).code();
        assert_eq!(
            code(b.get_token(Peer::default(), msg("nope")).await),
            Code::NotFound
        );
        assert_eq!(
            code(b.get_token(Peer::default(), msg("")).await),
            Code::InvalidArgument
        );
        // file provider without clusterName → INVALID_ARGUMENT naming provider and cluster.
        let err = b.get_token(Peer::default(), msg("f")).await.unwrap_err();
        let status = Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("provider \"f\", cluster \"(no cluster info)\""),
            "{}",
            status.message()
        );
        // A cloud provider asked without cluster info cannot tell which cluster to sign for.
        assert_eq!(
            code(b.get_token(Peer::default(), msg("cloud")).await),
            Code::InvalidArgument
        );
        let unknown = Status::from(b.get_token(Peer::default(), msg("nope")).await.unwrap_err());
        assert_eq!(
            unknown.message(),
            "unknown provider \"nope\" (configured: cloud, f)"
        );
    }

    #[tokio::test]
    async fn identity_overrides_are_permission_denied_before_the_provider() {
        let b = broker(FILE);
        let mut fields = std::collections::BTreeMap::new();
        for (k, v) in [
            ("clusterName", "w1"),
            ("roleArn", "arn:aws:iam::111122223333:role/admin"),
        ] {
            let kind = prost_types::value::Kind::StringValue(v.into());
            fields.insert(k.to_owned(), prost_types::Value { kind: Some(kind) });
        }
        let mut asked = msg("cloud");
        asked.cluster = Some(credbroker_proto::v1::Cluster {
            server: "https://w1.example".into(),
            config: Some(prost_types::Struct { fields }),
            ..Default::default()
        });
        let err = b.get_token(Peer::default(), asked).await.unwrap_err();
        assert!(
            matches!(err, BrokerError::OverrideRefused { .. }),
            "{err:?}"
        );
        let status = Status::from(err);
        assert_eq!(status.code(), Code::PermissionDenied);
        assert!(
            status.message().starts_with(
                "provider \"cloud\", cluster \"w1\": override refused: the cluster's exec config sets roleArn"
            ),
            "{}",
            status.message()
        );
        assert!(
            status
                .message()
                .contains("allowOverrides: {roleArn: [\"arn:aws:iam::111122223333:role/admin\"]}"),
            "{}",
            status.message()
        );
        assert!(b.cache().entries().is_empty(), "refused before the cache");

        // Allowed by a reload, then refused again by the next one: the running config decides.
        let asked = || {
            let mut m = msg("cloud");
            m.cluster = Some(credbroker_proto::v1::Cluster {
                server: "https://w1.example".into(),
                config: Some(prost_types::Struct {
                    fields: [("roleArn", "arn:aws:iam::111122223333:role/admin")]
                        .into_iter()
                        .map(|(k, v)| {
                            let kind = prost_types::value::Kind::StringValue(v.into());
                            (k.to_owned(), prost_types::Value { kind: Some(kind) })
                        })
                        .collect(),
                }),
                ..Default::default()
            });
            m
        };
        let allowing = FILE.replace(
            "type: aws}",
            "type: aws, allowOverrides: {roleArn: [\"arn:aws:iam::111122223333:role/*\"]}}",
        );
        b.reload(&Config::parse(&allowing, "t").unwrap());
        let err = b.get_token(Peer::default(), asked()).await.unwrap_err();
        assert!(
            !matches!(err, BrokerError::OverrideRefused { .. }),
            "allowed now, so the provider sees it: {err}"
        );
        b.reload(&Config::parse(FILE, "t").unwrap());
        let err = b.get_token(Peer::default(), asked()).await.unwrap_err();
        assert!(matches!(err, BrokerError::OverrideRefused { .. }), "{err}");
    }

    #[tokio::test]
    async fn allowed_uids_are_enforced() {
        let b = broker(&format!(
            "socket: {{path: /x, allowedUids: [1000]}}\n{FILE}"
        ));
        for uid in [None, Some(0), Some(1001)] {
            let peer = Peer { uid, gid: Some(5) };
            let status = Status::from(b.get_token(peer, msg("nope")).await.unwrap_err());
            assert_eq!(status.code(), Code::PermissionDenied, "{uid:?}");
            assert!(
                status.message().contains("permission denied"),
                "{}",
                status.message()
            );
        }
        let allowed = Peer {
            uid: Some(1000),
            gid: None,
        };
        let status = Status::from(b.get_token(allowed, msg("nope")).await.unwrap_err());
        assert_eq!(
            status.code(),
            Code::NotFound,
            "an allowed uid gets past the check"
        );
        // allowedGids admits by group too.
        let b = broker(&format!(
            "socket: {{path: /x, allowedUids: [1000], allowedGids: [44]}}\n{FILE}"
        ));
        let by_group = Peer {
            uid: Some(1001),
            gid: Some(44),
        };
        let status = Status::from(b.get_token(by_group, msg("nope")).await.unwrap_err());
        assert_eq!(status.code(), Code::NotFound);
        let refused = BrokerError::CallerNotAllowed {
            uid: Some(7),
            list: "socket.allowedUids/allowedGids",
        };
        assert_eq!(
            Status::from(refused).message(),
            "permission denied: caller uid 7 is not in socket.allowedUids/allowedGids"
        );
    }

    #[test]
    fn admin_defaults_to_own_uid_and_root() {
        let b = broker(FILE);
        let me = nix::unistd::geteuid().as_raw();
        assert!(
            b.authorize_admin(Peer {
                uid: Some(me),
                gid: None
            })
            .is_ok()
        );
        assert!(
            b.authorize_admin(Peer {
                uid: Some(0),
                gid: None
            })
            .is_ok()
        );
        let err = b
            .authorize_admin(Peer {
                uid: Some(4242),
                gid: None,
            })
            .unwrap_err();
        assert_eq!(Status::from(err).code(), Code::PermissionDenied);
        let b = broker(&format!("socket: {{path: /x, adminUids: [4242]}}\n{FILE}"));
        assert!(
            b.authorize_admin(Peer {
                uid: Some(4242),
                gid: None
            })
            .is_ok()
        );
        assert!(
            b.authorize_admin(Peer {
                uid: Some(0),
                gid: None
            })
            .is_err()
        );
        assert!(b.authorize_admin(Peer::default()).is_err());
    }

    #[tokio::test]
    async fn reload_keeps_unchanged_providers_and_their_entries() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b"] {
            std::fs::write(dir.path().join(name), format!("token-{name}")).unwrap();
        }
        let yaml = |b_lifetime: &str, extra: &str| {
            format!(
                "providers:\n  - {{name: a, type: file, file: {{path: {d}/a}}}}\n  - {{name: b, type: file, file: {{path: {d}/b, lifetime: {b_lifetime}}}}}\n{extra}",
                d = dir.path().display()
            )
        };
        let b = broker(&yaml("1h", ""));
        for p in ["a", "b"] {
            b.get_token(Peer::default(), msg(p)).await.unwrap();
        }
        assert_eq!(b.cache().entry_count(), 2);
        let a_before = b.provider("a").unwrap();
        let next = Config::parse(&yaml("2h", "  - {name: c, type: aws}\n"), "t").unwrap();
        let done = b.reload(&next);
        assert_eq!(done.kept, ["a"]);
        assert_eq!(done.replaced, ["b"]);
        assert_eq!(done.added, ["c"]);
        assert_eq!(done.invalidated, 1);
        assert!(
            Arc::ptr_eq(&a_before, &b.provider("a").unwrap()),
            "unchanged provider kept"
        );
        let entries = b.cache().entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(&*entries[0].key.provider, "a");
        let removed = b.reload(&Config::parse(&yaml("2h", ""), "t").unwrap());
        assert_eq!(removed.removed, ["c"]);
        assert!(b.provider("c").is_none());
    }

    #[test]
    fn restart_warnings_compare_with_what_is_running() {
        let started = Config::parse(
            "socket: {mode: \"0660\"}\nproviders: [{name: f, type: file, file: {path: /t}}]\n",
            "t",
        )
        .unwrap();
        let changed = Config::parse(
            "socket: {mode: \"0600\"}\nproviders: [{name: f, type: file, file: {path: /t}}]\n",
            "t",
        )
        .unwrap();
        // The first reload with a new mode warns; a second reload of the same file still
        // does (the running socket has the old mode); going back to the running mode does not.
        assert_eq!(
            restart_only_changes(&started, &changed),
            ["socket.path, socket.mode and socket.maxConnections"]
        );
        assert_eq!(
            restart_only_changes(&started, &changed),
            ["socket.path, socket.mode and socket.maxConnections"]
        );
        assert!(restart_only_changes(&started, &started).is_empty());
    }

    #[test]
    fn come_back_times_round_up_to_the_next_whole_second() {
        let at = |secs: u64, nanos: u32| SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        assert_eq!(whole_second_after(at(100, 300_000_000)), at(101, 0));
        assert_eq!(whole_second_after(at(100, 1)), at(101, 0));
        assert_eq!(whole_second_after(at(100, 0)), at(100, 0));
        let served = Served {
            credential: crate::providers::Credential::token("t", at(2000, 0)),
            come_back: at(1000, 999_999_999),
            outcome: crate::cache::Outcome::Hit,
        };
        let out = response(served);
        assert_eq!(out.expiration_time.unwrap().seconds, 1001);
        assert_eq!(out.token, "t");
    }

    #[test]
    fn every_provider_error_has_its_code() {
        let cases = [
            (
                ProviderError::InvalidRequest(String::new()),
                Code::InvalidArgument,
            ),
            (ProviderError::NotFound(String::new()), Code::NotFound),
            (ProviderError::Denied(String::new()), Code::PermissionDenied),
            (ProviderError::Unavailable(String::new()), Code::Unavailable),
            (
                ProviderError::Timeout(String::new()),
                Code::DeadlineExceeded,
            ),
            (
                ProviderError::Unimplemented(String::new()),
                Code::Unimplemented,
            ),
        ];
        for (e, want) in cases {
            let backing_off = CacheError::BackingOff {
                last: Box::new(CacheError::Provider(e.clone())),
                retry_in: Duration::from_secs(1),
            };
            assert_eq!(cache_code(&CacheError::Provider(e)), want);
            assert_eq!(cache_code(&backing_off), want);
        }
        assert_eq!(
            cache_code(&CacheError::UpstreamTimeout(Duration::ZERO)),
            Code::DeadlineExceeded
        );
    }
}
