//! Operations and security over the real socket: AdminService through grpcurl, caller
//! authorization by uid (callers run under another uid with setpriv), secrets kept out of
//! logs at trace level, exact metrics, SIGHUP reload under load, and the rate limit.

// Helpers here are test code too: a panic is a failed assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use credbroker_tests::{
    Broker, COMMAND_TIMEOUT, ExecPlugin, PluginOptions, SHIM, V1, assert_credential,
    assert_shim_error, bin, describe, exec_info, exec_provider, grpcurl, grpcurl_binary,
    require_tool, run, scrape_metrics, send_signal, tempdir, unix_channel, world_runnable,
};
use serde_json::{Value, json};

/// An unprivileged uid and gid that exist on every Debian system (nobody / nogroup).
const NOBODY: u32 = 65534;

fn config(socket_extra: &str, top_extra: &str, providers: &[String]) -> String {
    format!(
        "socket: {{path: \"{{socket}}\"{socket_extra}}}\n{top_extra}providers:\n{}",
        providers.concat()
    )
}

fn info(cluster: &str) -> String {
    exec_info(
        V1,
        &format!("https://{cluster}.example"),
        json!({"clusterName": cluster}),
    )
}

fn shim(broker: &Broker, provider: &str, cluster: &str) -> Output {
    credbroker_tests::run_shim(
        broker.socket(),
        &["--provider", provider],
        Some(&info(cluster)),
    )
}

fn json_out(out: &Output) -> Value {
    assert!(out.status.success(), "{}", describe(out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe(out)))
}

fn as_nobody(program: &Path) -> Command {
    let setpriv = require_tool("setpriv", "apt-get install util-linux");
    let mut cmd = Command::new(setpriv);
    cmd.args([
        "--reuid",
        &NOBODY.to_string(),
        "--regid",
        &NOBODY.to_string(),
        "--clear-groups",
    ])
    .arg(program);
    cmd
}

