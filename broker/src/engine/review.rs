//! Asks a cluster's API server whether it still accepts a credential, before the broker
//! treats a caller's re-ask as a rejection (see [`crate::engine::rejections`]).
//!
//! A caller asking again before its come-back time is client-go after a 401, or just as well
//! a process that built a second authenticator for the same cluster (Kueue rebuilding its
//! clients, any program with two clientsets). Guessing between them either fetches anew for
//! nothing (a false alarm, an upstream call) or leaves a revoked token in service; asking the
//! server settles it. The request carries what client-go connects with (server, CA data,
//! `tls-server-name`, `insecure-skip-tls-verify`, `proxy-url`), so the credential goes only
//! to the server client-go is about to send it to, verified as client-go verifies it:
//!
//! - **What is sent**: `POST <server>/apis/authentication.k8s.io/v1/selfsubjectreviews`
//!   with the credential (a bearer token, or the client certificate in the TLS handshake).
//!   Any authenticated user may create one (`system:basic-user`); an API server authenticates
//!   before it authorizes or routes, so **401 is the only answer that means rejected**: 201,
//!   403 (authenticated, not allowed), 404 (a server before 1.28), 429 (priority and
//!   fairness, after authentication) all mean the credential is accepted.
//! - **Trust**: the request's CA data and nothing else when it has some (client-go's rule),
//!   else the broker's trust roots (the system store with `SSL_CERT_FILE`/`SSL_CERT_DIR`).
//!   The certificate is verified against `tls-server-name` when the request names one, else
//!   the server's host. Verification is skipped only when the request itself says
//!   `insecure-skip-tls-verify`. Redirects are not followed.
//! - **Route** ([`route`], [`dial`]): client-go's, rule for rule. The server string is read as
//!   Go's `url.Parse` reads it and the path is built as client-go's `rest` package builds it
//!   (the server's path a prefix: `https://h/p` asks `/p/apis/…`, and `https://h//x:1/` asks
//!   `h` for `/x:1/apis/…`); the request's `proxy-url` is used for every server, loopback
//!   included (http, https or socks5, as client-go); without one, the broker's `HTTPS_PROXY`
//!   (else `https_proxy`) unless `NO_PROXY` (else `no_proxy`) or a loopback host says
//!   otherwise, as Go's httpproxy reads them (the sidecar shares the pod's network and should
//!   share Kueue's proxy settings). SNI is `tls-server-name` when given.
//! - **Headers**: `Authorization: Bearer` for a token; nothing for a client certificate
//!   (it goes in the handshake); `Authorization: Basic` alone when the server URL has
//!   userinfo (Go's `http.Client` sets it, then client-go adds no token).
//! - **Bounds**: [`CHECK_TIMEOUT`] per check, at most [`MAX_CONCURRENT_CHECKS`] at once; the
//!   cache runs one check per entry at a time and reuses an answer briefly
//!   ([`crate::engine::cache::CHECK_REUSE`]).
//!
//! A check that cannot reach the server ([`Answer::Unreachable`]) leaves the held credential
//! in service: client-go cannot reach that server either. A request that cannot be checked at
//! all ([`Answer::Unchecked`]: no cluster in it because the kubeconfig lacks
//! `provideClusterInfo: true`, a server that is not https) keeps the rule from before checks
//! existed: the re-ask is taken as a rejection, within the forced-refresh bounds.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::sync::Semaphore;

use crate::providers::upstream::{CertEnv, trust_roots};
use crate::providers::{BoxFuture, Credential, CredentialSecret};
use crate::request::ClusterInfo;
use route::{GoUrl, ProxyEnv};

mod dial;
mod route;

/// The path every API server since 1.28 serves to any authenticated user (GA in 1.28,
/// `authentication.k8s.io/v1`); older servers answer 404 after authenticating, which counts
/// as accepted.
pub const REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
/// The body: a SelfSubjectReview has no spec.
const REVIEW_BODY: &str = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;
/// One check, connection and TLS handshake included. A re-asking caller waits for it, and a
/// forced fetch (at most the 20 s upstream timeout) must still fit in the shim's default 30 s
/// after it; an API server that has not answered a tiny POST in 5 s is as good as unreachable
/// for the client-go waiting behind it (Go's TLS handshake timeout is 10 s).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Checks running at once across all entries: each is one short connection; a fleet whose
/// every cluster re-asks at once (a client rebuilt for 1 000 clusters) waits in turn rather
/// than opening a thousand connections. A check that waits past [`CHECK_TIMEOUT`] for its
/// turn counts as unreachable.
pub const MAX_CONCURRENT_CHECKS: usize = 16;

