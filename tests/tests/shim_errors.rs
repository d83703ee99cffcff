//! The shim's failure contract: exit 1, empty stdout, exactly one stderr line
//! `credbroker-shim: <what failed>: <why> (<hint>)`, never a hang past `--timeout`; and a bad
//! call never takes the broker down.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use credbroker_tests::{
    Broker, ExecPlugin, HungServer, PluginOptions, SHIM, TokenFiles, V1, V1BETA1,
    assert_credential, assert_shim_error, bin, config_yaml, exec_info, exec_provider,
    file_provider, run, run_shim, tempdir,
};
use serde_json::json;

const PROVIDER: &str = "static";
const CLUSTER: &str = "a";
const TOKEN: &str = "static-token-a";

/// A broker with one `file` provider (`static`) holding a token for cluster `a`.
fn static_broker() -> (TokenFiles, Broker) {
    let files = TokenFiles::new();
    files.write(CLUSTER, TOKEN);
    let broker = Broker::start(&config_yaml(&[file_provider(PROVIDER, &files.template())]));
    (files, broker)
}

fn good_info() -> String {
    exec_info(V1, "https://a.example", json!({"clusterName": CLUSTER}))
}

/// A well-formed call succeeds: the broker is still serving.
fn assert_good_call(broker: &Broker) {
    let out = run_shim(
        broker.socket(),
        &["--provider", PROVIDER],
        Some(&good_info()),
    );
    let cred = assert_credential(&out, V1);
    assert_eq!(cred.token, TOKEN);
    assert!(broker_alive(broker), "broker log:\n{}", broker.logs());
}

fn broker_alive(broker: &Broker) -> bool {
    std::os::unix::net::UnixStream::connect(broker.socket()).is_ok()
}

#[test]
fn malformed_exec_info() {
    let (_files, broker) = static_broker();
    let out = run_shim(
        broker.socket(),
        &["--provider", PROVIDER],
        Some(r#"{"apiVersion": "client.authentication.k8s.io/v1", "kind": "#),
    );
    assert_shim_error(&out, &["KUBERNETES_EXEC_INFO"]);
    assert_good_call(&broker);
}

#[test]
fn unsupported_api_version() {
    let (_files, broker) = static_broker();
    let info = json!({
        "apiVersion": "client.authentication.k8s.io/v1alpha1",
        "kind": "ExecCredential",
        "spec": {"interactive": false},
    })
    .to_string();
    let out = run_shim(broker.socket(), &["--provider", PROVIDER], Some(&info));
    assert_shim_error(&out, &["client.authentication.k8s.io/v1alpha1"]);
    assert_good_call(&broker);
}

#[test]
fn unknown_provider_is_named() {
    let (_files, broker) = static_broker();
    let out = run_shim(
        broker.socket(),
        &["--provider", "no-such-provider"],
        Some(&good_info()),
    );
    assert_shim_error(&out, &["no-such-provider"]);
    assert_good_call(&broker);
}

#[test]
fn missing_provider_flag() {
    let (_files, broker) = static_broker();
    let out = run_shim(broker.socket(), &[], Some(&good_info()));
    assert_shim_error(&out, &["--provider"]);
    assert_good_call(&broker);
}

#[test]
fn missing_file_token_is_not_found_naming_the_path() {
    let (files, broker) = static_broker();
    let info = exec_info(V1, "https://b.example", json!({"clusterName": "b"}));
    let out = run_shim(broker.socket(), &["--provider", PROVIDER], Some(&info));
    let path = files.path("b");
    assert_shim_error(&out, &[path.to_str().expect("UTF-8 path")]);
    assert_good_call(&broker);
}

#[test]
fn failing_plugin_stderr_is_reported_on_one_line() {
    let plugin = ExecPlugin::with(PluginOptions {
        fail_with: Some(vec![
            "boom: invalid_grant for this identity".to_owned(),
            "second line of detail".to_owned(),
        ]),
        ..PluginOptions::default()
    });
    let files = TokenFiles::new();
    files.write(CLUSTER, TOKEN);
    let broker = Broker::start(&config_yaml(&[
        exec_provider("failing", plugin.command(), ""),
        file_provider(PROVIDER, &files.template()),
    ]));
    let out = run_shim(
        broker.socket(),
        &["--provider", "failing"],
        Some(&good_info()),
    );
    assert_shim_error(&out, &["boom: invalid_grant"]);
    assert!(plugin.runs() >= 1, "the plugin never ran");
    assert_good_call(&broker);
}

#[test]
fn no_broker_names_the_socket() {
    let dir = tempdir();
    let socket = dir.path().join("nobody-here.sock");
    let out = run_shim(&socket, &["--provider", PROVIDER], Some(&good_info()));
    assert_shim_error(&out, &[socket.to_str().expect("UTF-8 path")]);
}

#[test]
fn hung_broker_times_out() {
    let dir = tempdir();
    let socket = dir.path().join("hung.sock");
    let _server = HungServer::start(&socket);
    let started = Instant::now();
    let out = run_shim(
        &socket,
        &["--provider", PROVIDER, "--timeout", "1s"],
        Some(&good_info()),
    );
    let elapsed = started.elapsed();
    assert_shim_error(&out, &[]);
    assert!(
        elapsed < Duration::from_secs(10),
        "shim with --timeout 1s took {elapsed:?} against a broker that never answers"
    );
}

#[test]
fn absent_exec_info_means_v1beta1() {
    // Without KUBERNETES_EXEC_INFO there is no cluster: use a provider whose path needs none.
    let files = TokenFiles::new();
    let path = files.write("fixed", "fixed-token");
    let broker = Broker::start(&config_yaml(&[file_provider(
        "fixed",
        path.to_str().expect("UTF-8 path"),
    )]));
    let out = run_shim(broker.socket(), &["--provider", "fixed"], None);
    let cred = assert_credential(&out, V1BETA1);
    assert_eq!(cred.token, "fixed-token");
}

#[test]
fn socket_from_environment() {
    let (_files, broker) = static_broker();
    let out = run(
        Command::new(bin(SHIM))
            .args(["--provider", PROVIDER])
            .env("CREDBROKER_SOCKET", broker.socket())
            .env("KUBERNETES_EXEC_INFO", good_info()),
        credbroker_tests::SHIM_TIMEOUT,
    );
    assert_eq!(assert_credential(&out, V1).token, TOKEN);
    // --socket wins over the environment.
    let out = run(
        Command::new(bin(SHIM))
            .args(["--provider", PROVIDER, "--socket"])
            .arg(broker.socket())
            .env(
                "CREDBROKER_SOCKET",
                Path::new("/nonexistent/credbroker.sock"),
            )
            .env("KUBERNETES_EXEC_INFO", good_info()),
        credbroker_tests::SHIM_TIMEOUT,
    );
    assert_eq!(assert_credential(&out, V1).token, TOKEN);
}