#[test]
fn admin_service_over_grpcurl_shows_entries_without_secrets() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(
        "",
        "",
        &[exec_provider("onprem", plugin.command(), "")],
    ));
    // Before any call, nothing says the provider's identity works: "untested", not "ready".
    let untested = json_out(&grpcurl(
        broker.socket(),
        &["-d", "{}"],
        &["credbroker.v1.AdminService/ListProviders"],
    ));
    assert_eq!(untested["providers"][0]["state"], "untested", "{untested}");
    assert!(
        untested["providers"][0]["lastSuccess"].is_null(),
        "{untested}"
    );
    let token = assert_credential(&shim(&broker, "onprem", "alpha"), V1).token;
    assert_credential(&shim(&broker, "onprem", "alpha"), V1);

    let listed = grpcurl(broker.socket(), &[], &["list"]);
    let services = String::from_utf8_lossy(&listed.stdout);
    for service in [
        "credbroker.v1.TokenService",
        "credbroker.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.lines().any(|l| l == service),
            "{service} missing: {}",
            describe(&listed)
        );
    }
    let described = grpcurl(
        broker.socket(),
        &[],
        &["describe", "credbroker.v1.AdminService"],
    );
    assert!(
        String::from_utf8_lossy(&described.stdout).contains("rpc ListEntries"),
        "{}",
        describe(&described)
    );

    let out = grpcurl(
        broker.socket(),
        &["-d", "{}"],
        &["credbroker.v1.AdminService/ListEntries"],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !text.contains(&token),
        "ListEntries must not show the token: {text}"
    );
    let entries = json_out(&out)["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 1, "{text}");
    assert_eq!(entries[0]["provider"], "onprem");
    assert_eq!(entries[0]["clusters"], json!(["alpha"]));
    assert_eq!(entries[0]["hits"], "1", "uint64 prints as a string in JSON");
    assert_eq!(entries[0]["state"], "fresh");
    assert!(
        entries[0]["expiresAt"].is_string() && entries[0]["refreshAt"].is_string(),
        "{text}"
    );

    let providers = json_out(&grpcurl(
        broker.socket(),
        &["-d", "{}"],
        &["credbroker.v1.AdminService/ListProviders"],
    ));
    assert_eq!(providers["providers"][0]["name"], "onprem");
    assert_eq!(providers["providers"][0]["type"], "exec");
    assert_eq!(providers["providers"][0]["ready"], true);
    assert_eq!(providers["providers"][0]["state"], "ready", "{providers}");
    assert!(
        providers["providers"][0]["lastSuccess"].is_string(),
        "{providers}"
    );

    // Forced refresh runs the plugin again; invalidate empties the cache.
    let refreshed = json_out(&grpcurl(
        broker.socket(),
        &["-d", r#"{"provider":"onprem"}"#],
        &["credbroker.v1.AdminService/Refresh"],
    ));
    assert_eq!(refreshed["refreshed"], 1, "{refreshed}");
    assert_eq!(plugin.runs(), 2);
    let invalidated = json_out(&grpcurl(
        broker.socket(),
        &["-d", r#"{"all":true}"#],
        &["credbroker.v1.AdminService/Invalidate"],
    ));
    assert_eq!(invalidated["invalidated"], 1, "{invalidated}");
    let after = json_out(&grpcurl(
        broker.socket(),
        &["-d", "{}"],
        &["credbroker.v1.AdminService/ListEntries"],
    ));
    assert!(after.get("entries").is_none(), "{after}");
    let bad = grpcurl(
        broker.socket(),
        &["-d", "{}"],
        &["credbroker.v1.AdminService/Invalidate"],
    );
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("Code: InvalidArgument"),
        "{}",
        describe(&bad)
    );
}

#[test]
fn callers_outside_the_allowed_uids_are_refused() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(
        ", mode: \"0666\", allowedUids: [0]",
        "",
        &[exec_provider("onprem", plugin.command(), "")],
    ));
    // Root (our uid) is allowed.
    assert_credential(&shim(&broker, "onprem", "a"), V1);

    let dir = tempdir();
    let shim_copy = world_runnable(dir.path(), &bin(SHIM));
    let mut cmd = as_nobody(&shim_copy);
    cmd.args(["--provider", "onprem", "--socket"])
        .arg(broker.socket())
        .env("KUBERNETES_EXEC_INFO", info("a"));
    let out = run(&mut cmd, COMMAND_TIMEOUT);
    let line = assert_shim_error(
        &out,
        &["PERMISSION_DENIED", "permission denied", "caller uid 65534"],
    );
    assert!(line.contains("socket.allowedUids"), "{line}");
    assert_eq!(plugin.runs(), 1, "a refused caller causes no upstream call");
    // Red-team finding: a refused caller in a loop made one WARN line per call. The first is
    // logged, the rest summed up (every 10 s) like rate-limited calls.
    for _ in 0..20 {
        let mut cmd = as_nobody(&shim_copy);
        cmd.args(["--provider", "onprem", "--socket"])
            .arg(broker.socket())
            .env("KUBERNETES_EXEC_INFO", info("a"));
        assert_shim_error(&run(&mut cmd, COMMAND_TIMEOUT), &["PERMISSION_DENIED"]);
    }
    let refused: Vec<String> = broker
        .logs()
        .lines()
        .filter(|l| l.contains("GetToken") && l.contains("PERMISSION_DENIED"))
        .map(str::to_owned)
        .collect();
    assert_eq!(refused.len(), 1, "21 refused calls, one line: {refused:?}");
    assert!(
        refused[0].contains("refused=1") && refused[0].contains("uid=65534"),
        "{refused:?}"
    );

    // AdminService: nobody is not an admin (default: the broker's uid and root).
    let grpcurl_copy = world_runnable(dir.path(), &grpcurl_binary());
    let mut cmd = as_nobody(&grpcurl_copy);
    cmd.args(["-plaintext", "-unix", "-authority", "localhost", "-d", "{}"])
        .arg(broker.socket())
        .arg("credbroker.v1.AdminService/ListEntries");
    let out = run(&mut cmd, COMMAND_TIMEOUT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        stderr.contains("Code: PermissionDenied") && stderr.contains("socket.adminUids"),
        "{}",
        describe(&out)
    );
    // Health stays open to every caller (probes).
    let mut cmd = as_nobody(&grpcurl_copy);
    cmd.args(["-plaintext", "-unix", "-authority", "localhost"])
        .arg(broker.socket())
        .arg("grpc.health.v1.Health/Check");
    let out = run(&mut cmd, COMMAND_TIMEOUT);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("SERVING"),
        "{}",
        describe(&out)
    );
}

