//! The broker under test: its config (whole files or `providers[]` entries), a
//! `credbroker serve` child in its own temp dir built by [`Broker::builder`], and one
//! GetToken over gRPC.

use std::ffi::{OsStr, OsString};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest, GetTokenResponse};
use serde_json::Value;
use tempfile::TempDir;

use crate::process::wait_child;
use crate::{BROKER, BROKER_TIMEOUT, bin, send_signal, tempdir, unix_channel, wait_until};

// ---------------------------------------------------------------------------------------
// Broker configuration
// ---------------------------------------------------------------------------------------

/// `s` as a YAML double-quoted scalar (JSON strings are valid YAML).
pub fn yaml_str(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("string to JSON")
}

/// A broker config: `socket.path` is the `{socket}` placeholder that [`Broker::start`]
/// fills in, followed by `providers` (entries from [`exec_provider`] / [`file_provider`]).
pub fn config_yaml(providers: &[String]) -> String {
    let mut yaml = String::from("socket: {path: \"{socket}\"}\nproviders:\n");
    for p in providers {
        yaml.push_str(p);
    }
    yaml
}

/// A `providers[]` entry of type `exec` running `command`; `extra` is appended inside the
/// `exec:` flow mapping (e.g. `"apiVersion: client.authentication.k8s.io/v1beta1"`).
pub fn exec_provider(name: &str, command: &Path, extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!(
        "  - name: {}\n    type: exec\n    exec: {{command: {}{extra}}}\n",
        yaml_str(name),
        yaml_str(command.to_str().expect("UTF-8 path"))
    )
}

/// A `providers[]` entry of type `file` reading `path_template` (may contain `{clusterName}`).
pub fn file_provider(name: &str, path_template: &str) -> String {
    format!(
        "  - name: {}\n    type: file\n    file: {{path: {}}}\n",
        yaml_str(name),
        yaml_str(path_template)
    )
}

/// A `providers[]` entry of type `ty` whose section is `section` (a YAML flow mapping such
/// as `{region: us-west-2}`); `extra` holds further keys of the entry, one per line, each
/// without indentation (e.g. `allowOverrides: {tenantId: ["*"]}`).
pub fn provider(name: &str, ty: &str, section: &str, extra: &[&str]) -> String {
    let mut entry = format!("  - name: {}\n    type: {ty}\n", yaml_str(name));
    for line in extra {
        entry.push_str(&format!("    {line}\n"));
    }
    entry.push_str(&format!("    {ty}: {section}\n"));
    entry
}

// ---------------------------------------------------------------------------------------
// The broker
// ---------------------------------------------------------------------------------------

/// A running `credbroker serve --config <dir>/config.yaml`, stdout and stderr in
/// `<dir>/broker.log`. Killed (SIGKILL) on drop if still running.
#[derive(Debug)]
pub struct Broker {
    dir: TempDir,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Child,
}

/// How to start a [`Broker`]: its config (a whole file, or `providers[]` entries under a
/// `socket:` line), its environment, extra `serve` flags, a socket elsewhere, a shell
/// prefix. Made by [`Broker::builder`]; [`BrokerBuilder::start`] runs it.
#[derive(Debug)]
pub struct BrokerBuilder {
    dir: TempDir,
    config: Option<String>,
    providers: Vec<String>,
    socket: Option<PathBuf>,
    args: Vec<OsString>,
    env_clear: bool,
    env_remove: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    shell: Option<String>,
    binary: Option<PathBuf>,
}

