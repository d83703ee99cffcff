//! Connections and the socket file under hostile or clumsy callers: `touch`/`chmod` on the
//! socket, a umask of 000, a world-writable mode, thousands of connections that never
//! finish their handshake, and a metrics scraper that stops mid-header.

// Helpers here are test code too: a panic is a failed assertion.
#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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

// ---------------------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------------------

/// How many idle connections the flood opens: twice the soft fd limit the broker is started
/// under, so that without raising its limit the broker runs out of descriptors.
const FLOOD: usize = 1_000;
const SOFT_FD_LIMIT: usize = 512;

/// 1 000 connections that never send the HTTP/2 preface, against a broker started with a
/// soft fd limit of 512: real calls and health keep working, and the idle connections are
/// closed within the handshake timeout (a read returns EOF).
#[test]
fn connections_that_never_handshake_cannot_starve_real_callers() {
    let files = TokenFiles::new();
    let dir = tempdir();
    let socket = dir.path().join("broker.sock");
    let broker = Broker::start_in_shell(
        &static_config(&files, ""),
        &socket,
        &format!("ulimit -Sn {SOFT_FD_LIMIT}"),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", broker.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let soft: usize = open_files
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        soft > FLOOD + 100,
        "the broker kept its soft fd limit: {open_files}"
    );
    let opened = Instant::now();
    let mut idle: Vec<UnixStream> = (0..FLOOD)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let out = health(&socket);
    assert!(
        out.status.success(),
        "{}\n{}",
        describe(&out),
        broker.logs()
    );
    get_token(&socket);
    // Every idle connection is closed by the broker: a read sees EOF (or a reset).
    for (i, stream) in idle.iter_mut().enumerate() {
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        // The server's own SETTINGS frame may come first; then the end.
        let mut buf = Vec::new();
        match stream.read_to_end(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!(
                "connection {i} still open after {:?}: {e}\n{}",
                opened.elapsed(),
                broker.logs()
            ),
        }
    }
    assert!(
        opened.elapsed() < Duration::from_secs(15),
        "idle connections were closed only after {:?}",
        opened.elapsed()
    );
    get_token(&socket);
}

/// A scraper that sends half a request header and stops is disconnected after the metrics
/// endpoint's header-read timeout, and a real scrape still works meanwhile.
#[test]
fn metrics_connections_with_half_sent_headers_are_closed() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let files = TokenFiles::new();
    let broker = Broker::start(&format!(
        "metrics: {{address: \"127.0.0.1:{port}\"}}\n{}",
        static_config(&files, "")
    ));
    let connect = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => return s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("metrics port: {e}\n{}", broker.logs()),
            }
        }
    };
    let opened = Instant::now();
    let mut half: Vec<std::net::TcpStream> = (0..20)
        .map(|_| {
            let mut s = connect();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // A scraper that keeps its connection open after a scrape is closed the same way.
    let mut kept = connect();
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    half.push(kept);
    let mut scrape = connect();
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    scrape.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("credbroker_"), "{body}");
    for (i, stream) in half.iter_mut().enumerate() {
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let mut buf = Vec::new();
        match stream.read_to_end(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!(
                "half-sent request {i} still open after {:?}: {e}",
                opened.elapsed()
            ),
        }
        let text = String::from_utf8_lossy(&buf);
        assert_eq!(
            text.contains("credbroker_"),
            i == 20,
            "request {i} (only the 21st is whole): {text}"
        );
    }
    assert!(
        opened.elapsed() < Duration::from_secs(15),
        "closed only after {:?}",
        opened.elapsed()
    );
}
