//! The load generator: GetToken over the broker's Unix socket with tonic, from many tasks
//! sharing a few HTTP/2 connections.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use credbroker_proto::v1::token_service_client::TokenServiceClient;
use credbroker_proto::v1::{Cluster, GetTokenRequest, GetTokenResponse};
use credbroker_tests::unix_channel as connect;
use tonic::transport::Channel;

/// `n` connections.
pub async fn connect_many(socket: &Path, n: usize) -> Vec<Channel> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        out.push(connect(socket).await);
    }
    out
}

/// A request for `provider` and the cluster named `cluster` (the ClusterProfile's exec
/// extension `{clusterName: …}`), as the shim builds it.
pub fn request(provider: &str, cluster: &str) -> GetTokenRequest {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "clusterName".to_owned(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(cluster.to_owned())),
        },
    );
    GetTokenRequest {
        provider: provider.to_owned(),
        cluster: Some(Cluster {
            server: format!("https://{cluster}.example.com"),
            config: Some(prost_types::Struct { fields }),
            ..Default::default()
        }),
        interactive: false,
        caller: None,
    }
}

pub async fn get_token(
    channel: &Channel,
    req: GetTokenRequest,
) -> Result<GetTokenResponse, tonic::Status> {
    let mut client = TokenServiceClient::new(channel.clone());
    client.get_token(req).await.map(tonic::Response::into_inner)
}

/// What a closed-loop run measured.
#[derive(Debug, Default)]
pub struct Run {
    pub ok: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
}

/// `concurrency` tasks, each calling back-to-back for `duration` (closed loop), request
/// `i` made by `make(i)`. Latency of every call is kept.
pub async fn closed_loop(
    channels: &[Channel],
    concurrency: usize,
    duration: Duration,
    make: Arc<dyn Fn(u64) -> GetTokenRequest + Send + Sync>,
) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let channel = channels[w % channels.len()].clone();
        let stop = Arc::clone(&stop);
        let counter = Arc::clone(&counter);
        let make = Arc::clone(&make);
        tasks.push(tokio::spawn(async move {
            let mut run = Run::default();
            let mut client = TokenServiceClient::new(channel);
            while !stop.load(Ordering::Relaxed) {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                match client.get_token(make(i)).await {
                    Ok(_) => run.ok += 1,
                    Err(e) => {
                        run.errors += 1;
                        run.first_error.get_or_insert_with(|| e.to_string());
                    }
                }
                run.latencies.push(t.elapsed());
            }
            run
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = Run::default();
    for t in tasks {
        let r = t.await.expect("load task");
        total.ok += r.ok;
        total.errors += r.errors;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
        total.latencies.extend(r.latencies);
    }
    total.elapsed = started.elapsed();
    total
}

/// Calls once for each of `requests`, at most `concurrency` at a time; returns the
/// responses' failures (count, first message).
pub async fn each_once(
    channels: &[Channel],
    concurrency: usize,
    requests: Vec<GetTokenRequest>,
) -> (u64, Option<String>) {
    let queue = Arc::new(std::sync::Mutex::new(requests));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let channel = channels[w % channels.len()].clone();
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            let mut client = TokenServiceClient::new(channel);
            let mut errors = (0u64, None::<String>);
            loop {
                let Some(req) = queue.lock().expect("queue").pop() else {
                    return errors;
                };
                if let Err(e) = client.get_token(req).await {
                    errors.0 += 1;
                    errors.1.get_or_insert_with(|| e.to_string());
                }
            }
        }));
    }
    let mut errors = (0, None);
    for t in tasks {
        let (n, first) = t.await.expect("task");
        errors.0 += n;
        if errors.1.is_none() {
            errors.1 = first;
        }
    }
    errors
}

/// Like [`each_once`], keeping each answer's token (`None` for a failed call), in the
/// order of `requests`.
pub async fn tokens(
    channels: &[Channel],
    concurrency: usize,
    requests: Vec<GetTokenRequest>,
) -> Vec<Option<String>> {
    let n = requests.len();
    let queue = Arc::new(std::sync::Mutex::new(
        requests.into_iter().enumerate().collect::<Vec<_>>(),
    ));
    let results = Arc::new(std::sync::Mutex::new(vec![None; n]));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let channel = channels[w % channels.len()].clone();
        let queue = Arc::clone(&queue);
        let results = Arc::clone(&results);
        tasks.push(tokio::spawn(async move {
            let mut client = TokenServiceClient::new(channel);
            loop {
                let Some((i, req)) = queue.lock().expect("queue").pop() else {
                    return;
                };
                if let Ok(r) = client.get_token(req).await {
                    results.lock().expect("results")[i] = Some(r.into_inner().token);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let mut results = results.lock().expect("results");
    std::mem::take(&mut *results)
}
