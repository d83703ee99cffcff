//! The provider's HTTP clients: reqwest on rustls with aws-lc-rs (the broker's one crypto
//! provider), the system CA store extended by `SSL_CERT_FILE` / `SSL_CERT_DIR`, and proxies
//! from `HTTPS_PROXY` / `NO_PROXY` for remote endpoints.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::Clients;

/// A TCP + TLS handshake to Entra ID takes well under a second; ten allows for a slow proxy.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One token request, end to end: below the shim's default 30 s wait, so the caller gets
/// the broker's explanation rather than its own timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Where distributions keep their CA bundle (the list Go's crypto/x509 searches), loaded
/// explicitly when `SSL_CERT_FILE`/`SSL_CERT_DIR` are set: rustls-native-certs then reads
/// only those, and the design wants them to extend the system store, not replace it.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Builds the remote (proxied) and local (never proxied) clients.
pub(super) fn build_clients() -> Result<Clients, String> {
    let roots = extra_roots();
    let builder = || {
        reqwest::Client::builder()
            .tls_certs_merge(roots.iter().cloned())
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            // Token endpoints do not redirect; following one would send the assertion on.
            .redirect(reqwest::redirect::Policy::none())
    };
    let remote = builder()
        .build()
        .map_err(|e| format!("cannot set up the HTTPS client: {e}"))?;
    let local = builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
    Ok(Clients {
        remote: Arc::new(remote),
        local: Arc::new(local),
    })
}

/// Roots on top of what the platform verifier loads by itself (the system store, or only
/// `SSL_CERT_FILE`/`SSL_CERT_DIR` when they are set): with them set, the system bundle and
/// the files themselves, so the result is always system ∪ env.
fn extra_roots() -> Vec<reqwest::Certificate> {
    let file = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty());
    let dirs = std::env::var_os("SSL_CERT_DIR").filter(|v| !v.is_empty());
    if file.is_none() && dirs.is_none() {
        return Vec::new();
    }
    let mut roots = Vec::new();
    if let Some(bundle) = SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
        roots.extend(pem_file(bundle));
    }
    if let Some(file) = file {
        roots.extend(pem_file(Path::new(&file)));
    }
    if let Some(dirs) = dirs {
        for dir in std::env::split_paths(&dirs) {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                tracing::warn!(dir = %dir.display(), "SSL_CERT_DIR entry cannot be read");
                continue;
            };
            for entry in entries.flatten() {
                if entry.path().is_file() {
                    roots.extend(pem_file(&entry.path()));
                }
            }
        }
    }
    roots
}

/// The certificates in a PEM file; a file that cannot be read or parsed adds none (and says so).
fn pem_file(path: &Path) -> Vec<reqwest::Certificate> {
    match std::fs::read(path) {
        Ok(pem) => reqwest::Certificate::from_pem_bundle(&pem).unwrap_or_else(|e| {
            tracing::warn!(file = %path.display(), error = %e, "no usable CA certificates in file");
            Vec::new()
        }),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read CA certificate file");
            Vec::new()
        }
    }
}
