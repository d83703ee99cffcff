//! `type: gcp`: one OAuth2 access token per Google identity, shared by every GKE cluster.
//!
//! # Where the credential comes from
//! Application Default Credentials order (AIP-4110), unless `gcp.credentialsFile` names a file:
//! 1. the file in `GOOGLE_APPLICATION_CREDENTIALS`;
//! 2. gcloud's ADC file (`$CLOUDSDK_CONFIG` or `~/.config/gcloud`, `application_default_credentials.json`);
//! 3. the metadata server (GKE Workload Identity, GCE), at `GCE_METADATA_HOST` when set.
//!
//! Then, with `gcp.impersonateServiceAccount`, that token is exchanged for one of the target
//! service account (IAM Credentials `generateAccessToken`, through `gcp.delegates`).
//!
//! # Who does which exchange, and why
//! GKE wants an OAuth2 access token (what `gke-gcloud-auth-plugin` and Argo CD hand it). Google
//! documents no promise that every service accepts self-signed JWTs (google-cloud-rust issue
//! #4024 shows services rejecting them), and GKE is not documented to. So:
//! - **service-account keys**: the provider itself signs an RS256 assertion and exchanges it at
//!   the key's `token_uri` with the JWT-bearer grant (RFC 7523), in [`sa_key`]. Google's
//!   `google-cloud-auth` crate mints self-signed JWTs from keys and ignores `token_uri`, and
//!   `gcp_auth` is no better (it hard-codes the metadata host, ignores scopes there and has no
//!   external_account); the exchange is small, signs with aws-lc-rs (the broker's one crypto
//!   provider) and has its own tests.
//! - **external_account** (workload identity federation with file, URL, executable or AWS
//!   sourced subject tokens), **authorized_user**, **external_account_authorized_user** and
//!   **impersonated_service_account** files: `google-cloud-auth`, which implements all of them
//!   (including AWS SigV4 subject tokens) and honours the URLs in the file.
//! - **the metadata server** and **`impersonateServiceAccount`**: one plain HTTP call each,
//!   made here. `google-cloud-auth` 1.19 can do both, but it does not tell its caller when a
//!   token expires (`AccessToken` has only the token; `Token::expires_at` is crate-private), and
//!   the broker's cache must know: a metadata-server token has anywhere from ~5 to 60 minutes
//!   left when it is handed out, so no fixed guess is both safe and useful. The metadata answer
//!   carries `expires_in`, `generateAccessToken` answers with `expireTime`: both exact.
//!
//! For the library's sources the expiry is therefore derived, conservatively, from when the
//! request started (see `library::Kind::assumed_lifetime`); each fetch builds a fresh
//! library credential so the token it returns was minted by that fetch, not taken from the
//! library's own cache.
//!
//! # Cache identity
//! Credential identity (service-account email, federation audience, file path or metadata
//! host) + sorted scopes + impersonation target and delegates, never the cluster: every GKE
//! cluster shares one token and one refresh.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::config::values::ProviderKind;

use crate::config::providers::gcp::Config as GcpConfig;
use crate::request::TokenRequest;

use super::{BoxFuture, Credential, Provider, ProviderError, Resolved};
mod http;
mod library;
mod sa_key;
#[cfg(test)]
mod tests;

