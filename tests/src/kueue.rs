//! Kueue's own manifests, at the versions the real-cluster suite runs (`e2e/peers.sh`), so the
//! deploy and docs tests render every overlay over Kueue's real `config/default` instead of a
//! stand-in: Kueue's ports, volumes, ServiceAccount and RBAC are then what a user's cluster has.
//!
//! `e2e/peers.sh` downloads the `sigs.k8s.io/kueue` modules through the Go module proxy and
//! writes their directories into `peers.env`; `scripts/test.sh` runs it before `cargo test`.
//! A missing file or directory fails the test, naming the command that provides it: a test is
//! never skipped for a missing peer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The Kueue versions the real-cluster suite verifies (e2e/peers.sh `KUEUE_VERSIONS`).
pub const KUEUE_VERSIONS: [&str; 2] = ["v0.19.2", "v0.17.0"];
/// The Kueue release `deploy/kueue/kueue-install` names, and whose default configuration
/// `deploy/kueue/components/kueue-config` carries.
pub const SHIPPED_KUEUE_VERSION: &str = "v0.19.2";

/// `${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e}/peers.env`, as
/// e2e/peers.sh and e2e/harness/peers.go spell it.
pub fn peers_env_path() -> PathBuf {
    if let Some(dir) = std::env::var_os("CREDBROKER_E2E_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("peers.env");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache")
        });
    cache.join("credbroker-e2e").join("peers.env")
}

/// The `KEY=value` lines of peers.env.
pub fn peers_env() -> BTreeMap<String, String> {
    let path = peers_env_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. These tests render deploy/ over Kueue's own manifests, which e2e/peers.sh \
             downloads (scripts/test.sh runs it first): run e2e/peers.sh",
            path.display()
        )
    });
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The `sigs.k8s.io/kueue` module directory of `version` (`v0.19.2`), with its
/// `config/default`.
pub fn kueue_dir(version: &str) -> PathBuf {
    let key = format!(
        "KUEUE_{}_DIR",
        version.trim_start_matches('v').replace('.', "_")
    );
    let env = peers_env();
    let dir = PathBuf::from(env.get(&key).unwrap_or_else(|| {
        panic!(
            "{} has no {key}: run e2e/peers.sh (it lists Kueue {version})",
            peers_env_path().display()
        )
    }));
    let default = dir.join("config/default/kustomization.yaml");
    assert!(
        default.is_file(),
        "{} is missing ({key} in {}): run e2e/peers.sh",
        default.display(),
        peers_env_path().display()
    );
    dir
}

/// `to` relative to the directory `from` (kustomize refuses absolute paths in `resources:`).
/// Both are resolved first, since kustomize resolves `..` on the real path.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().expect("the directory exists");
    let to = to.canonicalize().expect("the target exists");
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut rel = PathBuf::new();
    for _ in from.components().skip(common) {
        rel.push("..");
    }
    for part in to.components().skip(common) {
        rel.push(part);
    }
    rel
}

/// A copy of the repository's `deploy/` at `root/deploy` in which `kueue/kueue-install`
/// is Kueue's `config/default` of `version` (from the module cache) instead of the release
/// URL the shipped file names: what `kubectl kustomize deploy/…` renders for a user of that
/// Kueue release, offline. Anything already at `root` is removed first.
pub fn deploy_over_kueue(repo: &Path, root: &Path, version: &str) -> PathBuf {
    let kueue = kueue_dir(version);
    if root.exists() {
        std::fs::remove_dir_all(root).unwrap_or_else(|e| panic!("remove {}: {e}", root.display()));
    }
    copy_tree(&repo.join("deploy"), &root.join("deploy"));
    let install = root.join("deploy/kueue/kueue-install");
    let default = relative_path(&install, &kueue.join("config/default"));
    std::fs::write(
        install.join("kustomization.yaml"),
        format!(
            "# tests: Kueue {version}'s config/default from the Go module cache, in place of \
             its release manifest\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: \
             Kustomization\nresources:\n  - {}\n",
            default.display()
        ),
    )
    .expect("write kueue-install");
    root.to_path_buf()
}

/// Copies the directory tree `from` to `to` (regular files and directories only).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("mkdir {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.expect("dir entry");
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
        }
    }
}

/// The `kueue` manager binary of `version`, built by e2e/peers.sh from that release's module.
pub fn kueue_bin(version: &str) -> PathBuf {
    let key = format!(
        "KUEUE_{}",
        version.trim_start_matches('v').replace('.', "_")
    );
    let env = peers_env();
    let bin = PathBuf::from(env.get(&key).unwrap_or_else(|| {
        panic!(
            "{} has no {key}: run e2e/peers.sh (it builds Kueue {version})",
            peers_env_path().display()
        )
    }));
    assert!(
        bin.is_file(),
        "{} is missing ({key} in {}): run e2e/peers.sh",
        bin.display(),
        peers_env_path().display()
    );
    bin
}

/// What Kueue's manager made of a configuration file at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigVerdict {
    /// It loaded the file (strict decoding, defaulting and validation passed): the manager
    /// logged "Initializing" and went on to connect to its API server.
    Loaded,
    /// It stopped at start: "Unable to load the configuration" (or a later configuration
    /// check), with the log line.
    Refused(String),
}

/// How long Kueue's manager may take to read its configuration and log either verdict.
const KUEUE_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts Kueue `version`'s manager with `--config FILE`, exactly as its Deployment does, and
/// reports whether it loaded the file. Kueue reads the file before anything else; its API
/// server here is a loopback address nothing listens on (127.0.0.1:1), so a manager that got
/// past its configuration fails to connect and is stopped. Nothing is left running.
pub fn kueue_loads_config(version: &str, config_yaml: &str, scratch: &Path) -> ConfigVerdict {
    use std::process::{Command, Stdio};
    std::fs::create_dir_all(scratch).expect("mkdir scratch");
    let config = scratch.join("controller_manager_config.yaml");
    std::fs::write(&config, config_yaml).expect("write the Kueue config");
    let kubeconfig = scratch.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n",
    )
    .expect("write kubeconfig");
    let log = scratch.join("kueue.log");
    let file = std::fs::File::create(&log).expect("create the log");
    let mut child = Command::new(kueue_bin(version))
        .arg(format!("--config={}", config.display()))
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup the log"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("start Kueue {version}: {e}"));
    let deadline = std::time::Instant::now() + KUEUE_START_TIMEOUT;
    let verdict = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| {
            l.contains("Unable to load the configuration")
                || l.contains("conflicting feature gates")
                || l.contains("Unable to set flag gates")
        }) {
            break Some(ConfigVerdict::Refused(line.to_owned()));
        }
        if text.contains("\"Initializing\"") || text.contains("Initializing") {
            break Some(ConfigVerdict::Loaded);
        }
        let exited = child.try_wait().expect("try_wait on Kueue").is_some();
        if exited || std::time::Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    verdict.unwrap_or_else(|| {
        panic!(
            "Kueue {version} neither loaded nor refused its configuration within \
             {KUEUE_START_TIMEOUT:?} (or exited without saying):\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    })
}
