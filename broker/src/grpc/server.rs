//! The wiring: `credbroker serve` binds the socket, puts the services (TokenService,
//! AdminService, health, reflection v1 and v1alpha) behind the connection bounds and the
//! rate limit, reloads the config on SIGHUP and shuts down gracefully. What the services
//! do is in `token_service` and `admin_service`, what they call in `broker`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use credbroker_proto::v1::admin_service_server::AdminServiceServer;
use credbroker_proto::v1::token_service_server::TokenServiceServer;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic_health::ServingStatus;

use crate::base::conn::{self, ActivityLayer, ConnLimiter, PeerCred, RefusedGate};
use crate::base::socket::{self, SocketError};
use crate::config::Config;
use crate::engine::broker::Broker;
use crate::engine::metrics::{self, MetricsError};
use crate::grpc::admin_service::AdminApi;
use crate::grpc::ratelimit::{self, RateLimitLayer};
use crate::grpc::token_service::TokenApi;
use crate::grpc::wire::WireErrors;
use crate::request::caller;

/// In-flight calls get this long to finish after SIGTERM: far longer than a cache hit takes.
/// In Kueue's pod (`terminationGracePeriodSeconds: 10`, the sidecar signalled only after the
/// manager exits) the kubelet may kill the broker sooner; by then its callers are gone.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Accepted connections waiting for the server: a Kueue restart opens a thousand at once,
/// and the server takes them off this queue in microseconds.
const ACCEPT_QUEUE: usize = 1024;
/// HTTP/2 PINGs on a connection quiet for this long, to find peers that vanished without
/// closing (a frozen process keeps its socket open): grpc-go's server pings every 2 h by
/// default; a minute frees a dead peer's connection well within the idle timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// A peer that does not answer a PING within this long is gone: grpc-go's default.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

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
            // google.rpc.ErrorInfo and its kin: the details of every error status, so that
            // grpcurl and other reflection clients print them decoded.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
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
    let refused = ConnLimiter::new("socket, refused callers", conn::REFUSED_CONNECTIONS);
    let refused_gate = RefusedGate::default();
    let rate_limiter = Arc::new(ratelimit::Limiter::new(&config.rate_limit));
    let gate = broker.clone();
    let paused = rate_limiter.clone();
    let incoming = ReceiverStream::new(conn_rx).filter_map(move |accepted| match accepted {
        // Who the caller is decides before anything waits on it: a peer the broker would
        // refuse lands in a small pool of its own, never in the callers' (crate::base::conn).
        Ok(stream) => {
            let cred = stream.peer_cred().ok().map(|cred| PeerCred {
                uid: cred.uid(),
                gid: cred.gid(),
            });
            let pool = if cred.is_some_and(|c| gate.may_connect(caller::of(Some(c)))) {
                &limiter
            } else if refused_gate.may_serve() {
                &refused
            } else {
                refused_gate.hold(stream);
                return None;
            };
            let admitted = pool.admit(stream)?;
            // A caller refused by the rate limit past what is worth answering: its new
            // connection waits, unread, with its others (crate::grpc::ratelimit).
            if let Some(until) = cred.and_then(|c| paused.paused_until(c.uid)) {
                admitted.state().pause_reads(until);
            }
            Some(Ok(match cred {
                Some(cred) => admitted.with_cred(cred),
                None => admitted,
            }))
        }
        Err(e) => Some(Err(e)),
    });

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(Some(conn::MAX_STREAMS_PER_CONNECTION))
        .layer(ActivityLayer)
        .layer(RateLimitLayer::new(
            rate_limiter,
            broker.metrics().rate_limited(),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(WireErrors::new(
            TokenServiceServer::new(TokenApi::new(broker.clone()))
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
        providers = ?config.providers.iter().map(|p| format!("{} ({})", p.name, p.kind())).collect::<Vec<_>>(),
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
            keeper.stop().await;
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

/// How long a reload may read and check the file before it is given up (the next SIGHUP is
/// heard either way). A 1 MiB file parses in well under a second; reading one from a stalled
/// network volume must not leave reloads deaf.
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

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
            tokio::time::timeout(
                RELOAD_TIMEOUT,
                tokio::task::spawn_blocking(move || Config::load(&path)),
            )
            .await
        };
        let next = match next {
            Ok(Ok(Ok(next))) => next,
            Ok(Ok(Err(e))) => {
                tracing::error!(error = %e, "SIGHUP: config not reloaded; still serving the previous one");
                continue;
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: config not reloaded (the parser failed); still serving the previous one");
                continue;
            }
            Err(_elapsed) => {
                tracing::error!(
                    "SIGHUP: config not reloaded: reading it took longer than {}s; still serving the previous one",
                    RELOAD_TIMEOUT.as_secs()
                );
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
            "cache.maxEntries, cache.maxBytes, cache.idleTimeout and cache.maxConcurrentFetches",
            next.cache.max_entries != running.cache.max_entries
                || next.cache.max_bytes != running.cache.max_bytes
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
}
