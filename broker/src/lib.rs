//! credbroker: a credential broker for Kubernetes multi-cluster controllers. client-go runs
//! `credbroker-shim` as a kubeconfig exec plugin; the shim asks this broker over a Unix
//! socket; the broker answers from a per-identity cache filled by providers.

pub mod admin_service;
pub mod broker;
pub mod cache;
pub mod caller;
pub mod clock;
pub mod config;
pub mod conn;
pub mod files;
pub mod gate;
pub mod metrics;
pub mod providers;
pub mod ratelimit;
pub mod rejections;
pub mod request;
pub mod review;
pub mod server;
pub mod socket;
pub mod status;
pub mod telemetry;
pub mod text;
pub mod token_service;
pub mod values;
pub mod wire;
