//! credbroker's benchmarks: the built `credbroker` and `credbroker-shim` on a real Unix
//! socket, fake cloud endpoints on 127.0.0.1 that answer after 200 ms, and the plugins
//! users run today (`aws eks get-token`, `gke-gcloud-auth-plugin`, and in the anchors section
//! the Go plugins e2e/anchors.sh builds) measured in the same run. Prints a markdown report on stdout; progress goes to stderr.
//!
//! ```text
//! bench/run.sh                      # builds release binaries and runs everything (minutes)
//! cargo run -p credbroker-bench -- --smoke   # small N, seconds: CI keeps it working
//! ```

mod anchors;
mod attack;
mod bench;
mod fakes;
mod floor;
mod load;
mod plan;
mod procs;
mod scenarios;
mod stats;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use bench::Bench;
use plan::Plan;

const USAGE: &str = "usage: credbroker-bench [--smoke] [--bin-dir DIR] [--shim PATH] [--shim-before PATH]
                        [--anchor-fleet N] [--anchors-fleet N] [--anchors-env FILE] [--only LIST]

  --smoke           small N (seconds); what CI runs so the benchmarks keep working
  --bin-dir DIR     where credbroker and credbroker-shim are (default: next to this binary)
  --shim PATH       the shim to time (default: the size-optimised build in
                    target/x86_64-unknown-linux-gnu/shim/ if present, else DIR/credbroker-shim)
  --shim-before PATH  an earlier shim build, timed beside --shim (exec and fleet sections)
  --anchor-fleet N  clusters in the `aws eks get-token` fleet sample (default 100; 3 in --smoke)
  --anchors-fleet N clusters of the anchors section's client-go fleet (default 1000; 6 in --smoke)
  --anchors-env FILE  e2e/anchors.sh's list of built anchors (default: anchors.env in its cache,
                    ${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e})
  --only LIST       comma-separated sections: exec,throughput,cold,memory,refresh,fleet,steady,hostile,anchors";

fn main() {
    let mut plan = Plan::full();
    let mut bin_dir: Option<PathBuf> = None;
    let mut shim: Option<PathBuf> = None;
    let mut shim_before: Option<PathBuf> = None;
    let mut anchor_fleet: Option<usize> = None;
    let mut anchors_env: Option<PathBuf> = None;
    let mut anchors_fleet: Option<usize> = None;
    let mut only = Vec::new();
    // The hostile section's attackers: this binary again, under another uid.
    let argv: Vec<String> = std::env::args().collect();
    if let [_, flag, kind, socket, secs, target @ ..] = argv.as_slice()
        && flag == "--attack"
        && target.len() <= 1
    {
        attack::main(
            kind,
            std::path::Path::new(socket),
            secs.parse().unwrap_or(5),
            target.first().map(std::path::Path::new),
        );
        return;
    }
    // The anchors section's max-RSS probe: a plugin run under this binary.
    if let [_, flag, file, program, rest @ ..] = argv.as_slice()
        && flag == "--rusage"
    {
        procs::rusage_main(std::path::Path::new(file), program, rest);
        return;
    }
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--smoke" => plan = Plan::smoke(),
            "--bin-dir" => bin_dir = args.next().map(PathBuf::from),
            "--shim" => shim = args.next().map(PathBuf::from),
            "--shim-before" => shim_before = args.next().map(PathBuf::from),
            "--anchor-fleet" => anchor_fleet = args.next().and_then(|n| n.parse().ok()),
            "--anchors-env" => anchors_env = args.next().map(PathBuf::from),
            "--anchors-fleet" => anchors_fleet = args.next().and_then(|n| n.parse().ok()),
            "--only" => {
                only = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_owned)
                    .collect();
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => {
                eprintln!("credbroker-bench: unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    if let Some(n) = anchor_fleet {
        plan.anchor_fleet = n;
    }
    // A misspelt section would otherwise run nothing and print an empty report.
    if let Some(unknown) = only
        .iter()
        .find(|o| !scenarios::ALL.iter().any(|(name, _)| name == o))
    {
        let known: Vec<&str> = scenarios::ALL.iter().map(|(name, _)| *name).collect();
        eprintln!(
            "credbroker-bench: unknown section {unknown:?} in --only (sections: {})\n{USAGE}",
            known.join(",")
        );
        std::process::exit(2);
    }
    plan.only = only;
    plan.anchors_env = anchors_env;
    if let Some(n) = anchors_fleet {
        plan.anchors_fleet = n;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let bin_dir = bin_dir.unwrap_or_else(|| exe.parent().expect("exe dir").to_path_buf());
    let broker_bin = bin_dir.join("credbroker");
    let shim_bin = shim.unwrap_or_else(|| {
        let size_optimised = bin_dir.join("../shim/credbroker-shim");
        if size_optimised.is_file() {
            size_optimised
        } else {
            bin_dir.join("credbroker-shim")
        }
    });
    for b in [&broker_bin, &shim_bin].into_iter().chain(&shim_before) {
        assert!(
            b.is_file(),
            "{} not found: build it first (bench/run.sh does)",
            b.display()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut bench = Bench::new(&rt, plan, broker_bin, shim_bin);
    bench.shim_before = shim_before;
    let report = run(&mut bench);
    print!("{report}");
}

/// The header, then each section `--only` selects, in report order, then the total time.
fn run(bench: &mut Bench<'_>) -> String {
    let started = Instant::now();
    bench.header();
    for (name, scenario) in scenarios::ALL {
        if bench.plan.runs(name) {
            scenario(bench);
        }
    }
    let _ = writeln!(
        bench.out,
        "\nTotal bench time: {:.0} s.",
        started.elapsed().as_secs_f64()
    );
    std::mem::take(&mut bench.out)
}
