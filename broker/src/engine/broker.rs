//! The broker's core, apart from its transport: the runtime snapshot a reload swaps, who
//! may call, `get_token` (caller check, request limits, provider, overrides, cache) and
//! reload, and [`BrokerError`], every refusal the broker makes. No gRPC here: the services
//! (`token_service`, `admin_service`) turn requests into calls on [`Broker`], and
//! `status` turns its errors into statuses.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use credbroker_proto::v1::GetTokenRequest;

use crate::base::text::{self, quote};
use crate::config::{Config, LimitsConfig, ProviderConfig};
use crate::engine::cache::{Ask, Cache, CacheError, CacheSettings, Served, UPSTREAM_TIMEOUT};
use crate::engine::metrics::{self, Metrics};
use crate::engine::telemetry::{ProviderHealth, Telemetry};
use crate::providers::overrides::{self, OverrideError};
use crate::providers::{self, Provider};
use crate::request::caller::{Caller, Peer};
use crate::request::{RequestError, TokenRequest};

/// Why a call failed: every refusal the broker makes, whichever service or layer makes it.
/// Turned into a gRPC status (code, message, `google.rpc.ErrorInfo`) in exactly one place:
/// the status module, which depends on this one, never the other way.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("permission denied: caller uid {} is not in {list}", .uid.map_or_else(|| "(unknown)".to_owned(), |u| u.to_string()))]
    CallerNotAllowed {
        uid: Option<u32>,
        list: &'static str,
    },
    /// An AdminService Invalidate or Refresh that selects no entries, or contradicts itself.
    #[error("{0}")]
    BadSelection(String),
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error("unknown provider \"{}\" (configured: {known})", quote(.name))]
    UnknownProvider { name: String, known: String },
    #[error("provider \"{}\", cluster \"{}\": {source}", quote(.provider), quote(.cluster))]
    Provider {
        provider: String,
        cluster: String,
        source: CacheError,
    },
    /// The cluster's exec config picks an identity or a secret the provider does not allow.
    /// Refused before the cache: nothing cached is touched.
    #[error("provider {provider:?}, cluster \"{cluster}\": {source}")]
    OverrideRefused {
        provider: String,
        cluster: String,
        source: Box<OverrideError>,
    },
    /// The caller's uid is over `rateLimit` (the per-uid token bucket in front of the
    /// services).
    #[error(
        "caller uid {uid} exceeded the rate limit of {per_second}/s (burst {burst}); slow down or raise rateLimit in the broker config"
    )]
    RateLimited {
        uid: u32,
        per_second: u32,
        burst: u32,
    },
}

/// A configured provider and the config it was built from (to tell, on reload, whether
/// it changed).
#[derive(Debug, Clone)]
pub struct Configured {
    pub config: ProviderConfig,
    pub provider: Arc<dyn Provider>,
}

/// What a reload swaps atomically: requests hold a snapshot, so none fails mid-swap.
#[derive(Debug)]
struct Runtime {
    providers: BTreeMap<String, Configured>,
    allowed_uids: Option<Vec<u32>>,
    allowed_gids: Option<Vec<u32>>,
    admin_uids: Vec<u32>,
}

impl Runtime {
    fn new(config: &Config, providers: BTreeMap<String, Configured>) -> Self {
        let admin_uids = config
            .socket
            .admin_uids
            .clone()
            .unwrap_or_else(|| vec![nix::unistd::geteuid().as_raw(), 0]);
        Self {
            providers,
            allowed_uids: config.socket.allowed_uids.clone(),
            allowed_gids: config.socket.allowed_gids.clone(),
            admin_uids,
        }
    }

    fn may_get_tokens(&self, peer: Peer) -> bool {
        if self.allowed_uids.is_none() && self.allowed_gids.is_none() {
            return true;
        }
        let listed = |ids: &Option<Vec<u32>>, id: Option<u32>| {
            ids.as_ref()
                .is_some_and(|ids| id.is_some_and(|id| ids.contains(&id)))
        };
        listed(&self.allowed_uids, peer.uid) || listed(&self.allowed_gids, peer.gid)
    }
}

