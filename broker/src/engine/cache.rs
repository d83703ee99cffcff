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
//! when the credential is stored ([`crate::base::clock`] has both clocks).
//!
//! In parts: this module is the API ([`Cache`], one [`Ask`] per call) and the path of an ask
//! (a pass over the entry, the fetch); `table` files the entries and evicts; `entry` is one
//! entry's state and schedule; `reask` runs the re-ask checks.

mod entry;
mod reask;
mod table;

use std::collections::HashMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use futures_util::FutureExt as _;
use tokio::time::Instant;

use crate::base::gate::{Bounds, Gate, Purpose};
use crate::engine::rejections::{CredentialDigest, RejectionInfo};
use crate::engine::review::{
    Answer, ApiServerCheck, CHECK_TIMEOUT, CredentialCheck, MAX_CONCURRENT_CHECKS,
};
use crate::providers::{BoxFuture, Credential, Provider, ProviderError, Resolved};
use crate::request::caller::Caller;
use crate::request::{StoredRequest, TokenRequest};
use entry::{Class, Inflight, Slot, State, come_back_at};
use reask::CheckStep;
use table::Table;

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
/// An identity the upstream denied (a disabled client, a role gone) is asked for again at
/// most once per this long, whichever callers ask: a fleet's clusters share one identity,
/// and each cluster's retry used to be an upstream call. Not growing like the backoff, since
/// what ends a denial is an operator's fix, which should show at once: 5 s is Kueue's first
/// retry of a disconnected cluster (see
/// [`crate::engine::rejections::FORCED_REFRESH_INTERVAL`]), so a fix is picked up by about
/// the same retry that would have seen it anyway. The admin `Refresh` asks at once.
pub const DENIAL_RETRY_AFTER: Duration = Duration::from_secs(5);
/// How long the cache waits for any upstream call. Defined with the config's shared values,
/// since provider sections (an exec plugin's `timeout`) are checked against it.
pub use crate::config::values::UPSTREAM_TIMEOUT;
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

    /// A re-ask was checked with the cluster's API server (see [`crate::engine::rejections`]): once
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

/// One ask of the cache: what `provider` resolved `req` to, for `caller`. One value, so that
/// every step of an ask (the entry's pass, a re-ask's check, the fetch) takes it whole.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub provider: &'a Arc<dyn Provider>,
    pub req: &'a TokenRequest,
    pub target: &'a Resolved,
    pub caller: Caller,
}

impl<'a> Ask<'a> {
    /// An ask from a caller that says nothing of itself (an operator's refresh, a test).
    pub fn new(
        provider: &'a Arc<dyn Provider>,
        req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> Self {
        Self {
            provider,
            req,
            target,
            caller: Caller::default(),
        }
    }

    /// The same ask, from `caller`.
    pub fn by(self, caller: Caller) -> Self {
        Self { caller, ..self }
    }

    fn key(&self) -> CacheKey {
        CacheKey::new(&self.req.provider, self.target)
    }

    /// A copy a task that outlives the call keeps (a check).
    fn owned(&self) -> Owned {
        Owned {
            provider: Arc::clone(self.provider),
            req: self.req.clone(),
            target: self.target.clone(),
            caller: self.caller,
        }
    }
}

/// An [`Ask`] kept by a task that outlives the call.
struct Owned {
    provider: Arc<dyn Provider>,
    req: TokenRequest,
    target: Resolved,
    caller: Caller,
}

impl Owned {
    fn ask(&self) -> Ask<'_> {
        Ask {
            provider: &self.provider,
            req: &self.req,
            target: &self.target,
            caller: self.caller,
        }
    }
}

/// What one look at an entry ([`Cache::get`]'s pass) decided.
enum Pass {
    /// Answered: served from the entry, or refused (backing off).
    Done(Result<Served, CacheError>),
    /// Wait for this fetch.
    Wait(Wait),
    /// A re-ask: its check first.
    Check(CheckStep),
}

/// A fetch to wait for, and how to file and answer what it gives.
struct Wait {
    fetch: Inflight,
    outcome: Outcome,
    /// The entry changed class (its table counts are to be updated).
    moved: bool,
    /// A refresh forced by a rejection or a changed source: a transient failure serves what
    /// is held instead.
    forced: bool,
}

