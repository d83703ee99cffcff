//! The machine-readable reasons of credbroker's error statuses. Every error status the
//! broker makes (not those of the gRPC library itself: an unknown method, a malformed
//! `grpc-timeout`) carries a `google.rpc.ErrorInfo` in its details with [`DOMAIN`] and one of
//! these reasons (UPPER_SNAKE, stable across releases: clients match on them, never on
//! the message). The list, with each reason's code and meaning, is also in
//! `credbroker/v1/token.proto` and docs/contract.md.

/// `ErrorInfo.domain` of every credbroker error.
pub const DOMAIN: &str = "credbroker.dev";

/// `PERMISSION_DENIED`: the caller's uid/gid is not in `socket.allowedUids`/`allowedGids`
/// (GetToken) or `socket.adminUids` (AdminService). Metadata: `uid`, `key` (the list).
pub const CALLER_NOT_ALLOWED: &str = "CALLER_NOT_ALLOWED";
/// `RESOURCE_EXHAUSTED`: the caller's uid is over `rateLimit`. Metadata: `uid`, `limit`.
pub const RATE_LIMITED: &str = "RATE_LIMITED";
/// `NOT_FOUND`: no provider of that name is configured. Metadata: `provider`.
pub const UNKNOWN_PROVIDER: &str = "UNKNOWN_PROVIDER";
/// `INVALID_ARGUMENT`: the request is malformed (no provider, undecodable, a
/// `cluster.config_json` that is not a JSON object or comes with `cluster.config`).
pub const INVALID_REQUEST: &str = "INVALID_REQUEST";
/// `INVALID_ARGUMENT`: the request, or a field of it, is over a `limits` bound.
/// Metadata: `limit` (the config key, e.g. `limits.maxRequestBytes`).
pub const REQUEST_OVER_LIMIT: &str = "REQUEST_OVER_LIMIT";
/// `INVALID_ARGUMENT`: an AdminService Invalidate/Refresh selection that selects nothing
/// or contradicts itself, or a ListEntries `page_token` the broker did not give out.
pub const INVALID_SELECTION: &str = "INVALID_SELECTION";
/// `PERMISSION_DENIED`: the cluster's exec config picks an identity or secret its provider
/// does not allow (`allowOverrides`). Metadata: `provider`, `cluster`, `key`.
pub const OVERRIDE_REFUSED: &str = "OVERRIDE_REFUSED";
/// `INVALID_ARGUMENT`: the provider cannot use the cluster's input (e.g. no `clusterName`,
/// no cluster info). Metadata: `provider`, `cluster`.
pub const INVALID_CLUSTER_INPUT: &str = "INVALID_CLUSTER_INPUT";
/// `NOT_FOUND`: the credential's source for this cluster is missing (a token file, a
/// Secret or its key). Metadata: `provider`, `cluster`.
pub const SOURCE_NOT_FOUND: &str = "SOURCE_NOT_FOUND";
/// `PERMISSION_DENIED`: the upstream refused the identity. Metadata: `provider`, `cluster`.
pub const UPSTREAM_DENIED: &str = "UPSTREAM_DENIED";
/// `UNAVAILABLE`: the upstream failed or could not be reached. Metadata: `provider`,
/// `cluster`.
pub const UPSTREAM_UNAVAILABLE: &str = "UPSTREAM_UNAVAILABLE";
/// `DEADLINE_EXCEEDED`: the upstream did not answer in time. Metadata: `provider`, `cluster`.
pub const UPSTREAM_TIMEOUT: &str = "UPSTREAM_TIMEOUT";
/// `UNIMPLEMENTED`: the provider's type is not in this build, or cannot serve as
/// configured. Metadata: `provider`, `cluster`.
pub const PROVIDER_UNIMPLEMENTED: &str = "PROVIDER_UNIMPLEMENTED";
/// `UNAVAILABLE`: every upstream call the provider may run at once stayed busy.
/// Metadata: `provider`, `cluster`, `limit` (`cache.maxConcurrentFetches`).
pub const PROVIDER_BUSY: &str = "PROVIDER_BUSY";
/// `UNAVAILABLE`: the upstream returned a credential already expired, or one expiring
/// within the second. Metadata: `provider`, `cluster`.
pub const CREDENTIAL_EXPIRED: &str = "CREDENTIAL_EXPIRED";
/// `INTERNAL`: a fault inside the broker (the fetch task failed). Metadata: `provider`,
/// `cluster`.
pub const INTERNAL: &str = "INTERNAL";

/// Every reason, for tests and docs checks.
pub const ALL: &[&str] = &[
    CALLER_NOT_ALLOWED,
    RATE_LIMITED,
    UNKNOWN_PROVIDER,
    INVALID_REQUEST,
    REQUEST_OVER_LIMIT,
    INVALID_SELECTION,
    OVERRIDE_REFUSED,
    INVALID_CLUSTER_INPUT,
    SOURCE_NOT_FOUND,
    UPSTREAM_DENIED,
    UPSTREAM_UNAVAILABLE,
    UPSTREAM_TIMEOUT,
    PROVIDER_UNIMPLEMENTED,
    PROVIDER_BUSY,
    CREDENTIAL_EXPIRED,
    INTERNAL,
];
