//! Processes: the broker under test (started from the built binary with a generated
//! config and a controlled environment), its RSS, and timed runs of exec plugins.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// What the benchmark's brokers allow: the default per-uid limit (200/s, burst 2000) is
/// for production callers and would throttle a load generator that runs tens of
/// thousands of calls per second under one uid.
pub const BENCH_RATE_LIMIT: &str = "rateLimit: {perSecond: 100000000, burst: 100000000}";

/// `credbroker serve` on a socket in a temp dir; stopped (SIGTERM) on drop.
#[derive(Debug)]
pub struct Broker {
    _dir: TempDir,
    pub socket: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Broker {
    /// `providers` is the YAML list under `providers:`; `env` is the whole environment
    /// (cleared first, so no ambient cloud credential or proxy leaks in).
    pub fn start(
        bin: &Path,
        providers: &str,
        max_entries: u64,
        env: &[(String, String)],
    ) -> Broker {
        let top = format!("cache: {{maxEntries: {max_entries}}}\n{BENCH_RATE_LIMIT}\n");
        Self::start_with(bin, "", &top, providers, env)
    }

    /// [`Broker::start`] with the config's own `socket` keys (`socket_extra`, after `path`)
    /// and top-level sections (`top`, YAML lines before `providers:`). The socket's
    /// directory is 0755, so callers under other uids can reach it.
    pub fn start_with(
        bin: &Path,
        socket_extra: &str,
        top: &str,
        providers: &str,
        env: &[(String, String)],
    ) -> Broker {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::Builder::new()
            .prefix("credbroker-bench-")
            .tempdir()
            .expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the broker's dir");
        let socket = dir.path().join("broker.sock");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home dir");
        let config = format!(
            "socket: {{path: {:?}{socket_extra}}}\n{top}providers:\n{providers}",
            socket.display().to_string()
        );
        let config_path = dir.path().join("credbroker.yaml");
        std::fs::write(&config_path, config).expect("write config");
        let log = dir.path().join("broker.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", "/usr/bin:/bin")
            .env("AWS_CONFIG_FILE", home.join("no-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", home.join("no-credentials"))
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup"))
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut broker = Broker {
            _dir: dir,
            socket,
            log,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&broker.socket).is_err() {
            if Instant::now() > deadline || broker.child.try_wait().ok().flatten().is_some() {
                let _ = broker.child.kill();
                let _ = broker.child.wait();
                panic!(
                    "the broker did not listen within 20s; log:\n{}",
                    broker.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        broker
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Resident set size (VmRSS) in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // SIGTERM for a clean shutdown (the socket is removed); SIGKILL if it lingers.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => break,
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS of a process, from /proc/<pid>/status, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One timed run: spawn, read stdout to the end, wait. Fails when the exit is not 0 or
/// stdout does not hold `expect`.
pub fn timed_run(cmd: &mut Command, expect: &str) -> Result<Duration, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let mut err = String::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
    let elapsed = started.elapsed();
    if !status.success() || !out.contains(expect) {
        return Err(format!(
            "{status}; stdout {:?}; stderr {:?}",
            out.chars().take(300).collect::<String>(),
            err.chars().take(600).collect::<String>()
        ));
    }
    Ok(elapsed)
}

/// `credbroker-bench --rusage FILE PROGRAM ARGS...`: runs PROGRAM with this process's
/// environment and stdio, waits for it, and writes its max RSS in KiB (getrusage of the
/// children: PROGRAM is the only one) to FILE; exits with its exit code. The anchors section
/// runs a plugin under it, untimed, for the plugin's max RSS.
pub fn rusage_main(file: &Path, program: &str, args: &[String]) {
    let status = Command::new(program).args(args).status();
    let code = match status {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => {
            eprintln!("credbroker-bench --rusage: spawn {program}: {e}");
            std::process::exit(127);
        }
    };
    let kib = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map_or(0, |u| u.max_rss());
    let _ = std::fs::write(file, kib.to_string());
    std::process::exit(code);
}
