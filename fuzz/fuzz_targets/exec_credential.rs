//! The ExecCredential a wrapped plugin prints, parsed by the broker's exec provider:
//! never panics, and an error never quotes the credential. The second property is checked
//! by planting canaries as `status.token` and `status.clientKeyData` in whatever JSON
//! object the fuzzer made, so the rest of the document is the fuzzer's choice.
#![no_main]

use std::time::Duration;

use credbroker::providers::CredentialSecret;
use credbroker::providers::exec::parse_exec_credential;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const TOKEN: &str = "TOKEN-CANARY-0f3a9c71";
const KEY: &str = "KEY-CANARY-5be21d04";

fuzz_target!(|data: &[u8]| {
    let lifetime = Duration::from_secs(900);
    let _ = parse_exec_credential(data, lifetime);

    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let status = doc
        .entry("status")
        .or_insert_with(|| Value::Object(Default::default()));
    let Value::Object(status) = status else {
        return;
    };
    status.insert("token".into(), TOKEN.into());
    let with_key = status.contains_key("clientKeyData");
    if with_key {
        status.insert("clientKeyData".into(), KEY.into());
    }
    let text = Value::Object(doc).to_string();
    // A canary must appear only where it was planted, or a quoted field is not a leak (the
    // fuzzer learns the canaries' bytes and writes them into other fields).
    if text.matches(TOKEN).count() != 1 || text.matches(KEY).count() != usize::from(with_key) {
        return;
    }
    match parse_exec_credential(text.as_bytes(), lifetime) {
        Ok(credential) => match credential.secret {
            // A token, when present, wins over a key pair.
            CredentialSecret::Token(t) => assert_eq!(t.expose(), TOKEN),
            CredentialSecret::ClientCertificate { .. } => panic!("token ignored: {text}"),
        },
        Err(message) => {
            assert!(!message.contains(TOKEN), "{message}");
            assert!(!message.contains(KEY), "{message}");
        }
    }
});
