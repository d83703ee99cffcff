//! One way to reach an upstream, for every provider that calls one over HTTPS (aws, gcp,
//! azure), for the re-ask check that asks a cluster's API server ([`crate::engine::review`], which
//! takes the trust roots from here when a request brings no CA data), or that reports a
//! library's error (kubernetesSecret and `credbroker health` too):
//!
//! - **Trust roots** ([`trust_roots`]): the system store ∪ `SSL_CERT_FILE` ∪ `SSL_CERT_DIR`,
//!   always. The variables add CAs (a TLS-inspecting proxy's, a private endpoint's, a test
//!   fake's); they never take the public ones away, unlike OpenSSL and rustls-native-certs,
//!   where setting them replaces the system store and breaks the real cloud endpoints.
//! - **HTTP clients** ([`http_client`]): reqwest on rustls trusting exactly those roots, one
//!   connect and one request timeout, proxies from `HTTPS_PROXY`/`NO_PROXY` for remote
//!   endpoints and never for node-local ones (metadata servers). AWS keeps its SDK's own
//!   client (its signing and retries live there) and takes its roots from [`trust_roots`].
//! - **Error chains** ([`error_chain`]): a library error and its causes on one line.

pub use roots::{CertEnv, Origin, RootsProblem, TrustRoots, trust_roots};

#[cfg(any(feature = "gcp", feature = "azure"))]
pub use client::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, Route, http_client};

/// An error and its causes on one line: each cause's text is added unless the text so far
/// already says it (many errors repeat their source in their own message), and runs of
/// whitespace (a multi-line library message) become one space. Library errors name URLs,
/// paths, codes and OS errors; callers that may see an upstream's answer text in the chain
/// still pass it through their own redaction.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

mod roots {
    use std::ffi::OsString;
    use std::fmt;
    use std::path::{Path, PathBuf};

    use rustls_pki_types::CertificateDer;

