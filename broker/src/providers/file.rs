//! `type: file`: a token kept in a file per cluster (e.g. a projected ServiceAccount token
//! or a Secret mounted as a volume). The file is checked on every hit with one `stat`, so a
//! rotated token is served as soon as it lands.

use crate::config::values::ProviderKind;
use crate::request::TokenRequest;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::{BoxFuture, Credential, Provider, ProviderError, Resolved, jwt};
use crate::config::providers::file::Config as FileConfig;

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

    async fn read(&self, path: &Path) -> Result<Credential, ProviderError> {
        let (meta, bytes) = read_bounded(path).await?;
        let shown = path.display();
        let text = String::from_utf8(bytes).map_err(|_| {
            ProviderError::Unavailable(format!("token file {shown} is not UTF-8 text"))
        })?;
        // Never where in the file, nor which character: the path may lead anywhere.
        let token = super::bearer_token(&text)
            .map_err(|e| ProviderError::Unavailable(format!("token file {shown} {}", e.shape())))?;
        let expires_at = jwt::bearer_expiry(token, self.config.lifetime.0, &shown.to_string())?;
        let mut credential = Credential::token(token, expires_at);
        credential.source_version = Some(version(&meta));
        Ok(credential)
    }
}

/// Reads at most [`MAX_TOKEN_BYTES`] from `path`, which must be (or, through symlinks such
/// as kubelet's `..data`, lead to) a regular file. A FIFO, a device or a socket is refused
/// before a byte is read: a `stat` size says nothing about them (a FIFO with no writer
/// would block the read, and with it shutdown, forever; `/dev/zero` never ends).
/// The metadata is the opened file's own (`fstat`), so the version matches what was read.
async fn read_bounded(path: &Path) -> Result<(std::fs::Metadata, Vec<u8>), ProviderError> {
    use tokio::io::AsyncReadExt as _;
    let shown = path.display();
    let io_error = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => {
            ProviderError::NotFound(format!("token file {shown} does not exist"))
        }
        _ => ProviderError::Unavailable(format!("cannot read token file {shown}: {e}")),
    };
    // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a
    // writer; it changes nothing for a regular file. O_NOCTTY: a terminal never becomes ours.
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(crate::base::files::OPEN_FLAGS)
        .open(path)
        .await
        .map_err(io_error)?;
    let meta = file.metadata().await.map_err(io_error)?;
    if !meta.is_file() {
        return Err(ProviderError::Unavailable(format!(
            "token file {shown} is not a regular file (it is a {}); point the path at a file",
            crate::base::files::kind_of(&meta)
        )));
    }
    if meta.len() > MAX_TOKEN_BYTES {
        return Err(too_large(path));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_TOKEN_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(io_error)?;
    // The file may have grown since the fstat.
    if bytes.len() as u64 > MAX_TOKEN_BYTES {
        return Err(too_large(path));
    }
    Ok((meta, bytes))
}

fn too_large(path: &Path) -> ProviderError {
    ProviderError::Unavailable(format!(
        "token file {} is larger than {MAX_TOKEN_BYTES} bytes",
        path.display()
    ))
}

