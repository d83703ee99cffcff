//! The per-identity credential cache: one entry per (provider, identity), refreshed ahead of
//! expiry in the background, one upstream call for any number of concurrent misses, stale
//! credentials served through upstream outages (never past expiry), and per-entry backoff.
//!
//! Time comes from `tokio::time::Instant`, so every rule is tested on paused time.
//! Expiries arrive as wall-clock times from providers and are converted to `Instant`s once,
//! when the credential is stored.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use futures_util::FutureExt as _;
use futures_util::future::Shared;
use tokio::time::Instant;

use crate::providers::{BoxFuture, Credential, Provider, ProviderError};
use crate::request::{StoredRequest, TokenRequest};

/// The design's rule: refresh at about half the lifetime, so a refresh that fails has the
/// other half of the lifetime to succeed in.
pub const REFRESH_FRACTION: f64 = 0.5;
/// ± this fraction of the lifetime, so entries fetched together do not refresh together.
pub const REFRESH_JITTER: f64 = 0.1;
/// The design's rule: never refresh later than this before expiry. For tokens shorter than
/// twice this, it would leave less than half the lifetime, so the half-life rule wins.
pub const REFRESH_LEAD: Duration = Duration::from_secs(5 * 60);
/// Never serve a credential closer than this to its expiry (clock skew between the broker,
/// the caller and the API server; requests in flight). Tokens shorter than four times this
/// use a quarter of their lifetime instead, so a one-minute token is still served.
pub const STALE_MARGIN: Duration = Duration::from_secs(60);
/// First retry after an upstream failure: most failures are blips.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Retries never wait longer than this: a cached credential is served until one minute
/// before it expires, so a retry per minute still lands before that for any real token.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// ± this fraction of each backoff, so entries that failed together retry apart.
pub const BACKOFF_JITTER: f64 = 0.2;
/// Twice the shim's default wait: a slow upstream still fills the cache for the next caller,
/// a stuck one frees its entry for a new attempt.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// Which credential an entry holds: the provider's name and the identity it derived.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub provider: Arc<str>,
    pub identity: String,
}

/// How a request was answered, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served from the cache.
    Hit,
    /// Served from the cache past its refresh time (a refresh is running or backing off).
    Stale,
    /// Fetched from upstream for this request.
    Miss,
    /// Waited for a fetch another request had started.
    Joined,
}

/// A credential and when the caller should come back for a new one.
#[derive(Debug, Clone)]
pub struct Served {
    pub credential: Credential,
    /// Always in the future and at least [`STALE_MARGIN`] (or a quarter of the lifetime)
    /// before the credential's real expiry.
    pub come_back: SystemTime,
    pub outcome: Outcome,
}

/// Why the cache could not serve a credential.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A recent attempt failed and the entry is waiting before it tries again.
    #[error("{last} (retrying in {}s)", retry_in.as_secs().max(1))]
    BackingOff {
        last: Box<CacheError>,
        retry_in: Duration,
    },
    #[error("upstream did not answer within {}s", .0.as_secs())]
    UpstreamTimeout(Duration),
    #[error("upstream returned a credential that has already expired")]
    Expired,
    #[error("the upstream call failed unexpectedly: {0}")]
    Internal(String),
}

impl CacheError {
    /// Transient failures back off and leave a cached credential in service.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Provider(e) => e.is_transient(),
            Self::BackingOff { last, .. } => last.is_transient(),
            Self::UpstreamTimeout(_) | Self::Expired | Self::Internal(_) => true,
        }
    }
}

/// Clusters listed per entry in [`EntryInfo`]; the rest are only counted. An identity can
/// serve thousands of clusters (one GCP token for every GKE cluster).
pub const LISTED_CLUSTERS: usize = 32;

/// Tunables, from the `cache` section of the config.
#[derive(Debug, Clone)]
pub struct CacheSettings {
    pub max_entries: u64,
    pub idle_timeout: Duration,
    pub upstream_timeout: Duration,
}

/// Told about every upstream call the cache makes (metrics, provider health).
pub trait CacheObserver: Send + Sync {
    /// `background` is true for refresh-ahead calls no caller waits on.
    fn upstream_call(
        &self,
        provider: &str,
        elapsed: Duration,
        result: Result<(), &CacheError>,
        background: bool,
    );
}

