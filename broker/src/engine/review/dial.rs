//! The one connection a check makes, step by step as Go's `net/http` transport makes it
//! (`Transport.dialConn`): TCP to the server or to the proxy; TLS to an https proxy; a
//! CONNECT naming the server's canonical address (with `Proxy-Authorization` from the
//! proxy's userinfo) or a SOCKS5 connect request naming it (the proxy resolves it, as Go's
//! socks dialer lets it); TLS to the server; one HTTP/1.1 request. Each step's failure says
//! which step and where, never a credential.

use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::route::GoUrl;

/// The most a proxy's CONNECT answer head may hold; Go's `maxHeaderResponseSize` default
/// (`net/http`, 10 MiB) is far more than any proxy sends, 16 KiB is plenty and bounded.
const MAX_CONNECT_ANSWER: usize = 16 * 1024;

/// A byte stream the check speaks over: TCP, or TLS over TCP to an https proxy.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What the TLS handshake with the server (and an https proxy) uses.
pub struct Tls {
    pub config: Arc<ClientConfig>,
    /// The name sent as SNI and verified: `tls-server-name`, else the host; an IP address
    /// sends no SNI (Go's rule).
    pub server_name: ServerName<'static>,
    /// client-go's `tls-server-name`, which Go also uses for an https proxy's handshake.
    pub tls_server_name: Option<ServerName<'static>>,
}

/// One POST of `body` to `path` on `server`, over `proxy` when there is one; the status.
pub async fn post(
    server: &GoUrl,
    proxy: Option<&GoUrl>,
    tls: &Tls,
    request: http::Request<Full<Bytes>>,
) -> Result<u16, String> {
    let target = server.authority();
    let stream: Box<dyn Io> = match proxy {
        None => Box::new(tcp(&server.ascii_hostname(), server.dial_port()).await?),
        Some(proxy) => {
            let where_ = format!("the proxy {}", proxy.authority());
            let tcp = tcp(&proxy.ascii_hostname(), proxy.dial_port()).await?;
            match proxy.scheme.as_str() {
                "http" => Box::new(connect(tcp, &target, proxy, &where_).await?),
                "https" => {
                    let name = match &tls.tls_server_name {
                        Some(name) => name.clone(),
                        None => server_name(&proxy.ascii_hostname())?,
                    };
                    let tls_to_proxy = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config))
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("TLS with {where_}: {e}"))?;
                    Box::new(connect(tls_to_proxy, &target, proxy, &where_).await?)
                }
                _ => Box::new(socks5(tcp, server, proxy, &where_).await?),
            }
        }
    };
    let tls_stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls.config))
        .connect(tls.server_name.clone(), stream)
        .await
        .map_err(|e| format!("TLS with {target}: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls_stream))
            .await
            .map_err(|e| format!("HTTP with {target}: {e}"))?;
    let driver = tokio::spawn(connection);
    let answer = sender.send_request(request).await;
    let status = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            // Read (and drop) the small answer so the connection ends cleanly.
            let _ = response.into_body().collect().await;
            Ok(status)
        }
        Err(e) => Err(format!("HTTP with {target}: {e}")),
    };
    driver.abort();
    status
}

/// A host name or IP address as rustls takes it for SNI and verification; an IPv4-mapped
/// IPv6 address is its IPv4 address (Go's `net.IP.Equal` makes them one for certificates).
pub fn server_name(name: &str) -> Result<ServerName<'static>, String> {
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return Ok(ServerName::IpAddress(ip.to_canonical().into()));
    }
    ServerName::try_from(name.to_owned()).map_err(|_| format!("{name:?} is not a host name"))
}

/// TCP to `host:port`, each address the resolver gives in turn (the whole check is bounded
/// by the caller's timeout).
async fn tcp(host: &str, port: &str) -> Result<TcpStream, String> {
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} of {host} is not a port number"))?;
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?;
    let mut last = format!("{host} resolves to no address");
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = format!("connecting to {addr}: {e}"),
        }
    }
    Err(last)
}

