//! `type: file`: a token kept in a file per cluster (e.g. a projected ServiceAccount token
//! or a Secret mounted as a volume). The file is checked on every hit with one `stat`, so a
//! rotated token is served as soon as it lands.

use crate::config::{FileConfig, ProviderKind};
use crate::request::TokenRequest;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use super::{BoxFuture, Credential, Provider, ProviderError, jwt};

/// A token file holds one token; anything this large is not one.
const MAX_TOKEN_BYTES: u64 = 1024 * 1024;
const CLUSTER_NAME: &str = "{clusterName}";

#[derive(Debug)]
pub struct FileProvider {
    config: FileConfig,
}

impl FileProvider {
    pub fn new(config: FileConfig) -> Self {
        Self { config }
    }

    /// The template with `{clusterName}` filled in. A cluster name can never leave the
    /// template's directory: no `/`, no `..`.
    fn path_for(&self, req: &TokenRequest) -> Result<PathBuf, ProviderError> {
        if !self.config.path.contains(CLUSTER_NAME) {
            return Ok(PathBuf::from(&self.config.path));
        }
        let name = req.config_str("clusterName").ok_or_else(|| {
            ProviderError::InvalidRequest(format!(
                "the cluster's exec config has no clusterName, which the token path {} needs",
                self.config.path
            ))
        })?;
        if name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(ProviderError::InvalidRequest(format!(
                "clusterName {name:?} cannot be used in a file path"
            )));
        }
        Ok(PathBuf::from(self.config.path.replace(CLUSTER_NAME, &name)))
    }

    async fn read(&self, req: &TokenRequest) -> Result<Credential, ProviderError> {
        let path = self.path_for(req)?;
        let shown = path.display();
        let io_error = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => {
                ProviderError::NotFound(format!("token file {shown} does not exist"))
            }
            _ => ProviderError::Unavailable(format!("cannot read token file {shown}: {e}")),
        };
        // Version first: if the file is replaced between the stat and the read, the next
        // hit sees a new version and reads again (never the reverse).
        let meta = tokio::fs::metadata(&path).await.map_err(io_error)?;
        if meta.len() > MAX_TOKEN_BYTES {
            return Err(ProviderError::Unavailable(format!(
                "token file {shown} is larger than {MAX_TOKEN_BYTES} bytes"
            )));
        }
        let text = tokio::fs::read_to_string(&path).await.map_err(io_error)?;
        let token = super::bearer_token(&text)
            .map_err(|e| ProviderError::Unavailable(format!("token file {shown} {e}")))?;
        if token.is_empty() {
            return Err(ProviderError::Unavailable(format!(
                "token file {shown} is empty"
            )));
        }
        let expires_at = jwt::bearer_expiry(token, self.config.lifetime.0, &shown.to_string())?;
        let mut credential = Credential::token(token, expires_at);
        credential.source_version = Some(version(&meta));
        Ok(credential)
    }
}

impl Provider for FileProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::File
    }

    fn identity(&self, req: &TokenRequest) -> Result<String, ProviderError> {
        Ok(self.path_for(req)?.display().to_string())
    }

    fn fetch<'a>(
        &'a self,
        req: &'a TokenRequest,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(self.read(req))
    }

    fn is_current(&self, req: &TokenRequest, cached: &Credential) -> bool {
        let Ok(path) = self.path_for(req) else {
            return false;
        };
        std::fs::metadata(path).is_ok_and(|meta| Some(version(&meta)) == cached.source_version)
    }
}

