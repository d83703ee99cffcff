//! credbroker's gRPC API, package `credbroker.v1`, generated from `proto/credbroker/v1`.

/// Messages and services of package `credbroker.v1`.
#[cfg(feature = "transport")]
pub mod v1 {
    #![allow(missing_debug_implementations, clippy::all, unreachable_pub)]
    tonic::include_proto!("credbroker.v1");
}

/// Messages of package `credbroker.v1` (the same types, without the services).
#[cfg(not(feature = "transport"))]
pub mod v1 {
    #![allow(missing_debug_implementations, clippy::all, unreachable_pub)]
    include!(concat!(env!("OUT_DIR"), "/messages/credbroker.v1.rs"));
}

pub mod reason;
pub mod text;

/// Where the broker listens and the shim dials when nothing says otherwise: the path the
/// sidecar manifests in `deploy/` mount the shared socket volume at.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/credbroker/broker.sock";

/// A gRPC channel to a server on the Unix socket at `path` (the broker), with tonic's default
/// endpoint settings. The connection is made before this returns.
#[cfg(feature = "transport")]
pub async fn connect_unix(
    path: impl AsRef<std::path::Path>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    connect_unix_with(unix_endpoint(), path).await
}

/// The endpoint [`connect_unix`] starts from, for callers that set timeouts on it. The URI
/// only fills HTTP/2's `:authority`: "localhost" is what every gRPC server accepts (h2 rejects
/// a socket path there); the connector ignores it and dials the socket.
#[cfg(feature = "transport")]
pub fn unix_endpoint() -> tonic::transport::Endpoint {
    tonic::transport::Endpoint::from_static("http://localhost")
}

/// [`connect_unix`] with the caller's endpoint settings (timeouts, keepalive).
#[cfg(feature = "transport")]
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
#[cfg(feature = "transport")]
pub fn code_name(code: tonic::Code) -> &'static str {
    code_name_of(code as i32)
}

/// [`code_name`] of a `grpc-status` number; a number gRPC does not define is `UNKNOWN`, as
/// gRPC's own clients read it.
pub fn code_name_of(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

#[cfg(all(test, feature = "transport"))]
mod tests {
    #[test]
    fn code_names_agree_with_tonic() {
        for n in 0..17 {
            let code = tonic::Code::from_i32(n);
            assert_eq!(super::code_name(code), super::code_name_of(n));
            assert_eq!(super::code_name_of(n) == "UNKNOWN", n == 2, "{n}");
        }
        assert_eq!(super::code_name_of(2), "UNKNOWN");
        assert_eq!(super::code_name_of(99), "UNKNOWN");
        assert_eq!(super::code_name_of(-1), "UNKNOWN");
    }
}
