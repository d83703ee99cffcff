//! `type: exec`: wraps any kubeconfig exec plugin (kubelogin, gke-gcloud-auth-plugin,
//! cluster-inventory-api's plugins, on-prem tools), adding the cache and single-flight
//! without changing the plugin. The plugin sees what client-go would have given it.

use std::process::Stdio;
use std::time::SystemTime;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::process::Command;

use crate::config::{EXEC_API_V1, EXEC_API_V1BETA1, ExecConfig, ProviderKind};
use crate::request::TokenRequest;

use super::{BoxFuture, Credential, CredentialSecret, Provider, ProviderError, Secret};

/// An ExecCredential is a few KiB at most; anything past this is not one.
const MAX_STDOUT: u64 = 1024 * 1024;
/// Enough of the plugin's stderr to say why it failed.
const MAX_STDERR: u64 = 64 * 1024;
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

    /// `KUBERNETES_EXEC_INFO` for the plugin: the caller's cluster, never interactive.
    fn exec_info(&self, req: &TokenRequest) -> String {
        let mut spec = json!({ "interactive": false });
        if let Some(cluster) = &req.cluster {
            spec["cluster"] = cluster.to_exec_json();
        }
        json!({
            "apiVersion": self.config.api_version,
            "kind": "ExecCredential",
            "spec": spec,
        })
        .to_string()
    }

    async fn run(&self, req: &TokenRequest) -> Result<Credential, ProviderError> {
        let command = self.config.command.display().to_string();
        let mut child = Command::new(&self.config.command)
            .args(&self.config.args)
            .envs(&self.config.env)
            .env("KUBERNETES_EXEC_INFO", self.exec_info(req))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout kills everything it started.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                ProviderError::Unavailable(format!("cannot run exec plugin {command}: {e}"))
            })?;
        let pid = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let work = async {
            let (out, err, status) = tokio::join!(
                read_limited(stdout, MAX_STDOUT),
                read_limited(stderr, MAX_STDERR),
                child.wait()
            );
            (out, err, status)
        };
        let outcome = tokio::time::timeout(self.config.timeout.0, work).await;
        // Whatever happened, nothing the plugin started outlives this call.
        kill_group(pid);
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
                first_lines(&stderr)
            )));
        }
        if stdout.len() as u64 > MAX_STDOUT {
            return Err(ProviderError::Unavailable(format!(
                "exec plugin {command} printed more than {MAX_STDOUT} bytes; that is not an ExecCredential"
            )));
        }
        parse_exec_credential(&stdout, self.config.default_lifetime.0).map_err(|why| {
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

    /// Server and cluster config: what distinguishes one cluster's plugin run from another's.
    fn identity(&self, req: &TokenRequest) -> Result<String, ProviderError> {
        Ok(match &req.cluster {
            // serde_json maps are sorted, so equal configs render equally.
            Some(c) => {
                let config = serde_json::to_string(&c.config).map_err(|e| {
                    ProviderError::InvalidRequest(format!("cluster config cannot be rendered: {e}"))
                })?;
                format!("{} {config}", c.server)
            }
            None => String::new(),
        })
    }

    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(self.run(req))
    }
}

/// Reads at most `limit + 1` bytes, so an oversized output is detected without buffering it.
async fn read_limited(pipe: Option<impl AsyncRead + Unpin>, limit: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(pipe) = pipe {
        // A read error leaves what was read; the exit status tells what went wrong.
        let _ = pipe.take(limit + 1).read_to_end(&mut buf).await;
    }
    buf
}

fn kill_group(pid: Option<u32>) {
    if let Some(pgid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // ESRCH (nothing left in the group) is the normal case.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
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
        .map(|l| l.chars().take(STDERR_LINE_CHARS).collect())
        .collect();
    if lines.is_empty() {
        "(no output on stderr)".to_owned()
    } else {
        lines.join(" | ")
    }
}

/// Parses an ExecCredential (v1 or v1beta1). Errors describe the structure only: the
/// output holds a secret, so none of its values is ever quoted.
///
/// Public for the fuzz target in `fuzz/` (the exec provider is its only caller).
pub fn parse_exec_credential(
    stdout: &[u8],
    default_lifetime: std::time::Duration,
) -> Result<Credential, String> {
    let value: Value = serde_json::from_slice(stdout).map_err(|e| format!("not JSON ({e})"))?;
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if api_version != EXEC_API_V1 && api_version != EXEC_API_V1BETA1 {
        return Err(format!(
            "apiVersion must be {EXEC_API_V1} or {EXEC_API_V1BETA1}"
        ));
    }
    if value.get("kind").and_then(Value::as_str) != Some("ExecCredential") {
        return Err("kind must be ExecCredential".into());
    }
    let status = value
        .get("status")
        .and_then(Value::as_object)
        .ok_or("no status object")?;
    let field = |name: &str| -> Result<Option<String>, String> {
        match status.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("status.{name} must be a string")),
        }
    };
    let secret = match (
        field("token")?,
        field("clientCertificateData")?,
        field("clientKeyData")?,
    ) {
        (Some(token), _, _) => CredentialSecret::Token(Secret::new(token)),
        (None, Some(certificate_pem), Some(key)) => CredentialSecret::ClientCertificate {
            certificate_pem,
            key_pem: Secret::new(key),
        },
        (None, Some(_), None) | (None, None, Some(_)) => {
            return Err("status.clientCertificateData and status.clientKeyData go together".into());
        }
        (None, None, None) => {
            return Err("status has neither token nor clientCertificateData".into());
        }
    };
    let expires_at = match field("expirationTimestamp")? {
        Some(text) => {
            parse_rfc3339(&text).map_err(|e| format!("status.expirationTimestamp {text:?}: {e}"))?
        }
        None => SystemTime::now() + default_lifetime,
    };
    Ok(Credential {
        secret,
        expires_at,
        source_version: None,
    })
}

fn parse_rfc3339(text: &str) -> Result<SystemTime, String> {
    let parsed = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("not an RFC 3339 time ({e})"))?;
    Ok(SystemTime::from(parsed))
}

#[cfg(test)]
mod tests;
