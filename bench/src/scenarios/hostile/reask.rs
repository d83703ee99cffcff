//! Section 8's re-ask part: a legitimate re-ask about a revoked token, alone and beside each of
//! the re-ask check's attackers (`check-slot` and `caller-flood`, `bench/src/attack.rs`, run
//! under another uid). The victim (uid 0, the bench) asks for a new cluster's token of `reask`,
//! the bench revokes that token at the victim's API server (a loopback fake answering the
//! broker's check after [`VICTIM_CHECK_LATENCY`]: 401 for the revoked token), and the victim
//! asks again as the same caller before its come-back time: a re-ask, which the broker checks
//! with that server and, on the 401, answers with a new token. Reported per phase: the time from
//! the re-ask to the new token (median, max over the tries), whether the revoked token ever came
//! back (it must not), the 401s the server gave, and the broker's RSS before, during and after.

use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use credbroker_proto::v1::Caller;

use crate::attack::{self, CANCEL_AFTER, CHECK_SLOT_CA_BYTES, REASK_RATE, ReaskTarget};
use crate::bench::{Bench, progress, verdict};
use crate::fakes::ReviewServer;
use crate::load;
use crate::procs::{Broker, rss_kib};
use crate::stats::{ms, percentile};

use super::{ALLOWED_ATTACKER, SETPRIV};

/// How long the victim's API server takes to answer a check: the 200 ms upstream (the
/// bench's fakes all answer after it), so one check is visible in the recovery time.
const VICTIM_CHECK_LATENCY: Duration = Duration::from_millis(200);
/// Between the victim's first ask and its re-ask: client-go uses the token until a request
/// gets a 401. Long enough for the caller flood (180 calls a second) to bring about 54 new
/// callers into the victim's entry, over three times the 16 per uid the broker remembers.
const DWELL: Duration = Duration::from_millis(300);
/// After a re-ask answered with the revoked token, the victim asks again this much later (as
/// client-go does at its next 401), until [`RECOVERY_DEADLINE`].
const RETRY_AFTER: Duration = Duration::from_millis(100);
const RECOVERY_DEADLINE: Duration = Duration::from_secs(30);
/// One victim call: a re-ask waits at most for a check slot (`CHECK_WAIT`, 10 s) and the check
/// (`CHECK_TIMEOUT`, 5 s).
const CALL_DEADLINE: Duration = Duration::from_secs(20);
/// Between the victim's tries.
const BETWEEN_TRIES: Duration = Duration::from_millis(100);
/// After the attacker says it is ready, before the victim's first try: the check-slot
/// attacker's re-asks fill the slots it may hold within a second.
const WARM_IN: Duration = Duration::from_secs(2);
/// The longest an attacker may take to set up (the check-slot attacker's 1 300 first asks
/// take seconds on a release build, more on a debug one on a busy machine).
const READY_WITHIN: Duration = Duration::from_secs(180);
/// The broker's growth allowed during the check-slot flood: `tests/tests/hostile_reasks.rs`'s
/// bound (7 MiB measured there; the code before the bounds grew by 115 MiB on a release build).
const RSS_GROWTH_GOAL_MIB: u64 = 20;
/// Attackers of this part, in the order their phases run.
const ATTACKERS: [&str; 2] = ["check-slot", "caller-flood"];

/// One phase: the victim's tries, alone or beside one attacker.
#[derive(Debug, Default)]
struct Phase {
    attacker: Option<&'static str>,
    recoveries: Vec<Duration>,
    /// Re-asks answered with the revoked token.
    revoked_back: usize,
    /// Tries that failed (an error, or no new token within [`RECOVERY_DEADLINE`]).
    failed: usize,
    first_error: Option<String>,
    /// Checks the victim's server answered during the phase: 401 (a revoked token), 201.
    rejected: u64,
    accepted: u64,
    rss_before_kib: u64,
    rss_ready_kib: u64,
    rss_max_kib: u64,
    rss_after_kib: u64,
    summary: String,
}

