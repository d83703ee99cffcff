//! Section 8: the hostile phase. Legitimate callers (uid 0) alone; then for five minutes beside
//! the stream attackers run as child processes under other uids: streams that never send a
//! body from a refused uid (`stall`) and a flood of header-only streams from an allowed one
//! (`flood`), the broker's RSS followed all along (goal ≤ +40 MiB); then beside all four,
//! adding requests at every `limits.*` bound for new clusters (`oversize`) and misses whose
//! plugin hangs (`hang`). Reports legitimate errors (goal 0), their hit latency against the
//! unloaded phase of the same run (goal p99 ≤ 2×), and the new-cluster misses that share a
//! provider with the hanging ones.
//!
//! Then, on a broker of its own, the re-ask check's attackers ([`reask`]): a legitimate re-ask
//! about a revoked token, alone and beside an allowed uid holding the check slots
//! (`check-slot`) or flooding the victim's entry with made-up callers (`caller-flood`).

mod reask;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bench::{Bench, progress, verdict};
use crate::load;
use crate::stats::{ms, percentile};

/// Runs the attackers under their uids (util-linux; scripts/test.sh installs it).
const SETPRIV: &str = "/usr/bin/setpriv";
/// The attackers' uids: one `allowedUids` lists (nobody), one it does not.
const ALLOWED_ATTACKER: u32 = 65534;
const REFUSED_ATTACKER: u32 = 4242;
/// Legitimate hit callers, each on a fresh connection (as the shim) every 25 ms: 160 calls/s,
/// inside the default per-uid rate limit (200/s) the broker runs with here.
const HIT_CALLERS: usize = 4;
const HIT_EVERY: Duration = Duration::from_millis(25);
/// A legitimate new-cluster miss this often, on the provider the hanging misses use.
const MISS_EVERY: Duration = Duration::from_secs(1);
/// A legitimate call slower than this counts as failed (the shim's default is 30 s; a hit
/// that takes seconds is a failure for a controller).
const CALL_DEADLINE: Duration = Duration::from_secs(5);
/// A miss waits for a permit another uid's hanging miss holds: at most its 5 s timeout.
const MISS_DEADLINE: Duration = Duration::from_secs(10);
/// The bound on RSS growth under the stream flood.
const RSS_GROWTH_GOAL_MIB: u64 = 40;
/// Before each window alone, after attackers: the hanging misses' plugin timeout (5 s,
/// `shared`'s `timeout`) and a second for the broker to reap them.
const SETTLE: Duration = Duration::from_secs(6);

#[derive(Debug, Default)]
struct Phase {
    hits: Vec<Duration>,
    hit_errors: usize,
    misses: Vec<Duration>,
    miss_errors: usize,
    first_error: Option<String>,
    rss_max_kib: u64,
    rss_end_kib: u64,
}

impl Phase {
    /// Adds a later window's calls to this phase's.
    fn absorb(&mut self, later: Phase) {
        self.hits.extend(later.hits);
        self.misses.extend(later.misses);
        self.hit_errors += later.hit_errors;
        self.miss_errors += later.miss_errors;
        self.first_error = self.first_error.take().or(later.first_error);
        self.rss_max_kib = self.rss_max_kib.max(later.rss_max_kib);
        self.rss_end_kib = later.rss_end_kib;
    }
}

