//! `type: exec`: wraps any kubeconfig exec plugin (kubelogin, gke-gcloud-auth-plugin,
//! cluster-inventory-api's plugins, on-prem tools), adding the cache and single-flight
//! without changing the plugin. The plugin sees what client-go would have given it.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::SystemTime;

use credbroker_execcred::{ApiVersion, ExecInfo, exec_credential};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::process::{Child, Command};

use crate::config::values::ProviderKind;
use crate::request::TokenRequest;

use crate::config::providers::exec::{Config as ExecConfig, DEFAULT_EXEC_PASS_ENV};

use super::{BoxFuture, Credential, CredentialSecret, Provider, ProviderError, Resolved, Secret};

/// An ExecCredential is a few KiB at most; anything past this is not one.
const MAX_STDOUT: usize = 1024 * 1024;
/// Enough of the plugin's stderr to say why it failed.
const MAX_STDERR: usize = 64 * 1024;
/// Bytes per read while draining a pipe: Linux's default pipe capacity.
const READ_CHUNK: usize = 64 * 1024;
/// Lines of stderr quoted in an error, and the length each is cut to.
const STDERR_LINES: usize = 5;
const STDERR_LINE_CHARS: usize = 300;

#[derive(Debug)]
pub struct ExecProvider {
    config: ExecConfig,
}

impl ExecProvider {
    pub fn new(config: ExecConfig) -> Self {
        Self { config }
    }

    /// `KUBERNETES_EXEC_INFO` for the plugin, as client-go writes it: the caller's cluster
    /// (its config the very text client-go sent), never interactive.
    fn exec_info(&self, req: &TokenRequest) -> String {
        ExecInfo {
            // Validated when the config was loaded.
            api_version: ApiVersion::parse(&self.config.api_version).unwrap_or(ApiVersion::DEFAULT),
            interactive: false,
            cluster: req.cluster.as_ref().map(|c| c.to_exec_cluster()),
        }
        .to_json()
    }

    /// What the plugin gets of the broker's own environment: the default allowlist plus
    /// `passEnv`, or everything with `inheritEnv: true` (`env` and `KUBERNETES_EXEC_INFO` are
    /// set on top).
    fn inherited_env(&self) -> impl Iterator<Item = (OsString, OsString)> + '_ {
        std::env::vars_os().filter(|(name, _)| {
            self.config.inherit_env
                || name.to_str().is_some_and(|name| {
                    DEFAULT_EXEC_PASS_ENV
                        .iter()
                        .copied()
                        .chain(self.config.pass_env.iter().map(String::as_str))
                        .any(|pattern| match pattern.strip_suffix('*') {
                            Some(prefix) => name.starts_with(prefix),
                            None => name == pattern,
                        })
                })
        })
    }

    async fn run(&self, req: &TokenRequest) -> Result<Credential, ProviderError> {
        let command = self.config.command.display().to_string();
        let mut child = Command::new(&self.config.command)
            .args(&self.config.args)
            .env_clear()
            .envs(self.inherited_env())
            .envs(&self.config.env)
            .env("KUBERNETES_EXEC_INFO", self.exec_info(req))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that everything it started can be killed at once.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                ProviderError::Unavailable(format!("cannot run exec plugin {command}: {e}"))
            })?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        // From here on, however this future ends (answer, timeout, the cache giving up on it,
        // the runtime shutting down), dropping `group` kills and reaps what the plugin started.
        let mut group = ProcessGroup::new(child);
        let work = async {
            tokio::join!(
                drain(stdout, MAX_STDOUT),
                drain(stderr, MAX_STDERR),
                group.wait()
            )
        };
        let outcome = tokio::time::timeout(self.config.timeout.0, work).await;
        drop(group);
        let (stdout, stderr, status) = outcome.map_err(|_| {
            ProviderError::Timeout(format!(
                "exec plugin {command} did not finish within {}; killed its process group",
                humantime::format_duration(self.config.timeout.0)
            ))
        })?;
        let status = status.map_err(|e| {
            ProviderError::Unavailable(format!("waiting for exec plugin {command}: {e}"))
        })?;
        if !status.success() {
            let code = status.code().map_or_else(
                || "was killed by a signal".to_owned(),
                |c| format!("exited with code {c}"),
            );
            return Err(ProviderError::Unavailable(format!(
                "exec plugin {command} {code}: {}",
                first_lines(&stderr.kept)
            )));
        }
        if stdout.overflowed {
            return Err(ProviderError::Unavailable(format!(
                "exec plugin {command} printed more than {MAX_STDOUT} bytes on stdout; that is not an ExecCredential"
            )));
        }
        parse_exec_credential(&stdout.kept, self.config.default_lifetime.0).map_err(|why| {
            ProviderError::Unavailable(format!(
                "exec plugin {command} printed no usable ExecCredential: {why}"
            ))
        })
    }
}

