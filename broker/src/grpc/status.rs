//! The one table from [`BrokerError`] to a gRPC status: its code, its message (cut to fit a
//! trailer) and a `google.rpc.ErrorInfo` with a stable reason (`credbroker_proto::reason`),
//! domain `credbroker.dev` and metadata that name the provider, the cluster and the config
//! key involved, never a secret. Every status the broker makes comes from here: the
//! services, the decoder's refusals (`wire`) and the rate limit (`ratelimit`).

use std::collections::HashMap;

use credbroker_proto::reason;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::base::text::{controls_escaped, quote};
use crate::engine::broker::BrokerError;
use crate::engine::cache::CacheError;
use crate::providers::ProviderError;
use crate::providers::overrides::OverrideError;
use crate::request::RequestError;

/// A status message travels in an HTTP/2 trailer (clients refuse header lists past 16 KiB,
/// and grpc-message is percent-encoded, up to three bytes per byte): whatever a provider or
/// a caller put in it, the message is cut to this many bytes.
const MAX_STATUS_MESSAGE_BYTES: usize = 2048;

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Self {
        let (code, why) = code_and_reason(&e);
        // The one escaping rule, at the one door every status goes out by: whatever text a
        // caller, a ClusterProfile, a file or an upstream put in the error, no raw control
        // character, line separator or bidi override leaves in a message or ErrorInfo value.
        let metadata: HashMap<String, String> = metadata(&e)
            .into_iter()
            .map(|(k, v)| (k, controls_escaped(&v).into_owned()))
            .collect();
        let details = ErrorDetails::with_error_info(why, reason::DOMAIN, metadata);
        let message = controls_escaped(&e.to_string()).into_owned();
        Status::with_error_details(code, cut(message, MAX_STATUS_MESSAGE_BYTES), details)
    }
}

/// The code and the `ErrorInfo` reason of each error.
pub fn code_and_reason(e: &BrokerError) -> (Code, &'static str) {
    match e {
        BrokerError::CallerNotAllowed { .. } => {
            (Code::PermissionDenied, reason::CALLER_NOT_ALLOWED)
        }
        BrokerError::OverrideRefused { .. } => (Code::PermissionDenied, reason::OVERRIDE_REFUSED),
        BrokerError::BadRequest(e) => (Code::InvalidArgument, request_reason(e)),
        BrokerError::BadSelection(_) => (Code::InvalidArgument, reason::INVALID_SELECTION),
        BrokerError::UnknownProvider { .. } => (Code::NotFound, reason::UNKNOWN_PROVIDER),
        BrokerError::Provider { source, .. } => cache_status(source),
        BrokerError::RateLimited { .. } => (Code::ResourceExhausted, reason::RATE_LIMITED),
    }
}

fn request_reason(e: &RequestError) -> &'static str {
    match e {
        RequestError::MissingProvider
        | RequestError::Undecodable(_)
        | RequestError::BadClusterConfig(_)
        | RequestError::Caller(_) => reason::INVALID_REQUEST,
        RequestError::TooLarge { .. }
        | RequestError::TooDeep { .. }
        | RequestError::TooManyKeys { .. } => reason::REQUEST_OVER_LIMIT,
    }
}

fn cache_status(e: &CacheError) -> (Code, &'static str) {
    match e {
        CacheError::Provider(p) => match p {
            ProviderError::InvalidRequest(_) => {
                (Code::InvalidArgument, reason::INVALID_CLUSTER_INPUT)
            }
            ProviderError::NotFound(_) => (Code::NotFound, reason::SOURCE_NOT_FOUND),
            ProviderError::Denied(_) => (Code::PermissionDenied, reason::UPSTREAM_DENIED),
            ProviderError::Unavailable(_) => (Code::Unavailable, reason::UPSTREAM_UNAVAILABLE),
            ProviderError::Timeout(_) => (Code::DeadlineExceeded, reason::UPSTREAM_TIMEOUT),
            ProviderError::Unimplemented(_) => {
                (Code::Unimplemented, reason::PROVIDER_UNIMPLEMENTED)
            }
        },
        CacheError::BackingOff { last, .. } => cache_status(last),
        CacheError::UpstreamTimeout(_) => (Code::DeadlineExceeded, reason::UPSTREAM_TIMEOUT),
        CacheError::Expired | CacheError::ExpiresTooSoon(_) => {
            (Code::Unavailable, reason::CREDENTIAL_EXPIRED)
        }
        CacheError::Busy { .. } => (Code::Unavailable, reason::PROVIDER_BUSY),
        CacheError::Internal(_) => (Code::Internal, reason::INTERNAL),
    }
}

