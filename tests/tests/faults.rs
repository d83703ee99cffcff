//! Faults: an upstream that fails, hangs or crawls, a broker killed with SIGKILL under load,
//! and a socket deleted under a running broker. Callers keep getting valid cached tokens,
//! errors are one clear line, and everything recovers without a restart (or, after a
//! crash, as soon as the broker is back).

// Helpers here are test code too: a panic is a failed assertion.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use credbroker_tests::modal_plugin::{ModalPlugin, Mode, epoch_now, parse_token};
use credbroker_tests::{
    BROKER_TIMEOUT, Broker, V1, assert_credential, describe, exec_info, exec_provider, grpcurl,
    run_shim, send_signal, tempdir,
};
use serde_json::json;

fn config(plugin: &ModalPlugin, exec_timeout: &str) -> String {
    format!(
        "socket: {{path: \"{{socket}}\"}}\nproviders:\n{}",
        exec_provider(
            "onprem",
            &plugin.command(),
            &format!("timeout: {exec_timeout}")
        )
    )
}

fn info(cluster: &str) -> String {
    exec_info(
        V1,
        &format!("https://{cluster}.example"),
        json!({"clusterName": cluster}),
    )
}

/// One shim call and when it started, relative to the test's start.
#[derive(Debug)]
struct Call {
    at: Duration,
    took: Duration,
    /// When the answer arrived, in seconds since the Unix epoch.
    received: f64,
    out: Output,
}

impl Call {
    fn now(start: Instant, socket: &Path, timeout: &str) -> Self {
        let begun = Instant::now();
        let out = run_shim(
            socket,
            &["--provider", "onprem", "--timeout", timeout],
            Some(&info("a")),
        );
        Call {
            at: begun - start,
            took: begun.elapsed(),
            received: epoch_now(),
            out,
        }
    }
}

