//! A per-caller token bucket in front of the token and admin services: one runaway
//! client (a controller stuck in a re-auth loop) cannot starve the others, while probes
//! always get through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use crate::base::bucket::TokenBucket;
use crate::base::conn::ConnInfo;
use crate::config::RateLimitConfig;
use crate::engine::broker::BrokerError;
use crate::request::caller;

/// Never limited: health (a throttled probe would restart a healthy broker) and reflection
/// (operators' grpcurl must work while a runaway caller is being throttled). Neither ever
/// reaches upstream.
const EXEMPT_PREFIXES: [&str; 3] = [
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];
/// Callers whose uid the socket could not tell share one bucket.
const UNKNOWN_CALLER: u32 = u32::MAX;
/// A refused caller is logged once, then at most once per this interval with the number of
/// calls refused since: a runaway loop makes tens of thousands of calls a second, which
/// must not become as many log lines; 10 s is short enough to see it stop.
pub const REFUSAL_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// Refusals answered per caller uid and second, paced; past them, the connection that carried
/// the call is not read again until the next refusal is due, nor is a new connection of that
/// uid. A real caller in a loop makes a few hundred calls a second at most (the shim, one
/// process a call, about 1 ms each on a core), each on a connection of its own, and reads
/// every refusal it asks for; the hostile benchmark's `oversize` attacker, 8 calls at a time
/// on one connection, was refused 8 000 times a second, each refusal with up to 64 KB of
/// request read and thrown away: 60 % of a core of the broker's CPU (BENCHMARKS.md). 100 is
/// the refused peers' budget (`conn::REFUSED_SERVED_PER_SECOND`) again.
pub const REFUSALS_ANSWERED_PER_SECOND: u32 = 100;
/// Refusals answered at once before the pacing starts: the calls one connection carries at
/// once (`conn::MAX_STREAMS_PER_CONNECTION`). Why paced and not a budget a second: answered
/// 100 at once and then held for the rest of the second, the attacker's calls came back in a
/// burst at every second, its refusals and the calls its bucket had refilled for, tens of
/// milliseconds of both runtime threads in one go, which a legitimate hit arriving then could
/// only wait behind (BENCHMARKS.md, section 8: that alone did not bring the hits' p99 within
/// 2x).
pub const REFUSALS_ANSWERED_AT_ONCE: u32 = 16;

#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Arc<Limiter>,
    refused: Counter,
}

impl RateLimitLayer {
    /// `refused` counts the calls the limit refuses (`credbroker_rate_limited_total`). The
    /// accept loop shares `limiter`, to hold a new connection of a caller whose others are not
    /// read ([`Limiter::paused_until`]).
    pub fn new(limiter: Arc<Limiter>, refused: Counter) -> Self {
        Self { limiter, refused }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            refused: self.refused.clone(),
        }
    }
}

/// The buckets, one per caller uid. Their number is bounded by the uids that can open the
/// socket (a handful in a pod).
#[derive(Debug)]
pub struct Limiter {
    /// As configured, for the refusal's message.
    config: RateLimitConfig,
    buckets: Mutex<HashMap<u32, Buckets>>,
    log: RefusalLog,
}

/// One caller's.
#[derive(Debug, Clone, Copy)]
struct Buckets {
    /// The calls it may make: `rateLimit.perSecond`, `rateLimit.burst`.
    calls: TokenBucket,
    /// The refusals answered ([`REFUSALS_ANSWERED_PER_SECOND`],
    /// [`REFUSALS_ANSWERED_AT_ONCE`]); in debt, the caller's connections are not read until
    /// it is paid back.
    answers: TokenBucket,
}

/// Refusals of one kind, per caller uid: the first is logged at once, later ones summed up at
/// most once per [`REFUSAL_LOG_INTERVAL`] (on the next call, refused or not, once it has
/// passed). The one rule for every per-call refusal a caller can repeat at will (the rate
/// limit, the socket's allow lists), so that a loop never becomes as many log lines.
#[derive(Debug, Default)]
pub struct RefusalLog {
    /// When a refusal of this caller was last logged, and how many were not logged since.
    callers: Mutex<HashMap<u32, (Option<Instant>, u64)>>,
}

