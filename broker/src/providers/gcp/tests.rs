//! Unit tests of the gcp provider's pieces; the end-to-end behaviour against local fakes
//! (key exchange, metadata server, federation, outages) is in tests/tests/gcp.rs.

use aws_lc_rs::encoding::AsDer as _;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use aws_lc_rs::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use base64::Engine as _;
use serde_json::json;

use super::http::CallError;
use super::*;
use crate::providers::ProviderTestExt as _;
use crate::request::ClusterInfo;

/// A throwaway RSA key for these tests only, as PKCS#8 PEM, and its public key (PKCS#1 DER).
fn test_key() -> (String, Vec<u8>) {
    let key = KeyPair::generate(KeySize::Rsa2048).unwrap();
    let der = key.as_der().unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap());
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    (pem, key.public_key().as_ref().to_vec())
}

fn sa_json(pem: &str) -> serde_json::Value {
    json!({
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "kid-1",
        "private_key": pem,
        "client_email": "kueue@p.iam.gserviceaccount.com",
        "client_id": "123",
        "token_uri": "http://127.0.0.1:9/token",
    })
}

fn request(cluster: &str) -> TokenRequest {
    let mut config = serde_json::Map::new();
    config.insert("clusterName".into(), json!(cluster));
    TokenRequest {
        provider: "gke".into(),
        cluster: Some(ClusterInfo {
            server: format!("https://{cluster}.example"),
            config: config.into(),
            ..ClusterInfo::default()
        }),
        interactive: false,
    }
}

fn decode_part(part: &str) -> serde_json::Value {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn assertion_is_rs256_signed_with_the_right_claims() {
    let (pem, public) = test_key();
    let key = sa_key::ServiceAccountKey::from_json(&sa_json(&pem)).unwrap();
    let scopes = vec!["s1".to_owned(), "s2".to_owned()];
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let jwt = key.assertion(&scopes, now).unwrap();
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3);
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[2])
        .unwrap();
    let signed = format!("{}.{}", parts[0], parts[1]);
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public)
        .verify(signed.as_bytes(), &signature)
        .expect("the assertion verifies with the key's public key");
    // A different key must not verify it (the check above can fail).
    let (_, other) = test_key();
    assert!(
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &other)
            .verify(signed.as_bytes(), &signature)
            .is_err()
    );
    assert_eq!(
        decode_part(parts[0]),
        json!({"alg": "RS256", "typ": "JWT", "kid": "kid-1"})
    );
    assert_eq!(
        decode_part(parts[1]),
        json!({
            "iss": "kueue@p.iam.gserviceaccount.com",
            "aud": "http://127.0.0.1:9/token",
            "scope": "s1 s2",
            "iat": 1_700_000_000u64,
            "exp": 1_700_003_600u64,
        })
    );
}

