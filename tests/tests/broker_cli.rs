//! The broker's command line, config validation, socket handling and shutdown.

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use credbroker_tests::{
    BROKER_TIMEOUT, Broker, ExecPlugin, PluginOptions, TokenFiles, V1, assert_credential,
    config_yaml, describe, exec_info, exec_provider, file_provider, run_broker_cli, run_shim,
    spawn_shim, tempdir, yaml_str,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// version / check-config
// ---------------------------------------------------------------------------------------

#[test]
fn version() {
    let out = run_broker_cli(&["version"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("credbroker {}", env!("CARGO_PKG_VERSION"))
    );
}

/// Writes `yaml` to `<dir>/config.yaml`.
fn write_config(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(&path, yaml).expect("write config");
    path
}

#[test]
fn check_config_accepts_a_good_file() {
    let dir = tempdir();
    let yaml = format!(
        r#"socket: {{path: /var/run/credbroker/broker.sock, mode: "0660", allowedUids: [0, 65532]}}
cache: {{maxEntries: 100, idleTimeout: 2h}}
providers:
  - name: onprem
    type: exec
    exec:
      command: /usr/local/bin/plugin
      args: [get-token, --cluster]
      env: {{PLUGIN_MODE: test}}
      timeout: 30s
      apiVersion: client.authentication.k8s.io/v1beta1
      defaultLifetime: 15m
  - name: static
    type: file
    file: {{path: {}, lifetime: 1h}}
"#,
        yaml_str("/var/run/secrets/clusters/{clusterName}/token")
    );
    let config = write_config(dir.path(), &yaml);
    let out = run_broker_cli(&[Path::new("check-config"), &config]);
    assert!(
        out.status.success(),
        "check-config rejected a good file: {}",
        describe(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "check-config should print a one-line summary: {}",
        describe(&out)
    );
}

/// `credbroker check-config` on `yaml` exits 1 and names the file and `yaml_path`.
fn assert_check_config_rejects(yaml: &str, yaml_path: &str, also: &[&str]) {
    let dir = tempdir();
    let config = write_config(dir.path(), yaml);
    let out = run_broker_cli(&[Path::new("check-config"), &config]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "check-config exit code: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [config.to_str().expect("UTF-8 path"), yaml_path]
        .iter()
        .chain(also)
    {
        assert!(
            stderr.contains(needle),
            "check-config error should name {needle:?}: {}",
            describe(&out)
        );
    }
}

const EXEC_OK: &str = "  - name: onprem\n    type: exec\n    exec: {command: /bin/true}\n";

#[test]
fn check_config_unknown_key_names_its_path() {
    assert_check_config_rejects(
        "socket: {path: /tmp/x.sock}\nproviders:\n  - name: onprem\n    type: exec\n    exec: {command: /bin/true, bogusKey: 1}\n",
        "providers[0].exec.bogusKey",
        &[],
    );
}

#[test]
fn check_config_duplicate_provider_names() {
    assert_check_config_rejects(
        "socket: {path: /tmp/x.sock}\nproviders:\n  - name: twin\n    type: exec\n    exec: {command: /bin/true}\n  - name: twin\n    type: exec\n    exec: {command: /bin/false}\n",
        "providers[1]",
        &["twin"],
    );
}

#[test]
fn check_config_relative_socket_path() {
    assert_check_config_rejects(
        &format!("socket: {{path: run/broker.sock}}\nproviders:\n{EXEC_OK}"),
        "socket.path",
        &[],
    );
}

#[test]
fn check_config_bad_duration() {
    assert_check_config_rejects(
        "socket: {path: /tmp/x.sock}\nproviders:\n  - name: onprem\n    type: exec\n    exec: {command: /bin/true, timeout: 5 parsecs}\n",
        "providers[0].exec.timeout",
        &[],
    );
}

#[test]
fn check_config_bad_mode() {
    assert_check_config_rejects(
        &format!("socket: {{path: /tmp/x.sock, mode: \"0999\"}}\nproviders:\n{EXEC_OK}"),
        "socket.mode",
        &[],
    );
}

#[test]
fn check_config_exec_command_not_absolute() {
    assert_check_config_rejects(
        "socket: {path: /tmp/x.sock}\nproviders:\n  - name: onprem\n    type: exec\n    exec: {command: bin/plugin}\n",
        "providers[0].exec.command",
        &[],
    );
}

#[test]
fn serve_rejects_unknown_key_too() {
    let dir = tempdir();
    let socket = dir.path().join("broker.sock");
    let config = write_config(
        dir.path(),
        &format!(
            "socket: {{path: {}}}\nproviders:\n  - name: onprem\n    type: exec\n    exec: {{command: /bin/true, bogusKey: 1}}\n",
            yaml_str(socket.to_str().expect("UTF-8 path"))
        ),
    );
    let out = run_broker_cli(&[Path::new("serve"), Path::new("--config"), &config]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "serve exit code: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("providers[0].exec.bogusKey"),
        "serve should name the unknown key: {}",
        describe(&out)
    );
    assert!(
        !socket.exists(),
        "serve created a socket for an invalid config"
    );
}

// ---------------------------------------------------------------------------------------
// Socket handling
// ---------------------------------------------------------------------------------------

/// A `file` provider `static` with a token for cluster `a`, and the config line for it.
fn static_provider() -> (TokenFiles, String) {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    let provider = file_provider("static", &files.template());
    (files, provider)
}

/// One shim call through `socket` succeeds.
fn assert_serves(socket: &Path) {
    let info = exec_info(V1, "https://a.example", json!({"clusterName": "a"}));
    let out = run_shim(socket, &["--provider", "static"], Some(&info));
    assert_eq!(assert_credential(&out, V1).token, "token-a");
}

fn socket_mode(path: &Path) -> u32 {
    let meta = std::fs::metadata(path).expect("stat socket");
    assert!(
        meta.file_type().is_socket(),
        "{} is not a socket",
        path.display()
    );
    meta.permissions().mode() & 0o7777
}

#[test]
fn socket_parent_dir_is_created_with_default_mode() {
    let (_files, provider) = static_provider();
    let dir = tempdir();
    let socket = dir.path().join("not/yet/there/broker.sock");
    let broker = Broker::start_at(&config_yaml(&[provider]), &socket);
    assert_eq!(socket_mode(&socket), 0o660, "default socket mode");
    assert_serves(broker.socket());
}

#[test]
fn socket_mode_from_config() {
    let (_files, provider) = static_provider();
    let broker = Broker::start(&format!(
        "socket: {{path: \"{{socket}}\", mode: \"0600\"}}\nproviders:\n{provider}"
    ));
    assert_eq!(
        socket_mode(broker.socket()),
        0o600,
        "configured socket mode"
    );
    assert_serves(broker.socket());
}

#[test]
fn refuses_a_path_that_is_not_a_socket() {
    let (_files, provider) = static_provider();
    let dir = tempdir();
    let path = dir.path().join("precious.txt");
    std::fs::write(&path, "do not delete me\n").expect("write file");
    let yaml = config_yaml(&[provider]).replace("{socket}", path.to_str().expect("UTF-8"));
    let config = write_config(dir.path(), &yaml);
    let out = run_broker_cli(&[Path::new("serve"), Path::new("--config"), &config]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "serve over a regular file: {}",
        describe(&out)
    );
    assert!(
        !out.stderr.is_empty(),
        "serve should say why it refuses: {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(path.to_str().expect("UTF-8")),
        "the refusal should name the path: {}",
        describe(&out)
    );
    assert!(
        std::fs::metadata(&path).expect("stat").is_file(),
        "file replaced"
    );
    assert_eq!(
        std::fs::read_to_string(&path).expect("read file"),
        "do not delete me\n",
        "file content changed"
    );
}

#[test]
fn refuses_a_socket_with_a_live_broker() {
    let (_files, provider) = static_provider();
    let yaml = config_yaml(&[provider]);
    let mut first = Broker::start(&yaml);
    let dir = tempdir();
    let config = write_config(
        dir.path(),
        &yaml.replace("{socket}", first.socket().to_str().expect("UTF-8")),
    );
    let out = run_broker_cli(&[Path::new("serve"), Path::new("--config"), &config]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a second broker on a live socket should refuse: {}",
        describe(&out)
    );
    assert!(!out.stderr.is_empty(), "the refusal needs a message");
    assert!(
        first.is_running(),
        "the first broker died: {}",
        first.logs()
    );
    assert_serves(first.socket());
}

#[test]
fn replaces_a_stale_socket() {
    let (_files, provider) = static_provider();
    let dir = tempdir();
    let socket = dir.path().join("broker.sock");
    drop(UnixListener::bind(&socket).expect("bind"));
    assert!(
        std::fs::metadata(&socket)
            .expect("stat")
            .file_type()
            .is_socket(),
        "the stale socket file should remain after the listener is dropped"
    );
    let broker = Broker::start_at(&config_yaml(&[provider]), &socket);
    assert_serves(broker.socket());
}

// ---------------------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------------------

#[test]
fn sigterm_exits_zero_and_removes_the_socket() {
    let (_files, provider) = static_provider();
    let mut broker = Broker::start(&config_yaml(&[provider]));
    assert_serves(broker.socket());
    let status = broker.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "exit after SIGTERM; log:\n{}",
        broker.logs()
    );
    assert!(
        !broker.socket().exists(),
        "socket left behind after SIGTERM"
    );
}

#[test]
fn sigint_exits_zero_and_removes_the_socket() {
    let (_files, provider) = static_provider();
    let mut broker = Broker::start(&config_yaml(&[provider]));
    credbroker_tests::send_signal(broker.pid(), "INT");
    let status = broker.wait_exit(BROKER_TIMEOUT);
    assert_eq!(
        status.code(),
        Some(0),
        "exit after SIGINT; log:\n{}",
        broker.logs()
    );
    assert!(!broker.socket().exists(), "socket left behind after SIGINT");
}

#[test]
fn in_flight_call_completes_after_sigterm() {
    let plugin = ExecPlugin::with(PluginOptions {
        sleep: Duration::from_secs(2),
        expires_in: Some(Duration::from_secs(3600)),
        ..PluginOptions::default()
    });
    let mut broker = Broker::start(&config_yaml(&[exec_provider("slow", plugin.command(), "")]));
    let info = exec_info(V1, "https://slow.example", json!({"clusterName": "slow"}));
    let shim = spawn_shim(broker.socket(), &["--provider", "slow"], Some(&info));
    assert!(
        plugin.wait_for_runs(1, Duration::from_secs(10)),
        "the plugin never started; broker log:\n{}",
        broker.logs()
    );
    broker.send_sigterm();
    let out = shim.wait(Duration::from_secs(20));
    let cred = assert_credential(&out, V1);
    assert_eq!(cred.token, "tok-slow-1");
    let status = broker.wait_exit(BROKER_TIMEOUT);
    assert_eq!(
        status.code(),
        Some(0),
        "exit after SIGTERM; log:\n{}",
        broker.logs()
    );
    assert!(
        !broker.socket().exists(),
        "socket left behind after SIGTERM"
    );
}

// ---------------------------------------------------------------------------------------
// health
// ---------------------------------------------------------------------------------------

/// Without a broker, `health` says once what failed and where (the transport error already
/// carries its OS cause: printing the source chain on top of it said it twice).
#[test]
fn health_without_a_broker_prints_the_error_once() {
    let dir = tempdir();
    let socket = dir.path().join("absent.sock");
    let out = run_broker_cli(&[
        "health".as_ref(),
        "--timeout".as_ref(),
        "2s".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "credbroker: cannot connect to {}: transport error: No such file or directory (os error 2)\n",
            socket.display()
        )
    );
}
