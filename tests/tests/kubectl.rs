//! Real kubectl (client-go's exec authenticator) → credbroker-shim → credbroker → provider.
//! client-go only runs exec plugins for https servers, so every cluster is a TLS
//! [`FakeApiServer`] that accepts only the token issued for it.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use base64::Engine as _;
use credbroker_tests::{
    Broker, ExecPlugin, FakeApiServer, Kubeconfig, TokenFiles, V1, V1BETA1, config_yaml, describe,
    exec_provider, file_provider, kubectl, tempdir, write_kubeconfig,
};
use serde_json::{Value, json};

/// `kubectl get --raw /api` against the kubeconfig at `path`.
fn get_api(kubeconfig: &Path) -> Output {
    kubectl(kubeconfig, &["get", "--raw", "/api"])
}

/// Bearer tokens `server` saw on `/api` (kubectl may also call `/version` once).
fn api_tokens(server: &FakeApiServer) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api")
        .filter_map(|r| r.token)
        .collect()
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "kubectl failed: {}", describe(out));
    let body: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("kubectl printed no JSON ({e}): {}", describe(out)));
    assert_eq!(body["kind"], "APIVersions", "{body}");
}

/// A kubeconfig in `dir` for `server`, whose exec extension names `cluster`.
fn kubeconfig(
    dir: &Path,
    file: &str,
    server: &FakeApiServer,
    cluster: &str,
    api_version: &str,
    provider: &str,
    broker: &Broker,
) -> PathBuf {
    let path = dir.join(file);
    write_kubeconfig(
        &path,
        &Kubeconfig {
            server: server.url(),
            ca_pem: server.ca_pem(),
            cluster_config: json!({"clusterName": cluster, "region": "test-1"}),
            api_version,
            provider,
            socket: broker.socket(),
        },
    );
    path
}

/// Two clusters through one exec provider: kubectl (with `kubectl_api_version`) 3 times per
/// cluster; the plugin (speaking `plugin_api_version`) runs once per cluster.
fn two_clusters(kubectl_api_version: &str, plugin_api_version: Option<&str>) {
    let plugin = ExecPlugin::new();
    let extra = plugin_api_version
        .map(|v| format!("apiVersion: {v}"))
        .unwrap_or_default();
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        &extra,
    )]));
    // The plugin numbers its runs: alpha is asked first (run 1), beta second (run 2).
    let alpha = FakeApiServer::start(&["tok-alpha-1"]);
    let beta = FakeApiServer::start(&["tok-beta-2"]);
    let dir = tempdir();
    let kc_alpha = kubeconfig(
        dir.path(),
        "alpha.json",
        &alpha,
        "alpha",
        kubectl_api_version,
        "onprem",
        &broker,
    );
    let kc_beta = kubeconfig(
        dir.path(),
        "beta.json",
        &beta,
        "beta",
        kubectl_api_version,
        "onprem",
        &broker,
    );

    for kc in [&kc_alpha, &kc_beta] {
        for _ in 0..3 {
            assert_ok(&get_api(kc));
        }
    }
    assert_eq!(
        plugin.runs(),
        2,
        "the plugin should run once per cluster; broker log:\n{}",
        broker.logs()
    );
    assert_eq!(api_tokens(&alpha), vec!["tok-alpha-1"; 3]);
    assert_eq!(api_tokens(&beta), vec!["tok-beta-2"; 3]);

    let expected_plugin_version = plugin_api_version.unwrap_or(V1);
    for (run, name, server) in [(1, "alpha", &alpha), (2, "beta", &beta)] {
        let info = plugin.exec_info(run);
        assert_eq!(info["apiVersion"], expected_plugin_version, "{info}");
        assert_eq!(info["kind"], "ExecCredential", "{info}");
        assert_eq!(info["spec"]["interactive"], false, "{info}");
        let cluster = &info["spec"]["cluster"];
        assert_eq!(cluster["config"]["clusterName"], name, "{info}");
        assert_eq!(cluster["config"]["region"], "test-1", "{info}");
        assert_eq!(cluster["server"], server.url(), "{info}");
        // Passed on as client-go sends it: base64 of the CA PEM.
        assert_eq!(
            cluster["certificate-authority-data"],
            base64::engine::general_purpose::STANDARD.encode(server.ca_pem()),
            "{info}"
        );
    }

    // Cluster alpha's exec config pointed at beta's server: a new cache key, so a fresh
    // alpha token (run 3), which beta did not issue and refuses.
    let crossed = dir.path().join("crossed.json");
    write_kubeconfig(
        &crossed,
        &Kubeconfig {
            server: beta.url(),
            ca_pem: beta.ca_pem(),
            cluster_config: json!({"clusterName": "alpha", "region": "test-1"}),
            api_version: kubectl_api_version,
            provider: "onprem",
            socket: broker.socket(),
        },
    );
    let out = get_api(&crossed);
    assert!(
        !out.status.success(),
        "beta accepted alpha's token: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Unauthorized") || stderr.contains("logged in"),
        "expected a 401 from kubectl: {}",
        describe(&out)
    );
    assert!(
        beta.requests().iter().any(|r| r.status == 401
            && r.token
                .as_deref()
                .is_some_and(|t| t.starts_with("tok-alpha-"))),
        "beta should have refused an alpha token: {:?}",
        beta.requests()
    );
}

