//! credbroker's gRPC API, package `credbroker.v1`, generated from `proto/credbroker/v1`.

/// Messages and services of package `credbroker.v1`.
pub mod v1 {
    #![allow(missing_debug_implementations, clippy::all, unreachable_pub)]
    tonic::include_proto!("credbroker.v1");
}

pub mod reason;

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
