//! `KUBERNETES_EXEC_INFO` as client-go sets it, parsed by the shim: never panics, and a
//! document it accepts becomes a request (and a reply) without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code, unreachable_pub)]
#[path = "../../shim/src/exec_credential.rs"]
mod exec_credential;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match exec_credential::parse_exec_info(Some(text)) {
        Ok(info) => {
            // What the shim does next with an accepted document: print a credential in
            // the same apiVersion.
            let response = credbroker_proto::v1::GetTokenResponse {
                token: "t".into(),
                expiration_time: Some(prost_types::Timestamp {
                    seconds: 4_102_444_800,
                    nanos: 0,
                }),
                ..Default::default()
            };
            let _ = exec_credential::exec_credential_json(info.api_version, &response, 0);
        }
        Err(message) => assert!(!message.is_empty()),
    }
});