/// An HTTP CONNECT for `target` (Go's `connectReq`), answered 200 or an error naming the
/// proxy's status.
async fn connect<S: Io>(
    mut stream: S,
    target: &str,
    proxy: &GoUrl,
    where_: &str,
) -> Result<S, String> {
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = proxy.basic_auth() {
        head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    head.push_str(concat!(
        "User-Agent: credbroker/",
        env!("CARGO_PKG_VERSION"),
        "\r\n\r\n"
    ));
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("CONNECT to {where_}: {e}"))?;
    // Byte by byte up to the blank line: nothing of the tunnel is read ahead (the server
    // speaks only after the ClientHello anyway).
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() >= MAX_CONNECT_ANSWER {
            return Err(format!("{where_} answered CONNECT with an endless head"));
        }
        let byte = stream
            .read_u8()
            .await
            .map_err(|e| format!("CONNECT to {where_}: {e}"))?;
        answer.push(byte);
    }
    let status_line = String::from_utf8_lossy(&answer);
    let status_line = status_line.lines().next().unwrap_or_default();
    match status_line.split_whitespace().nth(1) {
        Some("200") => Ok(stream),
        _ => Err(format!(
            "{where_} answered CONNECT {target}: {}",
            crate::base::text::quote(status_line)
        )),
    }
}

/// SOCKS5 (RFC 1928, user/password RFC 1929) as Go's socks dialer speaks it: no
/// authentication or, with userinfo, user/password; the target as an IP address or as a
/// name the proxy resolves.
async fn socks5(
    mut stream: TcpStream,
    server: &GoUrl,
    proxy: &GoUrl,
    where_: &str,
) -> Result<TcpStream, String> {
    let fail = |what: &str| format!("SOCKS5 with {where_}: {what}");
    let io = |e: std::io::Error| format!("SOCKS5 with {where_}: {e}");
    let methods: &[u8] = if proxy.user.is_some() {
        &[5, 2, 0, 2]
    } else {
        &[5, 1, 0]
    };
    stream.write_all(methods).await.map_err(io)?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await.map_err(io)?;
    match (choice, &proxy.user) {
        ([5, 0], _) => {}
        ([5, 2], Some((user, password))) => {
            let password = password.as_deref().unwrap_or("");
            let (Ok(ulen), Ok(plen)) = (u8::try_from(user.len()), u8::try_from(password.len()))
            else {
                return Err(fail("the proxy's user or password is too long"));
            };
            let mut auth = vec![1, ulen];
            auth.extend_from_slice(user.as_bytes());
            auth.push(plen);
            auth.extend_from_slice(password.as_bytes());
            stream.write_all(&auth).await.map_err(io)?;
            let mut status = [0u8; 2];
            stream.read_exact(&mut status).await.map_err(io)?;
            if status[1] != 0 {
                return Err(fail("the proxy refused the user and password"));
            }
        }
        _ => return Err(fail("no authentication method in common")),
    }
    let host = server.ascii_hostname();
    let port: u16 = server
        .dial_port()
        .parse()
        .map_err(|_| fail("the server's port is not a number"))?;
    let mut request = vec![5, 1, 0];
    match host.parse::<std::net::IpAddr>().map(|ip| ip.to_canonical()) {
        Ok(std::net::IpAddr::V4(ip)) => {
            request.push(1);
            request.extend_from_slice(&ip.octets());
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            request.push(4);
            request.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            let len = u8::try_from(host.len()).map_err(|_| fail("the host name is too long"))?;
            request.extend_from_slice(&[3, len]);
            request.extend_from_slice(host.as_bytes());
        }
    }
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.map_err(io)?;
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).await.map_err(io)?;
    if reply[1] != 0 {
        return Err(fail(&format!("the proxy answered code {}", reply[1])));
    }
    let skip = match reply[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => usize::from(stream.read_u8().await.map_err(io)?) + 2,
        _ => return Err(fail("the proxy's answer has an unknown address type")),
    };
    let mut bound = vec![0u8; skip];
    stream.read_exact(&mut bound).await.map_err(io)?;
    Ok(stream)
}