/// The cache. Cheap to share behind an `Arc`.
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table>,
    settings: CacheSettings,
    observer: Option<Arc<dyn CacheObserver>>,
    /// Asks a cluster's API server about a re-asked credential ([`crate::engine::review`]).
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

    /// Serves the credential for what the ask's provider resolved its request to (keyed on
    /// the provider's name and the resolved identity), fetching it on a miss. A hit never
    /// waits on upstream; concurrent misses for one key share one fetch.
    ///
    /// A caller that says who it is and asks again before the come-back time it was given (a
    /// re-ask, [`crate::engine::rejections`]) waits for a check of the held credential with the
    /// cluster's API server ([`crate::engine::review`]), single-flight per entry; only a rejection (or
    /// a request that cannot be checked) fetches anew, bounded, single-flight with every other
    /// fetch. The caller's uid is whose miss this is, for the fair share of the provider's
    /// permits ([`Gate`]).
    pub async fn get(&self, ask: Ask<'_>) -> Result<Served, CacheError> {
        let key = ask.key();
        let (slot, placed_as) = self.inner.slot_for(&key);
        // A re-ask waits for the check, then is judged again with its answer (or with none,
        // when what it asked about was replaced meanwhile): once, since a pass that has been
        // judged never starts a check.
        let mut judged: Option<Option<Answer>> = None;
        let wait = loop {
            let pending = match self.pass(&key, &slot, placed_as, &ask, judged.as_ref()) {
                Pass::Done(result) => return result,
                Pass::Wait(wait) => break wait,
                Pass::Check(CheckStep::Join(running)) => Some(running),
                Pass::Check(CheckStep::Start(about)) => match self.check_slot(&ask).await {
                    // Holding a slot: the check starts now (or another caller's started
                    // meanwhile, and the slot goes back).
                    Ok(permit) => self.start_check(&slot, &ask, about, permit),
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
                    (_, Some(fetch)) => {
                        break Wait {
                            fetch,
                            outcome: Outcome::Joined,
                            moved: false,
                            forced: true,
                        };
                    }
                    (answer, None) => judged = Some(Some(answer)),
                },
            }
        };
        if wait.moved {
            // A remembered failure fetching again, or a credential gone while fetching anew.
            self.inner.reclassify(&key, &slot);
        }
        let result = wait.fetch.await;
        self.finish(&slot, &ask, result, wait.outcome, wait.forced)
    }

    /// One look at the entry under its lock: serves what it holds, or says which fetch to
    /// wait for (starting one if none runs), or that a re-ask needs a check first. `judged`
    /// is a re-ask's answer once it has one (`Some(None)`: what it asked about was replaced).
    fn pass(
        &self,
        key: &CacheKey,
        slot: &Arc<Slot>,
        placed_as: Class,
        ask: &Ask<'_>,
        judged: Option<&Option<Answer>>,
    ) -> Pass {
        let mut guard = slot.lock();
        let st = &mut *guard;
        let now = Instant::now();
        let answer = match judged {
            Some(answer) => answer.clone(),
            None => {
                st.last_access = Some(now);
                st.note_request(ask.req);
                match reask::answer(st, ask, now) {
                    Ok(answer) => answer,
                    Err(step) => return Pass::Check(step),
                }
            }
        };
        let may_retry = st.retry_at.is_none_or(|at| now >= at);
        // The source changed under what is held (a file rewritten, a Secret updated):
        // fetched anew, and what is held stays in service until that works.
        let mut changed = false;
        if let Some(fresh) = &st.current {
            if !fresh.servable(now) {
                st.current = None;
            } else if !ask.provider.is_current(ask.target, &fresh.credential) {
                changed = true;
            } else {
                // A rejection joins the fetch it started, a background refresh or another
                // caller's; with none running, what is held is served.
                let forced = answer
                    .as_ref()
                    .is_some_and(|a| a.forces_refresh() && st.inflight.is_some());
                if !forced {
                    let due = fresh.due(now);
                    let served = fresh.serve(now, if due { Outcome::Stale } else { Outcome::Hit });
                    let digest = fresh.digest;
                    st.hits += 1;
                    if due && st.inflight.is_none() && may_retry {
                        // Refresh ahead in the background; this caller does not wait.
                        drop(self.start_fetch(slot, st, ask, None, true));
                    }
                    if let (Some(caller), Some(memory)) = (ask.caller.id, &mut st.rejections) {
                        let come_back = come_back_at(&served, now);
                        memory.served(caller, ask.caller.uid(), now, come_back, digest);
                    }
                    return Pass::Done(Ok(served));
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
                    return Pass::Done(Ok(fresh.serve(now, Outcome::Stale)));
                }
                let err = CacheError::BackingOff {
                    last: Box::new(last.clone()),
                    retry_in: at - now,
                };
                let moved = st.class() != placed_as;
                drop(guard);
                if moved {
                    self.inner.reclassify(key, slot);
                }
                return Pass::Done(Err(err));
            }
            let uid = ask.caller.uid();
            (self.start_fetch(slot, st, ask, uid, false), Outcome::Miss)
        };
        Pass::Wait(Wait {
            fetch,
            outcome,
            moved: st.class() != placed_as,
            forced,
        })
    }

    /// What the fetch an ask waited for gives its caller, remembered for its re-asks.
    fn finish(
        &self,
        slot: &Slot,
        ask: &Ask<'_>,
        result: Result<Served, CacheError>,
        outcome: Outcome,
        forced: bool,
    ) -> Result<Served, CacheError> {
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
        let Some(caller) = ask.caller.id else {
            return Ok(served);
        };
        let digest = CredentialDigest::of(&served.credential);
        let come_back = come_back_at(&served, now);
        st.rejections.get_or_insert_default().served(
            caller,
            ask.caller.uid(),
            now,
            come_back,
            digest,
        );
        Ok(served)
    }

    /// Starts the one upstream call for a slot. It runs in its own task, so it completes
    /// (and fills the cache) even when every caller waiting on it has given up. It first
    /// waits for one of the provider's permits (at most the upstream timeout): any permit if
    /// the entry holds a credential, else one outside the reserve, in `uid`'s fair share.
    /// Then the call itself gets the upstream timeout. The slot is the one the ask keys.
    fn start_fetch(
        &self,
        slot: &Arc<Slot>,
        st: &mut State,
        ask: &Ask<'_>,
        uid: Option<u32>,
        background: bool,
    ) -> Inflight {
        let Ask {
            provider,
            req,
            target,
            ..
        } = *ask;
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
                    provider = crate::base::text::quote(&key.provider),
                    cluster = crate::base::text::quote(&req.cluster_label()),
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
                    let ask = Ask::new(provider, &req, &target);
                    self.start_fetch(&slot, &mut st, &ask, None, true)
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

#[cfg(test)]
mod tests;
