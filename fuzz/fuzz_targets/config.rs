//! The broker's config file: never panics, and an error never quotes a secret. YAML is a
//! superset of JSON, so a JSON document the fuzzer made is also fed back with canaries
//! planted where the config holds secrets (an AWS `externalId`, exec plugin `env` values).
#![no_main]

use credbroker::config::Config;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const CANARY: &str = "SECRET-CANARY-77c0e1b2";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Config::parse(text, "fuzz.yaml");

    let Ok(Value::Object(mut doc)) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let Some(Value::Array(providers)) = doc.get_mut("providers") else {
        return;
    };
    for p in providers.iter_mut() {
        if let Some(Value::Object(aws)) = p.get_mut("aws") {
            aws.insert("externalId".into(), CANARY.into());
        }
        if let Some(Value::Object(exec)) = p.get_mut("exec")
            && let Some(Value::Object(env)) = exec.get_mut("env")
        {
            for v in env.values_mut() {
                *v = CANARY.into();
            }
        }
    }
    let planted = Value::Object(doc).to_string();
    if let Err(e) = Config::parse(&planted, "fuzz.yaml") {
        let message = e.to_string();
        assert!(!message.contains(CANARY), "{message}\nfrom {planted}");
    }
});