#[test]
fn kubectl_v1_two_clusters() {
    two_clusters(V1, None);
}

#[test]
fn kubectl_v1beta1_two_clusters() {
    two_clusters(V1BETA1, Some(V1BETA1));
}

#[test]
fn kubectl_v1beta1_with_v1_plugin() {
    // The shim answers in kubectl's apiVersion whatever the wrapped plugin speaks.
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        "",
    )]));
    let server = FakeApiServer::start(&["tok-gamma-1"]);
    let dir = tempdir();
    let kc = kubeconfig(
        dir.path(),
        "gamma.json",
        &server,
        "gamma",
        V1BETA1,
        "onprem",
        &broker,
    );
    assert_ok(&get_api(&kc));
    assert_eq!(plugin.exec_info(1)["apiVersion"], V1);
}

#[test]
fn kubectl_file_provider() {
    let files = TokenFiles::new();
    files.write("delta", "file-token-delta-1");
    let broker = Broker::start(&config_yaml(&[file_provider("static", &files.template())]));
    let server = FakeApiServer::start(&["file-token-delta-1"]);
    let dir = tempdir();
    let kc = kubeconfig(
        dir.path(),
        "delta.json",
        &server,
        "delta",
        V1,
        "static",
        &broker,
    );
    for _ in 0..2 {
        assert_ok(&get_api(&kc));
    }
    assert_eq!(api_tokens(&server), vec!["file-token-delta-1"; 2]);

    // A rotated file is re-read: the next kubectl presents the new token.
    files.write("delta", "file-token-delta-2-rotated");
    server.accept("file-token-delta-2-rotated");
    let rotated = credbroker_tests::wait_until(Duration::from_secs(10), || {
        get_api(&kc).status.success()
            && api_tokens(&server).last().map(String::as_str) == Some("file-token-delta-2-rotated")
    });
    assert!(
        rotated,
        "the broker kept serving the old file token: seen {:?}; broker log:\n{}",
        server.seen_tokens(),
        broker.logs()
    );
}

/// kubectl through the arm64 shim to the arm64 broker, both under qemu
/// (`credbroker_tests::arch`), wrapping an exec plugin: the token reaches the API server, and
/// the second kubectl is served from the cache.
#[test]
fn kubectl_through_the_arm64_shim_and_broker() {
    let arm64 = credbroker_tests::arch::arm64();
    let plugin = ExecPlugin::new();
    let broker = Broker::builder()
        .providers(&[exec_provider("onprem", plugin.command(), "")])
        .binary(&arm64.wrapper(credbroker_tests::BROKER))
        .start();
    let server = FakeApiServer::start(&["tok-alpha-1"]);
    let dir = tempdir();
    let kc = kubeconfig(
        dir.path(),
        "arm64.json",
        &server,
        "alpha",
        V1,
        "onprem",
        &broker,
    );
    // The exec command: the arm64 shim (its qemu wrapper) instead of this build's.
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&kc).unwrap()).unwrap();
    doc["users"][0]["user"]["exec"]["command"] =
        json!(arm64.wrapper(credbroker_tests::SHIM).display().to_string());
    std::fs::write(&kc, serde_json::to_vec(&doc).unwrap()).unwrap();
    for _ in 0..2 {
        assert_ok(&get_api(&kc));
    }
    assert_eq!(api_tokens(&server), vec!["tok-alpha-1"; 2]);
    assert_eq!(
        plugin.runs(),
        1,
        "the second kubectl was served from the cache"
    );
}