/// Scope of every Google Cloud API: GKE checks IAM permissions on top of it.
pub const SCOPE_CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Lets GKE map the token to the identity's email (what RBAC bindings name).
pub const SCOPE_USERINFO_EMAIL: &str = "https://www.googleapis.com/auth/userinfo.email";
/// The default: what `gke-gcloud-auth-plugin` asks for.
pub const DEFAULT_SCOPES: [&str; 2] = [SCOPE_CLOUD_PLATFORM, SCOPE_USERINFO_EMAIL];
/// Where `generateAccessToken` lives outside sovereign clouds and Private Service Connect.
pub const DEFAULT_IAM_CREDENTIALS_ENDPOINT: &str = "https://iamcredentials.googleapis.com";
/// The metadata server's name on GCE and GKE (`GCE_METADATA_HOST` overrides it).
pub const DEFAULT_METADATA_HOST: &str = "metadata.google.internal";
/// Where a service-account key without `token_uri` is exchanged (Google's OAuth2 server).
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// Lifetime asked of `generateAccessToken`: its default and, without an org-policy exception,
/// its maximum.
pub const IMPERSONATED_LIFETIME: Duration = Duration::from_secs(3600);
/// The lifetime google-cloud-auth 1.19 asks `generateAccessToken` for when an external_account
/// file has `service_account_impersonation_url` (its `impersonated::DEFAULT_LIFETIME`; it
/// ignores `token_lifetime_seconds`).
pub const LIBRARY_IMPERSONATION_LIFETIME: Duration = Duration::from_secs(3600);
/// Tokens whose lifetime the library does not report (a direct STS federated token, an
/// authorized_user refresh): Google issues them for an hour today, but does not promise it and
/// workforce sessions can be configured down to 15 minutes; assuming 10 minutes never serves
/// one past its expiry and still costs only one exchange every ~5 minutes.
pub const OPAQUE_TOKEN_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// Which file in gcloud's config dir holds Application Default Credentials.
const GCLOUD_ADC_FILE: &str = "application_default_credentials.json";
/// A credential file holds one JSON object of a few KiB; anything this large is not one.
const MAX_CREDENTIALS_FILE_BYTES: u64 = 1024 * 1024;

/// Builds the provider for one config entry. Cheap: the environment is read now, files and
/// the network on the first request.
pub fn build(name: &str, config: &GcpConfig) -> Arc<dyn Provider> {
    Arc::new(GcpProvider::new(name, config.clone(), Env::from_process()))
}

/// The process environment the provider depends on, read once at start-up (tests pass their
/// own, since the environment of a test process cannot be changed safely).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub google_application_credentials: Option<PathBuf>,
    pub cloudsdk_config: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub gce_metadata_host: Option<String>,
}

impl Env {
    pub fn from_process() -> Self {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Self {
            google_application_credentials: path("GOOGLE_APPLICATION_CREDENTIALS"),
            cloudsdk_config: path("CLOUDSDK_CONFIG"),
            home: path("HOME"),
            gce_metadata_host: std::env::var("GCE_METADATA_HOST")
                .ok()
                .filter(|v| !v.trim().is_empty()),
        }
    }

    /// gcloud's ADC file, where gcloud writes it.
    fn gcloud_adc_file(&self) -> Option<PathBuf> {
        match (&self.cloudsdk_config, &self.home) {
            (Some(dir), _) => Some(dir.join(GCLOUD_ADC_FILE)),
            (None, Some(home)) => Some(home.join(".config/gcloud").join(GCLOUD_ADC_FILE)),
            (None, None) => None,
        }
    }

    fn metadata_host(&self) -> &str {
        self.gce_metadata_host
            .as_deref()
            .unwrap_or(DEFAULT_METADATA_HOST)
    }
}

/// Where a credential file was found, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Config,
    EnvVar,
    Gcloud,
}

impl Origin {
    fn describe(self) -> &'static str {
        match self {
            Self::Config => "gcp.credentialsFile",
            Self::EnvVar => "GOOGLE_APPLICATION_CREDENTIALS",
            Self::Gcloud => "gcloud's application-default credentials",
        }
    }
}

/// The ADC source chosen for a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    File {
        path: PathBuf,
        origin: Origin,
    },
    /// `tried` lists what came before it, for the message when it fails too.
    Metadata {
        host: String,
        tried: Vec<String>,
    },
}

/// A parsed credential file.
#[derive(Debug)]
enum CredentialFile {
    ServiceAccount(sa_key::ServiceAccountKey),
    Library {
        kind: library::Kind,
        json: Value,
        identity: String,
    },
}

impl CredentialFile {
    fn identity(&self, path: &Path) -> String {
        match self {
            Self::ServiceAccount(key) => format!("service_account:{}", key.client_email),
            Self::Library { identity, .. } if !identity.is_empty() => identity.clone(),
            Self::Library { kind, .. } => format!("{}:{}", kind.as_str(), path.display()),
        }
    }
}

/// A token and its (possibly conservative) expiry.
#[derive(Clone)]
struct Token {
    secret: super::Secret,
    expires_at: SystemTime,
}

#[derive(Debug)]
pub struct GcpProvider {
    name: String,
    config: GcpConfig,
    /// Sorted and deduplicated: the order of scopes does not change the token.
    scopes: Vec<String>,
    env: Env,
    http: tokio::sync::OnceCell<http::Clients>,
    /// The credential identity, once a source has been read successfully.
    source_identity: OnceLock<String>,
    /// What follows the source in the cache key: fixed by the config, so built once.
    identity_suffix: String,
}

