use super::*;

fn info(raw: &str) -> Result<ExecInfo, Error> {
    parse_exec_info(Some(raw))
}

#[test]
fn absent_or_empty_is_v1beta1_without_cluster() {
    for raw in [None, Some(""), Some("  \n")] {
        let i = parse_exec_info(raw).unwrap();
        assert_eq!(i.api_version, ApiVersion::V1Beta1);
        assert!(!i.interactive);
        assert_eq!(i.cluster, None);
    }
}

#[test]
fn v1_with_full_cluster() {
    let raw = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
            "spec":{"interactive":true,"cluster":{
                "server":"https://10.0.0.1:6443","tls-server-name":"kube.example",
                "insecure-skip-tls-verify":true,"certificate-authority-data":"UEVNIQ==",
                "proxy-url":"http://proxy:3128","disable-compression":true,
                "config":{"clusterName":"c1","region":"us-west-2","replicas":3,
                          "nested":{"list":[1.5,"x",null,false],"empty":{}}}}}}"#;
    let i = info(raw).unwrap();
    assert_eq!(i.api_version, ApiVersion::V1);
    assert!(i.interactive);
    let c = i.cluster.unwrap();
    assert_eq!(c.server, "https://10.0.0.1:6443");
    assert_eq!(c.tls_server_name, "kube.example");
    assert!(c.insecure_skip_tls_verify);
    assert_eq!(c.certificate_authority_data, b"PEM!");
    assert_eq!(c.proxy_url, "http://proxy:3128");
    assert!(c.disable_compression);

    // The config as written: key order, spacing and numbers untouched.
    assert_eq!(
        c.config.as_deref(),
        Some(
            r#"{"clusterName":"c1","region":"us-west-2","replicas":3,
                          "nested":{"list":[1.5,"x",null,false],"empty":{}}}"#
        )
    );
}

#[test]
fn v1beta1_without_cluster() {
    let raw = r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}"#;
    let i = info(raw).unwrap();
    assert_eq!(i.api_version, ApiVersion::V1Beta1);
    assert_eq!(i.cluster, None);
}

#[test]
fn minimal_cluster_has_empty_defaults() {
    let raw = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"server":"https://x"}}}"#;
    let c = info(raw).unwrap().cluster.unwrap();
    assert_eq!(c.server, "https://x");
    assert!(c.certificate_authority_data.is_empty());
    assert_eq!(c.config, None);
}

#[test]
fn bad_inputs_name_what_is_wrong() {
    let cases = [
        ("{not json", "not valid JSON"),
        ("[1]", "not a JSON object"),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Pod"}"#,
            "kind is \"Pod\"",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1alpha1","kind":"ExecCredential"}"#,
            "apiVersion \"client.authentication.k8s.io/v1alpha1\" is not supported",
        ),
        (
            r#"{"kind":"ExecCredential"}"#,
            "apiVersion \"\" is not supported",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"certificate-authority-data":"***"}}}"#,
            "spec.cluster.certificate-authority-data is not valid base64",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"config":[1]}}}"#,
            "spec.cluster.config must be a JSON object",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"server":1}}}"#,
            "spec.cluster.server must be a string",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":"yes"}}"#,
            "spec.interactive must be true or false",
        ),
        (
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":"x"}}"#,
            "spec.cluster must be a JSON object",
        ),
    ];
    for (raw, want) in cases {
        let err = info(raw).unwrap_err().to_string();
        assert!(err.contains(want), "{raw}: got {err:?}, want {want:?}");
    }
}

/// What client-go sets (Go's encoding/json: compact, struct field order), with a config
/// holding integers a double cannot carry.
const FROM_CLIENT_GO: &str = r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"cluster":{"server":"https://10.0.0.1:6443","tls-server-name":"kube.example","insecure-skip-tls-verify":true,"certificate-authority-data":"UEVNIQ==","proxy-url":"http://proxy:3128","disable-compression":true,"config":{"zone":"b","clusterName":"c1","id":9007199254740993,"big":123456789012345678901234567890,"ratio":1.50}},"interactive":false}}"#;

#[test]
fn config_is_carried_as_written_and_rendered_back_byte_for_byte() {
    let i = info(FROM_CLIENT_GO).unwrap();
    assert_eq!(
        i.cluster.as_ref().unwrap().config.as_deref(),
        Some(
            r#"{"zone":"b","clusterName":"c1","id":9007199254740993,"big":123456789012345678901234567890,"ratio":1.50}"#
        )
    );
    assert_eq!(i.to_json(), FROM_CLIENT_GO);
    // And back again.
    assert_eq!(info(&i.to_json()).unwrap(), i);
}

#[test]
fn rendering_leaves_out_empty_fields_as_client_go_does() {
    let i = ExecInfo {
        api_version: ApiVersion::V1Beta1,
        interactive: false,
        cluster: Some(Cluster {
            server: "https://x\"y".into(),
            ..Cluster::default()
        }),
    };
    assert_eq!(
        i.to_json(),
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{"cluster":{"server":"https://x\"y"},"interactive":false}}"#
    );
    let bare = ExecInfo {
        cluster: None,
        interactive: true,
        ..i
    };
    assert_eq!(
        bare.to_json(),
        r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{"interactive":true}}"#
    );
    assert_eq!(info(&bare.to_json()).unwrap(), bare);
}

#[test]
fn duplicate_keys_resolve_like_serde_json() {
    let raw = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"cluster":{"config":{"a":1},"config":{"b":2}}}}"#;
    assert_eq!(
        info(raw).unwrap().cluster.unwrap().config.as_deref(),
        Some(r#"{"b":2}"#)
    );
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever client-go (or anyone) puts in KUBERNETES_EXEC_INFO: a result, never a panic.
        #[test]
        fn exec_info_never_panics(raw in "[ -~]{0,300}") {
            let _ = parse_exec_info(Some(&raw));
        }

        #[test]
        fn structured_exec_info_round_trips(
            v1 in any::<bool>(),
            server in "https://[a-z]{1,10}\\.example",
            name in "[a-z0-9-]{1,20}",
            port in 1u16..,
        ) {
            let api = if v1 { "client.authentication.k8s.io/v1" } else { "client.authentication.k8s.io/v1beta1" };
            let raw = serde_json::json!({
                "apiVersion": api, "kind": "ExecCredential",
                "spec": {"interactive": false, "cluster": {"server": server, "config": {"clusterName": name, "port": port}}},
            }).to_string();
            let info = parse_exec_info(Some(&raw)).unwrap();
            let cluster = info.cluster.unwrap();
            prop_assert_eq!(cluster.server, server);
            let config: Value = serde_json::from_str(&cluster.config.unwrap()).unwrap();
            prop_assert_eq!(config, serde_json::json!({"clusterName": name, "port": port}));
        }

    }
}