/// What a reload changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub kept: Vec<String>,
    pub replaced: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub invalidated: usize,
}

/// Answers token requests: authorises the caller, picks the provider, asks the cache.
#[derive(Debug)]
pub struct Broker {
    runtime: RwLock<Arc<Runtime>>,
    cache: Arc<Cache>,
    metrics: Arc<Metrics>,
    health: Arc<ProviderHealth>,
    /// Bound at start-up, like the gRPC decoder's size limit they go with.
    limits: LimitsConfig,
}

impl Broker {
    pub fn new(config: &Config) -> Self {
        let providers = config
            .providers
            .iter()
            .map(|p| {
                let configured = Configured {
                    config: p.clone(),
                    provider: providers::build(p),
                };
                (p.name.clone(), configured)
            })
            .collect();
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(ProviderHealth::default());
        let telemetry = Arc::new(Telemetry::new(metrics.clone(), health.clone()));
        let cache = Cache::new(CacheSettings {
            max_entries: config.cache.max_entries,
            max_bytes: config.cache.max_bytes,
            idle_timeout: config.cache.idle_timeout.0,
            upstream_timeout: UPSTREAM_TIMEOUT,
            max_concurrent_fetches: config.cache.max_concurrent_fetches,
        })
        .with_observer(telemetry);
        Self {
            runtime: RwLock::new(Arc::new(Runtime::new(config, providers))),
            cache: Arc::new(cache),
            metrics,
            health,
            limits: config.limits,
        }
    }

