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
//! environment that points at them. The anchors section also uses [`hub`] (the API server
//! cluster-inventory-api's secretreader reads its Secrets from) and [`workers`] (the worker
//! clusters' API server the client-go fleet reaches); the hostile section's re-ask part uses
//! [`ReviewServer`] (the victim's API server, answering the broker's re-ask checks).

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
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
    /// Requests that were not credential calls (Entra's OpenID configuration, 404s).
    other: AtomicU64,
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
            other: AtomicU64::new(0),
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

    /// Requests answered that were not credential calls (Entra's OpenID configuration).
    pub fn other_requests(&self) -> u64 {
        self.state.other.load(Ordering::SeqCst)
    }

    pub fn reset_calls(&self) {
        self.state.calls.store(0, Ordering::SeqCst);
        self.state.other.store(0, Ordering::SeqCst);
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
            self.other.fetch_add(1, Ordering::SeqCst);
            // MSAL (kubelogin) reads the authority's OpenID configuration before a token call
            // when instance discovery is off: answered at once, as Entra's CDN does.
            if self.kind == Kind::Entra
                && req.method == "GET"
                && req.path.ends_with("/v2.0/.well-known/openid-configuration")
            {
                return openid_configuration(req);
            }
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

/// Entra's `/<tenant>/v2.0/.well-known/openid-configuration`, naming this fake (the `Host` the
/// client sent) as the token endpoint.
fn openid_configuration(req: &Seen) -> Reply {
    let host = req.header("host").unwrap_or("127.0.0.1");
    let tenant = req
        .path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    let base = format!("https://{host}/{tenant}");
    Reply::json(
        200,
        &serde_json::json!({
            "token_endpoint": format!("{base}/oauth2/v2.0/token"),
            "authorization_endpoint": format!("{base}/oauth2/v2.0/authorize"),
            "device_authorization_endpoint": format!("{base}/oauth2/v2.0/devicecode"),
            "issuer": format!("{base}/v2.0"),
            "jwks_uri": format!("{base}/discovery/v2.0/keys"),
            "end_session_endpoint": format!("{base}/oauth2/v2.0/logout"),
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "scopes_supported": ["openid", "profile", "email", "offline_access"],
            "tenant_region_scope": "NA",
        }),
    )
}

/// A loopback HTTPS fake (a throwaway CA) that tallies the requests it answers and those it
/// refuses: its handler returns `Ok` for an answer, `Err` for a refusal.
#[derive(Debug)]
pub struct Tallied {
    server: FakeHttps,
    answered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl Tallied {
    fn spawn(handler: impl Fn(&Seen) -> Result<Reply, Reply> + Send + Sync + 'static) -> Tallied {
        let answered = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let (a, r) = (Arc::clone(&answered), Arc::clone(&refused));
        let server = FakeHttps::spawn(move |req: &Seen| {
            let (reply, count) = match handler(req) {
                Ok(reply) => (reply, &a),
                Err(reply) => (reply, &r),
            };
            count.fetch_add(1, Ordering::SeqCst);
            reply
        });
        Tallied {
            server,
            answered,
            refused,
        }
    }

    /// Requests answered.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }

    /// Requests refused.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    pub fn reset(&self) {
        self.answered.store(0, Ordering::SeqCst);
        self.refused.store(0, Ordering::SeqCst);
    }

    pub fn url(&self) -> &str {
        self.server.url()
    }

    pub fn ca_pem(&self) -> &str {
        self.server.ca_pem()
    }
}

/// The namespace of the Secrets on the hub and the bearer token of the hub's kubeconfig.
pub const HUB_NAMESPACE: &str = "kueue-system";
pub const HUB_TOKEN: &str = "bench-hub-reader-token";

/// The hub API server secretreader reads `Secret <namespace>/<clusterName>` from: a `GET` of
/// a Secret with the hub token is a credential call, answered after the delay with
/// `data.token` = `sr-<clusterName>`; anything else is refused (401 without the token, 404
/// for another path).
pub fn hub(delay: Duration) -> Tallied {
    let prefix = format!("/api/v1/namespaces/{HUB_NAMESPACE}/secrets/");
    Tallied::spawn(move |req: &Seen| {
        if req.bearer() != Some(HUB_TOKEN) {
            return Err(Reply::json(
                401,
                &serde_json::json!({"kind": "Status", "code": 401}),
            ));
        }
        match req.path.strip_prefix(&prefix) {
            Some(name) if req.method == "GET" && !name.is_empty() && !name.contains('/') => {
                let token = base64::engine::general_purpose::STANDARD.encode(format!("sr-{name}"));
                Ok(Reply::json(
                    200,
                    &serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": HUB_NAMESPACE}, "type": "Opaque", "data": {"token": token}}),
                )
                .after(delay))
            }
            _ => Err(Reply::json(
                404,
                &serde_json::json!({"kind": "Status", "code": 404}),
            )),
        }
    })
}

/// The worker clusters' API server for the client-go fleet: `GET /version` with a bearer
/// token is answered at once; without one it is a 401.
pub fn workers() -> Tallied {
    Tallied::spawn(|req: &Seen| match req.bearer() {
        Some(t) if !t.is_empty() && req.path == "/version" => Ok(Reply::json(
            200,
            &serde_json::json!({"major": "1", "minor": "36", "gitVersion": "v1.36.3", "platform": "linux/amd64"}),
        )),
        _ => Err(Reply::json(
            401,
            &serde_json::json!({"kind": "Status", "code": 401}),
        )),
    })
}

/// The victim's API server in the hostile section's re-ask part: the broker's re-ask check (a
/// SelfSubjectReview, `POST /apis/authentication.k8s.io/v1/selfsubjectreviews`) is answered
/// after a set latency, 401 for a token the bench revoked, 201 for any other; counted.
#[derive(Debug)]
pub struct ReviewServer {
    server: FakeHttps,
    revoked: Arc<Mutex<HashSet<String>>>,
    rejected: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
}

impl ReviewServer {
    pub fn start(latency: Duration) -> ReviewServer {
        let revoked: Arc<Mutex<HashSet<String>>> = Arc::default();
        let (rejected, accepted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (r, rej, acc) = (
            Arc::clone(&revoked),
            Arc::clone(&rejected),
            Arc::clone(&accepted),
        );
        let server = FakeHttps::spawn(move |req: &Seen| {
            let bearer = req.bearer().unwrap_or_default();
            let known = !bearer.is_empty() && !r.lock().expect("revoked").contains(bearer);
            let reply = if !known {
                rej.fetch_add(1, Ordering::SeqCst);
                Reply::json(
                    401,
                    &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "message": "Unauthorized", "reason": "Unauthorized", "code": 401}),
                )
            } else if req.method == "POST"
                && req.path == "/apis/authentication.k8s.io/v1/selfsubjectreviews"
            {
                acc.fetch_add(1, Ordering::SeqCst);
                Reply::json(
                    201,
                    &serde_json::json!({"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                                        "status": {"userInfo": {"username": "bench-victim"}}}),
                )
            } else {
                Reply::json(404, &serde_json::json!({"kind": "Status", "code": 404}))
            };
            reply.after(latency)
        });
        ReviewServer {
            server,
            revoked,
            rejected,
            accepted,
        }
    }

    /// From now on `token` is answered 401.
    pub fn revoke(&self, token: &str) {
        self.revoked
            .lock()
            .expect("revoked")
            .insert(token.to_owned());
    }

    /// Requests answered 401 so far (re-ask checks that found a revoked token).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::SeqCst)
    }

    /// Re-ask checks answered 201 so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> &str {
        self.server.url()
    }

    pub fn ca_pem(&self) -> &str {
        self.server.ca_pem()
    }
}
