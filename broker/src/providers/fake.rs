//! A provider for tests: counts its calls, can be slowed down, and fails on demand.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::config::ProviderKind;
use crate::request::TokenRequest;

use super::{BoxFuture, Credential, Provider, ProviderError};

#[derive(Debug)]
pub struct FakeProvider {
    calls: AtomicUsize,
    behaviour: Mutex<Behaviour>,
}

#[derive(Debug, Clone)]
struct Behaviour {
    delay: Duration,
    ttl: Duration,
    failure: Option<ProviderError>,
}

impl FakeProvider {
    /// Issues `fake-<clusterName>-<call number>` tokens that live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            calls: AtomicUsize::new(0),
            behaviour: Mutex::new(Behaviour {
                delay: Duration::ZERO,
                ttl,
                failure: None,
            }),
        }
    }

    /// How many times `fetch` has been called.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
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

    fn identity(&self, req: &TokenRequest) -> Result<String, ProviderError> {
        Ok(req
            .config_str("clusterName")
            .unwrap_or_else(|| "default".into()))
    }

    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let behaviour = self.lock().clone();
            tokio::time::sleep(behaviour.delay).await;
            if let Some(error) = behaviour.failure {
                return Err(error);
            }
            let identity = self.identity(req)?;
            Ok(Credential::token(
                format!("fake-{identity}-{n}"),
                SystemTime::now() + behaviour.ttl,
            ))
        })
    }
}