impl Provider for FileProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::File
    }

    /// The cluster's file: its path is the key and the target.
    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        let path = self.path_for(req)?;
        Ok(Resolved::new(path.display().to_string(), path))
    }

    fn fetch<'a>(
        &'a self,
        _req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move { self.read(target.target::<PathBuf>()?).await })
    }

    /// A read is cheap, and a file rewritten in place is whole again a moment later.
    fn retries_at_once(&self) -> bool {
        true
    }

    fn is_current(&self, target: &Resolved, cached: &Credential) -> bool {
        let Ok(path) = target.target::<PathBuf>() else {
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
    use crate::config::values::ConfigDuration;
    use crate::providers::{CredentialSecret, ProviderTestExt as _};
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
                config: config.into(),
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
        let cred = p.fetch_for(&req("a")).await.unwrap();
        assert_eq!(token_of(&cred), "plain-token");
        let lifetime = cred.expires_at.duration_since(before).unwrap();
        assert!(lifetime >= Duration::from_secs(3600) && lifetime < Duration::from_secs(3610));
        assert_eq!(
            p.key_for(&req("a")).unwrap(),
            format!("{}/a/token", dir.path().display())
        );
    }

    #[tokio::test]
    async fn jwt_expiry_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let exp = 4_102_444_800; // 2100-01-01
        std::fs::write(dir.path().join("token"), jwt(exp)).unwrap();
        let p = provider(format!("{}/token", dir.path().display()));
        let cred = p.fetch_for(&req("any")).await.unwrap();
        assert_eq!(
            cred.expires_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(exp)
        );
        // An expired JWT is refused with its expiry, not served.
        std::fs::write(dir.path().join("token"), jwt(1_000)).unwrap();
        let msg = p.fetch_for(&req("any")).await.unwrap_err().to_string();
        assert!(msg.contains("expired at 1970-01-01T00:16:40Z"), "{msg}");
    }

    #[tokio::test]
    async fn a_changed_file_is_no_longer_current() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one").unwrap();
        let p = provider(path.display().to_string());
        let cred = p.fetch_for(&req("x")).await.unwrap();
        assert!(p.is_current_for(&req("x"), &cred));
        // Rotation by rename, as kubelet does.
        std::fs::write(dir.path().join("new"), "two").unwrap();
        std::fs::rename(dir.path().join("new"), &path).unwrap();
        assert!(!p.is_current_for(&req("x"), &cred));
        assert_eq!(token_of(&p.fetch_for(&req("x")).await.unwrap()), "two");
        std::fs::remove_file(&path).unwrap();
        assert!(!p.is_current_for(&req("x"), &cred));
    }

    #[tokio::test]
    async fn missing_empty_and_unsafe_inputs_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(format!("{}/{{clusterName}}.token", dir.path().display()));
        let err = p.fetch_for(&req("nope")).await.unwrap_err();
        assert_eq!(
            err,
            ProviderError::NotFound(format!(
                "token file {}/nope.token does not exist",
                dir.path().display()
            ))
        );
        std::fs::write(dir.path().join("empty.token"), "  \n").unwrap();
        assert!(
            p.fetch_for(&req("empty"))
                .await
                .unwrap_err()
                .to_string()
                .contains("is empty")
        );
        for bad in ["..", "a/b", "."] {
            assert!(
                matches!(p.key_for(&req(bad)), Err(ProviderError::InvalidRequest(_))),
                "{bad}"
            );
        }
        let no_cluster = TokenRequest {
            provider: "f".into(),
            cluster: None,
            interactive: false,
        };
        let msg = p.key_for(&no_cluster).unwrap_err().to_string();
        assert!(msg.contains("no clusterName"), "{msg}");
    }

    #[tokio::test]
    async fn only_regular_files_are_read_and_never_more_than_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(format!("{}/{{clusterName}}", dir.path().display()));
        // A FIFO with no writer: refused at once, not waited on.
        nix::unistd::mkfifo(
            &dir.path().join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(5), p.fetch_for(&req("fifo")))
            .await
            .expect("a FIFO never blocks the read")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("is not a regular file (it is a FIFO)"),
            "{e}"
        );
        // A device behind a symlink: refused without reading.
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero")).unwrap();
        let e = p.fetch_for(&req("zero")).await.unwrap_err();
        assert!(e.to_string().contains("(it is a character device)"), "{e}");
        // A directory.
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let e = p.fetch_for(&req("d")).await.unwrap_err();
        assert!(e.to_string().contains("(it is a directory)"), "{e}");
        // Over the limit.
        std::fs::write(
            dir.path().join("big"),
            vec![b'a'; MAX_TOKEN_BYTES as usize + 1],
        )
        .unwrap();
        let e = p.fetch_for(&req("big")).await.unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        // Kubelet's layout: a symlink chain to a regular file is served.
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join("..data/tok"), "tok-1\n").unwrap();
        std::os::unix::fs::symlink("..data/tok", dir.path().join("linked")).unwrap();
        let c = p.fetch_for(&req("linked")).await.unwrap();
        assert_eq!(token_of(&c), "tok-1");
    }

    /// Red-team finding: a token file rewritten in place (truncated, then written) failed
    /// every call that caught it empty although a valid token was held, and after it was
    /// valid again calls still failed "retrying in 16s". Through the real cache: a failed or
    /// empty read serves what is held, a file valid again is served at once, and an empty
    /// file with nothing held is a clear error.
    #[tokio::test]
    async fn a_file_rewritten_in_place_is_served_through_and_read_again_at_once() {
        use crate::engine::cache::{Ask, Cache, CacheSettings, Outcome};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let provider: std::sync::Arc<dyn Provider> = std::sync::Arc::new(provider(
            dir.path().join("{clusterName}").display().to_string(),
        ));
        let cache = Cache::new(CacheSettings {
            max_entries: 10,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            idle_timeout: Duration::from_secs(3600),
            upstream_timeout: Duration::from_secs(20),
            max_concurrent_fetches: 4,
        });
        let req = req("a");
        let target = provider.resolve(&req).unwrap();
        let token = |s: &crate::engine::cache::Served| match &s.credential.secret {
            CredentialSecret::Token(t) => t.expose().to_owned(),
            CredentialSecret::ClientCertificate { .. } => panic!("a token"),
        };
        let write = |text: &str| {
            // In place: the same inode, truncated then written (another size: another version).
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .create(true)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        };
        write("tok-1");
        let first = cache.get(Ask::new(&provider, &req, &target)).await.unwrap();
        assert_eq!(token(&first), "tok-1");
        // Caught mid-rewrite, empty: the held token, again and again, no back-off.
        write("");
        for _ in 0..5 {
            let served = cache.get(Ask::new(&provider, &req, &target)).await.unwrap();
            assert_eq!(
                (token(&served).as_str(), served.outcome),
                ("tok-1", Outcome::Stale)
            );
        }
        // Half written and not a token: the same.
        write("tok-2 partial\n");
        assert_eq!(
            token(&cache.get(Ask::new(&provider, &req, &target)).await.unwrap()),
            "tok-1"
        );
        // Whole again: served at the very next call.
        write("tok-2");
        assert_eq!(
            token(&cache.get(Ask::new(&provider, &req, &target)).await.unwrap()),
            "tok-2"
        );

        // Nothing held and the file empty: a clear error, and the next read is at once.
        let other = Cache::new(CacheSettings {
            max_entries: 10,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            idle_timeout: Duration::from_secs(3600),
            upstream_timeout: Duration::from_secs(20),
            max_concurrent_fetches: 4,
        });
        write("");
        let e = other
            .get(Ask::new(&provider, &req, &target))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is empty") && e.contains(&path.display().to_string()),
            "{e}"
        );
        assert!(!e.contains("retrying"), "{e}");
        write("tok-3");
        assert_eq!(
            token(&other.get(Ask::new(&provider, &req, &target)).await.unwrap()),
            "tok-3"
        );
    }

    /// Red-team finding: a path that leads (through a symlink) to a file that is no token
    /// file said where that file's first line ends ("at byte 25").
    #[tokio::test]
    async fn a_file_that_is_no_token_is_refused_without_where_or_what() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("secret"),
            "root:$6$saltsalt$hash:19000:0:99999:7:::\nbin:*:1\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("a")).unwrap();
        let p = provider(dir.path().join("{clusterName}").display().to_string());
        let e = p.fetch_for(&req("a")).await.unwrap_err().to_string();
        assert!(e.contains("contains a control character"), "{e}");
        assert!(
            !e.contains("byte") && !e.contains("U+") && !e.contains("root"),
            "{e}"
        );
    }
}
