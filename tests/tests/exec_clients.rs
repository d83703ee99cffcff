//! The exec-plugin clients besides client-go (kubectl, `tests/tests/kubectl.rs`): the Python
//! `kubernetes` client (its `ExecProvider`, PyPI `kubernetes`) and kube-rs (`kube::Config`
//! from a kubeconfig with an exec user), each against TLS [`FakeApiServer`]s through the
//! shim and the broker, for `client.authentication.k8s.io/v1` and `v1beta1`.
//!
//! Both clients support `provideClusterInfo` (read in their sources: Python's
//! `kubernetes/config/exec_provider.py`, kube-client's `client/auth/mod.rs`), so every
//! kubeconfig sets it and each cluster's credential is chosen by the cluster's own exec
//! extension: two clusters, two tokens, each API server accepting only its own. A
//! recorder in front of the shim keeps the `KUBERNETES_EXEC_INFO` each client sent, to check
//! the apiVersion and the cluster input as the client built them.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use credbroker_tests::{
    Broker, COMMAND_TIMEOUT, FakeApiServer, SHIM, TokenFiles, V1, V1BETA1, bin, config_yaml,
    describe, file_provider, run, sh_quote, tempdir,
};
use serde_json::{Value, json};

/// The exec extension name client-go, Python and kube-rs read the cluster config from.
const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
const CLUSTERS: [&str; 2] = ["alpha", "beta"];

/// A broker serving each cluster's token from a file, one API server per cluster that
/// accepts only that token, and a shim wrapper that records what the client sent.
struct Setup {
    _tokens: TokenFiles,
    broker: Broker,
    servers: Vec<(&'static str, FakeApiServer)>,
    dir: tempfile::TempDir,
    recorder: PathBuf,
}

fn token_of(cluster: &str) -> String {
    format!("tok-{cluster}")
}

impl Setup {
    fn new() -> Setup {
        let tokens = TokenFiles::new();
        let mut servers = Vec::new();
        for cluster in CLUSTERS {
            tokens.write(cluster, &token_of(cluster));
            servers.push((cluster, FakeApiServer::start(&[&token_of(cluster)])));
        }
        let broker = Broker::start(&config_yaml(&[file_provider("files", &tokens.template())]));
        let dir = tempdir();
        let recorder = dir.path().join("record-and-run-shim");
        std::fs::write(
            &recorder,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$KUBERNETES_EXEC_INFO\" >> {}\nexec {} \"$@\"\n",
                sh_quote(dir.path().join("exec-info.jsonl").to_str().expect("UTF-8")),
                sh_quote(bin(SHIM).to_str().expect("UTF-8")),
            ),
        )
        .expect("write recorder");
        std::fs::set_permissions(&recorder, std::fs::Permissions::from_mode(0o755))
            .expect("chmod recorder");
        Setup {
            _tokens: tokens,
            broker,
            servers,
            dir,
            recorder,
        }
    }

