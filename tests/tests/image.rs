//! `scripts/build-image.sh`: the credbroker image as an OCI archive, built with buildah from
//! `scripts/image-content.sh`'s output on an empty base, then inspected and run.
//!
//! - the archive's config: user 65532, entrypoint `/bin/credbroker`, the sidecar's default
//!   args, linux/amd64, the OCI source/version/revision labels;
//! - its one layer holds exactly the image content (two static binaries, the CA bundle,
//!   `/etc/passwd` and `/etc/group`), owned by root, with the content's modes;
//! - run from the archive (`buildah run --isolation chroot`, the image's own user), the broker
//!   serves a file provider config mounted in, its health check passes, and the shim from the
//!   same image gets a token over the shared socket.
//!
//! - deploy/Containerfile, built with `buildah build` on a local stand-in for its Rust base
//!   (scripts/local-rust-base.sh), holds what build-image.sh's release archive holds.
//!
//! The image is built once per test process from a debug-profile content build (release takes
//! minutes); buildah's storage lives in temp dirs (vfs driver), so nothing is left behind.
//! Needs root and buildah, skopeo (scripts/test.sh installs them).

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use credbroker_tests::{
    BROKER_TIMEOUT, COMMAND_TIMEOUT, Running, V1, assert_credential, describe, exec_info,
    require_tool, run, send_signal, tempdir, wait_until,
};
use serde_json::{Value, json};

/// The image's user (distroless's `nonroot`, Kueue's manager uid).
const NONROOT: &str = "65532:65532";
/// Bound for the content script plus the image build (a cold debug build of both binaries).
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// What the image's root holds: files with their modes (directories aside).
const IMAGE_FILES: [(&str, &str); 6] = [
    ("bin/credbroker", "-rwxr-xr-x"),
    ("etc/group", "-rw-r--r--"),
    ("etc/passwd", "-rw-r--r--"),
    ("etc/ssl/certs/ca-certificates.crt", "-rw-r--r--"),
    ("plugins/bin/credbroker-shim", "-rwxr-xr-x"),
    ("usr/share/doc/credbroker/sbom.cdx.json", "-rw-r--r--"),
];
const SOCKET_IN_IMAGE: &str = "/var/run/credbroker/broker.sock";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

fn buildah_tool() -> PathBuf {
    require_tool(
        "buildah",
        "apt-get install buildah (scripts/test.sh installs it)",
    )
}

/// The OCI archive, built once per test process: the debug content, then build-image.sh.
fn image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        buildah_tool();
        require_tool("readelf", "install binutils");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-test");
        let content = dir.join("content");
        let archive = dir.join("credbroker-image.tar");
        let out = run(
            Command::new(repo().join("scripts/image-content.sh"))
                .args(["--profile", "debug", "--out"])
                .arg(&content),
            BUILD_TIMEOUT,
        );
        assert!(out.status.success(), "image-content.sh: {}", describe(&out));
        let out = run(
            Command::new(repo().join("scripts/build-image.sh"))
                .arg("--content")
                .arg(&content)
                .arg("--out")
                .arg(&archive),
            BUILD_TIMEOUT,
        );
        assert!(out.status.success(), "build-image.sh: {}", describe(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            archive.to_str().expect("UTF-8"),
            "build-image.sh prints the archive's path"
        );
        archive
    })
}

fn skopeo_json(args: &[&str]) -> Value {
    let skopeo = require_tool(
        "skopeo",
        "apt-get install skopeo (scripts/test.sh installs it)",
    );
    let out = run(
        Command::new(skopeo)
            .args(args)
            .arg(format!("oci-archive:{}", image().display())),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "skopeo {args:?}: {}", describe(&out));
    serde_json::from_slice(&out.stdout).expect("skopeo prints JSON")
}

