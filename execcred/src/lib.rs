//! client-go's side of the kubeconfig exec-plugin protocol, in both directions, for the shim
//! (which client-go runs) and the broker's exec provider (which runs other plugins the way
//! client-go would):
//!
//! | message | the shim | the broker |
//! |---|---|---|
//! | `KUBERNETES_EXEC_INFO` ([`ExecInfo`]) | parses it | renders it for a wrapped plugin |
//! | `ExecCredential` on stdout ([`exec_credential`]) | renders it | parses a plugin's |
//!
//! `spec.cluster.config` (the cluster's `client.authentication.k8s.io/exec` extension) is
//! carried as the JSON text client-go sent, never re-encoded, so a wrapped plugin sees its
//! integers (past 2^53 too), key order and spelling as client-go wrote them.
//!
//! [`Cluster`] is client-go's `spec.cluster` at every step from the shim to a wrapped plugin,
//! with its conversions to and from the GetToken message's `Cluster` (credbroker-proto's
//! messages, without its gRPC transport).
//!
//! serde_json, base64, time and the prost messages, and thiserror for [`Error`] (no gRPC, no
//! serde derive): the shim links all of these already and stays small.

mod cluster;
mod error;
mod exec_info;
mod json_span;
mod rfc3339;

pub mod exec_credential;

pub use cluster::{Cluster, ConfigText, WireConfig};
pub use error::Error;
pub use exec_info::{ExecInfo, parse_exec_info};
pub use rfc3339::{parse_rfc3339, rfc3339_utc};

/// The environment variable client-go passes the [`ExecInfo`] in.
pub const EXEC_INFO_ENV: &str = "KUBERNETES_EXEC_INFO";
/// `client.authentication.k8s.io/v1`: client-go ≥ 1.22.
pub const API_V1: &str = "client.authentication.k8s.io/v1";
/// `client.authentication.k8s.io/v1beta1`: what older plugins and clients speak.
pub const API_V1BETA1: &str = "client.authentication.k8s.io/v1beta1";
/// The `kind` of both messages.
pub const KIND: &str = "ExecCredential";

/// The ExecCredential apiVersion a client speaks. An answer must carry the one the request
/// had, or client-go rejects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1Beta1,
}

impl ApiVersion {
    /// The version most plugins speak; older ones speak only v1beta1.
    pub const DEFAULT: Self = Self::V1;

    pub const fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => API_V1,
            ApiVersion::V1Beta1 => API_V1BETA1,
        }
    }

    /// `None` for anything but the two supported versions (v1alpha1 was removed from
    /// client-go in 1.24).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            API_V1 => Some(ApiVersion::V1),
            API_V1BETA1 => Some(ApiVersion::V1Beta1),
            _ => None,
        }
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