/// What an operator sees of an entry: never the credential itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    pub key: CacheKey,
    pub clusters: Vec<String>,
    pub more_clusters: u32,
    pub expires_at: Option<SystemTime>,
    pub refresh_at: Option<SystemTime>,
    pub hits: u64,
    pub state: EntryState,
    pub last_error: Option<String>,
    pub failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Holds a credential before its refresh time.
    Fresh,
    /// Holds a credential past its refresh time, with no refresh running.
    Stale,
    /// An upstream call is running.
    Refreshing,
    /// The last upstream call failed; the next waits for the backoff.
    BackingOff,
    /// Holds nothing servable.
    Empty,
}

impl EntryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Stale => "stale",
            Self::Refreshing => "refreshing",
            Self::BackingOff => "backing-off",
            Self::Empty => "empty",
        }
    }
}

/// The cache. Cheap to share behind an `Arc`.
pub struct Cache {
    slots: moka::sync::Cache<CacheKey, Arc<Slot>>,
    settings: CacheSettings,
    observer: Option<Arc<dyn CacheObserver>>,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("entries", &self.slots.entry_count())
            .field("settings", &self.settings)
            .finish()
    }
}

type Inflight = Shared<BoxFuture<'static, Result<Served, CacheError>>>;

#[derive(Default)]
struct Slot {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    current: Option<Fresh>,
    inflight: Option<Inflight>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: Option<CacheError>,
    last_access: Option<Instant>,
    /// The request of the last upstream call, so an operator's forced refresh can fetch
    /// without a caller.
    last_request: Option<StoredRequest>,
    /// Sorted, at most [`LISTED_CLUSTERS`]. A `Vec`, not a `BTreeSet`: most entries serve
    /// one cluster (an EKS token per cluster), and a set's first node alone takes about
    /// 300 bytes per entry (BENCHMARKS.md, memory).
    clusters: Vec<String>,
    more_clusters: u32,
    hits: u64,
}

impl State {
    fn note_request(&mut self, req: &TokenRequest) {
        let label = req.cluster_label();
        if let Err(at) = self.clusters.binary_search(&label) {
            if self.clusters.len() < LISTED_CLUSTERS {
                if self.clusters.is_empty() {
                    self.clusters.reserve_exact(1);
                }
                self.clusters.insert(at, label);
            } else {
                self.more_clusters = self.more_clusters.saturating_add(1);
            }
        }
    }
}

/// A stored credential and its schedule.
struct Fresh {
    credential: Credential,
    refresh_at: Instant,
    serve_until: Instant,
}

impl Cache {
    pub fn new(settings: CacheSettings) -> Self {
        let slots = moka::sync::Cache::builder()
            .max_capacity(settings.max_entries)
            .build();
        Self {
            slots,
            settings,
            observer: None,
        }
    }

    /// Reports every upstream call to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn CacheObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Serves the credential for `key`, fetching it with `provider` on a miss. A hit never
    /// waits on upstream; concurrent misses for one key share one fetch.
    pub async fn get(
        &self,
        key: CacheKey,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
    ) -> Result<Served, CacheError> {
        let slot = self.slots.get_with(key, || Arc::new(Slot::default()));
        let (fetch, outcome) = {
            let mut st = slot.lock();
            let now = Instant::now();
            st.last_access = Some(now);
            st.note_request(req);
            if let Some(fresh) = &st.current {
                if now < fresh.serve_until && provider.is_current(req, &fresh.credential) {
                    let due = now >= fresh.refresh_at;
                    let served = fresh.serve(now, if due { Outcome::Stale } else { Outcome::Hit });
                    let may_retry = st.retry_at.is_none_or(|at| now >= at);
                    st.hits += 1;
                    if due && st.inflight.is_none() && may_retry {
                        // Refresh ahead in the background; this caller does not wait.
                        drop(self.start_fetch(&slot, &mut st, provider, req, true));
                    }
                    return Ok(served);
                }
                st.current = None;
            }
            if let Some(inflight) = &st.inflight {
                (inflight.clone(), Outcome::Joined)
            } else {
                if let (Some(at), Some(last)) = (st.retry_at, &st.last_error)
                    && now < at
                {
                    return Err(CacheError::BackingOff {
                        last: Box::new(last.clone()),
                        retry_in: at - now,
                    });
                }
                (
                    self.start_fetch(&slot, &mut st, provider, req, false),
                    Outcome::Miss,
                )
            }
        };
        let mut served = fetch.await?;
        served.outcome = outcome;
        Ok(served)
    }