/// What the API server said of the credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Authenticated: any status but 401 from the server (201, 403, 404, 429, …).
    Accepted(u16),
    /// 401: the server no longer accepts the credential.
    Rejected,
    /// The server could not be asked (connection, TLS, timeout, a 5xx from something in
    /// front of it); why, on one line, never the credential.
    Unreachable(String),
    /// This request cannot be checked; why.
    Unchecked(String),
}

impl Answer {
    /// Whether the cache treats the re-ask as a rejection (fetching anew within its bounds).
    pub fn forces_refresh(&self) -> bool {
        matches!(self, Self::Rejected | Self::Unchecked(_))
    }

    /// The `answer` label of `credbroker_reasks_total` and what ListEntries shows.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted(_) => "accepted",
            Self::Rejected => "rejected",
            Self::Unreachable(_) => "unreachable",
            Self::Unchecked(_) => "unchecked",
        }
    }

    /// One line for ListEntries: the label, and the status or the reason.
    pub fn describe(&self) -> String {
        match self {
            Self::Accepted(status) => format!("accepted ({status})"),
            Self::Rejected => "rejected (401)".to_owned(),
            Self::Unreachable(why) => format!("unreachable: {}", crate::base::text::quote(why)),
            Self::Unchecked(why) => format!("unchecked: {}", crate::base::text::quote(why)),
        }
    }
}

/// Asks whether a credential is still accepted for the cluster a request describes. The
/// cache holds one; tests give it a scripted one.
pub trait CredentialCheck: Send + Sync {
    fn check(
        &self,
        cluster: Option<&ClusterInfo>,
        credential: &Credential,
    ) -> BoxFuture<'_, Answer>;
}

/// The real check: a SelfSubjectReview to the request's API server.
pub struct ApiServerCheck {
    provider: Arc<CryptoProvider>,
    /// The broker's trust roots, read at the first check that needs them.
    roots: OnceLock<Arc<RootCertStore>>,
    /// The broker's `HTTPS_PROXY`/`NO_PROXY`, read at the first check.
    proxy_env: OnceLock<ProxyEnv>,
    permits: Semaphore,
}

impl std::fmt::Debug for ApiServerCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerCheck").finish_non_exhaustive()
    }
}

impl Default for ApiServerCheck {
    fn default() -> Self {
        Self {
            provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
            roots: OnceLock::new(),
            proxy_env: OnceLock::new(),
            permits: Semaphore::new(MAX_CONCURRENT_CHECKS),
        }
    }
}

impl CredentialCheck for ApiServerCheck {
    fn check(
        &self,
        cluster: Option<&ClusterInfo>,
        credential: &Credential,
    ) -> BoxFuture<'_, Answer> {
        let prepared = cluster
            .ok_or_else(|| {
                Answer::Unchecked(
                    "the request carries no cluster (the kubeconfig's exec user lacks provideClusterInfo: true)"
                        .to_owned(),
                )
            })
            .and_then(|c| self.prepare(c, credential));
        Box::pin(async move {
            let prepared = match prepared {
                Ok(p) => p,
                Err(answer) => return answer,
            };
            let ask = async {
                let _permit = self.permits.acquire().await;
                dial::post(
                    &prepared.server,
                    prepared.proxy.as_ref(),
                    &prepared.tls,
                    prepared.request,
                )
                .await
            };
            match tokio::time::timeout(CHECK_TIMEOUT, ask).await {
                Err(_) => {
                    Answer::Unreachable(format!("no answer within {}s", CHECK_TIMEOUT.as_secs()))
                }
                Ok(Err(why)) => Answer::Unreachable(why),
                Ok(Ok(status)) => classify(status),
            }
        })
    }
}

/// 401 is the one rejection; a 5xx or a redirect comes from something in front of the
/// server (a load balancer with no backend) or a server in trouble, before or without
/// authentication: it says nothing of the credential.
fn classify(status: u16) -> Answer {
    match status {
        401 => Answer::Rejected,
        200..=299 | 400..=499 => Answer::Accepted(status),
        _ => Answer::Unreachable(format!("the server answered {status}")),
    }
}

