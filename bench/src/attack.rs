//! The attackers of the hostile section, run as child processes of the bench under another
//! uid (`setpriv`): `credbroker-bench --attack KIND SOCKET SECS`. Each runs for SECS, then
//! prints one summary line on stdout and exits.
//!
//! - `stall`: 64 connections, each opening 16 GetToken streams with HEADERS only (no body,
//!   never END_STREAM), reconnecting whenever the broker closes one (run from a refused uid).
//! - `flood`: 20 connections opening header-only GetToken streams at about 1 000 a second
//!   in all (new stream ids, never a body), reconnecting when closed.
//! - `oversize`: distinct GetToken requests at every default `limits.*` bound (44 KB of CA
//!   data, a 4 KB server, a 12 KB exec extension) for `eks-static`, 8 at a time.
//! - `hang`: 64 misses at a time for clusters whose plugin hangs until its timeout.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use credbroker_proto::v1::GetTokenRequest;

use crate::load;

pub const KINDS: [&str; 4] = ["stall", "flood", "oversize", "hang"];

/// Runs the attacker `kind` for `secs`; its summary on stdout.
pub fn main(kind: &str, socket: &Path, secs: u64) {
    let until = Instant::now() + Duration::from_secs(secs);
    let summary = match kind {
        "stall" => streams(socket, until, 64, 16, None),
        "flood" => streams(socket, until, 20, u32::MAX, Some(Duration::from_millis(20))),
        "oversize" => calls(socket, until, 8, oversize),
        "hang" => calls(socket, until, 64, |i| {
            load::request("shared", &format!("hang-{i}"))
        }),
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
