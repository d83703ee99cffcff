//! What every scenario shares: the built binaries, the fake clouds, a work dir with the exec
//! plugin script and the files the broker reads, the broker's config and environment, and the
//! report being written.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::fakes::Clouds;
use crate::plan::Plan;
use crate::procs::Broker;

/// How long every fake cloud takes to answer a credential call: the 200 ms.
pub const UPSTREAM_DELAY: Duration = Duration::from_millis(200);
pub const ROLE_ARN: &str = "arn:aws:iam::111122223333:role/kueue";
pub const REGION: &str = "us-west-2";
pub const V1: &str = "client.authentication.k8s.io/v1";
/// Fake static AWS keys: signing is local, nothing checks them.
pub const AWS_KEY: &str = "AKIABENCHEXAMPLE0001";
pub const AWS_SECRET: &str = "bench/secret/not/a/real/key/0000000000000";
/// Lifetime of the fakes' credentials outside the runs that shorten it.
const HOUR: Duration = Duration::from_secs(3600);

/// Everything a run shares: the fakes, a work dir with plugin scripts and files, and the
/// report being written.
#[derive(Debug)]
pub struct Bench<'a> {
    pub rt: &'a tokio::runtime::Runtime,
    pub plan: Plan,
    pub broker_bin: PathBuf,
    pub shim_bin: PathBuf,
    /// `--shim-before`: an earlier shim build, timed beside `shim_bin` in the exec and fleet
    /// sections, so a change to the shim is measured in one run.
    pub shim_before: Option<PathBuf>,
    work: tempfile::TempDir,
    pub clouds: Clouds,
    /// The markdown report so far.
    pub out: String,
}

/// One progress line on stderr (the report goes to stdout).
pub fn progress(what: &str) {
    eprintln!("credbroker-bench: {what}");
}

/// A target's verdict in the report.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
}

impl<'a> Bench<'a> {
    pub fn new(
        rt: &'a tokio::runtime::Runtime,
        plan: Plan,
        broker_bin: PathBuf,
        shim_bin: PathBuf,
    ) -> Self {
        let clouds = Clouds::start(UPSTREAM_DELAY, HOUR);
        let work = tempfile::Builder::new()
            .prefix("credbroker-bench-work-")
            .tempdir()
            .expect("work dir");
        let w = work.path();
        std::fs::write(w.join("fakes-ca.pem"), clouds.ca_bundle()).expect("ca");
        std::fs::write(w.join("federated-token"), "bench-federated-sa-token").expect("token");
        // The exec plugin for hits and for the 200 ms provider: sleeps $1 seconds, counts its
        // runs in $2, prints an ExecCredential without expiry (the provider's defaultLifetime).
        std::fs::write(
            w.join("plugin.sh"),
            "#!/bin/sh\n[ \"$1\" = 0 ] || sleep \"$1\"\necho run >> \"$2\"\nprintf '%s\\n' '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"bench-exec-token\"}}'\n",
        )
        .expect("plugin");
        Bench {
            rt,
            plan,
            broker_bin,
            shim_bin,
            shim_before: None,
            work,
            clouds,
            out: String::new(),
        }
    }

    /// The work dir.
    pub fn w(&self) -> &Path {
        self.work.path()
    }

    /// Exec providers: `hit` (instant) and `slow` (200 ms), both counting runs in files.
    fn exec_providers(&self) -> String {
        let plugin = self.w().join("plugin.sh");
        let mut y = String::new();
        for (name, delay) in [("hit", "0"), ("slow", "0.2")] {
            let count = self.w().join(format!("{name}.runs"));
            let _ = writeln!(
                y,
                "  - {{name: {name}, type: exec, exec: {{command: /bin/sh, args: [{:?}, {delay:?}, {:?}], defaultLifetime: 1h}}}}",
                plugin.display().to_string(),
                count.display().to_string()
            );
        }
        y
    }

    fn cloud_providers(&self) -> String {
        format!(
            "  - {{name: eks, type: aws, aws: {{region: {REGION}, roleArn: {ROLE_ARN:?}}}}}\n  - {{name: eks-static, type: aws, aws: {{region: {REGION}}}}}\n  - {{name: gke, type: gcp, gcp: {{}}}}\n  - {{name: aks, type: azure, azure: {{}}}}\n"
        )
    }

