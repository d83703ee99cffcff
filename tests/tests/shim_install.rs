//! `credbroker-shim install DIR`, the built binary: it copies itself (what `/proc/self/exe`
//! names, whatever path ran it), replaces an earlier copy, and fails by the shim's contract
//! (exit 1, empty stdout, one stderr line naming the path) without leaving anything in DIR.
//! The init container's use of it is in `tests/tests/deploy.rs`.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use credbroker_tests::{COMMAND_TIMEOUT, SHIM, assert_shim_error, bin, describe, run, tempdir};

/// The uid of Kueue's manager image and the init container (`runAsUser: 65532`).
const NONROOT: u32 = 65532;

fn shim(args: &[&Path]) -> Output {
    run(
        Command::new(bin(SHIM)).args(args).env_clear(),
        COMMAND_TIMEOUT,
    )
}

fn install(dir: &Path) -> Output {
    shim(&[Path::new("install"), dir])
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn installs_itself_then_replaces_its_earlier_copy() {
    let tmp = tempdir();
    let dest = tmp.path().join("credbroker-shim");
    let out = install(tmp.path());
    assert!(out.status.success(), "{}", describe(&out));
    let size = std::fs::metadata(bin(SHIM)).expect("stat").len();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "credbroker-shim: installed {} ({size} bytes)\n",
            dest.display()
        )
    );
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert_eq!(
        std::fs::read(&dest).expect("installed"),
        std::fs::read(bin(SHIM)).expect("built")
    );
    assert_eq!(dest.metadata().expect("stat").mode() & 0o7777, 0o755);
    assert_eq!(entries(tmp.path()), ["credbroker-shim"]);

    // The copy runs, and installs itself over itself: nothing to do.
    let out = run(Command::new(&dest).arg("--version"), COMMAND_TIMEOUT);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("credbroker-shim "),
        "{}",
        describe(&out)
    );
    let out = run(
        Command::new(&dest).arg("install").arg(tmp.path()),
        COMMAND_TIMEOUT,
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is this executable already"),
        "{}",
        describe(&out)
    );

    // The built shim again: an earlier copy (another inode), replaced.
    let before = dest.metadata().expect("stat").ino();
    let out = install(tmp.path());
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).starts_with("credbroker-shim: replaced "),
        "{}",
        describe(&out)
    );
    assert_ne!(dest.metadata().expect("stat").ino(), before, "renamed over");
    assert_eq!(entries(tmp.path()), ["credbroker-shim"]);

    let out = shim(&[
        Path::new("install"),
        tmp.path(),
        Path::new("--name"),
        Path::new("other"),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(entries(tmp.path()), ["credbroker-shim", "other"]);
}

#[test]
fn refusals_follow_the_one_line_contract() {
    let tmp = tempdir();
    let missing = tmp.path().join("missing");
    let line = assert_shim_error(
        &install(&missing),
        &["cannot install into", "no such directory"],
    );
    assert!(line.contains(&missing.display().to_string()), "{line}");

    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    assert_shim_error(&install(&file), &["cannot install into", "not a directory"]);

    let dir = tmp.path().join("dir");
    std::fs::create_dir(&dir).expect("mkdir");
    let dest = dir.join("credbroker-shim");
    std::fs::write(&dest, "#!/bin/sh\n").expect("write");
    let line = assert_shim_error(
        &install(&dir),
        &["refusing to replace", "not an earlier credbroker-shim"],
    );
    assert!(line.contains(&dest.display().to_string()), "{line}");
    assert_eq!(std::fs::read_to_string(&dest).expect("kept"), "#!/bin/sh\n");
    assert_eq!(entries(&dir), ["credbroker-shim"]);

    assert_shim_error(
        &shim(&[Path::new("install")]),
        &["invalid arguments", "install needs DIR"],
    );
}

/// A DIR this user cannot write: the init container as uid 65532 on a volume it may not
/// write (run as that uid when the tests run as root, as scripts/test.sh does).
#[test]
fn an_unwritable_dir_is_one_line_and_leaves_nothing() {
    let tmp = tempdir();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // The shim where uid 65532 can reach it.
    let copy = tmp.path().join("credbroker-shim");
    credbroker_tests::copy_executable(&bin(SHIM), &copy);
    let dir: PathBuf = tmp.path().join("read-only");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let mut command = Command::new(&copy);
    command.arg("install").arg(&dir).env_clear();
    let root = std::fs::metadata("/proc/self").expect("/proc/self").uid() == 0;
    if root {
        command.uid(NONROOT).gid(NONROOT);
    }
    let out = run(&mut command, COMMAND_TIMEOUT);
    let line = assert_shim_error(
        &out,
        &["cannot install into", "Permission denied", "writable"],
    );
    assert!(line.contains(&dir.display().to_string()), "{line}");
    assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
}

/// A DIR on a read-only filesystem (a volume mounted `readOnly`): a private tmpfs mounted
/// read-only in a mount namespace of its own (`unshare`, as root). Where that is not permitted
/// the EACCES case above stands for it.
#[test]
fn a_read_only_filesystem_is_one_line() {
    let tmp = tempdir();
    let dir = tmp.path().join("ro");
    std::fs::create_dir(&dir).expect("mkdir");
    let out = run(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount -t tmpfs -o ro tmpfs "$1" || exit 99; exec "$2" install "$1""#)
            .arg("sh")
            .arg(&dir)
            .arg(bin(SHIM))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        COMMAND_TIMEOUT,
    );
    if out.status.code() == Some(99) || String::from_utf8_lossy(&out.stderr).contains("unshare:") {
        eprintln!("no private read-only mount here: {}", describe(&out));
        return;
    }
    assert_shim_error(
        &out,
        &["cannot install into", "Read-only file system", "writable"],
    );
}

/// client-go runs the shim with flags first: a provider named "install" is a normal run.
#[test]
fn a_provider_named_install_is_not_the_subcommand() {
    let tmp = tempdir();
    let socket = tmp.path().join("none.sock");
    let out = run(
        Command::new(bin(SHIM))
            .args(["--provider", "install", "--socket"])
            .arg(&socket)
            .env_clear(),
        COMMAND_TIMEOUT,
    );
    assert_shim_error(&out, &["cannot connect to the broker"]);
    assert!(entries(tmp.path()).is_empty());
}