impl GcpProvider {
    pub fn new(name: &str, config: GcpConfig, env: Env) -> Self {
        let mut scopes: Vec<String> = match &config.scopes {
            Some(s) if !s.is_empty() => s.clone(),
            _ => DEFAULT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
        };
        scopes.sort();
        scopes.dedup();
        let identity_suffix = identity_suffix(&scopes, &config);
        Self {
            name: name.to_owned(),
            config,
            scopes,
            env,
            http: tokio::sync::OnceCell::new(),
            source_identity: OnceLock::new(),
            identity_suffix,
        }
    }

    /// The ADC chain: explicit file, `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's file, metadata.
    fn locate(&self) -> Result<Source, ProviderError> {
        if let Some(path) = &self.config.credentials_file {
            return Ok(Source::File {
                path: path.clone(),
                origin: Origin::Config,
            });
        }
        if let Some(path) = &self.env.google_application_credentials {
            return Ok(Source::File {
                path: path.clone(),
                origin: Origin::EnvVar,
            });
        }
        let mut tried = vec!["GOOGLE_APPLICATION_CREDENTIALS is not set".to_owned()];
        match self.env.gcloud_adc_file() {
            Some(path) if path.is_file() => {
                return Ok(Source::File {
                    path,
                    origin: Origin::Gcloud,
                });
            }
            Some(path) => tried.push(format!("no gcloud ADC file at {}", path.display())),
            None => {
                tried.push("no gcloud ADC file (neither CLOUDSDK_CONFIG nor HOME is set)".into())
            }
        }
        Ok(Source::Metadata {
            host: self.env.metadata_host().to_owned(),
            tried,
        })
    }

    /// Reads and parses a credential file; errors name the file, where it came from and the field.
    fn read_file(&self, path: &Path, origin: Origin) -> Result<CredentialFile, ProviderError> {
        let shown = format!(
            "GCP credentials file {} (from {})",
            path.display(),
            origin.describe()
        );
        let meta = std::fs::metadata(path).map_err(|e| file_error(&shown, &e))?;
        if meta.len() > MAX_CREDENTIALS_FILE_BYTES {
            return Err(ProviderError::Unavailable(format!(
                "{shown} is larger than {MAX_CREDENTIALS_FILE_BYTES} bytes: not a credentials file"
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| file_error(&shown, &e))?;
        parse_credential_file(&text)
            .map_err(|why| ProviderError::Unavailable(format!("{shown}: {why}")))
    }

    fn source_identity(&self) -> Result<String, ProviderError> {
        if let Some(id) = self.source_identity.get() {
            return Ok(id.clone());
        }
        let id = match self.locate()? {
            Source::File { path, origin } => self.read_file(&path, origin)?.identity(&path),
            Source::Metadata { host, .. } => format!("metadata:{host}"),
        };
        Ok(self.source_identity.get_or_init(|| id).clone())
    }

    async fn client(&self) -> Result<&http::Clients, ProviderError> {
        self.http
            .get_or_try_init(|| async { http::client() })
            .await
            .map_err(|e| {
                ProviderError::Unavailable(format!(
                    "gcp provider {:?}: cannot set up the HTTP client: {e}",
                    self.name
                ))
            })
    }

    /// Scopes for the token the source hands out: the configured ones, or, when it is only
    /// the caller of `generateAccessToken`, the scope IAM Credentials needs.
    fn source_scopes(&self) -> Vec<String> {
        if self.config.impersonate_service_account.is_some() {
            vec![SCOPE_CLOUD_PLATFORM.to_owned()]
        } else {
            self.scopes.clone()
        }
    }

    async fn fetch_token(&self) -> Result<Credential, ProviderError> {
        let source = self.locate()?;
        let scopes = self.source_scopes();
        let token = match source {
            Source::File { path, origin } => {
                let file = self.read_file(&path, origin)?;
                let _ = self.source_identity.set(file.identity(&path));
                let what = format!(
                    "GCP credentials file {} (from {})",
                    path.display(),
                    origin.describe()
                );
                match file {
                    CredentialFile::ServiceAccount(key) => {
                        let client = self.client().await?;
                        sa_key::exchange(client, &key, &scopes)
                            .await
                            .map_err(|e| e.into_provider_error(&what))?
                    }
                    CredentialFile::Library { kind, json, .. } => {
                        library::fetch(kind, json, &scopes, &what).await?
                    }
                }
            }
            Source::Metadata { host, tried } => {
                let client = self.client().await?;
                http::metadata_token(client, &host, &scopes)
                    .await
                    .map_err(|e| e.into_metadata_error(&host, &tried))?
            }
        };
        let token = match &self.config.impersonate_service_account {
            Some(target) => {
                let client = self.client().await?;
                let endpoint = self
                    .config
                    .iam_credentials_endpoint
                    .as_deref()
                    .unwrap_or(DEFAULT_IAM_CREDENTIALS_ENDPOINT);
                let delegates = self.config.delegates.as_deref().unwrap_or_default();
                http::generate_access_token(
                    client,
                    endpoint,
                    &token.secret,
                    target,
                    delegates,
                    &self.scopes,
                )
                .await
                .map_err(|e| {
                    e.into_provider_error(&format!("impersonating service account {target}"))
                })?
            }
            None => token,
        };
        Ok(Credential {
            secret: super::CredentialSecret::Token(token.secret),
            expires_at: token.expires_at,
            source_version: None,
        })
    }
}

impl Provider for GcpProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gcp
    }

    /// The same for every cluster: the credential's identity, the scopes, the impersonation.
    /// No target: the token depends on the broker's credentials only, which `fetch` locates.
    fn resolve(&self, _req: &TokenRequest) -> Result<Resolved, ProviderError> {
        let key = format!("{}{}", self.source_identity()?, self.identity_suffix);
        Ok(Resolved::new(key, ()))
    }

    fn fetch<'a>(
        &'a self,
        _req: &'a TokenRequest,
        _target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(self.fetch_token())
    }
}

