//! The shim as client-go runs it: `KUBERNETES_EXEC_INFO` in, one ExecCredential or one
//! error line out, and the assertions that check either against the contract.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::{Running, SHIM, SHIM_TIMEOUT, bin, describe};

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

/// Set by [`shim_command`] to a number of its own for each run.
pub const SHIM_RUN_ENV: &str = "CREDBROKER_TEST_SHIM_RUN";

/// The shim command: `credbroker-shim --socket SOCKET ARGS...`, with `KUBERNETES_EXEC_INFO`
/// set to `exec_info` (removed when `None`) and `CREDBROKER_SOCKET` removed.
///
/// Each run is a new caller to the broker: the test process is long-lived and multi-threaded,
/// like client-go, so runs with the same arguments and environment would be client-go asking
/// again before its come-back time (a re-ask, `tests/tests/rejections.rs`); [`SHIM_RUN_ENV`]
/// set to a number of its own changes the exec config's digest. Remove it to run the shim as
/// the same caller again.
pub fn shim_command(socket: &Path, args: &[&str], exec_info: Option<&str>) -> Command {
    shim_command_of(&bin(SHIM), socket, args, exec_info)
}

/// [`shim_command`] running the shim `shim` (another build of it, such as the arm64 one's
/// qemu wrapper, [`crate::arch`]).
pub fn shim_command_of(
    shim: &Path,
    socket: &Path,
    args: &[&str],
    exec_info: Option<&str>,
) -> Command {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut cmd = Command::new(shim);
    cmd.arg("--socket").arg(socket).args(args);
    cmd.env_remove("CREDBROKER_SOCKET");
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cmd.env(SHIM_RUN_ENV, run.to_string());
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

/// [`run_shim`] with the shim `shim` (another build of it, see [`shim_command_of`]).
pub fn run_shim_of(shim: &Path, socket: &Path, args: &[&str], exec_info: Option<&str>) -> Output {
    Running::spawn(&mut shim_command_of(shim, socket, args, exec_info)).wait(SHIM_TIMEOUT)
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
