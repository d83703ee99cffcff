//! Every cache rule, on paused tokio time.

use std::time::{Duration, SystemTime};

use super::entry::{backoff, schedule};
use super::*;
use crate::base::clock::{wall_ahead, wall_now, wall_reset};
use crate::providers::CredentialSecret;
use crate::providers::fake::FakeProvider;
use crate::request::ClusterInfo;

const HOUR: Duration = Duration::from_secs(3600);
const MIN: Duration = Duration::from_secs(60);

/// Red-team finding: entries were timed on the monotonic clock only, so where it lags the
/// wall clock (a suspended VM, a restored checkpoint) a credential expired by the wall clock
/// was served, with a come-back time in the past. Now both clocks bound it.
#[tokio::test(start_paused = true)]
async fn a_credential_is_never_served_past_its_wall_clock_expiry() {
    let (cache, fake, provider) = setup(HOUR);
    let first = get(&cache, &provider, "a").await.unwrap();
    assert_eq!(token(&first), "fake-a-1");
    // The VM slept 40 minutes: past the refresh time by the wall clock only. Still served,
    // a refresh starts, and the come-back time is in the (wall clock's) future.
    wall_ahead(40 * MIN);
    let stale = get(&cache, &provider, "a").await.unwrap();
    assert_eq!((token(&stale), stale.outcome), ("fake-a-1", Outcome::Stale));
    assert!(stale.come_back > wall_now(), "come-back in the future");
    assert!(
        stale.come_back < first.credential.expires_at,
        "before expiry"
    );
    settle().await;
    assert_eq!(fake.calls(), 2, "the refresh ran");
    // Slept past the expiry of what the entry holds: never served, fetched anew.
    let (cache, fake, provider) = setup(HOUR);
    get(&cache, &provider, "a").await.unwrap();
    wall_ahead(2 * HOUR);
    let after = get(&cache, &provider, "a").await.unwrap();
    assert_eq!((token(&after), after.outcome), ("fake-a-2", Outcome::Miss));
    assert_eq!(fake.calls(), 2);
    assert!(after.come_back > wall_now());
    wall_reset();
}

fn settings() -> CacheSettings {
    CacheSettings {
        max_entries: 100,
        max_bytes: crate::config::DEFAULT_MAX_BYTES,
        idle_timeout: 2 * HOUR,
        upstream_timeout: UPSTREAM_TIMEOUT,
        max_concurrent_fetches: crate::config::DEFAULT_MAX_CONCURRENT_FETCHES,
    }
}

fn setup(ttl: Duration) -> (Arc<Cache>, Arc<FakeProvider>, Arc<dyn Provider>) {
    let fake = Arc::new(FakeProvider::new(ttl));
    let provider: Arc<dyn Provider> = fake.clone();
    (Arc::new(Cache::new(settings())), fake, provider)
}

fn req(cluster: &str) -> TokenRequest {
    let mut config = serde_json::Map::new();
    config.insert("clusterName".into(), cluster.into());
    TokenRequest {
        provider: "fake".into(),
        cluster: Some(ClusterInfo {
            server: format!("https://{cluster}"),
            config: config.into(),
            ..Default::default()
        }),
        interactive: false,
    }
}

fn key(cluster: &str) -> CacheKey {
    CacheKey {
        provider: "fake".into(),
        identity: cluster.into(),
    }
}

async fn get(
    cache: &Cache,
    provider: &Arc<dyn Provider>,
    cluster: &str,
) -> Result<Served, CacheError> {
    let req = req(cluster);
    let target = provider.resolve(&req)?;
    cache.get(Ask::new(provider, &req, &target)).await
}

fn token(served: &Served) -> &str {
    match &served.credential.secret {
        CredentialSecret::Token(t) => t.expose(),
        CredentialSecret::ClientCertificate { .. } => panic!("expected a token"),
    }
}

/// Lets spawned background fetches run to completion.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn miss_then_hit() {
    let (cache, fake, p) = setup(HOUR);
    let first = get(&cache, &p, "a").await.unwrap();
    assert_eq!(first.outcome, Outcome::Miss);
    assert_eq!(token(&first), "fake-a-1");
    let second = get(&cache, &p, "a").await.unwrap();
    assert_eq!(second.outcome, Outcome::Hit);
    assert_eq!(token(&second), "fake-a-1");
    assert_eq!(fake.calls(), 1);
    // Another identity is another entry.
    assert_eq!(token(&get(&cache, &p, "b").await.unwrap()), "fake-b-2");
    assert_eq!(cache.entry_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn concurrent_misses_share_one_fetch() {
    let (cache, fake, p) = setup(HOUR);
    fake.set_delay(Duration::from_millis(200));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (cache, p) = (cache.clone(), p.clone());
        tasks.push(tokio::spawn(async move { get(&cache, &p, "a").await }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        let served = task.await.unwrap().unwrap();
        assert_eq!(token(&served), "fake-a-1");
        outcomes.push(served.outcome);
    }
    assert_eq!(fake.calls(), 1);
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Miss).count(), 1);
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Joined).count(),
        99
    );
}

