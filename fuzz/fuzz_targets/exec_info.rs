//! `KUBERNETES_EXEC_INFO` as client-go sets it, parsed by the shim: never panics, and a
//! document it accepts becomes a request (and a reply) without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;

use credbroker_execcred::{exec_credential, parse_exec_info};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_exec_info(Some(text)) {
        Ok(info) => {
            // What the shim does next with an accepted document: print a credential in
            // the same apiVersion.
            let status = exec_credential::Status {
                token: "t",
                client_certificate_data: "",
                client_key_data: "",
                expiration_unix: Some(4_102_444_800),
            };
            let _ = exec_credential::render(info.api_version, &status, 0);
            // What the broker hands a wrapped plugin, rendered from it, parses back the same
            // (the config's text untouched).
            let again = parse_exec_info(Some(&info.to_json())).expect("rendered exec info parses");
            assert_eq!(again, info);
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
});
