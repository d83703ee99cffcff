//! `type: kubernetesSecret`: a credential per worker cluster kept in a Secret of one
//! namespace of the hub — cluster-inventory-api's `secretreader` (`<namespace>/<clusterName>`,
//! key `token`) and `kubeconfig-secretreader` (a kubeconfig in a Secret), and OCM's
//! managed-serviceaccount (`<clusterName>-<msaName>`).
//!
//! The Secrets are watched with a kube-rs reflector, so a GetToken never calls the API
//! server once the first list is in: the credential comes from the reflector's store. Every
//! cache hit compares the Secret's uid and resourceVersion (kept in
//! [`Credential::source_version`]) with the store's, so a rotated Secret is served on the
//! next call and a deleted one fails with NOT_FOUND. While the API server is unreachable
//! the store keeps the last state it saw: calls are still served from it, and the provider
//! reports itself not ready ([`Provider::available`]) until the watch is back.

use std::fmt;
use std::future::Future;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;

use crate::config::values::{
    ProviderKind, TemplatePart, is_dns_subdomain, is_secret_key, template_parts,
};
use crate::request::TokenRequest;

use crate::config::providers::kubernetes_secret::{Config as KubernetesSecretConfig, SecretFormat};

use super::{
    BoxFuture, Credential, CredentialSecret, Provider, ProviderError, Resolved, Secret as Hidden,
};

/// How long a call waits for the first list of the namespace's Secrets. A list of one
/// namespace answers in well under a second on a healthy API server; 10 s leaves room for
/// a slow one and stays well inside the shim's default 30 s `--timeout`.
pub const INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// First retry when the API client cannot be built (kubeconfig file missing, not in a pod):
/// most such failures are a volume or a ServiceAccount token not mounted yet.
pub const CLIENT_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Retries of the client set-up never wait longer than this, the cache's `MAX_BACKOFF`.
pub const CLIENT_RETRY_MAX: Duration = Duration::from_secs(60);

/// Builds the provider for one config entry: cheap and infallible. The API client and the
/// watch start in a background task (at once when a Tokio runtime is running, else on the
/// first call), so a broker whose API server is unreachable still starts.
pub fn build(name: &str, config: &KubernetesSecretConfig) -> Arc<dyn Provider> {
    let provider = KubernetesSecretProvider::new(name, config.clone());
    if tokio::runtime::Handle::try_current().is_ok() {
        provider.watch();
    }
    Arc::new(provider)
}

pub struct KubernetesSecretProvider {
    name: String,
    config: KubernetesSecretConfig,
    template: Vec<TemplatePart>,
    watch: OnceLock<Watch>,
}

impl fmt::Debug for KubernetesSecretProvider {
    // The store holds Secrets: never printed, only the watch's state.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesSecretProvider")
            .field("name", &self.name)
            .field("namespace", &self.config.namespace)
            .field("name_template", &self.config.name_template)
            .field("key", &self.config.key)
            .field("format", &self.config.format)
            .field("watch", &self.watch.get().map(|w| w.status()))
            .finish()
    }
}

/// Which Secret and which part of it a request maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    name: String,
    key: String,
    context: Option<String>,
}

impl KubernetesSecretProvider {
    pub fn new(name: &str, config: KubernetesSecretConfig) -> Self {
        // Validated with the config; an unparsable template fails every request instead.
        let template = template_parts(&config.name_template).unwrap_or_default();
        Self {
            name: name.to_owned(),
            config,
            template,
            watch: OnceLock::new(),
        }
    }

    /// The watch, started on first use.
    fn watch(&self) -> &Watch {
        self.watch
            .get_or_init(|| Watch::start(&self.name, &self.config))
    }

