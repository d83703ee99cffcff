//! Section 9, the anchors: the exec plugins users would run instead of credbroker, built by
//! e2e/anchors.sh from the Go module proxy at pinned versions (gke-gcloud-auth-plugin from the
//! Debian package: the proxy refuses its module), measured side by side with credbroker on the
//! same fakes in one table. The bench never builds them: a plugin e2e/anchors.sh has not built
//! keeps its row, saying so (the CI smoke run measures only what is there, with tiny N).
//!
//! Where each number comes from:
//! - **exec, hit and miss**: wall time from spawn to exit with stdout and stderr read, the
//!   plugin run by the bench in a cleared environment (only what it needs: fake keys, the
//!   fakes' endpoints, `SSL_CERT_FILE`, a temp `HOME`, `KUBERNETES_EXEC_INFO` as client-go
//!   sets it). A hit is a run its own cache can serve (after 3 untimed runs); a miss is a run
//!   from an empty cache (a fresh `HOME`; for credbroker a fresh broker) that must call the
//!   fake upstream, which answers after [`UPSTREAM_DELAY`]. A plugin without a cache has no
//!   hit: its hit is its miss. Upstream calls per exec are counted at the fake.
//! - **fleet cold start**: e2e/cmd/fleet, a client-go program that reads a kubeconfig of
//!   [`Plan::anchors_fleet`] contexts (one per cluster, each an exec user with
//!   `provideClusterInfo` and the cluster's `client.authentication.k8s.io/exec` extension
//!   naming `clusterName`), builds one client per cluster and makes one request to each, all at
//!   once, against [`fakes::workers`] (HTTPS, 401 without a bearer token). Wall time and failures
//!   from its JSON; upstream calls counted at the fakes.
//! - **calls per identity per hour** in steady state: client-go keeps a plugin's
//!   ExecCredential until its `expirationTimestamp` (`L`, read from what the plugin printed)
//!   and then runs the plugin again, for every cluster; the clusters of a fleet that started
//!   together expire together, so each lifetime repeats the cold start:
//!   `fleet upstream calls ÷ identities × 3600 s ÷ L` (0 when the plugin prints no expiry:
//!   client-go keeps the token until a 401). credbroker's is its cache's schedule (section
//!   7): one call per identity per half lifetime, an AWS role session renewed 15 min before
//!   its hour ends.
//! - **memory**: max RSS of one plugin process (getrusage of the children, the plugin run
//!   under `credbroker-bench --rusage`, untimed) × the fleet's processes (each cluster runs
//!   its own; an upper bound: RSS counts the binary's shared pages in each); credbroker adds
//!   the broker's VmRSS after its fleet run. Beside it, the notes give how far the machine's
//!   MemAvailable fell during each fleet run.
//! - **ratios**: each cell ÷ credbroker's cell of the same column, from the same run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::anchors::{Built, gke_cache};
use crate::bench::{AWS_KEY, AWS_SECRET, Bench, REGION, UPSTREAM_DELAY, V1, progress, verdict};
use crate::fakes::{self, HUB_NAMESPACE, HUB_TOKEN, Tallied};
use crate::plan::Plan;
use crate::procs::Broker;
use crate::stats::{Summary, ms, summarize};

/// The older ExecCredential version aws-iam-authenticator and gke-gcloud-auth-plugin print.
const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// Untimed runs before a hit block, as section 1 does (one tool's caches warm for its own runs).
const WARMUP: usize = 3;
/// Bound on one plugin run: every fake answers in 200 ms, so a run this long is stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one fleet run (e2e/cmd/fleet's `-timeout`; the bench kills it a little later):
/// 1 000 Go plugins on 2 CPUs take tens of seconds.
const FLEET_TIMEOUT: Duration = Duration::from_secs(300);
/// The AKS AAD server application id: kubelogin's `--server-id` (the token's audience).
const AKS_SERVER_ID: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";
/// The tenant of the fake Entra ID (the broker's `AZURE_TENANT_ID` in the bench).
const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
/// Rounds of credbroker's fleet and its floors, in turn; the median round is judged.
const FLEET_ROUNDS: usize = 3;
/// credbroker's fleet at most this many times the static-token fleet's wall time (issue 31:
/// exec should add a quarter at most to what client-go's own connections cost).
const FLEET_FLOOR_RATIO: f64 = 1.25;
/// Identities of the fleet: the issue's 1 000 clusters over 3 identities.
const IDENTITIES: usize = 3;
/// credbroker's steady-state calls per identity per hour (section 7's schedule): an AWS role
/// session of 1 h renewed 15 min before expiry, GCP and Azure 1 h tokens refreshed at half.
const BROKER_PER_HOUR: [(&str, f64); 3] = [("AWS role", 1.0 / 0.75), ("GCP", 2.0), ("Azure", 2.0)];

/// A plugin run: program, arguments, its whole environment (it runs with `env_clear`), the
/// ExecCredential apiVersion its kubeconfig entry names, and the cluster client-go describes
/// in `KUBERNETES_EXEC_INFO` (`None`: no `provideClusterInfo`).
#[derive(Debug, Clone)]
struct Plugin {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    api_version: &'static str,
    cluster: Option<String>,
}

