//! The sizes of one run: the full run (`bench/run.sh`, minutes) and `--smoke` (seconds, what
//! CI runs so the benchmarks keep working; its numbers mean nothing).

use std::path::PathBuf;
use std::time::Duration;

/// The anchors section's runs per plugin: misses are 200 ms fake calls each, so 20 give a
/// median and a p99 (the worst of 20) in seconds per row; hits are cheap, 200 as section 1's
/// 300 for the shim, within a few seconds for the slowest anchor (~15 ms a run).
const ANCHORS_HITS: usize = 200;
const ANCHORS_MISSES: usize = 20;
/// The fleet: 1 000 clusters (over 3 identities).
const ANCHORS_FLEET: usize = 1000;

/// Sizes of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub smoke: bool,
    /// Sections to run (all when empty).
    pub only: Vec<String>,
    pub shim_runs: usize,
    pub aws_runs: usize,
    pub load_secs: f64,
    pub levels: Vec<usize>,
    pub cold: usize,
    pub rss_entries: usize,
    pub refresh_entries: usize,
    pub refresh_life: Duration,
    pub phase: Duration,
    /// Worker clusters of the fleet: (EKS, GKE, AKS).
    pub fleet: (usize, usize, usize),
    pub anchor_fleet: usize,
    /// The anchors section: hit runs and miss runs per plugin, clusters of its fleet, and
    /// e2e/anchors.sh's env file (default: in its cache).
    pub anchors_hits: usize,
    pub anchors_misses: usize,
    pub anchors_fleet: usize,
    pub anchors_env: Option<PathBuf>,
    pub steady: Duration,
    pub steady_life: Duration,
    /// The hostile section: legitimate callers alone, beside the stream attackers (RSS
    /// followed), then beside all four attackers.
    pub hostile_unloaded: Duration,
    pub hostile_streams: Duration,
    pub hostile: Duration,
    /// The comparison with the attackers in a cpu cgroup of their own: this many rounds of
    /// legitimate callers alone, then beside the attackers, `hostile / rounds` each.
    pub hostile_rounds: u32,
    /// The hostile section's re-ask part: the victim's tries per phase (unloaded, beside
    /// each re-ask attacker), the check-slot attacker's entries, and the most an attacker
    /// runs (it stops when the victim's tries are done).
    pub reask_tries: usize,
    pub reask_entries: u32,
    pub reask_attack_cap: Duration,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            smoke: false,
            only: Vec::new(),
            shim_runs: 300,
            aws_runs: 200,
            load_secs: 5.0,
            levels: vec![1, 16, 64, 256],
            cold: 1000,
            rss_entries: 100_000,
            refresh_entries: 10_000,
            refresh_life: Duration::from_secs(120),
            phase: Duration::from_secs(3),
            fleet: (600, 300, 100),
            anchor_fleet: 100,
            anchors_hits: ANCHORS_HITS,
            anchors_misses: ANCHORS_MISSES,
            anchors_fleet: ANCHORS_FLEET,
            anchors_env: None,
            steady: Duration::from_secs(60),
            steady_life: Duration::from_secs(20),
            // Five minutes: the bound on RSS under a stream flood is over that long.
            hostile_unloaded: Duration::from_secs(30),
            hostile_streams: Duration::from_secs(300),
            hostile: Duration::from_secs(60),
            // Six windows of 10 s each way: the machine's slow spells (seconds long, see
            // BENCHMARKS.md section 8) fall on both sides instead of on one phase.
            hostile_rounds: 6,
            // 30 tries give a median and a max worth reading (about 30 s a phase); 1 300
            // entries is the red team's attack (tests/tests/hostile_reasks.rs).
            reask_tries: 30,
            reask_entries: 1300,
            reask_attack_cap: Duration::from_secs(300),
        }
    }

    pub fn smoke() -> Plan {
        Plan {
            smoke: true,
            only: Vec::new(),
            shim_runs: 20,
            aws_runs: 3,
            load_secs: 0.5,
            levels: vec![1, 16, 64, 256],
            cold: 100,
            rss_entries: 2000,
            refresh_entries: 300,
            refresh_life: Duration::from_secs(12),
            phase: Duration::from_secs(1),
            fleet: (60, 30, 10),
            anchor_fleet: 3,
            anchors_hits: 5,
            anchors_misses: 2,
            anchors_fleet: 6,
            anchors_env: None,
            steady: Duration::from_secs(6),
            steady_life: Duration::from_secs(4),
            hostile_unloaded: Duration::from_secs(3),
            hostile_streams: Duration::from_secs(3),
            hostile: Duration::from_secs(4),
            hostile_rounds: 1,
            reask_tries: 3,
            reask_entries: 100,
            reask_attack_cap: Duration::from_secs(60),
        }
    }

    /// Whether the section `name` runs (`--only`).
    pub fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }

    /// The fleet's clusters in order: the EKS ones first, then GKE, then AKS.
    pub fn fleet_total(&self) -> usize {
        let (n_eks, n_gke, n_aks) = self.fleet;
        n_eks + n_gke + n_aks
    }

    /// The provider serving fleet cluster `i`.
    pub fn fleet_provider(&self, i: usize) -> &'static str {
        let (n_eks, n_gke, _) = self.fleet;
        if i < n_eks {
            "eks"
        } else if i < n_eks + n_gke {
            "gke"
        } else {
            "aks"
        }
    }
}