    /// The broker's environment: static AWS keys, every cloud pointed at its fake.
    fn cloud_env(&self) -> Vec<(String, String)> {
        let w = self.w();
        [
            ("AWS_ACCESS_KEY_ID", AWS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", AWS_SECRET.to_owned()),
            (
                "AZURE_CLIENT_ID",
                "11111111-2222-3333-4444-555555555555".to_owned(),
            ),
            (
                "AZURE_TENANT_ID",
                "72f988bf-86f1-41af-91ab-2d7cd011db47".to_owned(),
            ),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                w.join("federated-token").display().to_string(),
            ),
            ("RUST_LOG", "info".to_owned()),
        ]
        .into_iter()
        .chain(self.clouds.endpoint_env(&w.join("fakes-ca.pem")))
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// A broker for the hostile section: production's rate limit and socket rules (mode
    /// 0666, `allowedUids` 0 and `allowed`), `eks-static`, `shared`, an exec provider
    /// whose plugin answers at once, except for clusters named `hang-*`: those hang until its
    /// 5 s timeout, and `reask`, an exec provider whose plugin answers at once with a new
    /// token every run (so a refresh after a rejection is seen to replace the token).
    pub fn start_hostile_broker(&self, allowed: u32) -> Broker {
        let plugin = self.w().join("hang-plugin.sh");
        std::fs::write(
            &plugin,
            "#!/bin/sh\ncase \"${KUBERNETES_EXEC_INFO:-}\" in *hang-*) exec sleep 60;; esac\nprintf '%s\\n' '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"bench-shared-token\"}}'\n",
        )
        .expect("hang plugin");
        let fresh = self.w().join("fresh-plugin.sh");
        std::fs::write(
            &fresh,
            "#!/bin/sh\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"bench-reask-%s-%s\"}}\\n' \"$(date +%s%N)\" \"$$\"\n",
        )
        .expect("fresh-token plugin");
        let providers = format!(
            "  - {{name: shared, type: exec, exec: {{command: /bin/sh, args: [{:?}], timeout: 5s, defaultLifetime: 1h}}}}\n  - {{name: reask, type: exec, exec: {{command: /bin/sh, args: [{:?}], timeout: 5s, defaultLifetime: 1h}}}}\n  - {{name: eks-static, type: aws, aws: {{region: {REGION}}}}}\n",
            plugin.display().to_string(),
            fresh.display().to_string()
        );
        Broker::start_with(
            &self.broker_bin,
            &format!(", mode: \"0666\", allowedUids: [0, {allowed}]"),
            "",
            &providers,
            &self.cloud_env(),
        )
    }

    /// A broker with every provider (`hit`, `slow`, `eks`, `eks-static`, `gke`, `aks`).
    pub fn start_broker(&self, max_entries: u64) -> Broker {
        let providers = format!("{}{}", self.exec_providers(), self.cloud_providers());
        Broker::start(&self.broker_bin, &providers, max_entries, &self.cloud_env())
    }

    /// Runs of the exec provider `name`'s plugin so far.
    pub fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.w().join(format!("{name}.runs")))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    pub fn reset_runs(&self, name: &str) {
        let _ = std::fs::remove_file(self.w().join(format!("{name}.runs")));
    }

    /// Zeroes the fakes' call counts; their credentials live `lifetime` from now on.
    pub fn reset_fakes(&self, lifetime: Duration) {
        self.clouds.reset(lifetime);
    }

    /// Credential calls served: (AssumeRole, metadata token, Entra token).
    pub fn upstream_calls(&self) -> (u64, u64, u64) {
        self.clouds.calls()
    }

    /// The report's title and the machine it ran on.
    pub fn header(&mut self) {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let _ = writeln!(
            self.out,
            "# credbroker benchmark{}\n\nMachine: {cpus} CPUs ({model}), {:.1} GiB RAM. Broker: `{}`. Shim: `{}` ({} bytes). Fake upstreams answer after {} ms.\n",
            if self.plan.smoke {
                " (--smoke: small N, numbers not meaningful)"
            } else {
                ""
            },
            mem_kib as f64 / 1024.0 / 1024.0,
            self.broker_bin.display(),
            self.shim_bin.display(),
            std::fs::metadata(&self.shim_bin).map_or(0, |m| m.len()),
            UPSTREAM_DELAY.as_millis()
        );
    }
}