impl Plugin {
    fn new(program: &Path, args: &[&str], env: Vec<(String, String)>, cluster: &str) -> Plugin {
        Plugin {
            program: program.to_path_buf(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env,
            api_version: V1,
            cluster: Some(cluster.to_owned()),
        }
    }

    /// A plugin that prints `client.authentication.k8s.io/v1beta1` (client-go refuses an
    /// answer of another version than its entry names).
    fn v1beta1(mut self) -> Plugin {
        self.api_version = V1BETA1;
        self
    }

    /// An entry without `provideClusterInfo`.
    fn without_cluster_info(mut self) -> Plugin {
        self.cluster = None;
        self
    }

    /// What client-go puts in `KUBERNETES_EXEC_INFO` for this entry.
    fn exec_info(&self) -> String {
        let mut spec = json!({"interactive": false});
        if let Some(c) = &self.cluster {
            spec["cluster"] =
                json!({"server": format!("https://{c}.example.com"), "config": {"clusterName": c}});
        }
        json!({"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}).to_string()
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .env_clear()
            .envs(self.env.iter().cloned())
            .env("KUBERNETES_EXEC_INFO", self.exec_info());
        c
    }

    /// The same run under `credbroker-bench --rusage`, writing its max RSS to `file`.
    fn under_rusage(&self, file: &Path) -> Command {
        let exe = std::env::current_exe().expect("current_exe");
        let mut c = Command::new(exe);
        c.arg("--rusage")
            .arg(file)
            .arg(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().cloned())
            .env("KUBERNETES_EXEC_INFO", self.exec_info());
        c
    }

    /// The kubeconfig `user.exec` entry that runs it (client-go adds the process's env).
    fn exec_entry(&self) -> Value {
        json!({
            "apiVersion": self.api_version,
            "command": self.program,
            "args": self.args,
            "provideClusterInfo": self.cluster.is_some(),
            "interactiveMode": "Never",
        })
    }
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// One run, timed from spawn to exit (stdout and stderr read to the end), killed after
/// [`RUN_TIMEOUT`]. Fails when the exit is not 0 or stdout lacks `expect`.
fn run_plugin(cmd: &mut Command, expect: &str) -> Result<(Duration, String), String> {
    use std::io::Read as _;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (done, wait_done) = mpsc::channel::<()>();
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        if wait_done.recv_timeout(RUN_TIMEOUT).is_err() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    });
    let err_pipe = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut err = String::new();
        if let Some(mut s) = err_pipe {
            let _ = s.read_to_string(&mut err);
        }
        err
    });
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let err = err_reader.join().unwrap_or_default();
    let status = child.wait().map_err(|e| format!("wait: {e}"));
    let took = started.elapsed();
    let _ = done.send(());
    let _ = watchdog.join();
    let status = status?;
    if !status.success() || !out.contains(expect) {
        return Err(format!(
            "{status}; stdout {:?}; stderr {:?}",
            out.chars().take(200).collect::<String>(),
            err.chars().take(400).collect::<String>()
        ));
    }
    Ok((took, out))
}

/// The credential's lifetime as printed: `status.expirationTimestamp` − now.
fn printed_lifetime(stdout: &str) -> Option<Duration> {
    let v: Value = serde_json::from_str(stdout.trim()).ok()?;
    let at = v["status"]["expirationTimestamp"].as_str()?;
    let at =
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()?;
    let now = time::OffsetDateTime::from(SystemTime::now());
    Some(Duration::from_secs_f64(
        (at - now).as_seconds_f64().max(0.0),
    ))
}

/// What a cleanup-on-drop a miss run needs (credbroker's fresh broker).
type Guard = Option<Broker>;

/// A fleet: cluster `i`'s plugin.
type FleetPlugin<'a> = Box<dyn Fn(usize) -> Plugin + 'a>;

/// One row's plugin, how it is run, and how its upstream calls are counted.
struct Anchor<'a> {
    name: String,
    /// Version, how it was built and pointed at the fakes.
    how: String,
    /// A run its own cache serves; `None` when it has no cache (hit = miss).
    hit: Option<Plugin>,
    /// Miss run `i`: from an empty cache.
    miss: Box<dyn Fn(usize) -> (Plugin, Guard) + 'a>,
    expect: &'static str,
    /// Upstream credential calls so far (the fake's count).
    calls: Box<dyn Fn() -> u64 + 'a>,
    /// The fleet: cluster `i`'s plugin (all share the environment of cluster 0's), the
    /// identities it spreads them over, and what those are.
    fleet: Option<(FleetPlugin<'a>, usize, &'static str)>,
    /// Why there is no fleet run, when there is none.
    no_fleet: &'static str,
    note: String,
}

/// A row's measurements.
#[derive(Debug, Default)]
struct Row {
    name: String,
    how: String,
    hit: Option<Summary>,
    hit_is_miss: bool,
    hit_calls: f64,
    miss: Option<Summary>,
    miss_calls: f64,
    lifetime: Option<Duration>,
    rss_kib: Option<u64>,
    fleet: Option<Fleet>,
    fleet_identities: usize,
    fleet_what: &'static str,
    no_fleet: String,
    /// Steady-state calls per identity per hour.
    per_hour: Option<f64>,
    per_hour_text: String,
    broker_rss_kib: Option<u64>,
    error: Option<String>,
    note: String,
}