    /// What callers may send.
    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// The `provider` label for `name` in metrics: a configured provider's name, else one
    /// fixed label, so that callers cannot mint label values.
    pub fn metric_label<'a>(&self, name: &'a str) -> &'a str {
        if self.runtime().providers.contains_key(name) {
            name
        } else {
            metrics::UNKNOWN_PROVIDER
        }
    }

    fn runtime(&self) -> Arc<Runtime> {
        self.runtime
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn health(&self) -> &ProviderHealth {
        &self.health
    }

    /// The configured providers, in name order.
    pub fn providers(&self) -> Vec<Configured> {
        self.runtime().providers.values().cloned().collect()
    }

    /// The provider currently configured under `name`.
    pub fn provider(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.runtime()
            .providers
            .get(name)
            .map(|c| c.provider.clone())
    }

    /// Whether a peer may call anything that needs more than a refusal: tokens
    /// (`socket.allowedUids`/`allowedGids`) or AdminService (`socket.adminUids`). The server
    /// asks at accept, so a connection nobody would serve never shares the pool of those that
    /// are ([`crate::base::conn`]); each call is still checked on its own.
    pub fn may_connect(&self, peer: Peer) -> bool {
        let runtime = self.runtime();
        runtime.may_get_tokens(peer)
            || peer
                .uid
                .is_some_and(|uid| runtime.admin_uids.contains(&uid))
    }

    /// Refuses callers outside `socket.adminUids`.
    pub fn authorize_admin(&self, peer: Peer) -> Result<(), BrokerError> {
        let runtime = self.runtime();
        if peer
            .uid
            .is_some_and(|uid| runtime.admin_uids.contains(&uid))
        {
            Ok(())
        } else {
            Err(BrokerError::CallerNotAllowed {
                uid: peer.uid,
                list: "socket.adminUids",
            })
        }
    }

    /// One `GetToken`, from an already-identified caller.
    pub async fn get_token(
        &self,
        peer: Peer,
        msg: GetTokenRequest,
    ) -> Result<(Served, TokenRequest), BrokerError> {
        let runtime = self.runtime();
        if !runtime.may_get_tokens(peer) {
            return Err(BrokerError::CallerNotAllowed {
                uid: peer.uid,
                list: "socket.allowedUids/allowedGids",
            });
        }
        let caller = Caller::from_proto(peer, msg.caller.as_ref()).map_err(RequestError::Caller)?;
        let req = TokenRequest::from_proto(msg, &self.limits)?;
        let provider = &runtime
            .providers
            .get(&req.provider)
            .ok_or_else(|| BrokerError::UnknownProvider {
                name: req.provider.clone(),
                known: runtime
                    .providers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?
            .provider;
        let failed = |source: CacheError| BrokerError::Provider {
            provider: req.provider.clone(),
            cluster: req.cluster_label(),
            source,
        };
        // Before the provider reads the request: its identity, the cache and the fetch only
        // ever see per-cluster keys the provider's config allows.
        if let Some(configured) = runtime.providers.get(&req.provider) {
            overrides::check(&configured.config, &req).map_err(|source| {
                BrokerError::OverrideRefused {
                    provider: req.provider.clone(),
                    cluster: text::quote(&req.cluster_label()),
                    source: Box::new(source),
                }
            })?;
        }
        let target = provider.resolve(&req).map_err(|e| failed(e.into()))?;
        match self
            .cache
            .get(Ask::new(provider, &req, &target).by(caller))
            .await
        {
            Ok(served) => Ok((served, req)),
            Err(e) => Err(failed(e)),
        }
    }

    /// Applies a new config: providers whose config is unchanged keep their instance and
    /// cache entries; changed and removed ones lose their entries; access lists take
    /// effect at once. Settings bound at start-up (socket, cache size, metrics address,
    /// rate limit) need a restart: the caller warns about them.
    pub fn reload(&self, config: &Config) -> Reloaded {
        let old = self.runtime();
        let mut done = Reloaded::default();
        let mut providers = BTreeMap::new();
        for p in &config.providers {
            let configured = match old.providers.get(&p.name) {
                Some(current) if current.config == *p => {
                    done.kept.push(p.name.clone());
                    current.clone()
                }
                current => {
                    let list = if current.is_some() {
                        &mut done.replaced
                    } else {
                        &mut done.added
                    };
                    list.push(p.name.clone());
                    Configured {
                        config: p.clone(),
                        provider: providers::build(p),
                    }
                }
            };
            providers.insert(p.name.clone(), configured);
        }
        done.removed = old
            .providers
            .keys()
            .filter(|n| !providers.contains_key(*n))
            .cloned()
            .collect();
        *self.runtime.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Runtime::new(config, providers));
        done.invalidated = self.cache.invalidate(|key| {
            done.replaced
                .iter()
                .chain(&done.removed)
                .any(|name| **name == *key.provider)
        });
        done
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A broker on a config that must parse (the status table's tests use it too).
    pub(crate) fn broker(yaml: &str) -> Broker {
        Broker::new(&Config::parse(yaml, "t").unwrap())
    }

    /// A GetToken message naming only its provider.
    pub(crate) fn msg(provider: &str) -> GetTokenRequest {
        GetTokenRequest {
            provider: provider.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn reload_keeps_unchanged_providers_and_their_entries() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b"] {
            std::fs::write(dir.path().join(name), format!("token-{name}")).unwrap();
        }
        let yaml = |b_lifetime: &str, extra: &str| {
            format!(
                "providers:\n  - {{name: a, type: file, file: {{path: {d}/a}}}}\n  - {{name: b, type: file, file: {{path: {d}/b, lifetime: {b_lifetime}}}}}\n{extra}",
                d = dir.path().display()
            )
        };
        let b = broker(&yaml("1h", ""));
        for p in ["a", "b"] {
            b.get_token(Peer::default(), msg(p)).await.unwrap();
        }
        assert_eq!(b.cache().entry_count(), 2);
        let a_before = b.provider("a").unwrap();
        let next = Config::parse(&yaml("2h", "  - {name: c, type: aws}\n"), "t").unwrap();
        let done = b.reload(&next);
        assert_eq!(done.kept, ["a"]);
        assert_eq!(done.replaced, ["b"]);
        assert_eq!(done.added, ["c"]);
        assert_eq!(done.invalidated, 1);
        assert!(
            Arc::ptr_eq(&a_before, &b.provider("a").unwrap()),
            "unchanged provider kept"
        );
        let entries = b.cache().entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(&*entries[0].key.provider, "a");
        let removed = b.reload(&Config::parse(&yaml("2h", ""), "t").unwrap());
        assert_eq!(removed.removed, ["c"]);
        assert!(b.provider("c").is_none());
    }
}