/// Runs the part on a broker of its own (so its RSS is this part's alone) and appends its
/// markdown to the report.
pub fn run(bench: &mut Bench<'_>, attacker_bin: &Path) {
    let server = ReviewServer::start(VICTIM_CHECK_LATENCY);
    let broker = bench.start_hostile_broker(ALLOWED_ATTACKER);
    let w = bench.w().to_path_buf();
    let target = ReaskTarget {
        server: server.url().to_owned(),
        ca_pem: server.ca_pem().to_owned(),
        entries: bench.plan.reask_entries,
        current: w.join("reask-current"),
        stop: w.join("reask-stop"),
    };
    let target_file = w.join("reask-target.json");
    target.write(&target_file);
    progress(&format!(
        "hostile re-asks: {} tries each unloaded and beside the {} attackers",
        bench.plan.reask_tries,
        ATTACKERS.join(" and ")
    ));
    let mut phases = Vec::new();
    for attacker in std::iter::once(None).chain(ATTACKERS.map(Some)) {
        let _ = std::fs::remove_file(&target.stop);
        let _ = std::fs::remove_file(&target.current);
        phases.push(phase(
            bench,
            &broker,
            &server,
            &target,
            attacker.map(|kind| (kind, attacker_bin, target_file.as_path())),
        ));
    }
    drop(broker);
    let part = report(&phases, &target);
    bench.out.push_str(&part);
}

/// The victim's tries, beside `attacker` (its kind, the binary, the target file) if any.
fn phase(
    bench: &Bench<'_>,
    broker: &Broker,
    server: &ReviewServer,
    target: &ReaskTarget,
    attacker: Option<(&'static str, &Path, &Path)>,
) -> Phase {
    let pid = broker.pid();
    let name = attacker.map_or("unloaded", |(kind, _, _)| kind);
    let mut phase = Phase {
        attacker: attacker.map(|(kind, _, _)| kind),
        rss_before_kib: rss_kib(pid),
        ..Phase::default()
    };
    let mut running = attacker.map(|(kind, bin, file)| {
        let cap = bench.plan.reask_attack_cap;
        Attacker::spawn(bin, kind, &broker.socket, cap, file)
    });
    if let Some(Err(e)) = running.as_mut().map(Attacker::wait_ready) {
        phase.failed = bench.plan.reask_tries;
        phase.first_error = Some(e);
        phase.summary = running.map(|a| a.finish(&target.stop)).unwrap_or_default();
        return phase;
    }
    if running.is_some() {
        std::thread::sleep(WARM_IN);
    }
    phase.rss_ready_kib = rss_kib(pid);
    let (rejected_before, accepted_before) = (server.rejected(), server.accepted());
    let tries = bench.plan.reask_tries;
    let socket = broker.socket.clone();
    let (recoveries, rss_max) = bench.rt.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut max = 0;
                while !stop.load(Ordering::Relaxed) {
                    max = max.max(rss_kib(pid));
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                max
            })
        };
        let mut out = Vec::new();
        for k in 0..tries {
            let cluster = format!("victim-{name}-{k}");
            out.push(victim_try(&socket, server, target, &cluster).await);
            tokio::time::sleep(BETWEEN_TRIES).await;
        }
        stop.store(true, Ordering::Relaxed);
        (out, sampler.await.unwrap_or(0))
    });
    phase.rss_max_kib = rss_max;
    phase.rejected = server.rejected() - rejected_before;
    phase.accepted = server.accepted() - accepted_before;
    for t in recoveries {
        phase.revoked_back += t.revoked_back;
        match t.result {
            Ok(d) => phase.recoveries.push(d),
            Err(e) => {
                phase.failed += 1;
                phase.first_error.get_or_insert(e);
            }
        }
    }
    if let Some(a) = running {
        phase.summary = a.finish(&target.stop);
    }
    std::thread::sleep(Duration::from_secs(1));
    phase.rss_after_kib = rss_kib(pid);
    progress(&format!(
        "hostile re-asks, {name}: {} of {tries} recovered, revoked token back {} times",
        phase.recoveries.len(),
        phase.revoked_back
    ));
    phase
}

/// One try's outcome.
#[derive(Debug)]
struct Try {
    /// From the re-ask to the new token, or why none came.
    result: Result<Duration, String>,
    revoked_back: usize,
}

/// The victim's caller id: the bench's pid, a start time and a digest of its own, the same
/// for the first ask and the re-ask (as one client-go process asking for one cluster).
fn victim_caller() -> Caller {
    Caller {
        pid: std::process::id(),
        start_time: 1,
        config_digest: "cd".repeat(32),
    }
}