/// One check, ready to send: where to, through what, with which TLS, and the request.
struct Prepared {
    server: GoUrl,
    proxy: Option<GoUrl>,
    tls: dial::Tls,
    request: http::Request<Full<Bytes>>,
}

impl ApiServerCheck {
    /// The broker's proxy settings, read at the first check as Go reads them once.
    fn proxy_env(&self) -> &ProxyEnv {
        self.proxy_env.get_or_init(ProxyEnv::from_process)
    }

    /// The check for this cluster and credential, as client-go would send a request with
    /// them: each cluster has its own trust, name and route, and a check is rare (re-asks
    /// only), so nothing is pooled. A request client-go could not have sent from a working
    /// kubeconfig (a server that is not an https URL: client-go runs exec plugins only for
    /// https) cannot be checked; a cluster entry client-go could not connect with (CA data,
    /// name or proxy it refuses) is unreachable for client-go too.
    fn prepare(&self, cluster: &ClusterInfo, credential: &Credential) -> Result<Prepared, Answer> {
        let server = GoUrl::parse(&cluster.server).map_err(|why| {
            Answer::Unchecked(format!("the cluster's server is not a URL ({why})"))
        })?;
        if server.scheme != "https" {
            return Err(Answer::Unchecked(
                "the cluster's server is not https".to_owned(),
            ));
        }
        if server.hostname().is_empty() {
            return Err(Answer::Unchecked(
                "the cluster's server names no host".to_owned(),
            ));
        }
        let proxy = route::proxy_for(&server, &cluster.proxy_url, self.proxy_env())
            .map_err(Answer::Unreachable)?;
        let tls = self
            .tls(cluster, credential, &server)
            .map_err(Answer::Unreachable)?;
        let request = review_request(&server, credential).map_err(Answer::Unreachable)?;
        Ok(Prepared {
            server,
            proxy,
            tls,
            request,
        })
    }

    /// client-go's TLS for the cluster: the request's CA data, else the broker's roots; the
    /// certificate verified (and SNI sent) for `tls-server-name`, else the server's host;
    /// nothing verified only with `insecure-skip-tls-verify`; a client certificate when the
    /// credential is one.
    fn tls(
        &self,
        cluster: &ClusterInfo,
        credential: &Credential,
        server: &GoUrl,
    ) -> Result<dial::Tls, String> {
        let tls_server_name = if cluster.tls_server_name.is_empty() {
            None
        } else {
            Some(
                dial::server_name(&cluster.tls_server_name)
                    .map_err(|_| "the cluster's tls-server-name is not a host name".to_owned())?,
            )
        };
        let server_name = match &tls_server_name {
            Some(name) => name.clone(),
            None => dial::server_name(&server.ascii_hostname())
                .map_err(|why| format!("the cluster's server: {why}"))?,
        };
        let verifier: Arc<dyn ServerCertVerifier> = if cluster.insecure_skip_tls_verify {
            Arc::new(Unverified(Arc::clone(&self.provider)))
        } else {
            let roots = if cluster.certificate_authority_data.is_empty() {
                self.system_roots()
            } else {
                Arc::new(roots_from_pem(&cluster.certificate_authority_data)?)
            };
            rustls::client::WebPkiServerVerifier::builder_with_provider(
                roots,
                Arc::clone(&self.provider),
            )
            .build()
            .map_err(|e| format!("the cluster's CA data cannot be used ({e})"))?
        };
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &credential.secret {
            CredentialSecret::Token(_) => builder.with_no_client_auth(),
            CredentialSecret::ClientCertificate {
                certificate_pem,
                key_pem,
            } => {
                let chain = CertificateDer::pem_slice_iter(certificate_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| "the client certificate is not PEM".to_owned())?;
                let key = PrivateKeyDer::from_pem_slice(key_pem.expose().as_bytes())
                    .map_err(|_| "the client key is not PEM".to_owned())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the client certificate cannot be used ({e})"))?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(dial::Tls {
            config: Arc::new(config),
            server_name,
            tls_server_name,
        })
    }

    fn system_roots(&self) -> Arc<RootCertStore> {
        Arc::clone(self.roots.get_or_init(|| {
            let roots = trust_roots(&CertEnv::from_process());
            roots.log();
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(roots.certs);
            Arc::new(store)
        }))
    }
}

