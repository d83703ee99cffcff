//! A Kubernetes API server stand-in for kubectl: 401 for a bearer token it does not accept,
//! like the real one (authentication comes before everything); for one it accepts, what a
//! real server answers on the paths kubectl and the broker use: `/version`, `/api`, `/apis`,
//! `/api/v1` and an empty pod list in `default`, a SelfSubjectReview (201) on
//! `POST /apis/authentication.k8s.io/v1/selfsubjectreviews` (the broker's re-ask check), and
//! 200 with a small JSON body anywhere else.
//!
//! Why a fake beside the real one: kubectl runs through the shim against a real kube-apiserver
//! in the real-cluster suite (`e2e/`, `TestKubectlThroughTheShim`: one-shot runs and `kubectl
//! proxy` recovering from a revoked token), which needs root and Go. This fake stays for a
//! plain `cargo test` and for what a real server does not give a test: the exact token each
//! request carried, which server it reached, and any `/version` (the Google Cloud SDK's kubectl
//! dispatcher re-executes itself only for a server version it has a binary for, 1.31 here).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde_json::json;

use super::{FakeHttps, Reply, Seen};

/// One request the fake API server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// Request path.
    pub path: String,
    /// Bearer token, if an `Authorization: Bearer` header was sent.
    pub token: Option<String>,
    /// Status code answered (200 or 401).
    pub status: u16,
}

/// HTTPS on 127.0.0.1 with a fresh self-signed CA: 200 + a small JSON body when the
/// bearer token is accepted, else 401 `{"kind":"Status","code":401}`. Stops on drop.
#[derive(Debug)]
pub struct FakeApiServer {
    server: FakeHttps,
    accepted: Arc<Mutex<HashSet<String>>>,
}

/// The version [`FakeApiServer::start`] reports: the real kube-apiserver the suite pins.
pub const FAKE_SERVER_MINOR: u32 = 36;

impl FakeApiServer {
    /// Starts a server accepting exactly `accepted` bearer tokens, reporting Kubernetes
    /// 1.[`FAKE_SERVER_MINOR`].
    pub fn start(accepted: &[&str]) -> FakeApiServer {
        Self::start_at(accepted, FAKE_SERVER_MINOR)
    }

    /// [`FakeApiServer::start`] reporting Kubernetes `1.<minor>` on `/version`: the Google
    /// Cloud SDK's `kubectl` dispatcher re-executes itself as `kubectl.1.<minor>` when it
    /// has that version, as it does against a real cluster of that version.
    pub fn start_at(accepted: &[&str], minor: u32) -> FakeApiServer {
        let accepted: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(
            accepted.iter().map(|t| (*t).to_owned()).collect(),
        ));
        let tokens = Arc::clone(&accepted);
        let server = FakeHttps::spawn(move |req: &Seen| {
            let ok = req
                .bearer()
                .is_some_and(|t| tokens.lock().expect("lock").contains(t));
            if ok {
                answer(req, minor)
            } else {
                Reply::json(
                    401,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": "Unauthorized", "reason": "Unauthorized", "code": 401}),
                )
            }
        });
        FakeApiServer { server, accepted }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// PEM of the CA that signed the server certificate.
    pub fn ca_pem(&self) -> &str {
        self.server.ca_pem()
    }

    /// Accept one more token from now on.
    pub fn accept(&self, token: &str) {
        self.accepted.lock().expect("lock").insert(token.to_owned());
    }

    /// Accept none of the tokens accepted so far (they were revoked).
    pub fn revoke_all(&self) {
        self.accepted.lock().expect("lock").clear();
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.server
            .seen()
            .into_iter()
            .map(|s| SeenRequest {
                token: s.bearer().map(str::to_owned),
                path: s.path,
                status: s.status,
            })
            .collect()
    }

    /// The broker's re-ask checks so far: each SelfSubjectReview and the status answered.
    pub fn reviews(&self) -> Vec<SeenRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == REVIEW_PATH)
            .collect()
    }

    /// Every bearer token seen so far (in order, with repeats).
    pub fn seen_tokens(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter_map(|r| r.token)
            .collect()
    }
}

const REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// A real server's answer for an authenticated request, on the paths kubectl uses.
fn answer(req: &Seen, minor: u32) -> Reply {
    match (req.method.as_str(), req.path.as_str()) {
        ("POST", REVIEW_PATH) => Reply::json(
            201,
            &json!({"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                    "metadata": {"creationTimestamp": null},
                    "status": {"userInfo": {"username": "fake-user", "groups": ["system:authenticated"]}}}),
        ),
        (_, "/version") => Reply::json(
            200,
            &json!({"major": "1", "minor": minor.to_string(), "gitVersion": format!("v1.{minor}.3"),
                    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.26.8", "compiler": "gc",
                    "platform": "linux/amd64"}),
        ),
        (_, "/apis") => Reply::json(
            200,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ),
        (_, "/api/v1") => Reply::json(
            200,
            &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                    "resources": [{"name": "pods", "singularName": "pod", "namespaced": true,
                                   "kind": "Pod", "verbs": ["get", "list"], "shortNames": ["po"]}]}),
        ),
        (_, "/api/v1/namespaces/default/pods") => Reply::json(
            200,
            &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}),
        ),
        _ => Reply::json(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        ),
    }
}