pub fn run(bench: &mut Bench<'_>) {
    assert!(
        Path::new(SETPRIV).is_file(),
        "the hostile section runs its attackers under other uids with setpriv (apt-get install util-linux)"
    );
    let broker = bench.start_hostile_broker(ALLOWED_ATTACKER);
    let attacker_bin = world_runnable_copy(bench.w());
    let (unloaded_for, streams_for, hostile_for) = (
        bench.plan.hostile_unloaded,
        bench.plan.hostile_streams,
        bench.plan.hostile,
    );
    progress(&format!(
        "hostile phase: {}s unloaded, {}s beside the stream attackers, {}s beside all four",
        unloaded_for.as_secs(),
        streams_for.as_secs(),
        hostile_for.as_secs()
    ));
    let pid = broker.pid();
    let socket = broker.socket.clone();
    let (unloaded, rss_before) = bench.rt.block_on(async {
        // Warm: the hit clusters cached, the providers set up.
        let ch = credbroker_tests::unix_channel(&socket).await;
        for k in 0..HIT_CALLERS {
            load::get_token(&ch, load::request("shared", &format!("legit-hit-{k}")))
                .await
                .expect("warm-up call");
        }
        let phase = legit(&socket, pid, unloaded_for, "unloaded").await;
        (phase, crate::procs::rss_kib(pid))
    });
    // One phase: the attackers of `kinds` (in `group`, when given) beside the legitimate
    // callers for `secs`; with what each attacker did, and whether all went into the group.
    let phase = |kinds: &[&'static str], secs: Duration, name: &str, group: Option<&CpuGroup>| {
        let attackers = spawn(&attacker_bin, &socket, kinds, secs);
        let moved = group.map_or(Ok(()), |g| {
            attackers
                .iter()
                .try_for_each(|(_, child)| g.add(child.id()))
        });
        let calls = bench.rt.block_on(legit(&socket, pid, secs, name));
        (calls, reports(attackers), moved)
    };
    const ALL_FOUR: [&str; 4] = ["stall", "flood", "oversize", "hang"];
    let (streams, mut attacks, _) = phase(&["stall", "flood"], streams_for, "streams", None);
    let (hostile, more, _) = phase(&ALL_FOUR, hostile_for, "hostile", None);
    attacks.extend(more);
    // The same again with the attackers in a cpu cgroup of their own, as separate pods
    // would be: the kernel then shares the CPU between the groups, not between threads.
    // Measured in rounds, each a window of the legitimate callers alone and one beside the
    // attackers, compared window against window: this machine has slow spells of a few
    // seconds (every call 2–4× slower, attackers or not) that decide a p99 by where they fall,
    // and alternating windows spreads them over both sides.
    let rounds = bench.plan.hostile_rounds.max(1);
    let window = plan_window(&bench.plan);
    let grouped = CpuGroup::create().and_then(|group| {
        let (mut alone, mut beside) = (Phase::default(), Phase::default());
        for round in 0..rounds {
            // What the attackers before left running (a hanging plugin until its timeout)
            // ends before a window alone.
            std::thread::sleep(SETTLE);
            let calls = bench
                .rt
                .block_on(legit(&socket, pid, window, &format!("alone-{round}")));
            alone.absorb(calls);
            let (calls, more, moved) = phase(&ALL_FOUR, window, "grouped", Some(&group));
            moved?;
            beside.absorb(calls);
            if round == 0 {
                attacks.extend(more);
            }
        }
        Ok([alone, beside])
    });
    drop(broker);
    report(
        bench,
        [&unloaded, &streams, &hostile],
        &grouped,
        rss_before,
        &attacks,
    );
    reask::run(bench, &attacker_bin);
}

/// How long each window of the rounds lasts.
fn plan_window(plan: &crate::plan::Plan) -> Duration {
    plan.hostile / plan.hostile_rounds.max(1)
}

/// Where cgroup v1's `cpu` controller is mounted (this machine's hybrid layout).
const CPU_CGROUP_ROOT: &str = "/sys/fs/cgroup/cpu";

/// A cgroup of the `cpu` controller for the attackers, with the default `cpu.shares` (1024,
/// what a pod's group gets for a 1-CPU request): removed when dropped, once its processes
/// have exited.
struct CpuGroup {
    dir: PathBuf,
}