/// `ErrorInfo.metadata`: lowerCamelCase keys (Google's convention). Caller text only
/// quoted; config keys and numbers as they are; never a credential.
fn metadata(e: &BrokerError) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_owned(), v);
    };
    match e {
        BrokerError::CallerNotAllowed { uid, list } => {
            if let Some(uid) = uid {
                put("uid", uid.to_string());
            }
            put("key", (*list).to_owned());
        }
        BrokerError::RateLimited { uid, .. } => {
            put("uid", uid.to_string());
            put("limit", "rateLimit".to_owned());
        }
        BrokerError::UnknownProvider { name, .. } => put("provider", quote(name)),
        BrokerError::BadRequest(e) => match e {
            RequestError::TooLarge { key, .. } => put("limit", (*key).to_owned()),
            RequestError::TooDeep { .. } => put("limit", "limits.maxClusterConfigDepth".into()),
            RequestError::TooManyKeys { .. } => {
                put("limit", "limits.maxClusterConfigKeys".into());
            }
            RequestError::Caller(e) => put("field", e.field().to_owned()),
            RequestError::MissingProvider
            | RequestError::Undecodable(_)
            | RequestError::BadClusterConfig(_) => {}
        },
        BrokerError::BadSelection(_) => {}
        BrokerError::Provider {
            provider,
            cluster,
            source,
        } => {
            put("provider", quote(provider));
            put("cluster", quote(cluster));
            let mut source = source;
            while let CacheError::BackingOff { last, retry_in } = source {
                put("retryInSeconds", retry_in.as_secs().max(1).to_string());
                source = last;
            }
            if let CacheError::Busy { .. } = source {
                put("limit", "cache.maxConcurrentFetches".into());
            }
        }
        BrokerError::OverrideRefused {
            provider,
            cluster,
            source,
        } => {
            put("provider", quote(provider));
            // Already quoted where the error is made.
            put("cluster", cluster.clone());
            let OverrideError::Refused { key, .. } = &**source;
            put("key", quote(key));
        }
    }
    m
}

