//! A GetToken request as the broker parses it: protobuf bytes → `GetTokenRequest` (prost, as
//! tonic decodes it) → `TokenRequest::from_proto` with the default limits. Never panics; an
//! accepted request is within every limit and goes through the cache's compact form;
//! a refusal, and the cluster label a log line shows, are one bounded line.
#![no_main]

use credbroker::config::LimitsConfig;
use credbroker::request::{StoredRequest, TokenRequest, cluster_label_of};
use credbroker_proto::v1::GetTokenRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let limits = LimitsConfig::default();
    // tonic refuses a message over the limit before decoding it.
    if data.len() > limits.max_request_bytes as usize {
        return;
    }
    let Ok(msg) = GetTokenRequest::decode(data) else {
        return;
    };
    let label = cluster_label_of(&msg);
    assert!(!label.chars().any(char::is_control), "{label:?}");
    assert!(label.len() <= 4 * 256 + 32, "{} bytes", label.len());
    match TokenRequest::from_proto(msg, &limits) {
        Ok(req) => {
            assert!(!req.provider.is_empty());
            assert!(req.provider.len() <= limits.max_provider_name_bytes as usize);
            if let Some(c) = &req.cluster {
                for field in [&c.server, &c.tls_server_name, &c.proxy_url] {
                    assert!(field.len() <= limits.max_field_bytes as usize);
                }
                // What a wrapped plugin gets parses back to the same cluster, its config
                // text untouched.
                let info = credbroker_execcred::ExecInfo {
                    api_version: credbroker_execcred::ApiVersion::V1,
                    interactive: false,
                    cluster: Some(c.to_exec_cluster()),
                }
                .to_json();
                let back = credbroker_execcred::parse_exec_info(Some(&info))
                    .expect("rendered KUBERNETES_EXEC_INFO parses");
                assert_eq!(back.cluster, Some(c.to_exec_cluster()));
            }
            let _ = req.cluster_label();
            // What the cache keeps for a forced refresh comes back as it was.
            assert_eq!(StoredRequest::new(&req, true).request(), req);
        }
        Err(e) => {
            let message = e.to_string();
            assert!(!message.chars().any(char::is_control), "{message:?}");
            assert!(message.len() < 2048, "{} bytes", message.len());
        }
    }
});