/// One try on the cluster `cluster`: first ask, revoke, re-ask until a new token comes.
async fn victim_try(
    socket: &Path,
    server: &ReviewServer,
    target: &ReaskTarget,
    cluster: &str,
) -> Try {
    let mut t = Try {
        result: Err(String::new()),
        revoked_back: 0,
    };
    // The caller flood's target from now on (written whole, then renamed into place).
    let tmp = target.current.with_extension("tmp");
    let written =
        std::fs::write(&tmp, cluster).and_then(|()| std::fs::rename(&tmp, &target.current));
    if let Err(e) = written {
        t.result = Err(format!("write {}: {e}", target.current.display()));
        return t;
    }
    let request = || {
        attack::reask_request(
            "reask",
            cluster,
            server.url(),
            server.ca_pem().as_bytes(),
            victim_caller(),
        )
    };
    let first = match fresh_call(socket, request()).await {
        Ok(token) => token,
        Err(e) => {
            t.result = Err(format!("first ask: {e}"));
            return t;
        }
    };
    server.revoke(&first);
    tokio::time::sleep(DWELL).await;
    let started = Instant::now();
    loop {
        match fresh_call(socket, request()).await {
            Ok(token) if token != first => {
                t.result = Ok(started.elapsed());
                return t;
            }
            Ok(_) => t.revoked_back += 1,
            Err(e) => {
                t.result = Err(format!("re-ask: {e}"));
                return t;
            }
        }
        if started.elapsed() > RECOVERY_DEADLINE {
            t.result = Err(format!(
                "still the revoked token after {RECOVERY_DEADLINE:?} ({} re-asks)",
                t.revoked_back
            ));
            return t;
        }
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// One call on a new connection (as a shim run makes it): the token, or why none came.
async fn fresh_call(
    socket: &Path,
    req: credbroker_proto::v1::GetTokenRequest,
) -> Result<String, String> {
    let call = async {
        let ch = credbroker_tests::unix_channel(socket).await;
        load::get_token(&ch, req).await
    };
    match tokio::time::timeout(CALL_DEADLINE, call).await {
        Ok(Ok(r)) if r.token.starts_with("bench-reask-") => Ok(r.token),
        Ok(Ok(r)) => Err(format!("an unexpected token ({} bytes)", r.token.len())),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {CALL_DEADLINE:?}")),
    }
}

/// A re-ask attacker running under [`ALLOWED_ATTACKER`], its stdout read line by line.
struct Attacker {
    kind: &'static str,
    child: Child,
    lines: Receiver<String>,
}

impl Attacker {
    fn spawn(
        bin: &Path,
        kind: &'static str,
        socket: &Path,
        cap: Duration,
        file: &Path,
    ) -> Attacker {
        let uid = ALLOWED_ATTACKER.to_string();
        let mut child = Command::new(SETPRIV)
            .args(["--reuid", &uid, "--regid", &uid, "--clear-groups"])
            .arg(bin)
            .args(["--attack", kind])
            .arg(socket)
            .arg(cap.as_secs().to_string())
            .arg(file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {kind} attacker: {e}"));
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("the attacker's stdout");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Attacker { kind, child, lines }
    }

    /// Until the attacker prints `ready` (its entries made, its connections open).
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == "ready" => return Ok(()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the {} attacker was not ready within {READY_WITHIN:?}",
                        self.kind
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "the {} attacker exited before it was ready",
                        self.kind
                    ));
                }
            }
        }
    }

    /// Stops it (the stop file) and returns its summary line, or what it said on stderr.
    fn finish(mut self, stop: &Path) -> String {
        std::fs::write(stop, "stop").expect("write the stop file");
        let status = self.child.wait();
        let mut last = None;
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            last = Some(line);
        }
        match (status, last) {
            (Ok(s), Some(line)) if s.success() && line != "ready" => line,
            (status, _) => {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                format!("FAILED ({status:?}): {}", err.trim())
            }
        }
    }
}