/// Which file and which write of it: a rotation by rename (kubelet's atomic writer) changes
/// the inode, an in-place write changes mtime or size.
fn version(meta: &std::fs::Metadata) -> u64 {
    let mut h = DefaultHasher::new();
    (
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.len(),
    )
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::config::ConfigDuration;
    use crate::providers::CredentialSecret;
    use crate::request::ClusterInfo;

    fn provider(template: String) -> FileProvider {
        FileProvider::new(FileConfig {
            path: template,
            lifetime: ConfigDuration(Duration::from_secs(3600)),
        })
    }

    fn req(cluster: &str) -> TokenRequest {
        let mut config = serde_json::Map::new();
        config.insert("clusterName".into(), cluster.into());
        TokenRequest {
            provider: "f".into(),
            cluster: Some(ClusterInfo {
                config,
                ..Default::default()
            }),
            interactive: false,
        }
    }

    fn jwt(exp: u64) -> String {
        jwt::unsigned(&serde_json::json!({"sub": "x", "exp": exp}))
    }

    fn token_of(c: &Credential) -> &str {
        match &c.secret {
            CredentialSecret::Token(t) => t.expose(),
            CredentialSecret::ClientCertificate { .. } => "",
        }
    }

    #[tokio::test]
    async fn reads_the_clusters_file_and_uses_the_lifetime() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/token"), "plain-token\n").unwrap();
        let p = provider(format!("{}/{{clusterName}}/token", dir.path().display()));
        let before = SystemTime::now();
        let cred = p.fetch(&req("a")).await.unwrap();
        assert_eq!(token_of(&cred), "plain-token");
        let lifetime = cred.expires_at.duration_since(before).unwrap();
        assert!(lifetime >= Duration::from_secs(3600) && lifetime < Duration::from_secs(3610));
        assert_eq!(
            p.identity(&req("a")).unwrap(),
            format!("{}/a/token", dir.path().display())
        );
    }

    #[tokio::test]
    async fn jwt_expiry_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let exp = 4_102_444_800; // 2100-01-01
        std::fs::write(dir.path().join("token"), jwt(exp)).unwrap();
        let p = provider(format!("{}/token", dir.path().display()));
        let cred = p.fetch(&req("any")).await.unwrap();
        assert_eq!(
            cred.expires_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(exp)
        );
        // An expired JWT is refused with its expiry, not served.
        std::fs::write(dir.path().join("token"), jwt(1_000)).unwrap();
        let msg = p.fetch(&req("any")).await.unwrap_err().to_string();
        assert!(msg.contains("expired at 1970-01-01T00:16:40Z"), "{msg}");
    }

    #[tokio::test]
    async fn a_changed_file_is_no_longer_current() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one").unwrap();
        let p = provider(path.display().to_string());
        let cred = p.fetch(&req("x")).await.unwrap();
        assert!(p.is_current(&req("x"), &cred));
        // Rotation by rename, as kubelet does.
        std::fs::write(dir.path().join("new"), "two").unwrap();
        std::fs::rename(dir.path().join("new"), &path).unwrap();
        assert!(!p.is_current(&req("x"), &cred));
        assert_eq!(token_of(&p.fetch(&req("x")).await.unwrap()), "two");
        std::fs::remove_file(&path).unwrap();
        assert!(!p.is_current(&req("x"), &cred));
    }

    #[tokio::test]
    async fn missing_empty_and_unsafe_inputs_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(format!("{}/{{clusterName}}.token", dir.path().display()));
        let err = p.fetch(&req("nope")).await.unwrap_err();
        assert_eq!(
            err,
            ProviderError::NotFound(format!(
                "token file {}/nope.token does not exist",
                dir.path().display()
            ))
        );
        std::fs::write(dir.path().join("empty.token"), "  \n").unwrap();
        assert!(
            p.fetch(&req("empty"))
                .await
                .unwrap_err()
                .to_string()
                .contains("is empty")
        );
        for bad in ["..", "a/b", "."] {
            assert!(
                matches!(p.identity(&req(bad)), Err(ProviderError::InvalidRequest(_))),
                "{bad}"
            );
        }
        let no_cluster = TokenRequest {
            provider: "f".into(),
            cluster: None,
            interactive: false,
        };
        let msg = p.identity(&no_cluster).unwrap_err().to_string();
        assert!(msg.contains("no clusterName"), "{msg}");
    }
}
