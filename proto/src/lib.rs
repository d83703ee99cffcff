//! credbroker's gRPC API, package `credbroker.v1`, generated from `proto/credbroker/v1`.

/// Messages and services of package `credbroker.v1`.
pub mod v1 {
    #![allow(missing_debug_implementations, clippy::all, unreachable_pub)]
    tonic::include_proto!("credbroker.v1");
}

/// Encoded `FileDescriptorSet` of every credbroker proto file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/credbroker_descriptor.bin"));