/// The SelfSubjectReview as client-go would POST it to `server`: its path under the
/// server's path prefix, `Host` as Go writes it, and the credential where client-go puts
/// it: userinfo in the server URL becomes `Authorization: Basic` (Go's `http.Client`) and
/// then no bearer token is added (client-go's token round-tripper keeps an Authorization
/// already there); else a token is `Authorization: Bearer` and a client certificate goes
/// in the TLS handshake alone.
fn review_request(
    server: &GoUrl,
    credential: &Credential,
) -> Result<http::Request<Full<Bytes>>, String> {
    let host = if server.host.is_ascii() {
        server.host.clone()
    } else {
        match server.port() {
            "" => server.ascii_hostname(),
            port => format!("{}:{port}", server.ascii_hostname()),
        }
    };
    let authorization = match (server.basic_auth(), &credential.secret) {
        (Some(basic), _) => Some(basic),
        (None, CredentialSecret::Token(token)) => Some(format!("Bearer {}", token.expose())),
        (None, CredentialSecret::ClientCertificate { .. }) => None,
    };
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(route::request_path(server, REVIEW_PATH))
        .header(http::header::HOST, host)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("credbroker/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(Bytes::from_static(REVIEW_BODY.as_bytes())))
        .map_err(|_| "the cluster's server cannot be written in a request".to_owned())?;
    if let Some(value) = authorization {
        let mut value = http::HeaderValue::try_from(value)
            .map_err(|_| "the credential cannot be sent in a header".to_owned())?;
        value.set_sensitive(true);
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, value);
    }
    Ok(request)
}

/// The request's CA data (PEM), as client-go reads `certificate-authority-data`.
fn roots_from_pem(pem: &[u8]) -> Result<RootCertStore, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "the cluster's CA data is not PEM".to_owned())?;
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err("the cluster's CA data holds no usable certificate".to_owned());
    }
    Ok(store)
}

/// `insecure-skip-tls-verify: true`, only because the request says so (client-go's own
/// rule): any certificate, but the handshake's signatures still checked.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _host: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_401_is_a_rejection() {
        assert_eq!(classify(401), Answer::Rejected);
        for ok in [200, 201, 400, 403, 404, 405, 429] {
            assert_eq!(classify(ok), Answer::Accepted(ok), "{ok}");
        }
        for unknown in [301, 302, 500, 502, 503, 504] {
            assert!(
                matches!(classify(unknown), Answer::Unreachable(_)),
                "{unknown}"
            );
        }
    }

    fn cluster(server: &str) -> ClusterInfo {
        ClusterInfo {
            server: server.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn requests_that_cannot_be_checked_say_why() {
        let check = ApiServerCheck::default();
        let cred = Credential::token("t", std::time::SystemTime::now());
        let unchecked = |a: Answer| match a {
            Answer::Unchecked(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(unchecked(check.check(None, &cred).await).contains("provideClusterInfo"));
        assert!(
            unchecked(
                check
                    .check(Some(&cluster("http://127.0.0.1:1")), &cred)
                    .await
            )
            .contains("not https")
        );
        assert!(
            unchecked(check.check(Some(&cluster("not a url")), &cred).await).contains("not a URL")
        );
        // What client-go could not connect with either: unreachable, so the held credential
        // stays in service.
        let unreachable = |a: Answer| match a {
            Answer::Unreachable(why) => why,
            other => panic!("{other:?}"),
        };
        let mut bad_ca = cluster("https://127.0.0.1:1");
        bad_ca.certificate_authority_data =
            b"-----BEGIN CERTIFICATE-----\nbm8=\n-----END CERTIFICATE-----\n".to_vec();
        assert!(unreachable(check.check(Some(&bad_ca), &cred).await).contains("CA data"));
        let mut bad_proxy = cluster("https://10.0.0.1:1");
        bad_proxy.proxy_url = "ftp://proxy".into();
        assert!(unreachable(check.check(Some(&bad_proxy), &cred).await).contains("proxy-url"));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_names_no_credential() {
        let check = ApiServerCheck::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let cred = Credential::token("very-secret-token", std::time::SystemTime::now());
        let answer = check
            .check(Some(&cluster(&format!("https://127.0.0.1:{port}"))), &cred)
            .await;
        match &answer {
            Answer::Unreachable(why) => assert!(!why.contains("very-secret"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(!answer.describe().contains("very-secret"));
    }
}
