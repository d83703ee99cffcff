//! The rules of re-asks and rejections on paused time.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::*;
use crate::providers::Credential;

fn digest(token: &str) -> CredentialDigest {
    CredentialDigest::of(&Credential::token(token, SystemTime::now()))
}

/// What the cache makes of a request when every check answers 401 (or cannot be made): the
/// rules of the forced refreshes, apart from how the answer was had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    Serve,
    Superseded,
    Refresh,
    Hold { next_in: Duration },
}

impl Memory {
    fn check(&mut self, caller: &CallerId, now: Instant, current: CredentialDigest) -> Judged {
        match self.reask(caller, None, now, current) {
            Reask::No => Judged::Serve,
            Reask::Superseded => Judged::Superseded,
            Reask::Held => match self.answered(now, about(current), &Answer::Rejected, caller) {
                Some(Verdict::Refresh) => Judged::Refresh,
                Some(Verdict::Hold { next_in }) => Judged::Hold { next_in },
                None => unreachable!("a rejection always has a verdict"),
            },
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// A check of `credential` with the one server these tests name.
fn about(credential: CredentialDigest) -> CheckKey {
    CheckKey {
        credential,
        cluster: ClusterDigest::of(None),
    }
}

#[tokio::test(start_paused = true)]
async fn a_re_ask_before_the_come_back_time_rejected_refreshes() {
    let mut m = Memory::default();
    let caller = CallerId::new(100, 7, 1);
    let t0 = digest("t0");
    let now = Instant::now();
    assert_eq!(m.check(&caller, now, t0), Judged::Serve, "a new caller");
    m.served(caller, None, now, now + HOUR, t0);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(m.check(&caller, Instant::now(), t0), Judged::Refresh);
    assert_eq!(m.info().reasks, 1);
    assert!(m.info().last_reask.is_some());
}

#[tokio::test(start_paused = true)]
async fn asking_at_or_after_the_come_back_time_is_on_time() {
    let mut m = Memory::default();
    let caller = CallerId::new(100, 7, 1);
    let t0 = digest("t0");
    let now = Instant::now();
    m.served(caller, None, now, now + Duration::from_secs(60), t0);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(
        m.check(&caller, Instant::now(), t0),
        Judged::Serve,
        "within the slack of the come-back time"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(m.check(&caller, Instant::now(), t0), Judged::Serve);
    assert_eq!(m.info().reasks, 0);
}

#[tokio::test(start_paused = true)]
async fn another_process_or_a_reused_pid_or_another_config_is_a_new_caller() {
    let mut m = Memory::default();
    let t0 = digest("t0");
    let now = Instant::now();
    m.served(CallerId::new(100, 7, 1), None, now, now + HOUR, t0);
    for other in [
        CallerId::new(101, 7, 1),
        // The same pid, started at another time: a reused pid.
        CallerId::new(100, 8, 1),
        // The same process for another exec config or cluster.
        CallerId::new(100, 7, 2),
    ] {
        assert_eq!(m.check(&other, now, t0), Judged::Serve, "{other:?}");
    }
    assert_eq!(m.info().reasks, 0);
}

#[tokio::test(start_paused = true)]
async fn a_re_ask_for_a_credential_already_replaced_fetches_nothing() {
    let mut m = Memory::default();
    let (a, b) = (CallerId::new(100, 7, 1), CallerId::new(200, 9, 1));
    let (t0, t1) = (digest("t0"), digest("t1"));
    let now = Instant::now();
    m.served(a, None, now, now + HOUR, t0);
    m.served(b, None, now, now + HOUR, t0);
    assert_eq!(m.check(&a, now, t0), Judged::Refresh);
    assert_eq!(m.fetched(t1), Some(false));
    m.served(a, None, now, now + HOUR, t1);
    // b was rejected too, and asks after the fetch: the new credential is served.
    assert_eq!(m.check(&b, now, t1), Judged::Superseded);
    assert_eq!(m.info().reasks, 2);
}

/// Red-team finding (issue 20, item 4): a made-up caller re-asking once a second (its
/// re-asks checked against a server of its own that answers 401) doubled the entry's
/// forced-refresh interval, and a genuine client-go re-ask after a 401 then got the rejected
/// token back for 111 s (up to the 10-minute cap). The doubling now applies only to the
/// callers that forced the streak: another caller's first forced refresh waits at most the
/// base interval, and the entry still forces at most one refresh per base interval.
#[tokio::test(start_paused = true)]
async fn a_forgers_streak_never_delays_another_callers_first_forced_refresh() {
    let mut m = Memory::default();
    let (forger, kueue) = (CallerId::new(66, 6, 6), CallerId::new(10, 1, 1));
    let start = Instant::now();
    let mut current = digest("t0");
    let mut fetches = 0;
    m.served(kueue, None, start, start + HOUR, current);
    m.served(forger, None, start, start + HOUR, current);
    let refresh = |m: &mut Memory, fetches: &mut u32| {
        *fetches += 1;
        let next = digest(&format!("t{fetches}"));
        assert_eq!(m.fetched(next), Some(false));
        next
    };
    // 300 s of forged re-asks, once a second, each confirmed by the forger's own server.
    for _ in 0..300 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        if m.check(&forger, now, current) == Judged::Refresh {
            current = refresh(&mut m, &mut fetches);
        }
        m.served(forger, None, now, now + HOUR, current);
    }
    // Its own streak backed off: at 1, 31, 91, 211 s.
    assert_eq!(fetches, 4);
    // The genuine client: its credential revoked for real, client-go re-asks after the 401.
    m.served(kueue, None, Instant::now(), Instant::now() + HOUR, current);
    tokio::time::advance(Duration::from_secs(1)).await;
    let asked = Instant::now();
    let mut waited = None;
    for _ in 0..60 {
        if m.check(&kueue, Instant::now(), current) == Judged::Refresh {
            waited = Some(Instant::now() - asked);
            break;
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let waited = waited.expect("the genuine re-ask forced a refresh within a minute");
    assert!(
        waited <= FORCED_REFRESH_INTERVAL,
        "the genuine re-ask waited {waited:?}, over the base interval"
    );
}

#[tokio::test(start_paused = true)]
async fn forced_refreshes_are_bounded_and_back_off_while_rejected_again() {
    let mut m = Memory::default();
    let caller = CallerId::new(100, 7, 1);
    let mut fetches = 0;
    let mut refreshes_at = Vec::new();
    let start = Instant::now();
    let mut current = digest("t0");
    m.served(caller, None, start, start + HOUR, current);
    // A caller re-asking every 5 s for an hour, every credential rejected (RBAC broken).
    for _ in 0..720 {
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        match m.check(&caller, now, current) {
            Judged::Refresh => {
                fetches += 1;
                refreshes_at.push((now - start).as_secs());
                current = digest(&format!("t{fetches}"));
                assert_eq!(m.fetched(current), Some(false));
            }
            Judged::Hold { next_in } => {
                assert!(next_in <= MAX_FORCED_REFRESH_INTERVAL, "{next_in:?}");
            }
            v => panic!("unexpected {v:?}"),
        }
        m.served(caller, None, now, now + HOUR, current);
    }
    // 30 s apart, then 60, 120, 240, 480, then every 600 s.
    assert_eq!(
        refreshes_at,
        [5, 35, 95, 215, 455, 935, 1535, 2135, 2735, 3335],
        "{refreshes_at:?}"
    );
    assert_eq!(m.info().reasks, 720);
}

#[tokio::test(start_paused = true)]
async fn the_same_credential_back_is_reported_and_not_fetched_in_a_loop() {
    let mut m = Memory::default();
    let caller = CallerId::new(100, 7, 1);
    let t0 = digest("t0");
    let now = Instant::now();
    m.served(caller, None, now, now + HOUR, t0);
    assert_eq!(m.check(&caller, now, t0), Judged::Refresh);
    assert_eq!(m.fetched(t0), Some(true), "the file was not rotated yet");
    assert!(m.info().returned_rejected);
    m.served(caller, None, now, now + HOUR, t0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(
        m.check(&caller, Instant::now(), t0),
        Judged::Hold { .. }
    ));
    // Rotated: a refresh (not forced) brings another credential; the flag clears.
    assert_eq!(m.fetched(digest("t1")), None);
    assert!(!m.info().returned_rejected);
}

#[tokio::test(start_paused = true)]
async fn a_new_credential_rejected_starts_a_new_episode() {
    let mut m = Memory::default();
    let caller = CallerId::new(100, 7, 1);
    let now = Instant::now();
    // Three forced refreshes in a row, each result rejected: the wait is 120 s now.
    let mut current = digest("t0");
    let mut at = now;
    for i in 1..=3 {
        m.served(caller, None, at, at + HOUR, current);
        assert_eq!(m.check(&caller, at, current), Judged::Refresh, "{i}");
        current = digest(&format!("t{i}"));
        m.fetched(current);
        at += interval(i - 1);
    }
    // A background refresh brings t9, which is rejected 30 s after the last forced refresh:
    // another credential, so the base interval applies again.
    let t9 = digest("t9");
    assert_eq!(m.fetched(t9), None);
    let last = at - interval(2);
    m.served(caller, None, last, last + HOUR, t9);
    tokio::time::advance(last + FORCED_REFRESH_INTERVAL - Instant::now()).await;
    assert_eq!(m.check(&caller, Instant::now(), t9), Judged::Refresh);
}

#[tokio::test(start_paused = true)]
async fn the_caller_set_is_bounded_and_forgets_the_oldest_first() {
    let mut m = Memory::default();
    let t0 = digest("t0");
    let now = Instant::now();
    // One caller already past its come-back time, then more than the bound.
    m.served(
        CallerId::new(1, 1, 0),
        None,
        now,
        now + Duration::from_secs(2),
        t0,
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    let now = Instant::now();
    let many = MAX_CALLERS_PER_ENTRY as u32 + 3;
    for pid in 2..2 + many {
        m.served(CallerId::new(pid, 1, 0), None, now, now + HOUR, t0);
    }
    let kept = m.callers();
    assert_eq!(kept.len(), MAX_CALLERS_PER_ENTRY);
    let pids: Vec<u32> = kept.iter().map(|c| c.pid).collect();
    let want: Vec<u32> = (2 + many - MAX_CALLERS_PER_ENTRY as u32..2 + many).collect();
    assert_eq!(pids, want, "the most recently served are kept");
    // A forgotten caller is a new caller again; a remembered one is not.
    assert_eq!(m.check(&CallerId::new(2, 1, 0), now, t0), Judged::Serve);
    assert_eq!(
        m.check(&CallerId::new(1 + many, 1, 0), now, t0),
        Judged::Refresh
    );
    // Serving a remembered caller again moves it to the back, it is not duplicated.
    m.served(CallerId::new(want[0], 1, 0), None, now, now + HOUR, t0);
    let again = m.callers();
    assert_eq!(again.len(), MAX_CALLERS_PER_ENTRY);
    assert_eq!(again.last().map(|c| c.pid), Some(want[0]));
}

#[test]
fn a_credential_digest_shows_nothing_of_the_credential() {
    let d = digest("super-secret-token");
    assert_eq!(format!("{d:?}"), "CredentialDigest([redacted])");
    assert_ne!(d, digest("other"));
    assert_eq!(d, digest("super-secret-token"));
}

// ---------------------------------------------------------------------------------------
// Through the cache: the hooks in `Cache::get_for`.
// ---------------------------------------------------------------------------------------

mod through_the_cache {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::engine::cache::{
        Ask, Cache, CacheKey, CacheObserver, CacheSettings, Outcome, Served,
    };
    use crate::engine::review::{Answer, CredentialCheck};
    use crate::providers::fake::FakeProvider;
    use crate::providers::{BoxFuture, Credential, CredentialSecret, Provider, ProviderError};
    use crate::request::caller::{Caller, CallerId};
    use crate::request::{ClusterInfo, TokenRequest};

    const HOUR: Duration = Duration::from_secs(3600);

    /// Checks re-asks reported, by answer.
    #[derive(Default)]
    struct Counted(AtomicUsize, std::sync::Mutex<Vec<&'static str>>);

    /// An API server that answers every check as told, after 10 ms.
    struct Scripted {
        answer: std::sync::Mutex<Answer>,
        calls: AtomicUsize,
    }

    impl CredentialCheck for Scripted {
        fn check(&self, cluster: Option<&ClusterInfo>, _: &Credential) -> BoxFuture<'_, Answer> {
            assert_eq!(cluster.map(|c| c.server.as_str()), Some("https://a"));
            self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = self.answer.lock().unwrap().clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                answer
            })
        }
    }

    impl CacheObserver for Counted {
        fn upstream_call(
            &self,
            _: &str,
            _: Duration,
            _: Result<(), &crate::engine::cache::CacheError>,
            _: bool,
        ) {
        }
        fn reask_checked(&self, provider: &str, answer: &Answer) {
            assert_eq!(provider, "fake");
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1.lock().unwrap().push(answer.label());
        }
    }

    struct World {
        cache: Arc<Cache>,
        fake: Arc<FakeProvider>,
        provider: Arc<dyn Provider>,
        seen: Arc<Counted>,
        server: Arc<Scripted>,
    }

    /// Every check answers 401 unless told otherwise.
    fn world() -> World {
        let fake = Arc::new(FakeProvider::new(HOUR));
        let seen = Arc::new(Counted::default());
        let server = Arc::new(Scripted {
            answer: std::sync::Mutex::new(Answer::Rejected),
            calls: AtomicUsize::new(0),
        });
        let cache = Cache::new(CacheSettings {
            max_entries: 100,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            idle_timeout: 2 * HOUR,
            upstream_timeout: crate::engine::cache::UPSTREAM_TIMEOUT,
            max_concurrent_fetches: 4,
        })
        .with_observer(seen.clone())
        .with_checker(server.clone());
        World {
            cache: Arc::new(cache),
            provider: fake.clone(),
            fake,
            seen,
            server,
        }
    }

    fn req() -> TokenRequest {
        let mut config = serde_json::Map::new();
        config.insert("clusterName".into(), "a".into());
        TokenRequest {
            provider: "fake".into(),
            cluster: Some(ClusterInfo {
                server: "https://a".into(),
                config: config.into(),
                ..Default::default()
            }),
            interactive: false,
        }
    }

    impl World {
        async fn ask(&self, caller: Option<CallerId>) -> Served {
            let req = req();
            let target = self.provider.resolve(&req).unwrap();
            let caller = Caller {
                id: caller,
                ..Caller::default()
            };
            let ask = Ask::new(&self.provider, &req, &target).by(caller);
            self.cache.get(ask).await.unwrap()
        }
        fn rejections(&self) -> super::RejectionInfo {
            self.cache.entries()[0].rejections.clone()
        }
        fn answer(&self, answer: Answer) {
            *self.server.answer.lock().unwrap() = answer;
        }
        fn checks(&self) -> usize {
            self.server.calls.load(Ordering::SeqCst)
        }
    }

    fn token(served: &Served) -> &str {
        match &served.credential.secret {
            CredentialSecret::Token(t) => t.expose(),
            CredentialSecret::ClientCertificate { .. } => panic!("a token"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_re_ask_fetches_anew_and_new_processes_hit_the_cache() {
        let w = world();
        let kueue = CallerId::new(10, 1, 1);
        assert_eq!(token(&w.ask(Some(kueue)).await), "fake-a-1");
        // New processes (one-shot kubectl), and callers that do not say who they are.
        for pid in 11..20 {
            let served = w.ask(Some(CallerId::new(pid, 1, 1))).await;
            assert_eq!((token(&served), served.outcome), ("fake-a-1", Outcome::Hit));
        }
        assert_eq!(token(&w.ask(None).await), "fake-a-1");
        assert_eq!(token(&w.ask(None).await), "fake-a-1");
        assert_eq!(w.fake.calls(), 1);
        assert_eq!(w.checks(), 0, "no re-ask, no check");
        // The first caller asks again long before its come-back time: the API server
        // answers 401, the caller joins the fetch that starts.
        tokio::time::advance(Duration::from_secs(10)).await;
        let again = w.ask(Some(kueue)).await;
        assert_eq!(
            (token(&again), again.outcome),
            ("fake-a-2", Outcome::Joined)
        );
        assert_eq!(w.fake.calls(), 2);
        assert_eq!(w.seen.0.load(Ordering::SeqCst), 1);
        assert_eq!(w.rejections().reasks, 1);
        assert_eq!(w.rejections().confirmed, 1);
        // Asked again at once: rejected again, but a forced refresh ran less than 30 s ago.
        let held = w.ask(Some(kueue)).await;
        assert_eq!((token(&held), held.outcome), ("fake-a-2", Outcome::Hit));
        assert_eq!(w.fake.calls(), 2);
        // 30 s later the interval allows another.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(token(&w.ask(Some(kueue)).await), "fake-a-3");
        assert_eq!(w.fake.calls(), 3);
        // Another process that held fake-a-1 asks again: it gets the new one, no fetch.
        let other = w.ask(Some(CallerId::new(11, 1, 1))).await;
        assert_eq!(token(&other), "fake-a-3");
        assert_eq!(w.fake.calls(), 3);
        assert_eq!(w.rejections().reasks, 4);
        // That one needed no check: three checks, each a confirmed rejection.
        assert_eq!(w.seen.0.load(Ordering::SeqCst), 3);
        assert_eq!(w.checks(), 3);
        assert_eq!(w.rejections().confirmed, 3);
        assert_eq!(*w.seen.1.lock().unwrap(), ["rejected"; 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_pid_is_a_new_caller() {
        let w = world();
        w.ask(Some(CallerId::new(10, 1, 1))).await;
        tokio::time::advance(Duration::from_secs(10)).await;
        let reused = w.ask(Some(CallerId::new(10, 2, 1))).await;
        assert_eq!(reused.outcome, Outcome::Hit);
        assert_eq!(w.fake.calls(), 1);
        assert_eq!(w.rejections().reasks, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_re_asks_make_one_fetch() {
        let w = Arc::new(world());
        w.fake.set_delay(Duration::from_secs(2));
        let callers: Vec<CallerId> = (10..22).map(|pid| CallerId::new(pid, 1, 1)).collect();
        for c in &callers {
            w.ask(Some(*c)).await;
        }
        assert_eq!(w.fake.calls(), 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        // Every process got a 401 for the same token and asks again at once.
        let asks: Vec<_> = callers
            .iter()
            .map(|c| {
                let w = w.clone();
                let c = *c;
                tokio::spawn(async move { w.ask(Some(c)).await })
            })
            .collect();
        for ask in asks {
            let served = ask.await.unwrap();
            assert_eq!(token(&served), "fake-a-2");
        }
        assert_eq!(w.fake.calls(), 2);
        assert_eq!(
            w.checks(),
            1,
            "one check for every re-ask about one credential"
        );
        // And a re-ask joins a background refresh that is already running.
        let w2 = world();
        w2.fake.set_delay(Duration::from_secs(2));
        let c = CallerId::new(10, 1, 1);
        w2.ask(Some(c)).await;
        let refresh = {
            let (cache, p) = (w2.cache.clone(), w2.provider.clone());
            tokio::spawn(async move {
                let key = CacheKey {
                    provider: "fake".into(),
                    identity: "a".into(),
                };
                cache.refresh(&key, &p).await
            })
        };
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(token(&w2.ask(Some(c)).await), "fake-a-2");
        refresh.await.unwrap().unwrap();
        assert_eq!(w2.fake.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rejected_credential_back_is_served_without_a_loop() {
        let w = world();
        w.fake.set_fixed_token(Some("same"));
        let c = CallerId::new(10, 1, 1);
        w.ask(Some(c)).await;
        for _ in 0..50 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(token(&w.ask(Some(c)).await), "same");
        }
        // One fetch at first, one forced at once, one 30 s later, none in the 60 s after.
        assert_eq!(w.fake.calls(), 3);
        let info = w.rejections();
        assert!(info.returned_rejected);
        assert_eq!(info.reasks, 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forced_refresh_that_fails_serves_what_is_held() {
        let w = world();
        let c = CallerId::new(10, 1, 1);
        w.ask(Some(c)).await;
        w.fake
            .fail_with(Some(ProviderError::Unavailable("down".into())));
        tokio::time::advance(Duration::from_secs(10)).await;
        let served = w.ask(Some(c)).await;
        assert_eq!(
            (token(&served), served.outcome),
            ("fake-a-1", Outcome::Stale)
        );
        assert_eq!(w.fake.calls(), 2);
    }

    /// The false alarm this check exists for: a process with a second authenticator for the
    /// cluster (or any client-go re-ask without a 401) asks again while the credential is
    /// fine. The server accepts it: no fetch, no rejection, whatever the number of re-asks.
    #[tokio::test(start_paused = true)]
    async fn an_accepted_re_ask_is_served_from_the_cache() {
        let w = world();
        w.answer(Answer::Accepted(201));
        let kueue = CallerId::new(10, 1, 1);
        w.ask(Some(kueue)).await;
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(3)).await;
            let served = w.ask(Some(kueue)).await;
            assert_eq!((token(&served), served.outcome), ("fake-a-1", Outcome::Hit));
        }
        assert_eq!(w.fake.calls(), 1);
        let info = w.rejections();
        assert_eq!((info.reasks, info.confirmed), (20, 0));
        assert_eq!(info.last_answer, Some(Answer::Accepted(201)));
        assert!(info.last_confirmed.is_none());
        assert_eq!(w.checks(), 20);
        assert_eq!(*w.seen.1.lock().unwrap(), ["accepted"; 20]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_stands_briefly_for_re_asks_about_the_same_credential() {
        let w = world();
        w.answer(Answer::Accepted(201));
        let callers: Vec<CallerId> = (10..15).map(|pid| CallerId::new(pid, 1, 1)).collect();
        for c in &callers {
            w.ask(Some(*c)).await;
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        // A burst of re-asks within CHECK_REUSE: one check.
        for c in &callers {
            assert_eq!(w.ask(Some(*c)).await.outcome, Outcome::Hit);
        }
        assert_eq!(w.checks(), 1);
        // Past it, the next re-ask is checked again: now rejected.
        tokio::time::advance(crate::engine::cache::CHECK_REUSE).await;
        w.answer(Answer::Rejected);
        assert_eq!(token(&w.ask(Some(callers[0])).await), "fake-a-2");
        assert_eq!((w.checks(), w.fake.calls()), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_server_leaves_the_held_credential_in_service() {
        let w = world();
        w.answer(Answer::Unreachable("connection refused".into()));
        let c = CallerId::new(10, 1, 1);
        w.ask(Some(c)).await;
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(5)).await;
            assert_eq!(token(&w.ask(Some(c)).await), "fake-a-1");
        }
        assert_eq!(w.fake.calls(), 1);
        assert_eq!(w.rejections().confirmed, 0);
        assert_eq!(*w.seen.1.lock().unwrap(), ["unreachable"; 5]);
    }

    /// A caller that makes up re-asks (a forged `caller`) while the credential is fine makes
    /// checks, never a forced refresh, so it cannot start or stretch the forced-refresh
    /// interval: when the credential is revoked, the genuine re-ask fetches at once.
    #[tokio::test(start_paused = true)]
    async fn forged_re_asks_cannot_delay_a_real_recovery() {
        let w = world();
        w.answer(Answer::Accepted(201));
        let (forger, kueue) = (CallerId::new(66, 6, 6), CallerId::new(10, 1, 1));
        w.ask(Some(kueue)).await;
        w.ask(Some(forger)).await;
        for _ in 0..100 {
            tokio::time::advance(Duration::from_secs(1)).await;
            w.ask(Some(forger)).await;
        }
        assert_eq!(w.fake.calls(), 1, "accepted re-asks fetch nothing");
        w.answer(Answer::Rejected);
        tokio::time::advance(crate::engine::cache::CHECK_REUSE).await;
        assert_eq!(token(&w.ask(Some(kueue)).await), "fake-a-2");
        assert_eq!(w.fake.calls(), 2);
    }

    /// A request without the cluster (no `provideClusterInfo: true`) cannot be checked: the
    /// re-ask is taken as a rejection, within the same bounds, as before checks existed.
    #[tokio::test(start_paused = true)]
    async fn a_re_ask_without_a_cluster_is_taken_as_a_rejection() {
        let fake = Arc::new(FakeProvider::new(HOUR));
        let provider: Arc<dyn Provider> = fake.clone();
        let seen = Arc::new(Counted::default());
        // The real check, which says why it cannot check.
        let cache = Cache::new(CacheSettings {
            max_entries: 100,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            idle_timeout: 2 * HOUR,
            upstream_timeout: crate::engine::cache::UPSTREAM_TIMEOUT,
            max_concurrent_fetches: 4,
        })
        .with_observer(seen.clone());
        let req = TokenRequest {
            provider: "fake".into(),
            cluster: None,
            interactive: false,
        };
        let target = provider.resolve(&req).unwrap();
        let c = CallerId::new(10, 1, 1);
        let caller = Caller {
            id: Some(c),
            ..Caller::default()
        };
        let ask = || cache.get(Ask::new(&provider, &req, &target).by(caller));
        ask().await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        ask().await.unwrap();
        assert_eq!(fake.calls(), 2);
        tokio::time::advance(Duration::from_secs(10)).await;
        ask().await.unwrap();
        assert_eq!(fake.calls(), 2, "bounded: 30 s between forced refreshes");
        assert_eq!(*seen.1.lock().unwrap(), ["unchecked"; 2]);
        let info = cache.entries()[0].rejections.clone();
        assert_eq!(info.confirmed, 0, "not confirmed");
        assert!(
            matches!(&info.last_answer, Some(Answer::Unchecked(why)) if why.contains("provideClusterInfo")),
            "{:?}",
            info.last_answer
        );
    }
}

// ---------------------------------------------------------------------------------------
// Hostile callers: the re-ask check can be neither held, grown nor fooled by another uid.
// ---------------------------------------------------------------------------------------

/// Red-team finding: 16 made-up callers of one uid on a shared entry pushed the real caller of
/// another uid out, so its re-ask looked like a first ask (no check, the revoked token served).
#[tokio::test(start_paused = true)]
async fn a_uid_can_push_out_only_its_own_callers() {
    let mut m = Memory::default();
    let t0 = digest("t0");
    let now = Instant::now();
    let (real, victim_uid, attacker_uid) = (CallerId::new(10, 1, 1), Some(1000), Some(66));
    m.served(real, victim_uid, now, now + HOUR, t0);
    for pid in 100..100 + 3 * MAX_CALLERS_PER_ENTRY as u32 {
        m.served(CallerId::new(pid, 1, 1), attacker_uid, now, now + HOUR, t0);
    }
    assert_eq!(m.callers_of(victim_uid), [real]);
    assert_eq!(m.callers_of(attacker_uid).len(), MAX_CALLERS_PER_ENTRY);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(m.reask(&real, victim_uid, Instant::now(), t0), Reask::Held);
    // The same caller id claimed from the other uid is another caller: no re-ask of the
    // real one's, and nothing of the real one's record changes.
    assert_eq!(m.reask(&real, attacker_uid, Instant::now(), t0), Reask::No);
    // Uids past the bound are not remembered, rather than pushing a remembered one out.
    for uid in 0..2 * MAX_UIDS_PER_ENTRY as u32 {
        m.served(CallerId::new(7, 7, 7), Some(uid), now, now + HOUR, t0);
    }
    assert_eq!(m.callers_of(victim_uid), [real]);
    let mut uids: Vec<Option<u32>> = m.callers.iter().map(|r| r.uid).collect();
    uids.dedup();
    assert_eq!(uids.len(), MAX_UIDS_PER_ENTRY);
    assert!(m.heap_bytes() < MAX_UIDS_PER_ENTRY * MAX_CALLERS_PER_ENTRY * RECORD_BYTES * 2);
    // Past their come-back time, callers make room for a new uid again.
    tokio::time::advance(2 * HOUR).await;
    m.served(
        CallerId::new(8, 8, 8),
        Some(4242),
        Instant::now(),
        Instant::now() + HOUR,
        t0,
    );
    assert_eq!(m.callers_of(Some(4242)).len(), 1);
}

mod hostile_callers {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::engine::cache::{Ask, CHECK_WAIT, Cache, CacheSettings, Served};
    use crate::engine::review::{Answer, CHECK_TIMEOUT, CredentialCheck, MAX_CONCURRENT_CHECKS};
    use crate::providers::fake::FakeProvider;
    use crate::providers::{BoxFuture, Credential, CredentialSecret, Provider};
    use crate::request::caller::{Caller, CallerId, Peer};
    use crate::request::{ClusterInfo, TokenRequest};

    const HOUR: Duration = Duration::from_secs(3600);

    /// API servers by URL: each answers after its delay (`None`: never), as scripted. Counts
    /// the checks running at once: `check` is where the real one builds its client and CA
    /// store, so this is also how many of those exist.
    #[derive(Default)]
    struct Servers {
        script: Mutex<HashMap<String, (Option<Duration>, Answer)>>,
        running: AtomicUsize,
        max_running: AtomicUsize,
        calls: AtomicUsize,
    }

    struct Running<'a>(&'a AtomicUsize);
    impl Drop for Running<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl CredentialCheck for Servers {
        fn check(&self, cluster: Option<&ClusterInfo>, _: &Credential) -> BoxFuture<'_, Answer> {
            let server = cluster.map(|c| c.server.clone()).unwrap_or_default();
            let (delay, answer) = self.script.lock().unwrap()[&server].clone();
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            Box::pin(async move {
                let _running = Running(&self.running);
                match delay {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
                answer
            })
        }
    }

    struct World {
        cache: Arc<Cache>,
        provider: Arc<dyn Provider>,
        servers: Arc<Servers>,
    }

    fn world() -> World {
        let servers = Arc::new(Servers::default());
        let cache = Cache::new(CacheSettings {
            max_entries: 10_000,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            idle_timeout: 2 * HOUR,
            upstream_timeout: crate::engine::cache::UPSTREAM_TIMEOUT,
            max_concurrent_fetches: 16,
        })
        .with_checker(servers.clone());
        World {
            cache: Arc::new(cache),
            provider: Arc::new(FakeProvider::new(HOUR)),
            servers,
        }
    }

    impl World {
        fn server(&self, url: &str, delay: Option<Duration>, answer: Answer) {
            self.servers
                .script
                .lock()
                .unwrap()
                .insert(url.into(), (delay, answer));
        }

        async fn ask(&self, cluster: &str, server: &str, caller: CallerId, uid: u32) -> Served {
            let req = req(cluster, server);
            let target = self.provider.resolve(&req).unwrap();
            let caller = Caller {
                peer: Peer {
                    uid: Some(uid),
                    gid: None,
                },
                id: Some(caller),
            };
            let ask = Ask::new(&self.provider, &req, &target).by(caller);
            self.cache.get(ask).await.unwrap()
        }

        /// A re-ask in its own task.
        fn spawn_ask(
            self: &Arc<Self>,
            cluster: &str,
            server: &str,
            caller: CallerId,
            uid: u32,
        ) -> tokio::task::JoinHandle<Served> {
            let (w, cluster, server) = (Arc::clone(self), cluster.to_owned(), server.to_owned());
            tokio::spawn(async move { w.ask(&cluster, &server, caller, uid).await })
        }
    }

    fn req(cluster: &str, server: &str) -> TokenRequest {
        let mut config = serde_json::Map::new();
        config.insert("clusterName".into(), cluster.into());
        TokenRequest {
            provider: "fake".into(),
            cluster: Some(ClusterInfo {
                server: server.into(),
                config: config.into(),
                ..Default::default()
            }),
            interactive: false,
        }
    }

    fn token(served: &Served) -> &str {
        match &served.credential.secret {
            CredentialSecret::Token(t) => t.expose(),
            CredentialSecret::ClientCertificate { .. } => panic!("a token"),
        }
    }

    const ATTACKER: u32 = 66;
    const OTHER_ATTACKER: u32 = 67;
    const VICTIM: u32 = 1000;
    const VICTIM_LATENCY: Duration = Duration::from_millis(200);

    /// `uid` asks once about `entries` entries whose server never answers.
    async fn first_asks(w: &Arc<World>, uid: u32, entries: u32) {
        let caller = CallerId::new(uid, 1, 1);
        for i in 0..entries {
            w.ask(&format!("{uid}-{i}"), "https://hangs", caller, uid)
                .await;
        }
    }

    /// Then re-asks about each, every call cancelled after 0.1 s: the red team's
    /// slot-holding attacker.
    async fn hold_slots(w: &Arc<World>, uid: u32, entries: u32) {
        let caller = CallerId::new(uid, 1, 1);
        let reasks: Vec<_> = (0..entries)
            .map(|i| w.spawn_ask(&format!("{uid}-{i}"), "https://hangs", caller, uid))
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        for r in reasks {
            r.abort();
        }
    }

    /// Red-team finding (point 1): one allowed uid re-asking about 1 300 entries held all 16
    /// check slots, and another uid's re-ask waited the whole 5 s for one and got the revoked
    /// token back. Now the cache hands out the slots (the checks' own count was in the
    /// real check, unbounded above it), a uid holds all but two, and the victim's check starts
    /// at once.
    #[tokio::test(start_paused = true)]
    async fn one_uid_cannot_hold_every_check_slot() {
        let w = Arc::new(world());
        w.server("https://hangs", None, Answer::Accepted(201));
        w.server("https://victim", Some(VICTIM_LATENCY), Answer::Rejected);
        let victim = CallerId::new(10, 1, 1);
        let revoked = w.ask("victim", "https://victim", victim, VICTIM).await;
        first_asks(&w, ATTACKER, 1300).await;
        tokio::time::advance(Duration::from_secs(10)).await;
        hold_slots(&w, ATTACKER, 1300).await;
        let busy = w.servers.running.load(Ordering::SeqCst);
        assert!(
            busy <= MAX_CONCURRENT_CHECKS - 2,
            "one uid holds at most all but two slots: {busy}"
        );
        let started = Instant::now();
        let served = w.ask("victim", "https://victim", victim, VICTIM).await;
        assert_ne!(
            token(&served),
            token(&revoked),
            "the revoked token replaced"
        );
        assert_eq!(
            started.elapsed(),
            VICTIM_LATENCY,
            "one check of its own server"
        );
        assert!(w.servers.max_running.load(Ordering::SeqCst) <= MAX_CONCURRENT_CHECKS);
    }

    /// Red-team finding (point 1, the bound): the 5 s of a check counted its wait for a slot.
    /// With two uids holding every slot, the victim's uid gets the first slot that frees, and
    /// its check then gets its own 5 s: a server answering in 200 ms answers it.
    #[tokio::test(start_paused = true)]
    async fn a_checks_time_bound_starts_when_it_starts() {
        let w = Arc::new(world());
        w.server("https://hangs", None, Answer::Accepted(201));
        w.server("https://victim", Some(VICTIM_LATENCY), Answer::Rejected);
        let victim = CallerId::new(10, 1, 1);
        let revoked = w.ask("victim", "https://victim", victim, VICTIM).await;
        first_asks(&w, ATTACKER, 100).await;
        first_asks(&w, OTHER_ATTACKER, 100).await;
        tokio::time::advance(Duration::from_secs(10)).await;
        hold_slots(&w, ATTACKER, 100).await;
        hold_slots(&w, OTHER_ATTACKER, 100).await;
        assert_eq!(
            w.servers.running.load(Ordering::SeqCst),
            MAX_CONCURRENT_CHECKS
        );
        let started = Instant::now();
        let served = tokio::time::timeout(
            CHECK_WAIT + CHECK_TIMEOUT,
            w.ask("victim", "https://victim", victim, VICTIM),
        )
        .await
        .expect("answered within the bounds");
        assert_ne!(token(&served), token(&revoked));
        assert!(
            started.elapsed() <= CHECK_TIMEOUT + VICTIM_LATENCY,
            "at most one check's wait, then its own server: {:?}",
            started.elapsed()
        );
        // A check whose server never answers ends at its own bound, slot given back.
        tokio::time::sleep(CHECK_TIMEOUT).await;
        assert_eq!(w.servers.running.load(Ordering::SeqCst), 0);
    }

    /// Red-team finding (point 2): each re-ask waiting for a slot kept a copy of the request
    /// and a parsed CA store (one uid: 10 → 125 MiB). Now a re-ask waits as its own call,
    /// holding its place in the queue: the check (client, CA store, request copy) exists only
    /// once it holds a slot, and a re-ask that gives up leaves nothing behind. The queue is
    /// bounded per uid and in all.
    #[tokio::test(start_paused = true)]
    async fn waiting_re_asks_hold_no_check_and_are_bounded() {
        let w = Arc::new(world());
        w.server("https://hangs", None, Answer::Accepted(201));
        let caller = CallerId::new(ATTACKER, 1, 1);
        let entries = crate::engine::cache::MAX_WAITING_CHECKS_PER_UID as u32 + 100;
        for i in 0..entries {
            w.ask(&format!("e-{i}"), "https://hangs", caller, ATTACKER)
                .await;
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        let reasks: Vec<_> = (0..entries)
            .map(|i| w.spawn_ask(&format!("e-{i}"), "https://hangs", caller, ATTACKER))
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Checks made: as many as the uid may hold slots, however many re-asks wait.
        assert_eq!(
            w.servers.calls.load(Ordering::SeqCst),
            MAX_CONCURRENT_CHECKS - 2
        );
        // The re-asks past the uid's waiting bound were answered at once, the held token.
        let finished = reasks.iter().filter(|r| r.is_finished()).count();
        assert_eq!(finished, 100 - (MAX_CONCURRENT_CHECKS - 2));
        for r in reasks {
            r.abort();
        }
        // Given up: nothing of theirs is left but the running checks.
        tokio::task::yield_now().await;
        assert_eq!(
            w.servers.calls.load(Ordering::SeqCst),
            MAX_CONCURRENT_CHECKS - 2
        );
        tokio::time::sleep(CHECK_TIMEOUT).await;
        assert_eq!(w.servers.running.load(Ordering::SeqCst), 0);
        assert_eq!(
            w.servers.calls.load(Ordering::SeqCst),
            MAX_CONCURRENT_CHECKS - 2,
            "the re-asks that gave up made no check"
        );
    }

    /// Red-team finding (point 6a): a victim's re-ask joined the check another uid had
    /// started against a server of its own on the same entry, and took its "unreachable";
    /// right after, it took that answer again from the 1 s reuse. Now a check and its answer
    /// are per server and credential.
    #[tokio::test(start_paused = true)]
    async fn a_check_answers_only_re_asks_about_its_own_server() {
        let w = Arc::new(world());
        w.server(
            "https://attacker",
            Some(Duration::from_secs(1)),
            Answer::Unreachable("down".into()),
        );
        w.server("https://victim", Some(VICTIM_LATENCY), Answer::Rejected);
        let (victim, attacker) = (CallerId::new(10, 1, 1), CallerId::new(66, 6, 6));
        // One shared entry (the same identity), asked about with two servers.
        w.ask("shared", "https://victim", victim, VICTIM).await;
        w.ask("shared", "https://attacker", attacker, ATTACKER)
            .await;
        tokio::time::advance(Duration::from_secs(10)).await;
        let attack = w.spawn_ask("shared", "https://attacker", attacker, ATTACKER);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let served = w.ask("shared", "https://victim", victim, VICTIM).await;
        assert_eq!(token(&served), "fake-shared-2", "its own server's 401");
        attack.await.unwrap();
        // The reuse: the attacker's unreachable, fresh, stands for no one else's server.
        let w = Arc::new(world());
        w.server(
            "https://attacker",
            Some(Duration::from_millis(1)),
            Answer::Unreachable("down".into()),
        );
        w.server("https://victim", Some(VICTIM_LATENCY), Answer::Rejected);
        w.ask("shared", "https://victim", victim, VICTIM).await;
        w.ask("shared", "https://attacker", attacker, ATTACKER)
            .await;
        tokio::time::advance(Duration::from_secs(10)).await;
        w.ask("shared", "https://attacker", attacker, ATTACKER)
            .await;
        let served = w.ask("shared", "https://victim", victim, VICTIM).await;
        assert_eq!(token(&served), "fake-shared-2");
    }

    /// Point 3 through the cache: a flood of made-up callers from another uid leaves the real
    /// caller's record, so its re-ask is still checked and the revoked token replaced.
    #[tokio::test(start_paused = true)]
    async fn a_caller_flood_of_another_uid_leaves_the_real_callers_re_ask_checked() {
        let w = Arc::new(world());
        w.server("https://victim", Some(VICTIM_LATENCY), Answer::Rejected);
        let victim = CallerId::new(10, 1, 1);
        w.ask("shared", "https://victim", victim, VICTIM).await;
        for pid in 0..64 {
            w.ask(
                "shared",
                "https://victim",
                CallerId::new(5000 + pid, 1, 1),
                ATTACKER,
            )
            .await;
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        let served = w.ask("shared", "https://victim", victim, VICTIM).await;
        assert_eq!(token(&served), "fake-shared-2");
    }
}
