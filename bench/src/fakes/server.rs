//! The server under the bench's fake clouds, in the shape of the test harness's coming
//! `credbroker_tests::FakeHttps`: HTTP/1.1 on 127.0.0.1 (an ephemeral port), TLS with a
//! throwaway CA ([`credbroker_tests::tls_config`]) or plain, on a thread and runtime of its
//! own; every request read whole into a [`Seen`] and answered with the handler's [`Reply`],
//! after the reply's delay (waited asynchronously: other requests are served meanwhile).
//!
//! Only the part the bench uses is here, with the harness's names and signatures, so taking
//! the harness's server is the one `use` line in `fakes.rs` and deleting this module.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;

/// One request a fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Headers, names lower-cased.
    pub headers: BTreeMap<String, String>,
    /// The body, as text.
    pub body: String,
}

/// What a handler answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
    /// Answer after this long.
    pub delay: Duration,
}

impl Reply {
    /// `status` with `body`.
    pub fn new(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            body: body.into(),
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Answers after `delay`.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A fake endpoint on 127.0.0.1; stops (and joins its thread) on drop.
pub struct FakeHttps {
    addr: SocketAddr,
    url: String,
    ca_pem: Option<String>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeHttps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeHttps")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl FakeHttps {
    /// HTTPS, with a certificate for 127.0.0.1 signed by a fresh CA ([`FakeHttps::ca_pem`]).
    pub fn spawn<R: Into<Reply>>(
        handler: impl Fn(&Seen) -> R + Send + Sync + 'static,
    ) -> FakeHttps {
        FakeHttps::start(true, handler)
    }

    /// The same over plain HTTP, for endpoints clients reach with `http://`.
    pub fn spawn_plain<R: Into<Reply>>(
        handler: impl Fn(&Seen) -> R + Send + Sync + 'static,
    ) -> FakeHttps {
        FakeHttps::start(false, handler)
    }

    fn start<R: Into<Reply>>(
        tls: bool,
        handler: impl Fn(&Seen) -> R + Send + Sync + 'static,
    ) -> FakeHttps {
        let handler: Handler = Arc::new(move |seen| handler(seen).into());
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind a fake upstream on 127.0.0.1");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("local addr");
        let (ca_pem, acceptor) = if tls {
            let (ca, config) = credbroker_tests::tls_config();
            (Some(ca), Some(tokio_rustls::TlsAcceptor::from(config)))
        } else {
            (None, None)
        };
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fake's runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let stream = tokio::select! {
                        _ = &mut rx => return,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => stream,
                            Err(_) => continue,
                        },
                    };
                    let handler = Arc::clone(&handler);
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let handler = Arc::clone(&handler);
                            async move { Ok::<_, Infallible>(answer(req, &handler).await) }
                        });
                        let http = hyper::server::conn::http1::Builder::new();
                        match acceptor {
                            Some(acceptor) => {
                                if let Ok(s) = acceptor.accept(stream).await {
                                    let _ = http.serve_connection(TokioIo::new(s), service).await;
                                }
                            }
                            None => {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                    });
                }
            });
        });
        let scheme = if ca_pem.is_some() { "https" } else { "http" };
        FakeHttps {
            addr,
            url: format!("{scheme}://{addr}"),
            ca_pem,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// `https://127.0.0.1:<port>` (`http://` for [`FakeHttps::spawn_plain`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM of the CA that signed the server certificate (empty for a plain fake).
    pub fn ca_pem(&self) -> &str {
        self.ca_pem.as_deref().unwrap_or_default()
    }
}

impl Drop for FakeHttps {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn answer(req: hyper::Request<Incoming>, handler: &Handler) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body,
    };
    let reply = handler(&seen);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = hyper::Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        response = response.header(k, v);
    }
    response
        .body(Full::new(Bytes::from(reply.body)))
        .expect("response")
}