impl RefusalLog {
    /// Notes a call of `uid`, refused or not; says how many refusals to log now.
    pub fn note(&self, uid: u32, refused: bool) -> Option<u64> {
        let now = Instant::now();
        let mut callers = self.callers.lock().unwrap_or_else(PoisonError::into_inner);
        if !refused && !callers.contains_key(&uid) {
            return None;
        }
        let (logged, unlogged) = callers.entry(uid).or_insert((None, 0));
        if refused {
            *unlogged += 1;
        }
        let due = logged.is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_INTERVAL);
        (*unlogged > 0 && due).then(|| {
            *logged = Some(now);
            std::mem::take(unlogged)
        })
    }
}

/// What [`Limiter::check`] decided, and whether to log refusals now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Log a line now for this many refused calls (this one included, when refused).
    pub report: Option<u64>,
    /// Refused past [`REFUSALS_ANSWERED_AT_ONCE`], faster than
    /// [`REFUSALS_ANSWERED_PER_SECOND`]: the caller's connections are not read until then.
    pub pause_until: Option<Instant>,
}

impl Limiter {
    pub fn new(config: &RateLimitConfig) -> Self {
        Self {
            config: config.clone(),
            buckets: Mutex::new(HashMap::new()),
            log: RefusalLog::default(),
        }
    }

    /// Takes one token from `uid`'s bucket; false when it is empty.
    pub fn allow(&self, uid: u32) -> bool {
        self.check(uid).allowed
    }

    /// Takes one token from `uid`'s bucket, and says when refusals are due for a log line:
    /// the first refusal at once, later ones summed up at most once per
    /// [`REFUSAL_LOG_INTERVAL`] (on the next call, refused or not, once it has passed).
    pub fn check(&self, uid: u32) -> Decision {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let caller = buckets.entry(uid).or_insert_with(|| Buckets {
            calls: TokenBucket::new(self.config.per_second, self.config.burst, now),
            answers: TokenBucket::new(REFUSALS_ANSWERED_PER_SECOND, REFUSALS_ANSWERED_AT_ONCE, now),
        });
        let allowed = caller.calls.try_take(now);
        let pause_until = if allowed {
            None
        } else {
            caller.answers.take(now)
        };
        drop(buckets);
        let report = self.log.note(uid, !allowed);
        Decision {
            allowed,
            report,
            pause_until,
        }
    }

    /// Until when `uid`'s connections are not read: a new connection of a caller refused
    /// faster than [`REFUSALS_ANSWERED_PER_SECOND`] waits as its others do.
    pub fn paused_until(&self, uid: u32) -> Option<Instant> {
        let buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        buckets.get(&uid)?.answers.owed_until(Instant::now())
    }
}

#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
    refused: Counter,
}