    /// Starts the one upstream call for a slot. It runs in its own task, so it completes
    /// (and fills the cache) even when every caller waiting on it has given up.
    fn start_fetch(
        &self,
        slot: &Arc<Slot>,
        st: &mut State,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
        background: bool,
    ) -> Inflight {
        st.last_request = Some(StoredRequest::new(req));
        let slot = Arc::clone(slot);
        let provider = Arc::clone(provider);
        let req = req.clone();
        let timeout = self.settings.upstream_timeout;
        let observer = self.observer.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let fetch = AssertUnwindSafe(provider.fetch(&req)).catch_unwind();
            let result = match tokio::time::timeout(timeout, fetch).await {
                Ok(Ok(result)) => result.map_err(CacheError::from),
                Ok(Err(_panic)) => Err(CacheError::Internal(format!(
                    "the {} provider panicked",
                    provider.kind()
                ))),
                Err(_elapsed) => Err(CacheError::UpstreamTimeout(timeout)),
            };
            let served = slot.complete(result);
            if let Some(observer) = observer {
                let outcome = served.as_ref().map(|_| ());
                observer.upstream_call(&req.provider, started.elapsed(), outcome, background);
            }
            served
        });
        let joined: BoxFuture<'static, _> = Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(CacheError::Internal(e.to_string())))
        });
        let shared = joined.shared();
        st.inflight = Some(shared.clone());
        shared
    }

    /// Drops entries nobody asked for within the idle timeout; returns how many.
    pub fn sweep_idle(&self) -> usize {
        let now = Instant::now();
        let idle = self.settings.idle_timeout;
        let mut dropped = 0;
        for (key, slot) in self.slots.iter() {
            let st = slot.lock();
            let is_idle = st.inflight.is_none()
                && st
                    .last_access
                    .is_none_or(|at| now.saturating_duration_since(at) >= idle);
            drop(st);
            if is_idle {
                self.slots.invalidate(&*key);
                dropped += 1;
            }
        }
        dropped
    }

    /// Runs [`Cache::sweep_idle`] periodically for as long as the cache lives.
    pub fn spawn_idle_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        // Sweep a few times per idle period, at least every minute, at most every second.
        let period =
            (self.settings.idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let cache: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(cache) = cache.upgrade() else { return };
                cache.sweep_idle();
            }
        })
    }

    /// What the cache holds, for operators: no credential, only its schedule and health.
    pub fn entries(&self) -> Vec<EntryInfo> {
        let now = Instant::now();
        let mut out: Vec<EntryInfo> = self
            .slots
            .iter()
            .map(|(key, slot)| slot.lock().info(CacheKey::clone(&key), now))
            .collect();
        out.sort_by(|a, b| {
            (&a.key.provider, &a.key.identity).cmp(&(&b.key.provider, &b.key.identity))
        });
        out
    }

    /// The keys of the entries that match.
    pub fn keys(&self, matches: impl Fn(&CacheKey) -> bool) -> Vec<CacheKey> {
        self.slots
            .iter()
            .filter(|(key, _)| matches(key))
            .map(|(key, _)| CacheKey::clone(&key))
            .collect()
    }

    /// Drops every entry whose key matches; returns how many.
    pub fn invalidate(&self, matches: impl Fn(&CacheKey) -> bool) -> usize {
        let keys = self.keys(matches);
        for key in &keys {
            self.slots.invalidate(key);
        }
        keys.len()
    }

    /// Fetches an entry anew now (joining a fetch already running), with the request that
    /// last used it. Backoff does not apply: an operator asked for it.
    pub async fn refresh(
        &self,
        key: &CacheKey,
        provider: &Arc<dyn Provider>,
    ) -> Result<(), CacheError> {
        let Some(slot) = self.slots.get(key) else {
            return Err(CacheError::Internal(format!(
                "no entry for provider {:?}, identity {:?}",
                key.provider, key.identity
            )));
        };
        let fetch = {
            let mut st = slot.lock();
            match (
                &st.inflight,
                st.last_request.as_ref().map(StoredRequest::request),
            ) {
                (Some(inflight), _) => inflight.clone(),
                (None, Some(req)) => self.start_fetch(&slot, &mut st, provider, &req, true),
                (None, None) => {
                    return Err(CacheError::Internal(
                        "the entry has never been asked for".into(),
                    ));
                }
            }
        };
        fetch.await.map(|_| ())
    }

    /// Entries currently held (after pending evictions are applied).
    pub fn entry_count(&self) -> u64 {
        self.slots.run_pending_tasks();
        self.slots.entry_count()
    }
}

