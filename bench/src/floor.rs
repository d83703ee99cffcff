//! The floors under a hit's round trip (section 1): the shim's own client, timed as the
//! broker's row is, against servers with less and less in them.
//!
//! - **tonic, a constant answer**: `TokenService` whose `GetToken` returns a fixed token, on
//!   tonic's server as the broker builds it (hyper's HTTP/2, a Unix socket), on a runtime of
//!   each kind. It is the server stack the broker stands on with no broker in it: what a hit
//!   costs before the broker does anything.
//! - **a canned answer**: a blocking thread that reads the request and writes back the bytes
//!   tonic answered with (recorded once through a relay), parsing nothing: one connection,
//!   one write each way and the wake-ups between the two processes.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use credbroker_proto::v1::token_service_server::{TokenService, TokenServiceServer};
use credbroker_proto::v1::{GetTokenRequest, GetTokenResponse};

/// The token the constant servers answer with.
pub const FLOOR_TOKEN: &str = "bench-floor-token";

/// A runtime of this kind, as a server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// tokio's default, the broker's: a worker per CPU.
    MultiThread,
    /// One thread that accepts and answers.
    CurrentThread,
}

/// A floor server on its own thread; stopped and joined when dropped.
#[derive(Debug)]
pub struct FloorServer {
    pub socket: PathBuf,
    stop: Arc<AtomicBool>,
    stop_tx: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        // Wakes a blocking accept so that it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Debug)]
struct Constant;

#[tonic::async_trait]
impl TokenService for Constant {
    async fn get_token(
        &self,
        _request: tonic::Request<GetTokenRequest>,
    ) -> Result<tonic::Response<GetTokenResponse>, tonic::Status> {
        Ok(tonic::Response::new(GetTokenResponse {
            token: FLOOR_TOKEN.to_owned(),
            expiration_time: Some(prost_types::Timestamp {
                seconds: 4_102_444_800,
                nanos: 0,
            }),
            ..Default::default()
        }))
    }
}

/// tonic with a constant `GetToken` at `socket`, on a runtime of `kind`.
pub fn constant(socket: &Path, kind: Runtime) -> FloorServer {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let path = socket.to_path_buf();
    let thread = std::thread::spawn(move || {
        let rt = match kind {
            Runtime::MultiThread => tokio::runtime::Builder::new_multi_thread(),
            Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        }
        .enable_all()
        .build()
        .expect("floor runtime");
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&path).expect("bind the floor socket");
            let _ = ready_tx.send(());
            tonic::transport::Server::builder()
                .add_service(TokenServiceServer::new(Constant))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stop_rx.await;
                    },
                )
                .await
                .expect("floor server");
        });
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the floor server bound its socket");
    FloorServer {
        socket: socket.to_path_buf(),
        stop: Arc::default(),
        stop_tx: Some(stop_tx),
        thread: Some(thread),
    }
}

/// The bytes the server at `upstream` wrote for one call of `message`, recorded by a relay the
/// shim's client connects through.
pub fn record_answer(upstream: &Path, dir: &Path, message: &[u8]) -> Vec<u8> {
    let relay = dir.join("relay.sock");
    let listener = UnixListener::bind(&relay).expect("bind the relay");
    let up = upstream.to_path_buf();
    let recorder = std::thread::spawn(move || {
        let (client, _) = listener.accept().expect("relay accept");
        let server = UnixStream::connect(&up).expect("relay connect");
        let (mut c_in, mut s_out) = (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        let forward = std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_in, &mut s_out);
            let _ = s_out.shutdown(std::net::Shutdown::Write);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = c_out.shutdown(std::net::Shutdown::Write);
        let _ = forward.join();
        answer
    });
    let mut stream = UnixStream::connect(&relay).expect("connect the relay");
    let answer =
        credbroker_shim::wire::unary(&mut stream, credbroker_shim::wire::GET_TOKEN, message)
            .expect("a call through the relay");
    assert_eq!(answer.code, 0, "the recorded call's status");
    drop(stream);
    recorder.join().expect("relay")
}

/// A blocking thread at `socket` that answers every connection with `answer` as soon as the
/// request's first bytes have come (the shim's client writes the whole request at once), then
/// waits for the client to close.
pub fn canned(socket: &Path, answer: Vec<u8>) -> FloorServer {
    let listener = UnixListener::bind(socket).expect("bind the canned socket");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        for conn in listener.incoming() {
            if flag.load(Ordering::SeqCst) {
                return;
            }
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            if !matches!(conn.read(&mut buf), Ok(n) if n > 0) || conn.write_all(&answer).is_err() {
                continue;
            }
            while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
        }
    });
    FloorServer {
        socket: socket.to_path_buf(),
        stop,
        stop_tx: None,
        thread: Some(thread),
    }
}

/// `runs` calls of `message` with the shim's client, each on a new connection: their times.
pub fn time_calls(socket: &Path, message: &[u8], runs: usize, expect: &str) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let mut stream = UnixStream::connect(socket).expect("connect");
            let answer = credbroker_shim::wire::unary(
                &mut stream,
                credbroker_shim::wire::GET_TOKEN,
                message,
            )
            .expect("a call with the shim's client");
            assert_eq!(answer.code, 0, "status of a call to {}", socket.display());
            let elapsed = t.elapsed();
            let response: GetTokenResponse =
                prost::Message::decode(answer.body.as_slice()).expect("a GetTokenResponse");
            assert_eq!(response.token, expect, "token from {}", socket.display());
            elapsed
        })
        .collect()
}