impl<S, B> tower::Service<http::Request<B>> for RateLimit<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures_util::future::Either<S::Future, std::future::Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if EXEMPT_PREFIXES
            .iter()
            .any(|p| req.uri().path().starts_with(p))
        {
            return futures_util::future::Either::Left(self.inner.call(req));
        }
        let uid = caller::peer(req.extensions()).uid.unwrap_or(UNKNOWN_CALLER);
        let decision = self.limiter.check(uid);
        if let Some(refused) = decision.report {
            tracing::warn!(
                uid,
                refused,
                "rate limit exceeded: {refused} call(s) refused; further refusals of this caller are summed up every {}s; its connections are read no faster than {REFUSALS_ANSWERED_PER_SECOND} refusals a second",
                REFUSAL_LOG_INTERVAL.as_secs()
            );
        }
        if let Some(until) = decision.pause_until
            && let Some(info) = req.extensions().get::<ConnInfo>()
        {
            info.state.pause_reads(until);
        }
        if decision.allowed {
            return futures_util::future::Either::Left(self.inner.call(req));
        }
        self.refused.inc();
        let status = tonic::Status::from(BrokerError::RateLimited {
            uid,
            per_second: self.limiter.config.per_second,
            burst: self.limiter.config.burst,
        });
        futures_util::future::Either::Right(std::future::ready(Ok(status.into_http())))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bursts_are_cut_and_the_bucket_refills() {
        let limiter = Limiter::new(&RateLimitConfig {
            per_second: 10,
            burst: 5,
        });
        assert!((0..5).all(|_| limiter.allow(1)));
        assert!(
            !limiter.allow(1),
            "the sixth call in the same instant is refused"
        );
        assert!(limiter.allow(2), "other callers have their own bucket");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(limiter.allow(1), "one token back after 1/10 s");
        assert!(!limiter.allow(1));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            (0..10).filter(|_| limiter.allow(1)).count(),
            5,
            "refill stops at the burst"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_logged_once_per_interval_per_caller() {
        let limiter = Limiter::new(&RateLimitConfig {
            per_second: 1,
            burst: 1,
        });
        assert_eq!(
            limiter.check(1),
            Decision {
                allowed: true,
                report: None,
                pause_until: None,
            }
        );
        // The first refusal is reported at once, the next 999 within the interval are not.
        assert_eq!(limiter.check(1).report, Some(1));
        let reports: Vec<u64> = (0..999).filter_map(|_| limiter.check(1).report).collect();
        assert!(reports.is_empty(), "{reports:?}");
        assert_eq!(
            limiter.check(2).report,
            None,
            "another caller has its own count"
        );
        assert_eq!(limiter.check(2).report, Some(1));
        // Once the interval has passed, the next call (allowed, here) reports the rest.
        tokio::time::advance(REFUSAL_LOG_INTERVAL).await;
        let next = limiter.check(1);
        assert_eq!(
            next,
            Decision {
                allowed: true,
                report: Some(999),
                pause_until: None,
            }
        );
        assert_eq!(
            limiter.check(1).report,
            None,
            "nothing left, nothing logged"
        );
        tokio::time::advance(REFUSAL_LOG_INTERVAL / 2).await;
        assert!(limiter.check(1).allowed);
        assert_eq!(
            limiter.check(1),
            Decision {
                allowed: false,
                report: None,
                pause_until: None,
            },
            "within the interval: counted, not logged"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_polite_caller_is_never_refused() {
        let limiter = Limiter::new(&RateLimitConfig {
            per_second: 10,
            burst: 5,
        });
        for _ in 0..1000 {
            assert!(limiter.allow(7));
            tokio::time::advance(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_past_those_answered_at_once_are_paced_at_the_answered_rate() {
        let limiter = Limiter::new(&RateLimitConfig {
            per_second: 1,
            burst: 1,
        });
        assert!(limiter.allow(1));
        for n in 1..=REFUSALS_ANSWERED_AT_ONCE {
            let decision = limiter.check(1);
            assert!(!decision.allowed);
            assert_eq!(
                decision.pause_until, None,
                "refusal {n} is answered at once"
            );
        }
        assert_eq!(limiter.paused_until(1), None);
        let step = Duration::from_secs(1) / REFUSALS_ANSWERED_PER_SECOND;
        let past = limiter.check(1);
        assert!(!past.allowed);
        assert_eq!(
            past.pause_until,
            Some(Instant::now() + step),
            "until the next is due"
        );
        assert_eq!(limiter.paused_until(1), Some(Instant::now() + step));
        assert_eq!(limiter.paused_until(2), None, "another caller is read");
        // A call already read while paused lengthens the pause by one step.
        assert_eq!(
            limiter.check(1).pause_until,
            Some(Instant::now() + 2 * step)
        );
        tokio::time::advance(2 * step).await;
        assert_eq!(limiter.paused_until(1), None);
        // Paced: a refusal per step, each read when the pause ends, never a second's worth.
        let mut answered = 0;
        let start = Instant::now();
        while Instant::now() < start + Duration::from_secs(1) {
            if let Some(until) = limiter.paused_until(1) {
                tokio::time::advance(until - Instant::now()).await;
                continue;
            }
            limiter.check(1);
            answered += 1;
        }
        assert!(
            (REFUSALS_ANSWERED_PER_SECOND..=REFUSALS_ANSWERED_PER_SECOND + 2).contains(&answered),
            "{answered} answered in a second"
        );
        // Quiet for a while, the caller gets its refusals answered at once again.
        tokio::time::advance(Duration::from_secs(1)).await;
        let refused = limiter.check(1);
        assert!(refused.allowed, "a token came back");
        assert_eq!(limiter.check(1).pause_until, None);
    }
}
