//! A provider for tests: counts its calls (and how many run at once), can be slowed down,
//! and fails on demand.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::config::values::ProviderKind;
use crate::request::TokenRequest;

use super::{BoxFuture, Credential, Provider, ProviderError, Resolved};

#[derive(Debug)]
pub struct FakeProvider {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    behaviour: Mutex<Behaviour>,
}

#[derive(Debug, Clone)]
struct Behaviour {
    delay: Duration,
    ttl: Duration,
    expires_at: Option<SystemTime>,
    failure: Option<ProviderError>,
    fixed_token: Option<String>,
}

/// Counts a fetch out of `in_flight` however it ends (completed, or dropped on a timeout).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FakeProvider {
    /// Issues `fake-<clusterName>-<call number>` tokens that live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            calls: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            behaviour: Mutex::new(Behaviour {
                delay: Duration::ZERO,
                ttl,
                expires_at: None,
                failure: None,
                fixed_token: None,
            }),
        }
    }

    /// How many times `fetch` has been called.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The most fetches that have run at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Every credential from now on expires at `at` (instead of `ttl` after its fetch).
    pub fn set_expires_at(&self, at: Option<SystemTime>) {
        self.lock().expires_at = at;
    }

    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    pub fn set_ttl(&self, ttl: Duration) {
        self.lock().ttl = ttl;
    }

    /// Every fetch from now on fails with `error` (or succeeds again with `None`).
    pub fn fail_with(&self, error: Option<ProviderError>) {
        self.lock().failure = error;
    }

    /// Every fetch from now on returns `token` (a source not rotated), or numbered tokens
    /// again with `None`.
    pub fn set_fixed_token(&self, token: Option<&str>) {
        self.lock().fixed_token = token.map(str::to_owned);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Behaviour> {
        self.behaviour
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Provider for FakeProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Exec
    }

    /// The cluster's `clusterName` (else `default`), as key and target alike.
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        let identity = req
            .config_str("clusterName")
            .unwrap_or_else(|| "default".into());
        Ok(Resolved::new(identity.clone(), identity))
    }

    fn fetch<'a>(
        &'a self,
        _req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let now_running = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            let _running = InFlight(&self.in_flight);
            self.max_in_flight.fetch_max(now_running, Ordering::SeqCst);
            let behaviour = self.lock().clone();
            tokio::time::sleep(behaviour.delay).await;
            if let Some(error) = behaviour.failure {
                return Err(error);
            }
            let identity: &String = target.target()?;
            Ok(Credential::token(
                behaviour
                    .fixed_token
                    .unwrap_or_else(|| format!("fake-{identity}-{n}")),
                behaviour
                    .expires_at
                    .unwrap_or_else(|| crate::base::clock::wall_now() + behaviour.ttl),
            ))
        })
    }
}
