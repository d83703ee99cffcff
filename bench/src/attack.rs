//! The attackers of the hostile section, run as child processes of the bench under another
//! uid (`setpriv`): `credbroker-bench --attack KIND SOCKET SECS [TARGET]`. Each runs for SECS
//! (the re-ask attackers: until TARGET's stop file appears, at most SECS), then prints one
//! summary line on stdout and exits; the re-ask attackers print `ready` first, once set up.
//!
//! - `stall`: 64 connections, each opening 16 GetToken streams with HEADERS only (no body,
//!   never END_STREAM), reconnecting whenever the broker closes one (run from a refused uid).
//! - `flood`: 20 connections opening header-only GetToken streams at about 1 000 a second
//!   in all (new stream ids, never a body), reconnecting when closed.
//! - `oversize`: distinct GetToken requests at every default `limits.*` bound (44 KB of CA
//!   data, a 4 KB server, a 12 KB exec extension) for `eks-static`, 8 at a time.
//! - `hang`: 64 misses at a time for clusters whose plugin hangs until its timeout.
//! - `check-slot`: the red team's attack on the re-ask check (`tests/tests/hostile_reasks.rs`):
//!   entries of its own, each served once, then re-asks about them in turn whose API server
//!   never answers (a loopback listener that accepts and holds the connection), with 46 KB of
//!   CA data each, every call cancelled after 0.1 s, at 180 calls a second (inside production's
//!   200/s per uid).
//! - `caller-flood`: made-up caller ids asking, 180 a second, about the entry the victim is
//!   using (named in TARGET's `current` file: the attacker knows the shared entry), each a new
//!   caller of that entry, to push the victim's record out of it.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use credbroker_proto::v1::{Caller, GetTokenRequest};
use serde_json::{Value, json};

use crate::load;

pub const KINDS: [&str; 6] = [
    "stall",
    "flood",
    "oversize",
    "hang",
    "check-slot",
    "caller-flood",
];

/// The re-ask attackers' calls a second: 90% of production's per-uid rate limit (200/s,
/// `rateLimit.perSecond`), so the broker refuses none of them and the check's own bounds are
/// what is measured.
pub const REASK_RATE: f64 = 180.0;
/// The check-slot attacker cancels every call after this long (the red team's 0.1 s): a
/// waiting re-ask then leaves the queue, and a check that got its slot runs on without it.
pub const CANCEL_AFTER: Duration = Duration::from_millis(100);
/// The CA data of every check-slot re-ask: a real PEM (the victim server's CA) repeated to
/// about 46 KB, under `limits.maxCertificateAuthorityBytes` (48 KiB), as the red team sent it.
pub const CHECK_SLOT_CA_BYTES: usize = 46_000;
/// Connections each re-ask attacker spreads its calls over: a connection carries at most 16
/// streams at once, and 180 calls a second of up to 0.1 s (or a few ms) need fewer than 32.
const REASK_CONNECTIONS: usize = 4;
/// How long the caller flood waits for one answer (a hit: milliseconds) before counting it
/// as unanswered.
const FLOOD_CALL_DEADLINE: Duration = Duration::from_secs(5);

/// What the re-ask attackers are told, as a JSON file the bench writes (TARGET).
#[derive(Debug, Clone)]
pub struct ReaskTarget {
    /// The victim's API server and its CA: the caller flood asks about the victim's entry
    /// exactly as the victim does (the entry's key holds both); the check-slot attacker
    /// repeats the CA to [`CHECK_SLOT_CA_BYTES`].
    pub server: String,
    pub ca_pem: String,
    /// Entries the check-slot attacker makes and re-asks about.
    pub entries: u32,
    /// A file holding the name of the cluster the victim asks about now.
    pub current: PathBuf,
    /// The re-ask attackers stop once this file exists.
    pub stop: PathBuf,
}

impl ReaskTarget {
    pub fn write(&self, path: &Path) {
        let v = json!({
            "server": self.server,
            "caPem": self.ca_pem,
            "entries": self.entries,
            "current": self.current.display().to_string(),
            "stop": self.stop.display().to_string(),
        });
        std::fs::write(path, v.to_string()).expect("write the re-ask target");
    }