    /// The Secret name, key and context for a request. Placeholders come from the cluster's
    /// exec config, else `templateDefaults`; the exec config's `key` and `context` override
    /// the provider's (the kubeconfig-secretreader plugin reads the same keys).
    fn target(&self, req: &TokenRequest) -> Result<Target, ProviderError> {
        let template = &self.config.name_template;
        if self.template.is_empty() {
            return Err(ProviderError::InvalidRequest(format!(
                "nameTemplate {template:?} is not valid"
            )));
        }
        let mut name = String::new();
        for part in &self.template {
            match part {
                TemplatePart::Literal(text) => name.push_str(text),
                TemplatePart::Placeholder(key) => {
                    let value = req
                        .config_str(key)
                        .or_else(|| self.config.template_defaults.get(key).cloned())
                        .ok_or_else(|| {
                            ProviderError::InvalidRequest(format!(
                                "the cluster's exec config has no {key}, which nameTemplate {template:?} needs{}",
                                if key == "clusterName" {
                                    String::new()
                                } else {
                                    format!(" (or set kubernetesSecret.templateDefaults.{key})")
                                }
                            ))
                        })?;
                    name.push_str(&value);
                }
            }
        }
        if !is_dns_subdomain(&name) {
            return Err(ProviderError::InvalidRequest(format!(
                "{name:?} (from nameTemplate {template:?}) is not a valid Secret name"
            )));
        }
        if let Some(namespace) = req.config_str("namespace")
            && namespace != self.config.namespace
        {
            return Err(ProviderError::InvalidRequest(format!(
                "the cluster's exec config asks for namespace {namespace:?}, but this provider watches only {:?}",
                self.config.namespace
            )));
        }
        let key = req
            .config_str("key")
            .unwrap_or_else(|| self.config.key.clone());
        if !is_secret_key(&key) {
            return Err(ProviderError::InvalidRequest(format!(
                "{key:?} (the exec config's key) is not a Secret data key"
            )));
        }
        let context = match self.config.format {
            SecretFormat::Token => None,
            SecretFormat::Kubeconfig => req
                .config_str("context")
                .or_else(|| self.config.context.clone()),
        };
        Ok(Target { name, key, context })
    }

    fn describe(&self, target: &Target) -> String {
        format!(
            "key {:?} of Secret {}/{}",
            target.key, self.config.namespace, target.name
        )
    }

    async fn read(&self, target: &Target) -> Result<Credential, ProviderError> {
        let watch = self.watch();
        watch.synced(&self.config.namespace).await?;
        let namespace = &self.config.namespace;
        let secret = watch.get(namespace, &target.name).ok_or_else(|| {
            ProviderError::NotFound(format!(
                "Secret {namespace}/{} does not exist{}",
                target.name,
                match &self.config.label_selector {
                    Some(selector) => format!(" or does not match labelSelector {selector:?}"),
                    None => String::new(),
                }
            ))
        })?;
        let status = watch.status();
        if !status.connected {
            tracing::warn!(
                provider = %self.name,
                secret = crate::base::text::quote(&format!("{namespace}/{}", target.name)).as_str(),
                error = status.error.as_deref().unwrap_or(""),
                "serving a Secret from the last state seen: the watch on the API server is down"
            );
        }
        let what = self.describe(target);
        let data = secret
            .data
            .as_ref()
            .and_then(|data| data.get(&target.key))
            .ok_or_else(|| {
                let keys: Vec<&str> = secret
                    .data
                    .iter()
                    .flat_map(|d| d.keys())
                    .map(String::as_str)
                    .collect();
                ProviderError::NotFound(format!(
                    "Secret {namespace}/{} has no key {:?} (its keys: {})",
                    target.name,
                    target.key,
                    if keys.is_empty() {
                        "none".to_owned()
                    } else {
                        keys.join(", ")
                    }
                ))
            })?;
        let mut credential = match self.config.format {
            SecretFormat::Token => token_credential(&data.0, self.config.lifetime.0, &what)?,
            SecretFormat::Kubeconfig => kubeconfig_credential(
                &data.0,
                target.context.as_deref(),
                self.config.lifetime.0,
                &what,
            )?,
        };
        credential.source_version = Some(version(&secret));
        Ok(credential)
    }
}

impl Provider for KubernetesSecretProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::KubernetesSecret
    }

    fn resolve(&self, req: &TokenRequest) -> Result<Resolved, ProviderError> {
        let target = self.target(req)?;
        let mut identity = format!(
            "{}/{} key {}",
            self.config.namespace, target.name, target.key
        );
        if let Some(context) = &target.context {
            identity.push_str(" context ");
            identity.push_str(context);
        }
        Ok(Resolved::new(identity, target))
    }

    fn fetch<'a>(
        &'a self,
        _req: &'a TokenRequest,
        target: &'a Resolved,
    ) -> BoxFuture<'a, Result<Credential, ProviderError>> {
        Box::pin(async move { self.read(target.target()?).await })
    }

    /// One store lookup: the Secret the credential came from must still be there with the
    /// same uid and resourceVersion.
    fn is_current(&self, target: &Resolved, cached: &Credential) -> bool {
        let (Some(watch), Ok(target)) = (self.watch.get(), target.target::<Target>()) else {
            return false;
        };
        watch
            .get(&self.config.namespace, &target.name)
            .is_some_and(|secret| Some(version(&secret)) == cached.source_version)
    }

    /// Ready when the Secrets have been listed and the watch is connected; before the first
    /// call nothing is known to be wrong.
    fn available(&self) -> bool {
        self.watch.get().is_none_or(|w| {
            let status = w.status();
            status.synced && status.connected
        })
    }
}