fn git_head() -> String {
    let out = run(
        Command::new("git")
            .arg("-C")
            .arg(repo())
            .args(["rev-parse", "HEAD"]),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "git rev-parse: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn image_config_and_layer_hold_exactly_the_content() {
    let config = skopeo_json(&["inspect", "--config"]);
    let c = &config["config"];
    assert_eq!(config["os"], "linux", "{config}");
    assert_eq!(config["architecture"], "amd64", "{config}");
    assert_eq!(c["User"], NONROOT, "{c}");
    assert_eq!(c["Entrypoint"], json!(["/bin/credbroker"]), "{c}");
    assert_eq!(
        c["Cmd"],
        json!(["serve", "--config", "/etc/credbroker/config.yaml"]),
        "the sidecar's args are the image's default: {c}"
    );
    let labels = &c["Labels"];
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        cargo.contains(&format!(
            "repository = \"{}\"",
            labels["org.opencontainers.image.source"]
                .as_str()
                .expect("source label")
        )),
        "source label is Cargo.toml's repository: {labels}"
    );
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION"),
        "{labels}"
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        git_head(),
        "{labels}"
    );

    // One layer, on no base: its entries are the whole root filesystem.
    let manifest = skopeo_json(&["inspect", "--raw"]);
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(
        layers.len(),
        1,
        "an empty base plus the content: {manifest}"
    );
    let digest = layers[0]["digest"].as_str().expect("digest");
    let blob = format!("blobs/{}", digest.replacen(':', "/", 1));
    let tmp = tempdir();
    let out = run(
        Command::new("tar")
            .arg("-xf")
            .arg(image())
            .arg("-C")
            .arg(tmp.path())
            .arg(&blob),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "extract {blob}: {}", describe(&out));
    let out = run(
        Command::new("tar")
            .args(["-tv", "--numeric-owner", "-f"])
            .arg(tmp.path().join(&blob)),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "list the layer: {}", describe(&out));
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut files = BTreeMap::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mode, owner, name) = (fields[0], fields[1], fields[fields.len() - 1]);
        assert_eq!(owner, "0/0", "owned by root: {line}");
        let name = name.trim_start_matches("./").trim_end_matches('/');
        if !mode.starts_with('d') {
            files.insert(name.to_owned(), mode.to_owned());
        }
    }
    let want: BTreeMap<String, String> = IMAGE_FILES
        .iter()
        .map(|(f, m)| ((*f).to_owned(), (*m).to_owned()))
        .collect();
    assert_eq!(files, want, "the layer:\n{listing}");
}

/// A buildah container of the archive in its own temp storage, removed on drop.
struct Container {
    storage: tempfile::TempDir,
    name: String,
}

impl Container {
    fn from_archive() -> Container {
        let storage = tempdir();
        let mut c = Container {
            storage,
            name: String::new(),
        };
        let out = run(
            c.buildah()
                .args(["from", "--quiet"])
                .arg(format!("oci-archive:{}", image().display())),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "buildah from: {}", describe(&out));
        c.name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        c
    }

    fn buildah(&self) -> Command {
        let mut cmd = Command::new(buildah_tool());
        cmd.arg("--root")
            .arg(self.storage.path().join("root"))
            .arg("--runroot")
            .arg(self.storage.path().join("runroot"))
            .args(["--storage-driver", "vfs"]);
        cmd
    }

    /// `buildah run --isolation chroot` as the image's user, with `mounts` (host, image, options)
    /// and `env`.
    fn run_command(&self, mounts: &[(&Path, &str, &str)], env: &[&str], argv: &[&str]) -> Command {
        let mut cmd = self.buildah();
        cmd.args(["run", "--isolation", "chroot"]);
        for (host, at, opts) in mounts {
            cmd.arg("-v").arg(format!("{}:{at}{opts}", host.display()));
        }
        for e in env {
            cmd.args(["--env", e]);
        }
        cmd.arg(&self.name).arg("--").args(argv);
        cmd
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            let _ = run(self.buildah().arg("rm").arg(&self.name), COMMAND_TIMEOUT);
        }
    }
}

