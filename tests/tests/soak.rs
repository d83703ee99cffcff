//! Soak: tokens that live 20–30 s, continuous concurrent callers on several clusters for
//! a bounded time (75 s by default; CREDBROKER_SOAK_SECS sets 10–180). Zero failed calls,
//! zero expired tokens served, and upstream calls per cluster as the refresh schedule says.

// Helpers here are test code too: a panic is a failed assertion.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use credbroker_tests::modal_plugin::{ModalPlugin, epoch_now, parse_token};
use credbroker_tests::{Broker, V1, describe, exec_info, exec_provider, run_shim};
use serde_json::json;

const CLUSTERS: usize = 4;
const THREADS_PER_CLUSTER: usize = 2;
/// Token lifetimes from the plugin, in seconds.
const LIFETIME: (u32, u32) = (20, 30);

fn soak_duration() -> Duration {
    let secs = std::env::var("CREDBROKER_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(75)
        .clamp(10, 180);
    Duration::from_secs(secs)
}

#[test]
fn continuous_callers_never_fail_and_never_get_an_expired_token() {
    let plugin = ModalPlugin::new(LIFETIME.0, LIFETIME.1);
    let broker = Broker::start(&format!(
        "socket: {{path: \"{{socket}}\"}}\nproviders:\n{}",
        exec_provider("onprem", &plugin.command(), "timeout: 10s")
    ));
    let duration = soak_duration();
    let start = Instant::now();
    let served: Arc<Mutex<BTreeMap<String, Vec<u32>>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let threads: Vec<_> = (0..CLUSTERS * THREADS_PER_CLUSTER)
        .map(|i| {
            let cluster = format!("soak-{}", i % CLUSTERS);
            let (socket, served, failures) =
                (broker.socket().to_owned(), served.clone(), failures.clone());
            std::thread::spawn(move || {
                let info = exec_info(
                    V1,
                    &format!("https://{cluster}.example"),
                    json!({"clusterName": cluster}),
                );
                while start.elapsed() < duration {
                    let out = run_shim(&socket, &["--provider", "onprem"], Some(&info));
                    let received = epoch_now();
                    let checked = check(&out, received, &cluster);
                    match checked {
                        Ok(run) => served
                            .lock()
                            .unwrap()
                            .entry(cluster.clone())
                            .or_default()
                            .push(run),
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed calls, first: {:?}",
        failures.len(),
        failures.first()
    );

    // Refresh at 40–60 % of a 20–30 s lifetime: every 8–18 s, plus the first fetch.
    let secs = duration.as_secs_f64();
    let (fewest, most) = (1.0 + secs / 18.0 - 1.0, 1.0 + secs / 8.0 + 1.0);
    let mut per_cluster = BTreeMap::new();
    for (cluster, mode) in plugin.runs() {
        assert_eq!(mode, "ok");
        *per_cluster.entry(cluster).or_insert(0u32) += 1;
    }
    assert_eq!(per_cluster.len(), CLUSTERS, "{per_cluster:?}");
    for (cluster, runs) in &per_cluster {
        let runs = f64::from(*runs);
        assert!(
            runs >= fewest.floor() && runs <= most.ceil(),
            "{cluster}: {runs} upstream calls in {secs} s, expected {fewest:.1}..{most:.1}: {per_cluster:?}"
        );
    }
    let served = served.lock().unwrap();
    for (cluster, runs) in served.iter() {
        let newest = runs.iter().max().copied().unwrap_or(0);
        assert!(
            newest >= 2,
            "{cluster}: callers kept getting the first token: {newest}"
        );
    }
    let total: usize = served.values().map(Vec::len).sum();
    eprintln!("soak: {total} calls in {secs} s, upstream calls per cluster {per_cluster:?}");
}

/// A call's result when it arrived: the plugin run that issued the token, or what was wrong.
fn check(out: &std::process::Output, received: f64, cluster: &str) -> Result<u32, String> {
    if !out.status.success() {
        return Err(describe(out));
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let token = json["status"]["token"].as_str().ok_or("no token")?;
    let (issued_for, run, exp) = parse_token(token).ok_or_else(|| format!("token {token}"))?;
    if issued_for != cluster {
        return Err(format!("{cluster} got {issued_for}'s token"));
    }
    if exp as f64 <= received {
        return Err(format!("expired token served: {token} at {received}"));
    }
    let come_back = json["status"]["expirationTimestamp"]
        .as_str()
        .ok_or("no expiry")?;
    let come_back =
        time::OffsetDateTime::parse(come_back, &time::format_description::well_known::Rfc3339)
            .map_err(|e| e.to_string())?
            .unix_timestamp() as f64;
    if come_back > exp as f64 || come_back <= received - 1.0 {
        return Err(format!("come back {come_back} outside ({received}, {exp}]"));
    }
    Ok(run)
}