impl State {
    fn info(&self, key: CacheKey, now: Instant) -> EntryInfo {
        let state = if self.inflight.is_some() {
            EntryState::Refreshing
        } else if self.retry_at.is_some_and(|at| now < at) {
            EntryState::BackingOff
        } else {
            match &self.current {
                Some(f) if now < f.refresh_at => EntryState::Fresh,
                Some(f) if now < f.serve_until => EntryState::Stale,
                _ => EntryState::Empty,
            }
        };
        let wall = |at: Instant| SystemTime::now() + at.saturating_duration_since(now);
        EntryInfo {
            key,
            clusters: self.clusters.clone(),
            more_clusters: self.more_clusters,
            expires_at: self.current.as_ref().map(|f| f.credential.expires_at),
            refresh_at: self.current.as_ref().map(|f| wall(f.refresh_at)),
            hits: self.hits,
            state,
            last_error: self.last_error.as_ref().map(ToString::to_string),
            failures: self.failures,
        }
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that
        // matters (every field is valid on its own), so keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the result of an upstream call and answers the callers waiting on it.
    fn complete(&self, result: Result<Credential, CacheError>) -> Result<Served, CacheError> {
        let mut st = self.lock();
        st.inflight = None;
        let now = Instant::now();
        match result.and_then(|credential| Fresh::new(credential, now)) {
            Ok(fresh) => {
                st.failures = 0;
                st.retry_at = None;
                st.last_error = None;
                let served = fresh.serve(now, Outcome::Miss);
                st.current = Some(fresh);
                Ok(served)
            }
            Err(error) if error.is_transient() => {
                st.failures = st.failures.saturating_add(1);
                st.retry_at = Some(now + backoff(st.failures, fastrand::f64()));
                st.last_error = Some(error.clone());
                Err(error)
            }
            Err(error) => {
                // Denied, or the source is gone: what we hold must not be served again.
                st.current = None;
                st.failures = 0;
                st.retry_at = None;
                st.last_error = Some(error.clone());
                Err(error)
            }
        }
    }
}

impl Fresh {
    fn new(credential: Credential, now: Instant) -> Result<Self, CacheError> {
        let lifetime = credential
            .expires_at
            .duration_since(SystemTime::now())
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(CacheError::Expired)?;
        let (refresh_after, serve_for) = schedule(lifetime, fastrand::f64());
        Ok(Self {
            credential,
            refresh_at: now + refresh_after,
            serve_until: now + serve_for,
        })
    }

    /// Before the refresh time the caller comes back then, when a newer credential is due;
    /// after it, at the end of the serving window.
    fn serve(&self, now: Instant, outcome: Outcome) -> Served {
        let come_back = if now < self.refresh_at {
            self.refresh_at
        } else {
            self.serve_until
        };
        Served {
            credential: self.credential.clone(),
            come_back: SystemTime::now() + come_back.saturating_duration_since(now),
            outcome,
        }
    }
}

/// When to refresh and how long to serve a credential of `lifetime`; `r` in [0, 1) picks
/// the jitter. Returns (refresh after, serve for), both measured from when it was fetched.
fn schedule(lifetime: Duration, r: f64) -> (Duration, Duration) {
    let margin = STALE_MARGIN.min(lifetime / 4);
    let serve_for = lifetime - margin;
    let fraction = REFRESH_FRACTION + REFRESH_JITTER * (2.0 * r - 1.0);
    let mut refresh_after = lifetime.mul_f64(fraction);
    if lifetime >= REFRESH_LEAD * 2 {
        refresh_after = refresh_after.min(lifetime - REFRESH_LEAD);
    }
    (refresh_after.min(serve_for), serve_for)
}

/// The wait after the `failures`-th failure in a row; `r` in [0, 1) picks the jitter.
fn backoff(failures: u32, r: f64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let base = INITIAL_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF);
    base.mul_f64(1.0 - BACKOFF_JITTER + 2.0 * BACKOFF_JITTER * r)
        .min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests;