#[test]
fn broker_and_shim_from_the_image_serve_a_token_end_to_end() {
    let ctr = Container::from_archive();
    let dir = tempdir();
    let (config_dir, socket_dir, tokens_dir) = (
        dir.path().join("config"),
        dir.path().join("socket"),
        dir.path().join("tokens"),
    );
    for d in [&config_dir, &socket_dir, &tokens_dir] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    // An emptyDir is world-writable; the broker runs as the image's user, not root.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::write(
        config_dir.join("config.yaml"),
        format!(
            "socket:\n  path: {SOCKET_IN_IMAGE}\nproviders:\n  - name: onprem\n    type: file\n    file:\n      path: \"/tokens/{{clusterName}}\"\n"
        ),
    )
    .expect("write config");
    std::fs::write(tokens_dir.join("lab-1"), "token-served-from-the-image\n").expect("token");

    // The image's ENTRYPOINT and CMD, as the sidecar runs them.
    let socket_mount = (socket_dir.as_path(), "/var/run/credbroker", "");
    let mut broker = Running::spawn(&mut ctr.run_command(
        &[
            (config_dir.as_path(), "/etc/credbroker", ":ro"),
            socket_mount,
            (tokens_dir.as_path(), "/tokens", ":ro"),
        ],
        &[],
        &[
            "/bin/credbroker",
            "serve",
            "--config",
            "/etc/credbroker/config.yaml",
        ],
    ));
    let host_socket = socket_dir.join("broker.sock");
    if !wait_until(BROKER_TIMEOUT, || UnixStream::connect(&host_socket).is_ok()) {
        let out = broker.wait_timeout(Duration::from_secs(1));
        panic!("the broker in the image never listened: {out:?}");
    }
    use std::os::unix::fs::MetadataExt as _;
    let meta = host_socket.metadata().expect("stat socket");
    assert_eq!(
        (meta.uid(), meta.gid()),
        (65532, 65532),
        "the broker runs as the image's user"
    );

    let out = run(
        &mut ctr.run_command(&[socket_mount], &[], &["/bin/credbroker", "health"]),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "health in the image: {}",
        describe(&out)
    );

    let info = exec_info(
        V1,
        "https://k8s.lab-1.example.internal:6443",
        json!({"clusterName": "lab-1"}),
    );
    let env = format!("KUBERNETES_EXEC_INFO={info}");
    let out = run(
        &mut ctr.run_command(
            &[socket_mount],
            &[&env],
            &["/plugins/bin/credbroker-shim", "--provider", "onprem"],
        ),
        COMMAND_TIMEOUT,
    );
    let cred = assert_credential(&out, V1);
    assert_eq!(cred.token, "token-served-from-the-image");

    // buildah passes SIGTERM on to the broker: it stops, and nothing listens any more.
    send_signal(broker.id(), "TERM");
    let out = broker.wait(BROKER_TIMEOUT);
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("credbroker serving"), "{}", describe(&out));
    assert!(
        UnixStream::connect(&host_socket).is_err(),
        "the broker outlived buildah run: {}",
        describe(&out)
    );
}