#[tokio::test(start_paused = true)]
async fn a_fetch_completes_even_if_its_caller_gives_up() {
    let (cache, fake, p) = setup(HOUR);
    fake.set_delay(Duration::from_secs(5));
    let gave_up = tokio::time::timeout(Duration::from_secs(1), get(&cache, &p, "a")).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let served = get(&cache, &p, "a").await.unwrap();
    assert_eq!(served.outcome, Outcome::Hit);
    assert_eq!(fake.calls(), 1);
}

#[test]
fn schedule_refreshes_at_jittered_half_life() {
    for r in [0.0, 0.5, 0.999] {
        let (refresh, serve) = schedule(HOUR, r);
        assert!(refresh >= 24 * MIN && refresh <= 36 * MIN, "{refresh:?}");
        assert_eq!(serve, HOUR - STALE_MARGIN);
    }
    assert!(
        schedule(HOUR, 0.0).0 < schedule(HOUR, 0.999).0,
        "jitter moves the refresh time"
    );
}

#[test]
fn schedule_never_refreshes_later_than_five_minutes_before_expiry() {
    for lifetime in [10 * MIN, 11 * MIN, 15 * MIN, 12 * HOUR] {
        for r in [0.0, 0.999] {
            let (refresh, _) = schedule(lifetime, r);
            assert!(
                refresh <= lifetime - REFRESH_LEAD,
                "{lifetime:?}: {refresh:?}"
            );
        }
    }
}

#[test]
fn schedule_for_short_lived_tokens_keeps_half_life_and_shrinks_margin() {
    // 8 minutes: "expiry - 5 min" would refresh after 3 minutes; half-life wins.
    let (refresh, serve) = schedule(8 * MIN, 0.5);
    assert_eq!(refresh, 4 * MIN);
    assert_eq!(serve, 7 * MIN);
    // 1 minute: served for 45 s (a quarter as margin), refreshed around 30 s.
    let (refresh, serve) = schedule(MIN, 0.5);
    assert_eq!(serve, Duration::from_secs(45));
    assert_eq!(refresh, Duration::from_secs(30));
    // 2 seconds still yields a usable window.
    let (refresh, serve) = schedule(Duration::from_secs(2), 0.999);
    assert!(refresh <= serve && serve == Duration::from_millis(1500));
}

#[tokio::test(start_paused = true)]
async fn refresh_ahead_serves_the_old_token_without_waiting() {
    let (cache, fake, p) = setup(HOUR);
    get(&cache, &p, "a").await.unwrap();
    fake.set_delay(Duration::from_secs(10));
    // Before the earliest refresh time: a plain hit, no upstream call.
    tokio::time::advance(23 * MIN).await;
    assert_eq!(get(&cache, &p, "a").await.unwrap().outcome, Outcome::Hit);
    assert_eq!(fake.calls(), 1);
    // Past the latest refresh time: the old token comes back at once, a refresh starts.
    tokio::time::advance(14 * MIN).await;
    let started = Instant::now();
    let stale = get(&cache, &p, "a").await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a hit never waits on upstream"
    );
    assert_eq!(stale.outcome, Outcome::Stale);
    assert_eq!(token(&stale), "fake-a-1");
    // Many hits during the refresh start no second one.
    for _ in 0..10 {
        assert_eq!(token(&get(&cache, &p, "a").await.unwrap()), "fake-a-1");
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(fake.calls(), 2);
    let fresh = get(&cache, &p, "a").await.unwrap();
    assert_eq!((token(&fresh), fresh.outcome), ("fake-a-2", Outcome::Hit));
}

