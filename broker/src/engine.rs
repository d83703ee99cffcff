//! The core, apart from any transport: the per-identity cache and its rules, the re-ask check
//! with the cluster's API server, what operators see, and the broker that ties them together.
//! No tonic here; the gRPC edge (`crate::grpc`) is thin over it.

pub mod broker;
pub mod cache;
pub mod metrics;
pub mod rejections;
pub mod review;
pub mod telemetry;
