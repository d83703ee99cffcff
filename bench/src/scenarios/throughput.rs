//! Section 2: throughput and latency of cache hits over the socket, per concurrency level.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::bench::{Bench, progress, verdict};
use crate::load;
use crate::stats::{ms, summarize};

pub fn run(bench: &mut Bench<'_>) {
    progress("GetToken throughput at concurrency 1, 16, 64, 256");
    let broker = bench.start_broker(10_000);
    let clusters = 100u64;
    let plan = bench.plan.clone();
    let rows = bench.rt.block_on(async {
        let warm = load::connect_many(&broker.socket, 8).await;
        let reqs = (0..clusters)
            .map(|i| load::request("hit", &format!("c{i}")))
            .collect();
        let (errors, first) = load::each_once(&warm, 8, reqs).await;
        assert_eq!(errors, 0, "warming failed: {first:?}");
        drop(warm);
        let mut rows = Vec::new();
        for &c in &plan.levels {
            let channels = load::connect_many(&broker.socket, c.min(16)).await;
            let make: Arc<dyn Fn(u64) -> _ + Send + Sync> =
                Arc::new(move |i| load::request("hit", &format!("c{}", i % clusters)));
            let mut run =
                load::closed_loop(&channels, c, Duration::from_secs_f64(plan.load_secs), make)
                    .await;
            let s = summarize(&mut run.latencies);
            rows.push((c, run.ok, run.errors, run.first_error, run.elapsed, s));
        }
        rows
    });
    let mut o = String::from(
        "## 2. GetToken over the Unix socket (cache hits, tonic client)\n\n| concurrency | calls | errors | calls/s | p50 | p99 |\n|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut at64 = 0.0;
    for (c, ok, errors, first, elapsed, s) in rows {
        let rate = ok as f64 / elapsed.as_secs_f64();
        if c == 64 {
            at64 = rate;
        }
        let _ = writeln!(
            o,
            "| {c} | {ok} | {errors}{} | {rate:.0} | {} | {} |",
            first.map(|e| format!(" ({e})")).unwrap_or_default(),
            ms(s.p50),
            ms(s.p99)
        );
    }
    let _ = writeln!(
        o,
        "\nThe load generator runs on the same 2 CPUs as the broker. Target ≥ 20 000 GetToken/s at concurrency 64: **{}** ({at64:.0}/s). Broker RSS after the runs: {} KiB.\n",
        verdict(at64 >= 20_000.0),
        broker.rss_kib()
    );
    bench.out.push_str(&o);
}