    /// Where the CA certificates come from: the environment's two variables, read once.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct CertEnv {
        /// `SSL_CERT_FILE`: one PEM bundle.
        pub file: Option<PathBuf>,
        /// `SSL_CERT_DIR`: directories (`:`-separated, as OpenSSL reads it); every file in
        /// each is read as PEM.
        pub dirs: Vec<PathBuf>,
    }

    impl CertEnv {
        /// The broker's own environment. Empty values count as unset.
        pub fn from_process() -> Self {
            Self::from_vars(
                std::env::var_os("SSL_CERT_FILE"),
                std::env::var_os("SSL_CERT_DIR"),
            )
        }

        pub fn from_vars(file: Option<OsString>, dirs: Option<OsString>) -> Self {
            Self {
                file: file.filter(|f| !f.is_empty()).map(PathBuf::from),
                dirs: dirs
                    .map(|d| {
                        std::env::split_paths(&d)
                            .filter(|p| !p.as_os_str().is_empty())
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        }
    }

    /// Which source a problem is about.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Origin {
        System,
        CertFile,
        CertDir,
    }

    impl fmt::Display for Origin {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(match self {
                Self::System => "system CA store",
                Self::CertFile => "SSL_CERT_FILE",
                Self::CertDir => "SSL_CERT_DIR",
            })
        }
    }

    /// A CA source that added less than it should have. Never fatal: the other sources still
    /// count, and the broker logs each problem (with its path) when it builds a client.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum RootsProblem {
        /// Missing, unreadable, or not PEM (`why` is the I/O or PEM error, with the path).
        #[error("{origin} {}: cannot be used: {why}", path.display())]
        Unreadable {
            origin: Origin,
            path: PathBuf,
            why: String,
        },
        /// Read, but holds no certificate at all.
        #[error("{origin} {}: holds no PEM certificate", path.display())]
        Empty { origin: Origin, path: PathBuf },
        /// Certificates that do not parse as a trust anchor (X.509 v3 with a usable key).
        #[error("{origin} {}: {count} certificate(s) skipped: not usable as a trust anchor", path.display())]
        NotAnchors {
            origin: Origin,
            path: PathBuf,
            count: usize,
        },
    }

    /// The roots every upstream client trusts, and what went wrong reading them.
    #[derive(Debug, Clone, Default)]
    pub struct TrustRoots {
        /// Sorted, without duplicates, each a valid trust anchor.
        pub certs: Vec<CertificateDer<'static>>,
        pub problems: Vec<RootsProblem>,
    }

    impl TrustRoots {
        /// Logs each problem, and an error when there is no root at all (every HTTPS call
        /// will then fail its handshake). Called by every client builder.
        pub fn log(&self) {
            for problem in &self.problems {
                tracing::warn!(%problem, "CA certificates skipped");
            }
            if self.certs.is_empty() {
                tracing::error!(
                    "no CA certificates in the system store or SSL_CERT_FILE/SSL_CERT_DIR; upstream calls over https will fail"
                );
            }
        }
    }

    /// The one rule: every certificate in the system's CA directories (openssl-probe's
    /// candidates: `/etc/ssl/certs`, `/etc/pki/tls/certs`, …, which hold each
    /// distribution's bundle), plus `env.file`, plus every file in each of `env.dirs`.
    /// Only certificates that parse as trust anchors are kept (aws's SDK client panics on
    /// any other; a junk entry in a bundle must not take the rest down). A system directory
    /// that does not exist is not a problem; a path the variables name that cannot be used
    /// is, and so is a named file with no certificate in it.
    pub fn trust_roots(env: &CertEnv) -> TrustRoots {
        let mut roots = TrustRoots::default();
        for dir in openssl_probe::candidate_cert_dirs() {
            add(&mut roots, Origin::System, dir, None, Some(dir));
        }
        if let Some(file) = &env.file {
            add(&mut roots, Origin::CertFile, file, Some(file), None);
        }
        for dir in &env.dirs {
            add(&mut roots, Origin::CertDir, dir, None, Some(dir));
        }
        roots
            .certs
            .sort_unstable_by(|a, b| a.as_ref().cmp(b.as_ref()));
        roots.certs.dedup();
        roots
    }

    fn add(
        roots: &mut TrustRoots,
        origin: Origin,
        path: &Path,
        file: Option<&Path>,
        dir: Option<&Path>,
    ) {
        let loaded = rustls_native_certs::load_certs_from_paths(file, dir);
        for error in &loaded.errors {
            roots.problems.push(RootsProblem::Unreadable {
                origin,
                path: path.to_owned(),
                why: error.to_string(),
            });
        }
        if origin != Origin::System && loaded.certs.is_empty() && loaded.errors.is_empty() {
            roots.problems.push(RootsProblem::Empty {
                origin,
                path: path.to_owned(),
            });
        }
        let before = loaded.certs.len();
        let anchors: Vec<_> = loaded
            .certs
            .into_iter()
            .filter(|cert| webpki::anchor_from_trusted_cert(cert).is_ok())
            .collect();
        if anchors.len() < before {
            roots.problems.push(RootsProblem::NotAnchors {
                origin,
                path: path.to_owned(),
                count: before - anchors.len(),
            });
        }
        roots.certs.extend(anchors);
    }
}

#[cfg(any(feature = "gcp", feature = "azure"))]
mod client {
    use std::time::Duration;

    use super::{CertEnv, trust_roots};

    /// Connecting (TCP, a proxy's CONNECT, the TLS handshake) to a cloud's token endpoint
    /// takes well under a second; this is the bound Go's `http.DefaultTransport` gives a TLS
    /// handshake (what client-go and the clouds' Go SDKs use), and half of
    /// [`REQUEST_TIMEOUT`], so a slow proxy still connects and a black-holed address still
    /// leaves time to tell the caller why.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// One upstream call, end to end: below the shim's default 30 s wait, so the caller hears
    /// the broker's explanation rather than its own timeout.
    pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

