//! Re-asks and rejections end to end. Long-lived client-go processes (`kubectl proxy`) whose
//! token the API server stops accepting run the shim again after the 401, before the
//! come-back time they were given: the broker checks the token with the API server, which
//! answers 401, and fetches a new one at once (once, whatever the number of processes),
//! bounded while the new tokens are rejected too. Callers that ask again while the token is
//! fine (the Google Cloud SDK `kubectl` dispatcher re-executing itself, a process with a
//! second authenticator) fetch nothing, warn nothing and count no rejection.
//! tests/tests/alerts.rs runs the shipped alert on both kinds of re-ask with promtool.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use credbroker_tests::fakes::dead_port;
use credbroker_tests::{
    Broker, ExecPlugin, FakeApiServer, Kubeconfig, SHIM_RUN_ENV, TokenFiles, V1, assert_credential,
    describe, exec_provider, file_provider, grpcurl, kubectl, require_tool, scrape_metrics,
    shim_command, tempdir, write_kubeconfig,
};
use serde_json::{Value, json};

fn config(providers: &[String]) -> String {
    format!(
        "socket: {{path: \"{{socket}}\"}}\nmetrics: {{address: \"127.0.0.1:0\"}}\nproviders:\n{}",
        providers.concat()
    )
}

/// `KUBERNETES_EXEC_INFO` as client-go sets it for `server` with `provideClusterInfo: true`:
/// the server, its CA (base64 of the PEM) and the cluster's exec extension.
fn exec_info_for(server: &str, ca_pem: &str) -> String {
    json!({
        "apiVersion": V1,
        "kind": "ExecCredential",
        "spec": {"interactive": false, "cluster": {
            "server": server,
            "certificate-authority-data":
                base64::engine::general_purpose::STANDARD.encode(ca_pem),
            "config": {"clusterName": "alpha"},
        }},
    })
    .to_string()
}

/// Runs the shim as the same caller each time: this test process, multi-threaded like
/// client-go, with the same arguments and environment. That is a process with a second
/// authenticator for one cluster asking again, or client-go after a 401.
fn same_caller(broker: &Broker, provider: &str, info: &str) -> std::process::Output {
    let mut cmd = shim_command(broker.socket(), &["--provider", provider], Some(info));
    cmd.env_remove(SHIM_RUN_ENV);
    credbroker_tests::Running::spawn(&mut cmd).wait(Duration::from_secs(45))
}

