//! The binaries are static: the shim runs in an empty chroot (no libc, no /etc, no /proc)
//! holding only itself and the broker's socket, and neither binary has a PT_INTERP header.

use std::path::Path;
use std::process::{Command, Output};

use credbroker_tests::{
    BROKER, Broker, COMMAND_TIMEOUT, SHIM, TokenFiles, V1, assert_credential, bin, config_yaml,
    describe, exec_info, file_provider, require_tool, run, tempdir,
};
use serde_json::json;

/// `chroot ROOT CMD...` with KUBERNETES_EXEC_INFO set; falls back to `unshare -r chroot`
/// when plain chroot is not permitted.
fn chroot(root: &Path, cmd: &[&str], info: &str) -> Output {
    let chroot = require_tool("chroot", "coreutils chroot");
    let attempt = |prefix: &[&str]| {
        let (program, args): (&Path, &[&str]) = if prefix.is_empty() {
            (chroot.as_path(), &[])
        } else {
            (Path::new(prefix[0]), &prefix[1..])
        };
        let mut command = Command::new(program);
        command.args(args);
        if !prefix.is_empty() {
            command.arg(&chroot);
        }
        command
            .arg(root)
            .args(cmd)
            .env_remove("CREDBROKER_SOCKET")
            .env("KUBERNETES_EXEC_INFO", info);
        run(&mut command, COMMAND_TIMEOUT)
    };
    let out = attempt(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success()
        && stderr.contains("chroot:")
        && stderr.contains("Operation not permitted")
    {
        require_tool(
            "unshare",
            "util-linux unshare, to chroot without CAP_SYS_CHROOT",
        );
        let out = attempt(&["unshare", "-r"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !(stderr.contains("unshare:") || stderr.contains("chroot:")),
            "neither chroot nor `unshare -r chroot` is permitted here: {}",
            describe(&out)
        );
        return out;
    }
    out
}

/// The shim in an empty root holding only `files` (copied in, mode 0755) and the broker's
/// socket, run as `run` there: it gets the token of a file provider outside.
fn token_in_an_empty_root(files: &[(std::path::PathBuf, &str)], run: &[&str]) {
    let tokens = TokenFiles::new();
    tokens.write("jail", "token-from-outside");
    let root = tempdir();
    let socket = root.path().join("broker.sock");
    let _broker = Broker::start_at(
        &config_yaml(&[file_provider("static", &tokens.template())]),
        &socket,
    );
    for (from, name) in files {
        credbroker_tests::copy_executable(from, &root.path().join(name));
    }
    let entries: Vec<_> = std::fs::read_dir(root.path())
        .expect("read chroot")
        .map(|e| e.expect("dir entry").file_name())
        .collect();
    assert_eq!(
        entries.len(),
        files.len() + 1,
        "the chroot holds only {files:?} and the socket: {entries:?}"
    );
    let info = exec_info(V1, "https://jail.example", json!({"clusterName": "jail"}));
    let mut cmd = run.to_vec();
    cmd.extend(["--provider", "static", "--socket", "/broker.sock"]);
    let out = chroot(root.path(), &cmd, &info);
    let cred = assert_credential(&out, V1);
    assert_eq!(cred.token, "token-from-outside");
}

#[test]
fn shim_runs_in_an_empty_chroot() {
    token_in_an_empty_root(&[(bin(SHIM), SHIM)], &["/credbroker-shim"]);
}

/// The arm64 shim in an empty root beside only the socket and qemu (static too): no libc, no
/// /etc, no /proc of its architecture, and it still gets its token.
#[test]
fn the_arm64_shim_runs_in_an_empty_chroot_under_qemu() {
    let arm64 = credbroker_tests::arch::arm64();
    token_in_an_empty_root(
        &[
            (arm64.binary(SHIM), SHIM),
            (arm64.qemu.clone(), "qemu-aarch64-static"),
        ],
        &["/qemu-aarch64-static", "/credbroker-shim"],
    );
}

#[test]
fn binaries_have_no_program_interpreter() {
    let readelf = require_tool("readelf", "install binutils");
    for name in [BROKER, SHIM] {
        let out = run(
            Command::new(&readelf).arg("-lW").arg(bin(name)),
            COMMAND_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "readelf -l {name}: {}",
            describe(&out)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Program Headers:"),
            "readelf -l {name} printed no program headers: {}",
            describe(&out)
        );
        assert!(
            !text.contains("INTERP") && !text.contains("program interpreter"),
            "{name} is dynamically linked (has a PT_INTERP header):\n{text}"
        );
    }
}
