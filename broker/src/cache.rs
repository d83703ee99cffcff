//! The per-identity credential cache: one entry per (provider, identity), refreshed ahead of
//! expiry in the background, one upstream call for any number of concurrent misses, stale
//! credentials served through upstream outages (never past expiry), and per-entry backoff.
//!
//! The bound (`cache.maxEntries`) is on entries that hold a credential: only a fetch that
//! succeeds can push another credential out (the least recently used). Entries still fetching
//! their first credential do not count, and entries that hold only a failure (backoff state,
//! the last error) live under their own small bound, [`MAX_REMEMBERED_FAILURES`]. What entries
//! weigh together is bounded too (`cache.maxBytes`): a request can carry tens of KiB that
//! `limits.*` admit (CA data, the exec extension, the server), so a count alone bounds
//! nothing. Each entry's weight ([`State::weight`]) is what it holds on the heap plus
//! [`ENTRY_OVERHEAD`], recomputed whenever a fetch completes and at every idle sweep; past
//! the bound, remembered failures go first, then the least recently used credentials. Upstream
//! calls run through a per-provider gate of `cache.maxConcurrentFetches` permits ([`Gate`]),
//! whether a caller, a background refresh or an operator started them: refreshes of held
//! credentials have a reserve no miss can take, and misses share the rest fairly between uids.
//! A caller that joins a fetch already running takes no permit.
//!
//! Time comes from `tokio::time::Instant`, so every rule is tested on paused time.
//! Expiries arrive as wall-clock times from providers and are converted to `Instant`s once,
//! when the credential is stored.

use std::collections::HashMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use futures_util::FutureExt as _;
use futures_util::future::Shared;
use tokio::time::Instant;

use crate::gate::{Bounds, Full, Gate, Permit, Purpose};
use crate::providers::{BoxFuture, Credential, Provider, ProviderError, Resolved};
use crate::rejections::{
    self, CallerId, CheckKey, ClusterDigest, CredentialDigest, Reask, RejectionInfo, Verdict,
};
use crate::request::{StoredRequest, TokenRequest};
use crate::review::{
    Answer, ApiServerCheck, CHECK_TIMEOUT, CredentialCheck, MAX_CONCURRENT_CHECKS,
};

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
/// How long the cache waits for any upstream call. Defined with the config's shared values,
/// since provider sections (an exec plugin's `timeout`) are checked against it.
pub use crate::values::UPSTREAM_TIMEOUT;
/// No credential is scheduled as living longer than this, whatever its expiry says (a JWT
/// `exp` in the year 9999, a plugin's far-off `expirationTimestamp`): it is refreshed by half
/// of it and served at most until then. A day is longer than any cloud token (Azure managed
/// identity tokens, the longest, live 24 h), so real tokens keep their own schedule; for
/// longer-lived ones the only cost is reading the source again once or twice a day.
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// Identities whose last fetch failed and that hold no credential (their backoff and last
/// error) are remembered up to this many; past it the least recently asked quarter is
/// forgotten (they fetch again at their next call, without backoff). Enough to back off every
/// cluster of a 1 000-cluster fleet cold-started during an outage; at a few hundred bytes
/// each, well under a MiB. Kept apart from `cache.maxEntries`, so failures never push a
/// held credential out.
pub const MAX_REMEMBERED_FAILURES: usize = 1024;
/// What `cache.maxBytes` counts for an entry besides the bytes of its strings: the map slot,
/// the state, its locks and `Arc`s. BENCHMARKS.md measured 1 615 bytes of RSS per EKS entry
/// holding a 493-byte token and a request of about 100 bytes, so about 1 KiB.
pub const ENTRY_OVERHEAD: usize = 1024;

/// Which credential an entry holds: the provider's name and the identity it resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub provider: Arc<str>,
    pub identity: String,
}

impl CacheKey {
    /// The key of what `provider` resolved a request to.
    pub fn new(provider: &str, resolved: &Resolved) -> Self {
        Self {
            provider: provider.into(),
            identity: resolved.key().to_owned(),
        }
    }
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
    /// A whole second (client-go's precision), always in the future and strictly before
    /// the credential's real expiry: the refresh time (rounded up), or past it the end of
    /// the serving window ([`STALE_MARGIN`], or a quarter of the lifetime, before expiry).
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
    /// Callers get whole seconds to come back at (client-go's `expirationTimestamp`); a
    /// credential with no whole second left before its expiry cannot be handed out.
    #[error(
        "upstream returned a credential that expires in {}ms, too soon to hand out (a caller needs a whole second before expiry)",
        .0.as_millis()
    )]
    ExpiresTooSoon(Duration),
    /// Every upstream permit of the provider stayed taken while this fetch queued.
    #[error(
        "all {limit} upstream calls this provider may run at once (cache.maxConcurrentFetches) stayed busy for {}s; try again later, or raise the limit if the upstream takes more",
        waited.as_secs()
    )]
    Busy { limit: usize, waited: Duration },
    #[error("the upstream call failed unexpectedly: {0}")]
    Internal(String),
}

impl CacheError {
    /// Transient failures back off and leave a cached credential in service.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Provider(e) => e.is_transient(),
            Self::BackingOff { last, .. } => last.is_transient(),
            Self::UpstreamTimeout(_)
            | Self::Expired
            | Self::ExpiresTooSoon(_)
            | Self::Busy { .. }
            | Self::Internal(_) => true,
        }
    }
}