/// Calls the shim every `every` from `threads` threads until `until` (from `start`).
fn callers(
    socket: &Path,
    threads: usize,
    every: Duration,
    start: Instant,
    until: Duration,
    timeout: &str,
) -> Vec<Call> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (socket, calls, timeout) = (socket.to_owned(), calls.clone(), timeout.to_owned());
            std::thread::spawn(move || {
                while start.elapsed() < until {
                    let call = Call::now(start, &socket, &timeout);
                    calls.lock().unwrap().push(call);
                    std::thread::sleep(every);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut calls = std::mem::take(&mut *calls.lock().unwrap());
    calls.sort_by_key(|c| c.at);
    calls
}

/// The token a successful call printed, checked when it arrived: not expired (its own
/// expiry is in the token), with a come-back time in the future and before that expiry.
fn valid_token(call: &Call) -> (u32, String) {
    assert!(
        call.out.status.success(),
        "{:?}: {}",
        call.at,
        describe(&call.out)
    );
    let json: serde_json::Value = serde_json::from_slice(&call.out.stdout).unwrap();
    let token = json["status"]["token"].as_str().unwrap().to_owned();
    let (_, run, exp) = parse_token(&token).unwrap_or_else(|| panic!("token {token}"));
    let come_back = time::OffsetDateTime::parse(
        json["status"]["expirationTimestamp"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
    .unix_timestamp() as f64;
    assert!(
        exp as f64 > call.received,
        "an expired token was served at {:?}: {token}",
        call.at
    );
    assert!(
        come_back > call.received - 1.0,
        "come back {come_back} in the past at {}",
        call.received
    );
    assert!(
        come_back <= exp as f64,
        "come back {come_back} after the token's expiry {exp}"
    );
    (run, token)
}

#[test]
fn a_failing_upstream_is_ridden_out_with_cached_tokens_and_recovers() {
    // 30 s tokens: refreshed from 12–18 s, served until 22.5 s (a quarter-lifetime margin).
    let plugin = ModalPlugin::new(30, 30);
    let broker = Broker::start(&config(&plugin, "5s"));
    let start = Instant::now();
    let (first, _) = valid_token(&Call::now(start, broker.socket(), "10s"));
    assert_eq!(first, 1);
    plugin.set(Mode::Fail);
    // An operator's forced refresh now fails: the failure is on record and backs off.
    let refreshed = grpcurl(
        broker.socket(),
        &["-d", r#"{"provider":"onprem"}"#],
        &["credbroker.v1.AdminService/Refresh"],
    );
    assert!(
        String::from_utf8_lossy(&refreshed.stdout).contains("upstream says no"),
        "{}",
        describe(&refreshed)
    );
    let socket = broker.socket().to_owned();
    let recover = std::thread::spawn({
        let dir = plugin.dir().to_owned();
        move || {
            std::thread::sleep(Duration::from_secs(16).saturating_sub(start.elapsed()));
            std::fs::write(dir.join("mode.tmp"), "ok").unwrap();
            std::fs::rename(dir.join("mode.tmp"), dir.join("mode")).unwrap();
        }
    });
    let calls = callers(
        &socket,
        2,
        Duration::from_millis(250),
        start,
        Duration::from_secs(26),
        "10s",
    );
    recover.join().unwrap();
    let runs: Vec<u32> = calls.iter().map(|c| valid_token(c).0).collect();
    assert!(
        runs.iter().take_while(|r| **r == 1).count() > 10,
        "the cached token was served through the outage"
    );
    assert!(
        runs.last().is_some_and(|r| *r > 1),
        "a new token after recovery, without a restart: {runs:?}"
    );
    let failed_runs = plugin
        .runs()
        .iter()
        .filter(|(_, mode)| mode == "fail")
        .count();
    // The forced refresh failed for sure; background refreshes fail too when they fall
    // before the recovery (their time is jittered), which the cache's property tests cover.
    assert!(failed_runs >= 1, "the outage was real: {:?}", plugin.runs());
    let logs = broker.logs();
    assert!(
        logs.contains("upstream call failed") && logs.contains("upstream says no"),
        "{logs}"
    );
}

#[test]
fn a_hung_or_slow_upstream_never_delays_a_cached_hit() {
    // 10 s tokens: refreshed from 4–6 s, served until 7.5 s; the exec timeout is 3 s. The
    // plugin's expirationTimestamp has whole seconds, so a token may live only 9 s and be
    // served until about 7 s: the hung phase ends at 6.5 s, inside that window.
    let plugin = ModalPlugin::new(10, 10);
    let broker = Broker::start(&config(&plugin, "3s"));
    let start = Instant::now();
    assert_credential(
        &run_shim(broker.socket(), &["--provider", "onprem"], Some(&info("a"))),
        V1,
    );
    plugin.set(Mode::Hang);
    let hung = callers(
        broker.socket(),
        2,
        Duration::from_millis(200),
        start,
        Duration::from_millis(6_500),
        "10s",
    );
    for call in &hung {
        let (run, _) = valid_token(call);
        assert_eq!(run, 1, "{call:?}");
        // A hit answers from memory: far below the 3 s the hung refresh takes to be killed.
        assert!(
            call.took < Duration::from_secs(2),
            "a hit waited on the hung upstream: {call:?}"
        );
    }
    assert!(
        plugin.runs().iter().any(|(_, mode)| mode == "hang"),
        "a refresh ran into the hang"
    );
    plugin.set(Mode::Slow);
    let later = callers(
        broker.socket(),
        2,
        Duration::from_millis(200),
        start,
        Duration::from_secs(20),
        "10s",
    );
    let mut fresh = false;
    for call in &later {
        if call.out.status.success() {
            fresh |= valid_token(call).0 > 1;
        } else {
            // Past the serving window, before the slow refresh lands: one clear line.
            let line = credbroker_tests::assert_shim_error(&call.out, &["onprem"]);
            assert!(
                line.contains("did not finish within") || line.contains("retrying in"),
                "{line}"
            );
        }
    }
    assert!(
        fresh,
        "a fresh token arrived once the upstream answered again, without a restart"
    );
    let logs = broker.logs();
    assert!(
        logs.contains("did not finish within 3s; killed its process group"),
        "{logs}"
    );
}

#[test]
fn a_broker_killed_under_load_is_reported_clearly_and_works_within_a_second_of_restart() {
    let plugin = ModalPlugin::new(3600, 3600);
    let dir = tempdir();
    let socket = dir.path().join("broker.sock");
    let yaml = config(&plugin, "5s");
    let mut broker = Broker::start_at(&yaml, &socket);
    let start = Instant::now();
    let load = std::thread::spawn({
        let socket = socket.clone();
        move || {
            callers(
                &socket,
                3,
                Duration::from_millis(50),
                start,
                Duration::from_secs(4),
                "5s",
            )
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    send_signal(broker.pid(), "KILL");
    broker.wait_exit(BROKER_TIMEOUT);
    assert!(socket.exists(), "SIGKILL leaves the socket file behind");
    let down = run_shim(&socket, &["--provider", "onprem"], Some(&info("a")));
    credbroker_tests::assert_shim_error(
        &down,
        &["cannot connect to the broker", "Connection refused"],
    );
    std::thread::sleep(Duration::from_millis(500));

    let restarted = Broker::start_at(&yaml, &socket);
    let ready = Instant::now();
    let out = run_shim(&socket, &["--provider", "onprem"], Some(&info("a")));
    let first = ready.elapsed();
    assert_credential(&out, V1);
    // The same call (a miss: the plugin runs) for a cluster the restarted broker has not
    // seen, once it has served: what a miss costs on this machine now. The restart may add
    // under a second to that. A bound of a second in all held on a quiet machine but not
    // under CI's load (1.04 s once, release builds and the real-cluster suite beside), none of
    // that the restart's.
    let runs = plugin.runs().len();
    let settled = Instant::now();
    assert_credential(
        &run_shim(&socket, &["--provider", "onprem"], Some(&info("b"))),
        V1,
    );
    let miss = settled.elapsed();
    assert!(
        plugin.runs()[runs..]
            .iter()
            .any(|(cluster, _)| cluster == "b"),
        "the call it is compared with is a miss too: {:?}",
        plugin.runs()
    );
    assert!(
        first < miss + Duration::from_secs(1),
        "works within a second of the restart: the first call took {first:?}, a miss on the running broker {miss:?}"
    );
    assert!(
        restarted.logs().contains("replacing a stale socket"),
        "{}",
        restarted.logs()
    );

    let calls = load.join().unwrap();
    assert!(calls.iter().any(|c| c.out.status.success()), "the load ran");
    for call in calls.iter().filter(|c| !c.out.status.success()) {
        let line = credbroker_tests::assert_shim_error(&call.out, &["broker"]);
        assert!(
            line.contains("cannot connect to the broker")
                || line.contains("GetToken call to the broker"),
            "a clear error while the broker was down: {line}"
        );
    }
}

#[test]
fn a_deleted_socket_is_recreated() {
    let plugin = ModalPlugin::new(3600, 3600);
    let broker = Broker::start(&config(&plugin, "5s"));
    assert_credential(
        &run_shim(broker.socket(), &["--provider", "onprem"], Some(&info("a"))),
        V1,
    );
    std::fs::remove_file(broker.socket()).unwrap();
    let out = run_shim(broker.socket(), &["--provider", "onprem"], Some(&info("a")));
    credbroker_tests::assert_shim_error(&out, &["cannot connect to the broker"]);
    let back = credbroker_tests::wait_until(Duration::from_secs(5), || broker.socket().exists());
    assert!(
        back,
        "the socket was not recreated; log:\n{}",
        broker.logs()
    );
    let out = run_shim(broker.socket(), &["--provider", "onprem"], Some(&info("a")));
    let token = assert_credential(&out, V1).token;
    assert_eq!(
        parse_token(&token).unwrap().1,
        1,
        "the cache survived: no new upstream call"
    );
    assert!(broker.logs().contains("recreated it"), "{}", broker.logs());
}