/// A set duration in the report's prose: `200 ms`.
fn whole_ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn report(phases: &[Phase], target: &ReaskTarget) -> String {
    let mut out = String::new();
    let unloaded = &phases[0];
    let median = |p: &Phase| percentile(&mut p.recoveries.clone(), 50.0);
    let max = |p: &Phase| percentile(&mut p.recoveries.clone(), 100.0);
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let _ = writeln!(
        out,
        "### The re-ask check's attackers\n\nA legitimate re-ask (uid 0, a caller id of its own, on a fresh connection as a shim run makes it) about a token just revoked: per try a new cluster of `reask` (an exec provider whose plugin prints a new token every run), the victim asks once, the bench revokes that token at the cluster's API server (a loopback fake that answers the broker's check, a SelfSubjectReview, after {}: 401 for the revoked token), and {} later the victim asks again as the same caller. Recovery: from that re-ask to the answer with a new token (a re-ask answered with the revoked token is asked again {} later). Each attacker runs under uid {ALLOWED_ATTACKER}, an allowed uid, at {REASK_RATE:.0} calls a second (inside production's 200/s); the victim's tries start {} after the attacker is ready.\n\n| victim's re-ask beside | tries | recovered | median | max | revoked token back | its server's checks: 401 / 201 | RSS before | RSS attack ready | RSS max | RSS after |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        whole_ms(VICTIM_CHECK_LATENCY),
        whole_ms(DWELL),
        whole_ms(RETRY_AFTER),
        whole_ms(WARM_IN),
    );
    for p in phases {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
            p.attacker.map_or("no attacker", |k| match k {
                "check-slot" => "check-slot attacker",
                _ => "caller-flood attacker",
            }),
            p.recoveries.len() + p.failed,
            p.recoveries.len(),
            ms(median(p)),
            ms(max(p)),
            p.revoked_back,
            p.rejected,
            p.accepted,
            mib(p.rss_before_kib),
            if p.attacker.is_some() {
                mib(p.rss_ready_kib)
            } else {
                "–".to_owned()
            },
            mib(p.rss_max_kib),
            mib(p.rss_after_kib),
        );
    }
    let _ = writeln!(out, "\n| attacker | uid | what it did |\n|---|---:|---|");
    for p in phases {
        let Some(kind) = p.attacker else { continue };
        let what = match kind {
            "check-slot" => format!(
                "check-slot: {} entries of `eks-static` served once, then re-asks about them in turn whose server never answers, {} KB of CA data each, each cancelled after {}",
                target.entries,
                CHECK_SLOT_CA_BYTES / 1000,
                whole_ms(CANCEL_AFTER)
            ),
            _ => "caller-flood: a new made-up caller id every call, asking about the entry the victim uses".to_owned(),
        };
        let _ = writeln!(out, "| {what} | {ALLOWED_ATTACKER} | {} |", p.summary);
    }
    let revoked: usize = phases.iter().map(|p| p.revoked_back).sum();
    let failed: usize = phases.iter().map(|p| p.failed).sum();
    let first_error = phases.iter().find_map(|p| p.first_error.as_ref());
    let bound = median(unloaded) + VICTIM_CHECK_LATENCY;
    let attacked = &phases[1..];
    let within = attacked
        .iter()
        .all(|p| !p.recoveries.is_empty() && median(p) <= bound);
    let slot = phases.iter().find(|p| p.attacker == Some("check-slot"));
    let growth_mib = slot.map_or(0, |p| p.rss_max_kib.saturating_sub(p.rss_ready_kib) / 1024);
    let _ = writeln!(
        out,
        "\nGoals: the revoked token never served back and every try recovered: **{}** (revoked token back {revoked} times, {failed} tries failed{}); recovery beside each attacker within one more check of the victim's own server (median ≤ unloaded median + {} = {}): **{}** ({}); RSS during the check-slot flood within +{RSS_GROWTH_GOAL_MIB} MiB of its start: **{}** (+{growth_mib} MiB).\n",
        verdict(revoked == 0 && failed == 0),
        first_error
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default(),
        whole_ms(VICTIM_CHECK_LATENCY),
        ms(bound),
        verdict(within),
        attacked
            .iter()
            .map(|p| format!("{} {}", p.attacker.unwrap_or_default(), ms(median(p))))
            .collect::<Vec<_>>()
            .join(", "),
        verdict(growth_mib <= RSS_GROWTH_GOAL_MIB),
    );
    out
}