    /// A kubeconfig (JSON, which every client reads as YAML) for `server`, whose exec user
    /// speaks `api_version` and whose exec extension names `cluster`.
    fn kubeconfig(&self, cluster: &str, server: &FakeApiServer, api_version: &str) -> PathBuf {
        let path = self.dir.path().join(format!(
            "{cluster}-{}.kubeconfig",
            api_version.replace('/', "_")
        ));
        let ca = base64::engine::general_purpose::STANDARD.encode(server.ca_pem());
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {
                "server": server.url(),
                "certificate-authority-data": ca,
                "extensions": [{"name": EXEC_EXTENSION, "extension": {"clusterName": cluster}}],
            }}],
            "users": [{"name": "broker", "user": {"exec": {
                "apiVersion": api_version,
                "command": self.recorder,
                "args": ["--provider", "files", "--socket", self.broker.socket()],
                "provideClusterInfo": true,
                "interactiveMode": "Never",
            }}}],
            "contexts": [{"name": "ctx", "context": {"cluster": cluster, "user": "broker"}}],
            "current-context": "ctx",
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&doc).expect("JSON")).expect("write");
        path
    }

    /// Every `KUBERNETES_EXEC_INFO` recorded so far, in order.
    fn exec_infos(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("exec-info.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    /// Runs `client` for each cluster and apiVersion; checks each API server saw only its
    /// own token and each exec call carried the kubeconfig's apiVersion and cluster input.
    fn check(&self, name: &str, client: impl Fn(&Path) -> Result<(), String>) {
        for api_version in [V1, V1BETA1] {
            for (cluster, server) in &self.servers {
                let before = self.exec_infos().len();
                let kubeconfig = self.kubeconfig(cluster, server, api_version);
                if let Err(e) = client(&kubeconfig) {
                    panic!(
                        "{name} ({api_version}) against {cluster}: {e}\nbroker log:\n{}",
                        self.broker.logs()
                    );
                }
                let infos = self.exec_infos();
                let info = infos.get(before).unwrap_or_else(|| {
                    panic!("{name} ({api_version}) ran no exec plugin for {cluster}")
                });
                assert_eq!(info["apiVersion"], api_version, "{name}: {info}");
                assert_eq!(info["kind"], "ExecCredential", "{name}: {info}");
                let sent = &info["spec"]["cluster"];
                assert_eq!(sent["server"], server.url(), "{name}: {info}");
                assert_eq!(sent["config"]["clusterName"], *cluster, "{name}: {info}");
                assert!(
                    sent["certificate-authority-data"].is_string(),
                    "{name}: {info}"
                );
            }
        }
        for (cluster, server) in &self.servers {
            let seen = server.requests();
            assert!(!seen.is_empty(), "{name} never called {cluster}");
            for request in seen {
                assert_eq!(
                    request.token.as_deref(),
                    Some(token_of(cluster).as_str()),
                    "{name}: {cluster} got {request:?}"
                );
                // A client that runs the plugin again in one process (kube-rs builds a client
                // per apiVersion here) is a re-ask: the broker checks the token with a
                // SelfSubjectReview, which the server creates (201).
                let ok = if request.path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" {
                    201
                } else {
                    200
                };
                assert_eq!(request.status, ok, "{name}: {cluster} got {request:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Python: kubernetes (PyPI), kubernetes.config.exec_provider.ExecProvider
// ---------------------------------------------------------------------------------------

/// Loads the kubeconfig (which runs the exec plugin) and GETs /api/ with the credential.
const PYTHON_CLIENT: &str = r#"
import json, sys
from kubernetes import client, config
api = config.new_client_from_config(config_file=sys.argv[1])
versions = client.CoreApi(api).get_api_versions(_request_timeout=30)
print(json.dumps(versions.to_dict()))
"#;

fn python_get_api(kubeconfig: &Path) -> Result<(), String> {
    let out: Output = run(
        Command::new("python3")
            .args(["-c", PYTHON_CLIENT])
            .arg(kubeconfig)
            .env_remove("KUBECONFIG"),
        COMMAND_TIMEOUT,
    );
    if !out.status.success() {
        return Err(describe(&out));
    }
    let body: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("no JSON ({e}): {}", describe(&out)))?;
    if body["versions"] == json!(["v1"]) {
        Ok(())
    } else {
        Err(format!("unexpected answer: {body}"))
    }
}

#[test]
fn python_kubernetes_client_per_cluster_v1_and_v1beta1() {
    let probe = run(
        Command::new("python3").args(["-c", "import kubernetes"]),
        COMMAND_TIMEOUT,
    );
    assert!(
        probe.status.success(),
        "the Python kubernetes client is missing (scripts/test.sh installs it: \
         pip install kubernetes): {}",
        describe(&probe)
    );
    Setup::new().check("python kubernetes", python_get_api);
}

// ---------------------------------------------------------------------------------------
// Rust: kube-rs (kube::Config from a kubeconfig with an exec user)
// ---------------------------------------------------------------------------------------

fn kube_rs_get_api(kubeconfig: &Path) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| e.to_string())?;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let versions = tokio::time::timeout(COMMAND_TIMEOUT, client.list_core_api_versions())
            .await
            .map_err(|_| format!("no answer within {COMMAND_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        if versions.versions == ["v1"] {
            Ok(())
        } else {
            Err(format!("unexpected versions {:?}", versions.versions))
        }
    })
}

#[test]
fn kube_rs_client_per_cluster_v1_and_v1beta1() {
    Setup::new().check("kube-rs", kube_rs_get_api);
}