/// A fleet run's result.
#[derive(Debug, Clone)]
struct Fleet {
    clusters: u64,
    ok: u64,
    failed: u64,
    first_error: String,
    wall: Duration,
    upstream_calls: u64,
    children_max_rss_kib: u64,
    /// How far the machine's MemAvailable fell below its value at the start, at worst during
    /// the run (sampled every 50 ms; the machine is shared, so a rough figure).
    mem_drop_kib: u64,
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn block(plan: &Plan, a: &Anchor<'_>) -> Row {
    let mut row = Row {
        name: a.name.clone(),
        how: a.how.clone(),
        hit_is_miss: a.hit.is_none(),
        note: a.note.clone(),
        no_fleet: a.no_fleet.to_owned(),
        ..Row::default()
    };
    progress(&format!("anchors: {}", a.name));
    // Misses: each from an empty cache, counted one by one.
    let mut times = Vec::with_capacity(plan.anchors_misses);
    let mut calls = 0;
    let mut last_out = String::new();
    for i in 0..plan.anchors_misses {
        let (p, guard) = (a.miss)(i);
        let before = (a.calls)();
        match run_plugin(&mut p.command(), a.expect) {
            Ok((t, out)) => {
                times.push(t);
                last_out = out;
            }
            Err(e) => {
                row.error = Some(format!("miss: {e}"));
                return row;
            }
        }
        calls += (a.calls)() - before;
        drop(guard);
    }
    row.miss_calls = calls as f64 / plan.anchors_misses.max(1) as f64;
    row.lifetime = printed_lifetime(&last_out);
    row.miss = Some(summarize(&mut times));
    // Hits: a warm cache.
    if let Some(h) = &a.hit {
        for _ in 0..WARMUP {
            if let Err(e) = run_plugin(&mut h.command(), a.expect) {
                row.error = Some(format!("hit: {e}"));
                return row;
            }
        }
        let before = (a.calls)();
        let mut times = Vec::with_capacity(plan.anchors_hits);
        for _ in 0..plan.anchors_hits {
            match run_plugin(&mut h.command(), a.expect) {
                Ok((t, _)) => times.push(t),
                Err(e) => {
                    row.error = Some(format!("hit: {e}"));
                    return row;
                }
            }
        }
        row.hit_calls = ((a.calls)() - before) as f64 / plan.anchors_hits.max(1) as f64;
        row.hit = Some(summarize(&mut times));
    } else {
        row.hit = row.miss;
        row.hit_calls = row.miss_calls;
    }
    // Max RSS: one more miss, untimed, under the rusage probe.
    let (p, guard) = (a.miss)(plan.anchors_misses);
    row.rss_kib = max_rss(&p, a.expect);
    drop(guard);
    row
}

/// The plugin's max RSS under the `--rusage` probe. Linux records the max RSS of the address
/// space an exec replaces too, which for a vfork'd child is the probe's own: a plugin whose
/// figure is the probe's floor ([`probe_floor`]) used at most that much.
fn max_rss(p: &Plugin, expect: &str) -> Option<u64> {
    let file = std::env::temp_dir().join(format!("credbroker-bench-rss-{}", std::process::id()));
    let kib = run_plugin(&mut p.under_rusage(&file), expect)
        .ok()
        .and_then(|_| std::fs::read_to_string(&file).ok())
        .and_then(|s| s.trim().parse().ok());
    let _ = std::fs::remove_file(&file);
    kib
}

/// The probe's floor: `/bin/true` under it.
fn probe_floor() -> Option<u64> {
    max_rss(
        &Plugin::new(Path::new("/bin/true"), &[], Vec::new(), "c1"),
        "",
    )
}

/// How the fleet's clusters authenticate.
enum FleetUsers<'p> {
    /// Cluster `i` runs `plugin(i)`; the fleet process gets cluster 0's environment
    /// (client-go passes its own on to every plugin).
    Exec(&'p dyn Fn(usize) -> Plugin),
    /// A static bearer token per cluster and no exec plugin: the fleet's floor, 1 000
    /// client-go TLS connections and requests with nothing to run first.
    StaticTokens,
    /// An exec entry per cluster that runs `/bin/echo` with a static ExecCredential: the
    /// floor of any exec plugin, client-go spawning 1 000 processes that print a token.
    Echo,
}

impl FleetUsers<'_> {
    fn user(&self, i: usize) -> Value {
        match self {
            FleetUsers::Exec(plugin) => json!({"exec": plugin(i).exec_entry()}),
            FleetUsers::StaticTokens => json!({"token": format!("bench-static-w{i}")}),
            FleetUsers::Echo => json!({"exec": {
                "apiVersion": V1,
                "command": "/bin/echo",
                "args": [json!({"apiVersion": V1, "kind": "ExecCredential",
                    "status": {"token": format!("bench-echo-w{i}")}}).to_string()],
                "provideClusterInfo": true,
                "interactiveMode": "Never",
            }}),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            FleetUsers::Exec(plugin) => plugin(0).env,
            FleetUsers::StaticTokens | FleetUsers::Echo => Vec::new(),
        }
    }
}

/// Runs e2e/cmd/fleet over `n` clusters, cluster `i` authenticating as `users` says.
fn run_fleet(
    fleet_bin: &Path,
    dir: &Path,
    workers: &Tallied,
    n: usize,
    users: &FleetUsers<'_>,
    calls: &dyn Fn() -> u64,
) -> Result<Fleet, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = dir.join("workers-ca.pem");
    std::fs::write(&ca, workers.ca_pem()).map_err(|e| format!("ca: {e}"))?;
    let (mut clusters, mut users_json, mut contexts) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let name = format!("w{i}");
        clusters.push(json!({"name": name, "cluster": {
            "server": workers.url(),
            "certificate-authority": ca,
            "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"clusterName": name}}],
        }}));
        users_json.push(json!({"name": name, "user": users.user(i)}));
        contexts.push(json!({"name": name, "context": {"cluster": name, "user": name}}));
    }
    let kubeconfig = dir.join("fleet.kubeconfig");
    let doc = json!({"apiVersion": "v1", "kind": "Config", "current-context": "w0",
        "clusters": clusters, "users": users_json, "contexts": contexts});
    std::fs::write(&kubeconfig, doc.to_string()).map_err(|e| format!("kubeconfig: {e}"))?;
    let env = users.env();
    let stderr = std::fs::File::create(dir.join("fleet.stderr")).map_err(|e| e.to_string())?;
    workers.reset();
    let before = calls();
    let mut cmd = Command::new(fleet_bin);
    cmd.arg("-kubeconfig")
        .arg(&kubeconfig)
        .arg("-timeout")
        .arg(format!("{}s", FLEET_TIMEOUT.as_secs()))
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    let mem_start = mem_available_kib();
    let child = cmd.spawn().map_err(|e| format!("spawn fleet: {e}"))?;
    let pid = child.id();
    let (done, wait_done) = mpsc::channel::<()>();
    // Kills a stuck fleet; samples MemAvailable meanwhile.
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + FLEET_TIMEOUT + Duration::from_secs(30);
        let mut low = mem_start;
        loop {
            match wait_done.recv_timeout(Duration::from_millis(50)) {
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    low = low.min(mem_available_kib());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                    break;
                }
                _ => break,
            }
        }
        mem_start.saturating_sub(low)
    });
    let out = child.wait_with_output();
    let _ = done.send(());
    let mem_drop_kib = watchdog.join().unwrap_or(0);
    let out = out.map_err(|e| format!("fleet: {e}"))?;
    let upstream_calls = calls() - before;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        let err = std::fs::read_to_string(dir.join("fleet.stderr")).unwrap_or_default();
        format!(
            "fleet printed no result ({e}; {}); stderr: {}",
            out.status,
            err.lines().take(3).collect::<Vec<_>>().join(" / ")
        )
    })?;
    let (served, refused) = (workers.answered(), workers.refused());
    let num = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut first_error = v["first_error"].as_str().unwrap_or("").to_owned();
    if refused > 0 && first_error.is_empty() {
        first_error = format!("{refused} requests without a token ({served} with one)");
    }
    Ok(Fleet {
        clusters: num("clusters"),
        ok: num("ok"),
        failed: num("failed"),
        first_error,
        wall: Duration::from_secs_f64(v["wall_ms"].as_f64().unwrap_or(0.0) / 1e3),
        upstream_calls,
        children_max_rss_kib: num("children_max_rss_kib"),
        mem_drop_kib,
    })
}