/// The image index (scripts/build-image-index.sh): linux/amd64 (this test's debug content) and
/// linux/arm64 (the arm64 build, `credbroker_tests::arch`), each manifest's config naming its
/// architecture and its layer holding that architecture's binaries; built twice with one
/// timestamp, the two archives hold the same index, manifests and layers, byte for byte.
#[test]
fn the_image_index_holds_amd64_and_arm64_and_builds_reproducibly() {
    image();
    let arm64 = credbroker_tests::arch::arm64();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-index-test");
    let amd64_content = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-test/content");
    let arm64_content = dir.join("content-arm64");
    let out = run(
        Command::new(repo().join("scripts/image-content.sh"))
            .args(["--arch", "arm64", "--out"])
            .arg(&arm64_content),
        BUILD_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "image-content.sh --arch arm64: {}",
        describe(&out)
    );
    assert_eq!(
        std::fs::read(arm64_content.join("bin/credbroker")).unwrap(),
        std::fs::read(arm64.binary(credbroker_tests::BROKER)).unwrap(),
        "the arm64 content is the cross build"
    );
    let build = |name: &str| {
        let archive = dir.join(name);
        let out = run(
            Command::new(repo().join("scripts/build-image-index.sh"))
                .arg("--content-amd64")
                .arg(&amd64_content)
                .arg("--content-arm64")
                .arg(&arm64_content)
                .args(["--timestamp", "1700000000", "--out"])
                .arg(&archive),
            BUILD_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "build-image-index.sh: {}",
            describe(&out)
        );
        archive
    };
    let (first, second) = (build("first.tar"), build("second.tar"));
    let skopeo = require_tool("skopeo", "apt-get install skopeo");
    let inspect = |archive: &Path, args: &[&str]| -> Value {
        let out = run(
            Command::new(&skopeo)
                .args(args)
                .arg(format!("oci-archive:{}", archive.display())),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "skopeo {args:?}: {}", describe(&out));
        serde_json::from_slice(&out.stdout).expect("skopeo prints JSON")
    };
    let index = inspect(&first, &["inspect", "--raw"]);
    assert_eq!(
        index["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{index}"
    );
    let platforms: Vec<(String, String)> = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .map(|m| {
            (
                m["platform"]["os"].as_str().unwrap_or("").to_owned(),
                m["platform"]["architecture"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("linux".to_owned(), "amd64".to_owned()),
            ("linux".to_owned(), "arm64".to_owned())
        ],
        "{index}"
    );
    for arch in ["amd64", "arm64"] {
        let config = inspect(&first, &["--override-arch", arch, "inspect", "--config"]);
        assert_eq!(config["architecture"], arch, "{config}");
        assert_eq!(config["os"], "linux", "{config}");
        assert_eq!(config["config"]["User"], NONROOT, "{config}");
    }
    // Reproducible: the same index (hence the same manifests, configs and layers).
    assert_eq!(
        index,
        inspect(&second, &["inspect", "--raw"]),
        "two builds of one commit with one timestamp"
    );
    let layers = |archive: &Path, arch: &str| {
        inspect(archive, &["--override-arch", arch, "inspect", "--raw"])["layers"].clone()
    };
    for arch in ["amd64", "arm64"] {
        assert_eq!(layers(&first, arch), layers(&second, arch), "{arch} layers");
    }
}

// ---------------------------------------------------------------------------------------
// deploy/Containerfile, built the documented way
// ---------------------------------------------------------------------------------------

/// One creation time for both builds of the comparison (build-image.sh's `--timestamp`,
/// `buildah build --timestamp`): every file's mtime and the config's `created`.
const COMPARE_TIMESTAMP: &str = "1700000000";
/// Bound for a cold Containerfile build: the local base (Debian's packages, about 3 min), then
/// cargo-auditable and the release broker and shim compiled in the container (measured at
/// about 15 min on a busy 2-core machine).
const CONTAINERFILE_TIMEOUT: Duration = Duration::from_secs(45 * 60);
/// The build stage's base in the tests' storage (scripts/local-rust-base.sh's OCI layout,
/// copied in by skopeo: `FROM oci:PATH` would name the image after its path, which buildah
/// refuses for a path with a dot in it, such as ~/.cache).
const LOCAL_BASE: &str = "localhost/credbroker-rust-base";
const CONTAINERFILE_TAG: &str = "localhost/credbroker:containerfile";

/// `CREDBROKER_IMAGE_CACHE`, else ~/.cache/credbroker-image: the local base
/// (scripts/local-rust-base.sh) and buildah's cache mounts (its TMPDIR), kept between runs as
/// a CI cache would keep them.
fn image_cache() -> PathBuf {
    std::env::var_os("CREDBROKER_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/credbroker-image")
        })
}

/// buildah storage (overlay: the 1.2 GB base is not copied per container as vfs would) in a
/// temp dir; its images and mounts are removed on drop.
struct Storage {
    dir: tempfile::TempDir,
}

impl Storage {
    fn new() -> Storage {
        Storage {
            dir: tempfile::Builder::new()
                .prefix("credbroker-containerfile-")
                .tempdir_in(Path::new(env!("CARGO_TARGET_TMPDIR")))
                .expect("temp dir"),
        }
    }

    fn spec(&self) -> String {
        format!(
            "[overlay@{}+{}]",
            self.dir.path().join("root").display(),
            self.dir.path().join("runroot").display()
        )
    }

    fn buildah(&self) -> Command {
        let mut cmd = Command::new(buildah_tool());
        cmd.arg("--root")
            .arg(self.dir.path().join("root"))
            .arg("--runroot")
            .arg(self.dir.path().join("runroot"))
            .args(["--storage-driver", "overlay"]);
        cmd
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let _ = run(self.buildah().args(["rm", "--all"]), COMMAND_TIMEOUT);
        let _ = run(
            self.buildah().args(["rmi", "--all", "--force"]),
            COMMAND_TIMEOUT,
        );
        // The overlay driver leaves its home mounted on itself.
        let _ = run(
            Command::new("umount")
                .arg("--recursive")
                .arg("--lazy")
                .arg(self.dir.path().join("root/overlay")),
            COMMAND_TIMEOUT,
        );
    }
}

/// What an OCI archive's one layer holds: for each entry, its `tar -tv` line (type, mode,
/// owner, size, mtime, name) and, for files, the SHA-256 of its bytes.
fn layer_entries(archive: &Path) -> (Value, BTreeMap<String, String>) {
    let skopeo = require_tool("skopeo", "apt-get install skopeo");
    let out = run(
        Command::new(&skopeo)
            .args(["inspect", "--raw"])
            .arg(format!("oci-archive:{}", archive.display())),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "skopeo inspect: {}", describe(&out));
    let manifest: Value = serde_json::from_slice(&out.stdout).expect("manifest JSON");
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "{}: {manifest}", archive.display());
    let blob = format!(
        "blobs/{}",
        layers[0]["digest"]
            .as_str()
            .expect("digest")
            .replacen(':', "/", 1)
    );
    let tmp = tempdir();
    let out = run(
        Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(tmp.path())
            .arg(&blob),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "extract {blob}: {}", describe(&out));
    let layer = tmp.path().join(&blob);
    let listing = out_stdout_of(&layer);
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).expect("mkdir");
    let out = run(
        Command::new("tar")
            .arg("-xf")
            .arg(&layer)
            .arg("-C")
            .arg(&root),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "unpack the layer: {}", describe(&out));
    let mut entries = BTreeMap::new();
    for line in String::from_utf8_lossy(&listing).lines() {
        let name = line
            .split_whitespace()
            .last()
            .expect("a name")
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        let mut entry = line.split_whitespace().collect::<Vec<_>>().join(" ");
        let path = root.join(&name);
        if path.is_file() {
            let out = run(Command::new("sha256sum").arg(&path), COMMAND_TIMEOUT);
            assert!(out.status.success(), "sha256sum: {}", describe(&out));
            let sum = String::from_utf8_lossy(&out.stdout);
            entry.push_str(" sha256:");
            entry.push_str(sum.split_whitespace().next().expect("a digest"));
        }
        entries.insert(name, entry);
    }
    (manifest, entries)
}

