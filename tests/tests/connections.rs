//! Connections and the socket file under hostile or clumsy callers: `touch`/`chmod` on the
//! socket, a umask of 000, a world-writable mode, thousands of connections that never
//! finish their handshake, and a metrics scraper that stops mid-header.

// Helpers here are test code too: a panic is a failed assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use credbroker_tests::{
    Broker, TokenFiles, V1, assert_credential, config_yaml, describe, exec_info, file_provider,
    run, run_broker_cli, run_shim, tempdir,
};
use serde_json::json;

/// A broker with a `file` provider `static` holding `token-a` for cluster `a`.
fn static_config(files: &TokenFiles, socket_extra: &str) -> String {
    files.write("a", "token-a");
    config_yaml(&[file_provider("static", &files.template())]).replacen(
        "socket: {path: \"{socket}\"}",
        &format!("socket: {{path: \"{{socket}}\"{socket_extra}}}"),
        1,
    )
}

fn health(socket: &Path) -> std::process::Output {
    run_broker_cli(&[
        "health".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
        "--timeout".as_ref(),
        "5s".as_ref(),
    ])
}

fn get_token(socket: &Path) {
    let info = exec_info(V1, "https://a.example", json!({"clusterName": "a"}));
    let out = run_shim(socket, &["--provider", "static"], Some(&info));
    assert_eq!(assert_credential(&out, V1).token, "token-a");
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

// ---------------------------------------------------------------------------------------
// The socket file
// ---------------------------------------------------------------------------------------

/// Any caller allowed to write the socket can touch or chmod it. Neither is a replacement:
/// health stays SERVING and shutdown still removes the socket.
#[test]
fn touch_and_chmod_on_the_socket_change_nothing() {
    let files = TokenFiles::new();
    let mut broker = Broker::start(&static_config(&files, ""));
    let socket = broker.socket().to_owned();
    let out = run(Command::new("touch").arg(&socket), Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    let out = run(
        Command::new("chmod").arg("0600").arg(&socket),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{}", describe(&out));
    // Nothing to wait for: the keeper must *not* act. It checks every second; give it three.
    std::thread::sleep(Duration::from_secs(3));
    let out = health(&socket);
    assert!(
        out.status.success(),
        "{}\n{}",
        describe(&out),
        broker.logs()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    assert_eq!(mode_of(&socket), 0o600, "the broker re-made its socket");
    get_token(&socket);
    assert!(
        !broker.logs().contains("removed or replaced"),
        "{}",
        broker.logs()
    );
    assert!(broker.terminate().success(), "{}", broker.logs());
    assert!(!socket.exists(), "the socket is left behind at shutdown");
}

/// Under umask 000, missing parents are created 0755, and the socket gets exactly its mode.
#[test]
fn parents_are_0755_whatever_the_umask() {
    let dir = tempdir();
    let socket = dir.path().join("a/b/broker.sock");
    let files = TokenFiles::new();
    let mut broker = Broker::start_in_shell(&static_config(&files, ""), &socket, "umask 000");
    for parent in [dir.path().join("a"), dir.path().join("a/b")] {
        assert_eq!(mode_of(&parent), 0o755, "{}", parent.display());
    }
    assert_eq!(mode_of(&socket), 0o660);
    get_token(&socket);
    assert!(broker.terminate().success(), "{}", broker.logs());
}

#[test]
fn a_socket_everyone_can_open_without_an_allow_list_is_warned_about() {
    let files = TokenFiles::new();
    let mut open = Broker::start(&static_config(&files, ", mode: \"0666\""));
    assert!(
        open.logs()
            .contains("socket.mode 0666 lets every local user connect"),
        "{}",
        open.logs()
    );
    let out = run_broker_cli(&["check-config".as_ref(), open.config_path().as_os_str()]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("warning: socket.mode 0666"),
        "{}",
        describe(&out)
    );
    open.terminate();
    let mut listed = Broker::start(&static_config(
        &files,
        ", mode: \"0666\", allowedUids: [0, 65534]",
    ));
    assert!(
        !listed.logs().contains("lets every local user connect"),
        "{}",
        listed.logs()
    );
    listed.terminate();
}

#[test]
fn check_config_refuses_long_socket_paths_and_malformed_modes() {
    let dir = tempdir();
    let long = format!("/{}", "s".repeat(107));
    for (socket, want) in [
        (
            format!("{{path: {long}}}"),
            "socket.path: 108 bytes is longer than a Unix socket address allows (107)",
        ),
        (
            "{path: /a.sock, mode: \"+660\"}".to_owned(),
            "socket.mode: invalid file mode \"+660\"",
        ),
        (
            "{path: /a.sock, mode: \"0o660\"}".to_owned(),
            "socket.mode: invalid file mode \"0o660\"",
        ),
        (
            "{path: /a.sock, mode: \"9999\"}".to_owned(),
            "socket.mode: invalid file mode \"9999\"",
        ),
    ] {
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            format!("socket: {socket}\nproviders:\n  - {{name: a, type: aws}}\n"),
        )
        .unwrap();
        let out = run_broker_cli(&["check-config".as_ref(), file.as_os_str()]);
        assert!(!out.status.success(), "{socket}: {}", describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{socket}: {stderr}");
    }
}
