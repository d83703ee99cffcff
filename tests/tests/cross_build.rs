//! `scripts/cross-build.sh` run twice at once into one output directory, as scripts/test.sh's
//! background arm64 build and a test needing the arm64 binaries do: both succeed and leave
//! whole binaries. Each run copies through a name of its own; with one shared temporary name,
//! the run that renamed it second found it gone (`mv: cannot stat …credbroker.partial`).
//!
//! A `cp` that lingers after copying (first on `PATH`) holds each run between its copy and
//! its rename, so the two runs' copies overlap every time rather than by chance.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use credbroker_tests::{BROKER, Running, SHIM, describe, tempdir};

/// Both runs: cargo finds the build done (the arm64 build comes first), so this is the
/// scripts' own time plus the lingering copies.
const RUNS_TIMEOUT: Duration = Duration::from_secs(10 * 60);

#[test]
fn two_cross_builds_at_once_into_one_directory_both_succeed() {
    let arm64 = credbroker_tests::arch::arm64();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempdir();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let cp = bin.join("cp");
    std::fs::write(&cp, "#!/bin/sh\n/bin/cp \"$@\" || exit\nexec sleep 3\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&cp, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = dir.path().join("out");
    let start = || {
        Running::spawn(
            Command::new(root.join("scripts/cross-build.sh"))
                .args(["--arch", "arm64", "--out"])
                .arg(&out)
                .env("PATH", &path)
                .current_dir(&root),
        )
    };
    let (first, second) = (start(), start());
    for run in [first, second] {
        let done = run.wait(RUNS_TIMEOUT);
        assert!(done.status.success(), "cross-build.sh: {}", describe(&done));
    }
    for name in [BROKER, SHIM] {
        assert_eq!(
            std::fs::read(out.join(name)).unwrap(),
            std::fs::read(arm64.binary(name)).unwrap(),
            "{name} in the shared output directory is the whole build"
        );
    }
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != BROKER && n != SHIM)
        .collect();
    assert!(left.is_empty(), "left in the output directory: {left:?}");
}
