//! `credbroker serve | check-config | version`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use credbroker::config::Config;

/// Credential broker for Kubernetes multi-cluster controllers.
#[derive(Debug, Parser)]
#[command(name = "credbroker", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve tokens on the Unix socket until SIGTERM or SIGINT.
    Serve {
        /// YAML config file; without it, the embedded default (providers aws, gcp, azure).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Socket path, overriding socket.path from the config.
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Log lines as human text or as JSON objects.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Ask a running broker for its gRPC health over the socket: exit 0 when SERVING.
    /// For Kubernetes exec probes (the broker listens on no TCP port for gRPC probes).
    Health {
        #[arg(long, value_name = "PATH", default_value = credbroker::config::DEFAULT_SOCKET_PATH)]
        socket: PathBuf,
        /// The service to check; empty for the broker as a whole.
        #[arg(long, default_value = "")]
        service: String,
        /// Give up after this long, e.g. 2s.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Parse and validate a config file, then exit.
    CheckConfig {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("credbroker: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Version => {
            println!("credbroker {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::CheckConfig { file } => {
            let config = Config::load(&file).map_err(|e| e.to_string())?;
            if let Some(warning) = config.socket.open_to_everyone_warning() {
                eprintln!("credbroker: warning: {warning}");
            }
            let providers: Vec<String> = config
                .providers
                .iter()
                .map(|p| format!("{} ({})", p.name, p.kind()))
                .collect();
            println!(
                "{}: ok; socket {}; providers: {}",
                file.display(),
                config.socket.path.display(),
                providers.join(", ")
            );
            Ok(())
        }
        Command::Health {
            socket,
            service,
            timeout,
        } => runtime()?.block_on(async {
            let status = tokio::time::timeout(timeout, health_check(&socket, service.clone()))
                .await
                .map_err(|_| {
                    format!(
                        "no health answer from {} within {timeout:?}",
                        socket.display()
                    )
                })??;
            println!("{status}");
            if status == "SERVING" {
                Ok(())
            } else {
                Err(format!("service {service:?} is {status}"))
            }
        }),
        Command::Serve {
            config,
            socket,
            log_format,
        } => {
            init_logging(log_format);
            match credbroker::base::conn::raise_fd_limit() {
                Ok(limit) => {
                    tracing::debug!(limit, "open files limit (soft) raised to the hard limit")
                }
                Err(e) => tracing::warn!(
                    "cannot raise the open files limit ({e}); keeping the current one"
                ),
            }
            let (config, config_path) = match config {
                Some(file) => (Config::load(&file).map_err(|e| e.to_string())?, Some(file)),
                None => (Config::embedded_default().map_err(|e| e.to_string())?, None),
            };
            let socket = socket.unwrap_or_else(|| config.socket.path.clone());
            if !socket.is_absolute() {
                return Err(format!(
                    "--socket must be an absolute path, got {}",
                    socket.display()
                ));
            }
            let options = credbroker::grpc::server::ServeOptions {
                config,
                config_path,
                socket,
            };
            let runtime = runtime()?;
            let served = runtime.block_on(async {
                credbroker::grpc::server::serve(options, shutdown_signal())
                    .await
                    .map_err(|e| e.to_string())
            });
            // Stopped: the tasks left are dropped (what they own, such as the socket file's
            // guard, cleaned up), but a blocking task still running (a reload reading a
            // stalled file) keeps the process at most this long after "credbroker stopped";
            // dropping the runtime would wait for it for ever.
            runtime.shutdown_timeout(EXIT_WAIT);
            served
        }
    }
}

/// How long the process waits, once stopped, for tasks still running (see `Serve`): long
/// enough for a dropped task to clean up, short next to Kubernetes' grace period.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// grpc.health.v1 Check over the Unix socket; returns the status name.
async fn health_check(socket: &std::path::Path, service: String) -> Result<String, String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = credbroker_proto::connect_unix(socket).await.map_err(|e| {
        format!(
            "cannot connect to {}: {}",
            socket.display(),
            credbroker::providers::upstream::error_chain(&e)
        )
    })?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest { service })
        .await
        .map_err(|s| {
            format!(
                "health check failed: {}: {}",
                credbroker_proto::code_name(s.code()),
                s.message()
            )
        })?;
    Ok(reply.into_inner().status().as_str_name().to_owned())
}

/// Log targets never shown below these levels, because their verbose output includes
/// credentials (the test `trace_logs_hold_no_secret` runs a signing flow at trace).
const SECRET_BEARING_TARGETS: &[&str] = &["aws_sigv4=info"];

/// Log targets shown at error only, because their warnings dump whole raw responses (kilobytes
/// per line: aws-config's credential chain and IMDS region lookup on a machine without AWS
/// identity). The broker logs each such failure itself, in one line that names what was tried
/// (the test `refusing_instance_metadata_still_lists_every_source_and_logs_no_dump`).
const NOISY_TARGETS: &[&str] = &["aws_config=error"];

/// Logs go to stderr; `RUST_LOG` filters them (default `info`).
fn init_logging(format: LogFormat) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Dependencies whose verbose output carries secrets, capped whatever RUST_LOG says:
    // aws-sigv4 traces each canonical request, session token included.
    // aws-config's warnings repeat, as multi-kilobyte dumps, failures the broker logs itself.
    for ceiling in SECRET_BEARING_TARGETS.iter().chain(NOISY_TARGETS) {
        if let Ok(directive) = ceiling.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
/// Registers for SIGTERM and SIGINT at once (before the socket is bound), so a signal that
/// arrives while the broker is still starting is a clean shutdown, not the default action
/// (death, leaving the socket behind); the returned future resolves on the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        let wait = |registered: std::io::Result<tokio::signal::unix::Signal>,
                    name: &'static str| async move {
            match registered {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot listen for {name} ({e}); use another signal to stop the broker"
                    );
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = wait(term, "SIGTERM") => {}
            () = wait(int, "SIGINT") => {}
        }
    }
}
