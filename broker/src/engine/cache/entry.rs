//! One entry: the credential it holds and its schedule on both clocks ([`Fresh`]), the fetch
//! running for it, its backoff, the clusters and callers it served, and what operators see of
//! it. Every change to an entry happens under its own lock ([`Slot::lock`]).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use futures_util::future::Shared;
use tokio::time::Instant;

use super::{
    BACKOFF_JITTER, CacheError, CacheKey, DENIAL_RETRY_AFTER, ENTRY_OVERHEAD, EntryInfo,
    EntryState, INITIAL_BACKOFF, LISTED_CLUSTERS, MAX_BACKOFF, MAX_LIFETIME, Outcome,
    REFRESH_FRACTION, REFRESH_JITTER, REFRESH_LEAD, STALE_MARGIN, Served,
};
use crate::base::clock::{last_whole_second_before, wall_now, whole_second_at_or_after};
use crate::engine::rejections::{self, CheckKey, CredentialDigest};
use crate::engine::review::Answer;
use crate::providers::{BoxFuture, Credential, ProviderError, Resolved};
use crate::request::{StoredRequest, TokenRequest};

pub(super) type Inflight = Shared<BoxFuture<'static, Result<Served, CacheError>>>;
/// A check of an entry's credential with its cluster's API server, running.
/// Its output: the answer, and the fetch a rejection started or joined (the callers waiting on
/// the check join it too, however soon it completes).
pub(super) type PendingCheck = Shared<BoxFuture<'static, (Answer, Option<Inflight>)>>;

/// What an entry holds decides which bound it counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// A credential (servable or not yet cleared): bounded by `maxEntries`.
    Held,
    /// No credential, its first fetch running: bounded by the fetch gate and its timeouts.
    Pending,
    /// No credential, no fetch: only a failure (backoff, last error) to remember.
    Failed,
}

impl Class {
    pub(super) const ALL: usize = 3;
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) state: Mutex<State>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) current: Option<Fresh>,
    pub(super) inflight: Option<Inflight>,
    pub(super) failures: u32,
    pub(super) retry_at: Option<Instant>,
    pub(super) last_error: Option<CacheError>,
    pub(super) last_access: Option<Instant>,
    /// The request of the last upstream call and what it resolved to, so an operator's
    /// forced refresh can fetch without a caller.
    pub(super) last_request: Option<(StoredRequest, Resolved)>,
    /// Sorted, at most [`LISTED_CLUSTERS`]. A `Vec`, not a `BTreeSet`: most entries serve
    /// one cluster (an EKS token per cluster), and a set's first node alone takes about
    /// 300 bytes per entry (BENCHMARKS.md, memory).
    pub(super) clusters: Vec<String>,
    pub(super) more_clusters: u32,
    pub(super) hits: u64,
    /// The callers served and the refreshes they forced; allocated at the first request
    /// that says who is asking.
    pub(super) rejections: Option<Box<rejections::Memory>>,
    /// The re-ask checks running, each for a credential and a server: at most one per key,
    /// and each holds one of the [`MAX_CONCURRENT_CHECKS`] slots, so few.
    pub(super) checking: Vec<(CheckKey, PendingCheck)>,
}

impl State {
    /// What the entry weighs for `cache.maxBytes`: the bytes it holds on the heap (its key,
    /// credential, the request kept for refreshes, the clusters listed, the last error, the
    /// callers remembered) plus [`ENTRY_OVERHEAD`]. An estimate, not an allocator's count.
    pub(super) fn weight(&self, key: &CacheKey) -> usize {
        ENTRY_OVERHEAD
            + key.identity.len()
            + self
                .current
                .as_ref()
                .map_or(0, |f| f.credential.heap_bytes())
            + self
                .last_request
                .as_ref()
                .map_or(0, |(req, target)| req.heap_bytes() + target.key().len())
            + self.clusters.iter().map(String::len).sum::<usize>()
            + self.last_error.as_ref().map_or(0, |e| e.to_string().len())
            + self.rejections.as_ref().map_or(0, |m| m.heap_bytes())
    }

    pub(super) fn class(&self) -> Class {
        if self.current.is_some() {
            Class::Held
        } else if self.inflight.is_some() {
            Class::Pending
        } else {
            Class::Failed
        }
    }

