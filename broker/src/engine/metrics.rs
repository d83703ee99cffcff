//! Prometheus metrics (`credbroker_*`) and the HTTP endpoint that serves them on
//! `metrics.address` at `/metrics`. Labels carry provider names and status codes only:
//! never a cluster's credential, and no per-cluster label (a fleet has thousands).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::engine::cache::{Cache, Outcome};
use crate::engine::review::Answer;

/// The `provider` label of calls that name no configured provider: label values come from
/// the config only, so no caller can grow `/metrics` (or the broker's memory) by inventing
/// names. Parentheses keep it apart from every valid provider name.
pub const UNKNOWN_PROVIDER: &str = "(unknown)";

/// Upstream latency buckets: 1 ms (a local file or signing) doubling to about 33 s (a
/// slow cloud endpoint near the 60 s upstream timeout).
const LATENCY_BUCKET_START: f64 = 0.001;
const LATENCY_BUCKET_COUNT: u16 = 16;
/// A scraper must send its whole request header within this long, and a kept-alive
/// connection waiting for its next request is closed after it: Prometheus sends its request
/// at once, and reconnects for the next scrape (its default interval is 1 min) without a fuss.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrape connections held at once: one or two Prometheus servers and a curl need a handful;
/// the metrics port shares the broker's fd table, so the rest are refused.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    provider: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReaskLabels {
    provider: String,
    /// [`Answer::label`]: four values.
    answer: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    provider: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// Every metric the broker exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    hits: Family<ProviderLabels, Counter>,
    misses: Family<ProviderLabels, Counter>,
    stale_served: Family<ProviderLabels, Counter>,
    refresh_failures: Family<ProviderLabels, Counter>,
    reask_checks: Family<ReaskLabels, Counter>,
    upstream_duration: Family<UpstreamLabels, Histogram, fn() -> Histogram>,
    entries: Gauge,
    bytes: Gauge,
    rate_limited: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("credbroker");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "GetToken calls by provider and gRPC status code",
            requests.clone(),
        );
        let hits = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "cache_hits",
            "GetToken calls served from the cache before the refresh time",
            hits.clone(),
        );
        let misses = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "cache_misses",
            "GetToken calls that waited for an upstream call",
            misses.clone(),
        );
        let stale_served = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "cache_stale_served",
            "GetToken calls served from the cache past the refresh time (refresh running or failing)",
            stale_served.clone(),
        );
        let refresh_failures = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "refresh_failures",
            "Background refreshes that failed (the cached credential stays in service)",
            refresh_failures.clone(),
        );
        let reask_checks = Family::<ReaskLabels, Counter>::default();
        registry.register(
            "reask_checks",
            "Checks with the cluster's API server of a credential a caller asked for again before its come-back time, by answer: rejected (401, a confirmed rejection: fetched anew), accepted, unreachable (the held credential stays in service), unchecked (the request could not be checked: taken as a rejection)",
            reask_checks.clone(),
        );
        let upstream_duration: Family<UpstreamLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(
                    LATENCY_BUCKET_START,
                    2.0,
                    LATENCY_BUCKET_COUNT,
                ))
            });
        registry.register(
            "upstream_fetch_duration_seconds",
            "Upstream calls by provider and outcome (ok or error)",
            upstream_duration.clone(),
        );
        let entries = Gauge::default();
        registry.register("cache_entries", "Entries in the cache", entries.clone());
        let bytes = Gauge::default();
        registry.register(
            "cache_bytes",
            "What the cache's entries weigh together, as cache.maxBytes counts it",
            bytes.clone(),
        );
        // No uid label: the rate limiter's warn lines name the uid.
        let rate_limited = Counter::default();
        registry.register(
            "rate_limited",
            "Calls refused by the per-caller rate limit (RESOURCE_EXHAUSTED)",
            rate_limited.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        registry.register("build_info", "The broker's version", build.clone());
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        Self {
            registry,
            requests,
            hits,
            misses,
            stale_served,
            refresh_failures,
            reask_checks,
            upstream_duration,
            entries,
            bytes,
            rate_limited,
        }
    }

    /// The counter the rate limiter increments for each call it refuses.
    pub fn rate_limited(&self) -> Counter {
        self.rate_limited.clone()
    }

    /// One GetToken call and, when it was answered, how. `provider` is a configured name or
    /// [`UNKNOWN_PROVIDER`] (the caller's choice is the server's to check).
    pub fn request(&self, provider: &str, code: tonic::Code, outcome: Option<Outcome>) {
        self.requests
            .get_or_create(&RequestLabels {
                provider: provider.to_owned(),
                code: credbroker_proto::code_name(code).to_owned(),
            })
            .inc();
        let family = match outcome {
            Some(Outcome::Hit) => &self.hits,
            Some(Outcome::Stale) => &self.stale_served,
            Some(Outcome::Miss | Outcome::Joined) => &self.misses,
            None => return,
        };
        family
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .inc();
    }

    /// A re-ask checked with the API server (see [`crate::engine::rejections`]); `provider` is a
    /// configured name, and the answer one of four labels: the family stays small.
    pub fn reask_checked(&self, provider: &str, answer: &Answer) {
        self.reask_checks
            .get_or_create(&ReaskLabels {
                provider: provider.to_owned(),
                answer: answer.label(),
            })
            .inc();
    }

    /// One upstream call made by the cache.
    pub fn upstream(&self, provider: &str, elapsed: Duration, ok: bool, background: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.upstream_duration
            .get_or_create(&UpstreamLabels {
                provider: provider.to_owned(),
                outcome: outcome.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
        if background && !ok {
            self.refresh_failures
                .get_or_create(&ProviderLabels {
                    provider: provider.to_owned(),
                })
                .inc();
        }
    }

    /// The OpenMetrics text exposition, with the entries and bytes gauges read from `cache`
    /// now.
    pub fn render(&self, cache: &Cache) -> String {
        self.entries
            .set(i64::try_from(cache.entry_count()).unwrap_or(i64::MAX));
        self.bytes
            .set(i64::try_from(cache.bytes()).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for metrics on {address}: {source}")]
pub struct MetricsError {
    address: SocketAddr,
    source: std::io::Error,
}

/// Serves `/metrics` on `address` until the task is aborted.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    cache: Arc<Cache>,
) -> Result<tokio::task::JoinHandle<()>, MetricsError> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| MetricsError { address, source })?;
    tracing::info!(address = %listener.local_addr().unwrap_or(address), "metrics at /metrics");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let cap_log = crate::base::conn::CapLog::new("metrics");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(crate::base::socket::ACCEPT_ERROR_PAUSE).await;
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                cap_log.hit(MAX_CONNECTIONS, false);
                continue; // dropping the stream closes it
            };
            let (metrics, cache) = (metrics.clone(), cache.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let response = if req.uri().path() == "/metrics" {
                            Response::builder()
                                .header(
                                    "content-type",
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                )
                                .body(Full::new(Bytes::from(metrics.render(&cache))))
                        } else {
                            Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(Bytes::from_static(
                                    b"not found; metrics are at /metrics\n",
                                )))
                        };
                        std::future::ready(Ok::<_, Infallible>(response.unwrap_or_default()))
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(io, service)
                    .await;
            });
        }
    }))
}