impl CpuGroup {
    fn create() -> Result<CpuGroup, String> {
        let root = Path::new(CPU_CGROUP_ROOT);
        if !root.join("cpu.shares").is_file() {
            return Err(format!(
                "no cgroup v1 cpu controller at {CPU_CGROUP_ROOT} (cpu.shares missing)"
            ));
        }
        let dir = root.join(format!("credbroker-bench-attackers-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(CpuGroup { dir })
    }

    /// Moves process `pid` (all its threads) into the group.
    fn add(&self, pid: u32) -> Result<(), String> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| format!("{}: {e}", procs.display()))
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // Empty once every attacker has been waited for; a zombie's exit can lag a little.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The attackers of `kinds`, each for `secs` under its uid.
fn spawn(
    bin: &Path,
    socket: &Path,
    kinds: &[&'static str],
    secs: Duration,
) -> Vec<(&'static str, Child)> {
    kinds
        .iter()
        .map(|&kind| {
            let uid = if kind == "stall" {
                REFUSED_ATTACKER
            } else {
                ALLOWED_ATTACKER
            };
            let child = Command::new(SETPRIV)
                .args([
                    "--reuid",
                    &uid.to_string(),
                    "--regid",
                    &uid.to_string(),
                    "--clear-groups",
                ])
                .arg(bin)
                .args(["--attack", kind])
                .arg(socket)
                .arg(secs.as_secs().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn the {kind} attacker: {e}"));
            (kind, child)
        })
        .collect()
}

/// Each attacker's summary line, once it has exited.
fn reports(attackers: Vec<(&'static str, Child)>) -> Vec<(&'static str, String)> {
    attackers
        .into_iter()
        .map(|(kind, child)| {
            let out = child.wait_with_output().expect("attacker");
            (kind, String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .collect()
}

/// This bench binary, copied where the attackers' uids can run it (it lives under /root).
fn world_runnable_copy(work: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = work.join("attacker");
    std::fs::create_dir_all(&dir).expect("attacker dir");
    credbroker_tests::world_runnable(&dir, &std::env::current_exe().expect("current_exe"))
}

/// The legitimate callers for `duration`, with the broker's RSS sampled every second.
async fn legit(socket: &Path, pid: u32, duration: Duration, name: &str) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let mut hitters = Vec::new();
    for k in 0..HIT_CALLERS {
        let (socket, stop) = (socket.to_path_buf(), Arc::clone(&stop));
        hitters.push(tokio::spawn(async move {
            let mut phase = Phase::default();
            while !stop.load(Ordering::Relaxed) {
                let req = load::request("shared", &format!("legit-hit-{k}"));
                let result = fresh_call(&socket, req, CALL_DEADLINE).await;
                note(&mut phase, result, false);
                tokio::time::sleep(HIT_EVERY).await;
            }
            phase
        }));
    }
    let misser = {
        let (socket, stop, name) = (socket.to_path_buf(), Arc::clone(&stop), name.to_owned());
        tokio::spawn(async move {
            let mut phase = Phase::default();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let req = load::request("shared", &format!("legit-new-{name}-{n}"));
                let result = fresh_call(&socket, req, MISS_DEADLINE).await;
                note(&mut phase, result, true);
                tokio::time::sleep(MISS_EVERY).await;
            }
            phase
        })
    };
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(crate::procs::rss_kib(pid));
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = misser.await.expect("miss task");
    for h in hitters {
        let p = h.await.expect("hit task");
        total.hits.extend(p.hits);
        total.hit_errors += p.hit_errors;
        total.first_error = total.first_error.or(p.first_error);
    }
    total.rss_max_kib = rss.iter().copied().max().unwrap_or(0);
    total.rss_end_kib = rss.last().copied().unwrap_or(0);
    total
}

/// One call on a new connection (as a shim run makes it): the time to connect and be
/// answered, or why it failed.
async fn fresh_call(
    socket: &Path,
    req: credbroker_proto::v1::GetTokenRequest,
    deadline: Duration,
) -> Result<Duration, String> {
    let t = Instant::now();
    let call = async {
        let ch = credbroker_tests::unix_channel(socket).await;
        load::get_token(&ch, req).await
    };
    match tokio::time::timeout(deadline, call).await {
        Ok(Ok(r)) if r.token == "bench-shared-token" => Ok(t.elapsed()),
        Ok(Ok(r)) => Err(format!("wrong token ({} bytes)", r.token.len())),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {deadline:?}")),
    }
}

fn note(phase: &mut Phase, result: Result<Duration, String>, miss: bool) {
    match (result, miss) {
        (Ok(d), false) => phase.hits.push(d),
        (Ok(d), true) => phase.misses.push(d),
        (Err(e), miss) => {
            if miss {
                phase.miss_errors += 1;
            } else {
                phase.hit_errors += 1;
            }
            phase.first_error.get_or_insert(e);
        }
    }
}

fn report(
    bench: &mut Bench<'_>,
    phases: [&Phase; 3],
    grouped: &Result<[Phase; 2], String>,
    rss_before: u64,
    attacks: &[(&str, String)],
) {
    let [unloaded, streams, hostile] = phases;
    let row = |name: &str, p: &Phase| {
        let (mut hits, mut misses) = (p.hits.clone(), p.misses.clone());
        format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} MiB | {:.1} MiB |",
            hits.len(),
            p.hit_errors,
            ms(percentile(&mut hits, 50.0)),
            ms(percentile(&mut hits, 99.0)),
            ms(percentile(&mut hits, 100.0)),
            misses.len(),
            p.miss_errors,
            ms(percentile(&mut misses, 50.0)),
            ms(percentile(&mut misses, 100.0)),
            p.rss_max_kib as f64 / 1024.0,
            p.rss_end_kib as f64 / 1024.0,
        )
    };
    let p99 = |p: &Phase| percentile(&mut p.hits.clone(), 99.0);
    let all: Vec<&Phase> = phases
        .iter()
        .copied()
        .chain(grouped.iter().flatten())
        .collect();
    let errors: usize = all.iter().map(|p| p.hit_errors + p.miss_errors).sum();
    let first_error = all.iter().find_map(|p| p.first_error.as_ref());
    let growth_mib = streams.rss_max_kib.saturating_sub(rss_before) / 1024;
    let unloaded_p99 = p99(unloaded).as_secs_f64().max(1e-9);
    let (streams_ratio, hostile_ratio) = (
        p99(streams).as_secs_f64() / unloaded_p99,
        p99(hostile).as_secs_f64() / unloaded_p99,
    );
    let (grouped_rows, grouped_ratio) = match grouped {
        Ok([alone, beside]) => (
            format!(
                "{}\n{}",
                row("rounds: alone", alone),
                row(
                    "rounds: beside all four, in a cpu cgroup of their own",
                    beside
                )
            ),
            Some(p99(beside).as_secs_f64() / p99(alone).as_secs_f64().max(1e-9)),
        ),
        Err(e) => (
            format!(
                "| rounds beside all four, in a cpu cgroup of their own | not run: {} | | | | | | | | | | |",
                e.replace('|', "/")
            ),
            None,
        ),
    };
    let window = plan_window(&bench.plan);
    let plan = &bench.plan;
    let _ = writeln!(
        bench.out,
        "## 8. Hostile phase\n\nLegitimate callers alone for {}s; then {}s beside the two stream attackers; then {}s beside all four (`bench/src/attack.rs`, run as this binary under other uids); then {} rounds of {}s alone and {}s beside all four in a cpu cgroup of their own (cgroup v1, default `cpu.shares`), a pause of {}s before each window alone, each side's windows pooled (the `rounds` rows). Legitimate: uid 0, {HIT_CALLERS} callers each making a cache hit on a fresh connection every {} ms, and one new-cluster miss every {} s on `shared`, the exec provider the hanging misses use. The broker runs production's rate limit (200/s, burst 2 000 per uid) and `allowedUids: [0, {ALLOWED_ATTACKER}]`.\n\n| phase | hits | errors | p50 | p99 | max | new-cluster misses | errors | p50 | max | RSS max | RSS end |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n{}\n{}\n{}\n{grouped_rows}\n",
        plan.hostile_unloaded.as_secs(),
        plan.hostile_streams.as_secs(),
        plan.hostile.as_secs(),
        plan.hostile_rounds.max(1),
        window.as_secs_f64(),
        window.as_secs_f64(),
        SETTLE.as_secs(),
        HIT_EVERY.as_millis(),
        MISS_EVERY.as_secs(),
        row("unloaded", unloaded),
        row("stream attackers", streams),
        row("all four attackers", hostile),
    );

    let mut table = String::from("| phase | attacker | uid | what it did |\n|---|---|---:|---|\n");
    for (i, (kind, summary)) in attacks.iter().enumerate() {
        let phase = match i {
            0 | 1 => "stream attackers",
            2..=5 => "all four",
            _ => "all four, own cpu cgroup (first round)",
        };
        let (what, uid) = match *kind {
            "stall" => (
                "stall: 64 connections × 16 streams of HEADERS only, reconnecting",
                format!("{REFUSED_ATTACKER} (refused)"),
            ),
            "flood" => (
                "flood: 20 connections opening header-only streams, ~1 000/s",
                ALLOWED_ATTACKER.to_string(),
            ),
            "oversize" => (
                "oversize: new clusters at every `limits.*` bound, 8 at a time",
                ALLOWED_ATTACKER.to_string(),
            ),
            _ => (
                "hang: 64 misses at a time whose plugin hangs until its 5 s timeout",
                ALLOWED_ATTACKER.to_string(),
            ),
        };
        let _ = writeln!(table, "| {phase} | {what} | {uid} | {summary} |");
    }
    let _ = writeln!(bench.out, "{table}");
    let _ = writeln!(
        bench.out,
        "Goals: legitimate errors 0: **{}** ({errors}{}); hit p99 ≤ 2× alone with the attackers in a cpu cgroup of their own, as separate pods would be (the rounds, window against window): **{}** ({}); against the first phase alone, in this bench's cgroup, sharing the CPU thread by thread with them: **{}** (stream attackers {streams_ratio:.2}×, all four {hostile_ratio:.2}×); RSS ≤ +{RSS_GROWTH_GOAL_MIB} MiB under the stream attackers: **{}** (+{growth_mib} MiB at most over {:.1} MiB before them). With all four, RSS also holds the oversize entries, bounded by `cache.maxBytes` (64 MiB). New-cluster misses wait for a permit a hanging miss holds (a free one goes to the uid holding fewest): at most one plugin timeout.\n",
        verdict(errors == 0),
        first_error
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default(),
        grouped_ratio.map_or("not run", |r| verdict(r <= 2.0)),
        grouped_ratio.map_or("see the table".to_owned(), |r| format!("{r:.2}×")),
        verdict(streams_ratio.max(hostile_ratio) <= 2.0),
        verdict(growth_mib <= RSS_GROWTH_GOAL_MIB),
        rss_before as f64 / 1024.0,
    );
}
