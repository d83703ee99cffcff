//! Section 3, single flight: many concurrent misses for one key on a 200 ms provider make
//! one upstream call.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::bench::{Bench, progress, verdict};
use crate::load;
use crate::procs;
use crate::stats::{self, ms, summarize};

pub fn run(bench: &mut Bench<'_>) {
    progress("concurrent cold requests for one key");
    // The provider's own latency: the plugin run alone.
    let plugin = bench.w().join("plugin.sh");
    let scratch = bench.w().join("scratch.runs");
    let mut alone: Vec<Duration> = (0..5)
        .map(|_| {
            let mut c = Command::new("/bin/sh");
            c.arg(&plugin).arg("0.2").arg(&scratch);
            procs::timed_run(&mut c, "bench-exec-token").expect("plugin alone")
        })
        .collect();
    let provider_latency = stats::percentile(&mut alone, 50.0);
    bench.reset_runs("slow");
    let broker = bench.start_broker(10_000);
    let n = bench.plan.cold;
    let (mut lat, errors) = bench.rt.block_on(async {
        let channels = load::connect_many(&broker.socket, 64).await;
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let ch = channels[i % channels.len()].clone();
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let r = load::get_token(&ch, load::request("slow", "cold-1")).await;
                (t.elapsed(), r.is_err())
            }));
        }
        let mut lat = Vec::with_capacity(n);
        let mut errors = 0;
        for t in tasks {
            let (d, e) = t.await.expect("task");
            lat.push(d);
            errors += u64::from(e);
        }
        (lat, errors)
    });
    let runs = bench.runs("slow");
    drop(broker);
    let s = summarize(&mut lat);
    let _ = writeln!(
        bench.out,
        "## 3. {n} concurrent cold requests for one key (provider: an exec plugin that sleeps 200 ms)\n\n| requests | errors | upstream calls | provider alone (median) | p50 | p99 |\n|---:|---:|---:|---:|---:|---:|\n| {n} | {errors} | {runs} | {} | {} | {} |\n\nTargets: 1 upstream call: **{}**; p99 ≤ provider latency + 10 ms: **{}** ({} over).\n",
        ms(provider_latency),
        ms(s.p50),
        ms(s.p99),
        verdict(runs == 1),
        verdict(s.p99 <= provider_latency + Duration::from_millis(10)),
        ms(s.p99.saturating_sub(provider_latency)),
    );
}
