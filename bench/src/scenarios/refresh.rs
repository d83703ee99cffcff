//! Section 5: hit latency while many entries refresh in the background.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench::{Bench, progress, verdict};
use crate::load;
use crate::stats::{ms, summarize};

pub fn run(bench: &mut Bench<'_>) {
    let n = bench.plan.refresh_entries;
    let life = bench.plan.refresh_life;
    progress(&format!(
        "hit p99 while {n} entries refresh (takes about {} s)",
        (life.as_secs_f64() * 0.75) as u64
    ));
    // EKS entries whose role session (and so every token) lives `life`: at ~half of it
    // every entry is due and the next hit on each starts a background re-sign (and one
    // AssumeRole for the role's new session).
    bench.reset_fakes(life);
    let broker = bench.start_broker(n as u64 * 2);
    let plan = bench.plan.clone();
    let result = bench.rt.block_on(async {
        let hot = credbroker_tests::unix_channel(&broker.socket).await;
        let touch = load::connect_many(&broker.socket, 8).await;
        load::get_token(&hot, load::request("hit", "hot"))
            .await
            .expect("hot");
        let t0 = Instant::now();
        let reqs: Vec<_> = (0..n)
            .map(|i| load::request("eks", &format!("r{i:05}")))
            .collect();
        let tokens_before = load::tokens(&touch, 64, reqs.clone()).await;
        let fill = t0.elapsed();
        let phase = || {
            let hot = hot.clone();
            let touch = touch.clone();
            let reqs = reqs.clone();
            async move {
                let make: Arc<dyn Fn(u64) -> _ + Send + Sync> =
                    Arc::new(|_| load::request("hit", "hot"));
                let measuring =
                    tokio::spawn(
                        async move { load::closed_loop(&[hot], 1, plan.phase, make).await },
                    );
                // The same sweep over every entry in both phases: only whether the
                // entries are due differs.
                load::tokens(&touch, 16, reqs).await;
                measuring.await.expect("hot loop")
            }
        };
        let mut before = phase().await;
        let calls_before = bench.clouds.sts.calls();
        // Every entry is due from 0.6 × its lifetime (+ jitter on the fill time) and
        // served until 0.75 × its lifetime.
        let due_at = life.mul_f64(0.62) + fill.mul_f64(0.4);
        tokio::time::sleep(due_at.saturating_sub(t0.elapsed())).await;
        let mut during = phase().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = load::tokens(&touch, 16, reqs).await;
        let refreshed = tokens_before
            .iter()
            .zip(&after)
            .filter(|(a, b)| a.is_some() && b.is_some() && a != b)
            .count();
        let sb = summarize(&mut before.latencies);
        let sd = summarize(&mut during.latencies);
        (
            sb,
            sd,
            refreshed,
            bench.clouds.sts.calls() - calls_before,
            before.errors + during.errors,
        )
    });
    drop(broker);
    let (sb, sd, refreshed, assume, errors) = result;
    let change = sd.p99.as_secs_f64() / sb.p99.as_secs_f64() - 1.0;
    let _ = writeln!(
        bench.out,
        "## 5. Hit latency while {n} entries refresh in the background\n\nA hot key is asked back-to-back (concurrency 1) while a sweep touches all {n} EKS entries (16 at a time): first while they are fresh (hits only), then when every one is due, so each touch starts a background refresh (a local re-sign; the role's session is renewed with one 200 ms AssumeRole).\n\n| phase | hot-key calls | p50 | p99 |\n|---|---:|---:|---:|\n| entries fresh | {} | {} | {} |\n| {refreshed} entries refreshing ({assume} AssumeRole) | {} | {} | {} |\n\nErrors: {errors}. Target: background refresh moves hit p99 by < 20 %: **{}** ({:+.0} %).\n",
        sb.n,
        ms(sb.p50),
        ms(sb.p99),
        sd.n,
        ms(sd.p50),
        ms(sd.p99),
        verdict(change < 0.2),
        change * 100.0
    );
    bench.reset_fakes(Duration::from_secs(3600));
}
