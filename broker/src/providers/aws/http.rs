//! The HTTP client for the SDK's own calls (STS AssumeRole and AssumeRoleWithWebIdentity,
//! container credentials, instance metadata): the SDK's default hyper + rustls client on
//! aws-lc-rs, with `HTTPS_PROXY` / `NO_PROXY` from the environment, and trust roots that are
//! the system CA store *plus* `SSL_CERT_FILE` / `SSL_CERT_DIR`. The SDK's default would use
//! those variables *instead of* the system store, which breaks real STS the moment a private
//! CA is added for a proxy or a test fake.

use std::path::{Path, PathBuf};

use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use aws_smithy_http_client::{Builder, ConnectorBuilder};
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use base64::Engine as _;
use rustls_pki_types::CertificateDer;

/// The client every SDK call of the provider goes through.
pub fn client() -> SharedHttpClient {
    let cert_file = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    let cert_dirs: Vec<PathBuf> = std::env::var_os("SSL_CERT_DIR")
        .map(|dirs| {
            std::env::split_paths(&dirs)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    let roots = trust_roots(cert_file.as_deref(), &cert_dirs);
    if roots.is_empty() {
        tracing::warn!(
            "no CA certificates found in the system store or SSL_CERT_FILE/SSL_CERT_DIR; AWS calls over https will fail"
        );
    }
    let store = TrustStore::empty().with_pem_certificate(to_pem(&roots).into_bytes());
    let context = TlsContext::builder()
        .with_trust_store(store)
        .build()
        .unwrap_or_default();
    // What the SDK's `default_https_client` does for behavior version 2025-08-07 and later,
    // with our trust store.
    Builder::new().build_with_connector_fn(move |settings, components| {
        let mut builder = ConnectorBuilder::default().tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ));
        builder.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            builder.set_sleep_impl(components.sleep_impl());
        }
        builder.set_proxy_config(Some(ProxyConfig::from_env()));
        builder.tls_context(context.clone()).build()
    })
}

/// Trust roots: the system store, plus what `SSL_CERT_FILE` / `SSL_CERT_DIR` name. Only
/// certificates that parse as trust anchors are kept (the SDK's client panics on any other).
pub fn trust_roots(
    cert_file: Option<&Path>,
    cert_dirs: &[PathBuf],
) -> Vec<CertificateDer<'static>> {
    let mut certs = Vec::new();
    if cert_file.is_none() && cert_dirs.is_empty() {
        // Exactly the platform store, as every rustls-based client loads it.
        certs.extend(rustls_native_certs::load_native_certs().certs);
    } else {
        // rustls-native-certs reads only the variables when they are set: add the system
        // locations ourselves so the variables extend the store rather than replace it.
        for dir in openssl_probe::candidate_cert_dirs() {
            certs.extend(rustls_native_certs::load_certs_from_paths(None, Some(dir)).certs);
        }
        if let Some(file) = cert_file {
            certs.extend(rustls_native_certs::load_certs_from_paths(Some(file), None).certs);
        }
        for dir in cert_dirs {
            certs.extend(rustls_native_certs::load_certs_from_paths(None, Some(dir)).certs);
        }
    }
    certs.sort_unstable_by(|a, b| a.as_ref().cmp(b.as_ref()));
    certs.dedup();
    certs.retain(|cert| webpki::anchor_from_trusted_cert(cert).is_ok());
    certs
}

/// Certificates as one PEM bundle (what the SDK's trust store takes).
fn to_pem(certs: &[CertificateDer<'_>]) -> String {
    let mut pem = String::new();
    for cert in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject as _;

    /// A self-signed root made once with openssl for this test (its key was discarded).
    const EXTRA_ROOT: &str = include_str!("../../../../tests/fixtures/aws/extra-root.pem");

    #[test]
    fn pem_round_trips() {
        let system = trust_roots(None, &[]);
        let pem = to_pem(&system);
        let back: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, system);
    }

    #[test]
    fn cert_env_extends_the_system_store() {
        let system = trust_roots(None, &[]);
        assert!(
            !system.is_empty(),
            "this machine has no system CA store; the test needs one (ca-certificates)"
        );
        let dir = tempfile::tempdir().unwrap();
        // A root the system does not have, a system root again, and junk that must be
        // skipped rather than break the client.
        let extra = dir.path().join("extra.pem");
        let mut text = EXTRA_ROOT.to_owned();
        text.push_str(&to_pem(&system[..1]));
        text.push_str("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n");
        std::fs::write(&extra, text).unwrap();
        let extra_der = CertificateDer::from_pem_slice(EXTRA_ROOT.as_bytes()).unwrap();
        assert!(!system.contains(&extra_der));
        let with_file = trust_roots(Some(&extra), &[]);
        assert_eq!(
            with_file.len(),
            system.len() + 1,
            "system store kept, duplicates merged"
        );
        assert!(with_file.contains(&extra_der));
        // The same through SSL_CERT_DIR.
        let with_dir = trust_roots(None, &[dir.path().to_path_buf()]);
        assert_eq!(with_dir, with_file);
        // A file that does not exist adds nothing and removes nothing.
        let missing = trust_roots(Some(Path::new("/nonexistent/ca.pem")), &[]);
        assert_eq!(missing.len(), system.len());
        let no_dir = trust_roots(None, &[dir.path().join("none")]);
        assert_eq!(no_dir.len(), system.len());
    }
}
