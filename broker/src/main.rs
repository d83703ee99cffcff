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
            let providers: Vec<String> = config
                .providers
                .iter()
                .map(|p| format!("{} ({})", p.name, p.kind))
                .collect();
            println!(
                "{}: ok; socket {}; providers: {}",
                file.display(),
                config.socket.path.display(),
                providers.join(", ")
            );
            Ok(())
        }
        Command::Serve { config, socket } => {
            init_logging();
            let config = match config {
                Some(file) => Config::load(&file).map_err(|e| e.to_string())?,
                None => Config::embedded_default(),
            };
            let socket = socket.unwrap_or_else(|| config.socket.path.clone());
            if !socket.is_absolute() {
                return Err(format!(
                    "--socket must be an absolute path, got {}",
                    socket.display()
                ));
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the async runtime: {e}"))?;
            runtime.block_on(async {
                credbroker::server::serve(&config, &socket, shutdown_signal())
                    .await
                    .map_err(|e| e.to_string())
            })
        }
    }
}

/// Logs go to stderr; `RUST_LOG` filters them (default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Resolves on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); only SIGINT stops the broker");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