    /// Which way a client goes out.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Route {
        /// Cloud endpoints: through `HTTPS_PROXY`/`HTTP_PROXY` unless `NO_PROXY` says
        /// otherwise (reqwest reads them as curl and Go do).
        Remote,
        /// The node's or the hypervisor's metadata endpoints (GCE metadata, Azure IMDS, App
        /// Service's local endpoint): link-local or on the host, never through a proxy.
        Local,
    }

    /// A client builder with the rules every provider's HTTP client shares: rustls trusting
    /// exactly [`trust_roots`] of the broker's environment, [`CONNECT_TIMEOUT`],
    /// [`REQUEST_TIMEOUT`], and the proxy rule of `route`. Callers add what is theirs
    /// (a shorter timeout for a metadata server, no redirects for a token endpoint).
    pub fn http_client(route: Route) -> reqwest::ClientBuilder {
        let roots = trust_roots(&CertEnv::from_process());
        roots.log();
        let certs = roots
            .certs
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der.as_ref()).ok());
        let builder = reqwest::Client::builder()
            .tls_certs_only(certs)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        match route {
            Route::Remote => builder,
            Route::Local => builder.no_proxy(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("listing failed\n  (see below)")]
    struct Wraps(#[source] Repeats);

    #[test]
    fn an_error_chain_says_each_cause_once_on_one_line() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(error_chain(&Repeats(io)), "outer: refused");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            error_chain(&Wraps(Repeats(io))),
            "listing failed (see below): outer: refused"
        );
    }

    /// The one rule, for every provider at once (aws's SDK client, gcp's and azure's reqwest
    /// clients all take their roots from here): the variables extend the system store, a
    /// file and a directory add the same roots, and what cannot be used is reported with
    /// its path instead of breaking the rest.
    #[test]
    fn ssl_cert_file_and_dir_extend_the_system_store() {
        use base64::Engine as _;
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject as _;

        /// A self-signed root made once with openssl for this test (its key was discarded).
        const EXTRA_ROOT: &str = include_str!("../../../tests/fixtures/aws/extra-root.pem");
        let pem = |der: &CertificateDer<'_>| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
            format!("-----BEGIN CERTIFICATE-----\n{b64}\n-----END CERTIFICATE-----\n")
        };

        let system = trust_roots(&CertEnv::default());
        assert!(
            !system.certs.is_empty(),
            "this machine has no system CA store; the test needs one (ca-certificates)"
        );
        assert_eq!(system.problems, [], "the system store reads cleanly here");
        let dir = tempfile::tempdir().unwrap();
        // A root the system does not have, a system root again, and junk that must be
        // skipped rather than break the client.
        let extra = dir.path().join("extra.pem");
        let junk = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n";
        std::fs::write(
            &extra,
            format!("{EXTRA_ROOT}{}{junk}", pem(&system.certs[0])),
        )
        .unwrap();
        let extra_der = CertificateDer::from_pem_slice(EXTRA_ROOT.as_bytes()).unwrap();
        assert!(!system.certs.contains(&extra_der));

        let with_file = trust_roots(&CertEnv::from_vars(Some(extra.clone().into()), None));
        assert_eq!(
            with_file.certs.len(),
            system.certs.len() + 1,
            "system store kept, duplicates merged"
        );
        assert!(with_file.certs.contains(&extra_der));
        assert_eq!(
            with_file.problems,
            [RootsProblem::NotAnchors {
                origin: Origin::CertFile,
                path: extra.clone(),
                count: 1
            }]
        );
        assert!(
            with_file.problems[0].to_string().starts_with(&format!(
                "SSL_CERT_FILE {}: 1 certificate(s) skipped",
                extra.display()
            )),
            "{}",
            with_file.problems[0]
        );

        // The same through SSL_CERT_DIR, one of a `:`-separated list.
        let empty = tempfile::tempdir().unwrap();
        let dirs = std::env::join_paths([empty.path(), dir.path()]).unwrap();
        let with_dir = trust_roots(&CertEnv::from_vars(None, Some(dirs)));
        assert_eq!(with_dir.certs, with_file.certs);

        // A path that does not exist adds nothing, removes nothing, and is named.
        let missing = dir.path().join("none.pem");
        let gone = trust_roots(&CertEnv::from_vars(Some(missing.clone().into()), None));
        assert_eq!(gone.certs, system.certs);
        assert!(
            matches!(&gone.problems[..], [RootsProblem::Unreadable { path, .. }] if *path == missing),
            "{:?}",
            gone.problems
        );
        let shown = gone.problems[0].to_string();
        assert!(
            shown.contains("SSL_CERT_FILE") && shown.contains(&missing.display().to_string()),
            "{shown}"
        );
        let no_dir = trust_roots(&CertEnv::from_vars(None, Some(missing.clone().into())));
        assert_eq!(no_dir.certs, system.certs);
        assert_eq!(no_dir.problems.len(), 1, "{:?}", no_dir.problems);

        // A file with no certificate in it says so.
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a certificate\n").unwrap();
        let none = trust_roots(&CertEnv::from_vars(Some(text.clone().into()), None));
        assert_eq!(none.certs, system.certs);
        assert_eq!(
            none.problems,
            [RootsProblem::Empty {
                origin: Origin::CertFile,
                path: text
            }]
        );
    }
}