/// A check's answer stands for re-asks about the same credential for this long: one client
/// rebuilding its clients for many clusters re-asks in a burst, and each answer is a request
/// to an API server. Short, because a credential revoked just after a check that accepted
/// it is then served once more than need be, and client-go asks again at its next 401.
pub const CHECK_REUSE: Duration = Duration::from_secs(1);

/// How long a re-ask waits for a check slot ([`MAX_CONCURRENT_CHECKS`], shared fairly between
/// uids, [`Gate::for_checks`]) before it is answered "unreachable" (the credential held is
/// served). Twice [`CHECK_TIMEOUT`]: every running check ends within one, so a uid holding no
/// slot gets the first that frees before it gives up, and its check, bounded from when it
/// starts, then takes its own server's time. Waits this long only when every slot is busy.
pub const CHECK_WAIT: Duration = CHECK_TIMEOUT.saturating_mul(2);
/// Re-asks of one uid that may wait for a check slot at once; past it the re-ask is answered
/// "unreachable" at once. A Kueue rebuilding its clients for a 1 000-cluster fleet (one entry
/// per cluster) re-asks about each at once: they all wait their turn. A waiting re-ask is the
/// caller's own call, queued: the queue keeps a few dozen bytes for it and a grant channel
/// ([`WAITING_CHECK_BYTES`]), no copy of the request, no client, no CA store (those are built
/// once it holds a slot).
pub const MAX_WAITING_CHECKS_PER_UID: usize = 1024;
/// Re-asks that may wait for a check slot at once, whatever their uids: four uids at their own
/// bound, about 1 MiB of queue at most.
pub const MAX_WAITING_CHECKS: usize = 4 * MAX_WAITING_CHECKS_PER_UID;
/// What the queue keeps per waiting re-ask, measured by `cache::tests`: its place (about 40
/// bytes) and the channel its slot comes by (an allocation of about 100).
pub const WAITING_CHECK_BYTES: usize = 256;

/// Clusters listed per entry in [`EntryInfo`]; the rest are only counted. An identity can
/// serve thousands of clusters (one GCP token for every GKE cluster).
pub const LISTED_CLUSTERS: usize = 32;

/// Tunables, from the `cache` section of the config.
#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// Entries holding a credential.
    pub max_entries: u64,
    /// What entries may weigh together ([`State::weight`]).
    pub max_bytes: u64,
    pub idle_timeout: Duration,
    /// Bounds an upstream call, and separately its wait for a permit.
    pub upstream_timeout: Duration,
    /// Upstream calls each provider may run at once.
    pub max_concurrent_fetches: usize,
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

    /// A re-ask was checked with the cluster's API server (see [`crate::rejections`]): once
    /// per check, however many callers waited on it.
    fn reask_checked(&self, _provider: &str, _answer: &Answer) {}
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
    pub rejections: RejectionInfo,
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
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table>,
    settings: CacheSettings,
    observer: Option<Arc<dyn CacheObserver>>,
    /// Asks a cluster's API server about a re-asked credential ([`crate::review`]).
    checker: Arc<dyn CredentialCheck>,
    /// One gate per provider name (only configured names reach the cache).
    gates: Mutex<HashMap<Arc<str>, Gate>>,
    /// The re-ask check slots, shared fairly between uids.
    checks: Gate,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("entries", &self.inner.table().slots.len())
            .field("settings", &self.inner.settings)
            .finish()
    }
}

/// What an entry holds decides which bound it counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A credential (servable or not yet cleared): bounded by `maxEntries`.
    Held,
    /// No credential, its first fetch running: bounded by the fetch gate and its timeouts.
    Pending,
    /// No credential, no fetch: only a failure (backoff, last error) to remember.
    Failed,
}

impl Class {
    const ALL: usize = 3;
    fn index(self) -> usize {
        self as usize
    }
}

struct Placed {
    class: Class,
    slot: Arc<Slot>,
    /// [`State::weight`] when last weighed.
    weight: usize,
}

/// Every entry, and how many of each class, kept in step under one lock. Lock order: the
/// table, then a slot; never a slot, then the table.
#[derive(Default)]
struct Table {
    slots: HashMap<CacheKey, Placed>,
    counts: [usize; Class::ALL],
    /// The sum of the entries' weights.
    bytes: usize,
}

impl Table {
    fn remove(&mut self, key: &CacheKey) -> Option<Placed> {
        let placed = self.slots.remove(key)?;
        self.counts[placed.class.index()] -= 1;
        self.bytes -= placed.weight;
        Some(placed)
    }

    /// Weighs the entry at `key` again.
    fn reweigh(&mut self, key: &CacheKey, weight: usize) {
        if let Some(placed) = self.slots.get_mut(key) {
            self.bytes = self.bytes - placed.weight + weight;
            placed.weight = weight;
        }
    }

