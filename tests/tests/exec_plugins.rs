//! Wrapped exec plugins as hostile or clumsy programs, end to end through the built broker and
//! shim: nothing a plugin starts outlives the broker, its stderr cannot inject control
//! characters, its tokens follow the one token rule, and clusters that differ only in their
//! TLS settings get a token each.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use credbroker_tests::{
    Broker, ExecPlugin, PluginOptions, V1, assert_credential, assert_shim_error, config_yaml,
    exec_info, exec_provider, process_alive, run_shim, send_signal, sh_quote, spawn_shim, tempdir,
    wait_until,
};
use serde_json::json;

/// The parent pid of `pid`, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Fails the test if `pid` is still running after a bounded wait, killing it first so that
/// nothing is left behind.
fn assert_gone(pid: u32, what: &str) {
    if !wait_until(Duration::from_secs(5), || !process_alive(pid)) {
        send_signal(pid, "KILL");
        panic!("{what} (pid {pid}) outlived the broker");
    }
}

#[test]
fn sigterm_with_a_plugin_in_flight_leaves_no_process_behind() {
    let plugin = ExecPlugin::with(PluginOptions {
        hang: true,
        ..PluginOptions::default()
    });
    let mut broker = Broker::start(&config_yaml(&[exec_provider(
        "stuck",
        plugin.command(),
        "timeout: 30s",
    )]));
    let info = exec_info(V1, "https://stuck.example", json!({"clusterName": "stuck"}));
    let shim = spawn_shim(broker.socket(), &["--provider", "stuck"], Some(&info));
    assert!(
        wait_until(Duration::from_secs(10), || plugin.child_pid(1).is_some()),
        "the plugin never started; broker log:\n{}",
        broker.logs()
    );
    let child = plugin.child_pid(1).expect("recorded");
    let plugin_pid = parent_of(child).expect("the plugin's child has a parent");
    assert_eq!(
        parent_of(plugin_pid),
        Some(broker.pid()),
        "the plugin runs under the broker"
    );
    // The caller gives up (so the shutdown does not wait out its grace period for it); the
    // fetch itself lives on in the cache until the broker stops.
    drop(shim);
    broker.send_sigterm();
    let status = broker.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status}; log:\n{}", broker.logs());
    assert_gone(child, "the plugin's background child");
    assert_gone(plugin_pid, "the plugin");
}

#[test]
fn plugin_stderr_reaches_the_caller_escaped() {
    let plugin = ExecPlugin::with(PluginOptions {
        fail_with: Some(vec![
            "bad \u{1b}[31mred\r\u{1b}]0;title\u{7}".into(),
            "second".into(),
        ]),
        ..PluginOptions::default()
    });
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "noisy",
        plugin.command(),
        "",
    )]));
    let info = exec_info(V1, "https://noisy.example", json!({"clusterName": "noisy"}));
    let out = run_shim(broker.socket(), &["--provider", "noisy"], Some(&info));
    let line = assert_shim_error(&out, &["exited with code 3", "second"]);
    assert!(!line.chars().any(char::is_control), "{line:?}");
    assert!(line.contains("bad \\u{1b}[31mred"), "{line:?}");
    assert!(
        !broker.logs().contains('\u{1b}'),
        "raw ESC in the broker log:\n{}",
        broker.logs()
    );
}

/// A plugin that prints `token` (JSON-escaped) as its ExecCredential's `status.token`.
fn token_plugin(dir: &Path, token: &str) -> PathBuf {
    let out = dir.join("credential.json");
    let credential = json!({
        "apiVersion": V1,
        "kind": "ExecCredential",
        "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"},
    });
    std::fs::write(&out, credential.to_string()).expect("write credential");
    let command = dir.join("plugin.sh");
    std::fs::write(&command, format!("#!/bin/sh\ncat '{}'\n", out.display())).expect("plugin");
    std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    command
}

