//! credbroker's gRPC API, package `credbroker.v1`, generated from `proto/credbroker/v1`.

/// Messages and services of package `credbroker.v1`.
pub mod v1 {
    #![allow(missing_debug_implementations, clippy::all, unreachable_pub)]
    tonic::include_proto!("credbroker.v1");
}

pub mod reason;

/// Where the broker listens and the shim dials when nothing says otherwise: the path the
/// sidecar manifests in `deploy/` mount the shared socket volume at.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/credbroker/broker.sock";

/// A gRPC channel to a server on the Unix socket at `path` (the broker), with tonic's default
/// endpoint settings. The connection is made before this returns.
pub async fn connect_unix(
    path: impl AsRef<std::path::Path>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    connect_unix_with(unix_endpoint(), path).await
}

/// The endpoint [`connect_unix`] starts from, for callers that set timeouts on it. The URI
/// only fills HTTP/2's `:authority`: "localhost" is what every gRPC server accepts (h2 rejects
/// a socket path there); the connector ignores it and dials the socket.
pub fn unix_endpoint() -> tonic::transport::Endpoint {
    tonic::transport::Endpoint::from_static("http://localhost")
}

/// [`connect_unix`] with the caller's endpoint settings (timeouts, keepalive).
pub async fn connect_unix_with(
    endpoint: tonic::transport::Endpoint,
    path: impl AsRef<std::path::Path>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.as_ref().to_path_buf();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}

/// Encoded `FileDescriptorSet` of every credbroker proto file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/credbroker_descriptor.bin"));

/// gRPC's canonical code names (`NOT_FOUND`), as grpcurl, the broker's metrics and the
/// shim's error lines print them; tonic only offers descriptions.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
