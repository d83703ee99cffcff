//! Config files and token files as inputs an attacker or a mistake controls: duplicate keys,
//! alias bombs through SIGHUP, restart-only warnings, and token "files" that are FIFOs or
//! devices.

use std::os::unix::fs::OpenOptionsExt as _;
use std::time::{Duration, Instant};

use credbroker_tests::{
    Broker, TokenFiles, assert_credential, assert_shim_error, config_yaml, exec_info,
    file_provider, run_broker_cli, run_shim, send_signal, tempdir, wait_until,
};
use serde_json::json;

const V1: &str = "client.authentication.k8s.io/v1";

fn info(cluster: &str) -> String {
    exec_info(V1, "https://x.example", json!({"clusterName": cluster}))
}

fn logs_count(broker: &Broker, needle: &str) -> usize {
    broker.logs().matches(needle).count()
}

#[test]
fn check_config_refuses_duplicate_keys_naming_the_path() {
    let dir = tempdir();
    let path = dir.path().join("dup.yaml");
    std::fs::write(
        &path,
        "socket:\n  path: /tmp/x.sock\n  allowedUids: [65532]\nsocket:\n  path: /tmp/x.sock\nproviders: [{name: f, type: file, file: {path: /t}}]\n",
    )
    .unwrap();
    let out = run_broker_cli(&["check-config".as_ref(), path.as_os_str()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("dup.yaml: socket: duplicate key \"socket\""),
        "{stderr}"
    );
}

/// `credbroker notin(x)` (no space before the parenthesis) passed `check-config` as a selector
/// by presence; Kubernetes' lexer ends an identifier at '(', so the API server reads
/// `credbroker notin (x)`: every Secret without that label. Refused, saying how it is read;
/// the same requirement beside one by presence is fine.
#[test]
fn check_config_reads_a_label_selector_as_kubernetes_does() {
    let dir = tempdir();
    let path = dir.path().join("secrets.yaml");
    let config = |selector: &str| {
        format!(
            "providers:\n  - name: secrets\n    type: kubernetesSecret\n    kubernetesSecret:\n      namespace: kueue-system\n      labelSelector: {selector}\n"
        )
    };
    std::fs::write(&path, config("credbroker notin(x)")).unwrap();
    let out = run_broker_cli(&["check-config".as_ref(), path.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "providers[0].kubernetesSecret.labelSelector: \"credbroker notin(x)\" selects \
             Secrets without a label: Kubernetes reads it as \"credbroker notin (x)\""
        ),
        "{stderr}"
    );
    std::fs::write(
        &path,
        config("\"credbroker notin(x),credbroker.dev/credential=true\""),
    )
    .unwrap();
    let out = run_broker_cli(&["check-config".as_ref(), path.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Item 5 of issue 23: a `providers:` fragment pasted into a file on its own was read as a
/// tuple of the top-level sections, so check-config named the socket section's fields
/// ("unknown field `allowOverrides`, expected one of `path`, `mode`, …").
#[test]
fn a_document_that_is_not_a_mapping_is_refused_saying_what_the_top_level_holds() {
    let dir = tempdir();
    for (name, text, want) in [
        (
            "fragment.yaml",
            "  - name: ocm\n    type: file\n    allowOverrides: {}\n    file: {path: \"/t/{clusterName}\"}\n",
            "fragment.yaml: (top level): the document is a list, but a credbroker config is a mapping with the keys socket, cache, metrics, rateLimit, limits and providers; a list of provider entries goes under `providers:`",
        ),
        (
            "scalar.yaml",
            "credbroker\n",
            "scalar.yaml: (top level): the document is a string, but a credbroker config is a mapping",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = run_broker_cli(&["check-config".as_ref(), path.as_os_str()]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{stderr}");
        assert!(!stderr.contains("`mode`"), "{stderr}");
    }
}

#[test]
fn an_alias_bomb_through_sighup_is_refused_and_never_delays_a_call() {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    let mut broker = Broker::start(&config_yaml(&[file_provider("f", &files.template())]));
    assert_credential(
        &run_shim(broker.socket(), &["--provider", "f"], Some(&info("a"))),
        V1,
    );
    // 500 KB anchored once, referenced 2 000 times: a gigabyte if expanded.
    let mut bomb = format!(
        "socket: {{path: {:?}}}\nx-big: &big {}\nx-copies: [",
        broker.socket(),
        "y".repeat(500_000)
    );
    bomb.push_str(&"*big,".repeat(2_000));
    bomb.push_str("*big]\nproviders: [{name: f, type: file, file: {path: /t}}]\n");
    std::fs::write(broker.config_path(), bomb).unwrap();
    send_signal(broker.pid(), "HUP");
    // Calls keep being answered from the cache while (and after) the file is refused.
    let started = Instant::now();
    for _ in 0..5 {
        let out = run_shim(
            broker.socket(),
            &["--provider", "f", "--timeout", "5s"],
            Some(&info("a")),
        );
        assert_credential(&out, V1);
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        wait_until(Duration::from_secs(10), || broker
            .logs()
            .contains("config not reloaded")),
        "{}",
        broker.logs()
    );
    let logs = broker.logs();
    assert!(logs.contains("alias"), "{logs}");
    assert!(broker.is_running());
}

/// Red-team finding (issue 20, item 9): a 960 KB config of nested brackets burned a core for
/// over 11 minutes on SIGHUP, every later SIGHUP was ignored, and SIGTERM left the process
/// running after it logged "stopped". Now deep nesting is refused in one pass, a FIFO put in
/// the config's place is refused without blocking, later SIGHUPs reload, SIGTERM exits.
#[test]
fn nested_brackets_or_a_fifo_through_sighup_neither_burn_nor_block() {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    let good = config_yaml(&[file_provider("f", &files.template())]);
    let mut broker = Broker::start(&good);
    let socket = broker.socket().to_str().unwrap().to_owned();
    let hup_and_wait = |broker: &Broker, needle: &str, n: usize| {
        send_signal(broker.pid(), "HUP");
        assert!(
            wait_until(Duration::from_secs(10), || logs_count(broker, needle) == n),
            "no {n}th {needle:?} within 10 s:\n{}",
            broker.logs()
        );
    };
    // 950 KB of `{a: {a: …`: refused at once, naming the line and column.
    let nested = format!(
        "socket: {{path: {socket:?}}}\nx: {}1{}\n",
        "{a: ".repeat(190_000),
        "}".repeat(190_000)
    );
    std::fs::write(broker.config_path(), nested).unwrap();
    let started = Instant::now();
    hup_and_wait(&broker, "config not reloaded", 1);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        broker.logs().contains("line 2 column 260"),
        "{}",
        broker.logs()
    );
    // A FIFO in the config's place: refused without waiting for a writer.
    std::fs::remove_file(broker.config_path()).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(broker.config_path())
        .status()
        .unwrap();
    assert!(status.success());
    hup_and_wait(&broker, "config not reloaded", 2);
    assert!(
        broker.logs().contains("not a regular file (it is a FIFO)"),
        "{}",
        broker.logs()
    );
    // The next SIGHUP is heard and reloads a good file.
    std::fs::remove_file(broker.config_path()).unwrap();
    std::fs::write(broker.config_path(), good.replace("{socket}", &socket)).unwrap();
    hup_and_wait(&broker, "SIGHUP: config reloaded", 1);
    assert_credential(
        &run_shim(broker.socket(), &["--provider", "f"], Some(&info("a"))),
        V1,
    );
    // SIGTERM exits promptly.
    let started = Instant::now();
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn restart_warnings_stay_until_the_restart_and_compare_with_the_running_config() {
    let files = TokenFiles::new();
    let first = config_yaml(&[file_provider("f", &files.template())]);
    let changed = first.replace(
        "socket: {path: \"{socket}\"}",
        "socket: {path: \"{socket}\", mode: \"0600\"}",
    );
    assert_ne!(first, changed);
    let mut broker = Broker::start(&first);
    let socket = broker.socket().to_str().unwrap().to_owned();
    let reload = |broker: &Broker, text: &str, n: usize| {
        std::fs::write(broker.config_path(), text.replace("{socket}", &socket)).unwrap();
        send_signal(broker.pid(), "HUP");
        assert!(
            wait_until(Duration::from_secs(10), || logs_count(
                broker,
                "SIGHUP: config reloaded"
            ) == n),
            "{}",
            broker.logs()
        );
    };
    let warning = "changes to socket.path, socket.mode and socket.maxConnections take effect at the next restart";
    reload(&broker, &changed, 1);
    assert_eq!(logs_count(&broker, warning), 1);
    // The same file again: the running socket still has the old mode, so it still warns.
    reload(&broker, &changed, 2);
    assert_eq!(logs_count(&broker, warning), 2, "{}", broker.logs());
    // Back to what is running: nothing is pending.
    reload(&broker, &first, 3);
    assert_eq!(logs_count(&broker, warning), 2, "{}", broker.logs());
    assert!(broker.is_running());
}

#[test]
fn token_files_that_are_fifos_or_devices_are_refused_and_never_block_shutdown() {
    let files = TokenFiles::new();
    let dir = files.path("fifo");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let fifo = files.path("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let zero = files.path("zero");
    std::fs::create_dir_all(zero.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let mut broker = Broker::start(&config_yaml(&[file_provider("f", &files.template())]));
    // A FIFO with no writer: refused at once (opening it for reading would block forever).
    let out = run_shim(
        broker.socket(),
        &["--provider", "f", "--timeout", "5s"],
        Some(&info("fifo")),
    );
    assert_shim_error(&out, &["is not a regular file"]);
    // A symlink to /dev/zero: refused, nothing read.
    let out = run_shim(
        broker.socket(),
        &["--provider", "f", "--timeout", "5s"],
        Some(&info("zero")),
    );
    assert_shim_error(&out, &["is not a regular file"]);
    // Kubelet's Secret volumes are symlinks to regular files: still served.
    let real = files.write("real-target", "the-token");
    let linked = files.path("linked");
    std::fs::create_dir_all(linked.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, &linked).unwrap();
    let cred = assert_credential(
        &run_shim(broker.socket(), &["--provider", "f"], Some(&info("linked"))),
        V1,
    );
    assert_eq!(cred.token, "the-token");
    // SIGTERM exits promptly: no read is left blocked on the FIFO.
    let started = Instant::now();
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_fifo_fed_with_a_large_token_is_never_read_whole() {
    let files = TokenFiles::new();
    let fifo = files.path("fed");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // A writer that keeps 30 MB ready for whoever opens the FIFO.
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Write as _;
            if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&fifo) {
                let chunk = vec![b'a'; 1024 * 1024];
                for _ in 0..30 {
                    if f.write_all(&chunk).is_err() {
                        break;
                    }
                }
            }
        })
    };
    let broker = Broker::start(&config_yaml(&[file_provider("f", &files.template())]));
    let out = run_shim(
        broker.socket(),
        &["--provider", "f", "--timeout", "10s"],
        Some(&info("fed")),
    );
    assert_shim_error(&out, &["is not a regular file"]);
    // Unblock and end the writer if the broker never opened the FIFO.
    // (O_NONBLOCK, 0o4000 on Linux: opening for reading must not wait for a writer.)
    let _ = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000)
        .open(&fifo);
    drop(broker);
    let _ = writer.join();
}
