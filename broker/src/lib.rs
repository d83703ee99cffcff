//! credbroker: a credential broker for Kubernetes multi-cluster controllers. client-go runs
//! `credbroker-shim` as a kubeconfig exec plugin; the shim asks this broker over a Unix
//! socket; the broker answers from a per-identity cache filled by providers.
//!
//! The modules are layers, each importing only those below it (CONTRIBUTING.md's map, which
//! a test holds against these imports): `base`, `config`, `request`, `providers`, `engine`,
//! `grpc`.

pub mod base;
pub mod config;
pub mod engine;
pub mod grpc;
pub mod providers;
pub mod request;