    /// Makes room under `cache.maxBytes`: forgets remembered failures, then drops credentials
    /// that can no longer be served, then the least recently used ones; never an entry that is
    /// fetching (its callers wait on it) and never `keep` (what just came in).
    fn evict_bytes(&mut self, max: u64, keep: Option<&CacheKey>, now: Instant) {
        while u64::try_from(self.bytes).unwrap_or(u64::MAX) > max {
            let victim = self
                .slots
                .iter()
                .filter(|(key, placed)| placed.class != Class::Pending && Some(*key) != keep)
                .filter_map(|(key, placed)| {
                    let st = placed.slot.lock();
                    let servable = st.current.as_ref().is_some_and(|f| f.servable(now));
                    st.inflight
                        .is_none()
                        .then(|| ((placed.class == Class::Held, servable, st.last_access), key))
                })
                .min_by_key(|(rank, _)| *rank)
                .map(|(_, key)| key.clone());
            let Some(victim) = victim else { return };
            self.remove(&victim);
        }
    }

    /// Makes room after a credential came in: drops the least recently used entry that holds
    /// one and is not fetching, those that can no longer be served first. Never `keep`.
    fn evict_held(&mut self, max: u64, keep: &CacheKey, now: Instant) {
        while u64::try_from(self.counts[Class::Held.index()]).unwrap_or(u64::MAX) > max {
            let victim = self
                .slots
                .iter()
                .filter(|(key, placed)| placed.class == Class::Held && *key != keep)
                .filter_map(|(key, placed)| {
                    let st = placed.slot.lock();
                    let servable = st.current.as_ref().is_some_and(|f| f.servable(now));
                    st.inflight
                        .is_none()
                        .then(|| ((servable, st.last_access), key))
                })
                .min_by_key(|(rank, _)| *rank)
                .map(|(_, key)| key.clone());
            let Some(victim) = victim else { return };
            self.remove(&victim);
        }
    }

    /// Forgets the least recently asked quarter of the remembered failures once there are
    /// more than [`MAX_REMEMBERED_FAILURES`] (a batch, so a flood of failures costs one scan
    /// per quarter of the bound).
    fn evict_failed(&mut self) {
        if self.counts[Class::Failed.index()] <= MAX_REMEMBERED_FAILURES {
            return;
        }
        let mut failed: Vec<(Option<Instant>, CacheKey)> = self
            .slots
            .iter()
            .filter(|(_, placed)| placed.class == Class::Failed)
            .filter_map(|(key, placed)| {
                let st = placed.slot.lock();
                st.inflight.is_none().then(|| (st.last_access, key.clone()))
            })
            .collect();
        failed.sort_unstable_by_key(|(at, _)| *at);
        let excess = self.counts[Class::Failed.index()] - MAX_REMEMBERED_FAILURES * 3 / 4;
        for (_, key) in failed.into_iter().take(excess) {
            self.remove(&key);
        }
    }
}

type Inflight = Shared<BoxFuture<'static, Result<Served, CacheError>>>;
/// A check of an entry's credential with its cluster's API server, running.
/// Its output: the answer, and the fetch a rejection started or joined (the callers waiting on
/// the check join it too, however soon it completes).
type PendingCheck = Shared<BoxFuture<'static, (Answer, Option<Inflight>)>>;

/// What a re-ask about the credential held needs, found under the entry's lock.
enum CheckStep {
    /// The same check (credential and server) is running: wait for its answer.
    Join(PendingCheck),
    /// None is: wait for a check slot, then start it.
    Start(CheckKey),
}

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
    /// The request of the last upstream call and what it resolved to, so an operator's
    /// forced refresh can fetch without a caller.
    last_request: Option<(StoredRequest, Resolved)>,
    /// Sorted, at most [`LISTED_CLUSTERS`]. A `Vec`, not a `BTreeSet`: most entries serve
    /// one cluster (an EKS token per cluster), and a set's first node alone takes about
    /// 300 bytes per entry (BENCHMARKS.md, memory).
    clusters: Vec<String>,
    more_clusters: u32,
    hits: u64,
    /// The callers served and the refreshes they forced; allocated at the first request
    /// that says who is asking.
    rejections: Option<Box<rejections::Memory>>,
    /// The re-ask checks running, each for a credential and a server: at most one per key,
    /// and each holds one of the [`MAX_CONCURRENT_CHECKS`] slots, so few.
    checking: Vec<(CheckKey, PendingCheck)>,
}

impl State {
    /// What the entry weighs for `cache.maxBytes`: the bytes it holds on the heap (its key,
    /// credential, the request kept for refreshes, the clusters listed, the last error, the
    /// callers remembered) plus [`ENTRY_OVERHEAD`]. An estimate, not an allocator's count.
    fn weight(&self, key: &CacheKey) -> usize {
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

    fn class(&self) -> Class {
        if self.current.is_some() {
            Class::Held
        } else if self.inflight.is_some() {
            Class::Pending
        } else {
            Class::Failed
        }
    }

    fn note_request(&mut self, req: &TokenRequest) {
        // Quoted: ListEntries shows it, so it is bounded and escaped like any caller text.
        let label = crate::text::quote(&req.cluster_label());
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

/// The wall clock. The schedule runs on two clocks: the monotonic one (tokio's `Instant`,
/// what paused-time tests drive) and this one, which expiries are stated in. Where the
/// monotonic clock lags the wall clock (a suspended or paused VM, a checkpointed and restored
/// container, a stepped clock), only the wall clock knows a credential has expired, so every
/// rule checks both. Tests move it ahead on their own thread ([`tests::wall_ahead`]).
pub(crate) fn wall_now() -> SystemTime {
    #[cfg(test)]
    {
        SystemTime::now() + tests::WALL_AHEAD.with(std::cell::Cell::get)
    }
    #[cfg(not(test))]
    {
        SystemTime::now()
    }
}

/// A stored credential and its schedule, on both clocks ([`wall_now`]).
struct Fresh {
    credential: Credential,
    refresh_at: Instant,
    serve_until: Instant,
    refresh_at_wall: SystemTime,
    serve_until_wall: SystemTime,
    /// The last whole second before the credential's expiry: no come-back time is later.
    latest_come_back: SystemTime,
    /// Computed once per fetch: callers' records compare against it.
    digest: CredentialDigest,
}

impl Cache {
    pub fn new(settings: CacheSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                table: Mutex::default(),
                settings,
                observer: None,
                checker: Arc::new(ApiServerCheck::default()),
                gates: Mutex::default(),
                checks: Gate::for_checks(
                    MAX_CONCURRENT_CHECKS,
                    Bounds {
                        per_uid: MAX_CONCURRENT_CHECKS,
                        waiting_per_uid: MAX_WAITING_CHECKS_PER_UID,
                        waiting: MAX_WAITING_CHECKS,
                    },
                ),
            }),
        }
    }

