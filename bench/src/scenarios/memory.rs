//! Section 4: the broker's RSS, idle and per cached entry.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::bench::{Bench, progress, verdict};
use crate::load;

pub fn run(bench: &mut Bench<'_>) {
    let n = bench.plan.rss_entries;
    progress(&format!("RSS idle and with {n} entries"));
    let broker = bench.start_broker(n as u64 * 2);
    std::thread::sleep(Duration::from_millis(500));
    let idle = broker.rss_kib();
    let (warm, full, fill) = bench.rt.block_on(async {
        let channels = load::connect_many(&broker.socket, 8).await;
        // One call per provider type used below, so their one-time set-up is not
        // counted per entry.
        for (p, c) in [("eks-static", "warm"), ("hit", "warm")] {
            load::get_token(&channels[0], load::request(p, c))
                .await
                .expect("warm-up call");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let warm = broker.rss_kib();
        let t = Instant::now();
        let reqs = (0..n)
            .map(|i| load::request("eks-static", &format!("cluster-{i:06}")))
            .collect();
        let (errors, first) = load::each_once(&channels, 64, reqs).await;
        assert_eq!(errors, 0, "filling failed: {first:?}");
        let fill = t.elapsed();
        tokio::time::sleep(Duration::from_millis(500)).await;
        (warm, broker.rss_kib(), fill)
    });
    drop(broker);
    let per_entry = (full.saturating_sub(warm)) as f64 * 1024.0 / n as f64;
    let _ = writeln!(
        bench.out,
        "## 4. Memory (VmRSS from /proc/<pid>/status)\n\n| state | RSS |\n|---|---:|\n| idle, just started | {idle} KiB ({:.1} MiB) |\n| after one EKS token (providers set up) | {warm} KiB |\n| with {n} more cached EKS tokens (one per cluster, signed locally; filled in {:.1} s) | {full} KiB ({:.1} MiB) |\n| **per entry** | **{per_entry:.0} bytes** |\n\nTargets: idle ≤ 20 MB: **{}**; ≤ 2 KiB per entry: **{}**. An EKS token is a presigned URL of about {} bytes; the entry also keeps the request (for operator refreshes) and the cluster's name.\n",
        idle as f64 / 1024.0,
        fill.as_secs_f64(),
        full as f64 / 1024.0,
        verdict(idle as f64 <= 20.0 * 1000.0 * 1000.0 / 1024.0),
        verdict(per_entry <= 2048.0),
        eks_token_len(bench),
    );
}

fn eks_token_len(bench: &Bench<'_>) -> usize {
    let broker = bench.start_broker(100);
    bench.rt.block_on(async {
        let ch = credbroker_tests::unix_channel(&broker.socket).await;
        load::get_token(&ch, load::request("eks-static", "cluster-000001"))
            .await
            .map(|r| r.token.len())
            .unwrap_or(0)
    })
}
