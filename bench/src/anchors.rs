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
