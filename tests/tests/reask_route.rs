//! The re-ask check goes where client-go goes. Each row of the table is one cluster entry
//! (server, `tls-server-name`, `proxy-url`) and one proxy environment; it runs through a
//! real client-go (`kubectl auth whoami`, whose SelfSubjectReview is the very request the
//! check sends, its exec user the real shim against the real broker), then through the
//! broker's check (the same caller asking twice over the socket: a re-ask), and compares
//! what each did: the CONNECTs each proxy saw (which proxy, which authority), the requests
//! each server got (which server, path, `Host`, `Authorization`) and the TLS names (SNI).
//!
//! Everything is on loopback: the API servers are recording TLS fakes with a CA made here,
//! the proxies record each CONNECT and tunnel it to the first server, whatever it names
//! (so a proxied request succeeds, and the recorded authority says where it was meant to
//! go). Names other than `localhost` come from /etc/hosts (a name that resolves to 127/8 is
//! not loopback to Go: the environment's proxy is used for it unless `NO_PROXY` says not).

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use credbroker_tests::{
    Broker, COMMAND_TIMEOUT, ExecPlugin, Running, SHIM, SHIM_RUN_ENV, V1, bin, describe,
    exec_provider, require_tool, run, sh_quote, shim_command, tempdir,
};
use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::{Value, json};

/// Every variable Go or the broker reads a proxy from: removed from both, then set per row.
const PROXY_VARS: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The Kubernetes minor the fake servers report: the Google Cloud SDK's `kubectl`
/// dispatcher re-executes itself as a `kubectl.1.31` it has (as in tests/tests/rejections.rs).
const SERVER_MINOR: u32 = 31;

// ---------------------------------------------------------------------------------------
// Recording fakes
// ---------------------------------------------------------------------------------------

/// A CA and one server certificate for `localhost`, the hosts-file name, 127.0.0.1 and ::1,
/// which every fake server of a row presents.
struct Pki {
    ca_pem: String,
    key: Arc<rustls::sign::CertifiedKey>,
}

impl Pki {
    fn new(names: &[&str]) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, "reask-route test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .expect("server params");
        for ip in ["127.0.0.1", "::1"] {
            params
                .subject_alt_names
                .push(SanType::IpAddress(ip.parse().expect("IP")));
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &issuer).expect("sign");
        let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let signing = rustls::crypto::ring::sign::any_supported_type(&der).expect("signing key");
        Pki {
            ca_pem: ca_cert.pem(),
            key: Arc::new(rustls::sign::CertifiedKey::new(
                vec![cert.der().clone()],
                signing,
            )),
        }
    }
}

/// Hands out the one certificate and records the SNI of each handshake.
#[derive(Debug)]
struct RecordSni {
    key: Arc<rustls::sign::CertifiedKey>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl rustls::server::ResolvesServerCert for RecordSni {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let sni = hello.server_name().unwrap_or("(no SNI)").to_owned();
        self.seen.lock().expect("lock").push(sni);
        Some(Arc::clone(&self.key))
    }
}

/// One request a fake server got: what decides where a credential went.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Got {
    method: String,
    path: String,
    host: String,
    authorization: String,
}