/// Which Secret and which write of it: a delete and re-create changes the uid, any update
/// the resourceVersion.
fn version(secret: &Secret) -> u64 {
    let mut h = DefaultHasher::new();
    (
        secret.metadata.uid.as_deref(),
        secret.metadata.resource_version.as_deref(),
    )
        .hash(&mut h);
    h.finish()
}

// ---------------------------------------------------------------------------------------
// The watch
// ---------------------------------------------------------------------------------------

/// What the watch has achieved so far; shared between the watch task, the HTTP layer that
/// sees the API server's answers, and callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchStatus {
    /// The first full list is in the store (stays true: the store keeps what it saw).
    pub synced: bool,
    /// The last request to the API server was answered with success, and no error came
    /// after it.
    pub connected: bool,
    /// The latest failure, for messages and logs (never a Secret's content).
    pub error: Option<String>,
}

struct Watch {
    store: Store<Secret>,
    status: Arc<tokio::sync::watch::Sender<WatchStatus>>,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        // A provider replaced by a reload stops watching.
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Watch {
    fn start(provider: &str, config: &KubernetesSecretConfig) -> Self {
        let (store, writer) = reflector::store();
        let status = Arc::new(tokio::sync::watch::Sender::new(WatchStatus::default()));
        let task = tokio::spawn(run_watch(
            provider.to_owned(),
            config.clone(),
            writer,
            Arc::clone(&status),
        ));
        Self {
            store,
            status,
            task: Some(task.abort_handle()),
        }
    }

    fn status(&self) -> WatchStatus {
        self.status.borrow().clone()
    }

    fn get(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Waits for the first list, bounded by [`INITIAL_SYNC_TIMEOUT`]; fails at once when the
    /// watch has not synced and its last attempt failed.
    async fn synced(&self, namespace: &str) -> Result<(), ProviderError> {
        let mut rx = self.status.subscribe();
        let waited = tokio::time::timeout(
            INITIAL_SYNC_TIMEOUT,
            rx.wait_for(|s| s.synced || s.error.is_some()),
        )
        .await;
        match waited {
            Ok(Ok(status)) if status.synced => Ok(()),
            Ok(Ok(status)) => Err(ProviderError::Unavailable(format!(
                "cannot list the Secrets of namespace {namespace}: {}",
                status.error.as_deref().unwrap_or("unknown error")
            ))),
            Ok(Err(_closed)) => Err(ProviderError::Unavailable(format!(
                "the watch on the Secrets of namespace {namespace} has stopped"
            ))),
            Err(_elapsed) => Err(ProviderError::Timeout(format!(
                "the Secrets of namespace {namespace} were not listed within {}s",
                INITIAL_SYNC_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// The watch task: builds the client (retrying), then runs the reflector for as long as the
/// provider lives. The watcher resumes from the last resourceVersion after a dropped
/// connection and lists again only when the API server says that version is gone.
async fn run_watch(
    provider: String,
    config: KubernetesSecretConfig,
    writer: reflector::store::Writer<Secret>,
    status: Arc<tokio::sync::watch::Sender<WatchStatus>>,
) {
    let namespace = config.namespace.clone();
    let mut delay = CLIENT_RETRY_INITIAL;
    let client = loop {
        let layer = ObserveLayer {
            status: Arc::clone(&status),
            provider: provider.clone(),
            namespace: namespace.clone(),
        };
        match make_client(&config, layer).await {
            Ok(client) => break client,
            Err(error) => {
                tracing::warn!(
                    provider = %provider,
                    %namespace,
                    %error,
                    retry_in_s = delay.as_secs(),
                    "cannot set up the Kubernetes API client"
                );
                status.send_modify(|s| {
                    s.connected = false;
                    s.error = Some(error);
                });
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(CLIENT_RETRY_MAX);
            }
        }
    };
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &namespace);
    let mut watch_config = watcher::Config::default();
    if let Some(selector) = &config.label_selector {
        watch_config = watch_config.labels(selector);
    }
    let stream =
        reflector::reflector(writer, watcher::watcher(api, watch_config)).default_backoff();
    tokio::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::InitDone) => {
                let was_synced = status.borrow().synced;
                status.send_modify(|s| s.synced = true);
                if !was_synced {
                    tracing::info!(provider = %provider, %namespace, "Secrets listed; watching for changes");
                }
            }
            Ok(_) => {}
            Err(error) => {
                let error = super::upstream::error_chain(&error);
                let was_connected = status.borrow().connected;
                status.send_modify(|s| {
                    s.connected = false;
                    s.error = Some(error.clone());
                });
                if was_connected {
                    tracing::warn!(
                        provider = %provider,
                        %namespace,
                        %error,
                        "the watch on Secrets failed; serving the last state seen and retrying"
                    );
                } else {
                    tracing::debug!(provider = %provider, %namespace, %error, "watch retry failed");
                }
            }
        }
    }
}

/// A kube client whose every successful answer marks the watch connected. Its config comes
/// from where every Kubernetes client looks, in the same order: `kubernetesSecret.kubeconfig`,
/// else the `KUBECONFIG` list (merged like kubectl merges it), else the in-cluster
/// ServiceAccount.
async fn make_client(
    config: &KubernetesSecretConfig,
    layer: ObserveLayer,
) -> Result<kube::Client, String> {
    let options = kube::config::KubeConfigOptions::default();
    let (kubeconfig, shown) = match &config.kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| kubeconfig_error(&shown, &e))?;
            (Some(kubeconfig), shown)
        }
        None => {
            let shown = format!(
                "KUBECONFIG={}",
                std::env::var_os("KUBECONFIG")
                    .unwrap_or_default()
                    .to_string_lossy()
            );
            let kubeconfig =
                kube::config::Kubeconfig::from_env().map_err(|e| kubeconfig_error(&shown, &e))?;
            (kubeconfig, shown)
        }
    };
    let kube_config = match kubeconfig {
        Some(kubeconfig) => kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| kubeconfig_error(&shown, &e))?,
        None => kube::Config::incluster().map_err(|e| {
            format!(
                "no in-cluster configuration ({e}); run the broker in a pod with a ServiceAccount, \
                 or set kubernetesSecret.kubeconfig or KUBECONFIG"
            )
        })?,
    };
    let mut kube_config = kube_config;
    // kube takes HTTPS_PROXY from the environment but not NO_PROXY; a proxy named in the
    // kubeconfig itself (proxy-url) is used as written, like client-go does.
    let from_env = ["HTTPS_PROXY", "https_proxy"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.is_empty());
    if let (Some(proxy), Some(env)) = (&kube_config.proxy_url, from_env)
        && proxy.to_string().trim_end_matches('/') == env.trim_end_matches('/')
        && let Some(host) = kube_config.cluster_url.host()
    {
        let no_proxy = ["NO_PROXY", "no_proxy"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .collect::<Vec<_>>()
            .join(",");
        if bypasses_proxy(host, &no_proxy) {
            kube_config.proxy_url = None;
        }
    }
    let builder = kube::client::ClientBuilder::try_from(kube_config)
        .map_err(|e| format!("cannot build the Kubernetes API client: {e}"))?;
    Ok(builder.with_layer(&layer).build())
}

/// Whether `host` is excluded from proxying by a NO_PROXY list: `*`, an exact host or IP, or
/// a domain suffix (`example.com` and `.example.com` both match `api.example.com`). Ports in
/// entries are ignored; CIDR ranges are not supported.
fn bypasses_proxy(host: &str, no_proxy: &str) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    no_proxy
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            let entry = if let Some(bracketed) = entry.strip_prefix('[') {
                // [v6]:port or [v6]
                bracketed.split(']').next().unwrap_or(bracketed)
            } else {
                match entry.rsplit_once(':') {
                    // host:port, but not a bare IPv6 address
                    Some((name, port))
                        if !name.contains(':') && port.chars().all(|c| c.is_ascii_digit()) =>
                    {
                        name
                    }
                    _ => entry,
                }
            };
            let entry = entry.to_ascii_lowercase();
            let domain = entry.trim_start_matches('.');
            host == domain || host.ends_with(&format!(".{domain}"))
        })
}