    pub fn read(path: &Path) -> Result<ReaskTarget, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("read the re-ask target {}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("the re-ask target {} is not JSON: {e}", path.display()))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("the re-ask target {} has no string {k:?}", path.display()))
        };
        Ok(ReaskTarget {
            server: field("server")?,
            ca_pem: field("caPem")?,
            entries: v["entries"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    format!("the re-ask target {} has no \"entries\"", path.display())
                })?,
            current: PathBuf::from(field("current")?),
            stop: PathBuf::from(field("stop")?),
        })
    }
}

/// A request as the shim makes it for the cluster `cluster` of `provider` whose API server
/// is `server` with the CA data `ca`, from `caller`.
pub fn reask_request(
    provider: &str,
    cluster: &str,
    server: &str,
    ca: &[u8],
    caller: Caller,
) -> GetTokenRequest {
    let mut req = load::request(provider, cluster);
    if let Some(c) = req.cluster.as_mut() {
        c.server = server.to_owned();
        c.certificate_authority_data = ca.to_vec();
    }
    req.caller = Some(caller);
    req
}

/// Made-up caller number `n`: a pid inside Linux's `PID_MAX_LIMIT` (2^22), a start time and
/// an exec-config digest of its own, so every `n` is another caller to the broker.
pub fn made_up_caller(n: u64) -> Caller {
    Caller {
        pid: u32::try_from(n % ((1 << 22) - 1000)).unwrap_or(0) + 1000,
        start_time: n,
        config_digest: format!("{n:064x}"),
    }
}

