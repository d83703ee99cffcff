//! Hostile phase: while a flood of oversize requests (1 MB cluster config), unknown provider
//! names and idle or half-open connections runs, legitimate callers keep being served.
//! Bounded: `CREDBROKER_HOSTILE_SECS` seconds (default 10, 5–60), a few hundred connections,
//! everything on a temp-dir socket. Prints the legitimate callers' count, errors and p99.

// Helpers here are test code too: a panic is a failed assertion.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest};
use credbroker_tests::{Broker, TokenFiles, config_yaml, file_provider, unix_channel};

/// Tasks per kind of caller.
const LEGIT_TASKS: usize = 4;
const OVERSIZE_TASKS: usize = 2;
const UNKNOWN_TASKS: usize = 2;
/// Idle and half-open connections held at once: more than the cap the broker runs with here,
/// so the cap is hit all along.
const IDLE_HELD: usize = 400;
const CAP: usize = 256;
/// A legitimate call slower than this counts as failed.
const CALL_DEADLINE: Duration = Duration::from_secs(5);

fn duration() -> Duration {
    let secs = std::env::var("CREDBROKER_HOSTILE_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(10)
        .clamp(5, 60);
    Duration::from_secs(secs)
}

fn cluster(config: &[(&str, String)]) -> Cluster {
    use prost_types::value::Kind;
    Cluster {
        server: "https://x".to_owned(),
        config: Some(prost_types::Struct {
            fields: config
                .iter()
                .map(|(k, v)| {
                    let value = prost_types::Value {
                        kind: Some(Kind::StringValue(v.clone())),
                    };
                    ((*k).to_owned(), value)
                })
                .collect(),
        }),
        ..Cluster::default()
    }
}

/// One GetToken on a fresh connection, like the shim makes it.
async fn call(socket: &Path, request: GetTokenRequest) -> Result<String, String> {
    let attempt = async {
        let mut client = TokenServiceClient::new(unix_channel(socket).await)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        client
            .get_token(request)
            .await
            .map(|r| r.into_inner().token)
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    };
    tokio::time::timeout(CALL_DEADLINE, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {CALL_DEADLINE:?}")))
}

/// Holds `IDLE_HELD` connections that never finish a handshake (half of them send half the
/// HTTP/2 preface), replacing a tenth of them every 100 ms, until `until`.
fn hold_idle_connections(socket: PathBuf, until: Instant) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut held = std::collections::VecDeque::new();
        let mut opened = 0;
        while Instant::now() < until {
            while held.len() < IDLE_HELD {
                match std::os::unix::net::UnixStream::connect(&socket) {
                    Ok(mut s) => {
                        if opened % 2 == 0 {
                            let _ = s.write_all(b"PRI * HTTP/2.0\r\n");
                        }
                        held.push_back(s);
                        opened += 1;
                    }
                    Err(_) => break,
                }
            }
            for _ in 0..IDLE_HELD / 10 {
                held.pop_front();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        opened
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legitimate_callers_are_served_through_a_hostile_flood() {
    let files = TokenFiles::new();
    files.write("a", "token-a");
    // Every caller here runs as the test's uid: the per-uid rate limit would stop the flood
    // before it reaches what this phase tests (connection and request bounds), so it is
    // opened wide.
    let config = format!(
        "rateLimit: {{perSecond: 1000000, burst: 1000000}}\n{}",
        config_yaml(&[file_provider("static", &files.template())])
    )
    .replacen(
        "socket: {path: \"{socket}\"}",
        &format!("socket: {{path: \"{{socket}}\", maxConnections: {CAP}}}"),
        1,
    );
    let broker = Broker::start(&config);
    let socket = broker.socket().to_owned();
    let length = duration();
    let started = Instant::now();
    let until = started + length;

    let idle = hold_idle_connections(socket.clone(), until);
    let hostile_calls = Arc::new(AtomicUsize::new(0));
    let hostile_ok = Arc::new(AtomicUsize::new(0));
    let mut hostile = Vec::new();
    for i in 0..OVERSIZE_TASKS + UNKNOWN_TASKS {
        let (socket, calls, ok) = (socket.clone(), hostile_calls.clone(), hostile_ok.clone());
        hostile.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                n += 1;
                let request = if i < OVERSIZE_TASKS {
                    // 1 MB of cluster config naming a cluster that has no token.
                    GetTokenRequest {
                        provider: "static".to_owned(),
                        cluster: Some(cluster(&[
                            ("clusterName", format!("x{n}")),
                            ("padding", "p".repeat(1 << 20)),
                        ])),
                        interactive: false,
                        caller: None,
                    }
                } else {
                    GetTokenRequest {
                        provider: format!("no-such-{n}-{}", "u".repeat(1000)),
                        cluster: Some(cluster(&[("clusterName", "a".to_owned())])),
                        interactive: false,
                        caller: None,
                    }
                };
                calls.fetch_add(1, Ordering::Relaxed);
                if call(&socket, request).await.is_ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    let mut legit = Vec::new();
    for _ in 0..LEGIT_TASKS {
        let socket = socket.clone();
        legit.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = Vec::new();
            while Instant::now() < until {
                let begun = Instant::now();
                let request = GetTokenRequest {
                    provider: "static".to_owned(),
                    cluster: Some(cluster(&[("clusterName", "a".to_owned())])),
                    interactive: false,
                    caller: None,
                };
                match call(&socket, request).await {
                    Ok(token) if token == "token-a" => latencies.push(begun.elapsed()),
                    Ok(other) => failures.push(format!("wrong token {other:?}")),
                    Err(e) => failures.push(e),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (latencies, failures)
        }));
    }

    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    for task in legit {
        let (l, f) = task.await.unwrap();
        latencies.extend(l);
        failures.extend(f);
    }
    for task in hostile {
        task.await.unwrap();
    }
    let idle_opened = tokio::task::spawn_blocking(move || idle.join().unwrap())
        .await
        .unwrap();
    latencies.sort();
    let p = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    eprintln!(
        "hostile phase ({:?}): legitimate calls {} ok, {} failed, p50 {:?}, p99 {:?}, max {:?}; \
         hostile calls {} ({} OK), idle/half-open connections opened {idle_opened}",
        length,
        latencies.len(),
        failures.len(),
        p(0.50),
        p(0.99),
        latencies.last().copied().unwrap_or_default(),
        hostile_calls.load(Ordering::Relaxed),
        hostile_ok.load(Ordering::Relaxed),
    );
    assert!(
        failures.is_empty(),
        "{} legitimate calls failed, first: {:?}\n{}",
        failures.len(),
        failures.first(),
        broker.logs()
    );
    assert!(
        latencies.len() >= LEGIT_TASKS * 5,
        "too few legitimate calls"
    );
    assert!(
        idle_opened >= IDLE_HELD,
        "the flood never held its connections"
    );
    assert!(
        broker.logs().contains("connection cap reached"),
        "the cap was never hit: {}",
        broker.logs()
    );
}