    pub(super) fn note_request(&mut self, req: &TokenRequest) {
        // Quoted: ListEntries shows it, so it is bounded and escaped like any caller text.
        let label = crate::base::text::quote(&req.cluster_label());
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

/// A stored credential and its schedule, on both clocks ([`crate::base::clock`]).
pub(super) struct Fresh {
    pub(super) credential: Credential,
    pub(super) refresh_at: Instant,
    pub(super) serve_until: Instant,
    pub(super) refresh_at_wall: SystemTime,
    pub(super) serve_until_wall: SystemTime,
    /// The last whole second before the credential's expiry: no come-back time is later.
    pub(super) latest_come_back: SystemTime,
    /// Computed once per fetch: callers' records compare against it.
    pub(super) digest: CredentialDigest,
}

impl State {
    pub(super) fn info(&self, key: CacheKey, now: Instant) -> EntryInfo {
        let state = if self.inflight.is_some() {
            EntryState::Refreshing
        } else if self.retry_at.is_some_and(|at| now < at) {
            EntryState::BackingOff
        } else {
            match &self.current {
                Some(f) if !f.due(now) => EntryState::Fresh,
                Some(f) if f.servable(now) => EntryState::Stale,
                _ => EntryState::Empty,
            }
        };
        let wall = |at: Instant| wall_now() + at.saturating_duration_since(now);
        EntryInfo {
            key,
            clusters: self.clusters.clone(),
            more_clusters: self.more_clusters,
            expires_at: self.current.as_ref().map(|f| f.credential.expires_at),
            refresh_at: self
                .current
                .as_ref()
                .map(|f| wall(f.refresh_at).min(f.refresh_at_wall)),
            hits: self.hits,
            state,
            last_error: self.last_error.as_ref().map(ToString::to_string),
            failures: self.failures,
            rejections: self
                .rejections
                .as_ref()
                .map(|m| m.info())
                .unwrap_or_default(),
        }
    }
}

impl Slot {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that
        // matters (every field is valid on its own), so keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the result of an upstream call and answers the callers waiting on it. Also
    /// says whether a refresh forced by a rejection got the rejected credential back.
    pub(super) fn complete(
        &self,
        result: Result<Credential, CacheError>,
        back_off: bool,
    ) -> (Result<Served, CacheError>, bool) {
        let mut st = self.lock();
        st.inflight = None;
        let now = Instant::now();
        let fetched = result.and_then(|credential| Fresh::new(credential, now));
        let returned_rejected = match (&fetched, &mut st.rejections) {
            (Ok(fresh), Some(memory)) => memory.fetched(fresh.digest) == Some(true),
            (Err(_), Some(memory)) => {
                memory.failed();
                false
            }
            (_, None) => false,
        };
        let served = match fetched {
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
                // A provider whose fetch is a local read tries again at the next call.
                st.retry_at = back_off.then(|| now + backoff(st.failures, fastrand::f64()));
                st.last_error = Some(error.clone());
                Err(error)
            }
            Err(error) => {
                // Denied, or the source is gone: what we hold must not be served again. An
                // upstream's denial is not asked again per caller; a missing source (a file,
                // a Secret) is looked for again at the next call.
                st.current = None;
                st.failures = 0;
                let denied = matches!(error, CacheError::Provider(ProviderError::Denied(_)));
                st.retry_at = (back_off && denied).then(|| now + DENIAL_RETRY_AFTER);
                st.last_error = Some(error.clone());
                Err(error)
            }
        };
        (served, returned_rejected)
    }
}

impl Fresh {
    pub(super) fn new(credential: Credential, now: Instant) -> Result<Self, CacheError> {
        let wall = wall_now();
        let remaining = credential
            .expires_at
            .duration_since(wall)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(CacheError::Expired)?;
        let latest_come_back = last_whole_second_before(credential.expires_at);
        let to_latest = latest_come_back
            .duration_since(wall)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(CacheError::ExpiresTooSoon(remaining))?;
        let (refresh_after, serve_for) = schedule(remaining.min(MAX_LIFETIME), fastrand::f64());
        // Served only while a whole second before expiry is left to send as the come-back.
        let serve_for = serve_for.min(to_latest);
        let refresh_after = refresh_after.min(serve_for);
        Ok(Self {
            digest: CredentialDigest::of(&credential),
            credential,
            refresh_at: now + refresh_after,
            serve_until: now + serve_for,
            refresh_at_wall: wall + refresh_after,
            serve_until_wall: wall + serve_for,
            latest_come_back,
        })
    }

    /// Whether it may be served: before the end of its serving window on both clocks.
    pub(super) fn servable(&self, now: Instant) -> bool {
        now < self.serve_until && wall_now() < self.serve_until_wall
    }

    /// Whether its refresh is due, on either clock.
    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.refresh_at || wall_now() >= self.refresh_at_wall
    }

    /// Before the refresh time the caller comes back then, when a newer credential is due;
    /// after it, at the end of the serving window. Rounded up to a whole second, but never
    /// past the last whole second before expiry.
    pub(super) fn serve(&self, now: Instant, outcome: Outcome) -> Served {
        let (target, target_wall) = if self.due(now) {
            (self.serve_until, self.serve_until_wall)
        } else {
            (self.refresh_at, self.refresh_at_wall)
        };
        // Whichever clock says it comes sooner.
        let at = (wall_now() + target.saturating_duration_since(now)).min(target_wall);
        Served {
            credential: self.credential.clone(),
            come_back: whole_second_at_or_after(at).min(self.latest_come_back),
            outcome,
        }
    }
}

/// A served come-back time on the cache's clock, to compare the caller's next call with.
pub(super) fn come_back_at(served: &Served, now: Instant) -> Instant {
    now + served
        .come_back
        .duration_since(wall_now())
        .unwrap_or_default()
}

/// When to refresh and how long to serve a credential of `lifetime`; `r` in [0, 1) picks
/// the jitter. Returns (refresh after, serve for), both measured from when it was fetched.
pub(super) fn schedule(lifetime: Duration, r: f64) -> (Duration, Duration) {
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
pub(super) fn backoff(failures: u32, r: f64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let base = INITIAL_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF);
    base.mul_f64(1.0 - BACKOFF_JITTER + 2.0 * BACKOFF_JITTER * r)
        .min(MAX_BACKOFF)
}