#[test]
fn no_secret_in_any_log_line_even_at_trace() {
    let plugin = ExecPlugin::new();
    let yaml = config("", "", &[exec_provider("onprem", plugin.command(), "")]);
    for format in ["text", "json"] {
        let broker = Broker::start_with(&yaml, &["--log-format", format], &[("RUST_LOG", "trace")]);
        let token =
            assert_credential(&shim(&broker, "onprem", &format!("trace-{format}")), V1).token;
        assert_credential(&shim(&broker, "onprem", &format!("trace-{format}")), V1);
        let grpc = grpcurl(
            broker.socket(),
            &["-d", &json!({"provider": "onprem", "cluster": {"server": format!("https://trace-{format}.example"), "config": {"clusterName": format!("trace-{format}")}}}).to_string()],
            &["credbroker.v1.TokenService/GetToken"],
        );
        assert!(
            String::from_utf8_lossy(&grpc.stdout).contains(&token),
            "{}",
            describe(&grpc)
        );
        let logs = broker.logs();
        assert!(logs.lines().count() > 20, "trace logging is on: {logs}");
        assert!(
            !logs.contains(&token),
            "{format} logs leak the token:\n{logs}"
        );
        assert!(logs.contains("GetToken"), "{logs}");
        if format == "json" {
            let line = logs.lines().find(|l| l.contains("GetToken")).unwrap();
            let event: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(event["fields"]["code"], "OK", "{line}");
        }
    }
}

/// The value of the sample `name{labels}` in a Prometheus text exposition.
fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn metrics_count_exactly_what_happened() {
    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(
        "",
        "metrics: {address: \"127.0.0.1:0\"}\n",
        &[exec_provider("onprem", plugin.command(), "")],
    ));
    let address = broker.metrics_address();
    for _ in 0..3 {
        assert_credential(&shim(&broker, "onprem", "m"), V1);
    }
    assert_credential(&shim(&broker, "onprem", "n"), V1);
    assert_shim_error(&shim(&broker, "nope", "m"), &["NOT_FOUND"]);
    let m = scrape_metrics(&address);
    let want = [
        (
            r#"credbroker_requests_total{provider="onprem",code="OK"}"#,
            4.0,
        ),
        (
            r#"credbroker_requests_total{provider="(unknown)",code="NOT_FOUND"}"#,
            1.0,
        ),
        (r#"credbroker_cache_hits_total{provider="onprem"}"#, 2.0),
        (r#"credbroker_cache_misses_total{provider="onprem"}"#, 2.0),
        (
            r#"credbroker_upstream_fetch_duration_seconds_count{provider="onprem",outcome="ok"}"#,
            2.0,
        ),
        ("credbroker_cache_entries", 2.0),
        (
            &format!(
                r#"credbroker_build_info{{version="{}"}}"#,
                env!("CARGO_PKG_VERSION")
            ),
            1.0,
        ),
    ];
    for (name, value) in want {
        assert_eq!(sample(&m, name), Some(value), "{name} in:\n{m}");
    }
    assert_eq!(
        sample(
            &m,
            r#"credbroker_cache_stale_served_total{provider="onprem"}"#
        ),
        None,
        "{m}"
    );
}

#[test]
fn sighup_reload_under_load_fails_no_call_and_survives_a_broken_file() {
    let plugin = ExecPlugin::with(PluginOptions {
        expires_in: Some(Duration::from_secs(3600)),
        ..PluginOptions::default()
    });
    let first = config("", "", &[exec_provider("onprem", plugin.command(), "")]);
    let mut broker = Broker::start(&first);
    let socket = broker.socket().to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let (socket, stop, ok, failed) =
                (socket.clone(), stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let info = info(&format!("load-{i}"));
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let out =
                        credbroker_tests::run_shim(&socket, &["--provider", "onprem"], Some(&info));
                    let counter = if out.status.success() { &ok } else { &failed };
                    if !out.status.success() {
                        eprintln!("failed during reload: {}", describe(&out));
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let config_path = broker.config_path().to_owned();
    let socket_str = socket.to_str().unwrap().to_owned();
    let with_file = |text: &str| text.replace("{socket}", &socket_str);
    let second = config(
        "",
        "",
        &[
            exec_provider("onprem", plugin.command(), ""),
            exec_provider("added", plugin.command(), ""),
        ],
    );
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        let text = if round % 2 == 0 { &second } else { &first };
        std::fs::write(&config_path, with_file(text)).unwrap();
        send_signal(broker.pid(), "HUP");
    }
    std::thread::sleep(Duration::from_millis(300));
    // A broken file: the old config keeps serving.
    std::fs::write(
        &config_path,
        "providers: [{name: x, type: exec, exec: {bogusKey: 1}}]\n",
    )
    .unwrap();
    send_signal(broker.pid(), "HUP");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        ok.load(Ordering::SeqCst) >= 8,
        "calls ran during the reloads"
    );
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "no call fails during a reload; log:\n{}",
        broker.logs()
    );
    assert!(broker.is_running());
    let logs = broker.logs();
    assert!(logs.contains("config not reloaded"), "{logs}");
    assert!(logs.contains("providers[0].exec.bogusKey"), "{logs}");
    assert!(logs.contains("SIGHUP: config reloaded"), "{logs}");
    // The last good config (the first: rounds end on an odd index) is still in force.
    assert_credential(&shim(&broker, "onprem", "after"), V1);
    assert_shim_error(
        &shim(&broker, "added", "after"),
        &["unknown provider \"added\""],
    );
    // "onprem" never changed: its entries survived every reload (one plugin run per cluster).
    assert_eq!(plugin.runs(), 5, "4 load clusters + 1 after; log:\n{logs}");
    broker.terminate();
}

