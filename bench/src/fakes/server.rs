//! The server under the bench's fake clouds: HTTP/1.1 on 127.0.0.1 (an ephemeral port),
//! plain or TLS with a throwaway CA (the test harness's [`credbroker_tests::tls_config`]),
//! every request read whole and handed to an async handler.
//!
//! This is the one piece the test harness is to provide (`FakeHttps::spawn(handler)` in
//! `credbroker_tests`): the cloud answers in `fakes.rs` only use [`spawn`], [`Seen`] and
//! [`Reply`], so swapping this module for the harness's server is the `use` line there.
//! The handler is async because the fakes wait 200 ms before answering without holding a
//! runtime thread the load generator needs.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;

/// One request a fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// What a fake answers: status, content type, body.
pub type Reply = (u16, &'static str, String);

/// Answers one request.
pub type Handler = Arc<dyn Fn(Seen) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync>;

/// Plain HTTP or TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A listening fake; it stops when the runtime it was spawned on shuts down.
#[derive(Debug)]
pub struct Listening {
    pub addr: SocketAddr,
    /// PEM of the CA that signed the server's certificate (TLS only).
    pub ca_pem: Option<String>,
}

impl Listening {
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }
}

/// Starts on 127.0.0.1 (an ephemeral port) on the current tokio runtime.
pub async fn spawn(scheme: Scheme, handler: Handler) -> Listening {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("bind a fake upstream on 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let (ca_pem, tls) = match scheme {
        Scheme::Https => {
            let (ca, config) = credbroker_tests::tls_config();
            (Some(ca), Some(tokio_rustls::TlsAcceptor::from(config)))
        }
        Scheme::Http => (None, None),
    };
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handler = Arc::clone(&handler);
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let handler = Arc::clone(&handler);
                    async move { Ok::<_, Infallible>(answer(req, &handler).await) }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(stream).await {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                                .await;
                        }
                    }
                    None => {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    Listening { addr, ca_pem }
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    handler: &Handler,
) -> hyper::Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let (status, content_type, body) = handler(Seen {
        method,
        path,
        headers,
        body,
    })
    .await;
    hyper::Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("response")
}