pub fn run(bench: &mut Bench<'_>) {
    let floor = probe_floor();
    let built = Built::load(bench.plan.anchors_env.as_deref());
    let plan = bench.plan.clone();
    let w = bench.w().to_path_buf();
    let ca = w.join("fakes-ca.pem");
    let ca_s = ca.display().to_string();
    let hub = fakes::hub(UPSTREAM_DELAY);
    let workers = fakes::workers();
    let hub_kubeconfig = w.join("hub.kubeconfig");
    let hub_ca = w.join("hub-ca.pem");
    std::fs::write(&hub_ca, hub.ca_pem()).expect("hub ca");
    std::fs::write(
        &hub_kubeconfig,
        json!({"apiVersion": "v1", "kind": "Config", "current-context": "hub",
            "clusters": [{"name": "hub", "cluster": {"server": hub.url(), "certificate-authority": hub_ca}}],
            "users": [{"name": "reader", "user": {"token": HUB_TOKEN}}],
            "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "reader", "namespace": HUB_NAMESPACE}}]})
        .to_string(),
    )
    .expect("hub kubeconfig");
    bench.reset_fakes(Duration::from_secs(3600));
    let clouds = &bench.clouds;
    let n = plan.anchors_fleet;
    let fresh = |what: &str, i: usize| {
        let d = w.join(format!("home-{what}-{i}"));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("home");
        d
    };
    let not_built = |what: &str| {
        format!(
            "not built: {} has no {what} (run e2e/anchors.sh; bench/run.sh does)",
            built.env_file.display()
        )
    };
    let mut rows = Vec::new();
    let mut missing: Vec<(String, String)> = Vec::new();

    // credbroker's fleet beside the same fleet with static tokens: (ours, the floor) per pair.
    let mut fleet_floor: Option<Vec<FleetRound>> = None;
    // credbroker: the shim against a release broker; a miss is a fresh broker (AssumeRole).
    {
        let broker = bench.start_broker(10_000);
        let shim = bench.shim_bin.clone();
        let shim_plugin = |socket: &Path, provider: &str, cluster: &str| {
            Plugin::new(
                &shim,
                &[
                    "--provider",
                    provider,
                    "--socket",
                    &socket.display().to_string(),
                ],
                Vec::new(),
                cluster,
            )
        };
        let a = Anchor {
            name: "**credbroker** (shim + broker)".to_owned(),
            how: format!(
                "this tree: `{}` against the broker of the header; `eks` provider (role, AssumeRole)",
                shim.file_name()
                    .map_or(String::new(), |f| f.to_string_lossy().into_owned())
            ),
            hit: Some(shim_plugin(&broker.socket, "eks", "c1")),
            miss: Box::new(|_| {
                let b = bench.start_broker(10_000);
                let p = shim_plugin(&b.socket, "eks", "c1");
                (p, Some(b))
            }),
            expect: "k8s-aws-v1.",
            calls: Box::new(|| clouds.sts.calls()),
            fleet: None,
            no_fleet: "",
            note: String::new(),
        };
        let mut row = block(&plan, &a);
        drop(broker);
        if let Some(fleet_bin) = &built.fleet {
            // Three identities: one per provider type (AWS role, GCP account, Azure workload
            // identity), as the fleet of section 6. Each round: the fleet on a fresh broker (a
            // cold start), again on that broker (all hits), then its two floors, in turn.
            let all_calls = || {
                let (s, m, e) = clouds.calls();
                s + m + e
            };
            let mut rounds = Vec::new();
            for k in 0..FLEET_ROUNDS {
                let fleet = |users: &FleetUsers<'_>, what: &str| {
                    run_fleet(
                        fleet_bin,
                        &w.join(format!("fleet-{what}-{k}")),
                        &workers,
                        n,
                        users,
                        &all_calls,
                    )
                };
                bench.reset_fakes(Duration::from_secs(3600));
                let broker = bench.start_broker(10_000);
                let providers = ["eks", "gke", "aks"];
                let plugin =
                    |i: usize| shim_plugin(&broker.socket, providers[i % 3], &format!("w{i}"));
                progress(&format!(
                    "anchors: credbroker's fleet and its floors, round {}",
                    k + 1
                ));
                let ours = fleet(&FleetUsers::Exec(&plugin), "credbroker");
                if k == 0 {
                    row.broker_rss_kib = Some(broker.rss_kib());
                }
                // The same broker again: every cluster a cache hit (the cold start's fetches
                // out of the way).
                let warm = fleet(&FleetUsers::Exec(&plugin), "credbroker-warm");
                drop(broker);
                let echo = fleet(&FleetUsers::Echo, "echo");
                let floor = fleet(&FleetUsers::StaticTokens, "static");
                rounds.push(FleetRound {
                    ours,
                    warm,
                    echo,
                    floor,
                });
            }
            match rounds.first().map(|r| r.ours.clone()) {
                Some(Ok(f)) => row.fleet = Some(f),
                Some(Err(e)) => row.no_fleet = format!("fleet failed: {e}"),
                None => {}
            }
            row.fleet_identities = IDENTITIES;
            row.fleet_what = "AWS role, GCP account, Azure workload identity (one per provider)";
            fleet_floor = Some(rounds);
        } else {
            row.no_fleet = not_built("FLEET");
        }
        row.per_hour_text = BROKER_PER_HOUR
            .iter()
            .map(|(what, c)| format!("{c:.2} ({what})"))
            .collect::<Vec<_>>()
            .join(", ");
        row.per_hour = Some(BROKER_PER_HOUR.iter().map(|(_, c)| c).sum::<f64>() / 3.0);
        rows.push(row);
    }

    // aws-iam-authenticator.
    match &built.aws_iam_authenticator {
        Some((bin, version)) => {
            let env = |home: &Path, sts: bool| {
                let h = home.display().to_string();
                let mut e = kv(&[
                    ("PATH", "/usr/bin:/bin"),
                    ("HOME", &h),
                    ("AWS_ACCESS_KEY_ID", AWS_KEY),
                    ("AWS_SECRET_ACCESS_KEY", AWS_SECRET),
                    ("AWS_REGION", REGION),
                    ("AWS_CONFIG_FILE", &format!("{h}/none")),
                    ("AWS_SHARED_CREDENTIALS_FILE", &format!("{h}/none")),
                    ("AWS_EC2_METADATA_DISABLED", "true"),
                ]);
                if sts {
                    e.push(("AWS_ENDPOINT_URL_STS".to_owned(), clouds.sts.url()));
                }
                e
            };
            let static_plugin = |home: &Path, cluster: &str| {
                Plugin::new(bin, &["token", "-i", cluster], env(home, false), cluster).v1beta1()
            };
            let a = Anchor {
                name: format!("`aws-iam-authenticator token -i` {version}, static keys"),
                how: format!(
                    "{version}, `go build` of a wrapper module requiring it (e2e/anchors.sh); fake static keys: local signing, no network"
                ),
                hit: None,
                miss: Box::new(|i| (static_plugin(&fresh("aia-static", i), "c1"), None)),
                expect: "k8s-aws-v1.",
                calls: Box::new(|| clouds.sts.calls()),
                fleet: None,
                no_fleet: "not run: static keys are one identity and make no upstream call (the role row is the fleet)",
                note: String::new(),
            };
            rows.push(block(&plan, &a));
            let roles: Vec<String> = (0..IDENTITIES)
                .map(|k| format!("arn:aws:iam::111122223333:role/kueue-{k}"))
                .collect();
            let fleet_home = fresh("aia-fleet", 0);
            let role_plugin = |home: &Path, cluster: &str, role: &str| {
                Plugin::new(
                    bin,
                    &["token", "-i", cluster, "-r", role, "--cache"],
                    env(home, true),
                    cluster,
                )
                .v1beta1()
            };
            let a = Anchor {
                name: format!("`aws-iam-authenticator token -i -r ROLE --cache` {version}"),
                how: format!("{version}, as above; STS at the fake through `AWS_ENDPOINT_URL_STS` (aws-sdk-go-v2 honours it)"),
                hit: None,
                miss: Box::new(|i| (role_plugin(&fresh("aia-role", i), "c1", &roles[0]), None)),
                expect: "k8s-aws-v1.",
                calls: Box::new(|| clouds.sts.calls()),
                fleet: Some((
                    Box::new(|i| role_plugin(&fleet_home, &format!("w{i}"), &roles[i % IDENTITIES])),
                    IDENTITIES,
                    "3 role ARNs",
                )),
                no_fleet: "",
                note: "2 AssumeRole calls per run: v0.7.13's pkg/token hands the STS client the bare stscreds provider (no aws.CredentialsCache around it) and a presign retrieves credentials twice, in the SDK's identity resolution and again in its presign middleware; `--cache` caches the *base* credentials (here static keys, which cannot expire: nothing cached) before the role is assumed, so every run makes an AssumeRole".to_owned(),
            };
            rows.push(with_fleet(&plan, &a, &built, &w, &workers, &not_built));
        }
        None => missing.push((
            "`aws-iam-authenticator`".to_owned(),
            not_built("AWS_IAM_AUTHENTICATOR"),
        )),
    }

    // kubelogin, workload identity against the fake Entra ID, with its persistent cache.
    match &built.kubelogin {
        Some((bin, version)) => {
            let token_file = w.join("federated-token").display().to_string();
            let authority = format!("{}/", clouds.entra.url());
            let client = |k: usize| format!("11111111-2222-3333-4444-55555555555{k}");
            let plugin = |home: &Path, k: usize| {
                let h = home.display().to_string();
                let c = client(k);
                Plugin::new(
                    bin,
                    &[
                        "get-token",
                        "--login",
                        "workloadidentity",
                        "--server-id",
                        AKS_SERVER_ID,
                        "--client-id",
                        &c,
                        "--tenant-id",
                        TENANT,
                        "--federated-token-file",
                        &token_file,
                        "--authority-host",
                        &authority,
                        "--disable-instance-discovery",
                    ],
                    kv(&[
                        ("PATH", "/usr/bin:/bin"),
                        ("HOME", &h),
                        ("SSL_CERT_FILE", &ca_s),
                    ]),
                    "c1",
                )
                // kubelogin v0.2.21 refuses a KUBERNETES_EXEC_INFO whose cluster has a
                // `config` (it unmarshals it into a runtime.Object); its users' kubeconfigs
                // have no provideClusterInfo, and it needs no cluster.
                .without_cluster_info()
            };
            let hit_home = fresh("kubelogin-hit", 0);
            let fleet_home = fresh("kubelogin-fleet", 0);
            let a = Anchor {
                name: format!("`kubelogin get-token --login workloadidentity` {version}"),
                how: format!(
                    "{version} (v0.2.22 needs go ≥ 1.26.10, this machine has 1.26.8), wrapper module; Entra at the fake through `--authority-host` (`AZURE_AUTHORITY_HOST`), `--disable-instance-discovery`, the fake's CA in `SSL_CERT_FILE`; its persistent token cache (azidentity/cache: an encrypted file under `$HOME/.cache`, its key `msal.cache` in the uid's persistent kernel keyring, which outlives the run: reused by the next one, gone with the keyring); the cache's set-up is serialised across processes by a file lock (`cache-test.lock`)"
                ),
                hit: Some(plugin(&hit_home, 0)),
                miss: Box::new(|i| (plugin(&fresh("kubelogin-miss", i), 0), None)),
                expect: "\"token\"",
                calls: Box::new(|| clouds.entra.calls()),
                fleet: Some((
                    Box::new(|i| plugin(&fleet_home, i % IDENTITIES)),
                    IDENTITIES,
                    "3 client IDs, one cache (one HOME) for the fleet",
                )),
                no_fleet: "",
                note: String::new(),
            };
            let other0 = clouds.entra.other_requests();
            let mut row = with_fleet(&plan, &a, &built, &w, &workers, &not_built);
            let other = clouds.entra.other_requests() - other0;
            let _ = write!(
                row.note,
                "{other} OpenID-configuration reads beside the token calls (answered at once)"
            );
            rows.push(row);
        }
        None => missing.push(("`kubelogin`".to_owned(), not_built("KUBELOGIN"))),
    }

    // gke-gcloud-auth-plugin: its own cache for a hit, ADC from the fake metadata server for a miss.
    match &built.gke {
        Some(bin) => {
            let version = Command::new(bin)
                .arg("--version")
                .env_clear()
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            let hit_home = fresh("gke-hit", 0);
            gke_cache(&hit_home);
            let hit = Plugin::new(
                bin,
                &[],
                kv(&[
                    ("PATH", "/usr/bin:/bin"),
                    ("HOME", &hit_home.display().to_string()),
                ]),
                "c1",
            )
            .v1beta1();
            let adc = |home: &Path, cluster: &str| {
                Plugin::new(
                    bin,
                    &["--use_application_default_credentials"],
                    kv(&[
                        ("PATH", "/usr/bin:/bin"),
                        ("HOME", &home.display().to_string()),
                        ("GCE_METADATA_HOST", &clouds.metadata.host()),
                    ]),
                    cluster,
                )
                .v1beta1()
            };
            let fleet_home = fresh("gke-fleet", 0);
            let a = Anchor {
                name: "`gke-gcloud-auth-plugin`".to_owned(),
                how: format!("`{}` from the Debian package google-cloud-cli-gke-gcloud-auth-plugin (`{version}`): the module proxy refuses k8s.io/cloud-provider-gcp (403), so it is not built; hit: its cache file for the current context; miss: `--use_application_default_credentials`, the fake metadata server at `GCE_METADATA_HOST`", bin.display()),
                hit: Some(hit),
                miss: Box::new(|i| (adc(&fresh("gke-miss", i), "c1"), None)),
                expect: "\"token\"",
                calls: Box::new(|| clouds.metadata.calls()),
                fleet: Some((Box::new(|i| adc(&fleet_home, &format!("w{i}"))), 1, "1: the metadata server's one account (its cache serves only the kubeconfig's current context, so a fleet runs it with ADC)")),
                no_fleet: "",
                note: "with `--use_application_default_credentials` it keeps no cache: every run reads the project id (a 404 here) and makes one metadata token call".to_owned(),
            };
            rows.push(with_fleet(&plan, &a, &built, &w, &workers, &not_built));
        }
        None => missing.push((
            "`gke-gcloud-auth-plugin`".to_owned(),
            "not installed (the Debian package google-cloud-cli-gke-gcloud-auth-plugin; the module proxy refuses k8s.io/cloud-provider-gcp, so it cannot be built)".to_owned(),
        )),
    }

    // cluster-inventory-api's secretreader, against the fake hub.
    match &built.secretreader {
        Some((bin, version)) => {
            let plugin = |cluster: &str| {
                Plugin::new(
                    bin,
                    &[],
                    kv(&[
                        ("PATH", "/usr/bin:/bin"),
                        ("HOME", &w.display().to_string()),
                        ("KUBECONFIG", &hub_kubeconfig.display().to_string()),
                    ]),
                    cluster,
                )
            };
            let a = Anchor {
                name: format!("cluster-inventory-api `secretreader` {version}"),
                how: format!(
                    "{version}, the binary e2e/peers.sh builds (same recipe, e2e/gowrap.sh); `KUBECONFIG` to a fake hub API server (HTTPS, checks the bearer token and the Secret's path) whose Secret read answers after {} ms",
                    UPSTREAM_DELAY.as_millis()
                ),
                hit: None,
                miss: Box::new(|_| (plugin("c1"), None)),
                expect: "sr-c1",
                calls: Box::new(|| hub.answered()),
                fleet: Some((
                    Box::new(|i| plugin(&format!("w{i}"))),
                    1,
                    "1 hub reader; a Secret per cluster",
                )),
                no_fleet: "",
                note: String::new(),
            };
            let mut row = with_fleet(&plan, &a, &built, &w, &workers, &not_built);
            if hub.refused() > 0 {
                let _ = write!(row.note, "the hub refused {} requests", hub.refused());
            }
            rows.push(row);
        }
        None => missing.push((
            "cluster-inventory-api `secretreader`".to_owned(),
            not_built("SECRETREADER"),
        )),
    }

    for row in rows.iter_mut().skip(1) {
        steady(row);
    }
    bench.reset_fakes(Duration::from_secs(3600));
    let mut o = report(&plan, &rows, &missing, floor);
    if let Some(rounds) = &fleet_floor {
        o.push_str(&floor_report(n, rounds));
    }
    bench.out.push_str(&o);
}

/// One round of fleet runs in turn: credbroker's on a fresh broker (a cold start) and again on
/// the same broker (all hits), the exec floor (`/bin/echo`) and the static-token floor.
struct FleetRound {
    ours: Result<Fleet, String>,
    warm: Result<Fleet, String>,
    echo: Result<Fleet, String>,
    floor: Result<Fleet, String>,
}

/// credbroker's fleet against its floor, the same client-go fleet with static bearer tokens:
/// each pair's wall times and their ratio, and the targets on the median pair.
fn floor_report(n: usize, rounds: &[FleetRound]) -> String {
    let mut o = format!(
        "### The fleet's floor: the same {n} clusters with static tokens\n\nThe client-go fleet of the table's first row on a fresh broker (a cold start: 3 upstream fetches of 200 ms), the same again on that broker (every cluster a cache hit), the same kubeconfig whose exec entries run `/bin/echo` with a static ExecCredential (the floor of any exec plugin: {n} processes spawned by client-go), and with a static bearer token per cluster instead (no plugin: {n} TLS connections and requests only). In turn, {} rounds; ÷: ÷ the static-token fleet of the same round.\n\n| round | credbroker, cold: wall | upstream calls | credbroker, warm | `/bin/echo` exec | static tokens | cold ÷ | warm ÷ | echo ÷ |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        rounds.len()
    );
    let whole = |f: &Result<Fleet, String>| match f {
        Ok(f) if f.ok == f.clusters => Ok(f.wall),
        Ok(f) => Err(format!(
            "{} of {} failed: {}",
            f.failed, f.clusters, f.first_error
        )),
        Err(e) => Err(format!("failed: {e}")),
    };
    let mut ratios = Vec::new();
    let mut walls = Vec::new();
    for (k, p) in rounds.iter().enumerate() {
        let cells = [
            whole(&p.ours),
            whole(&p.warm),
            whole(&p.echo),
            whole(&p.floor),
        ];
        let text: Vec<String> = cells
            .iter()
            .map(|c| match c {
                Ok(d) => ms(*d),
                Err(e) => e.replace('|', "/"),
            })
            .collect();
        let calls = p
            .ours
            .as_ref()
            .map_or(String::new(), |f| f.upstream_calls.to_string());
        let by = |c: &Result<Duration, String>| match (c, &cells[3]) {
            (Ok(a), Ok(b)) => format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64().max(1e-9)),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {calls} | {} | {} | {} | {} | {} | {} |",
            k + 1,
            text[0],
            text[1],
            text[2],
            text[3],
            by(&cells[0]),
            by(&cells[1]),
            by(&cells[2])
        );
        if let (Ok(ours), Ok(floor)) = (&cells[0], &cells[3]) {
            ratios.push(ours.as_secs_f64() / floor.as_secs_f64().max(1e-9));
            walls.push(*ours);
        }
    }
    ratios.sort_by(f64::total_cmp);
    walls.sort();
    match (ratios.get(ratios.len() / 2), walls.get(walls.len() / 2)) {
        (Some(r), Some(wall)) if ratios.len() == rounds.len() => {
            let _ = writeln!(
                o,
                "\nMedian of the rounds: credbroker's cold start ÷ static tokens **{r:.2}×**, its wall {}. Targets: ≤ {FLEET_FLOOR_RATIO}× the static-token fleet: **{}**; ≤ 2 s: **{}**.\n",
                ms(*wall),
                verdict(*r <= FLEET_FLOOR_RATIO),
                verdict(wall.as_secs_f64() <= 2.0)
            );
        }
        _ => o.push_str("\nTargets: not judged: a run failed.\n\n"),
    }
    o
}

