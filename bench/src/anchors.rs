//! The exec plugins users run today, measured next to the shim: `aws eks get-token` and
//! `gke-gcloud-auth-plugin`, found on `PATH` and run in a cleared environment.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bench::{AWS_KEY, AWS_SECRET, REGION};

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// The AWS CLI, past a pyenv shim (a bash script that would add its own start-up to every
/// run: users run the CLI itself).
pub fn find_aws() -> Option<PathBuf> {
    let aws = which("aws")?;
    if aws.to_string_lossy().contains("/.pyenv/shims/") {
        let out = Command::new("pyenv").args(["which", "aws"]).output().ok()?;
        let real = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() && !real.is_empty() {
            return Some(PathBuf::from(real));
        }
    }
    Some(aws)
}

/// `aws eks get-token` for `cluster` with the fake static keys and nothing else from the
/// environment (`HOME` is `home`, no config or credentials file, no instance metadata).
pub fn aws_eks_get_token(aws: &Path, home: &Path, cluster: &str) -> Command {
    let mut c = Command::new(aws);
    c.args([
        "eks",
        "get-token",
        "--cluster-name",
        cluster,
        "--region",
        REGION,
    ])
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
    .env("HOME", home)
    .env("AWS_ACCESS_KEY_ID", AWS_KEY)
    .env("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    .env("AWS_CONFIG_FILE", home.join("none"))
    .env("AWS_SHARED_CREDENTIALS_FILE", home.join("none"))
    .env("AWS_EC2_METADATA_DISABLED", "true");
    c
}

/// gke-gcloud-auth-plugin's own cache (`~/.kube/gke_gcloud_auth_plugin_cache`): it answers
/// from it without gcloud when the kubeconfig's current context matches the cached one and
/// the token has not expired.
pub fn gke_cache(home: &Path) {
    let kube = home.join(".kube");
    std::fs::create_dir_all(&kube).expect("kube dir");
    std::fs::write(
        kube.join("config"),
        "apiVersion: v1\nkind: Config\ncurrent-context: gke_bench_us-central1_c1\ncontexts:\n- name: gke_bench_us-central1_c1\n  context: {cluster: c1, user: u1}\nclusters:\n- name: c1\n  cluster: {server: \"https://192.0.2.1\"}\nusers:\n- name: u1\n  user: {}\n",
    )
    .expect("kubeconfig");
    let expiry = time::OffsetDateTime::now_utc() + Duration::from_secs(3600);
    let expiry = expiry
        .replace_nanosecond(0)
        .expect("nanos")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format");
    std::fs::write(
        kube.join("gke_gcloud_auth_plugin_cache"),
        serde_json::json!({"current_context": "gke_bench_us-central1_c1", "access_token": "ya29.bench-cached", "token_expiry": expiry, "extra_args": ""}).to_string(),
    )
    .expect("gke cache");
}

/// The anchors e2e/anchors.sh built, from its `anchors.env` (`KEY=path` lines).
#[derive(Debug, Default, Clone)]
pub struct Built {
    /// Where the file was looked for, for the report's "not built" cells.
    pub env_file: PathBuf,
    pub aws_iam_authenticator: Option<(PathBuf, String)>,
    pub kubelogin: Option<(PathBuf, String)>,
    pub secretreader: Option<(PathBuf, String)>,
    pub gke: Option<PathBuf>,
    /// e2e/cmd/fleet: the client-go fleet.
    pub fleet: Option<PathBuf>,
}

/// e2e/anchors.sh's cache: `${CREDBROKER_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/credbroker-e2e}`.
pub fn e2e_cache() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("CREDBROKER_E2E_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("credbroker-e2e")))
        .unwrap_or_else(|| {
            var("HOME")
                .unwrap_or_default()
                .join(".cache/credbroker-e2e")
        })
}

impl Built {
    /// Reads `file` (default: `anchors.env` in [`e2e_cache`]); a missing file or binary is
    /// `None`, never a build: the bench only measures what is built.
    pub fn load(file: Option<&Path>) -> Built {
        let env_file = file.map_or_else(|| e2e_cache().join("anchors.env"), Path::to_path_buf);
        let text = std::fs::read_to_string(&env_file).unwrap_or_default();
        let kv: std::collections::BTreeMap<&str, &str> =
            text.lines().filter_map(|l| l.split_once('=')).collect();
        let bin = |k: &str| kv.get(k).map(PathBuf::from).filter(|p| p.is_file());
        let versioned = |k: &str| {
            bin(k).map(|p| {
                let v = kv
                    .get(format!("{k}_VERSION").as_str())
                    .copied()
                    .unwrap_or("");
                (p, v.to_owned())
            })
        };
        Built {
            aws_iam_authenticator: versioned("AWS_IAM_AUTHENTICATOR"),
            kubelogin: versioned("KUBELOGIN"),
            secretreader: versioned("SECRETREADER"),
            gke: bin("GKE_GCLOUD_AUTH_PLUGIN").or_else(|| which("gke-gcloud-auth-plugin")),
            fleet: bin("FLEET"),
            env_file,
        }
    }
}
