use super::*;

fn response<'a>(token: &'a str, cert: &'a str, key: &'a str, expiry: Option<i64>) -> Status<'a> {
    Status {
        token,
        client_certificate_data: cert,
        client_key_data: key,
        expiration_unix: expiry,
    }
}

const NOW: i64 = 1_764_505_800; // 2025-11-30T12:30:00Z
const LATER: i64 = 1_796_041_296; // 2026-11-30T12:21:36Z

#[test]
fn token_output() {
    for v in [ApiVersion::V1, ApiVersion::V1Beta1] {
        let out = render(v, &response("tok", "", "", Some(LATER)), NOW).unwrap();
        let doc: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({
                "apiVersion": v.as_str(),
                "kind": "ExecCredential",
                "status": {"token": "tok", "expirationTimestamp": "2026-11-30T12:21:36Z"}
            })
        );
        assert!(!out.contains('\n'));
    }
}

#[test]
fn cert_and_key_output() {
    let resp = response("", "CERT PEM", "KEY PEM", Some(LATER));
    let out = render(ApiVersion::V1, &resp, NOW).unwrap();
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {
                "clientCertificateData": "CERT PEM",
                "clientKeyData": "KEY PEM",
                "expirationTimestamp": "2026-11-30T12:21:36Z"
            }
        })
    );
}

#[test]
fn unusable_responses_are_errors() {
    let cases = [
        (response("", "", "", Some(LATER)), "neither a token"),
        (response("", "CERT", "", Some(LATER)), "without its key"),
        (response("", "", "KEY", Some(LATER)), "without its key"),
        (response("tok", "", "", None), "no expiration_time"),
        (
            response("tok", "", "", Some(NOW)),
            "expiration_time 2025-11-30T12:30:00Z is not in the future",
        ),
        (response("tok", "", "", Some(0)), "1970-01-01T00:00:00Z"),
        (response("tok", "", "", Some(i64::MAX)), "past year 9999"),
    ];
    for (resp, want) in cases {
        let err = render(ApiVersion::V1, &resp, NOW).unwrap_err().to_string();
        assert!(err.contains(want), "got {err:?}, want {want:?}");
    }
}

#[test]
fn parses_tokens_and_key_pairs_of_either_version() {
    let c = parse(br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"tok","clientKeyData":"K","expirationTimestamp":"2026-11-30T12:21:36Z"}}"#).unwrap();
    assert_eq!(c.api_version, ApiVersion::V1Beta1);
    assert_eq!(c.credential, Credential::Token("tok".into()));
    assert_eq!(
        c.expiration,
        Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(LATER as u64))
    );
    let c = parse(br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"","clientCertificateData":"C","clientKeyData":"K"}}"#).unwrap();
    assert_eq!(
        c.credential,
        Credential::ClientCertificate {
            certificate_pem: "C".into(),
            key_pem: "K".into()
        }
    );
    assert_eq!(c.expiration, None);
}

#[test]
fn parse_errors_name_the_structure_never_the_secret() {
    let cases: [(&[u8], &str); 7] = [
            (b"nope", "not JSON"),
            (br#"{"apiVersion":"v9","kind":"ExecCredential"}"#, "apiVersion must be"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Pod"}"#, "kind must be ExecCredential"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#, "no status object"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":1}}"#, "status.token must be a string"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientKeyData":"SECRETKEY"}}"#, "go together"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"SECRETTOKEN","expirationTimestamp":"soon"}}"#, "status.expirationTimestamp \"soon\": not an RFC 3339 time"),
        ];
    for (raw, want) in cases {
        let e = parse(raw).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
    }
}

#[test]
fn debug_never_shows_a_secret() {
    let c = ExecCredential {
        api_version: ApiVersion::V1,
        credential: Credential::ClientCertificate {
            certificate_pem: "CERT".into(),
            key_pem: "SECRETKEY".into(),
        },
        expiration: None,
    };
    let t = Credential::Token("SECRETTOKEN".into());
    let s = response("SECRETTOKEN", "C", "SECRETKEY", None);
    for shown in [format!("{c:?}"), format!("{t:?}"), format!("{s:?}")] {
        assert!(!shown.contains("SECRET"), "{shown}");
    }
}

#[test]
fn what_the_shim_renders_the_broker_parses() {
    for v in [ApiVersion::V1, ApiVersion::V1Beta1] {
        let out = render(v, &response("tok", "", "", Some(LATER)), NOW).unwrap();
        let back = parse(out.as_bytes()).unwrap();
        assert_eq!(back.api_version, v);
        assert_eq!(back.credential, Credential::Token("tok".into()));
        assert_eq!(
            back.expiration,
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(LATER as u64))
        );
    }
}
