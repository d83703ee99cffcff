//! The README's walk-through, exactly as a user pastes it: the `sh run` block is read from
//! README.md (not copied here) and fed on stdin to `sh` and to `bash`, from the repository
//! root, [`RUNS`] times in all. Each run must print the three credentials, the one-line error
//! for the unknown provider, log a cache hit, and leave no socket and no broker behind.
//!
//! The block works in `/tmp/credbroker-demo` (the demo config names that path). So that
//! parallel test runs do not share it, each run gets its own: a private mount namespace with
//! a temp dir bound over `/tmp/credbroker-demo` (not over all of `/tmp`, where the checkout
//! itself may live), in a pid namespace so nothing outlives the run (`unshare`). Where that is
//! not permitted, the runs use the real `/tmp/credbroker-demo` under an exclusive `flock`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use credbroker_tests::doc_blocks::{Block, blocks_of, repo_root};
use credbroker_tests::{Running, bin, describe, run, tempdir};

/// How many times the block is pasted: without the wait for the socket, the shim ran before
/// the broker had made it in about two runs in three, so ten clean runs leave that no room.
const RUNS: usize = 10;
/// One whole run: a no-op `cargo build`, a broker start, four shims, a clean stop.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const DEMO: &str = "/tmp/credbroker-demo";

/// The README's `run` block that drives the shim.
fn walkthrough() -> Block {
    let blocks = blocks_of(&repo_root(), "README.md");
    let mut runs = blocks
        .into_iter()
        .filter(|b| b.kind.as_deref() == Some("run") && b.body.contains("credbroker-shim"));
    let block = runs
        .next()
        .expect("README.md has a `sh run` block with the walk-through");
    assert!(
        runs.next().is_none(),
        "one walk-through block expected in README.md"
    );
    block
}

/// `sh -c` running `then` after a private `dir` is bound over `/tmp/credbroker-demo`, in new
/// mount and pid namespaces (whatever the block leaves running dies with its shell). `$1` is
/// `dir`; arguments added to the command follow as `$2`, `$3`, …
fn in_private_demo(dir: &Path, then: &str) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--pid",
        "--fork",
        "--propagation",
        "private",
        "sh",
        "-c",
    ])
    .arg(format!(
        "mkdir -p {DEMO} && mount --bind \"$1\" {DEMO} && {then}"
    ))
    .arg("sh")
    .arg(dir);
    cmd
}

/// Whether this machine lets us bind a private `/tmp/credbroker-demo` in a new mount namespace.
fn can_unshare() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let dir = tempdir();
        in_private_demo(dir.path(), "true")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs `script` (a file) as stdin of `shell` in the repository root, with
/// `/tmp/credbroker-demo` private when possible; returns the output and where it was for this
/// run.
fn paste(shell: &str, script: &Path, tmp: &Path) -> (Output, PathBuf) {
    let repo = repo_root();
    let mut cmd;
    let demo;
    if can_unshare() {
        cmd = in_private_demo(tmp, "cd \"$2\" && exec \"$3\" < \"$4\"");
        cmd.arg(&repo).arg(shell).arg(script);
        demo = tmp.to_path_buf();
    } else {
        cmd = Command::new("flock");
        cmd.arg("/tmp/credbroker-demo.lock")
            .args(["sh", "-c", "cd \"$1\" && exec \"$2\" < \"$3\"", "sh"])
            .arg(&repo)
            .arg(shell)
            .arg(script);
        demo = PathBuf::from(DEMO);
    }
    (run(&mut cmd, RUN_TIMEOUT), demo)
}

