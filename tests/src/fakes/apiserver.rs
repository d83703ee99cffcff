//! A Kubernetes API server stand-in for kubectl: answers any path with 200 and a small JSON
//! body when the bearer token is one it accepts, else 401 like the real one.

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

impl FakeApiServer {
    /// Starts a server accepting exactly `accepted` bearer tokens.
    pub fn start(accepted: &[&str]) -> FakeApiServer {
        let accepted: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(
            accepted.iter().map(|t| (*t).to_owned()).collect(),
        ));
        let tokens = Arc::clone(&accepted);
        let server = FakeHttps::spawn(move |req: &Seen| {
            let ok = req
                .bearer()
                .is_some_and(|t| tokens.lock().expect("lock").contains(t));
            if ok {
                Reply::json(
                    200,
                    &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                )
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

    /// Every bearer token seen so far (in order, with repeats).
    pub fn seen_tokens(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter_map(|r| r.token)
            .collect()
    }
}