#[test]
fn key_file_errors_name_the_field_never_the_value() {
    let (pem, _) = test_key();
    let mut cases: Vec<(serde_json::Value, &str)> = Vec::new();
    let mut j = sa_json(&pem);
    j.as_object_mut().unwrap().remove("client_email");
    cases.push((j, "field `client_email` is missing"));
    let mut j = sa_json(&pem);
    j.as_object_mut().unwrap().remove("private_key");
    cases.push((j, "field `private_key` is missing"));
    let mut j = sa_json(&pem);
    j["private_key"] =
        json!("-----BEGIN PRIVATE KEY-----\nSECRETSECRET!!\n-----END PRIVATE KEY-----\n");
    cases.push((j, "field `private_key`: not PEM"));
    let mut j = sa_json(&pem);
    j["private_key"] = json!("MIIEvQIBADANSECRET");
    cases.push((j, "field `private_key`: not PEM"));
    let mut j = sa_json(&pem);
    j["private_key"] = json!(pem.replace("PRIVATE KEY", "CERTIFICATE"));
    cases.push((
        j,
        "field `private_key`: a PEM block of type \"CERTIFICATE\"",
    ));
    let mut j = sa_json(&pem);
    let b64 = base64::engine::general_purpose::STANDARD.encode(b"SECRET-but-not-a-key");
    j["private_key"] = json!(format!(
        "-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n"
    ));
    cases.push((j, "field `private_key`: not a usable RSA private key"));
    let mut j = sa_json(&pem);
    j["token_uri"] = json!("ftp://x");
    cases.push((j, "field `token_uri`"));
    let mut j = sa_json(&pem);
    j["client_email"] = json!(7);
    cases.push((j, "field `client_email` is not a string"));
    for (json, want) in cases {
        let err = parse_credential_file(&json.to_string()).unwrap_err();
        assert!(err.contains(want), "got {err:?}, want {want:?}");
        assert!(!err.contains("SECRET"), "{err}");
        assert!(!err.contains("MII"), "{err}");
    }
    let err = parse_credential_file("{not json").unwrap_err();
    assert!(err.starts_with("not valid JSON"), "{err}");
    let err = parse_credential_file(r#"{"type": "gdch_service_account"}"#).unwrap_err();
    assert!(
        err.contains("field `type` is \"gdch_service_account\""),
        "{err}"
    );
    let err = parse_credential_file(r#"{"client_email": "a@b.c"}"#).unwrap_err();
    assert!(err.contains("field `type` is missing"), "{err}");
    // A key without token_uri uses Google's token endpoint.
    let mut j = sa_json(&pem);
    j.as_object_mut().unwrap().remove("token_uri");
    let key = sa_key::ServiceAccountKey::from_json(&j).unwrap();
    assert_eq!(key.token_uri, DEFAULT_TOKEN_URI);
    assert!(!format!("{key:?}").contains("BEGIN"), "{key:?}");
}

#[test]
fn library_files_are_checked_before_the_library_sees_them() {
    let ext = json!({
        "type": "external_account",
        "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/x",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": "https://sts.googleapis.com/v1/token",
        "service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/kueue@p.iam.gserviceaccount.com:generateAccessToken",
        "credential_source": {"file": "/var/run/secrets/tokens/gcp"},
    });
    let CredentialFile::Library { kind, identity, .. } =
        parse_credential_file(&ext.to_string()).unwrap()
    else {
        panic!("external_account is the library's");
    };
    assert_eq!(kind, library::Kind::ExternalAccount);
    assert_eq!(
        identity,
        "external_account://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/x:as:kueue@p.iam.gserviceaccount.com"
    );
    assert_eq!(kind.assumed_lifetime(&ext), LIBRARY_IMPERSONATION_LIFETIME);
    let mut direct = ext.clone();
    direct
        .as_object_mut()
        .unwrap()
        .remove("service_account_impersonation_url");
    assert_eq!(kind.assumed_lifetime(&direct), OPAQUE_TOKEN_LIFETIME);

    let mut bad = ext.clone();
    bad.as_object_mut().unwrap().remove("credential_source");
    let e = parse_credential_file(&bad.to_string()).unwrap_err();
    assert_eq!(e, "field `credential_source` is missing");
    let mut bad = ext.clone();
    bad["audience"] = json!("");
    let e = parse_credential_file(&bad.to_string()).unwrap_err();
    assert_eq!(e, "field `audience` is empty");
    let user = json!({"type": "authorized_user", "client_id": "c", "client_secret": "s"});
    let e = parse_credential_file(&user.to_string()).unwrap_err();
    assert_eq!(e, "field `refresh_token` is missing");
    let imp = json!({"type": "impersonated_service_account", "service_account_impersonation_url": "u", "source_credentials": "x"});
    let e = parse_credential_file(&imp.to_string()).unwrap_err();
    assert_eq!(e, "field `source_credentials` is not an object");
}

fn provider(config: GcpConfig, env: Env) -> GcpProvider {
    GcpProvider::new("gke", config, env)
}

#[test]
fn adc_order_and_what_was_tried() {
    let dir = tempfile::tempdir().unwrap();
    let explicit = dir.path().join("explicit.json");
    let from_env = dir.path().join("env.json");
    let gcloud_dir = dir.path().join("gcloud");
    std::fs::create_dir(&gcloud_dir).unwrap();
    let env = Env {
        google_application_credentials: Some(from_env.clone()),
        cloudsdk_config: Some(gcloud_dir.clone()),
        home: Some(dir.path().to_owned()),
        gce_metadata_host: Some("127.0.0.1:1".into()),
    };
    let config = GcpConfig {
        credentials_file: Some(explicit.clone()),
        ..GcpConfig::default()
    };
    assert_eq!(
        provider(config, env.clone()).locate().unwrap(),
        Source::File {
            path: explicit,
            origin: Origin::Config
        }
    );
    assert_eq!(
        provider(GcpConfig::default(), env.clone())
            .locate()
            .unwrap(),
        Source::File {
            path: from_env,
            origin: Origin::EnvVar
        }
    );
    let no_env = Env {
        google_application_credentials: None,
        ..env.clone()
    };
    // gcloud's file only counts when it exists; then the metadata server, with the list.
    let Source::Metadata { host, tried } = provider(GcpConfig::default(), no_env.clone())
        .locate()
        .unwrap()
    else {
        panic!("metadata expected");
    };
    assert_eq!(host, "127.0.0.1:1");
    assert_eq!(tried[0], "GOOGLE_APPLICATION_CREDENTIALS is not set");
    assert!(tried[1].contains(&gcloud_dir.join(GCLOUD_ADC_FILE).display().to_string()));
    std::fs::write(gcloud_dir.join(GCLOUD_ADC_FILE), "{}").unwrap();
    assert_eq!(
        provider(GcpConfig::default(), no_env.clone())
            .locate()
            .unwrap(),
        Source::File {
            path: gcloud_dir.join(GCLOUD_ADC_FILE),
            origin: Origin::Gcloud
        }
    );
    // Without CLOUDSDK_CONFIG, gcloud's default dir under HOME; without a host, Google's.
    let home_only = Env {
        google_application_credentials: None,
        cloudsdk_config: None,
        home: Some(dir.path().to_owned()),
        gce_metadata_host: None,
    };
    let Source::Metadata { host, tried } =
        provider(GcpConfig::default(), home_only).locate().unwrap()
    else {
        panic!("metadata expected");
    };
    assert_eq!(host, DEFAULT_METADATA_HOST);
    assert!(
        tried[1].contains(".config/gcloud/application_default_credentials.json"),
        "{tried:?}"
    );
}

#[test]
fn identity_is_per_credential_and_scopes_never_per_cluster() {
    let (pem, _) = test_key();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.json");
    std::fs::write(&key, sa_json(&pem).to_string()).unwrap();
    let env = Env {
        gce_metadata_host: Some("127.0.0.1:1".into()),
        ..Env::default()
    };
    let with = |scopes: Option<Vec<&str>>, target: Option<&str>| {
        provider(
            GcpConfig {
                credentials_file: Some(key.clone()),
                scopes: scopes.map(|s| s.into_iter().map(str::to_owned).collect()),
                impersonate_service_account: target.map(str::to_owned),
                ..GcpConfig::default()
            },
            env.clone(),
        )
    };
    let p = with(None, None);
    let a = p.key_for(&request("east")).unwrap();
    assert_eq!(a, p.key_for(&request("west")).unwrap());
    assert_eq!(
        a,
        format!(
            "service_account:kueue@p.iam.gserviceaccount.com|scopes={SCOPE_CLOUD_PLATFORM},{SCOPE_USERINFO_EMAIL}"
        )
    );
    // Scope order does not matter, the scope set does.
    let b = with(Some(vec!["y", "x", "y"]), None)
        .key_for(&request("east"))
        .unwrap();
    let c = with(Some(vec!["x", "y"]), None)
        .key_for(&request("east"))
        .unwrap();
    assert_eq!(b, c);
    assert_ne!(a, b);
    let d = with(None, Some("t@p.iam.gserviceaccount.com"))
        .key_for(&request("east"))
        .unwrap();
    assert!(
        d.ends_with("|impersonate=t@p.iam.gserviceaccount.com"),
        "{d}"
    );
    // The metadata server's identity is its host.
    let m = provider(GcpConfig::default(), env)
        .key_for(&request("east"))
        .unwrap();
    assert!(m.starts_with("metadata:127.0.0.1:1|scopes="), "{m}");
}

#[tokio::test]
async fn missing_and_malformed_files_say_which_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let p = provider(
        GcpConfig::default(),
        Env {
            google_application_credentials: Some(missing.clone()),
            gce_metadata_host: Some("127.0.0.1:1".into()),
            ..Env::default()
        },
    );
    let ProviderError::NotFound(m) = p.fetch_for(&request("c")).await.unwrap_err() else {
        panic!("NotFound expected");
    };
    assert!(m.contains(&missing.display().to_string()), "{m}");
    assert!(m.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{m}");

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"type": "service_account", "client_email": "a@p.iam.gserviceaccount.com", "private_key": "oops"}"#).unwrap();
    let p = provider(
        GcpConfig {
            credentials_file: Some(bad.clone()),
            ..GcpConfig::default()
        },
        Env::default(),
    );
    let e = p.key_for(&request("c")).unwrap_err();
    let ProviderError::Unavailable(m) = e else {
        panic!("Unavailable expected: {e:?}");
    };
    assert!(m.contains(&bad.display().to_string()), "{m}");
    assert!(m.contains("gcp.credentialsFile"), "{m}");
    assert!(m.contains("field `private_key`"), "{m}");
}

#[tokio::test]
async fn no_credentials_anywhere_lists_what_was_tried() {
    // A port nothing listens on: connection refused, at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let p = provider(
        GcpConfig::default(),
        Env {
            home: Some(dir.path().to_owned()),
            gce_metadata_host: Some(format!("127.0.0.1:{port}")),
            ..Env::default()
        },
    );
    let e = p.fetch_for(&request("c")).await.unwrap_err();
    let ProviderError::Unavailable(m) = e else {
        panic!("Unavailable expected: {e:?}");
    };
    assert!(m.starts_with("no Google credentials found"), "{m}");
    assert!(
        m.contains("GOOGLE_APPLICATION_CREDENTIALS is not set"),
        "{m}"
    );
    assert!(m.contains("no gcloud ADC file at"), "{m}");
    assert!(
        m.contains(&format!("metadata server at 127.0.0.1:{port}")),
        "{m}"
    );
}