/// kube's kubeconfig errors, minus YAML parser detail (which may quote the file, and the
/// file holds credentials).
fn kubeconfig_error(path: &dyn fmt::Display, error: &kube::config::KubeconfigError) -> String {
    match error {
        kube::config::KubeconfigError::Parse(_) => {
            format!("kubeconfig {path} is not a valid kubeconfig (YAML)")
        }
        other => format!("kubeconfig {path}: {other}"),
    }
}

/// Marks the watch connected whenever the API server answers with success: a watch that
/// resumes after an outage sends no event until something changes, so the answer to the
/// watch request is the only sign that it is back.
#[derive(Clone)]
struct ObserveLayer {
    status: Arc<tokio::sync::watch::Sender<WatchStatus>>,
    provider: String,
    namespace: String,
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            layer: self.clone(),
        }
    }
}

struct Observe<S> {
    inner: S,
    layer: ObserveLayer,
}

impl<S, B, Req> tower::Service<Req> for Observe<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let answer = self.inner.call(req);
        let layer = self.layer.clone();
        Box::pin(async move {
            let answer = answer.await;
            if answer.as_ref().is_ok_and(|r| r.status().is_success()) {
                layer.status.send_if_modified(|s| {
                    let changed = !s.connected;
                    s.connected = true;
                    if changed && s.synced {
                        tracing::info!(
                            provider = %layer.provider,
                            namespace = %layer.namespace,
                            "the watch on Secrets is connected again"
                        );
                    }
                    changed
                });
            }
            answer
        })
    }
}

