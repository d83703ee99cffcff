//! The gRPC edge: the socket's services and their wiring, thin over the core
//! (`crate::engine`): who is calling, rate limits, decoder refusals, and the one table from the
//! core's errors to gRPC statuses.

pub mod admin_service;
pub mod ratelimit;
pub mod server;
pub mod status;
pub mod token_service;
pub mod wire;