#[test]
fn upstream_failures_are_classified() {
    let status = |code: u16, detail: &str| CallError::Status {
        url: "http://t/token".into(),
        status: code,
        detail: detail.into(),
    };
    type Check = fn(&ProviderError) -> bool;
    let cases: Vec<(CallError, Check)> = vec![
        (status(400, "invalid_grant: Invalid JWT Signature."), |e| {
            matches!(e, ProviderError::Denied(_))
        }),
        (status(403, ""), |e| matches!(e, ProviderError::Denied(_))),
        (status(401, ""), |e| matches!(e, ProviderError::Denied(_))),
        (status(500, ""), |e| {
            matches!(e, ProviderError::Unavailable(_))
        }),
        (status(503, ""), |e| {
            matches!(e, ProviderError::Unavailable(_))
        }),
        (status(429, ""), |e| {
            matches!(e, ProviderError::Unavailable(_))
        }),
        (status(408, ""), |e| {
            matches!(e, ProviderError::Unavailable(_))
        }),
        (
            CallError::Timeout {
                url: "http://t".into(),
            },
            |e| matches!(e, ProviderError::Timeout(_)),
        ),
        (
            CallError::Connect {
                url: "http://t".into(),
                why: "refused".into(),
            },
            |e| matches!(e, ProviderError::Unavailable(_)),
        ),
    ];
    for (call, ok) in cases {
        let shown = format!("{call:?}");
        let e = call.into_provider_error("key file k.json");
        assert!(ok(&e), "{shown} → {e:?}");
        assert!(e.to_string().starts_with("key file k.json: "), "{e}");
    }
    let e = status(400, "invalid_grant: Invalid JWT Signature.").into_provider_error("k");
    assert_eq!(
        e.to_string(),
        "k: http://t/token answered HTTP 400: invalid_grant: Invalid JWT Signature."
    );
}

#[test]
fn secrets_in_upstream_text_are_redacted() {
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJrdWV1ZUBwIn0.c2lnbmF0dXJlLXRoYXQtaXMtbG9uZw";
    let text = format!(
        "bad assertion {jwt} for ya29.a0AfH6SMBxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx at https://sts.googleapis.com/v1/token"
    );
    let clean = sanitize(&text);
    assert!(!clean.contains("eyJ"), "{clean}");
    assert!(!clean.contains("ya29"), "{clean}");
    assert!(
        clean.contains("https://sts.googleapis.com/v1/token"),
        "{clean}"
    );
    assert!(
        clean.starts_with("bad assertion [redacted] for [redacted] at"),
        "{clean}"
    );
    let long = "word ".repeat(500);
    assert!(sanitize(&long).len() < 700);
}

#[test]
fn delegates_become_resource_names() {
    assert_eq!(
        http::delegate_name("d@p.iam.gserviceaccount.com"),
        "projects/-/serviceAccounts/d@p.iam.gserviceaccount.com"
    );
    assert_eq!(
        http::delegate_name("projects/-/serviceAccounts/d@p.iam.gserviceaccount.com"),
        "projects/-/serviceAccounts/d@p.iam.gserviceaccount.com"
    );
}