/// Runs the attacker `kind` for `secs`; its summary on stdout.
pub fn main(kind: &str, socket: &Path, secs: u64, target: Option<&Path>) {
    let until = Instant::now() + Duration::from_secs(secs);
    let reask_target = || {
        let path = target.unwrap_or_else(|| {
            eprintln!("credbroker-bench --attack {kind}: needs a TARGET file");
            std::process::exit(2);
        });
        ReaskTarget::read(path).unwrap_or_else(|e| {
            eprintln!("credbroker-bench --attack {kind}: {e}");
            std::process::exit(2);
        })
    };
    let summary = match kind {
        "stall" => streams(socket, until, 64, 16, None),
        "flood" => streams(socket, until, 20, u32::MAX, Some(Duration::from_millis(20))),
        "oversize" => calls(socket, until, 8, oversize),
        "hang" => calls(socket, until, 64, |i| {
            load::request("shared", &format!("hang-{i}"))
        }),
        "check-slot" => check_slots(socket, until, &reask_target()),
        "caller-flood" => caller_flood(socket, until, &reask_target()),
        other => {
            eprintln!("credbroker-bench --attack: unknown kind {other:?} (one of {KINDS:?})");
            std::process::exit(2);
        }
    };
    println!("{summary}");
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A GetToken HEADERS block: literal fields without indexing (HPACK's simplest form).
fn get_token_headers() -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", "/credbroker.v1.TokenService/GetToken"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// `conns` threads, each holding one connection at a time: the handshake, then up to
/// `per_conn` header-only streams (one per `every`, or all at once), reading whatever the
/// broker sends and answering nothing; reconnecting when the broker closes it.
fn streams(
    socket: &Path,
    until: Instant,
    conns: usize,
    per_conn: u32,
    every: Option<Duration>,
) -> String {
    const END_HEADERS: u8 = 4;
    let (opened, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let headers = Arc::new(get_token_headers());
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let (socket, opened, sent, headers) = (
                socket.to_path_buf(),
                Arc::clone(&opened),
                Arc::clone(&sent),
                Arc::clone(&headers),
            );
            std::thread::spawn(move || {
                while Instant::now() < until {
                    let Ok(mut s) = UnixStream::connect(&socket) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    opened.fetch_add(1, Ordering::Relaxed);
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                    hello.extend(frame(4, 0, 0, &[]));
                    if s.write_all(&hello).is_err() {
                        continue;
                    }
                    let mut buf = vec![0u8; 65536];
                    let (mut id, mut count) = (1u32, 0u32);
                    'conn: while Instant::now() < until && count < per_conn {
                        if s.write_all(&frame(1, END_HEADERS, id, &headers)).is_err() {
                            break;
                        }
                        sent.fetch_add(1, Ordering::Relaxed);
                        (id, count) = (id + 2, count + 1);
                        if let Some(every) = every {
                            // Read what came (resets, pings) without answering it.
                            let _ = s.set_read_timeout(Some(every));
                            loop {
                                match s.read(&mut buf) {
                                    Ok(0) => break 'conn,
                                    Ok(_) => {}
                                    Err(_) => break,
                                }
                            }
                        }
                    }
                    // Hold the connection, reading and never answering, until it is closed.
                    while Instant::now() < until {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    format!(
        "connections={} streams={}",
        opened.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed)
    )
}

/// A request at every default `limits.*` bound, for a new `eks-static` cluster: its entry
/// keeps the server and the exec extension (not the CA data, which `aws` does not pass on).
fn oversize(i: u64) -> GetTokenRequest {
    let mut req = load::request("eks-static", &format!("over-{i:08}"));
    if let Some(cluster) = req.cluster.as_mut() {
        cluster.server = format!("https://over-{i:08}.{}", "s".repeat(4_000));
        cluster.certificate_authority_data = vec![b'c'; 44_000];
        cluster.tls_server_name = "t".repeat(253);
        if let Some(config) = cluster.config.as_mut() {
            for k in ["pad0", "pad1", "pad2", "pad3"] {
                config.fields.insert(
                    k.to_owned(),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::StringValue("p".repeat(3_000))),
                    },
                );
            }
        }
    }
    req
}

/// `inflight` GetToken calls at a time, request `i` made by `make(i)`, until `until`.
fn calls(
    socket: &Path,
    until: Instant,
    inflight: usize,
    make: fn(u64) -> GetTokenRequest,
) -> String {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let socket: PathBuf = socket.to_path_buf();
    let (ok, refused, next) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    rt.block_on(async {
        // A connection carries at most 16 streams at once.
        let channels = load::connect_many(&socket, inflight.div_ceil(16)).await;
        let tasks: Vec<_> = (0..inflight)
            .map(|t| {
                let channel = channels[t % channels.len()].clone();
                let (ok, refused, next) =
                    (Arc::clone(&ok), Arc::clone(&refused), Arc::clone(&next));
                tokio::spawn(async move {
                    while Instant::now() < until {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let left = until.saturating_duration_since(Instant::now());
                        match tokio::time::timeout(left, load::get_token(&channel, make(i))).await {
                            Ok(Ok(_)) => ok.fetch_add(1, Ordering::Relaxed),
                            Ok(Err(_)) => refused.fetch_add(1, Ordering::Relaxed),
                            Err(_) => break,
                        };
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    rt.shutdown_background();
    format!(
        "calls={} ok={} refused={}",
        next.load(Ordering::Relaxed),
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed)
    )
}

/// Prints `ready` on stdout (the bench waits for it before its victim's first try).
fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

/// Counts of a re-ask attacker's calls.
#[derive(Debug, Default)]
struct Tally {
    sent: AtomicU64,
    answered: AtomicU64,
    refused: AtomicU64,
    unanswered: AtomicU64,
}

impl Tally {
    fn note<T, E>(&self, result: Result<Result<T, E>, tokio::time::error::Elapsed>) {
        let count = match result {
            Ok(Ok(_)) => &self.answered,
            Ok(Err(_)) => &self.refused,
            Err(_) => &self.unanswered,
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    fn get(count: &AtomicU64) -> u64 {
        count.load(Ordering::Relaxed)
    }
}

/// A runtime for one attacker: two workers, as the bench's own.
fn attacker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Calls `make(i)` at [`REASK_RATE`] from `i = 0`, each in a task of its own waiting at most
/// `wait`, until `until` or the stop file; then waits for the calls still out.
async fn paced(
    channels: &[tonic::transport::Channel],
    until: Instant,
    stop: &Path,
    wait: Duration,
    tally: &Arc<Tally>,
    mut make: impl FnMut(u64) -> Option<GetTokenRequest>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / REASK_RATE));
    // Behind schedule (a busy machine), it does not catch up in a burst past the rate.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i = 0u64;
    let mut out = tokio::task::JoinSet::new();
    while Instant::now() < until && !stop.exists() {
        tick.tick().await;
        let Some(req) = make(i) else { continue };
        let channel = channels[(i as usize) % channels.len()].clone();
        let tally = Arc::clone(tally);
        tally.sent.fetch_add(1, Ordering::Relaxed);
        out.spawn(async move {
            tally.note(tokio::time::timeout(wait, load::get_token(&channel, req)).await);
        });
        i += 1;
        while out.try_join_next().is_some() {}
    }
    while out.join_next().await.is_some() {}
}

/// The check-slot attacker: [`ReaskTarget::entries`] entries of `eks-static` (signed locally:
/// making them costs no upstream), each asked once by one made-up caller with a server that
/// never answers and 46 KB of CA data; then re-asks about them in turn, each cancelled after
/// [`CANCEL_AFTER`]. Every check that gets a slot connects to the silent server and holds
/// the slot for the check's 5 s bound.
fn check_slots(socket: &Path, until: Instant, target: &ReaskTarget) -> String {
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind the silent server");
    let server = format!("https://{}", silent.local_addr().expect("its address"));
    let reached = Arc::new(AtomicU64::new(0));
    {
        let reached = Arc::clone(&reached);
        // Accepts and holds every connection, never answering; the process's exit ends it.
        std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            for conn in silent.incoming().flatten() {
                reached.fetch_add(1, Ordering::Relaxed);
                held.push(conn);
            }
        });
    }
    let pem = target.ca_pem.as_bytes();
    let ca: Arc<Vec<u8>> = Arc::new(
        pem.iter()
            .copied()
            .cycle()
            .take(CHECK_SLOT_CA_BYTES / pem.len().max(1) * pem.len())
            .collect(),
    );
    let entries = u64::from(target.entries.max(1));
    let request = {
        let (server, ca) = (server.clone(), Arc::clone(&ca));
        move |i: u64| {
            reask_request(
                "eks-static",
                &format!("atk-{i}"),
                &server,
                &ca,
                made_up_caller(7),
            )
        }
    };
    let (setup, tally) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let rt = attacker_runtime();
    rt.block_on(async {
        let channels = load::connect_many(socket, REASK_CONNECTIONS).await;
        // Each entry served once to its one caller, 16 at a time (inside the burst of 2 000).
        let next = Arc::new(AtomicU64::new(0));
        let mut first = tokio::task::JoinSet::new();
        for t in 0..16 {
            let (channel, next, setup, request) = (
                channels[t % channels.len()].clone(),
                Arc::clone(&next),
                Arc::clone(&setup),
                request.clone(),
            );
            first.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= entries {
                        return;
                    }
                    setup.sent.fetch_add(1, Ordering::Relaxed);
                    let call = load::get_token(&channel, request(i));
                    setup.note(tokio::time::timeout(FLOOD_CALL_DEADLINE, call).await);
                }
            });
        }
        while first.join_next().await.is_some() {}
        ready();
        paced(&channels, until, &target.stop, CANCEL_AFTER, &tally, |i| {
            Some(request(i % entries))
        })
        .await;
    });
    rt.shutdown_background();
    format!(
        "entries={entries} (first asks: {} served, {} refused); re-asks={} cancelled={} answered={} refused={}; checks reaching its server={}",
        Tally::get(&setup.answered),
        Tally::get(&setup.refused) + Tally::get(&setup.unanswered),
        Tally::get(&tally.sent),
        Tally::get(&tally.unanswered),
        Tally::get(&tally.answered),
        Tally::get(&tally.refused),
        reached.load(Ordering::Relaxed),
    )
}

/// The caller flood: a new made-up caller every call, asking about the entry the victim uses
/// now (the cluster named in [`ReaskTarget::current`], with the victim's server and CA data).
/// Each is a first ask the broker remembers; before callers were remembered per uid, sixteen
/// of them pushed the victim's record out, and its re-ask was served the revoked token unchecked.
fn caller_flood(socket: &Path, until: Instant, target: &ReaskTarget) -> String {
    let tally = Arc::new(Tally::default());
    let mut clusters = std::collections::BTreeSet::new();
    let rt = attacker_runtime();
    rt.block_on(async {
        let channels = load::connect_many(socket, REASK_CONNECTIONS).await;
        ready();
        paced(
            &channels,
            until,
            &target.stop,
            FLOOD_CALL_DEADLINE,
            &tally,
            |n| {
                let current = std::fs::read_to_string(&target.current).ok()?;
                let current = current.trim();
                if current.is_empty() {
                    return None;
                }
                clusters.insert(current.to_owned());
                Some(reask_request(
                    "reask",
                    current,
                    &target.server,
                    target.ca_pem.as_bytes(),
                    made_up_caller(1_000_000 + n),
                ))
            },
        )
        .await;
    });
    rt.shutdown_background();
    format!(
        "made-up callers={} over {} entries; answered={} refused={} unanswered={}",
        Tally::get(&tally.sent),
        clusters.len(),
        Tally::get(&tally.answered),
        Tally::get(&tally.refused),
        Tally::get(&tally.unanswered),
    )
}
