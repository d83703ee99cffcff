//! The gRPC side: `TokenService` over the Unix socket, with health and reflection, and the
//! one table that turns every error into a `tonic::Status`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use credbroker_proto::v1::token_service_server::{TokenService, TokenServiceServer};
use credbroker_proto::v1::{GetTokenRequest, GetTokenResponse};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Code, Request, Response, Status};
use tonic_health::ServingStatus;

use crate::cache::{Cache, CacheError, CacheKey, CacheSettings, Served, UPSTREAM_TIMEOUT};
use crate::config::Config;
use crate::providers::{self, CredentialSecret, Provider, ProviderError};
use crate::request::{RequestError, TokenRequest};
use crate::socket::{self, SocketError};

/// In-flight calls get this long to finish after SIGTERM: well inside Kubernetes' default
/// 30 s termination grace period, and far longer than a cache hit takes.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why a `GetToken` call failed. Turned into a status in exactly one place, below.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("caller uid {} is not in socket.allowedUids", .uid.map_or_else(|| "(unknown)".to_owned(), |u| u.to_string()))]
    CallerNotAllowed { uid: Option<u32> },
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error("unknown provider {name:?} (configured: {known})")]
    UnknownProvider { name: String, known: String },
    #[error("provider {provider:?}, cluster {cluster:?}: {source}")]
    Provider {
        provider: String,
        cluster: String,
        source: CacheError,
    },
}

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Self {
        let code = match &e {
            BrokerError::CallerNotAllowed { .. } => Code::PermissionDenied,
            BrokerError::BadRequest(_) => Code::InvalidArgument,
            BrokerError::UnknownProvider { .. } => Code::NotFound,
            BrokerError::Provider { source, .. } => cache_code(source),
        };
        Status::new(code, e.to_string())
    }
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
        CacheError::Expired => Code::Unavailable,
        CacheError::Internal(_) => Code::Internal,
    }
}

/// Answers token requests: authorises the caller, picks the provider, asks the cache.
#[derive(Debug)]
pub struct Broker {
    providers: BTreeMap<String, Arc<dyn Provider>>,
    cache: Arc<Cache>,
    allowed_uids: Option<Vec<u32>>,
}

impl Broker {
    pub fn new(config: &Config) -> Self {
        let providers = config
            .providers
            .iter()
            .map(|p| (p.name.clone(), providers::build(p)))
            .collect();
        let cache = Arc::new(Cache::new(CacheSettings {
            max_entries: config.cache.max_entries,
            idle_timeout: config.cache.idle_timeout.0,
            upstream_timeout: UPSTREAM_TIMEOUT,
        }));
        Self {
            providers,
            cache,
            allowed_uids: config.socket.allowed_uids.clone(),
        }
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// One `GetToken`, from an already-identified caller.
    pub async fn get_token(
        &self,
        uid: Option<u32>,
        msg: GetTokenRequest,
    ) -> Result<(Served, TokenRequest), BrokerError> {
        if let Some(allowed) = &self.allowed_uids
            && !uid.is_some_and(|u| allowed.contains(&u))
        {
            return Err(BrokerError::CallerNotAllowed { uid });
        }
        let req = TokenRequest::from_proto(msg)?;
        let provider =
            self.providers
                .get(&req.provider)
                .ok_or_else(|| BrokerError::UnknownProvider {
                    name: req.provider.clone(),
                    known: self
                        .providers
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
        let failed = |source: CacheError| BrokerError::Provider {
            provider: req.provider.clone(),
            cluster: req.cluster_label(),
            source,
        };
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
        let uid = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        let msg = request.into_inner();
        let provider = msg.provider.clone();
        let result = self.broker.get_token(uid, msg).await;
        let elapsed = started.elapsed();
        match result {
            Ok((served, req)) => {
                tracing::info!(provider, cluster = %req.cluster_label(), code = "OK", outcome = ?served.outcome, ?elapsed, "GetToken");
                Ok(Response::new(response(served)))
            }
            Err(e) => {
                let status = Status::from(e);
                tracing::warn!(provider, code = ?status.code(), ?elapsed, error = status.message(), "GetToken");
                Err(status)
            }
        }
    }
}

fn response(served: Served) -> GetTokenResponse {
    let mut out = GetTokenResponse {
        expiration_time: Some(prost_types::Timestamp::from(served.come_back)),
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
    #[error("the gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Serves until `shutdown` resolves, then stops accepting, gives in-flight calls
/// [`SHUTDOWN_GRACE`] to finish, and removes the socket.
pub async fn serve(
    config: &Config,
    socket_path: &Path,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let broker = Arc::new(Broker::new(config));
    let sweeper = broker.cache().spawn_idle_sweeper();
    let (listener, socket_guard) = socket::bind(socket_path, config.socket.mode.0)?;

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<TokenServiceServer<TokenApi>>().await;
    health.set_service_status("", ServingStatus::Serving).await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(credbroker_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(TokenServiceServer::new(TokenApi { broker }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
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
        ended = &mut server => ended.unwrap_or_else(|e| panic_or_cancelled(&e)).map_err(ServeError::from),
        () = shutdown => {
            tracing::info!("shutting down: no new connections, in-flight calls get {}s", SHUTDOWN_GRACE.as_secs());
            health.set_service_status("", ServingStatus::NotServing).await;
            health.set_not_serving::<TokenServiceServer<TokenApi>>().await;
            let _ = stop_tx.send(());
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(ended) => ended.unwrap_or_else(|e| panic_or_cancelled(&e)).map_err(ServeError::from),
                Err(_) => {
                    tracing::warn!("in-flight calls did not finish within {}s; closing them", SHUTDOWN_GRACE.as_secs());
                    server.abort();
                    Ok(())
                }
            }
        }
    };
    sweeper.abort();
    drop(socket_guard);
    tracing::info!(socket = %socket_path.display(), "credbroker stopped; socket removed");
    result
}

fn panic_or_cancelled(e: &tokio::task::JoinError) -> Result<(), tonic::transport::Error> {
    tracing::error!("the server task ended abnormally: {e}");
    Ok(())
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
        assert_eq!(code(b.get_token(None, msg("nope")).await), Code::NotFound);
        assert_eq!(
            code(b.get_token(None, msg("")).await),
            Code::InvalidArgument
        );
        // file provider without clusterName → INVALID_ARGUMENT naming provider and cluster.
        let err = b.get_token(None, msg("f")).await.unwrap_err();
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
            code(b.get_token(None, msg("cloud")).await),
            Code::InvalidArgument
        );
        let unknown = Status::from(b.get_token(None, msg("nope")).await.unwrap_err());
        assert_eq!(
            unknown.message(),
            "unknown provider \"nope\" (configured: cloud, f)"
        );
    }

    #[tokio::test]
    async fn allowed_uids_are_enforced() {
        let b = broker(&format!(
            "socket: {{path: /x, allowedUids: [1000]}}\n{FILE}"
        ));
        for uid in [None, Some(0), Some(1001)] {
            let status = Status::from(b.get_token(uid, msg("nope")).await.unwrap_err());
            assert_eq!(status.code(), Code::PermissionDenied, "{uid:?}");
        }
        let status = Status::from(b.get_token(Some(1000), msg("nope")).await.unwrap_err());
        assert_eq!(
            status.code(),
            Code::NotFound,
            "an allowed uid gets past the check"
        );
        assert_eq!(
            Status::from(BrokerError::CallerNotAllowed { uid: Some(7) }).message(),
            "caller uid 7 is not in socket.allowedUids"
        );
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