#[test]
fn a_burst_past_the_rate_limit_is_refused_and_a_polite_caller_never_is() {
    let plugin = ExecPlugin::new();
    let provider = [exec_provider("onprem", plugin.command(), "")];
    let broker = Broker::start(&config(
        "",
        "rateLimit: {perSecond: 1, burst: 5}\n",
        &provider,
    ));
    let outs: Vec<Output> = (0..12).map(|_| shim(&broker, "onprem", "burst")).collect();
    let refused = outs.iter().filter(|o| !o.status.success()).count();
    assert!(
        refused >= 5,
        "12 calls in a burst of 5 at 1/s: {refused} refused"
    );
    let line = assert_shim_error(
        outs.iter().find(|o| !o.status.success()).unwrap(),
        &["RESOURCE_EXHAUSTED"],
    );
    assert!(line.contains("rate limit"), "{line}");
    // Health is exempt even now.
    let health = grpcurl(broker.socket(), &[], &["grpc.health.v1.Health/Check"]);
    assert!(
        String::from_utf8_lossy(&health.stdout).contains("SERVING"),
        "{}",
        describe(&health)
    );

    let polite = Broker::start(&config(
        "",
        "rateLimit: {perSecond: 20, burst: 5}\n",
        &provider,
    ));
    for _ in 0..15 {
        assert_credential(&shim(&polite, "onprem", "polite"), V1);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_health_subcommand_answers_for_probes() {
    let plugin = ExecPlugin::new();
    let mut broker = Broker::start(&config(
        "",
        "",
        &[exec_provider("onprem", plugin.command(), "")],
    ));
    let socket = broker.socket().to_owned();
    let health = |extra: &[&str]| {
        let mut cmd = Command::new(bin(credbroker_tests::BROKER));
        cmd.arg("health").arg("--socket").arg(&socket).args(extra);
        run(&mut cmd, COMMAND_TIMEOUT)
    };
    let out = health(&[]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    assert!(
        health(&["--service", "credbroker.v1.AdminService"])
            .status
            .success()
    );
    let unknown = health(&["--service", "no.such.Service"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", describe(&unknown));
    broker.terminate();
    let gone = health(&["--timeout", "2s"]);
    assert_eq!(gone.status.code(), Some(1), "{}", describe(&gone));
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("cannot connect"),
        "{}",
        describe(&gone)
    );
}

/// AdminService calls naming a provider the broker does not have answer NOT_FOUND with the
/// configured names (as GetToken does), not an empty success that reads as "no entries".
#[test]
fn admin_calls_for_an_unknown_provider_are_not_found() {
    use credbroker_proto::v1::admin_service_client::AdminServiceClient;
    use credbroker_proto::v1::{InvalidateRequest, ListEntriesRequest, RefreshRequest};

    let plugin = ExecPlugin::new();
    let broker = Broker::start(&config(
        "",
        "",
        &[exec_provider("onprem", plugin.command(), "")],
    ));
    assert_credential(&shim(&broker, "onprem", "alpha"), V1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut admin = AdminServiceClient::new(unix_channel(broker.socket()).await);
        let list = |provider: &str| ListEntriesRequest {
            provider: provider.into(),
            ..Default::default()
        };
        let invalidate = |identity: &str| InvalidateRequest {
            provider: "nope".into(),
            identity: identity.into(),
            all: false,
        };
        let refresh = |identity: &str| RefreshRequest {
            provider: "nope".into(),
            identity: identity.into(),
            all: false,
        };
        let statuses = [
            ("ListEntries", admin.list_entries(list("nope")).await.err()),
            ("Invalidate", admin.invalidate(invalidate("")).await.err()),
            (
                "Invalidate one",
                admin.invalidate(invalidate("x")).await.err(),
            ),
            ("Refresh", admin.refresh(refresh("")).await.err()),
            ("Refresh one", admin.refresh(refresh("x")).await.err()),
        ];
        for (call, status) in statuses {
            let status = status.unwrap_or_else(|| panic!("{call} for provider \"nope\" succeeded"));
            assert_eq!(status.code(), tonic::Code::NotFound, "{call}: {status:?}");
            assert_eq!(
                status.message(),
                r#"unknown provider "nope" (configured: onprem)"#,
                "{call}"
            );
        }
        // The known provider's entry is untouched, and still listed by name.
        let listed = admin
            .list_entries(list("onprem"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.entries.len(), 1, "{listed:?}");
    });
}

/// Red-team finding (issue 20, item 5): misses, refreshes and operator refreshes took a
/// provider's 16 upstream permits first come, first served, so 64 misses whose plugin hung
/// until its 5 s timeout made another caller's new-cluster miss wait 19.4 s (~100 of them:
/// past the shim's 30 s). Now a free permit goes to the uid holding the fewest: the other
/// uid's miss waits for one permit to free (one plugin timeout), not for the whole queue.
#[test]
fn hanging_misses_of_one_uid_do_not_queue_another_uids_miss() {
    let dir = tempdir();
    let plugin = dir.path().join("plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncase \"${{KUBERNETES_EXEC_INFO:-}}\" in *hang-*) exec sleep 60;; esac\n\
             printf '%s\\n' '{{\"apiVersion\":\"{V1}\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"tok-legit\"}}}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let broker = Broker::start(&config(
        ", mode: \"0666\"",
        "rateLimit: {perSecond: 100000, burst: 100000}\n",
        &[exec_provider("onprem", &plugin, "timeout: 5s")],
    ));
    // 64 hanging misses from this uid (root), straight over gRPC.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let socket = broker.socket().to_path_buf();
    rt.spawn(async move {
        use credbroker_proto::v1::token_service_client::TokenServiceClient;
        let mut clients = Vec::new();
        // A connection carries at most 16 streams at once: 8 connections.
        for i in 0..64 {
            if i % 8 == 0 {
                clients.push(TokenServiceClient::new(unix_channel(&socket).await));
            }
            let mut client = clients[i / 8].clone();
            let mut req = credbroker_proto::v1::GetTokenRequest {
                provider: "onprem".into(),
                ..Default::default()
            };
            req.cluster = Some(credbroker_proto::v1::Cluster {
                server: format!("https://hang-{i}.example"),
                ..Default::default()
            });
            tokio::spawn(async move { client.get_token(req).await });
        }
    });
    // They have taken every permit a miss may take, and the rest queue.
    std::thread::sleep(Duration::from_millis(500));
    let shim_copy = world_runnable(dir.path(), &bin(SHIM));
    let mut cmd = as_nobody(&shim_copy);
    cmd.args(["--provider", "onprem", "--socket"])
        .arg(broker.socket())
        .env("KUBERNETES_EXEC_INFO", info("legit"));
    let started = Instant::now();
    let out = run(&mut cmd, COMMAND_TIMEOUT);
    let waited = started.elapsed();
    assert_eq!(assert_credential(&out, V1).token, "tok-legit");
    // One plugin timeout (5 s) and slack; first come, first served it was four (~20 s).
    assert!(
        waited < Duration::from_secs(9),
        "the other uid's miss waited {waited:?} behind 64 hanging misses"
    );
    eprintln!("a legitimate miss behind 64 hanging ones: {waited:?}");
    rt.shutdown_background();
}