fn with_fleet(
    plan: &Plan,
    a: &Anchor<'_>,
    built: &Built,
    w: &Path,
    workers: &Tallied,
    not_built: &dyn Fn(&str) -> String,
) -> Row {
    let mut row = block(plan, a);
    if row.error.is_some() {
        return row;
    }
    if let Some((plugin, identities, what)) = &a.fleet {
        row.fleet_identities = *identities;
        row.fleet_what = what;
        match &built.fleet {
            Some(fleet_bin) => {
                progress(&format!(
                    "anchors: fleet of {} × {}",
                    plan.anchors_fleet, a.name
                ));
                let dir = w.join(format!("fleet-{}", plan_slug(&a.name)));
                match run_fleet(
                    fleet_bin,
                    &dir,
                    workers,
                    plan.anchors_fleet,
                    &FleetUsers::Exec(plugin.as_ref()),
                    a.calls.as_ref(),
                ) {
                    Ok(f) => row.fleet = Some(f),
                    Err(e) => row.no_fleet = format!("fleet failed: {e}"),
                }
            }
            None => row.no_fleet = not_built("FLEET"),
        }
    }
    row
}

fn plan_slug(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(24)
        .collect()
}

/// Steady-state calls per identity per hour (the module's formula).
fn steady(row: &mut Row) {
    let Some(l) = row.lifetime.filter(|l| l.as_secs() > 0) else {
        if row.miss.is_some() {
            row.per_hour = Some(0.0);
            row.per_hour_text =
                "0 (no expiry printed: client-go keeps the token until a 401)".to_owned();
        }
        return;
    };
    let runs_h = 3600.0 / l.as_secs_f64();
    let per_identity = match &row.fleet {
        Some(f) => f.upstream_calls as f64 / row.fleet_identities.max(1) as f64,
        None if row.miss_calls == 0.0 => 0.0,
        None => {
            row.per_hour_text = "n/a (no fleet run)".to_owned();
            return;
        }
    };
    let v = per_identity * runs_h;
    row.per_hour = Some(v);
    row.per_hour_text = format!(
        "{v:.0} ({per_identity:.0} calls × 3600 s ÷ {:.0} s printed lifetime)",
        l.as_secs_f64()
    );
}