/// `text` cut to at most `max` bytes on a character boundary, saying how long it was.
fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("…({total} bytes)"));
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::engine::broker::tests::{broker, msg};
    use crate::request::caller::Peer;

    const FILE: &str = "providers:\n  - {name: f, type: file, file: {path: \"/nonexistent/{clusterName}\"}}\n  - {name: cloud, type: aws}\n";

    #[tokio::test]
    async fn errors_map_to_the_designed_codes() {
        let b = broker(FILE);
        let code = |r: Result<_, BrokerError>| Status::from(r.unwrap_err()).code();
        assert_eq!(
            code(b.get_token(Peer::default(), msg("nope")).await),
            Code::NotFound
        );
        assert_eq!(
            code(b.get_token(Peer::default(), msg("")).await),
            Code::InvalidArgument
        );
        // file provider without clusterName → INVALID_ARGUMENT naming provider and cluster.
        let err = b.get_token(Peer::default(), msg("f")).await.unwrap_err();
        let status = Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("provider \"f\", cluster \"(no cluster info)\""),
            "{}",
            status.message()
        );
        // A cloud provider asked without cluster info cannot tell which cluster to sign for.
        assert_eq!(
            code(b.get_token(Peer::default(), msg("cloud")).await),
            Code::InvalidArgument
        );
        let unknown = Status::from(b.get_token(Peer::default(), msg("nope")).await.unwrap_err());
        assert_eq!(
            unknown.message(),
            "unknown provider \"nope\" (configured: cloud, f)"
        );
    }

    #[tokio::test]
    async fn identity_overrides_are_permission_denied_before_the_provider() {
        let b = broker(FILE);
        let mut fields = std::collections::BTreeMap::new();
        for (k, v) in [
            ("clusterName", "w1"),
            ("roleArn", "arn:aws:iam::111122223333:role/admin"),
        ] {
            let kind = prost_types::value::Kind::StringValue(v.into());
            fields.insert(k.to_owned(), prost_types::Value { kind: Some(kind) });
        }
        let mut asked = msg("cloud");
        asked.cluster = Some(credbroker_proto::v1::Cluster {
            server: "https://w1.example".into(),
            config: Some(prost_types::Struct { fields }),
            ..Default::default()
        });
        let err = b.get_token(Peer::default(), asked).await.unwrap_err();
        assert!(
            matches!(err, BrokerError::OverrideRefused { .. }),
            "{err:?}"
        );
        let status = Status::from(err);
        assert_eq!(status.code(), Code::PermissionDenied);
        assert!(
            status.message().starts_with(
                "provider \"cloud\", cluster \"w1\": override refused: the cluster's exec config sets roleArn"
            ),
            "{}",
            status.message()
        );
        assert!(
            status
                .message()
                .contains("allowOverrides: {roleArn: [\"arn:aws:iam::111122223333:role/admin\"]}"),
            "{}",
            status.message()
        );
        assert!(b.cache().entries().is_empty(), "refused before the cache");

        // Allowed by a reload, then refused again by the next one: the running config decides.
        let asked = || {
            let mut m = msg("cloud");
            m.cluster = Some(credbroker_proto::v1::Cluster {
                server: "https://w1.example".into(),
                config: Some(prost_types::Struct {
                    fields: [("roleArn", "arn:aws:iam::111122223333:role/admin")]
                        .into_iter()
                        .map(|(k, v)| {
                            let kind = prost_types::value::Kind::StringValue(v.into());
                            (k.to_owned(), prost_types::Value { kind: Some(kind) })
                        })
                        .collect(),
                }),
                ..Default::default()
            });
            m
        };
        let allowing = FILE.replace(
            "type: aws}",
            "type: aws, allowOverrides: {roleArn: [\"arn:aws:iam::111122223333:role/*\"]}}",
        );
        b.reload(&Config::parse(&allowing, "t").unwrap());
        let err = b.get_token(Peer::default(), asked()).await.unwrap_err();
        assert!(
            !matches!(err, BrokerError::OverrideRefused { .. }),
            "allowed now, so the provider sees it: {err}"
        );
        b.reload(&Config::parse(FILE, "t").unwrap());
        let err = b.get_token(Peer::default(), asked()).await.unwrap_err();
        assert!(matches!(err, BrokerError::OverrideRefused { .. }), "{err}");
    }

    #[tokio::test]
    async fn allowed_uids_are_enforced() {
        let b = broker(&format!(
            "socket: {{path: /x, allowedUids: [1000]}}\n{FILE}"
        ));
        for uid in [None, Some(0), Some(1001)] {
            let peer = Peer { uid, gid: Some(5) };
            let status = Status::from(b.get_token(peer, msg("nope")).await.unwrap_err());
            assert_eq!(status.code(), Code::PermissionDenied, "{uid:?}");
            assert!(
                status.message().contains("permission denied"),
                "{}",
                status.message()
            );
        }
        let allowed = Peer {
            uid: Some(1000),
            gid: None,
        };
        let status = Status::from(b.get_token(allowed, msg("nope")).await.unwrap_err());
        assert_eq!(
            status.code(),
            Code::NotFound,
            "an allowed uid gets past the check"
        );
        // allowedGids admits by group too.
        let b = broker(&format!(
            "socket: {{path: /x, allowedUids: [1000], allowedGids: [44]}}\n{FILE}"
        ));
        let by_group = Peer {
            uid: Some(1001),
            gid: Some(44),
        };
        let status = Status::from(b.get_token(by_group, msg("nope")).await.unwrap_err());
        assert_eq!(status.code(), Code::NotFound);
        let refused = BrokerError::CallerNotAllowed {
            uid: Some(7),
            list: "socket.allowedUids/allowedGids",
        };
        assert_eq!(
            Status::from(refused).message(),
            "permission denied: caller uid 7 is not in socket.allowedUids/allowedGids"
        );
    }

    #[test]
    fn admin_defaults_to_own_uid_and_root() {
        let b = broker(FILE);
        let me = nix::unistd::geteuid().as_raw();
        assert!(
            b.authorize_admin(Peer {
                uid: Some(me),
                gid: None
            })
            .is_ok()
        );
        assert!(
            b.authorize_admin(Peer {
                uid: Some(0),
                gid: None
            })
            .is_ok()
        );
        let err = b
            .authorize_admin(Peer {
                uid: Some(4242),
                gid: None,
            })
            .unwrap_err();
        assert_eq!(Status::from(err).code(), Code::PermissionDenied);
        let b = broker(&format!("socket: {{path: /x, adminUids: [4242]}}\n{FILE}"));
        assert!(
            b.authorize_admin(Peer {
                uid: Some(4242),
                gid: None
            })
            .is_ok()
        );
        assert!(
            b.authorize_admin(Peer {
                uid: Some(0),
                gid: None
            })
            .is_err()
        );
        assert!(b.authorize_admin(Peer::default()).is_err());
    }

    #[test]
    fn every_provider_error_has_its_code() {
        let cases = [
            (
                ProviderError::InvalidRequest(String::new()),
                Code::InvalidArgument,
            ),
            (ProviderError::NotFound(String::new()), Code::NotFound),
            (ProviderError::Denied(String::new()), Code::PermissionDenied),
            (ProviderError::Unavailable(String::new()), Code::Unavailable),
            (
                ProviderError::Timeout(String::new()),
                Code::DeadlineExceeded,
            ),
            (
                ProviderError::Unimplemented(String::new()),
                Code::Unimplemented,
            ),
        ];
        for (e, want) in cases {
            let backing_off = CacheError::BackingOff {
                last: Box::new(CacheError::Provider(e.clone())),
                retry_in: Duration::from_secs(1),
            };
            assert_eq!(cache_status(&CacheError::Provider(e)).0, want);
            assert_eq!(cache_status(&backing_off).0, want);
        }
        assert_eq!(
            cache_status(&CacheError::UpstreamTimeout(Duration::ZERO)).0,
            Code::DeadlineExceeded
        );
    }
}