/// Broker log lines at WARN or above.
fn warnings(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

fn kubeconfig(dir: &Path, server: &FakeApiServer, provider: &str, broker: &Broker) -> PathBuf {
    let path = dir.join("kubeconfig.json");
    write_kubeconfig(
        &path,
        &Kubeconfig {
            server: server.url(),
            ca_pem: server.ca_pem(),
            cluster_config: json!({"clusterName": "alpha"}),
            api_version: V1,
            provider,
            socket: broker.socket(),
        },
    );
    path
}

/// `kubectl proxy` on a port of its choosing: one long-lived client-go process. Killed on drop.
struct Proxy {
    child: Child,
    port: u16,
}

impl Proxy {
    fn start(kubeconfig: &Path) -> Proxy {
        let kubectl = require_tool(
            "kubectl",
            "install kubectl (a client-go exec-plugin client)",
        );
        let mut child = Command::new(kubectl)
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(kubeconfig.with_extension("kube-cache"))
            .args(["proxy", "--port=0", "--address=127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kubectl proxy");
        let stdout = child.stdout.take().expect("proxy stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut proxy = Proxy { child, port: 0 };
        // "Starting to serve on 127.0.0.1:PORT"
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("kubectl proxy printed its address");
        proxy.port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        proxy
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET /api` through the proxy: the API server's status code.
    fn get_api(&self) -> u16 {
        let mut stream =
            TcpStream::connect(("127.0.0.1", self.port)).expect("connect to kubectl proxy");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        write!(
            stream,
            "GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .expect("send request");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status from kubectl proxy: {answer:?}"))
    }

    /// Requests until one succeeds, at most `tries`; returns how many it took.
    fn recover(&self, tries: usize) -> Option<usize> {
        (1..=tries).find(|_| self.get_api() == 200)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// AdminService's entry for the one identity, as grpcurl prints it.
fn entry(broker: &Broker) -> Value {
    let out = grpcurl(
        broker.socket(),
        &["-d", "{}"],
        &["credbroker.v1.AdminService/ListEntries"],
    );
    assert!(out.status.success(), "{}", describe(&out));
    let list: Value = serde_json::from_slice(&out.stdout).expect("grpcurl JSON");
    list["entries"][0].clone()
}

/// The false alarm of issue "precise rejection detection": one-shot kubectl runs (the
/// Google Cloud SDK's `kubectl` asks `/version` and re-executes itself as the `kubectl.1.NN`
/// of the server's version, in the same process, running the plugin again), first use
/// included, and a process that runs the plugin twice for one cluster. Nothing was
/// rejected: one fetch for the lot, no warning, no rejection counted (so nothing for the
/// rejection alert to read: tests/tests/alerts.rs).
#[test]
fn one_shot_kubectl_runs_and_second_authenticators_fetch_nothing() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(&[exec_provider("onprem", plugin.command(), "")]));
    // 1.31: a version this machine's kubectl dispatcher has a binary for.
    let server = FakeApiServer::start_at(&["tok-alpha-1"], 31);
    let dir = tempdir();
    let kc = kubeconfig(dir.path(), &server, "onprem", &broker);
    let runs: &[&[&str]] = &[
        &["get", "--raw", "/version"],
        &["get", "--raw", "/api"],
        &["get", "pods"],
        &["version"],
    ];
    for _ in 0..3 {
        for args in runs {
            let out = kubectl(&kc, args);
            assert!(out.status.success(), "kubectl {args:?}: {}", describe(&out));
        }
    }
    let info = exec_info_for(server.url(), server.ca_pem());
    for _ in 0..3 {
        assert_eq!(
            assert_credential(&same_caller(&broker, "onprem", &info), V1).token,
            "tok-alpha-1"
        );
    }
    let logs = broker.logs();
    let asks = logs.matches("GetToken provider").count();
    println!(
        "{} kubectl runs and 3 runs of one caller: {asks} GetToken calls, {} plugin run(s), {} re-ask check(s) by the API server",
        3 * runs.len(),
        plugin.runs(),
        server.reviews().len()
    );
    assert_eq!(plugin.runs(), 1, "one fetch for the lot:\n{logs}");
    assert_eq!(warnings(&logs), Vec::<&str>::new(), "no warning:\n{logs}");
    assert!(!logs.contains("tok-alpha"), "no token in the log:\n{logs}");
    let after = scrape_metrics(&broker.metrics_address());
    assert!(
        !after.contains(r#"answer="rejected""#) && !after.contains(r#"answer="unchecked""#),
        "{after}"
    );
    // The same caller's re-asks were checked (the server accepted the token), once per
    // re-ask at most: never a fetch.
    let reviews = server.reviews();
    assert!(
        (1..=2).contains(&reviews.len()) && reviews.iter().all(|r| r.status == 201),
        "{reviews:?}"
    );
    let e = entry(&broker);
    assert_eq!(e["reasks"], "2", "{e}");
    assert!(e.get("confirmedRejections").is_none(), "{e}");
    assert_eq!(e["lastReaskCheck"], "accepted (201)", "{e}");
}

#[test]
fn kubectl_proxy_recovers_from_a_revoked_token_with_one_fetch() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(&[exec_provider("onprem", plugin.command(), "")]));
    let server = FakeApiServer::start_at(&["tok-alpha-1"], 31);
    let dir = tempdir();
    let kc = kubeconfig(dir.path(), &server, "onprem", &broker);

    // Three long-lived client-go processes, each served the cached token.
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start(&kc)).collect();
    for p in &proxies {
        assert_eq!(p.get_api(), 200);
    }
    assert_eq!(plugin.runs(), 1, "one fetch for three processes");
    // One-shot kubectl runs are new processes: served from the cache, no fetch.
    for _ in 0..3 {
        let out = kubectl(&kc, &["get", "--raw", "/api"]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    assert_eq!(plugin.runs(), 1, "new processes are served from the cache");

    // The token is revoked; the API server accepts the next one the plugin issues.
    server.revoke_all();
    server.accept("tok-alpha-2");
    // Every proxy gets a 401 at once, client-go runs the shim again, the broker checks the
    // token with the API server (401) and fetches anew: once for all of them.
    let recovered: Vec<Option<usize>> = std::thread::scope(|s| {
        let asks: Vec<_> = proxies.iter().map(|p| s.spawn(|| p.recover(3))).collect();
        asks.into_iter().map(|a| a.join().expect("join")).collect()
    });
    for (i, tries) in recovered.iter().enumerate() {
        assert!(
            matches!(tries, Some(2 | 3)),
            "proxy {i} recovered after {tries:?} requests; plugin runs {}; log:\n{}",
            plugin.runs(),
            broker.logs()
        );
    }
    assert_eq!(
        plugin.runs(),
        2,
        "one new upstream fetch:\n{}",
        broker.logs()
    );
    for p in &proxies {
        assert_eq!(p.get_api(), 200, "the new token stays in use");
    }
    assert_eq!(plugin.runs(), 2);

    let logs = broker.logs();
    let confirmed: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("rejection confirmed"))
        .collect();
    assert_eq!(confirmed.len(), 1, "one check for all three:\n{logs}");
    let pids: Vec<String> = proxies
        .iter()
        .map(|p| format!("caller_pid={}", p.pid()))
        .collect();
    assert!(
        pids.iter().any(|pid| confirmed[0].contains(pid.as_str()))
            && confirmed[0].contains(&format!("server=\"{}\"", server.url()))
            && confirmed[0].contains("fetching a new credential"),
        "the line names a proxy and the server: {confirmed:?}"
    );
    assert!(!logs.contains("tok-alpha"), "no token in the log:\n{logs}");
    let after = scrape_metrics(&broker.metrics_address());
    assert_eq!(
        sample(
            &after,
            r#"credbroker_reask_checks_total{provider="onprem",answer="rejected"}"#
        ),
        Some(1.0),
        "{after}"
    );
    let reviews = server.reviews();
    assert_eq!(
        reviews
            .iter()
            .map(|r| (r.token.as_deref(), r.status))
            .collect::<Vec<_>>(),
        [(Some("tok-alpha-1"), 401)],
        "the revoked token was checked once, with the server it was meant for"
    );
    let e = entry(&broker);
    assert_eq!(e["reasks"], "3", "{e}");
    assert!(e["lastReask"].is_string(), "{e}");
    assert_eq!(e["confirmedRejections"], "1", "{e}");
    assert!(e["lastConfirmedRejection"].is_string(), "{e}");
    assert_eq!(e["lastReaskCheck"], "rejected (401)", "{e}");
    assert!(e.get("rejectedCredentialReturned").is_none(), "{e}");
}

/// An API server that cannot be asked (down, or a CA that does not verify it): client-go
/// cannot reach it either, so the held credential stays in service; the token goes to no
/// other server than the one the request names, verified with the request's CA.
#[test]
fn a_re_ask_that_cannot_reach_its_server_keeps_the_held_credential() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(&[exec_provider("onprem", plugin.command(), "")]));
    let server = FakeApiServer::start(&["tok-alpha-1"]);
    let other = FakeApiServer::start(&["tok-alpha-1"]);
    // The server is down.
    let down = exec_info_for(
        &format!("https://127.0.0.1:{}", dead_port()),
        server.ca_pem(),
    );
    // A CA that is not the server's.
    let wrong_ca = exec_info_for(other.url(), server.ca_pem());
    // Each server is a cluster of its own (an entry of its own); the re-ask gets what is held.
    for (info, token) in [(&down, "tok-alpha-1"), (&wrong_ca, "tok-alpha-2")] {
        for _ in 0..2 {
            assert_eq!(
                assert_credential(&same_caller(&broker, "onprem", info), V1).token,
                token
            );
        }
    }
    let logs = broker.logs();
    assert_eq!(plugin.runs(), 2, "one per cluster, none forced:\n{logs}");
    assert_eq!(logs.matches("re-ask not checked").count(), 2, "{logs}");
    assert_eq!(warnings(&logs), Vec::<&str>::new(), "{logs}");
    assert!(
        other.requests().is_empty(),
        "nothing reached a server the CA does not verify: {:?}",
        other.requests()
    );
    assert!(server.requests().is_empty());
}

#[test]
fn a_cluster_that_rejects_every_token_gets_a_bounded_number_of_fetches() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(&[exec_provider("onprem", plugin.command(), "")]));
    let server = FakeApiServer::start(&["tok-alpha-1"]);
    let dir = tempdir();
    let kc = kubeconfig(dir.path(), &server, "onprem", &broker);
    let proxy = Proxy::start(&kc);
    assert_eq!(proxy.get_api(), 200);
    // RBAC broken: no token is accepted any more. Kueue-like retries, one request each.
    server.revoke_all();
    for _ in 0..10 {
        assert_eq!(proxy.get_api(), 401);
    }
    // The first re-ask forced a fetch; the rest came within 30 s of it.
    assert_eq!(plugin.runs(), 2, "{}", broker.logs());
    let logs = broker.logs();
    assert!(
        logs.contains("a forced refresh ran recently, serving the cached credential"),
        "{logs}"
    );
    let e = entry(&broker);
    assert_eq!(e["lastReaskCheck"], "rejected (401)", "{e}");
    let count: u64 = e["reasks"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    assert!(count >= 9, "each 401 is a re-ask: {e}");
}

#[test]
fn a_file_not_rotated_yet_is_served_again_and_reported() {
    let files = TokenFiles::new();
    files.write("alpha", "file-token-1");
    let broker = Broker::start(&config(&[file_provider("static", &files.template())]));
    // The API server no longer accepts the token in the file.
    let server = FakeApiServer::start(&[]);
    let info = exec_info_for(server.url(), server.ca_pem());
    // The same caller (this process, the same arguments and environment) twice.
    let same_caller = || same_caller(&broker, "static", &info);
    assert_eq!(assert_credential(&same_caller(), V1).token, "file-token-1");
    assert_eq!(assert_credential(&same_caller(), V1).token, "file-token-1");
    let logs = broker.logs();
    assert!(
        logs.contains("got back the very credential that was rejected"),
        "{logs}"
    );
    assert!(!logs.contains("file-token-1"), "{logs}");
    let e = entry(&broker);
    assert_eq!(e["reasks"], "1", "{e}");
    assert_eq!(e["confirmedRejections"], "1", "{e}");
    assert_eq!(e["rejectedCredentialReturned"], true, "{e}");
    // Rotated (another size, so another version even within the same mtime tick): what
    // fixes it. The same caller asking again gets the new file at once.
    files.write("alpha", "file-token-rotated");
    assert_eq!(
        assert_credential(&same_caller(), V1).token,
        "file-token-rotated"
    );
}

#[test]
fn callers_that_do_not_say_who_they_are_are_served_as_before() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(&[exec_provider("onprem", plugin.command(), "")]));
    // grpcurl sends no caller: asking again and again is served from the cache.
    for _ in 0..3 {
        let out = grpcurl(
            broker.socket(),
            &[
                "-d",
                r#"{"provider":"onprem","cluster":{"server":"https://alpha.example","config":{"clusterName":"alpha"}}}"#,
            ],
            &["credbroker.v1.TokenService/GetToken"],
        );
        assert!(out.status.success(), "{}", describe(&out));
    }
    assert_eq!(plugin.runs(), 1);
    assert!(!broker.logs().contains("re-ask"));
    // A caller that is not of its fixed form is refused, naming the field.
    let out = grpcurl(
        broker.socket(),
        &[
            "-d",
            r#"{"provider":"onprem","caller":{"pid":7,"configDigest":"nope"}}"#,
        ],
        &["credbroker.v1.TokenService/GetToken"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("InvalidArgument")
            && stderr.contains("caller.configDigest"),
        "{}",
        describe(&out)
    );
}