fn check_run(shell: &str, n: usize, out: &Output, demo: &Path) {
    let what = format!("run {n} in {shell}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: {}", describe(out));
    assert!(
        !stderr.contains("cannot connect") && !stderr.contains("did not start"),
        "{what}: the shim ran before the broker was up: {}",
        describe(out)
    );

    let credentials: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l}")))
        .collect();
    assert_eq!(credentials.len(), 3, "{what}: {}", describe(out));
    let token = |i: usize| credentials[i]["status"]["token"].as_str().unwrap_or("");
    for c in &credentials {
        assert_eq!(c["kind"], "ExecCredential", "{what}: {c}");
        assert_eq!(
            c["apiVersion"], "client.authentication.k8s.io/v1",
            "{what}: {c}"
        );
    }
    assert_eq!(token(0), "my-dev-token", "{what}");
    assert!(
        token(1).starts_with("demo-issued-at-"),
        "{what}: {}",
        token(1)
    );
    assert_eq!(
        token(1),
        token(2),
        "{what}: the second run is served from the cache"
    );
    assert!(
        stdout.contains("providers: static (file), wrapped (exec)"),
        "{what}: check-config: {stdout}"
    );

    let shim_errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("credbroker-shim:"))
        .collect();
    assert_eq!(
        shim_errors.len(),
        1,
        "{what}: one shim error line: {stderr}"
    );
    assert!(
        shim_errors[0].contains("unknown provider \"nope\""),
        "{what}: {}",
        shim_errors[0]
    );
    assert!(
        stderr.contains("outcome=Hit"),
        "{what}: the broker logs the hit: {stderr}"
    );
    assert!(
        !stderr.contains("my-dev-token"),
        "{what}: a token in the log: {stderr}"
    );
    assert!(
        !demo.join("broker.sock").exists(),
        "{what}: the broker left its socket behind"
    );
}

#[test]
fn the_readme_walkthrough_pasted_into_sh_and_bash_works_every_time() {
    // The block builds the binaries itself; build them first so its `cargo build` is a no-op.
    bin("credbroker");
    let block = walkthrough();
    let dir = tempdir();
    let script = dir.path().join("walkthrough.sh");
    std::fs::write(&script, &block.body).unwrap();
    for n in 0..RUNS {
        let shell = if n % 2 == 0 { "sh" } else { "bash" };
        let tmp = tempdir();
        let (out, demo) = paste(shell, &script, tmp.path());
        check_run(shell, n, &out, &demo);
    }
    // The mount point the private runs left behind, if empty (never a user's demo).
    let _ = std::fs::remove_dir(DEMO);
}

/// The walk-through with the arm64 binaries, run under qemu (`credbroker_tests::arch`): the
/// README's block as written, but for its first two lines (the native build and where it
/// lands), which become `bin=` the qemu wrappers.
#[test]
fn the_readme_walkthrough_runs_the_arm64_binaries_under_qemu() {
    let arm64 = credbroker_tests::arch::arm64();
    let block = walkthrough();
    let mut lines = block.body.lines();
    let (build, bin_line) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    assert!(
        build.starts_with("cargo build") && bin_line.starts_with("bin=target/"),
        "{}: the walk-through no longer starts with its build and `bin=`: {build:?}, {bin_line:?}",
        block.at()
    );
    let script_text = format!(
        "bin={}\n{}\n",
        arm64.wrappers.display(),
        lines.collect::<Vec<_>>().join("\n")
    );
    let dir = tempdir();
    let script = dir.path().join("walkthrough-arm64.sh");
    std::fs::write(&script, script_text).unwrap();
    let tmp = tempdir();
    let (out, demo) = paste("sh", &script, tmp.path());
    check_run("sh", 0, &out, &demo);
    let _ = std::fs::remove_dir(DEMO);
}

#[test]
fn the_walkthrough_block_is_posix_sh() {
    // `kill %1` (job control) leaves the broker running under dash; `$!` does not.
    let block = walkthrough();
    assert!(
        !block.body.contains('%'),
        "{}: job specs need bash",
        block.at()
    );
    let dir = tempdir();
    let script = dir.path().join("w.sh");
    std::fs::write(&script, &block.body).unwrap();
    let out = Running::spawn(Command::new("sh").arg("-n").arg(&script)).wait(RUN_TIMEOUT);
    assert!(out.status.success(), "{}: {}", block.at(), describe(&out));
}