#[test]
fn exec_tokens_are_trimmed_or_refused_like_file_tokens() {
    let dir = tempdir();
    let cases = [
        ("padded", "  sekrit-token \r\n", Ok("sekrit-token")),
        ("crlf", "sekrit\r\nX-Injected: 1", Err("control character")),
        ("esc", "sekrit\u{1b}[2J", Err("control character")),
        ("space", "sekrit token", Err("whitespace")),
    ];
    let mut providers = Vec::new();
    for (name, token, _) in &cases {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).expect("mkdir");
        providers.push(exec_provider(name, &token_plugin(&sub, token), ""));
    }
    let broker = Broker::start(&config_yaml(&providers));
    let info = exec_info(V1, "https://t.example", json!({"clusterName": "t"}));
    for (name, _, want) in cases {
        let out = run_shim(broker.socket(), &["--provider", name], Some(&info));
        match want {
            Ok(token) => assert_eq!(assert_credential(&out, V1).token, token, "{name}"),
            Err(why) => {
                let line = assert_shim_error(&out, &[why, "status.token"]);
                assert!(!line.contains("sekrit"), "{name}: quotes the token: {line}");
            }
        }
    }
    assert!(!broker.logs().contains("sekrit"), "{}", broker.logs());
}

#[test]
fn clusters_that_differ_only_in_tls_server_name_get_a_token_each() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config_yaml(&[exec_provider(
        "onprem",
        plugin.command(),
        "",
    )]));
    let info = |tls_server_name: &str| {
        json!({
            "apiVersion": V1,
            "kind": "ExecCredential",
            "spec": {
                "interactive": false,
                "cluster": {
                    "server": "https://10.0.0.1:6443",
                    "tls-server-name": tls_server_name,
                    "config": {"clusterName": "shared"},
                },
            },
        })
        .to_string()
    };
    let first = run_shim(
        broker.socket(),
        &["--provider", "onprem"],
        Some(&info("a.example")),
    );
    let second = run_shim(
        broker.socket(),
        &["--provider", "onprem"],
        Some(&info("b.example")),
    );
    assert_eq!(assert_credential(&first, V1).token, "tok-shared-1");
    assert_eq!(assert_credential(&second, V1).token, "tok-shared-2");
    assert_eq!(plugin.runs(), 2, "one plugin run per TLS identity");
    assert_eq!(
        plugin.exec_info(2)["spec"]["cluster"]["tls-server-name"],
        "b.example"
    );
}

/// The cluster config travels as the text client-go wrote: a wrapped plugin gets
/// `KUBERNETES_EXEC_INFO` byte for byte as the shim got it, integers past 2^53 (and past 64
/// bits), unsorted keys and `1.50` included, never a double's rounding of them.
#[test]
fn a_wrapped_plugin_receives_the_cluster_config_client_go_sent_byte_for_byte() {
    let dir = tempdir();
    let seen = dir.path().join("seen-exec-info");
    let plugin = dir.path().join("plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nprintf '%s' \"$KUBERNETES_EXEC_INFO\" > {}\n\
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"wrapped-token\"}}}}'\n",
            sh_quote(seen.to_str().expect("UTF-8 path"))
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let broker = Broker::start(&config_yaml(&[exec_provider("wrapped", &plugin, "")]));
    // What client-go writes (Go's encoding/json: compact, struct field order); the plugin runs
    // with the provider's apiVersion (v1) and never interactive, so all of it comes through.
    let info = r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"cluster":{"server":"https://big.example:6443","certificate-authority-data":"UEVNIQ==","config":{"zone":"b","clusterName":"big","id":9007199254740993,"huge":123456789012345678901234567890,"ratio":1.50,"nested":{"z":[18446744073709551615,-9007199254740993]}}},"interactive":false}}"#;
    let out = run_shim(broker.socket(), &["--provider", "wrapped"], Some(info));
    assert_eq!(assert_credential(&out, V1).token, "wrapped-token");
    let got = std::fs::read_to_string(&seen).expect("the plugin ran");
    assert_eq!(
        got, info,
        "what the plugin got differs from what client-go sent"
    );
    // The broker read the same config: its log names the cluster by clusterName.
    assert!(
        broker.logs().contains(r#"cluster="big""#),
        "{}",
        broker.logs()
    );
}