/// `tar -tv` of a layer blob, as [`layer_entries`] reads it.
fn out_stdout_of(layer: &Path) -> Vec<u8> {
    let out = run(
        Command::new("tar")
            .args(["-tv", "--numeric-owner", "--full-time", "-f"])
            .arg(layer),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "list the layer: {}", describe(&out));
    out.stdout
}

/// deploy/Containerfile, built as docs/deploy.md section 1 says (`docker build -f
/// deploy/Containerfile ...` from the repository root), with buildah instead of Docker and the
/// local stand-in for `rust:1-bookworm` (scripts/local-rust-base.sh) as its build base; then
/// compared with scripts/build-image.sh's archive of the same commit and timestamp, both with
/// the release profile (what ships): the same config (user, entrypoint, args, working dir,
/// labels, platform, creation time) and the same one layer, entry for entry (type, mode,
/// owner, size, mtime, name, and each file's SHA-256), the two binaries aside: those are
/// compared by place, mode, owner and mtime, and must name no build path (their bytes differ,
/// docs/deploy.md "What the tests check" says why).
/// The Containerfile without its tools (jq, binutils, cargo-auditable) fails here: the base,
/// like the official image, has no cargo-auditable and no jq.
#[test]
fn containerfile_built_with_buildah_is_the_image_build_image_sh_builds() {
    let skopeo = require_tool(
        "skopeo",
        "apt-get install skopeo (scripts/test.sh installs it)",
    );
    buildah_tool();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("containerfile-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let revision = git_head();

    // scripts/build-image.sh on release content built on this machine.
    let out = run(
        Command::new(repo().join("scripts/image-content.sh")).args(["--profile", "release"]),
        BUILD_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "image-content.sh --profile release: {}",
        describe(&out)
    );
    let scripted = dir.join("build-image.tar");
    let out = run(
        Command::new(repo().join("scripts/build-image.sh"))
            .arg("--content")
            .arg(repo().join("target/image-content"))
            .args(["--timestamp", COMPARE_TIMESTAMP])
            .args(["--revision", &revision, "--out"])
            .arg(&scripted),
        BUILD_TIMEOUT,
    );
    assert!(out.status.success(), "build-image.sh: {}", describe(&out));

    // The base: built once, cached by Debian release, Rust version and the script's digest.
    let out = run(
        &mut Command::new(repo().join("scripts/local-rust-base.sh")),
        CONTAINERFILE_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "local-rust-base.sh: {}",
        describe(&out)
    );
    let base_ref = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let key = base_ref
        .rsplit('/')
        .next()
        .and_then(|name| name.strip_prefix("rust-base-"))
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("local-rust-base.sh printed {base_ref:?}"))
        .to_owned();
    let base = format!("{LOCAL_BASE}:{key}");
    let storage = Storage::new();
    let out = run(
        Command::new(&skopeo)
            .args(["copy", "--quiet", &base_ref])
            .arg(format!("containers-storage:{}{base}", storage.spec())),
        CONTAINERFILE_TIMEOUT,
    );
    assert!(out.status.success(), "load the base: {}", describe(&out));
    // Like the official image, the base lacks what the scripts need beyond Rust: the
    // Containerfile installs it (an older Containerfile that did not failed on this base).
    let out = run(
        storage
            .buildah()
            .args(["run", "--isolation", "chroot"])
            .arg(
                String::from_utf8_lossy(
                    &run(
                        storage
                            .buildah()
                            .args(["from", "--quiet", "--pull-never", &base]),
                        COMMAND_TIMEOUT,
                    )
                    .stdout,
                )
                .trim(),
            )
            .args(["--", "sh", "-c"])
            .arg("cargo --version && ! command -v jq && ! cargo auditable --version"),
        COMMAND_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "the base has cargo, and neither jq nor cargo-auditable: {}",
        describe(&out)
    );

    // The documented build: the repository root as context, the Containerfile's own steps.
    // - TMPDIR: where buildah keeps the cache mounts (crates.io downloads, compiled crates).
    // - --ignorefile: Docker reads deploy/Containerfile.dockerignore by itself; buildah 1.28
    //   needs it named.
    // - -v the CA bundle: crates.io is reached through this machine's TLS proxy, whose CA is
    //   in this machine's bundle only; it is also what image-content.sh ships, as on the host.
    let tmp = image_cache().join("buildah-tmp");
    std::fs::create_dir_all(&tmp).expect("mkdir cache");
    let version = env!("CARGO_PKG_VERSION");
    let out = run(
        storage
            .buildah()
            .env("TMPDIR", &tmp)
            .args(["build", "--isolation", "chroot", "--pull-never"])
            .args(["--timestamp", COMPARE_TIMESTAMP])
            .args(["--ignorefile", "deploy/Containerfile.dockerignore"])
            .args([
                "-v",
                "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
            ])
            .args(["-f", "deploy/Containerfile", "-t", CONTAINERFILE_TAG])
            .args(["--build-arg", &format!("RUST_IMAGE={base}")])
            .args(["--build-arg", &format!("VERSION={version}")])
            .args(["--build-arg", &format!("REVISION={revision}")])
            .arg(".")
            .current_dir(repo()),
        CONTAINERFILE_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "buildah build -f deploy/Containerfile: {}",
        describe(&out)
    );
    let built = dir.join("containerfile.tar");
    let out = run(
        storage
            .buildah()
            .args(["push", "--quiet", CONTAINERFILE_TAG])
            .arg(format!("oci-archive:{}", built.display())),
        COMMAND_TIMEOUT,
    );
    assert!(out.status.success(), "buildah push: {}", describe(&out));

    // The config: everything but the history (one entry per Containerfile step there, one
    // `buildah commit` in the script's), buildah's own version label and the layer digest.
    let config = |archive: &Path| -> Value {
        let out = run(
            Command::new(&skopeo)
                .args(["inspect", "--config"])
                .arg(format!("oci-archive:{}", archive.display())),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "skopeo inspect: {}", describe(&out));
        let mut c: Value = serde_json::from_slice(&out.stdout).expect("config JSON");
        let o = c.as_object_mut().expect("object");
        o.remove("history");
        // The layer's digest: its binaries' bytes differ (below).
        o.remove("rootfs");
        if let Some(labels) = c["config"]["Labels"].as_object_mut() {
            labels.remove("io.buildah.version");
        }
        c
    };
    let (want, got) = (config(&scripted), config(&built));
    assert_eq!(
        got, want,
        "deploy/Containerfile's config (left) against build-image.sh's (right)"
    );

    let (_, scripted_layer) = layer_entries(&scripted);
    let (_, built_layer) = layer_entries(&built);
    // The binaries: where they sit, mode, owner and mtime, not their bytes. Both builds map
    // their paths to the same names (no checkout, target or CARGO_HOME path is left, checked
    // below), but cargo gives the workspace's own crates another `-C metadata` in each (see
    // docs/deploy.md, "What the tests check"), so symbol hashes and layout differ.
    let comparable = |name: &str, entry: &str| -> String {
        if BINARIES.contains(&name) {
            let f: Vec<&str> = entry.split_whitespace().collect();
            format!("{} {} {} {} {}", f[0], f[1], f[3], f[4], f[5])
        } else {
            entry.to_owned()
        }
    };
    let differing: Vec<String> = scripted_layer
        .keys()
        .chain(built_layer.keys())
        .filter(|name| {
            scripted_layer.get(*name).map(|e| comparable(name, e))
                != built_layer.get(*name).map(|e| comparable(name, e))
        })
        .map(|name| {
            format!(
                "{name}:\n  Containerfile:   {}\n  build-image.sh:  {}",
                built_layer.get(name).map_or("(none)", String::as_str),
                scripted_layer.get(name).map_or("(none)", String::as_str)
            )
        })
        .collect();
    assert!(
        differing.is_empty(),
        "the two layers differ:\n{}",
        differing.join("\n")
    );
    let home = std::env::var("HOME").expect("HOME");
    let root = repo().display().to_string();
    let build_paths = [
        root.as_str(),
        "/src/broker/src/",
        "/src/shim/src/",
        "/usr/local/cargo",
        &format!("{home}/.cargo"),
    ];
    for (archive, what) in [(&scripted, "build-image.sh"), (&built, "Containerfile")] {
        let tmp = tempdir();
        let out = run(
            Command::new("tar")
                .arg("-xf")
                .arg(archive)
                .arg("-C")
                .arg(tmp.path()),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "unpack: {}", describe(&out));
        let (manifest, _) = layer_entries(archive);
        let blob = tmp.path().join(format!(
            "blobs/{}",
            manifest["layers"][0]["digest"]
                .as_str()
                .expect("digest")
                .replacen(':', "/", 1)
        ));
        let rootfs = tmp.path().join("rootfs");
        std::fs::create_dir(&rootfs).expect("mkdir");
        let out = run(
            Command::new("tar")
                .arg("-xf")
                .arg(&blob)
                .arg("-C")
                .arg(&rootfs),
            COMMAND_TIMEOUT,
        );
        assert!(out.status.success(), "unpack the layer: {}", describe(&out));
        for bin in BINARIES {
            let bytes = std::fs::read(rootfs.join(bin)).expect("read binary");
            for path in build_paths {
                assert!(
                    !bytes.windows(path.len()).any(|w| w == path.as_bytes()),
                    "{what}'s {bin} names the build path {path}"
                );
            }
        }
    }
}

/// The image's binaries (compared by place, not by bytes: see the Containerfile test).
const BINARIES: [&str; 2] = ["bin/credbroker", "plugins/bin/credbroker-shim"];