/// The scopes and impersonation part of the cache key.
fn identity_suffix(scopes: &[String], config: &GcpConfig) -> String {
    let mut id = format!("|scopes={}", scopes.join(","));
    if let Some(target) = &config.impersonate_service_account {
        id.push_str(&format!("|impersonate={target}"));
        if let Some(delegates) = &config.delegates {
            id.push_str(&format!("|delegates={}", delegates.join(",")));
        }
    }
    id
}

fn file_error(shown: &str, e: &std::io::Error) -> ProviderError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ProviderError::NotFound(format!("{shown} does not exist")),
        _ => ProviderError::Unavailable(format!("cannot read {shown}: {e}")),
    }
}

/// Parses a credential file by its `type`; the error names the field at fault.
fn parse_credential_file(text: &str) -> Result<CredentialFile, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "not valid JSON ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        )
    })?;
    if !json.is_object() {
        return Err("not a JSON object".into());
    }
    let kind = match json.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err("field `type` is not a string".into()),
        None => return Err("field `type` is missing (expected service_account, authorized_user, external_account, external_account_authorized_user or impersonated_service_account)".into()),
    };
    if kind == "service_account" {
        return sa_key::ServiceAccountKey::from_json(&json).map(CredentialFile::ServiceAccount);
    }
    let kind = library::Kind::from_type(kind)?;
    kind.check_fields(&json)?;
    let identity = kind.identity(&json);
    Ok(CredentialFile::Library {
        kind,
        json,
        identity,
    })
}

/// Trims a field of the JSON, if it is a non-empty string.
fn json_str<'a>(json: &'a Value, field: &str) -> Option<&'a str> {
    json.get(field)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Error text from a library or an upstream, made safe to show: anything that looks like a
/// token or an assertion (a long unbroken run of token characters) is redacted, and the whole
/// is cut to a readable length.
fn sanitize(text: &str) -> String {
    /// Longer than any word of an error message, shorter than any token Google issues.
    const MAX_WORD: usize = 40;
    /// Enough for an upstream's `error_description`.
    const MAX_LEN: usize = 600;
    let mut out = String::with_capacity(text.len().min(MAX_LEN));
    let mut word = String::new();
    let is_token_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '/' | '=');
    let flush = |word: &mut String, out: &mut String| {
        if word.len() > MAX_WORD && !word.contains("://") {
            out.push_str("[redacted]");
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if is_token_char(c) || (c == ':' && !word.is_empty()) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    if out.len() > MAX_LEN {
        let mut cut = MAX_LEN;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}