// ---------------------------------------------------------------------------------------
// What a Secret holds
// ---------------------------------------------------------------------------------------

/// A bearer token: the whole value, trimmed. Expiry from the JWT `exp`, else `lifetime`.
fn token_credential(
    data: &[u8],
    lifetime: Duration,
    what: &str,
) -> Result<Credential, ProviderError> {
    let text = std::str::from_utf8(data).map_err(|_| {
        ProviderError::InvalidRequest(format!("{what} is not UTF-8 text, so not a token"))
    })?;
    token_from_text(text.trim(), lifetime, what)
}

fn token_from_text(
    token: &str,
    lifetime: Duration,
    what: &str,
) -> Result<Credential, ProviderError> {
    let token = super::bearer_token(token).map_err(|e| {
        let hint = match e {
            super::TokenError::Whitespace { .. } => {
                "; is it a kubeconfig? then set format: kubeconfig"
            }
            _ => "",
        };
        ProviderError::InvalidRequest(format!("{what} {e}{hint}"))
    })?;
    let expires_at = super::jwt::bearer_expiry(token, lifetime, what)?;
    Ok(Credential::token(token, expires_at))
}

/// A kubeconfig: the token, or the client certificate and key, of the user of `context`
/// (default: current-context). Credentials that need something outside the kubeconfig —
/// an exec plugin, an auth provider, files — are refused.
fn kubeconfig_credential(
    data: &[u8],
    context: Option<&str>,
    lifetime: Duration,
    what: &str,
) -> Result<Credential, ProviderError> {
    let bad = |why: String| ProviderError::InvalidRequest(format!("{what}: {why}"));
    let text =
        std::str::from_utf8(data).map_err(|_| bad("the kubeconfig is not UTF-8 text".into()))?;
    // Parsed to a plain tree first: the parser's messages never quote the document (it
    // holds credentials); only its position is reported.
    let doc: Value = serde_norway::from_str(text).map_err(|e| {
        bad(match e.location() {
            Some(at) => format!(
                "not a valid kubeconfig: YAML syntax error at line {} column {}",
                at.line(),
                at.column()
            ),
            None => "not a valid kubeconfig (YAML)".into(),
        })
    })?;
    if !doc.is_object() {
        return Err(bad("not a valid kubeconfig: not a YAML mapping".into()));
    }
    let context_name = match context {
        Some(name) => name.to_owned(),
        None => doc
            .get("current-context")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("the kubeconfig has no current-context; set kubernetesSecret.context or the cluster's context key".into()))?
            .to_owned(),
    };
    let named = |list: &str, name: &str| -> Option<&Value> {
        doc.get(list)?
            .as_array()?
            .iter()
            .find(|item| item.get("name").and_then(Value::as_str) == Some(name))
    };
    let names = |list: &str| -> String {
        let names: Vec<&str> = doc
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|item| item.get("name").and_then(Value::as_str))
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    };
    let ctx = named("contexts", &context_name).ok_or_else(|| {
        bad(format!(
            "the kubeconfig has no context {context_name:?} (contexts: {})",
            names("contexts")
        ))
    })?;
    let user_name = ctx
        .get("context")
        .and_then(|c| c.get("user"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad(format!("context {context_name:?} names no user")))?;
    let user = named("users", user_name)
        .ok_or_else(|| {
            bad(format!(
                "context {context_name:?} names user {user_name:?}, which the kubeconfig does not have (users: {})",
                names("users")
            ))
        })?
        .get("user")
        .filter(|u| u.is_object())
        .ok_or_else(|| bad(format!("user {user_name:?} has no user section")))?;
    let field = |key: &str| user.get(key).filter(|v| !v.is_null());
    if field("exec").is_some() {
        return Err(bad(format!(
            "user {user_name:?} runs an exec plugin, which credbroker does not run from a Secret; store a token or a client certificate, or configure the plugin as an exec provider"
        )));
    }
    if field("auth-provider").is_some() {
        return Err(bad(format!(
            "user {user_name:?} uses an auth-provider, which credbroker does not support; store a token or a client certificate"
        )));
    }
    let string = |key: &str| -> Result<Option<&str>, ProviderError> {
        match field(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(bad(format!("user {user_name:?}: {key} is not a string"))),
        }
    };
    if let Some(token) = string("token")? {
        return token_from_text(
            token.trim(),
            lifetime,
            &format!("{what} (user {user_name:?})"),
        );
    }
    let cert = string("client-certificate-data")?;
    let key = string("client-key-data")?;
    match (cert, key) {
        (Some(cert), Some(key)) => {
            let decode = |field: &str, b64: &str| {
                base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .ok()
                    .and_then(|bytes| String::from_utf8(bytes).ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "user {user_name:?}: {field} is not base64 of PEM text"
                        ))
                    })
            };
            let certificate_pem = decode("client-certificate-data", cert)?;
            let key_pem = decode("client-key-data", key)?;
            if !(key_pem.contains("-----BEGIN") && key_pem.contains("PRIVATE KEY-----")) {
                return Err(bad(format!(
                    "user {user_name:?}: client-key-data is not a PEM private key"
                )));
            }
            let expires_at = certificate_not_after(&certificate_pem).map_err(|why| {
                bad(format!(
                    "user {user_name:?}: client-certificate-data: {why}"
                ))
            })?;
            if expires_at <= SystemTime::now() {
                return Err(ProviderError::Unavailable(format!(
                    "{what}: the client certificate of user {user_name:?} expired at {}",
                    humantime::format_rfc3339_seconds(expires_at)
                )));
            }
            Ok(Credential {
                secret: CredentialSecret::ClientCertificate {
                    certificate_pem,
                    key_pem: Hidden::new(key_pem),
                },
                expires_at,
                source_version: None,
            })
        }
        (Some(_), None) | (None, Some(_)) => Err(bad(format!(
            "user {user_name:?} has only one of client-certificate-data and client-key-data"
        ))),
        (None, None) => {
            let elsewhere = [
                "tokenFile",
                "client-certificate",
                "client-key",
                "username",
                "password",
            ]
            .into_iter()
            .filter(|k| field(k).is_some())
            .collect::<Vec<_>>();
            Err(bad(if elsewhere.is_empty() {
                format!(
                    "user {user_name:?} has neither a token nor client-certificate-data and client-key-data"
                )
            } else {
                format!(
                    "user {user_name:?} has {} but neither a token nor client-certificate-data and client-key-data; credentials in files or basic auth are not supported, inline them",
                    elsewhere.join(", ")
                )
            }))
        }
    }
}

/// The `notAfter` of the first certificate in a PEM chain (the client's own).
fn certificate_not_after(pem: &str) -> Result<SystemTime, String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|_| "no PEM certificate in it".to_owned())?;
    if block.label != "CERTIFICATE" {
        return Err(format!(
            "the first PEM block is a {}, not a CERTIFICATE",
            block.label
        ));
    }
    let cert = block
        .parse_x509()
        .map_err(|e| format!("not a valid X.509 certificate ({e})"))?;
    let secs = cert.validity().not_after.timestamp();
    let secs = u64::try_from(secs).map_err(|_| "notAfter is before 1970".to_owned())?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}
#[cfg(test)]
mod tests;
