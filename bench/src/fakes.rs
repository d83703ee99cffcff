//! The cloud endpoints the bench's brokers reach, on the test harness's fakes
//! ([`credbroker_tests::FakeHttps`] and its STS, GCE metadata and Entra answers), each
//! answering a credential call after a fixed delay (the 200 ms) and counting them:
//! AWS STS `AssumeRole` (plain HTTP at `AWS_ENDPOINT_URL_STS`), the GCE metadata server's
//! token (plain HTTP at `GCE_METADATA_HOST`), and Entra ID's token endpoint (HTTPS at
//! `AZURE_AUTHORITY_HOST`, with a throwaway CA the broker trusts through `SSL_CERT_FILE`).
//! Token lifetimes are adjustable while running, so one fake serves both the cold-start and
//! the fast-clock steady-state runs.
//!
//! The scenarios see only [`Clouds`]: the three fakes, their call counts and the broker
//! environment that points at them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use credbroker_tests::fakes::{entra, gce_metadata, sts};
use credbroker_tests::{FakeHttps, Reply, Seen};

/// The three fake clouds a run's brokers are pointed at.
#[derive(Debug)]
pub struct Clouds {
    pub sts: Fake,
    pub metadata: Fake,
    pub entra: Fake,
}

impl Clouds {
    /// Starts all three, answering after `delay` with credentials that live `lifetime`.
    pub fn start(delay: Duration, lifetime: Duration) -> Clouds {
        Clouds {
            sts: Fake::start(Kind::Sts, delay, lifetime),
            metadata: Fake::start(Kind::Metadata, delay, lifetime),
            entra: Fake::start(Kind::Entra, delay, lifetime),
        }
    }

    /// Zeroes the call counts; credentials issued from now on live `lifetime`.
    pub fn reset(&self, lifetime: Duration) {
        for f in [&self.sts, &self.metadata, &self.entra] {
            f.reset_calls();
            f.set_lifetime(lifetime);
        }
    }

    /// Credential calls served: (AssumeRole, metadata token, Entra token).
    pub fn calls(&self) -> (u64, u64, u64) {
        (self.sts.calls(), self.metadata.calls(), self.entra.calls())
    }

    /// The CAs the broker must trust to reach the TLS fakes, as one PEM bundle.
    pub fn ca_bundle(&self) -> String {
        [&self.sts, &self.metadata, &self.entra]
            .iter()
            .map(|f| f.server.ca_pem())
            .collect()
    }

    /// The variables that point each cloud's client at its fake; `ca_file` holds
    /// [`Clouds::ca_bundle`].
    pub fn endpoint_env(&self, ca_file: &Path) -> [(&'static str, String); 4] {
        [
            ("AWS_ENDPOINT_URL_STS", self.sts.url()),
            ("GCE_METADATA_HOST", self.metadata.host()),
            ("AZURE_AUTHORITY_HOST", self.entra.url()),
            ("SSL_CERT_FILE", ca_file.display().to_string()),
        ]
    }
}

/// Which cloud endpoint a fake plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sts,
    Metadata,
    Entra,
}

/// A running fake; stops when dropped.
#[derive(Debug)]
pub struct Fake {
    server: FakeHttps,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    kind: Kind,
    calls: AtomicU64,
    delay: Duration,
    lifetime_s: AtomicU64,
}

impl Fake {
    /// Starts on 127.0.0.1 (an ephemeral port): Entra over TLS, STS and metadata over plain
    /// HTTP (how clients reach the metadata server; STS at a plain `AWS_ENDPOINT_URL_STS`).
    pub fn start(kind: Kind, delay: Duration, lifetime: Duration) -> Fake {
        let state = Arc::new(State {
            kind,
            calls: AtomicU64::new(0),
            delay,
            lifetime_s: AtomicU64::new(lifetime.as_secs()),
        });
        let st = Arc::clone(&state);
        let handler = move |seen: &Seen| st.answer(seen);
        let server = match kind {
            Kind::Entra => FakeHttps::spawn(handler),
            Kind::Sts | Kind::Metadata => FakeHttps::spawn_plain(handler),
        };
        Fake { server, state }
    }

    /// Credential calls answered so far (AssumeRole, metadata token, Entra token).
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::SeqCst)
    }

    pub fn reset_calls(&self) {
        self.state.calls.store(0, Ordering::SeqCst);
    }

    /// Lifetime of the credentials issued from now on.
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.state
            .lifetime_s
            .store(lifetime.as_secs(), Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        self.server.url().to_owned()
    }

    /// `host:port`, as `GCE_METADATA_HOST` takes it.
    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }
}

impl State {
    /// A credential call is counted when it arrives and answered after the delay; anything
    /// else is a 404 at once.
    fn answer(&self, req: &Seen) -> Reply {
        let is_credential_call = match self.kind {
            Kind::Sts => req.method == "POST" && req.body.contains("Action=AssumeRole"),
            Kind::Metadata => {
                req.method == "GET"
                    && req.path == gce_metadata::METADATA_TOKEN_PATH
                    && req.header("metadata-flavor") == Some("Google")
            }
            Kind::Entra => req.method == "POST" && req.path.ends_with("/oauth2/v2.0/token"),
        };
        if !is_credential_call {
            return Reply::new(404, "not found").header("content-type", "text/plain");
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let life = self.lifetime_s.load(Ordering::SeqCst);
        let reply = match self.kind {
            Kind::Sts => Reply::new(
                200,
                sts::assume_role_ok(n as usize, Duration::from_secs(life)),
            )
            .header("content-type", "text/xml"),
            Kind::Metadata => {
                Reply::from(gce_metadata::token_body(&format!("ya29.bench-{n}"), life))
            }
            Kind::Entra => entra::token_reply(&format!("entra-bench-{n}"), life),
        };
        reply.after(self.delay)
    }
}
