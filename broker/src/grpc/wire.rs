//! Requests the gRPC decoder refuses before any handler runs: one over
//! `limits.maxRequestBytes` (tonic says `OUT_OF_RANGE`) or one prost cannot decode, such as a
//! cluster config nested past prost's recursion limit (tonic says `INTERNAL`, and nothing is
//! logged). Both are the caller's doing: they become `INVALID_ARGUMENT` naming the limit,
//! through the one status table (`crate::grpc::status`), and a log line.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use credbroker_proto::code_name;
use futures_util::future::BoxFuture;
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::base::text::quote;
use crate::engine::broker::{Broker, BrokerError};
use crate::engine::metrics::UNKNOWN_PROVIDER;
use crate::request::RequestError;
use crate::request::caller;

// The decoder's refusals are recognised by their code and their text, because nothing else
// of them reaches this layer, or exists at all (tonic 0.14.9, tonic-prost 0.14.9, prost
// 0.14.6, as Cargo.lock has them):
//
// - This layer wraps the generated service, and tonic's `Grpc::unary` has already turned the
//   decoder's `Status` into an HTTP response (`Status::into_http`): what is left is
//   `grpc-status` and `grpc-message`, read back by `Status::from_header_map`. A status's
//   `source()` never crosses that, and h2 plays no part (these refusals are gRPC's, on a
//   healthy stream).
// - Even before that, none of them carries a type: tonic's decoder makes the too-large one as
//   `Status::out_of_range(format!(..))` (`codec/decode.rs`) with no source; tonic-prost maps
//   every `prost::DecodeError` to `Status::internal(error.to_string())`; and prost keeps the
//   error's kind (`DecodeErrorKind::RecursionLimitReached`) private, its `Display` the only
//   way to tell a too-deep message from a broken one.
//
// So the text below is the contract. `tests::the_decoders_own_statuses_are_recognised` makes
// each status with tonic's and prost's own code, so an upgrade that rewords one fails there
// (and `tests/tests/hostile_requests.rs` checks the whole path over a socket).

/// tonic's message for a message over `max_decoding_message_size` (tonic 0.14,
/// `codec/decode.rs`): "Error, decoded message length too large: found N bytes, …".
const TOO_LARGE_PREFIX: &str = "Error, decoded message length too large";
/// tonic-prost's message for a `prost::DecodeError` (mapped to `INTERNAL`): the error's
/// `Display`, which starts so.
const UNDECODABLE_PREFIX: &str = "failed to decode Protobuf message";
/// prost's reason when a message nests deeper than its recursion limit (100).
const RECURSION_LIMIT: &str = "recursion limit reached";

/// Wraps a generated gRPC service (TokenService, AdminService).
#[derive(Debug, Clone)]
pub struct WireErrors<S> {
    inner: S,
    broker: Arc<Broker>,
}

impl<S> WireErrors<S> {
    pub fn new(inner: S, broker: Arc<Broker>) -> Self {
        Self { inner, broker }
    }
}

impl<S: NamedService> NamedService for WireErrors<S> {
    const NAME: &'static str = S::NAME;
}

type HttpResponse = http::Response<tonic::body::Body>;

impl<S> tower::Service<http::Request<tonic::body::Body>> for WireErrors<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = HttpResponse,
            Error = Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<HttpResponse, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let uid = caller::peer(req.extensions()).uid;
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let broker = self.broker.clone();
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await?;
            Ok(rewrite(response, uid, &method, &broker))
        })
    }
}

/// The decoder's refusal as the caller's error, or `response` unchanged.
fn rewrite(
    response: HttpResponse,
    uid: Option<u32>,
    method: &str,
    broker: &Broker,
) -> HttpResponse {
    // Only a call that failed before any message went out carries its status in the headers.
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    let Some(error) = refusal(&status, broker) else {
        return response;
    };
    let status = Status::from(BrokerError::BadRequest(error));
    tracing::warn!(
        cluster = "(not decoded)",
        code = code_name(status.code()),
        uid,
        error = status.message(),
        "{}",
        quote(method)
    );
    if method == "GetToken" {
        broker
            .metrics()
            .request(UNKNOWN_PROVIDER, status.code(), None);
    }
    status.into_http()
}