impl BrokerBuilder {
    /// The whole config file; `{socket}` in it becomes the socket path. Replaces any
    /// [`provider`](BrokerBuilder::provider) entries.
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(yaml.to_owned());
        self
    }

    /// One `providers[]` entry (from [`exec_provider`], [`file_provider`], [`provider`]):
    /// without [`config`](BrokerBuilder::config) the file is `socket: {path: …}` and the
    /// entries under `providers:`.
    pub fn provider(mut self, entry: impl Into<String>) -> Self {
        self.providers.push(entry.into());
        self
    }

    /// Several `providers[]` entries (see [`provider`](BrokerBuilder::provider)).
    pub fn providers<S: Into<String> + Clone>(mut self, entries: &[S]) -> Self {
        self.providers
            .extend(entries.iter().cloned().map(Into::into));
        self
    }

    /// Listens on `socket` instead of `<dir>/broker.sock`.
    pub fn socket(mut self, socket: &Path) -> Self {
        self.socket = Some(socket.to_path_buf());
        self
    }

    /// One more `serve` flag.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// More `serve` flags.
    pub fn args<S: AsRef<OsStr>>(mut self, args: &[S]) -> Self {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Starts from an empty environment (no `PATH` either), then applies
    /// [`env`](BrokerBuilder::env): nothing on the machine leaks in.
    pub fn env_clear(mut self) -> Self {
        self.env_clear = true;
        self
    }

    /// Removes `key` from what the broker inherits.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    /// Sets `key=value`; a later call for the same key wins.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Sets each `(key, value)` in order (see [`env`](BrokerBuilder::env)).
    pub fn envs<K: AsRef<OsStr>, V: AsRef<OsStr>>(mut self, vars: &[(K, V)]) -> Self {
        for (k, v) in vars {
            self = self.env(k, v);
        }
        self
    }

    /// Sets `HOME` to `<dir>/home` (created, empty): no dot-files of the machine's user.
    pub fn home(self) -> Self {
        let home = self.home_dir();
        std::fs::create_dir_all(&home).expect("create the broker's HOME");
        self.env("HOME", home)
    }

    /// `<dir>/home`, what [`home`](BrokerBuilder::home) sets `HOME` to.
    pub fn home_dir(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// Execs the broker from `sh -c "<shell>; exec …"`, so that `shell` can set what the
    /// broker inherits (e.g. `umask 000`, `ulimit -Sn 512`).
    pub fn shell(mut self, shell: &str) -> Self {
        self.shell = Some(shell.to_owned());
        self
    }

    /// Runs `binary` instead of this build's broker (the arm64 one's qemu wrapper,
    /// [`crate::arch`]).
    pub fn binary(mut self, binary: &Path) -> Self {
        self.binary = Some(binary.to_path_buf());
        self
    }

    /// The broker's temp dir (config, log and `home/` live there), before it starts.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes the config, starts `credbroker serve` and waits until the socket accepts
    /// connections; fails the test if the broker exits first or never listens.
    pub fn start(self) -> Broker {
        let BrokerBuilder {
            dir,
            config,
            providers,
            socket,
            args,
            env_clear,
            env_remove,
            env,
            shell,
            binary,
        } = self;
        let binary = binary.unwrap_or_else(|| bin(BROKER));
        let socket = socket.unwrap_or_else(|| dir.path().join("broker.sock"));
        let config = config.unwrap_or_else(|| config_yaml(&providers));
        let config_path = dir.path().join("config.yaml");
        let text = config.replace("{socket}", socket.to_str().expect("UTF-8 socket path"));
        std::fs::write(&config_path, text).expect("write broker config");
        let log = dir.path().join("broker.log");
        let log_file = std::fs::File::create(&log).expect("create broker log");
        let mut command = match shell {
            None => Command::new(&binary),
            Some(shell) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("{shell}; exec \"$0\" \"$@\""))
                    .arg(&binary);
                sh
            }
        };
        if env_clear {
            command.env_clear();
        }
        for key in &env_remove {
            command.env_remove(key);
        }
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .args(&args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup log file"))
            .stderr(log_file)
            .spawn()
            .expect("spawn credbroker serve");
        let mut broker = Broker {
            dir,
            socket,
            config: config_path,
            log,
            child,
        };
        broker.wait_ready();
        broker
    }
}