#[cfg(test)]
mod table {
    use std::time::Duration;

    use credbroker_proto::reason;
    use tonic::Code;
    use tonic_types::StatusExt as _;

    use super::*;
    use crate::engine::cache::CacheError;
    use crate::providers::ProviderError;
    use crate::providers::overrides::OverrideError;

    fn provider(source: CacheError) -> BrokerError {
        BrokerError::Provider {
            provider: "p".into(),
            cluster: "c\n1".into(),
            source,
        }
    }

    /// An error, and the code, reason and metadata its status must carry.
    type Case = (
        BrokerError,
        Code,
        &'static str,
        Vec<(&'static str, &'static str)>,
    );

    /// One of each error, with the code, reason and metadata it must get. The `match` in
    /// `covered` has no wildcard: a new variant does not compile until it is listed here.
    fn cases() -> Vec<Case> {
        let p = |s: ProviderError| provider(CacheError::Provider(s));
        vec![
            (
                BrokerError::CallerNotAllowed {
                    uid: Some(7),
                    list: "socket.adminUids",
                },
                Code::PermissionDenied,
                reason::CALLER_NOT_ALLOWED,
                vec![("uid", "7"), ("key", "socket.adminUids")],
            ),
            (
                BrokerError::RateLimited {
                    uid: 9,
                    per_second: 1,
                    burst: 2,
                },
                Code::ResourceExhausted,
                reason::RATE_LIMITED,
                vec![("uid", "9"), ("limit", "rateLimit")],
            ),
            (
                BrokerError::UnknownProvider {
                    name: "x\u{1b}".into(),
                    known: "a".into(),
                },
                Code::NotFound,
                reason::UNKNOWN_PROVIDER,
                vec![("provider", "x\\u{1b}")],
            ),
            (
                BrokerError::BadSelection("identity needs its provider".into()),
                Code::InvalidArgument,
                reason::INVALID_SELECTION,
                vec![],
            ),
            (
                BrokerError::BadRequest(RequestError::MissingProvider),
                Code::InvalidArgument,
                reason::INVALID_REQUEST,
                vec![],
            ),
            (
                BrokerError::BadRequest(RequestError::Undecodable("junk".into())),
                Code::InvalidArgument,
                reason::INVALID_REQUEST,
                vec![],
            ),
            (
                BrokerError::BadRequest(RequestError::BadClusterConfig(
                    "is not a JSON object".into(),
                )),
                Code::InvalidArgument,
                reason::INVALID_REQUEST,
                vec![],
            ),
            (
                BrokerError::BadRequest(RequestError::Caller(
                    crate::request::caller::CallerError::Digest(3),
                )),
                Code::InvalidArgument,
                reason::INVALID_REQUEST,
                vec![("field", "caller.configDigest")],
            ),
            (
                BrokerError::BadRequest(RequestError::Caller(
                    crate::request::caller::CallerError::Pid(0),
                )),
                Code::InvalidArgument,
                reason::INVALID_REQUEST,
                vec![("field", "caller.pid")],
            ),
            (
                BrokerError::BadRequest(RequestError::TooLarge {
                    what: "the provider name".into(),
                    size: 9,
                    limit: 8,
                    key: "limits.maxFieldBytes",
                }),
                Code::InvalidArgument,
                reason::REQUEST_OVER_LIMIT,
                vec![("limit", "limits.maxFieldBytes")],
            ),
            (
                BrokerError::BadRequest(RequestError::TooDeep { limit: 3 }),
                Code::InvalidArgument,
                reason::REQUEST_OVER_LIMIT,
                vec![("limit", "limits.maxClusterConfigDepth")],
            ),
            (
                BrokerError::BadRequest(RequestError::TooManyKeys { limit: 3 }),
                Code::InvalidArgument,
                reason::REQUEST_OVER_LIMIT,
                vec![("limit", "limits.maxClusterConfigKeys")],
            ),
            (
                BrokerError::OverrideRefused {
                    provider: "p".into(),
                    cluster: "c".into(),
                    source: Box::new(OverrideError::Refused {
                        key: "roleArn".into(),
                        shown: " (value not shown)".into(),
                        selects: "the IAM role",
                        why: "not allowed".into(),
                    }),
                },
                Code::PermissionDenied,
                reason::OVERRIDE_REFUSED,
                vec![("provider", "p"), ("cluster", "c"), ("key", "roleArn")],
            ),
            (
                p(ProviderError::InvalidRequest("no clusterName".into())),
                Code::InvalidArgument,
                reason::INVALID_CLUSTER_INPUT,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                p(ProviderError::NotFound("no file".into())),
                Code::NotFound,
                reason::SOURCE_NOT_FOUND,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                p(ProviderError::Denied("no".into())),
                Code::PermissionDenied,
                reason::UPSTREAM_DENIED,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                p(ProviderError::Unavailable("down".into())),
                Code::Unavailable,
                reason::UPSTREAM_UNAVAILABLE,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                p(ProviderError::Timeout("slow".into())),
                Code::DeadlineExceeded,
                reason::UPSTREAM_TIMEOUT,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                p(ProviderError::Unimplemented("not built".into())),
                Code::Unimplemented,
                reason::PROVIDER_UNIMPLEMENTED,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                provider(CacheError::BackingOff {
                    last: Box::new(CacheError::Provider(ProviderError::NotFound("gone".into()))),
                    retry_in: Duration::from_millis(1500),
                }),
                Code::NotFound,
                reason::SOURCE_NOT_FOUND,
                vec![
                    ("provider", "p"),
                    ("cluster", "c\\n1"),
                    ("retryInSeconds", "1"),
                ],
            ),
            (
                provider(CacheError::UpstreamTimeout(Duration::from_secs(60))),
                Code::DeadlineExceeded,
                reason::UPSTREAM_TIMEOUT,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                provider(CacheError::Expired),
                Code::Unavailable,
                reason::CREDENTIAL_EXPIRED,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                provider(CacheError::ExpiresTooSoon(Duration::from_millis(10))),
                Code::Unavailable,
                reason::CREDENTIAL_EXPIRED,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
            (
                provider(CacheError::Busy {
                    limit: 4,
                    waited: Duration::from_secs(60),
                }),
                Code::Unavailable,
                reason::PROVIDER_BUSY,
                vec![
                    ("provider", "p"),
                    ("cluster", "c\\n1"),
                    ("limit", "cache.maxConcurrentFetches"),
                ],
            ),
            (
                provider(CacheError::Internal("the fetch task panicked".into())),
                Code::Internal,
                reason::INTERNAL,
                vec![("provider", "p"), ("cluster", "c\\n1")],
            ),
        ]
    }

    /// Compile-time exhaustiveness of [`cases`]: every variant named, no wildcard.
    fn covered(e: &BrokerError) {
        match e {
            BrokerError::CallerNotAllowed { .. }
            | BrokerError::RateLimited { .. }
            | BrokerError::UnknownProvider { .. }
            | BrokerError::BadSelection(_)
            | BrokerError::OverrideRefused { .. } => {}
            BrokerError::BadRequest(r) => match r {
                RequestError::MissingProvider
                | RequestError::Undecodable(_)
                | RequestError::BadClusterConfig(_)
                | RequestError::TooLarge { .. }
                | RequestError::TooDeep { .. }
                | RequestError::TooManyKeys { .. }
                | RequestError::Caller(_) => {}
            },
            BrokerError::Provider { source, .. } => match source {
                CacheError::Provider(
                    ProviderError::InvalidRequest(_)
                    | ProviderError::NotFound(_)
                    | ProviderError::Denied(_)
                    | ProviderError::Unavailable(_)
                    | ProviderError::Timeout(_)
                    | ProviderError::Unimplemented(_),
                )
                | CacheError::BackingOff { .. }
                | CacheError::UpstreamTimeout(_)
                | CacheError::Expired
                | CacheError::ExpiresTooSoon(_)
                | CacheError::Busy { .. }
                | CacheError::Internal(_) => {}
            },
        }
    }

    #[test]
    fn every_error_has_its_code_reason_and_metadata() {
        let mut seen = std::collections::BTreeSet::new();
        for (error, code, why, metadata) in cases() {
            covered(&error);
            let message = error.to_string();
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{message}");
            assert_eq!(status.message(), message, "the message is the error's text");
            let info = status
                .get_details_error_info()
                .unwrap_or_else(|| panic!("no ErrorInfo on {message}"));
            assert_eq!(info.reason, why, "{message}");
            assert_eq!(info.domain, "credbroker.dev");
            let want: HashMap<String, String> = metadata
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            assert_eq!(info.metadata, want, "{message}");
            assert!(
                info.reason
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_'),
                "{}",
                info.reason
            );
            seen.insert(why);
        }
        let all: std::collections::BTreeSet<_> = reason::ALL.iter().copied().collect();
        assert_eq!(seen, all, "every listed reason is used, and only those");
    }

    #[test]
    fn long_messages_are_cut_and_keep_their_reason() {
        let status = Status::from(BrokerError::UnknownProvider {
            name: "p".into(),
            known: "k".repeat(5000),
        });
        assert!(status.message().len() < MAX_STATUS_MESSAGE_BYTES + 32);
        assert!(status.message().ends_with("bytes)"), "{}", status.message());
        assert_eq!(
            status.get_details_error_info().unwrap().reason,
            reason::UNKNOWN_PROVIDER
        );
    }

    /// The proto's comments and the contract list every reason with its code.
    #[test]
    fn every_reason_is_documented_with_its_code() {
        let proto = include_str!("../../../proto/credbroker/v1/token.proto");
        let contract = include_str!("../../../docs/contract.md");
        for (error, code, why, _) in cases() {
            let code = credbroker_proto::code_name(code);
            assert!(
                proto.contains(&format!("//   {why}:\n//       {code}:")),
                "token.proto lacks {why} ({code}) for {error}"
            );
            assert!(
                contract.contains(&format!("| `{why}` | `{code}` |")),
                "docs/contract.md lacks {why} ({code})"
            );
        }
    }
}
