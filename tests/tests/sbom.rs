//! What is inside the shipped binaries, said two ways, each naming the crates at the versions
//! Cargo.lock pins:
//!
//! - every shipped binary carries its dependency list (cargo-auditable's `.dep-v0` section,
//!   zlib-compressed JSON, which scanners such as Trivy, Grype and Syft read): the amd64 shim
//!   (`--profile shim`) and the arm64 broker and shim (`credbroker_tests::arch`);
//! - the image carries a CycloneDX SBOM of both binaries (`scripts/sbom.sh`, laid out by
//!   `scripts/image-content.sh` at `/usr/share/doc/credbroker/sbom.cdx.json`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use credbroker_tests::doc_blocks::repo_root;
use credbroker_tests::{BROKER, COMMAND_TIMEOUT, SHIM, describe, require_tool, run, tempdir};
use serde_json::Value;

/// A cold build of the size-optimised shim.
const BUILD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// Every (name, version) Cargo.lock pins.
fn locked() -> BTreeSet<(String, String)> {
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).expect("Cargo.lock");
    let mut out = BTreeSet::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            out.insert((n, v.trim_matches('"').to_owned()));
        }
    }
    assert!(out.len() > 100, "Cargo.lock parsed: {} packages", out.len());
    out
}

/// The `.dep-v0` section of `binary`, decompressed: cargo-auditable's package list.
fn audit_data(binary: &Path, objcopy: &str) -> Vec<(String, String, String)> {
    let objcopy = require_tool(
        objcopy,
        "apt-get install binutils (and gcc-aarch64-linux-gnu)",
    );
    let dir = tempdir();
    let section = dir.path().join("dep-v0");
    let out = run(
        Command::new(objcopy)
            .arg("--dump-section")
            .arg(format!(".dep-v0={}", section.display()))
            .arg(binary)
            .arg(dir.path().join("copy")),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success() && section.is_file(),
        "{} has no .dep-v0 section (built without `cargo auditable`?): {}",
        binary.display(),
        describe(&out)
    );
    let out = run(
        Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import sys, zlib; sys.stdout.write(zlib.decompress(open(sys.argv[1], 'rb').read()).decode())",
            ])
            .arg(&section),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "inflate .dep-v0: {}", describe(&out));
    let data: Value = serde_json::from_slice(&out.stdout).expect(".dep-v0 is JSON");
    data["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("").to_owned(),
                p["version"].as_str().unwrap_or("").to_owned(),
                p["kind"].as_str().unwrap_or("runtime").to_owned(),
            )
        })
        .collect()
}

/// Checks a package list: every entry is at its locked version, and `must` are in it.
fn check(what: &str, packages: &[(String, String)], must: &[&str]) {
    let locked = locked();
    for (name, version) in packages {
        assert!(
            locked.contains(&(name.clone(), version.clone())),
            "{what} names {name} {version}, which Cargo.lock does not pin"
        );
    }
    let names: BTreeMap<&str, &str> = packages
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    for m in must {
        assert!(names.contains_key(m), "{what} does not name {m}: {names:?}");
    }
}

fn runtime(packages: Vec<(String, String, String)>) -> Vec<(String, String)> {
    packages
        .into_iter()
        .filter(|(_, _, kind)| kind == "runtime")
        .map(|(n, v, _)| (n, v))
        .collect()
}

/// The amd64 shim as it ships (`cargo auditable build --profile shim`, as scripts/test.sh
/// and scripts/image-content.sh build it).
fn amd64_shim() -> PathBuf {
    let root = repo_root();
    let out = run(
        Command::new("cargo")
            .args([
                "auditable",
                "build",
                "--locked",
                "--profile",
                "shim",
                "-p",
                SHIM,
            ])
            .current_dir(&root),
        BUILD_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "cargo auditable build (install it with `cargo install --locked cargo-auditable`; scripts/test.sh does): {}",
        describe(&out)
    );
    root.join("target/x86_64-unknown-linux-gnu/shim").join(SHIM)
}

