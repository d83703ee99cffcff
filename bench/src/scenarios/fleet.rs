//! Section 6, fleet cold start: a Kueue manager restarting with its worker clusters (every
//! shim at once), next to one `aws eks get-token --role-arn` per EKS cluster.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::anchors::{self, find_aws};
use crate::bench::{Bench, ROLE_ARN, V1, progress, verdict};
use crate::stats::ms;

/// One fleet of shims against a fresh broker: the wall time until the last token, the time
/// spawning took, the shims that printed a token, and the upstream calls.
struct Fleet {
    wall: Duration,
    spawned: Duration,
    ok: usize,
    calls: (u64, u64, u64),
}

fn shim_fleet(bench: &mut Bench<'_>, shim: &Path) -> Fleet {
    let total = bench.plan.fleet_total();
    bench.reset_fakes(Duration::from_secs(3600));
    let broker = bench.start_broker(10_000);
    let mut children = Vec::with_capacity(total);
    let errlog = std::fs::File::create(bench.w().join("fleet-shims.stderr")).expect("stderr");
    let started = Instant::now();
    for i in 0..total {
        let provider = bench.plan.fleet_provider(i);
        let info = serde_json::json!({
            "apiVersion": V1, "kind": "ExecCredential",
            "spec": {"interactive": false, "cluster": {"server": format!("https://w{i}.example.com"), "config": {"clusterName": format!("{provider}-{i}")}}}
        })
        .to_string();
        let child = Command::new(shim)
            .args(["--provider", provider, "--socket"])
            .arg(&broker.socket)
            .env_clear()
            .env("KUBERNETES_EXEC_INFO", info)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(errlog.try_clone().expect("dup"))
            .spawn()
            .expect("spawn shim");
        children.push(child);
    }
    let spawned = started.elapsed();
    let mut ok = 0;
    for c in children {
        let out = c.wait_with_output().expect("shim");
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"token\"") {
            ok += 1;
        }
    }
    let wall = started.elapsed();
    let calls = bench.upstream_calls();
    drop(broker);
    if ok != total {
        let err = std::fs::read_to_string(bench.w().join("fleet-shims.stderr")).unwrap_or_default();
        progress(&format!(
            "fleet: {} shims failed; first lines:\n{}",
            total - ok,
            err.lines().take(5).collect::<Vec<_>>().join("\n")
        ));
    }
    Fleet {
        wall,
        spawned,
        ok,
        calls,
    }
}

pub fn run(bench: &mut Bench<'_>) {
    let (n_eks, n_gke, n_aks) = bench.plan.fleet;
    let total = bench.plan.fleet_total();
    progress(&format!("fleet cold start: {total} shims at once"));
    let shim = bench.shim_bin.clone();
    let Fleet {
        wall,
        spawned,
        ok,
        calls: (sts, mds, entra),
    } = shim_fleet(bench, &shim);
    let before = bench.shim_before.clone().map(|before| {
        progress(&format!("fleet cold start: {total} earlier shims at once"));
        (shim_fleet(bench, &before), before)
    });

    // The anchor: one `aws eks get-token --role-arn` process per EKS cluster, all at once
    // (what client-go does on a restart), against the same 200 ms fake STS.
    let anchor = find_aws().map(|aws| {
        let a = bench.plan.anchor_fleet;
        progress(&format!(
            "anchor fleet: {a} × aws eks get-token --role-arn at once"
        ));
        bench.reset_fakes(Duration::from_secs(3600));
        let home = bench.w().join("aws-home");
        let started = Instant::now();
        let children: Vec<_> = (0..a)
            .map(|i| {
                anchors::aws_eks_get_token(&aws, &home, &format!("eks-{i}"))
                    .args(["--role-arn", ROLE_ARN])
                    .env("AWS_ENDPOINT_URL_STS", bench.clouds.sts.url())
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn aws")
            })
            .collect();
        let ok = children
            .into_iter()
            .map(|c| c.wait_with_output().expect("aws"))
            .filter(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains("k8s-aws-v1.")
            })
            .count();
        (a, ok, started.elapsed(), bench.clouds.sts.calls())
    });
    let mut o = format!(
        "## 6. Fleet cold start: {total} worker clusters ({n_eks} EKS of one role, {n_gke} GKE, {n_aks} AKS), fake upstreams at 200 ms\n\nAll {total} shims are spawned at once (as client-go does when the manager restarts), each for its own cluster.\n\n| served by | clusters | tokens printed | wall time until the last token | upstream credential calls |\n|---|---:|---:|---:|---:|\n| **credbroker** | {total} | {ok} | **{}** (spawning took {}) | **{}** (AssumeRole {sts}, metadata {mds}, Entra {entra}) |\n",
        ms(wall),
        ms(spawned),
        sts + mds + entra
    );
    if let Some((f, path)) = &before {
        let (sts, mds, entra) = f.calls;
        let _ = writeln!(
            o,
            "| the earlier shim `{}` | {total} | {} | {} (spawning took {}) | {} |",
            path.display(),
            f.ok,
            ms(f.wall),
            ms(f.spawned),
            sts + mds + entra
        );
    }
    if let Some((a, aok, awall, calls)) = anchor {
        let scale = n_eks as f64 / a as f64;
        let _ = writeln!(
            o,
            "| `aws eks get-token --role-arn`, measured | {a} | {aok} | {} | {calls} AssumeRole |\n| `aws eks get-token --role-arn`, the {n_eks} EKS clusters (× {scale:.0}: the runs are CPU-bound) | {n_eks} | | ≈ {:.1} s | {n_eks} AssumeRole |",
            ms(awall),
            awall.as_secs_f64() * scale,
        );
    }
    let _ = writeln!(
        o,
        "\nTargets: ≤ 2 s: **{}**; exactly 3 upstream credential fetches: **{}**.\n",
        verdict(wall <= Duration::from_secs(2) && ok == total),
        verdict(sts + mds + entra == 3),
    );
    bench.out.push_str(&o);
}