impl Provider for ExecProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Exec
    }

    /// The plugin is shown `spec.cluster`, CA data included.
    fn reads_certificate_authority(&self) -> bool {
        true
    }

    /// Everything of the cluster the plugin is shown (`spec.cluster`): the server, then a
    /// SHA-256 of the config and of the TLS server name, CA data, proxy URL and the other
    /// connection settings. A plugin may answer differently for any of them, so two clusters
    /// that differ only there must not share a token; the digest keeps the key (and every
    /// ListEntries row) a few dozen bytes, whatever the cluster's exec extension holds.
    /// The target is empty: the plugin is shown the request itself (`fetch`'s `req`).
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        use sha2::Digest as _;
        let Some(c) = &req.cluster else {
            return Ok(Resolved::new(String::new(), ()));
        };
        let render = |value: &Value| {
            // serde_json maps are sorted, so equal configs render equally.
            serde_json::to_string(value).map_err(|e| {
                ProviderError::InvalidRequest(format!("cluster config cannot be rendered: {e}"))
            })
        };
        // The connection settings as the plugin sees them, without the server (in the key
        // already) and the config (digested on its own, whatever its key order).
        let connection = ExecInfo {
            api_version: ApiVersion::V1,
            interactive: false,
            cluster: Some(credbroker_execcred::Cluster {
                server: String::new(),
                config: None,
                ..c.to_exec_cluster()
            }),
        }
        .to_json();
        let mut digest = sha2::Sha256::new();
        digest.update(render(&Value::Object(c.config.fields().clone()))?);
        digest.update(b"\n");
        // A parsed number that is not an exact integer may stand for an integer past 64
        // bits (serde_json keeps those as f64): two such clusters would render alike, so the
        // text the plugin is shown joins the digest (its key order then counts too).
        if c.config.fields().values().any(has_inexact_number)
            && let Some(text) = c.config.as_json()
        {
            digest.update(text);
        }
        digest.update(b"\n");
        digest.update(connection);
        let hex: String = digest
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Resolved::new(format!("{} sha256:{hex}", c.server), ()))
    }

    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
        _target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(self.run(req))
    }
}

/// What a plugin wrote on one pipe: the first bytes, and whether it wrote more than that.
struct Captured {
    kept: Vec<u8>,
    overflowed: bool,
}

/// Reads a pipe to its end, keeping the first `limit` bytes. Closing the pipe early instead
/// would kill a chatty plugin with SIGPIPE (client-go reads everything, so such plugins work
/// there); a plugin that never stops writing is stopped by the timeout like a hanging one.
async fn drain(pipe: Option<impl AsyncRead + Unpin>, limit: usize) -> Captured {
    let mut captured = Captured {
        kept: Vec::new(),
        overflowed: false,
    };
    let Some(mut pipe) = pipe else {
        return captured;
    };
    let mut chunk = vec![0; READ_CHUNK];
    // A read error ends the capture with what was read; the exit status tells what went wrong.
    while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
        let room = limit - captured.kept.len();
        captured.kept.extend_from_slice(&chunk[..n.min(room)]);
        captured.overflowed |= n > room;
    }
    captured
}

/// A running plugin's process group (the plugin leads it). Dropping it SIGKILLs the whole
/// group and reaps the plugin: the one place that ends a plugin, so that no path (an answer,
/// the plugin's timeout, the cache dropping the fetch at its upstream timeout, the runtime
/// dropping every task at shutdown) leaves a process tree behind. Grandchildren are reparented
/// to init (or the pod's subreaper), which reaps them once killed.
struct ProcessGroup {
    child: Option<Child>,
    pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    fn new(child: Child) -> Self {
        let pgid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw);
        Self {
            child: Some(child),
            pgid,
        }
    }

    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match &mut self.child {
            Some(child) => child.wait().await,
            None => Err(std::io::Error::other("the plugin was already reaped")),
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            // ESRCH (nothing left in the group) is the normal case. The id stays reserved
            // while any member lives; once the group is empty it could only name another group
            // after the kernel's pid counter wrapped around, not in the moment since the reap.
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        // Killed, not yet reaped: wait for it on the runtime. Without a runtime (or when the
        // runtime is shutting down and drops the task), `kill_on_drop` hands it to tokio's
        // orphan reaping, and the process exits right after anyway.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}

/// The first lines of a plugin's stderr, on one line, for an error message.
fn first_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(STDERR_LINES)
        // Plugin text: no ESC, CR or other control character reaches a log or the shim.
        .map(|l| crate::base::text::one_line(l, STDERR_LINE_CHARS))
        .collect();
    if lines.is_empty() {
        "(no output on stderr)".to_owned()
    } else {
        lines.join(" | ")
    }
}

/// Parses a plugin's ExecCredential (v1 or v1beta1) into a credential: the token checked by
/// the one rule for every provider, no expiry meaning `default_lifetime` from now. Errors
/// describe the structure only: the output holds a secret, so none of its values is quoted.
///
/// Public for the fuzz target in `fuzz/` (the exec provider is its only caller).
pub fn parse_exec_credential(
    stdout: &[u8],
    default_lifetime: std::time::Duration,
) -> Result<Credential, String> {
    let parsed = exec_credential::parse(stdout).map_err(|e| e.to_string())?;
    let secret = match parsed.credential {
        exec_credential::Credential::Token(token) => CredentialSecret::Token(Secret::new(
            super::bearer_token(&token).map_err(|e| format!("status.token {e}"))?,
        )),
        exec_credential::Credential::ClientCertificate {
            certificate_pem,
            key_pem,
        } => CredentialSecret::ClientCertificate {
            certificate_pem,
            key_pem: Secret::new(key_pem),
        },
    };
    Ok(Credential {
        secret,
        expires_at: parsed
            .expiration
            .unwrap_or_else(|| SystemTime::now() + default_lifetime),
        source_version: None,
    })
}

#[cfg(test)]
mod tests;

/// Whether a JSON value holds a number serde_json could not keep exactly (a float, or an
/// integer outside i64/u64).
fn has_inexact_number(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_f64(),
        Value::Array(items) => items.iter().any(has_inexact_number),
        Value::Object(fields) => fields.values().any(has_inexact_number),
        _ => false,
    }
}