/// A TLS API server on 127.0.0.1 recording every request and handshake: `/version` answers
/// a version, anything else a SelfSubjectReview (201), whatever the credential.
struct Server {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Got>>>,
    snis: Arc<Mutex<Vec<String>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(pki: &Pki) -> Server {
        let snis = Arc::new(Mutex::new(Vec::new()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(RecordSni {
            key: Arc::clone(&pki.key),
            seen: Arc::clone(&snis),
        }));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(credbroker_tests::serve_tls(
                listener,
                Arc::new(config),
                rx,
                move |req: hyper::Request<hyper::body::Incoming>| {
                    let header = |name: &str| {
                        req.headers()
                            .get_all(name)
                            .iter()
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .collect::<Vec<_>>()
                            .join(" | ")
                    };
                    let got = Got {
                        method: req.method().to_string(),
                        // Without the query: kubectl adds `?timeout=` for its
                        // --request-timeout, which says nothing of the route.
                        path: req.uri().path().to_owned(),
                        host: header("host"),
                        authorization: header("authorization"),
                    };
                    let body = if got.path.ends_with("/version") {
                        json!({"major": "1", "minor": SERVER_MINOR.to_string(),
                               "gitVersion": format!("v1.{SERVER_MINOR}.0"), "platform": "linux/amd64"})
                    } else {
                        json!({"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                               "metadata": {"creationTimestamp": null},
                               "status": {"userInfo": {"username": "route-test"}}})
                    };
                    let status = if got.method == "POST" { 201 } else { 200 };
                    seen.lock().expect("lock").push(got);
                    async move {
                        hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body.to_string())))
                            .expect("response")
                    }
                },
            ));
        });
        Server {
            addr,
            requests,
            snis,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn take(&self) -> (Vec<Got>, Vec<String>) {
        (
            std::mem::take(&mut *self.requests.lock().expect("lock")),
            std::mem::take(&mut *self.snis.lock().expect("lock")),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One CONNECT a proxy saw: the authority and any `Proxy-Authorization`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Connect {
    authority: String,
    proxy_authorization: String,
}

/// An HTTP proxy on 127.0.0.1 that records each CONNECT and tunnels it to `target`
/// whatever it names (anything but a CONNECT is recorded and answered 502).
struct Proxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Connect>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long a tunnel or a client may sit idle before the proxy drops it.
const PROXY_IDLE: Duration = Duration::from_secs(10);

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_seen, thread_stop) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !thread_stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let seen = Arc::clone(&thread_seen);
                        std::thread::spawn(move || tunnel(client, target, &seen));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn take(&self) -> Vec<Connect> {
        std::mem::take(&mut *self.seen.lock().expect("lock"))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn tunnel(mut client: TcpStream, target: SocketAddr, seen: &Mutex<Vec<Connect>>) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(PROXY_IDLE));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let first: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let proxy_authorization = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    let (method, authority) = (
        first.first().copied().unwrap_or(""),
        first.get(1).copied().unwrap_or(""),
    );
    seen.lock().expect("lock").push(Connect {
        authority: if method == "CONNECT" {
            authority.to_owned()
        } else {
            format!("{method} {authority}")
        },
        proxy_authorization,
    });
    let upstream = match (method, TcpStream::connect(target)) {
        ("CONNECT", Ok(upstream)) => upstream,
        _ => {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
            return;
        }
    };
    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    let _ = upstream.set_read_timeout(Some(PROXY_IDLE));
    let (Ok(mut client_read), Ok(mut upstream_write)) = (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut upstream_write);
        let _ = upstream_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut upstream_read, mut client_write) = (upstream, client);
    let _ = std::io::copy(&mut upstream_read, &mut client_write);
    let _ = client_write.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

/// The fakes of one row: servers `a` and `b` (one CA), proxies `p1` and `p2` (both tunnel
/// to `a`).
struct Fakes {
    pki: Pki,
    a: Server,
    b: Server,
    p1: Proxy,
    p2: Proxy,
}

/// One cluster entry and environment.
struct Case {
    server: String,
    tls_server_name: String,
    proxy_url: String,
    env: Vec<(&'static str, String)>,
}

/// What one client did, in names the rows use: `a`, `b`, `p1`, `p2`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Seen {
    /// (proxy, CONNECT authority, Proxy-Authorization)
    connects: BTreeSet<(String, String, String)>,
    /// (server, request): the POSTs only (the kubectl dispatcher asks `/version` first).
    posts: BTreeSet<(String, Got)>,
    /// (server, SNI)
    snis: BTreeSet<(String, String)>,
}

impl Seen {
    fn take(f: &Fakes) -> Seen {
        let mut seen = Seen::default();
        for (name, proxy) in [("p1", &f.p1), ("p2", &f.p2)] {
            for c in proxy.take() {
                seen.connects
                    .insert((name.to_owned(), c.authority, c.proxy_authorization));
            }
        }
        for (name, server) in [("a", &f.a), ("b", &f.b)] {
            let (requests, snis) = server.take();
            for r in requests.into_iter().filter(|r| r.method == "POST") {
                seen.posts.insert((name.to_owned(), r));
            }
            for sni in snis {
                seen.snis.insert((name.to_owned(), sni));
            }
        }
        seen
    }

    /// `direct` or the proxies and authorities, then the servers and paths: the route.
    fn route(&self) -> String {
        let via = if self.connects.is_empty() {
            "direct".to_owned()
        } else {
            self.connects
                .iter()
                .map(|(p, a, _)| format!("{p} CONNECT {a}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let to = self
            .posts
            .iter()
            .map(|(s, g)| format!("{s} {}", g.path))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{via} → {to}")
    }

    /// What the POSTs carried and the names the handshakes sent.
    fn carried(&self) -> String {
        let posts = self
            .posts
            .iter()
            .map(|(_, g)| format!("Host {:?}, Authorization {:?}", g.host, g.authorization))
            .collect::<Vec<_>>()
            .join("; ");
        let snis = self
            .snis
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let proxy_auth = self
            .connects
            .iter()
            .filter(|(_, _, a)| !a.is_empty())
            .map(|(p, _, a)| format!("{p} {a}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("{posts}; SNI {snis}; Proxy-Authorization {proxy_auth:?}")
    }
}

/// The name /etc/hosts maps to a 127/8 address other than `localhost`, if any: a name
/// that reaches loopback and is not loopback to Go.
fn hosts_name() -> Option<String> {
    let hosts = std::fs::read_to_string("/etc/hosts").ok()?;
    hosts.lines().find_map(|line| {
        let mut words = line.split('#').next()?.split_whitespace();
        let ip: std::net::Ipv4Addr = words.next()?.parse().ok()?;
        if !ip.is_loopback() {
            return None;
        }
        words
            .find(|w| {
                !w.eq_ignore_ascii_case("localhost")
                    && !w.contains("localhost")
                    && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            .map(str::to_owned)
    })
}

/// The kubeconfig of a row: its cluster, and the shim behind a wrapper that keeps the
/// `KUBERNETES_EXEC_INFO` kubectl gave it (in `info.json`).
fn write_kubeconfig(dir: &Path, case: &Case, ca_pem: &str, broker: &Broker) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let wrapper = dir.join("shim.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nprintf '%s' \"$KUBERNETES_EXEC_INFO\" > {}\nexec {} --provider onprem --socket {}\n",
            sh_quote(dir.join("info.json").to_str().expect("UTF-8")),
            sh_quote(bin(SHIM).to_str().expect("UTF-8")),
            sh_quote(broker.socket().to_str().expect("UTF-8")),
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut cluster = json!({
        "server": case.server,
        "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        "extensions": [{"name": "client.authentication.k8s.io/exec",
                        "extension": {"clusterName": "alpha"}}],
    });
    if !case.tls_server_name.is_empty() {
        cluster["tls-server-name"] = json!(case.tls_server_name);
    }
    if !case.proxy_url.is_empty() {
        cluster["proxy-url"] = json!(case.proxy_url);
    }
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": V1, "command": wrapper, "provideClusterInfo": true,
            "interactiveMode": "Never"}}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    });
    let path = dir.join("kubeconfig.json");
    std::fs::write(&path, doc.to_string()).expect("write the kubeconfig");
    path
}

/// `KUBERNETES_EXEC_INFO` as client-go builds it for the row's cluster.
fn exec_info(case: &Case, ca_pem: &str) -> Value {
    let mut cluster = json!({
        "server": case.server,
        "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        "config": {"clusterName": "alpha"},
    });
    if !case.tls_server_name.is_empty() {
        cluster["tls-server-name"] = json!(case.tls_server_name);
    }
    if !case.proxy_url.is_empty() {
        cluster["proxy-url"] = json!(case.proxy_url);
    }
    json!({"apiVersion": V1, "kind": "ExecCredential",
           "spec": {"interactive": false, "cluster": cluster}})
}

/// Runs one row through kubectl and through the broker's check; returns what each did.
fn run_row(fakes: &Fakes, case: &Case) -> (Seen, Seen, String) {
    let plugin = ExecPlugin::new();
    let mut builder = Broker::builder().provider(exec_provider("onprem", plugin.command(), ""));
    for var in PROXY_VARS {
        builder = builder.env_remove(var);
    }
    for (k, v) in &case.env {
        builder = builder.env(k, v);
    }
    let broker = builder.start();
    let dir = tempdir();
    let kubeconfig = write_kubeconfig(dir.path(), case, &fakes.pki.ca_pem, &broker);

    // client-go.
    let kubectl = require_tool(
        "kubectl",
        "install kubectl (a client-go exec-plugin client)",
    );
    let mut cmd = Command::new(kubectl);
    cmd.env_remove("KUBECONFIG");
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(case.env.iter().map(|(k, v)| (k, v)))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .args(["--request-timeout=10s", "auth", "whoami", "-o", "json"]);
    let out = run(&mut cmd, COMMAND_TIMEOUT);
    let by_kubectl = Seen::take(fakes);
    let info = exec_info(case, &fakes.pki.ca_pem);
    // When kubectl ran the plugin, it gave it the cluster the check is given.
    if let Ok(given) = std::fs::read_to_string(dir.path().join("info.json")) {
        let given: Value = serde_json::from_str(&given).expect("exec info JSON");
        assert_eq!(
            given["spec"]["cluster"], info["spec"]["cluster"],
            "the exec info kubectl sets"
        );
    }

    // The broker's check: the same caller asking twice; the second is a re-ask.
    let info = info.to_string();
    for _ in 0..2 {
        let mut shim = shim_command(broker.socket(), &["--provider", "onprem"], Some(&info));
        shim.env_remove(SHIM_RUN_ENV);
        let answer = Running::spawn(&mut shim).wait(Duration::from_secs(45));
        assert!(answer.status.success(), "{}", describe(&answer));
    }
    let by_check = Seen::take(fakes);
    let detail = format!(
        "kubectl: {}\nbroker log:\n{}",
        describe(&out),
        broker.logs()
    );
    (by_kubectl, by_check, detail)
}

#[test]
fn the_re_ask_check_goes_where_kubectl_goes() {
    let name = hosts_name();
    let mut names = vec!["localhost"];
    names.extend(name.as_deref());
    let pki = Pki::new(&names);
    let a = Server::start(&pki);
    let b = Server::start(&pki);
    let fakes = Fakes {
        p1: Proxy::start(a.addr),
        p2: Proxy::start(a.addr),
        a,
        b,
        pki,
    };
    let (pa, pb) = (fakes.a.port(), fakes.b.port());
    let (p1, p2) = (fakes.p1.url(), fakes.p2.url());
    let case = |server: String, env: &[(&'static str, &str)]| Case {
        server,
        tls_server_name: String::new(),
        proxy_url: String::new(),
        env: env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
    };
    let review = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let loopback = format!("https://127.0.0.1:{pa}");

    // (row, case, the route client-go takes)
    let mut rows: Vec<(&str, Case, String)> = vec![
        (
            "loopback server with a proxy-url",
            Case {
                proxy_url: p1.clone(),
                ..case(loopback.clone(), &[])
            },
            format!("p1 CONNECT 127.0.0.1:{pa} → a {review}"),
        ),
        (
            "a proxy-url with userinfo",
            Case {
                proxy_url: p1.replacen("http://", "http://pu:p%3Ap@", 1),
                ..case(loopback.clone(), &[])
            },
            format!("p1 CONNECT 127.0.0.1:{pa} → a {review}"),
        ),
        (
            "loopback server, HTTPS_PROXY",
            case(loopback.clone(), &[("HTTPS_PROXY", &p1)]),
            format!("direct → a {review}"),
        ),
        (
            "IPv4-mapped loopback, HTTPS_PROXY",
            case(
                format!("https://[::ffff:127.0.0.1]:{pa}"),
                &[("HTTPS_PROXY", &p1)],
            ),
            format!("direct → a {review}"),
        ),
        (
            "localhost, HTTPS_PROXY",
            case(format!("https://localhost:{pa}"), &[("HTTPS_PROXY", &p1)]),
            format!("direct → a {review}"),
        ),
        (
            "userinfo in the server",
            case(format!("https://user:p%40ss@127.0.0.1:{pa}"), &[]),
            format!("direct → a {review}"),
        ),
        (
            "a path prefix",
            case(format!("{loopback}/prefix/"), &[]),
            format!("direct → a /prefix{review}"),
        ),
        (
            "a path prefix with an escaped slash",
            case(format!("{loopback}/pre%2Ffix"), &[]),
            format!("direct → a /pre/fix{review}"),
        ),
        (
            "a path naming another host",
            case(format!("{loopback}//127.0.0.1:{pb}/"), &[]),
            format!("direct → a /127.0.0.1:{pb}{review}"),
        ),
        (
            "tls-server-name",
            Case {
                tls_server_name: "localhost".to_owned(),
                ..case(loopback.clone(), &[])
            },
            format!("direct → a {review}"),
        ),
    ];
    match &name {
        None => println!(
            "no name other than localhost maps to 127/8 in /etc/hosts: rows by name skipped"
        ),
        Some(n) => {
            let by_name = format!("https://{n}:{pa}");
            let proxied = |p: &str| format!("{p} CONNECT {n}:{pa} → a {review}");
            let direct = format!("direct → a {review}");
            let no_proxy_port = format!("{n}:{pa}");
            let no_proxy_other_port = format!("{n}:1");
            let no_proxy_dot = format!(".{n}");
            let bare = fakes.p1.addr.to_string();
            rows.extend([
                (
                    "a name, HTTPS_PROXY",
                    case(by_name.clone(), &[("HTTPS_PROXY", &p1)]),
                    proxied("p1"),
                ),
                (
                    "a name, HTTPS_PROXY with no scheme",
                    case(by_name.clone(), &[("HTTPS_PROXY", &bare)]),
                    proxied("p1"),
                ),
                (
                    "a name, HTTPS_PROXY before https_proxy",
                    case(
                        by_name.clone(),
                        &[("HTTPS_PROXY", &p1), ("https_proxy", &p2)],
                    ),
                    proxied("p1"),
                ),
                (
                    "a name, an empty HTTPS_PROXY and https_proxy",
                    case(
                        by_name.clone(),
                        &[("HTTPS_PROXY", ""), ("https_proxy", &p2)],
                    ),
                    proxied("p2"),
                ),
                (
                    "a name, NO_PROXY naming it",
                    case(by_name.clone(), &[("HTTPS_PROXY", &p1), ("NO_PROXY", n)]),
                    direct.clone(),
                ),
                (
                    "a name, NO_PROXY naming it with its port",
                    case(
                        by_name.clone(),
                        &[("HTTPS_PROXY", &p1), ("NO_PROXY", &no_proxy_port)],
                    ),
                    direct.clone(),
                ),
                (
                    "a name, NO_PROXY naming it with another port",
                    case(
                        by_name.clone(),
                        &[("HTTPS_PROXY", &p1), ("NO_PROXY", &no_proxy_other_port)],
                    ),
                    proxied("p1"),
                ),
                (
                    "a name, NO_PROXY with a leading dot",
                    case(
                        by_name.clone(),
                        &[("HTTPS_PROXY", &p1), ("NO_PROXY", &no_proxy_dot)],
                    ),
                    proxied("p1"),
                ),
                (
                    "a name, NO_PROXY *",
                    case(by_name.clone(), &[("HTTPS_PROXY", &p1), ("NO_PROXY", "*")]),
                    direct.clone(),
                ),
                (
                    "a name, an empty NO_PROXY and no_proxy",
                    case(
                        by_name.clone(),
                        &[("HTTPS_PROXY", &p1), ("NO_PROXY", ""), ("no_proxy", n)],
                    ),
                    direct.clone(),
                ),
            ]);
        }
    }

    let mut failures = Vec::new();
    for (row, case, want) in &rows {
        let (kubectl, check, detail) = run_row(&fakes, case);
        println!(
            "{row}:\n  kubectl {}\n          {}\n  check   {}\n          {}",
            kubectl.route(),
            kubectl.carried(),
            check.route(),
            check.carried()
        );
        if kubectl.route() != *want {
            failures.push(format!(
                "{row}: kubectl went {} (this table says {want}); {detail}",
                kubectl.route()
            ));
        } else if kubectl != check {
            failures.push(format!(
                "{row}: kubectl and the check differ\n  kubectl {kubectl:?}\n  check   {check:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
