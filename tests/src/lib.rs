//! Harness for credbroker's end-to-end tests (and the bench's fakes).
//!
//! The tests drive the real binaries (`credbroker`, `credbroker-shim`) over a real Unix
//! socket, with real peers (`kubectl`, `grpcurl`) and local fakes of the upstreams. One
//! module per subject, everything re-exported here:
//!
//! - [`process`]: [`bin`] builds both binaries once per test process; [`run`], [`Running`],
//!   [`wait_until`], [`tempdir`]: every child bounded and killed on drop;
//! - [`broker`]: config snippets ([`exec_provider`], [`file_provider`], [`provider`]),
//!   [`Broker`] and its [`BrokerBuilder`] (config, environment, flags), [`get_token`];
//! - [`shim`]: [`run_shim`] / [`spawn_shim`], [`assert_credential`] / [`assert_shim_error`];
//! - [`plugins`]: [`ExecPlugin`] (a counting exec plugin), [`TokenFiles`], and
//!   [`modal_plugin`] (a plugin whose behaviour changes while the broker runs);
//! - [`peers`]: [`kubectl`] with [`write_kubeconfig`], [`grpcurl`], [`unix_channel`],
//!   [`HungServer`], [`scrape_metrics`];
//! - [`fakes`]: [`FakeHttps`] and the upstreams on it (STS, GCE metadata and Google OAuth,
//!   Entra ID, a Kubernetes API server), and [`fakes::kube_api`] (list and watch of Secrets);
//! - [`doc_blocks`]: the fenced blocks of README.md and docs/, by kind (docs are tested);
//! - [`alerts`]: the deploy's alert rules run by `promtool` on series scraped from `/metrics`;
//! - [`arch`]: the arm64 build of both binaries and qemu wrappers that run it here;
//! - [`kueue`]: Kueue's own manifests (e2e/peers.sh), which the deploy and docs tests render
//!   `deploy/` over.
//!
//! Every wait is bounded and every child process is killed when its owner is dropped.

use std::time::Duration;

pub mod alerts;
pub mod arch;
pub mod broker;
pub mod doc_blocks;
pub mod fakes;
pub mod kueue;
pub mod modal_plugin;
pub mod peers;
pub mod plugins;
pub mod process;
pub mod shim;

pub use broker::*;
pub use fakes::apiserver::{FAKE_SERVER_MINOR, FakeApiServer, SeenRequest};
pub use fakes::{FakeHttps, Reply, Seen, parse_form, serve_tls, tls_config};
pub use peers::*;
pub use plugins::*;
pub use process::*;
pub use shim::*;

/// `apiVersion` of client-go's v1 ExecCredential.
pub const V1: &str = "client.authentication.k8s.io/v1";
/// `apiVersion` of client-go's v1beta1 ExecCredential.
pub const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// Name of the broker binary.
pub const BROKER: &str = "credbroker";
/// Name of the shim binary.
pub const SHIM: &str = "credbroker-shim";

/// How long the broker gets to start listening or to exit after SIGTERM.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(15);
/// Hard bound for one shim run (the shim's own default `--timeout` is 30 s).
pub const SHIM_TIMEOUT: Duration = Duration::from_secs(45);
/// Hard bound for other one-shot commands (kubectl, grpcurl, `credbroker check-config`).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