#[test]
fn shipped_binaries_carry_their_dependencies_at_the_locked_versions() {
    let shim_crates = [
        "credbroker-shim",
        "credbroker-proto",
        "credbroker-execcred",
        "prost",
    ];
    let shim = runtime(audit_data(&amd64_shim(), "objcopy"));
    check("the amd64 shim's .dep-v0", &shim, &shim_crates);
    assert!(
        !shim
            .iter()
            .any(|(n, _)| n == "aws-config" || n == "credbroker"),
        "no cloud SDK and no broker code in the shim: {shim:?}"
    );
    // No async runtime or HTTP stack is linked either. The dependency list cannot show it:
    // cargo-auditable reads cargo metadata's resolve, which unifies the features the shim's
    // dev-dependencies turn on (credbroker-proto's `transport`, for the tests' tonic server),
    // so it lists tonic. The binary's own panic locations name every crate whose code is in it.
    let bytes = std::fs::read(amd64_shim()).unwrap();
    for crate_path in ["/tokio-1.", "/tonic-0.", "/hyper-1.", "/h2-0.", "/tower-0."] {
        assert!(
            !bytes
                .windows(crate_path.len())
                .any(|w| w == crate_path.as_bytes()),
            "the shim links {crate_path}: it must speak its one call without an async runtime \
             or HTTP stack (shim/src/wire.rs)"
        );
    }
    assert!(
        bytes.windows(18).any(|w| w == b"/library/core/src/"),
        "the check above reads source paths: the standard library's must be there"
    );
    let arm64 = credbroker_tests::arch::arm64();
    let broker = runtime(audit_data(
        &arm64.binary(BROKER),
        "aarch64-linux-gnu-objcopy",
    ));
    check(
        "the arm64 broker's .dep-v0",
        &broker,
        &[
            "credbroker",
            "tonic",
            "tokio",
            "rustls",
            "aws-lc-sys",
            "aws-config",
        ],
    );
    let shim = runtime(audit_data(&arm64.binary(SHIM), "aarch64-linux-gnu-objcopy"));
    check("the arm64 shim's .dep-v0", &shim, &shim_crates);
}

#[test]
fn the_image_sbom_names_both_binaries_dependencies_at_the_locked_versions() {
    let dir = tempdir();
    let sbom = dir.path().join("sbom.cdx.json");
    let out = run(
        Command::new(repo_root().join("scripts/sbom.sh"))
            .arg("--out")
            .arg(&sbom),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "scripts/sbom.sh: {}", describe(&out));
    let doc: Value = serde_json::from_slice(&std::fs::read(&sbom).unwrap()).unwrap();
    assert_eq!(doc["bomFormat"], "CycloneDX", "{doc}");
    assert_eq!(doc["specVersion"], "1.5");
    let components: Vec<(String, String)> = doc["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| {
            let (name, version) = (
                c["name"].as_str().unwrap_or("").to_owned(),
                c["version"].as_str().unwrap_or("").to_owned(),
            );
            assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"), "{c}");
            (name, version)
        })
        .collect();
    check(
        "the SBOM",
        &components,
        &[
            "credbroker",
            "credbroker-shim",
            "tonic",
            "tokio",
            "aws-lc-sys",
            "prost",
        ],
    );
    // What only tests and builds use is not in the binaries.
    for absent in ["proptest", "rcgen", "protox", "tempfile"] {
        assert!(
            !components.iter().any(|(n, _)| n == absent),
            "{absent} is a dev or build dependency, not in the binaries"
        );
    }
    // The same commit, the same file: reproducible images carry it.
    let again = dir.path().join("again.json");
    let out = run(
        Command::new(repo_root().join("scripts/sbom.sh"))
            .arg("--out")
            .arg(&again),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        std::fs::read(&sbom).unwrap(),
        std::fs::read(&again).unwrap()
    );
}
