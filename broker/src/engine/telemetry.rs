//! What the broker tells about its upstream calls: the cache's observer ([`Telemetry`])
//! feeds every call into the metrics, each provider's [`Health`] (what AdminService
//! `ListProviders` shows) and a warning in the log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::base::text::one_line;
use crate::engine::cache::{CacheError, CacheObserver};
use crate::engine::metrics::Metrics;
use crate::engine::review::Answer;

/// How many characters of an upstream error a log line quotes: a provider's error with its
/// quoted plugin or upstream output fits, a runaway one does not fill the log.
const MAX_LOGGED_ERROR_CHARS: usize = 1024;

/// Each provider's last upstream success and failure, fed by the cache's observer.
#[derive(Debug, Default)]
pub struct ProviderHealth {
    by_provider: Mutex<HashMap<String, Health>>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Health {
    pub last_success: Option<SystemTime>,
    pub last_error: Option<(String, SystemTime)>,
    /// Whether the most recent upstream call failed.
    pub failing: bool,
}

/// What `ListProviders` says of a provider: `available` is [`Provider::available`]
/// (`crate::providers::Provider`).
impl Health {
    /// `unavailable`, `failing`, `untested` (no upstream call recorded yet: nothing says its
    /// identity works) or `ready`.
    pub fn state(&self, available: bool) -> &'static str {
        if !available {
            "unavailable"
        } else if self.failing {
            "failing"
        } else if self.last_success.is_none() {
            "untested"
        } else {
            "ready"
        }
    }
}

impl ProviderHealth {
    pub fn record(&self, provider: &str, result: Result<(), &CacheError>) {
        let mut map = self
            .by_provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let health = map.entry(provider.to_owned()).or_default();
        match result {
            Ok(()) => {
                health.last_success = Some(SystemTime::now());
                health.failing = false;
            }
            Err(e) => {
                health.last_error = Some((e.to_string(), SystemTime::now()));
                health.failing = true;
            }
        }
    }

    pub fn get(&self, provider: &str) -> Health {
        let map = self
            .by_provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(provider).cloned().unwrap_or_default()
    }
}

/// Feeds every upstream call the cache makes into the metrics and provider health, and
/// logs failures at warn.
#[derive(Debug)]
pub struct Telemetry {
    metrics: Arc<Metrics>,
    health: Arc<ProviderHealth>,
}

impl Telemetry {
    pub fn new(metrics: Arc<Metrics>, health: Arc<ProviderHealth>) -> Self {
        Self { metrics, health }
    }
}

impl CacheObserver for Telemetry {
    fn upstream_call(
        &self,
        provider: &str,
        elapsed: Duration,
        result: Result<(), &CacheError>,
        background: bool,
    ) {
        self.metrics
            .upstream(provider, elapsed, result.is_ok(), background);
        self.health.record(provider, result);
        if let Err(error) = result {
            let error = one_line(&error.to_string(), MAX_LOGGED_ERROR_CHARS);
            // A string field, so the text log quotes it: an error holding caller text (a cluster
            // name with spaces and `key=value`) cannot pose as fields of its own.
            tracing::warn!(
                provider,
                background,
                ?elapsed,
                error = error.as_str(),
                "upstream call failed"
            );
        }
    }

    fn reask_checked(&self, provider: &str, answer: &Answer) {
        self.metrics.reask_checked(provider, answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_untested_until_an_upstream_call_is_made() {
        let h = ProviderHealth::default();
        assert_eq!(h.get("p").state(true), "untested");
        assert_eq!(h.get("p").state(false), "unavailable");
        h.record("p", Ok(()));
        assert_eq!(h.get("p").state(true), "ready");
        h.record("p", Err(&CacheError::Expired));
        assert_eq!(h.get("p").state(true), "failing");
        assert_eq!(h.get("p").state(false), "unavailable");
    }

    #[test]
    fn health_tracks_the_last_call() {
        let h = ProviderHealth::default();
        assert_eq!(h.get("p"), Health::default());
        h.record("p", Err(&CacheError::Expired));
        assert!(h.get("p").failing);
        h.record("p", Ok(()));
        let now = h.get("p");
        assert!(!now.failing && now.last_success.is_some() && now.last_error.is_some());
    }
}
