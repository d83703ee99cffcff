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

/// tonic's message for a message over `max_decoding_message_size` (tonic 0.14,
/// `codec/decode.rs`): "Error, decoded message length too large: found N bytes, …".
const TOO_LARGE_PREFIX: &str = "Error, decoded message length too large";
/// tonic-prost's message for a `prost::DecodeError` (mapped to `INTERNAL`).
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
}