/// What a decoder status means for the caller, if it is one of the decoder's.
fn refusal(status: &Status, broker: &Broker) -> Option<RequestError> {
    let message = status.message();
    match status.code() {
        Code::OutOfRange if message.starts_with(TOO_LARGE_PREFIX) => {
            let size = message
                .split("found ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_default();
            Some(RequestError::request_too_large(size, broker.limits()))
        }
        Code::Internal if message.starts_with(UNDECODABLE_PREFIX) => {
            Some(if message.contains(RECURSION_LIMIT) {
                RequestError::TooDeep {
                    limit: broker.limits().max_cluster_config_depth,
                }
            } else {
                RequestError::Undecodable(quote(message))
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn broker() -> Broker {
        let yaml = "limits: {maxRequestBytes: 1000}\nproviders:\n  - {name: f, type: file, file: {path: /x}}\n";
        Broker::new(&Config::parse(yaml, "t").unwrap())
    }

    #[test]
    fn decoder_refusals_become_invalid_argument_naming_the_limit() {
        let b = broker();
        let too_large = Status::out_of_range(
            "Error, decoded message length too large: found 3145800 bytes, the limit is: 1000 bytes",
        );
        let e = refusal(&too_large, &b).unwrap();
        let status = Status::from(BrokerError::BadRequest(e));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with(
                "the request is 3145800 bytes, over the broker's limit of 1000 (limits.maxRequestBytes)"
            ),
            "{}",
            status.message()
        );
        let deep = Status::internal(
            "failed to decode Protobuf message: Value.kind: Struct.fields: recursion limit reached",
        );
        let status = Status::from(BrokerError::BadRequest(refusal(&deep, &b).unwrap()));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("limits.maxClusterConfigDepth"),
            "{}",
            status.message()
        );
        let junk = Status::internal("failed to decode Protobuf message: invalid wire type\n");
        let status = Status::from(BrokerError::BadRequest(refusal(&junk, &b).unwrap()));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(!status.message().contains('\n'), "{}", status.message());
        // The broker's own statuses pass untouched.
        for other in [
            Status::internal("the cache failed"),
            Status::out_of_range("something else"),
            Status::not_found("failed to decode Protobuf message"),
        ] {
            assert!(refusal(&other, &b).is_none(), "{other:?}");
        }
    }

    /// What reaches [`rewrite`] when tonic's decoder, with prost's codec as the generated
    /// server runs it, refuses a request body with `limits.maxRequestBytes` 1000: the status
    /// through HTTP headers and back.
    async fn decoder_status(message: &[u8], declared_len: u32) -> Status {
        use tonic::codec::Codec as _;
        let mut frame = vec![0u8]; // not compressed
        frame.extend_from_slice(&declared_len.to_be_bytes());
        frame.extend_from_slice(message);
        let body = http_body_util::Full::new(hyper::body::Bytes::from(frame));
        let decoder = tonic_prost::ProstCodec::<
            credbroker_proto::v1::GetTokenRequest,
            credbroker_proto::v1::GetTokenRequest,
        >::default()
        .decoder();
        let mut stream = tonic::Streaming::new_request(decoder, body, None, Some(1000));
        let status = stream.message().await.unwrap_err();
        let response = status.into_http::<tonic::body::Body>();
        Status::from_header_map(response.headers()).unwrap()
    }

    #[tokio::test]
    async fn the_decoders_own_statuses_are_recognised() {
        use prost::Message as _;
        use prost_types::value::Kind;
        let b = broker();

        let too_large = decoder_status(b"", 3_145_800).await;
        assert_eq!(
            refusal(&too_large, &b),
            Some(RequestError::request_too_large(3_145_800, b.limits())),
            "{too_large:?}"
        );

        // A Struct nested past prost's recursion limit, in a few hundred bytes.
        let mut value = prost_types::Value {
            kind: Some(Kind::BoolValue(true)),
        };
        for _ in 0..60 {
            value = prost_types::Value {
                kind: Some(Kind::StructValue(prost_types::Struct {
                    fields: [("n".to_owned(), value)].into(),
                })),
            };
        }
        let Some(Kind::StructValue(config)) = value.kind else {
            unreachable!()
        };
        let deep = credbroker_proto::v1::GetTokenRequest {
            provider: "f".into(),
            cluster: Some(credbroker_proto::v1::Cluster {
                config: Some(config),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        assert!(deep.len() < 1000, "{} bytes", deep.len());
        let too_deep = decoder_status(&deep, deep.len() as u32).await;
        assert_eq!(
            refusal(&too_deep, &b),
            Some(RequestError::TooDeep {
                limit: b.limits().max_cluster_config_depth
            }),
            "{too_deep:?}"
        );

        let junk = decoder_status(&[0xff, 0xff], 2).await;
        assert!(
            matches!(refusal(&junk, &b), Some(RequestError::Undecodable(_))),
            "{junk:?}"
        );
    }
}
