//! What the broker's `exec` and `file` providers read: a counting kubeconfig exec plugin
//! and per-cluster token files. [`modal_plugin`](crate::modal_plugin) holds the plugin
//! whose behaviour changes while the broker runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::process::python3;
use crate::{V1, sh_quote, tempdir, wait_until};

/// Behaviour of the test exec plugin.
#[derive(Debug, Clone, Default)]
pub struct PluginOptions {
    /// Sleep this long before answering.
    pub sleep: Duration,
    /// Print `expirationTimestamp` = now + this; `None` leaves it out (broker's defaultLifetime).
    pub expires_in: Option<Duration>,
    /// Fail: print these lines on stderr and exit 3.
    pub fail_with: Option<Vec<String>>,
    /// Hang: start a background `sleep 60` (its pid saved, see [`ExecPlugin::child_pid`])
    /// and wait for it, never answering.
    pub hang: bool,
}

/// A `/bin/sh` kubeconfig exec plugin in its own temp dir. Each run appends a line to
/// `count`, saves `KUBERNETES_EXEC_INFO` to `info-<run>.json`, its arguments to
/// `args-<run>` and its environment to `env-<run>`, optionally sleeps, and prints
/// an ExecCredential (same apiVersion as it received) with token
/// `tok-<spec.cluster.config.clusterName or "none">-<run>`.
#[derive(Debug)]
pub struct ExecPlugin {
    dir: TempDir,
    command: PathBuf,
}

impl ExecPlugin {
    /// A plugin that answers at once with a one-hour token.
    pub fn new() -> ExecPlugin {
        ExecPlugin::with(PluginOptions {
            expires_in: Some(Duration::from_secs(3600)),
            ..PluginOptions::default()
        })
    }

    /// A plugin with the given behaviour.
    pub fn with(opts: PluginOptions) -> ExecPlugin {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempdir();
        let command = dir.path().join("plugin.sh");
        let sleep = if opts.sleep.is_zero() {
            String::new()
        } else {
            format!("sleep {:.3}\n", opts.sleep.as_secs_f64())
        };
        let fail = match &opts.fail_with {
            None => String::new(),
            Some(lines) => {
                let mut s = String::new();
                for l in lines {
                    s.push_str(&format!("printf '%s\\n' {} >&2\n", sh_quote(l)));
                }
                s.push_str("exit 3\n");
                s
            }
        };
        let hang = if opts.hang {
            "sleep 60 &\necho $! > \"$dir/child-$n.pid\"\nwait\n"
        } else {
            ""
        };
        let expires = match opts.expires_in {
            None => "None".to_owned(),
            Some(d) => d.as_secs().to_string(),
        };
        let script = format!(
            r#"#!/bin/sh
# credbroker e2e test plugin: counts runs, records KUBERNETES_EXEC_INFO, prints an ExecCredential.
set -eu
dir={dir}
echo run >> "$dir/count"
n=$(($(wc -l < "$dir/count") + 0))
printf '%s' "${{KUBERNETES_EXEC_INFO:-}}" > "$dir/info-$n.json"
for a in "$@"; do printf '%s\n' "$a"; done > "$dir/args-$n"
env > "$dir/env-$n"
{sleep}{hang}{fail}exec {python} - "$n" <<'PY'
import datetime, json, os, sys
info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{{}}")
cluster = (info.get("spec") or {{}}).get("cluster") or {{}}
name = (cluster.get("config") or {{}}).get("clusterName", "none")
# A token is one line of printable text: a hostile cluster name must not make it invalid.
name = "".join(c if c.isprintable() and not c.isspace() else "_" for c in str(name))
status = {{"token": "tok-%s-%s" % (name, sys.argv[1])}}
expires = {expires}
if expires is not None:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=expires)
    status["expirationTimestamp"] = t.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": info.get("apiVersion", "{V1}"), "kind": "ExecCredential", "status": status}}))
PY
"#,
            dir = sh_quote(dir.path().to_str().expect("UTF-8 temp dir")),
            python = sh_quote(python3()),
        );
        std::fs::write(&command, script).expect("write plugin script");
        std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755))
            .expect("chmod plugin script");
        ExecPlugin { dir, command }
    }

    /// Absolute path of the script (the provider's `exec.command`).
    pub fn command(&self) -> &Path {
        &self.command
    }

    /// How many times the plugin has run.
    pub fn runs(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("count"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Waits (bounded) until the plugin has started at least `n` times.
    pub fn wait_for_runs(&self, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.runs() >= n)
    }

    /// Arguments of run `run` (1-based).
    pub fn args(&self, run: usize) -> Vec<String> {
        let path = self.dir.path().join(format!("args-{run}"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("plugin run {run} left no {}: {e}", path.display()))
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Value of environment variable `name` in run `run` (1-based).
    pub fn env_var(&self, run: usize, name: &str) -> Option<String> {
        let path = self.dir.path().join(format!("env-{run}"));
        let env = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("plugin run {run} left no {}: {e}", path.display()));
        let prefix = format!("{name}=");
        env.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::to_owned)
    }

    /// Pid of the background child of run `run` of a hanging plugin, once it is known.
    pub fn child_pid(&self, run: usize) -> Option<u32> {
        std::fs::read_to_string(self.dir.path().join(format!("child-{run}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `KUBERNETES_EXEC_INFO` the plugin received on run `run` (1-based).
    pub fn exec_info(&self, run: usize) -> Value {
        let path = self.dir.path().join(format!("info-{run}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("plugin run {run} left no {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("plugin run {run} got invalid KUBERNETES_EXEC_INFO {text:?}: {e}")
        })
    }
}

impl Default for ExecPlugin {
    fn default() -> Self {
        ExecPlugin::new()
    }
}

/// Token files for the broker's `file` provider: `<tempdir>/<clusterName>/token`.
#[derive(Debug)]
pub struct TokenFiles {
    dir: TempDir,
}

impl TokenFiles {
    /// An empty token dir.
    pub fn new() -> TokenFiles {
        TokenFiles { dir: tempdir() }
    }

    /// The provider's `file.path`: `<dir>/{clusterName}/token`.
    pub fn template(&self) -> String {
        format!(
            "{}/{{clusterName}}/token",
            self.dir.path().to_str().expect("UTF-8 temp dir")
        )
    }

    /// Path of the token file of `cluster`.
    pub fn path(&self, cluster: &str) -> PathBuf {
        self.dir.path().join(cluster).join("token")
    }

    /// Writes (or replaces) the token of `cluster`; returns the file's path.
    pub fn write(&self, cluster: &str, token: &str) -> PathBuf {
        let path = self.path(cluster);
        std::fs::create_dir_all(path.parent().expect("token dir")).expect("create token dir");
        std::fs::write(&path, token).expect("write token file");
        path
    }
}

impl Default for TokenFiles {
    fn default() -> Self {
        TokenFiles::new()
    }
}
