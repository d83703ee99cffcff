//! `credbroker.v1.TokenService`: one `GetToken` per exec-plugin run. Identifies the caller,
//! asks the [`Broker`], logs and counts the call, and turns the answer into the response
//! client-go's `ExecCredential` is made of (or the error into its status, through
//! `crate::grpc::status`).

use std::sync::Arc;

use credbroker_proto::code_name;
use credbroker_proto::v1::token_service_server::TokenService;
use credbroker_proto::v1::{GetTokenRequest, GetTokenResponse};
use tonic::{Code, Request, Response, Status};

use crate::base::text::quote;
use crate::engine::broker::{Broker, BrokerError};
use crate::engine::cache::Served;
use crate::grpc::ratelimit::{REFUSAL_LOG_INTERVAL, RefusalLog};
use crate::providers::CredentialSecret;
use crate::request::caller;
use crate::request::cluster_label_of;

/// The tonic service over [`Broker`].
#[derive(Debug, Clone)]
pub struct TokenApi {
    broker: Arc<Broker>,
    /// Callers outside the allow lists, logged once and then summed up.
    refused: Arc<RefusalLog>,
}

impl TokenApi {
    pub fn new(broker: Arc<Broker>) -> Self {
        Self {
            broker,
            refused: Arc::default(),
        }
    }
}

#[tonic::async_trait]
impl TokenService for TokenApi {
    async fn get_token(
        &self,
        request: Request<GetTokenRequest>,
    ) -> Result<Response<GetTokenResponse>, Status> {
        let started = std::time::Instant::now();
        let peer = caller::peer(request.extensions());
        let msg = request.into_inner();
        // Caller text, bounded and escaped before it goes near a log line or a metric.
        let provider = quote(&msg.provider);
        let cluster = cluster_label_of(&msg);
        let label = self.broker.metric_label(&msg.provider).to_owned();
        let result = self.broker.get_token(peer, msg).await;
        let elapsed = started.elapsed();
        match result {
            Ok((served, _)) => {
                self.broker
                    .metrics()
                    .request(&label, Code::Ok, Some(served.outcome));
                tracing::info!(provider, cluster, code = code_name(Code::Ok), outcome = ?served.outcome, ?elapsed, uid = peer.uid, "GetToken");
                Ok(Response::new(response(served)))
            }
            Err(e) => {
                let not_allowed = matches!(e, BrokerError::CallerNotAllowed { .. });
                let status = Status::from(e);
                self.broker.metrics().request(&label, status.code(), None);
                if !not_allowed {
                    tracing::warn!(
                        provider,
                        cluster,
                        code = code_name(status.code()),
                        ?elapsed,
                        uid = peer.uid,
                        error = status.message(),
                        "GetToken"
                    );
                } else if let Some(refused) = self.refused.note(peer.uid.unwrap_or(u32::MAX), true)
                {
                    // A caller the allow lists refuse can call in a loop: summed up.
                    tracing::warn!(
                        provider,
                        cluster,
                        code = code_name(status.code()),
                        uid = peer.uid,
                        refused,
                        error = status.message(),
                        "GetToken refused: {refused} call(s) of this caller; further refusals are summed up every {}s",
                        REFUSAL_LOG_INTERVAL.as_secs()
                    );
                }
                Err(status)
            }
        }
    }
}

fn response(served: Served) -> GetTokenResponse {
    let mut out = GetTokenResponse {
        expiration_time: Some(prost_types::Timestamp::from(
            crate::base::clock::whole_second_at_or_after(served.come_back),
        )),
        ..Default::default()
    };
    match served.credential.secret {
        CredentialSecret::Token(token) => out.token = token.expose().to_owned(),
        CredentialSecret::ClientCertificate {
            certificate_pem,
            key_pem,
        } => {
            out.client_certificate_data = certificate_pem;
            out.client_key_data = key_pem.expose().to_owned();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn the_answer_carries_the_come_back_time_rounded_up_to_a_whole_second() {
        let at = |secs: u64, nanos: u32| SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        let served = Served {
            credential: crate::providers::Credential::token("t", at(2000, 0)),
            come_back: at(1000, 999_999_999),
            outcome: crate::engine::cache::Outcome::Hit,
        };
        let out = response(served);
        assert_eq!(out.expiration_time.unwrap().seconds, 1001);
        assert_eq!(out.token, "t");
    }
}