#[tokio::test(start_paused = true)]
async fn come_back_time_is_in_the_future_and_before_expiry() {
    let (cache, fake, p) = setup(HOUR);
    let served = get(&cache, &p, "a").await.unwrap();
    let until = served.come_back.duration_since(SystemTime::now()).unwrap();
    assert!(
        until >= 24 * MIN - Duration::from_secs(1) && until <= 36 * MIN,
        "{until:?}"
    );
    // Past the refresh time with upstream down: come back at the end of the serving window.
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    tokio::time::advance(40 * MIN).await;
    let stale = get(&cache, &p, "a").await.unwrap();
    let until = stale.come_back.duration_since(SystemTime::now()).unwrap();
    // (Up to a second later: come-back times are whole seconds.)
    assert!(
        until > Duration::ZERO && until <= 19 * MIN + Duration::from_secs(1),
        "{until:?}"
    );
    assert!(stale.come_back < served.credential.expires_at - STALE_MARGIN + Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn refresh_failure_serves_cached_token_until_expiry_minus_margin() {
    let (cache, fake, p) = setup(HOUR);
    get(&cache, &p, "a").await.unwrap();
    fake.fail_with(Some(ProviderError::Unavailable("upstream down".into())));
    tokio::time::advance(40 * MIN).await;
    // Keep asking every 30 s up to 58 min: always the old token, while refreshes fail.
    let stop = Instant::now() + 18 * MIN;
    while Instant::now() < stop {
        let served = get(&cache, &p, "a").await.unwrap();
        assert_eq!(token(&served), "fake-a-1");
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let calls_while_stale = fake.calls();
    assert!(calls_while_stale >= 2, "refreshes were attempted");
    // Past expiry - 60 s: never served; the caller gets the upstream error.
    tokio::time::advance(HOUR).await;
    let err = get(&cache, &p, "a").await.unwrap_err();
    assert!(err.to_string().contains("upstream down"), "{err}");
    assert!(err.is_transient());
}

#[tokio::test(start_paused = true)]
async fn stale_window_ends_exactly_one_margin_before_expiry() {
    let (cache, fake, p) = setup(HOUR);
    get(&cache, &p, "a").await.unwrap();
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    tokio::time::advance(HOUR - STALE_MARGIN - Duration::from_millis(1)).await;
    assert_eq!(token(&get(&cache, &p, "a").await.unwrap()), "fake-a-1");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(get(&cache, &p, "a").await.is_err());
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_and_reset_on_success() {
    let (cache, fake, p) = setup(HOUR);
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    assert!(get(&cache, &p, "a").await.is_err());
    assert_eq!(fake.calls(), 1);
    // Within the first backoff (≥ 0.8 s): fail fast, no upstream call.
    let err = get(&cache, &p, "a").await.unwrap_err();
    assert!(matches!(err, CacheError::BackingOff { .. }), "{err:?}");
    assert!(err.to_string().contains("retrying in"), "{err}");
    assert_eq!(fake.calls(), 1);
    // Retry times grow: 1 s, 2 s, 4 s, 8 s (each ±20 %).
    let mut waits = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        loop {
            tokio::time::advance(Duration::from_millis(50)).await;
            let before = fake.calls();
            let _ = get(&cache, &p, "a").await;
            if fake.calls() > before {
                break;
            }
        }
        waits.push(started.elapsed());
    }
    for (i, wait) in waits.iter().enumerate() {
        let base = INITIAL_BACKOFF * (1 << (i + 1)) / 2;
        assert!(
            *wait >= base.mul_f64(0.8) && *wait <= base.mul_f64(1.2) + Duration::from_millis(50),
            "{i}: {wait:?}"
        );
    }
    // Success resets: the next failure waits about a second again.
    fake.fail_with(None);
    tokio::time::advance(MAX_BACKOFF).await;
    get(&cache, &p, "a").await.unwrap();
    assert_eq!(
        backoff(1, 0.999),
        INITIAL_BACKOFF.mul_f64(1.0 + BACKOFF_JITTER * 0.998)
    );
    assert_eq!(backoff(30, 0.999), MAX_BACKOFF);
}

#[tokio::test(start_paused = true)]
async fn denial_drops_the_entry() {
    let (cache, fake, p) = setup(HOUR);
    get(&cache, &p, "a").await.unwrap();
    fake.fail_with(Some(ProviderError::Denied("role gone".into())));
    tokio::time::advance(40 * MIN).await;
    // This hit still gets the old token; its background refresh is denied.
    assert_eq!(token(&get(&cache, &p, "a").await.unwrap()), "fake-a-1");
    settle().await;
    // The denied token is not served again; the denial stands for DENIAL_RETRY_AFTER.
    let err = get(&cache, &p, "a").await.unwrap_err();
    assert!(
        matches!(&err, CacheError::BackingOff { last, .. }
            if matches!(**last, CacheError::Provider(ProviderError::Denied(_)))),
        "{err:?}"
    );
    assert_eq!(fake.calls(), 2);
    fake.fail_with(None);
    tokio::time::advance(DENIAL_RETRY_AFTER).await;
    assert_eq!(token(&get(&cache, &p, "a").await.unwrap()), "fake-a-3");
}

/// A fleet whose clusters share one identity asks for it once per cluster: when the upstream
/// denies it (a disabled client, a role gone), each of those calls asked the upstream again,
/// a thousand upstream calls per round of a thousand clusters' retries.
#[tokio::test(start_paused = true)]
async fn a_denied_identity_is_asked_upstream_once_per_interval_whatever_the_callers() {
    let (cache, fake, p) = setup(HOUR);
    fake.fail_with(Some(ProviderError::Denied("client disabled".into())));
    assert!(get(&cache, &p, "a").await.is_err());
    for _ in 0..1000 {
        let err = get(&cache, &p, "a").await.unwrap_err();
        assert!(err.to_string().contains("client disabled"), "{err}");
    }
    assert_eq!(fake.calls(), 1);
    // The interval stays the same while the denial lasts: the operator's fix is seen within
    // it, however long the identity was denied.
    for round in 2..=10 {
        tokio::time::advance(DENIAL_RETRY_AFTER).await;
        assert!(get(&cache, &p, "a").await.is_err());
        assert!(get(&cache, &p, "a").await.is_err());
        assert_eq!(fake.calls(), round);
    }
    fake.fail_with(None);
    tokio::time::advance(DENIAL_RETRY_AFTER).await;
    get(&cache, &p, "a").await.unwrap();
    assert_eq!(fake.calls(), 11);
}

/// A missing source (a Secret not created yet, a file not written yet) is not a denial: it
/// is looked for again at the next call.
#[tokio::test(start_paused = true)]
async fn a_missing_source_is_looked_for_again_at_the_next_call() {
    let (cache, fake, p) = setup(HOUR);
    fake.fail_with(Some(ProviderError::NotFound("no such Secret".into())));
    assert!(get(&cache, &p, "a").await.is_err());
    fake.fail_with(None);
    get(&cache, &p, "a").await.unwrap();
    assert_eq!(fake.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_expired_credential_from_upstream_is_never_served() {
    let (cache, fake, p) = setup(Duration::ZERO);
    let err = get(&cache, &p, "a").await.unwrap_err();
    assert!(matches!(err, CacheError::Expired), "{err:?}");
    fake.set_ttl(HOUR);
    tokio::time::advance(MAX_BACKOFF).await;
    assert_eq!(token(&get(&cache, &p, "a").await.unwrap()), "fake-a-2");
}

#[tokio::test(start_paused = true)]
async fn upstream_timeout_frees_the_entry() {
    let (cache, fake, p) = setup(HOUR);
    fake.set_delay(UPSTREAM_TIMEOUT * 2);
    let err = get(&cache, &p, "a").await.unwrap_err();
    assert!(matches!(err, CacheError::UpstreamTimeout(_)), "{err:?}");
    fake.set_delay(Duration::ZERO);
    tokio::time::advance(MAX_BACKOFF).await;
    assert_eq!(token(&get(&cache, &p, "a").await.unwrap()), "fake-a-2");
}

#[tokio::test(start_paused = true)]
async fn max_entries_bounds_the_cache() {
    let fake = Arc::new(FakeProvider::new(HOUR));
    let p: Arc<dyn Provider> = fake.clone();
    let cache = Cache::new(CacheSettings {
        max_entries: 10,
        max_bytes: crate::config::DEFAULT_MAX_BYTES,
        ..settings()
    });
    for i in 0..50 {
        get(&cache, &p, &format!("c{i}")).await.unwrap();
    }
    assert!(cache.entry_count() <= 10, "{}", cache.entry_count());
}

/// A request as large as `limits.*` admit by default: 44 KB of CA data, a 9 KB exec
/// extension and a 4 KB server.
fn big_req(cluster: &str) -> TokenRequest {
    let mut config = serde_json::Map::new();
    config.insert("clusterName".into(), cluster.into());
    config.insert("pad".into(), "p".repeat(9_000).into());
    TokenRequest {
        provider: "fake".into(),
        cluster: Some(ClusterInfo {
            server: format!("https://{cluster}.{}", "s".repeat(4_000)),
            certificate_authority_data: vec![b'c'; 44_000],
            config: config.into(),
            ..Default::default()
        }),
        interactive: false,
    }
}

/// Red-team finding (issue 20, item 3): 10 000 requests that each passed every `limits.*`
/// check made entries of about 75 KB and took RSS to 745 MiB, under `maxEntries`. Now what
/// entries weigh is bounded by `cache.maxBytes`, and an entry keeps no CA data its provider
/// does not pass on.
#[tokio::test(start_paused = true)]
async fn max_bytes_bounds_what_entries_weigh() {
    let fake = Arc::new(FakeProvider::new(HOUR));
    let p: Arc<dyn Provider> = fake.clone();
    let max_bytes = crate::config::MIN_MAX_BYTES;
    let cache = Cache::new(CacheSettings {
        max_entries: 10_000,
        max_bytes,
        ..settings()
    });
    let get_big = |cluster: String| {
        let (cache, p) = (&cache, &p);
        async move {
            let req = big_req(&cluster);
            let target = p.resolve(&req).unwrap();
            cache.get(Ask::new(p, &req, &target)).await
        }
    };
    get_big("first".into()).await.unwrap();
    let one = cache.bytes();
    // The request kept for refreshes holds the config and server, not the CA data (the
    // fake, like every provider but exec, does not pass it on).
    assert!((13_000..20_000).contains(&one), "one entry weighs {one}");
    for i in 0..500 {
        tokio::time::advance(Duration::from_millis(10)).await;
        get_big(format!("c{i}")).await.unwrap();
        assert!(
            cache.bytes() <= max_bytes,
            "{} > {max_bytes}",
            cache.bytes()
        );
    }
    let held = cache.entry_count();
    assert!((40..100).contains(&held), "{held} entries of ~{one} bytes");
    // The least recently used went; the newest are still hits.
    assert_eq!(get_big("c499".into()).await.unwrap().outcome, Outcome::Hit);
    assert_eq!(
        get_big("first".into()).await.unwrap().outcome,
        Outcome::Miss
    );
    // Remembered failures weigh too, and go first.
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    for i in 0..500 {
        tokio::time::advance(Duration::from_millis(10)).await;
        get_big(format!("f{i}")).await.unwrap_err();
        assert!(
            cache.bytes() <= max_bytes,
            "{} > {max_bytes}",
            cache.bytes()
        );
    }
    assert_eq!(get_big("c499".into()).await.unwrap().outcome, Outcome::Hit);
    // Every entry gone, nothing left counted.
    cache.invalidate(|_| true);
    assert_eq!(cache.bytes(), 0);
}

/// Hostile-benchmark finding: at `maxBytes` (or `maxEntries`) every new entry scanned the
/// whole table for the one to drop, under the lock every hit takes: 0.3 ms per new cluster at
/// 3 000 entries, so a caller adding clusters at the bound made every hit wait. Now one scan
/// chooses the next 64, and the least recently used still goes first.
#[tokio::test(start_paused = true)]
async fn evictions_at_the_bound_scan_the_table_once_per_64() {
    let fake = Arc::new(FakeProvider::new(HOUR));
    let p: Arc<dyn Provider> = fake.clone();
    let cache = Cache::new(CacheSettings {
        max_entries: 1_000,
        max_bytes: crate::config::DEFAULT_MAX_BYTES,
        ..settings()
    });
    for i in 0..1_000 {
        get(&cache, &p, &format!("c{i}")).await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    // Asked again after the first scan: skipped, though the scan chose it.
    get(&cache, &p, "n0").await.unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    get(&cache, &p, "c1").await.unwrap();
    for i in 1..640 {
        tokio::time::advance(Duration::from_millis(1)).await;
        get(&cache, &p, &format!("n{i}")).await.unwrap();
    }
    assert_eq!(cache.entry_count(), 1_000);
    let scans = cache.inner.table().scans;
    assert!(scans <= 640 / 64 + 1, "{scans} scans for 640 evictions");
    let held: std::collections::BTreeSet<String> = cache
        .entries()
        .into_iter()
        .map(|e| e.key.identity)
        .collect();
    // The 640 oldest but c1 went: c0 and c2..c640; c1 and c641.. stayed.
    assert!(held.contains("c1"), "c1 was asked since the scan");
    assert!(!held.contains("c0") && !held.contains("c640"));
    assert!(held.contains("c641") && held.contains("n639"));
}

/// Answers at once for clusters not named `hang-*`; never for those.
#[derive(Debug)]
struct HangsFor(FakeProvider);

impl Provider for HangsFor {
    fn kind(&self) -> crate::config::ProviderKind {
        self.0.kind()
    }
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        self.0.resolve(req)
    }
    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> crate::providers::BoxFuture<'a, Result<Credential, ProviderError>> {
        if target.key().starts_with("hang-") {
            return Box::pin(std::future::pending());
        }
        self.0.fetch(req, target)
    }
}

/// Red-team finding (issue 20, item 5): hanging misses took every permit, so held
/// credentials could not be refreshed while they hung. Refreshes of held entries now have a
/// reserve no miss can take.
#[tokio::test(start_paused = true)]
async fn hanging_misses_leave_the_reserve_to_refreshes_of_held_credentials() {
    let p: Arc<dyn Provider> = Arc::new(HangsFor(FakeProvider::new(HOUR)));
    let cache = Arc::new(Cache::new(settings()));
    assert_eq!(
        token(&get(&cache, &p, "held").await.unwrap()),
        "fake-held-1"
    );
    for i in 0..64 {
        let (cache, p) = (Arc::clone(&cache), Arc::clone(&p));
        tokio::spawn(async move { get(&cache, &p, &format!("hang-{i}")).await });
    }
    settle().await;
    // Past the refresh time: the background refresh runs on a reserved permit.
    tokio::time::advance(40 * MIN).await;
    let stale = get(&cache, &p, "held").await.unwrap();
    assert_eq!(stale.outcome, Outcome::Stale);
    settle().await;
    let after = get(&cache, &p, "held").await.unwrap();
    assert_eq!(
        (token(&after), after.outcome),
        ("fake-held-2", Outcome::Hit),
        "refreshed while 64 misses hang"
    );
    // A miss of another key still waits (every permit outside the reserve is taken).
    let miss = tokio::time::timeout(Duration::from_secs(1), get(&cache, &p, "new")).await;
    assert!(miss.is_err(), "{miss:?}");
}

#[tokio::test(start_paused = true)]
async fn idle_entries_age_out() {
    let (cache, fake, p) = setup(12 * HOUR);
    get(&cache, &p, "idle").await.unwrap();
    get(&cache, &p, "busy").await.unwrap();
    for _ in 0..5 {
        tokio::time::advance(30 * MIN).await;
        get(&cache, &p, "busy").await.unwrap();
        cache.sweep_idle();
    }
    // "idle" was last asked for 2.5 h ago (> 2 h idle timeout); "busy" 0 s ago.
    assert_eq!(cache.entry_count(), 1);
    let calls = fake.calls();
    assert_eq!(get(&cache, &p, "busy").await.unwrap().outcome, Outcome::Hit);
    assert_eq!(
        get(&cache, &p, "idle").await.unwrap().outcome,
        Outcome::Miss
    );
    assert_eq!(fake.calls(), calls + 1);
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_runs_on_its_own() {
    let (cache, _fake, p) = setup(12 * HOUR);
    let sweeper = cache.spawn_idle_sweeper();
    get(&cache, &p, "a").await.unwrap();
    tokio::time::sleep(3 * HOUR).await;
    assert_eq!(cache.entry_count(), 0);
    sweeper.abort();
}

#[tokio::test(start_paused = true)]
async fn entries_show_schedule_clusters_and_state_but_no_secret() {
    let (cache, fake, p) = setup(HOUR);
    get(&cache, &p, "a").await.unwrap();
    get(&cache, &p, "a").await.unwrap();
    let entries = cache.entries();
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(
        (e.clusters.as_slice(), e.hits, e.state),
        (&["a".to_owned()][..], 1, EntryState::Fresh)
    );
    assert!(e.refresh_at.unwrap() < e.expires_at.unwrap());
    assert!(
        !format!("{entries:?}").contains("fake-a-1"),
        "no credential in entry info"
    );
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    tokio::time::advance(40 * MIN).await;
    get(&cache, &p, "a").await.unwrap();
    settle().await;
    let e = &cache.entries()[0];
    assert_eq!((e.state, e.failures), (EntryState::BackingOff, 1));
    assert_eq!(e.last_error.as_deref(), Some("down"));
}

#[tokio::test(start_paused = true)]
async fn invalidate_and_forced_refresh() {
    let (cache, fake, p) = setup(HOUR);
    for c in ["a", "b", "c"] {
        get(&cache, &p, c).await.unwrap();
    }
    cache.refresh(&key("b"), &p).await.unwrap();
    assert_eq!(
        fake.calls(),
        4,
        "a forced refresh calls upstream even when fresh"
    );
    assert_eq!(token(&get(&cache, &p, "b").await.unwrap()), "fake-b-4");
    assert_eq!(cache.invalidate(|k| k.identity != "a"), 2);
    assert_eq!(cache.entry_count(), 1);
    assert!(
        cache.refresh(&key("b"), &p).await.is_err(),
        "no entry to refresh"
    );
}

#[tokio::test(start_paused = true)]
async fn the_observer_sees_every_upstream_call() {
    #[derive(Default)]
    struct Seen(std::sync::Mutex<Vec<(String, bool, bool)>>);
    impl CacheObserver for Seen {
        fn upstream_call(
            &self,
            provider: &str,
            _: Duration,
            result: Result<(), &CacheError>,
            background: bool,
        ) {
            self.0
                .lock()
                .unwrap()
                .push((provider.to_owned(), result.is_ok(), background));
        }
    }
    let seen = Arc::new(Seen::default());
    let fake = Arc::new(FakeProvider::new(HOUR));
    let p: Arc<dyn Provider> = fake.clone();
    let cache = Cache::new(settings()).with_observer(seen.clone());
    get(&cache, &p, "a").await.unwrap();
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    tokio::time::advance(40 * MIN).await;
    get(&cache, &p, "a").await.unwrap();
    settle().await;
    let calls = seen.0.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            ("fake".to_owned(), true, false),
            ("fake".to_owned(), false, true)
        ]
    );
}

mod properties {
    //! The cache's rules as properties over random lifetimes and random timelines.

    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use proptest::prelude::*;

    use super::*;
    use crate::config::ProviderKind;
    use crate::providers::BoxFuture;

    proptest! {
        #[test]
        fn schedule_stays_inside_the_lifetime(ms in 1u64..(48 * 3600 * 1000), r in 0.0f64..1.0) {
            let lifetime = Duration::from_millis(ms);
            let (refresh, serve) = schedule(lifetime, r);
            prop_assert!(refresh <= serve, "refresh {refresh:?} after serve {serve:?}");
            prop_assert!(serve < lifetime);
            prop_assert!(serve >= lifetime.mul_f64(0.75) && serve >= lifetime.saturating_sub(STALE_MARGIN));
            prop_assert!(refresh <= lifetime.mul_f64(0.6) + Duration::from_millis(1));
            if lifetime >= REFRESH_LEAD * 2 {
                prop_assert!(refresh <= lifetime - REFRESH_LEAD);
                prop_assert!(refresh >= lifetime.mul_f64(0.4) - Duration::from_millis(1));
            }
        }

        #[test]
        fn backoff_grows_and_stays_bounded(failures in 1u32..100, r in 0.0f64..1.0) {
            let wait = backoff(failures, r);
            prop_assert!(wait >= INITIAL_BACKOFF.mul_f64(1.0 - BACKOFF_JITTER) && wait <= MAX_BACKOFF);
            prop_assert!(backoff(failures + 1, r) >= wait);
        }

        #[test]
        fn outages_are_ridden_out_and_nothing_expired_is_served(
            ttl_s in 4u64..7200,
            steps in proptest::collection::vec((0u64..1_800_000, any::<bool>()), 1..40),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(timeline(Duration::from_secs(ttl_s), steps))?;
        }
    }

    /// A provider that records when it issued each token and fails on demand.
    #[derive(Debug, Default)]
    struct Recording {
        ttl: Duration,
        failing: AtomicBool,
        issued: Mutex<Vec<Instant>>,
    }

    impl Provider for Recording {
        fn kind(&self) -> ProviderKind {
            ProviderKind::Exec
        }
        fn resolve(&self, _: &TokenRequest) -> Result<Resolved, ProviderError> {
            Ok(Resolved::new("one", ()))
        }
        fn fetch<'a>(
            &'a self,
            _: &'a TokenRequest,
            _: &'a Resolved,
        ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
            Box::pin(async move {
                if self.failing.load(Ordering::SeqCst) {
                    return Err(ProviderError::Unavailable("down".into()));
                }
                let mut issued = self.issued.lock().unwrap();
                issued.push(Instant::now());
                Ok(Credential::token(
                    issued.len().to_string(),
                    SystemTime::now() + self.ttl,
                ))
            })
        }
    }

    /// Advances time step by step, flipping the upstream up and down, asking each time.
    async fn timeline(ttl: Duration, steps: Vec<(u64, bool)>) -> Result<(), TestCaseError> {
        let recording = Arc::new(Recording {
            ttl,
            ..Default::default()
        });
        let provider: Arc<dyn Provider> = recording.clone();
        let cache = Cache::new(settings());
        let window = ttl - STALE_MARGIN.min(ttl / 4);
        for (advance_ms, failing) in steps {
            tokio::time::advance(Duration::from_millis(advance_ms)).await;
            recording.failing.store(failing, Ordering::SeqCst);
            let now = Instant::now();
            let newest = recording.issued.lock().unwrap().last().copied();
            let result = get(&cache, &provider, "a").await;
            settle().await;
            match result {
                Ok(served) => {
                    let n: usize = token(&served).parse().unwrap();
                    let issued = recording.issued.lock().unwrap()[n - 1];
                    prop_assert!(
                        now - issued < window,
                        "token {n} served {:?} after issue (window {window:?})",
                        now - issued
                    );
                    prop_assert!(served.come_back > SystemTime::now());
                }
                Err(e) => {
                    // Failing is only allowed once the newest token has left its window.
                    if let Some(issued) = newest {
                        prop_assert!(
                            now - issued >= window,
                            "{e} at {:?} into a {window:?} window",
                            now - issued
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

#[test]
fn clusters_are_listed_sorted_once_and_counted_past_the_limit() {
    let mut st = State::default();
    let names: Vec<String> = (0..LISTED_CLUSTERS + 8)
        .rev()
        .map(|i| format!("c{i:03}"))
        .collect();
    for name in names.iter().chain(&names[..3]) {
        st.note_request(&req(name));
    }
    let mut want = names[..LISTED_CLUSTERS].to_vec();
    want.sort();
    assert_eq!(
        st.clusters, want,
        "the first {LISTED_CLUSTERS} seen, sorted"
    );
    assert_eq!(st.more_clusters, 8, "repeats are not counted again");
}

#[tokio::test(start_paused = true)]
async fn failures_never_evict_a_held_credential() {
    // maxEntries 100, one cached token, then 1 000 lookups that fail (issue 12, item 3).
    let (cache, fake, p) = setup(HOUR);
    get(&cache, &p, "held").await.unwrap();
    fake.fail_with(Some(ProviderError::NotFound(
        "token file is missing".into(),
    )));
    for i in 0..1000 {
        assert!(get(&cache, &p, &format!("missing-{i}")).await.is_err());
    }
    // Transient failures (remembered for their backoff) and a flood of them in flight at once.
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    for i in 0..1000 {
        assert!(get(&cache, &p, &format!("down-{i}")).await.is_err());
    }
    fake.set_delay(Duration::from_secs(1));
    let flood: Vec<_> = (0..1000)
        .map(|i| {
            let (cache, p) = (cache.clone(), p.clone());
            tokio::spawn(async move { get(&cache, &p, &format!("flood-{i}")).await })
        })
        .collect();
    for task in flood {
        assert!(task.await.unwrap().is_err());
    }
    cache.entry_count();
    let served = get(&cache, &p, "held").await.unwrap();
    assert_eq!(
        (token(&served), served.outcome),
        ("fake-held-1", Outcome::Hit)
    );
}

#[tokio::test(start_paused = true)]
async fn absurd_lifetimes_are_scheduled_as_the_maximum() {
    // An expiry centuries away (a JWT exp of 5e18 s got this far) is served, but the caller
    // comes back within the maximum lifetime and the broker fetches again by then.
    let (cache, fake, p) = setup(HOUR);
    fake.set_expires_at(Some(
        SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799),
    ));
    let served = get(&cache, &p, "a").await.unwrap();
    let until = served.come_back.duration_since(SystemTime::now()).unwrap();
    assert!(
        until <= 24 * HOUR * 6 / 10 + Duration::from_secs(1),
        "{until:?}"
    );
    tokio::time::advance(24 * HOUR).await;
    get(&cache, &p, "a").await.unwrap();
    settle().await;
    assert_eq!(fake.calls(), 2);
}

/// client-go's expirationTimestamp has whole seconds: what the server sends.
fn on_the_wire(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    SystemTime::UNIX_EPOCH
        + Duration::from_secs(since.as_secs() + u64::from(since.subsec_nanos() > 0))
}

#[tokio::test(start_paused = true)]
async fn come_back_is_a_future_whole_second_strictly_before_expiry() {
    // Short tokens whose exp is a whole second (every JWT): the come-back time rounded to
    // client-go's whole seconds used to land on the expiry itself.
    let (cache, fake, p) = setup(HOUR);
    let mut served_any = 0;
    for tenths in 11..=45 {
        for round in 0..20 {
            let now = SystemTime::now();
            let exp = on_the_wire(now + Duration::from_millis(tenths * 100));
            fake.set_expires_at(Some(exp));
            let cluster = format!("c{tenths}-{round}");
            match get(&cache, &p, &cluster).await {
                Ok(served) => {
                    served_any += 1;
                    let wire = on_the_wire(served.come_back);
                    assert!(
                        wire > now && wire < exp,
                        "{tenths}00 ms: come back {wire:?}, expiry {exp:?}"
                    );
                    assert_eq!(wire, served.come_back, "already a whole second");
                }
                Err(e) => {
                    // Only when no whole second is left between now and the expiry.
                    assert!(
                        exp.duration_since(now).unwrap() <= Duration::from_secs(2),
                        "{tenths}00 ms: {e}"
                    );
                    assert!(matches!(e, CacheError::ExpiresTooSoon(_)), "{e:?}");
                }
            }
        }
    }
    assert!(served_any > 600, "{served_any}");
}

#[tokio::test(start_paused = true)]
async fn remembered_failures_have_their_own_bound() {
    let (cache, fake, p) = setup(HOUR);
    fake.fail_with(Some(ProviderError::Unavailable("down".into())));
    for i in 0..3 * MAX_REMEMBERED_FAILURES {
        assert!(get(&cache, &p, &format!("down-{i}")).await.is_err());
    }
    let count = usize::try_from(cache.entry_count()).unwrap();
    assert!(count <= MAX_REMEMBERED_FAILURES, "{count}");
    // The most recent ones are still remembered, with their backoff.
    let calls = fake.calls();
    let err = get(
        &cache,
        &p,
        &format!("down-{}", 3 * MAX_REMEMBERED_FAILURES - 1),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CacheError::BackingOff { .. }), "{err:?}");
    assert_eq!(fake.calls(), calls);
}

#[tokio::test(start_paused = true)]
async fn a_new_credential_evicts_the_least_recently_used_one() {
    let fake = Arc::new(FakeProvider::new(HOUR));
    let p: Arc<dyn Provider> = fake.clone();
    let cache = Cache::new(CacheSettings {
        max_entries: 3,
        max_bytes: crate::config::DEFAULT_MAX_BYTES,
        ..settings()
    });
    for c in ["a", "b", "c"] {
        get(&cache, &p, c).await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    get(&cache, &p, "a").await.unwrap();
    get(&cache, &p, "d").await.unwrap();
    let held: Vec<String> = cache
        .entries()
        .into_iter()
        .map(|e| e.key.identity)
        .collect();
    assert_eq!(held, ["a", "c", "d"]);
}

fn capped(cap: usize) -> (Arc<Cache>, Arc<FakeProvider>, Arc<dyn Provider>) {
    let fake = Arc::new(FakeProvider::new(HOUR));
    let provider: Arc<dyn Provider> = fake.clone();
    let cache = Cache::new(CacheSettings {
        max_entries: 10_000,
        max_bytes: crate::config::DEFAULT_MAX_BYTES,
        max_concurrent_fetches: cap,
        ..settings()
    });
    (Arc::new(cache), fake, provider)
}

#[tokio::test(start_paused = true)]
async fn concurrent_misses_on_distinct_keys_are_capped_per_provider() {
    let (cache, fake, p) = capped(8);
    fake.set_delay(Duration::from_millis(100));
    let started = Instant::now();
    let tasks: Vec<_> = (0..600)
        .map(|i| {
            let (cache, p) = (cache.clone(), p.clone());
            tokio::spawn(async move { get(&cache, &p, &format!("c{i}")).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    // Misses take the cap less the refreshes' reserve (one of 8).
    let misses = 8 - crate::base::gate::reserve_of(8);
    assert_eq!((fake.calls(), fake.max_in_flight()), (600, misses));
    // They queued: 600 / 7 rounds (rounded up) of 100 ms.
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100 * 600_u64.div_ceil(7))
    );
}

#[tokio::test(start_paused = true)]
async fn joiners_take_no_permit_and_single_flight_holds() {
    let (cache, fake, p) = capped(1);
    fake.set_delay(Duration::from_secs(1));
    let started = Instant::now();
    let mut tasks: Vec<_> = (0..200)
        .map(|_| {
            let (cache, p) = (cache.clone(), p.clone());
            tokio::spawn(async move { get(&cache, &p, "a").await })
        })
        .collect();
    let (c, q) = (cache.clone(), p.clone());
    tasks.push(tokio::spawn(async move { get(&c, &q, "b").await }));
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!((fake.calls(), fake.max_in_flight()), (2, 1));
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "b waited for a only"
    );
}

#[tokio::test(start_paused = true)]
async fn refresh_all_and_background_refreshes_go_through_the_cap() {
    let (cache, fake, p) = capped(4);
    for i in 0..100 {
        get(&cache, &p, &format!("c{i}")).await.unwrap();
    }
    fake.set_delay(Duration::from_millis(100));
    // AdminService Refresh {all: true}: every entry at once.
    let keys = cache.keys(|_| true);
    let refreshes = keys.iter().map(|k| cache.refresh(k, &p));
    for result in futures_util::future::join_all(refreshes).await {
        result.unwrap();
    }
    assert_eq!((fake.calls(), fake.max_in_flight()), (200, 4));
    // Refresh-ahead: every entry past its refresh time, hit at once.
    tokio::time::advance(40 * MIN).await;
    for i in 0..100 {
        let served = get(&cache, &p, &format!("c{i}")).await.unwrap();
        assert_eq!(served.outcome, Outcome::Stale);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!((fake.calls(), fake.max_in_flight()), (300, 4));
}

#[tokio::test(start_paused = true)]
async fn a_queued_fetch_waits_at_most_the_upstream_timeout() {
    let (cache, fake, p) = capped(1);
    fake.set_delay(UPSTREAM_TIMEOUT - Duration::from_secs(1));
    let tasks: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|c| {
            let (cache, p) = (cache.clone(), p.clone());
            tokio::spawn(async move { get(&cache, &p, c).await })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    // a runs at once, b gets the permit after 59 s; c would wait 118 s: it gives up at 60.
    assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
    let err = results[2].as_ref().unwrap_err();
    assert!(matches!(err, CacheError::Busy { limit: 1, .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("cache.maxConcurrentFetches) stayed busy for 60s"),
        "{err}"
    );
    assert!(err.is_transient());
    assert_eq!(fake.calls(), 2);
}