fn ratio(v: f64, base: f64) -> String {
    if base > 0.0 && v.is_finite() {
        format!(" ({:.1}×)", v / base)
    } else {
        String::new()
    }
}

fn kib(k: u64) -> String {
    if k >= 1024 * 1024 {
        format!("{:.2} GiB", k as f64 / 1024.0 / 1024.0)
    } else {
        format!("{:.1} MiB", k as f64 / 1024.0)
    }
}

fn report(plan: &Plan, rows: &[Row], missing: &[(String, String)], floor: Option<u64>) -> String {
    let n = plan.anchors_fleet;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## 9. Anchors: the plugins users would run instead, side by side\n\nOne run, the same fakes for every row (each credential call answered after {} ms). Exec: {} hits (after {WARMUP} untimed runs) and {} misses per row, median / p99; a plugin without a cache has no hit (hit = miss). Fleet: e2e/cmd/fleet (client-go) reaching {n} clusters at once, one exec user per cluster. Calls per identity per hour: fleet upstream calls ÷ identities × 3600 s ÷ the lifetime the plugin printed (client-go runs every cluster's plugin again at that expiry, together); credbroker: its cache's schedule (section 7). Memory: max RSS of one plugin process × {n} processes (credbroker: + the broker). (N×): ÷ credbroker's cell.\n",
        UPSTREAM_DELAY.as_millis(),
        plan.anchors_hits,
        plan.anchors_misses
    );
    let _ = writeln!(
        o,
        "| plugin | exec, hit: median / p99 | exec, miss: median / p99 | upstream calls per exec (hit / miss) | fleet cold start, {n} clusters: wall | fleet: upstream calls | calls per identity per hour, steady | memory: max RSS × {n} processes |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    let base = rows.first();
    let b_hit = base
        .and_then(|b| b.hit)
        .map_or(0.0, |s| s.p50.as_secs_f64());
    let b_miss = base
        .and_then(|b| b.miss)
        .map_or(0.0, |s| s.p50.as_secs_f64());
    let b_wall = base
        .and_then(|b| b.fleet.as_ref())
        .map_or(0.0, |f| f.wall.as_secs_f64());
    let b_calls = base
        .and_then(|b| b.fleet.as_ref())
        .map_or(0.0, |f| f.upstream_calls as f64);
    let b_hour = base.and_then(|b| b.per_hour).unwrap_or(0.0);
    let b_mem = base.map_or(0.0, |b| {
        (b.rss_kib.unwrap_or(0) * n as u64 + b.broker_rss_kib.unwrap_or(0)) as f64
    });
    for (i, r) in rows.iter().enumerate() {
        let is_base = i == 0;
        let rt = |v: f64, b: f64| if is_base { String::new() } else { ratio(v, b) };
        if let Some(e) = &r.error {
            let _ = writeln!(
                o,
                "| {} | failed: {} | | | | | | |",
                r.name,
                e.replace('|', "/")
            );
            continue;
        }
        let hit = match (r.hit, r.hit_is_miss) {
            (Some(s), false) => format!(
                "{} / {}{}",
                ms(s.p50),
                ms(s.p99),
                rt(s.p50.as_secs_f64(), b_hit)
            ),
            (Some(s), true) => format!("no cache: = miss{}", rt(s.p50.as_secs_f64(), b_hit)),
            (None, _) => "n/a".to_owned(),
        };
        let miss = r.miss.map_or("n/a".to_owned(), |s| {
            format!(
                "{} / {}{}",
                ms(s.p50),
                ms(s.p99),
                rt(s.p50.as_secs_f64(), b_miss)
            )
        });
        let calls = format!("{:.2} / {:.2}", r.hit_calls, r.miss_calls);
        let (wall, fcalls) = match &r.fleet {
            Some(f) => {
                let fails = if f.failed > 0 || f.ok != f.clusters {
                    format!(
                        ", **{} of {} failed**: {}",
                        f.failed,
                        f.clusters,
                        f.first_error.replace('|', "/")
                    )
                } else {
                    String::new()
                };
                (
                    format!("{}{}{fails}", ms(f.wall), rt(f.wall.as_secs_f64(), b_wall)),
                    format!(
                        "{} over {} identities{}",
                        f.upstream_calls,
                        r.fleet_identities,
                        rt(f.upstream_calls as f64, b_calls)
                    ),
                )
            }
            None => (r.no_fleet.clone(), String::new()),
        };
        let hour = match r.per_hour {
            Some(v) if !is_base => format!("{}{}", r.per_hour_text, ratio(v, b_hour)),
            _ => r.per_hour_text.clone(),
        };
        let at_floor = |k: u64| floor.is_some_and(|f| k <= f + f / 20);
        let mem = match r.rss_kib {
            Some(k) => {
                let le = if at_floor(k) { "≤ " } else { "" };
                let total = k * n as u64 + r.broker_rss_kib.unwrap_or(0);
                let broker = r
                    .broker_rss_kib
                    .map_or(String::new(), |b| format!(" + broker {}", kib(b)));
                format!(
                    "{le}{} × {n}{broker} = {le}{}{}",
                    kib(k),
                    kib(total),
                    rt(total as f64, b_mem)
                )
            }
            None => "n/a".to_owned(),
        };
        let _ = writeln!(
            o,
            "| {} | {hit} | {miss} | {calls} | {wall} | {fcalls} | {hour} | {mem} |",
            r.name
        );
    }
    for (name, why) in missing {
        let _ = writeln!(o, "| {name} | {why} | | | | | | |");
    }
    if let Some(f) = floor {
        let _ = writeln!(
            o,
            "\nMax RSS is measured under a probe process (`credbroker-bench --rusage`); Linux counts the probe's own address space, replaced by the exec, in the child's figure, so `/bin/true` measures {} under it: a figure at that floor reads \"≤\".",
            kib(f)
        );
    }
    let _ = writeln!(o, "\nHow each row was built and pointed at the fakes:\n");
    for r in rows {
        let mut line = format!("- {}: {}", r.name, r.how);
        if let Some(l) = r.lifetime {
            let _ = write!(line, "; prints a lifetime of {:.0} s", l.as_secs_f64());
        } else if r.miss.is_some() {
            line.push_str("; prints no expiry");
        }
        if !r.fleet_what.is_empty() {
            let _ = write!(line, "; fleet identities: {}", r.fleet_what);
        }
        if let Some(f) = &r.fleet {
            let _ = write!(
                line,
                "; fleet: {} of {} requests answered, largest plugin max RSS seen by the fleet process {}, the machine's MemAvailable fell by at most {} during it",
                f.ok,
                f.clusters,
                kib(f.children_max_rss_kib),
                kib(f.mem_drop_kib)
            );
        }
        if !r.note.is_empty() {
            let _ = write!(line, "; {}", r.note);
        }
        let _ = writeln!(o, "{line}.");
    }
    o.push('\n');
    o
}