    /// Reports every upstream call to `observer`. Call before sharing the cache.
    pub fn with_observer(mut self, observer: Arc<dyn CacheObserver>) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.observer = Some(observer),
            None => tracing::error!("Cache::with_observer called on a shared cache; ignored"),
        }
        self
    }

    /// Checks re-asked credentials with `checker` instead of the API server (tests). Call
    /// before sharing the cache.
    pub fn with_checker(mut self, checker: Arc<dyn CredentialCheck>) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.checker = checker,
            None => tracing::error!("Cache::with_checker called on a shared cache; ignored"),
        }
        self
    }

    /// Serves the credential for what `provider` resolved `req` to (keyed on the provider's
    /// name and the resolved identity), fetching it with `provider` on a miss. A hit never
    /// waits on upstream; concurrent misses for one key share one fetch.
    pub async fn get(
        &self,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
        target: &Resolved,
    ) -> Result<Served, CacheError> {
        self.get_for(provider, req, target, None, None).await
    }

    /// [`Cache::get`] for a caller that says who it is: the same caller asking again before
    /// the come-back time it was given (a re-ask, [`crate::rejections`]) waits for a check of
    /// the held credential with the cluster's API server ([`crate::review`]), single-flight
    /// per entry; only a rejection (or a request that cannot be checked) fetches anew,
    /// bounded, single-flight with every other fetch. `uid` (the socket peer's) is whose
    /// miss this is, for the fair share of the provider's permits ([`Gate`]).
    pub async fn get_for(
        &self,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
        target: &Resolved,
        caller: Option<&CallerId>,
        uid: Option<u32>,
    ) -> Result<Served, CacheError> {
        let key = CacheKey::new(&req.provider, target);
        let (slot, placed_as) = self.inner.slot_for(&key);
        // A re-ask waits for the check, then is judged again with its answer (or with none,
        // when what it asked about was replaced meanwhile): once, since a pass that has been
        // judged never starts a check.
        let mut judged: Option<Option<Answer>> = None;
        let (fetch, outcome, moved, forced) = loop {
            let step: Result<_, CheckStep> = 'pass: {
                let mut guard = slot.lock();
                let st = &mut *guard;
                let now = Instant::now();
                if judged.is_none() {
                    st.last_access = Some(now);
                    st.note_request(req);
                }
                let answer = match (&judged, caller, &st.current) {
                    (Some(answer), _, _) => answer.clone(),
                    (None, Some(caller), Some(fresh)) if fresh.servable(now) => {
                        let digest = fresh.digest;
                        let memory = st.rejections.get_or_insert_default();
                        match memory.reask(caller, uid, now, digest) {
                            Reask::Held => {
                                let about = CheckKey {
                                    credential: digest,
                                    cluster: ClusterDigest::of(req.cluster.as_ref()),
                                };
                                match memory.recent_answer(now, &about, CHECK_REUSE).cloned() {
                                    Some(answer) => Some(answer),
                                    None => {
                                        break 'pass Err(
                                            match st.checking.iter().find(|(k, _)| *k == about) {
                                                Some((_, running)) => {
                                                    CheckStep::Join(running.clone())
                                                }
                                                None => CheckStep::Start(about),
                                            },
                                        );
                                    }
                                }
                            }
                            Reask::No | Reask::Superseded => None,
                        }
                    }
                    _ => None,
                };
                let may_retry = st.retry_at.is_none_or(|at| now >= at);
                // The source changed under what is held (a file rewritten, a Secret updated):
                // fetched anew, and what is held stays in service until that works.
                let mut changed = false;
                if let Some(fresh) = &st.current {
                    if !fresh.servable(now) {
                        st.current = None;
                    } else if !provider.is_current(target, &fresh.credential) {
                        changed = true;
                    } else {
                        // A rejection joins the fetch it started, a background refresh or
                        // another caller's; with none running, what is held is served.
                        let forced = answer
                            .as_ref()
                            .is_some_and(|a| a.forces_refresh() && st.inflight.is_some());
                        if !forced {
                            let due = fresh.due(now);
                            let served =
                                fresh.serve(now, if due { Outcome::Stale } else { Outcome::Hit });
                            let digest = fresh.digest;
                            st.hits += 1;
                            if due && st.inflight.is_none() && may_retry {
                                // Refresh ahead in the background; this caller does not wait.
                                drop(
                                    self.start_fetch(&slot, st, provider, req, target, None, true),
                                );
                            }
                            if let (Some(caller), Some(memory)) = (caller, &mut st.rejections) {
                                memory.served(
                                    *caller,
                                    uid,
                                    now,
                                    come_back_at(&served, now),
                                    digest,
                                );
                            }
                            return Ok(served);
                        }
                    }
                }
                let forced = changed || answer.is_some_and(|a| a.forces_refresh());
                let (fetch, outcome) = if let Some(inflight) = &st.inflight {
                    (inflight.clone(), Outcome::Joined)
                } else {
                    if let (Some(at), Some(last)) = (st.retry_at, &st.last_error)
                        && now < at
                    {
                        if let (true, Some(fresh)) = (forced, &st.current) {
                            // Backing off: what is held, until the next attempt.
                            return Ok(fresh.serve(now, Outcome::Stale));
                        }
                        let err = CacheError::BackingOff {
                            last: Box::new(last.clone()),
                            retry_in: at - now,
                        };
                        let moved = st.class() != placed_as;
                        drop(guard);
                        if moved {
                            self.inner.reclassify(&key, &slot);
                        }
                        return Err(err);
                    }
                    (
                        self.start_fetch(&slot, st, provider, req, target, uid, false),
                        Outcome::Miss,
                    )
                };
                Ok((fetch, outcome, st.class() != placed_as, forced))
            };
            let pending = match step {
                Ok(wait) => break wait,
                Err(CheckStep::Join(running)) => Some(running),
                Err(CheckStep::Start(about)) => match self.check_slot(req, caller, uid).await {
                    // Holding a slot: the check starts now (or another caller's started
                    // meanwhile, and the slot goes back).
                    Ok(permit) => {
                        self.start_check(&slot, provider, req, target, caller, about, permit)
                    }
                    Err(answer) => {
                        judged = Some(Some(answer));
                        continue;
                    }
                },
            };
            match pending {
                // What was re-asked about is no longer held: judged anew, with no check.
                None => judged = Some(None),
                Some(pending) => match pending.await {
                    (_, Some(fetch)) => break (fetch, Outcome::Joined, false, true),
                    (answer, None) => judged = Some(Some(answer)),
                },
            }
        };
        if moved {
            // A remembered failure fetching again, or a credential gone while fetching anew.
            self.inner.reclassify(&key, &slot);
        }
        let result = fetch.await;
        let mut st = slot.lock();
        let now = Instant::now();
        let served = match result {
            Ok(mut served) => {
                served.outcome = outcome;
                served
            }
            // A forced refresh, or a changed source read again, that failed for a while
            // leaves what was served before in service, as for any caller before its
            // come-back time.
            Err(e) if forced && e.is_transient() => match &st.current {
                Some(fresh) if fresh.servable(now) => fresh.serve(now, Outcome::Stale),
                _ => return Err(e),
            },
            Err(e) => return Err(e),
        };
        let Some(caller) = caller else {
            return Ok(served);
        };
        let digest = CredentialDigest::of(&served.credential);
        let come_back = come_back_at(&served, now);
        st.rejections
            .get_or_insert_default()
            .served(*caller, uid, now, come_back, digest);
        Ok(served)
    }

    /// Waits for a check slot for `uid`'s re-ask: at most [`CHECK_WAIT`], and only while its
    /// uid and the broker have room in the queue. Holds nothing while it waits but its place.
    /// Without a slot, the re-ask is answered "unreachable" (the credential held stays in
    /// service, as when its server cannot be asked), logged, and not counted as a check.
    async fn check_slot(
        &self,
        req: &TokenRequest,
        caller: Option<&CallerId>,
        uid: Option<u32>,
    ) -> Result<Permit, Answer> {
        let why = match tokio::time::timeout(
            CHECK_WAIT,
            self.inner.checks.try_acquire(Purpose::Miss { uid }),
        )
        .await
        {
            Ok(Ok(permit)) => return Ok(permit),
            Ok(Err(full @ (Full::Uid(_) | Full::All(_)))) => full.to_string(),
            Err(_elapsed) => format!("every check slot stayed busy for {}s", CHECK_WAIT.as_secs()),
        };
        tracing::info!(
            provider = crate::text::quote(&req.provider),
            cluster = crate::text::quote(&req.cluster_label()),
            caller_pid = caller.map(|c| c.pid),
            uid,
            why,
            "re-ask not checked: no check slot; serving the credential held"
        );
        Err(Answer::Unreachable(why))
    }

    /// Starts the check of `about` (the credential the entry holds, with the re-ask's
    /// server) holding `permit`, or joins the one another caller started while this one
    /// waited for its slot (the slot then goes back at once). `None` when the entry no longer
    /// holds that credential. The check runs in its own task, so it completes (and its answer
    /// is acted on once) whatever the callers waiting on it do; its [`CHECK_TIMEOUT`] counts
    /// from here, and only now are the request copied and the check's client and trust built.
    #[allow(clippy::too_many_arguments)]
    fn start_check(
        &self,
        slot: &Arc<Slot>,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
        target: &Resolved,
        caller: Option<&CallerId>,
        about: CheckKey,
        permit: Permit,
    ) -> Option<PendingCheck> {
        let mut st = slot.lock();
        let now = Instant::now();
        let credential = match &st.current {
            Some(fresh) if fresh.digest == about.credential && fresh.servable(now) => {
                fresh.credential.clone()
            }
            _ => return None,
        };
        if let Some((_, running)) = st.checking.iter().find(|(k, _)| *k == about) {
            return Some(running.clone());
        }
        let caller = *caller?;
        let cache = Cache {
            inner: Arc::clone(&self.inner),
        };
        let slot = Arc::clone(slot);
        let provider = Arc::clone(provider);
        let req = req.clone();
        let target = target.clone();
        let task = tokio::spawn(async move {
            let check = cache.inner.checker.check(req.cluster.as_ref(), &credential);
            let answer = match tokio::time::timeout(CHECK_TIMEOUT, check).await {
                Ok(answer) => answer,
                Err(_elapsed) => {
                    Answer::Unreachable(format!("no answer within {}s", CHECK_TIMEOUT.as_secs()))
                }
            };
            drop(permit);
            let fetch = cache.checked(&slot, &provider, &req, &target, &caller, about, &answer);
            (answer, fetch)
        });
        let joined: BoxFuture<'static, _> = Box::pin(async move {
            task.await
                .unwrap_or_else(|e| (Answer::Unreachable(format!("the check failed: {e}")), None))
        });
        let shared = joined.shared();
        st.checking.push((about, shared.clone()));
        Some(shared)
    }

    /// Acts on a check's answer once: a rejection (or a re-ask that cannot be checked) starts
    /// the forced refresh when the bounds allow; then logs it and reports it. Returns the
    /// fetch the re-askers are to join: the one it started, or one already running.
    #[allow(clippy::too_many_arguments)]
    fn checked(
        &self,
        slot: &Arc<Slot>,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
        target: &Resolved,
        caller: &CallerId,
        about: CheckKey,
        answer: &Answer,
    ) -> Option<Inflight> {
        let caller_pid = caller.pid;
        let (next, fetch) = {
            let mut guard = slot.lock();
            let st = &mut *guard;
            st.checking.retain(|(k, _)| *k != about);
            let now = Instant::now();
            let verdict = st
                .rejections
                .get_or_insert_default()
                .answered(now, about, answer, caller);
            let holds = st
                .current
                .as_ref()
                .is_some_and(|f| f.digest == about.credential && f.servable(now));
            match verdict {
                None => (None, None),
                Some(_) if st.inflight.is_some() => (Some(Next::Join), st.inflight.clone()),
                Some(_) if !holds => (Some(Next::Replaced), None),
                Some(Verdict::Hold { next_in }) => (Some(Next::Hold(next_in)), None),
                Some(Verdict::Refresh) if st.retry_at.is_some_and(|at| now < at) => {
                    (Some(Next::BackingOff), None)
                }
                Some(Verdict::Refresh) => {
                    let fetch = self.start_fetch(slot, st, provider, req, target, None, false);
                    (Some(Next::Fetch), Some(fetch))
                }
            }
        };
        let provider_name = crate::text::quote(&req.provider);
        let cluster = crate::text::quote(&req.cluster_label());
        let server = crate::text::quote(req.cluster.as_ref().map_or("", |c| c.server.as_str()));
        let what = next.map(Next::describe).unwrap_or_default();
        let next_forced_refresh_in = match next {
            Some(Next::Hold(d)) => Some(d),
            _ => None,
        };
        match answer {
            Answer::Accepted(status) => tracing::debug!(
                provider = provider_name,
                cluster,
                caller_pid,
                status,
                "re-ask: the API server accepts the credential held (a second client in the same process); serving it"
            ),
            Answer::Rejected => tracing::warn!(
                provider = provider_name,
                cluster,
                server,
                caller_pid,
                ?next_forced_refresh_in,
                "rejection confirmed: the API server answered 401 to the credential the caller was served; {what}"
            ),
            Answer::Unreachable(why) => tracing::info!(
                provider = provider_name,
                cluster,
                server,
                caller_pid,
                why = crate::text::quote(why),
                "re-ask not checked: the API server could not be asked; serving the credential held (client-go cannot reach it either)"
            ),
            Answer::Unchecked(why) => tracing::warn!(
                provider = provider_name,
                cluster,
                caller_pid,
                why = crate::text::quote(why),
                ?next_forced_refresh_in,
                "re-ask taken as a rejection without a check; {what}"
            ),
        }
        if let Some(observer) = &self.inner.observer {
            observer.reask_checked(&req.provider, answer);
        }
        fetch
    }

    /// Starts the one upstream call for a slot. It runs in its own task, so it completes
    /// (and fills the cache) even when every caller waiting on it has given up. It first
    /// waits for one of the provider's permits (at most the upstream timeout): any permit if
    /// the entry holds a credential, else one outside the reserve, in `uid`'s fair share.
    /// Then the call itself gets the upstream timeout. The slot is the one `req`'s provider
    /// name and `target` key.
    #[allow(clippy::too_many_arguments)]
    fn start_fetch(
        &self,
        slot: &Arc<Slot>,
        st: &mut State,
        provider: &Arc<dyn Provider>,
        req: &TokenRequest,
        target: &Resolved,
        uid: Option<u32>,
        background: bool,
    ) -> Inflight {
        let purpose = if st.current.is_some() {
            Purpose::Refresh
        } else {
            Purpose::Miss { uid }
        };
        st.last_request = Some((
            StoredRequest::new(req, provider.reads_certificate_authority()),
            target.clone(),
        ));
        let inner = Arc::clone(&self.inner);
        let key = CacheKey::new(&req.provider, target);
        let slot = Arc::clone(slot);
        let provider = Arc::clone(provider);
        let req = req.clone();
        let target = target.clone();
        let gate = self.inner.gate(&key.provider);
        let task = tokio::spawn(async move {
            let timeout = inner.settings.upstream_timeout;
            let queued = Instant::now();
            let permit = tokio::time::timeout(timeout, gate.acquire(purpose)).await;
            let started = Instant::now();
            let result = match permit {
                Ok(_permit) => {
                    let fetch = AssertUnwindSafe(provider.fetch(&req, &target)).catch_unwind();
                    match tokio::time::timeout(timeout, fetch).await {
                        Ok(Ok(result)) => result.map_err(CacheError::from),
                        Ok(Err(_panic)) => Err(CacheError::Internal(format!(
                            "the {} provider panicked",
                            provider.kind()
                        ))),
                        Err(_elapsed) => Err(CacheError::UpstreamTimeout(timeout)),
                    }
                    // The permit is released here, with the provider's future dropped.
                }
                Err(_elapsed) => Err(CacheError::Busy {
                    limit: inner.settings.max_concurrent_fetches,
                    waited: queued.elapsed(),
                }),
            };
            let (served, returned_rejected) = slot.complete(result, !provider.retries_at_once());
            if returned_rejected {
                tracing::warn!(
                    provider = crate::text::quote(&key.provider),
                    cluster = crate::text::quote(&req.cluster_label()),
                    "a refresh forced by a rejection got back the very credential that was rejected; serving it, and fetching again only after the back-off (rotate the source if it is stale)"
                );
            }
            inner.reclassify(&key, &slot);
            if let Some(observer) = &inner.observer {
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
        let idle = self.inner.settings.idle_timeout;
        let mut table = self.inner.table();
        let stale: Vec<CacheKey> = table
            .slots
            .iter()
            .filter(|(_, placed)| {
                let st = placed.slot.lock();
                st.inflight.is_none()
                    && st
                        .last_access
                        .is_none_or(|at| now.saturating_duration_since(at) >= idle)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &stale {
            table.remove(key);
        }
        // Entries grow between fetches (the clusters they list): weighed again here.
        let weights: Vec<(CacheKey, usize)> = table
            .slots
            .iter()
            .map(|(key, placed)| (key.clone(), placed.slot.lock().weight(key)))
            .collect();
        for (key, weight) in &weights {
            table.reweigh(key, *weight);
        }
        table.evict_bytes(self.inner.settings.max_bytes, None, now);
        stale.len()
    }

    /// Runs [`Cache::sweep_idle`] periodically for as long as the cache lives.
    pub fn spawn_idle_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        // Sweep a few times per idle period, at least every minute, at most every second.
        let period = (self.inner.settings.idle_timeout / 4)
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
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
            .inner
            .table()
            .slots
            .iter()
            .map(|(key, placed)| placed.slot.lock().info(key.clone(), now))
            .collect();
        out.sort_by(|a, b| {
            (&a.key.provider, &a.key.identity).cmp(&(&b.key.provider, &b.key.identity))
        });
        out
    }

    /// The keys of the entries that match.
    pub fn keys(&self, matches: impl Fn(&CacheKey) -> bool) -> Vec<CacheKey> {
        self.inner
            .table()
            .slots
            .keys()
            .filter(|key| matches(key))
            .cloned()
            .collect()
    }

    /// Drops every entry whose key matches; returns how many.
    pub fn invalidate(&self, matches: impl Fn(&CacheKey) -> bool) -> usize {
        let mut table = self.inner.table();
        let keys: Vec<CacheKey> = table.slots.keys().filter(|k| matches(k)).cloned().collect();
        for key in &keys {
            table.remove(key);
        }
        keys.len()
    }

    /// Fetches an entry anew now (joining a fetch already running), with the request that
    /// last used it. Backoff does not apply: an operator asked for it. The fetch goes through
    /// the provider's gate like any other.
    pub async fn refresh(
        &self,
        key: &CacheKey,
        provider: &Arc<dyn Provider>,
    ) -> Result<(), CacheError> {
        let Some((slot, placed_as)) = self.inner.slot(key) else {
            return Err(CacheError::Internal(format!(
                "no entry for provider {:?}, identity {:?}",
                key.provider, key.identity
            )));
        };
        let (fetch, moved) = {
            let mut st = slot.lock();
            let fetch = match (
                &st.inflight,
                st.last_request
                    .as_ref()
                    .map(|(req, target)| (req.request(), target.clone())),
            ) {
                (Some(inflight), _) => inflight.clone(),
                (None, Some((req, target))) => {
                    self.start_fetch(&slot, &mut st, provider, &req, &target, None, true)
                }
                (None, None) => {
                    return Err(CacheError::Internal(
                        "the entry has never been asked for".into(),
                    ));
                }
            };
            (fetch, st.class() != placed_as)
        };
        if moved {
            self.inner.reclassify(key, &slot);
        }
        fetch.await.map(|_| ())
    }

    /// Entries currently held: credentials, first fetches running, remembered failures.
    pub fn entry_count(&self) -> u64 {
        u64::try_from(self.inner.table().slots.len()).unwrap_or(u64::MAX)
    }

    /// What the entries weigh together, as `cache.maxBytes` counts it.
    pub fn bytes(&self) -> u64 {
        u64::try_from(self.inner.table().bytes).unwrap_or(u64::MAX)
    }
}

impl Inner {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Every operation leaves the table consistent before it can panic (the counts are
        // updated with the map), so keep serving.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry for `key` and its class, if any.
    fn slot(&self, key: &CacheKey) -> Option<(Arc<Slot>, Class)> {
        let table = self.table();
        let placed = table.slots.get(key)?;
        Some((Arc::clone(&placed.slot), placed.class))
    }

    /// The entry for `key`, created empty (its first fetch is about to start) if missing.
    fn slot_for(&self, key: &CacheKey) -> (Arc<Slot>, Class) {
        let mut table = self.table();
        if let Some(placed) = table.slots.get(key) {
            return (Arc::clone(&placed.slot), placed.class);
        }
        let slot = Arc::new(Slot::default());
        let weight = slot.lock().weight(key);
        table.counts[Class::Pending.index()] += 1;
        table.bytes += weight;
        table.slots.insert(
            key.clone(),
            Placed {
                class: Class::Pending,
                slot: Arc::clone(&slot),
                weight,
            },
        );
        (slot, Class::Pending)
    }

    /// Files the entry under what it now holds, then applies the bounds. A slot that has
    /// meanwhile been dropped or replaced (invalidated, evicted) is left alone.
    fn reclassify(&self, key: &CacheKey, slot: &Arc<Slot>) {
        let mut table = self.table();
        let Some(placed) = table.slots.get_mut(key) else {
            return;
        };
        if !Arc::ptr_eq(&placed.slot, slot) {
            return;
        }
        let (was, now, weight) = {
            let st = slot.lock();
            (placed.class, st.class(), st.weight(key))
        };
        placed.class = now;
        table.counts[was.index()] -= 1;
        table.counts[now.index()] += 1;
        table.reweigh(key, weight);
        let at = Instant::now();
        if now == Class::Held {
            table.evict_held(self.settings.max_entries, key, at);
        }
        table.evict_failed();
        table.evict_bytes(self.settings.max_bytes, Some(key), at);
    }

    /// The provider's gate, created with `maxConcurrentFetches` permits on first use.
    fn gate(&self, provider: &Arc<str>) -> Gate {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates
            .entry(Arc::clone(provider))
            .or_insert_with(|| Gate::new(self.settings.max_concurrent_fetches))
            .clone()
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
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that
        // matters (every field is valid on its own), so keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the result of an upstream call and answers the callers waiting on it. Also
    /// says whether a refresh forced by a rejection got the rejected credential back.
    fn complete(
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
                // Denied, or the source is gone: what we hold must not be served again.
                st.current = None;
                st.failures = 0;
                st.retry_at = None;
                st.last_error = Some(error.clone());
                Err(error)
            }
        };
        (served, returned_rejected)
    }
}

impl Fresh {
    fn new(credential: Credential, now: Instant) -> Result<Self, CacheError> {
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
    fn servable(&self, now: Instant) -> bool {
        now < self.serve_until && wall_now() < self.serve_until_wall
    }

    /// Whether its refresh is due, on either clock.
    fn due(&self, now: Instant) -> bool {
        now >= self.refresh_at || wall_now() >= self.refresh_at_wall
    }

    /// Before the refresh time the caller comes back then, when a newer credential is due;
    /// after it, at the end of the serving window. Rounded up to a whole second, but never
    /// past the last whole second before expiry.
    fn serve(&self, now: Instant, outcome: Outcome) -> Served {
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

/// What the cache does about a rejection, for its log line.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// Joins the fetch running for the entry.
    Join,
    /// Started a forced refresh.
    Fetch,
    /// Serves what it holds: the entry is backing off after upstream failures.
    BackingOff,
    /// Serves what it holds: a forced refresh ran recently; the next is allowed after this.
    Hold(Duration),
    /// The rejected credential was already replaced: callers get the new one.
    Replaced,
}

impl Next {
    fn describe(self) -> &'static str {
        match self {
            Self::Join => "joining the fetch running",
            Self::Fetch => "fetching a new credential",
            Self::BackingOff => {
                "the upstream is failing (backing off), serving the cached credential"
            }
            Self::Hold(_) => "a forced refresh ran recently, serving the cached credential",
            Self::Replaced => "serving the credential fetched since",
        }
    }
}

/// A served come-back time on the cache's clock, to compare the caller's next call with.
fn come_back_at(served: &Served, now: Instant) -> Instant {
    now + served
        .come_back
        .duration_since(wall_now())
        .unwrap_or_default()
}

/// The first whole second at or after `t` (client-go's `expirationTimestamp` has seconds).
fn whole_second_at_or_after(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since
        .as_secs()
        .saturating_add(u64::from(since.subsec_nanos() > 0));
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// The last whole second strictly before `t`.
fn last_whole_second_before(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = if since.subsec_nanos() > 0 {
        since.as_secs()
    } else {
        since.as_secs().saturating_sub(1)
    };
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
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
