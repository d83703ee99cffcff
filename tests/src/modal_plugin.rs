//! A wrapped exec plugin whose behaviour the test changes while the broker runs: it reads
//! `mode` (ok | fail | hang | slow) and `lifetime` ("LO HI" seconds) from its directory on
//! every run. Its token `tok-<cluster>-<run>-<expiry epoch>` carries its own expiry, so a
//! test can tell from any answer whether an expired token was ever served.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

/// How the next runs of a [`ModalPlugin`] behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Answer at once.
    Ok,
    /// Exit 3 with "upstream says no" on stderr.
    Fail,
    /// Never answer (sleep 600 s): the broker's exec timeout must kill it.
    Hang,
    /// Answer after 1.5 s.
    Slow,
}

const SCRIPT: &str = r#"#!/usr/bin/env python3
import json, os, random, sys, time
d = os.path.dirname(os.path.abspath(__file__))
info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")
cluster = info.get("spec", {}).get("cluster", {}).get("config", {}).get("clusterName", "none")
mode = open(os.path.join(d, "mode")).read().strip()
with open(os.path.join(d, "runs.log"), "a") as log:
    log.write("%s %s %f\n" % (cluster, mode, time.time()))
run = sum(1 for line in open(os.path.join(d, "runs.log")) if line.split()[0] == cluster)
if mode == "fail":
    print("upstream says no", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    time.sleep(600)
if mode == "slow":
    time.sleep(1.5)
lo, hi = map(int, open(os.path.join(d, "lifetime")).read().split())
exp = int(time.time()) + random.randint(lo, hi)
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": {
        "token": "tok-%s-%d-%d" % (cluster, run, exp),
        "expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp)),
    },
}))
"#;

/// See the module docs.
#[derive(Debug)]
pub struct ModalPlugin {
    dir: TempDir,
}

impl ModalPlugin {
    /// A plugin in mode [`Mode::Ok`] issuing tokens that live `lo..=hi` seconds.
    pub fn new(lo: u32, hi: u32) -> Self {
        let dir = crate::tempdir();
        let script = dir.path().join("plugin.py");
        std::fs::write(&script, SCRIPT).expect("write plugin");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("chmod plugin");
        std::fs::write(dir.path().join("lifetime"), format!("{lo} {hi}")).expect("write lifetime");
        let plugin = Self { dir };
        plugin.set(Mode::Ok);
        plugin
    }

    pub fn command(&self) -> PathBuf {
        self.dir.path().join("plugin.py")
    }

    /// Changes what the next runs do (a run already going keeps its mode).
    pub fn set(&self, mode: Mode) {
        let text = match mode {
            Mode::Ok => "ok",
            Mode::Fail => "fail",
            Mode::Hang => "hang",
            Mode::Slow => "slow",
        };
        // Write then rename: a run never reads a half-written file.
        let tmp = self.dir.path().join("mode.tmp");
        std::fs::write(&tmp, text).expect("write mode");
        std::fs::rename(&tmp, self.dir.path().join("mode")).expect("rename mode");
    }

    /// Every run so far: (cluster, mode it ran in).
    pub fn runs(&self) -> Vec<(String, String)> {
        let log = std::fs::read_to_string(self.dir.path().join("runs.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
            })
            .collect()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// What a token from a [`ModalPlugin`] says about itself: (cluster, run, expiry epoch).
pub fn parse_token(token: &str) -> Option<(String, u32, u64)> {
    let rest = token.strip_prefix("tok-")?;
    let mut parts = rest.rsplitn(3, '-');
    let exp = parts.next()?.parse().ok()?;
    let run = parts.next()?.parse().ok()?;
    Some((parts.next()?.to_owned(), run, exp))
}

/// Seconds since the Unix epoch, now.
pub fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