impl Broker {
    /// A builder for a broker in a fresh temp dir, on `<dir>/broker.sock`.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            dir: tempdir(),
            config: None,
            providers: Vec::new(),
            socket: None,
            args: Vec::new(),
            env_clear: false,
            env_remove: Vec::new(),
            env: Vec::new(),
            shell: None,
            binary: None,
        }
    }

    /// Starts a broker on `<tempdir>/broker.sock` (the `{socket}` placeholder in `config`)
    /// and waits until the socket accepts connections.
    pub fn start(config: &str) -> Broker {
        Broker::builder().config(config).start()
    }

    /// Like [`Broker::start`], with `{socket}` replaced by `socket`.
    pub fn start_at(config: &str, socket: &Path) -> Broker {
        Broker::builder().config(config).socket(socket).start()
    }

    /// Like [`Broker::start_at`], with the broker exec'd from `sh -c "<shell>; exec …"`
    /// (see [`BrokerBuilder::shell`]).
    pub fn start_in_shell(config: &str, socket: &Path, shell: &str) -> Broker {
        Broker::builder()
            .config(config)
            .socket(socket)
            .shell(shell)
            .start()
    }

    /// Like [`Broker::start`], with extra `serve` flags and environment variables.
    pub fn start_with(config: &str, args: &[&str], env: &[(&str, &str)]) -> Broker {
        Broker::builder()
            .config(config)
            .args(args)
            .envs(env)
            .start()
    }

    /// Waits (bounded) until the socket accepts a connection; fails the test if the broker
    /// exits first or never listens.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + BROKER_TIMEOUT;
        loop {
            if UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait broker") {
                panic!(
                    "credbroker serve exited ({status}) before listening on {}; log:\n{}",
                    self.socket.display(),
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "credbroker serve did not listen on {} within {BROKER_TIMEOUT:?}; log:\n{}",
                self.socket.display(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The socket the broker listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The config file the broker was started with.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The broker's temp dir (config and log live there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the broker wrote to stdout/stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address the metrics endpoint bound (`metrics.address` with port 0 picks one), as
    /// the broker logs it at start.
    pub fn metrics_address(&self) -> String {
        // The listener's log line may trail the socket by a moment.
        wait_until(Duration::from_secs(10), || {
            self.logs().contains("metrics at /metrics")
        });
        self.logs()
            .lines()
            .find(|l| l.contains("metrics at /metrics"))
            .and_then(|l| l.split("address=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no metrics address in the log:\n{}", self.logs()))
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM without waiting.
    pub fn send_sigterm(&self) {
        send_signal(self.pid(), "TERM");
    }

    /// Waits at most `timeout` for the broker to exit; fails the test otherwise.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        wait_child(&mut self.child, timeout).unwrap_or_else(|| {
            panic!(
                "credbroker did not exit within {timeout:?}; log:\n{}",
                self.logs()
            )
        })
    }

    /// SIGTERM, then waits (bounded by [`BROKER_TIMEOUT`]) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        self.send_sigterm();
        self.wait_exit(BROKER_TIMEOUT)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------
// GetToken over gRPC
// ---------------------------------------------------------------------------------------

/// A request's cluster: `server` and the exec extension `config` (a JSON object, as the
/// shim would send it).
pub fn cluster(server: &str, config: &Value) -> Cluster {
    Cluster {
        server: server.to_owned(),
        config: Some(json_struct(config)),
        ..Cluster::default()
    }
}

/// A JSON object as a protobuf `Struct`; panics on anything but an object.
pub fn json_struct(object: &Value) -> prost_types::Struct {
    let Value::Object(map) = object else {
        panic!("a cluster config must be a JSON object, not {object}")
    };
    prost_types::Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_value(v)))
            .collect(),
    }
}

fn json_value(value: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(json_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(json_struct(value)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// One GetToken for `provider` and `cluster` over a fresh channel to `socket`.
pub async fn get_token(
    socket: &Path,
    provider: &str,
    cluster: Cluster,
) -> Result<GetTokenResponse, tonic::Status> {
    let mut client = TokenServiceClient::new(unix_channel(socket).await);
    client
        .get_token(GetTokenRequest {
            provider: provider.to_owned(),
            cluster: Some(cluster),
            interactive: false,
            caller: None,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// [`get_token`] from synchronous code (on a runtime of its own).
pub fn get_token_blocking(
    socket: &Path,
    provider: &str,
    cluster: Cluster,
) -> Result<GetTokenResponse, tonic::Status> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(get_token(socket, provider, cluster))
}
