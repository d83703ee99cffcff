//! A ClusterProfile describes a cluster; it does not choose who the broker is. End to end over
//! the real socket with a kubernetesSecret provider on the fake hub API server: a cluster
//! whose exec extension picks another Secret data key (or another Secret through a template
//! placeholder) is refused with PERMISSION_DENIED naming the key and the config that would
//! allow it, and is served once the provider's `allowOverrides` matches. The refusal leaves
//! the cache alone.

use std::path::PathBuf;

use credbroker_proto::v1::ListEntriesRequest;
use credbroker_proto::v1::admin_service_client::AdminServiceClient;
use credbroker_tests::fakes::kube_api::FakeKubeApi;
use credbroker_tests::{
    Broker, V1, assert_credential, assert_shim_error, config_yaml, describe, exec_info, run_shim,
    tempdir, unix_channel, yaml_str,
};
use serde_json::{Value, json};

const NAMESPACE: &str = "kueue-system";
const HUB_TOKEN: &str = "hub-token-for-the-broker";

/// A fake hub holding, per worker cluster, the Kueue token and (the prize) an admin token
/// under another key, plus another team's Secret reachable only through a placeholder.
fn hub() -> FakeKubeApi {
    let api = FakeKubeApi::start(NAMESPACE, HUB_TOKEN);
    api.put_secret(
        "w1-kueue",
        &[("app", "kueue")],
        &[("token", b"tok-w1-kueue"), ("admin-token", b"tok-w1-admin")],
    );
    api.put_secret(
        "w1-payroll",
        &[("app", "kueue")],
        &[("token", b"tok-w1-payroll")],
    );
    api
}

/// A broker with one kubernetesSecret provider `secrets` (`{clusterName}-{team}`, team
/// defaulting to kueue) and `allow` as its `allowOverrides` entry when given.
fn broker(api: &FakeKubeApi, dir: &tempfile::TempDir, allow: Option<&str>) -> Broker {
    let kubeconfig: PathBuf = dir.path().join("hub.kubeconfig");
    api.write_kubeconfig(&kubeconfig, HUB_TOKEN);
    let allow = allow.map_or_else(String::new, |a| format!("    allowOverrides: {a}\n"));
    let provider = format!(
        "  - name: secrets\n    type: kubernetesSecret\n{allow}    kubernetesSecret: {{namespace: {NAMESPACE}, labelSelector: app=kueue, kubeconfig: {}, nameTemplate: \"{{clusterName}}-{{team}}\", templateDefaults: {{team: kueue}}}}\n",
        yaml_str(kubeconfig.to_str().expect("UTF-8 path"))
    );
    Broker::start_with(&config_yaml(&[provider]), &[], &[("RUST_LOG", "info")])
}

fn shim(broker: &Broker, config: Value) -> std::process::Output {
    let info = exec_info(V1, "https://w1.example", config);
    run_shim(broker.socket(), &["--provider", "secrets"], Some(&info))
}

fn token(broker: &Broker, config: Value) -> String {
    let out = shim(broker, config);
    assert!(
        out.status.success(),
        "{}\nbroker log:\n{}",
        describe(&out),
        broker.logs()
    );
    assert_credential(&out, V1).token
}

fn entries(broker: &Broker) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut client = AdminServiceClient::new(unix_channel(broker.socket()).await);
        client
            .list_entries(ListEntriesRequest::default())
            .await
            .expect("ListEntries")
            .into_inner()
            .entries
            .len()
    })
}

#[test]
fn per_cluster_secret_selectors_are_refused_until_allowed() {
    let api = hub();
    let dir = tempdir();
    let broker = broker(&api, &dir, None);

    // What only locates the cluster is served as always.
    assert_eq!(token(&broker, json!({"clusterName": "w1"})), "tok-w1-kueue");
    // Spelling out the provider's own values is not an override.
    assert_eq!(
        token(
            &broker,
            json!({"clusterName": "w1", "key": "token", "team": "kueue", "namespace": NAMESPACE})
        ),
        "tok-w1-kueue"
    );
    assert_eq!(entries(&broker), 1);

    // Another data key of the cluster's Secret: refused, naming the key and the fix.
    let out = shim(&broker, json!({"clusterName": "w1", "key": "admin-token"}));
    let line = assert_shim_error(
        &out,
        &[
            "PERMISSION_DENIED",
            "override refused",
            "key \"admin-token\"",
            "allowOverrides: {key: [\"admin-token\"]}",
        ],
    );
    assert!(!line.contains("tok-w1"), "{line}");
    // Another team's Secret through a template placeholder: refused the same way.
    let out = shim(&broker, json!({"clusterName": "w1", "team": "payroll"}));
    assert_shim_error(
        &out,
        &[
            "PERMISSION_DENIED",
            "override refused",
            "team \"payroll\"",
            "allowOverrides: {team: [\"payroll\"]}",
        ],
    );
    // The refusals neither added nor dropped an entry: the cached token is still a hit.
    assert_eq!(entries(&broker), 1);
    assert_eq!(token(&broker, json!({"clusterName": "w1"})), "tok-w1-kueue");
    let log = broker.logs();
    assert!(log.contains("outcome=Hit"), "{log}");
    assert!(!log.contains("tok-w1"), "a token in the log:\n{log}");
}

#[test]
fn allow_overrides_lets_matching_values_through() {
    let api = hub();
    let dir = tempdir();
    let broker = broker(&api, &dir, Some("{key: [\"admin-*\"], team: [pay?oll]}"));
    assert_eq!(
        token(&broker, json!({"clusterName": "w1", "key": "admin-token"})),
        "tok-w1-admin"
    );
    assert_eq!(
        token(&broker, json!({"clusterName": "w1", "team": "payroll"})),
        "tok-w1-payroll"
    );
    // A value no pattern matches is still refused, saying so.
    let out = shim(&broker, json!({"clusterName": "w1", "key": "ca.crt"}));
    assert_shim_error(
        &out,
        &[
            "PERMISSION_DENIED",
            "override refused",
            "key \"ca.crt\"",
            "matches none of the 1 pattern",
            "allowOverrides.key",
        ],
    );
}
