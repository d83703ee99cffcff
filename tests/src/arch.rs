//! The arm64 build of both binaries (`scripts/cross-build.sh --arch arm64`), run on this amd64
//! machine under qemu-user, so the tests that matter most for a Graviton or Ampere node run
//! the very binaries that ship for it: the walk-through, kubectl through the shim, a cloud
//! provider against its fake, the static shim in an empty root.
//!
//! [`arm64`] builds them once per test process (cached across runs: the script rebuilds only
//! what changed) and writes a wrapper per binary that runs it under `qemu-aarch64-static`, for
//! the places that take a command (a broker builder, a kubeconfig's exec command, the
//! README's `$bin/…`). No binfmt registration: nothing on the machine changes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::doc_blocks::repo_root;
use crate::{BROKER, SHIM, describe, require_tool, run};

/// A cold cross build of both binaries (release and the `shim` profile) on two cores.
const CROSS_BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// The arm64 binaries and their qemu wrappers.
#[derive(Debug)]
pub struct Arm64 {
    /// `credbroker` and `credbroker-shim`, static aarch64 ELF files.
    pub dir: PathBuf,
    /// `credbroker` and `credbroker-shim` scripts that exec them under qemu.
    pub wrappers: PathBuf,
    /// `qemu-aarch64-static`.
    pub qemu: PathBuf,
}

impl Arm64 {
    /// The real arm64 binary `name` ([`BROKER`] or [`SHIM`]).
    pub fn binary(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A command that runs the arm64 binary `name` under qemu (its wrapper).
    pub fn wrapper(&self, name: &str) -> PathBuf {
        self.wrappers.join(name)
    }
}

/// Builds the arm64 binaries once per test process and writes their wrappers; fails the test
/// (never skips it) when the build or qemu is missing.
pub fn arm64() -> &'static Arm64 {
    static ARM64: OnceLock<Arm64> = OnceLock::new();
    ARM64.get_or_init(|| {
        let qemu = require_tool(
            "qemu-aarch64-static",
            "apt-get install qemu-user-static (scripts/test.sh does)",
        );
        let root = repo_root();
        let dir = root.join("target/cross/arm64");
        let out = run(
            Command::new(root.join("scripts/cross-build.sh"))
                .args(["--arch", "arm64", "--out"])
                .arg(&dir)
                .current_dir(&root),
            CROSS_BUILD_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "scripts/cross-build.sh --arch arm64 failed: {}",
            describe(&out)
        );
        let wrappers = root.join("target/cross/arm64-qemu");
        std::fs::create_dir_all(&wrappers).expect("wrapper dir");
        for name in [BROKER, SHIM] {
            write_wrapper(&wrappers.join(name), &qemu, &dir.join(name));
        }
        Arm64 {
            dir,
            wrappers,
            qemu,
        }
    })
}

/// `#!/bin/sh` that execs `binary` under `qemu` with its arguments (same pid, so a caller's
/// `kill $!` reaches it; qemu passes signals on to the program).
fn write_wrapper(path: &Path, qemu: &Path, binary: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let script = format!(
        "#!/bin/sh\nexec {} {} \"$@\"\n",
        crate::sh_quote(qemu.to_str().expect("UTF-8 path")),
        crate::sh_quote(binary.to_str().expect("UTF-8 path"))
    );
    // A name of this process's own: test processes running at once each replace it whole.
    let partial = path.with_extension(format!("partial.{}", std::process::id()));
    std::fs::write(&partial, script).expect("write the qemu wrapper");
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&partial, path).expect("install the qemu wrapper");
}
