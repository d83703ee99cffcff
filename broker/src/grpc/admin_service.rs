//! `credbroker.v1.AdminService`: what operators see and the levers they pull. Lists
//! entries and providers (never a credential), drops and refreshes entries. Only callers
//! in `socket.adminUids` get in.

use std::sync::Arc;
use std::time::SystemTime;

use credbroker_proto::v1::admin_service_server::AdminService;
use credbroker_proto::v1::{
    Entry, InvalidateRequest, InvalidateResponse, ListEntriesRequest, ListEntriesResponse,
    ListProvidersRequest, ListProvidersResponse, ProviderStatus, RefreshRequest, RefreshResponse,
};
use tonic::{Request, Response, Status};

use crate::base::text::controls_escaped;
use crate::engine::broker::{Broker, BrokerError};
use crate::engine::cache::{CacheKey, EntryInfo};
use crate::engine::review::Answer;
use crate::grpc::ratelimit::{REFUSAL_LOG_INTERVAL, RefusalLog};
use crate::request::caller;

/// Which entries an Invalidate or Refresh targets.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selection {
    All,
    Provider(String),
    One(CacheKey),
}

/// For log lines: the caller's text quoted (cut short, control characters escaped).
impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::base::text::quote;
        match self {
            Self::All => f.write_str("all"),
            Self::Provider(p) => write!(f, "provider \"{}\"", quote(p)),
            Self::One(k) => write!(
                f,
                "provider \"{}\", identity \"{}\"",
                quote(&k.provider),
                quote(&k.identity)
            ),
        }
    }
}

impl Selection {
    fn parse(provider: String, identity: String, all: bool) -> Result<Self, BrokerError> {
        match (all, provider.is_empty(), identity.is_empty()) {
            (true, true, true) => Ok(Self::All),
            (true, _, _) => Err(BrokerError::BadSelection(
                "all = true selects every entry: leave provider and identity empty".into(),
            )),
            (false, true, true) => Err(BrokerError::BadSelection(
                "select entries with provider (and identity), or all = true".into(),
            )),
            (false, true, false) => Err(BrokerError::BadSelection(
                "identity needs its provider".into(),
            )),
            (false, false, true) => Ok(Self::Provider(provider)),
            (false, false, false) => Ok(Self::One(CacheKey {
                provider: provider.as_str().into(),
                identity,
            })),
        }
    }

    fn matches(&self, key: &CacheKey) -> bool {
        match self {
            Self::All => true,
            Self::Provider(p) => *key.provider == **p,
            Self::One(k) => k == key,
        }
    }
}

/// ListEntries' page when the caller names none: a few hundred KiB at most.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// The most entries a page holds, whatever the caller asks.
pub const MAX_PAGE_SIZE: usize = 1000;
/// A page stops before this many bytes of entries: a quarter of the 4 MiB a gRPC client takes
/// by default (grpcurl, grpc-go), so the answer fits with room for the framing. An entry is
/// at most a few tens of KiB (32 clusters of at most 256 characters, an identity, an error),
/// so even one page of them is far below the client's limit.
pub const MAX_PAGE_BYTES: usize = 1024 * 1024;

/// Where a ListEntries page starts: after this key, in the cache's order (provider, then
/// identity). Given out as hex, so it is opaque and safe in JSON and on a command line, and
/// signed ([`PAGE_TAG_BYTES`] of HMAC-SHA256 under a key drawn when the process starts), so
/// the contract's promise holds: a token this broker did not give out (made up, edited, or
/// from before a restart) is refused with INVALID_SELECTION, and a caller starts again from
/// the first page.
struct PageToken(CacheKey);

/// The signature's length in a page token: 128 bits, which no caller guesses.
const PAGE_TAG_BYTES: usize = 16;

/// The key page tokens are signed with, drawn once per process from the system's random
/// source (rustls' provider, the broker's one crypto library).
fn page_token_key() -> &'static [u8; 32] {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        if rustls::crypto::aws_lc_rs::default_provider()
            .secure_random
            .fill(&mut key)
            .is_err()
        {
            // Not expected on Linux (getrandom); std's per-process hash keys come from the
            // same source and keep tokens unguessable enough for a listing cursor.
            use std::hash::{BuildHasher as _, Hasher as _};
            for chunk in key.chunks_mut(8) {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u8(0);
                chunk.copy_from_slice(&h.finish().to_le_bytes());
            }
        }
        key
    })
}

/// HMAC-SHA256 (RFC 2104) of `text` under the page-token key, cut to [`PAGE_TAG_BYTES`].
fn page_tag(text: &[u8]) -> [u8; PAGE_TAG_BYTES] {
    use sha2::{Digest as _, Sha256};
    const BLOCK: usize = 64;
    let mut padded = [0u8; BLOCK];
    padded[..32].copy_from_slice(page_token_key());
    let pad = |byte: u8| padded.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(text)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    let mut tag = [0u8; PAGE_TAG_BYTES];
    tag.copy_from_slice(&outer[..PAGE_TAG_BYTES]);
    tag
}

impl PageToken {
    fn after(key: &CacheKey) -> String {
        let text = format!("{}:{}{}", key.provider.len(), key.provider, key.identity);
        let tag = page_tag(text.as_bytes());
        text.bytes()
            .chain(tag)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn parse(token: &str) -> Result<Option<Self>, BrokerError> {
        if token.is_empty() {
            return Ok(None);
        }
        let bad = || {
            BrokerError::BadSelection(
                "page_token is not one this broker gave out: pass next_page_token back as it came, or leave it empty for the first page".into(),
            )
        };
        if !token.len().is_multiple_of(2) || token.len() > 2 * (MAX_PAGE_BYTES + PAGE_TAG_BYTES) {
            return Err(bad());
        }
        let mut bytes: Vec<u8> = (0..token.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let at = bytes.len().checked_sub(PAGE_TAG_BYTES).ok_or_else(bad)?;
        let tag = bytes.split_off(at);
        // Every byte compared, so the time taken does not say how much of a guess was right.
        let differs = page_tag(&bytes)
            .iter()
            .zip(&tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs != 0 {
            return Err(bad());
        }
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let (len, rest) = text.split_once(':').ok_or_else(bad)?;
        let len: usize = len.parse().map_err(|_| bad())?;
        if !rest.is_char_boundary(len.min(rest.len())) || len > rest.len() {
            return Err(bad());
        }
        let (provider, identity) = rest.split_at(len);
        Ok(Some(Self(CacheKey {
            provider: provider.into(),
            identity: identity.to_owned(),
        })))
    }

    /// Whether `key` comes after this page's last entry.
    fn precedes(&self, key: &CacheKey) -> bool {
        (&*self.0.provider, &self.0.identity) < (&*key.provider, &key.identity)
    }
}

#[derive(Debug, Clone)]
pub struct AdminApi {
    broker: Arc<Broker>,
    /// Callers outside `socket.adminUids`, logged once and then summed up.
    refused: Arc<RefusalLog>,
}

impl AdminApi {
    pub fn new(broker: Arc<Broker>) -> Self {
        Self {
            broker,
            refused: Arc::default(),
        }
    }

    /// A call that names a provider must name a configured one: an empty answer for a
    /// typo would read as "no entries" (NOT_FOUND, as GetToken answers).
    fn check_provider(&self, name: &str) -> Result<(), BrokerError> {
        if name.is_empty() || self.broker.provider(name).is_some() {
            return Ok(());
        }
        let known: Vec<String> = self
            .broker
            .providers()
            .into_iter()
            .map(|c| c.config.name)
            .collect();
        Err(BrokerError::UnknownProvider {
            name: name.to_owned(),
            known: known.join(", "),
        })
    }

    fn authorize<T>(&self, request: &Request<T>, call: &str) -> Result<(), Status> {
        let peer = caller::peer(request.extensions());
        self.broker.authorize_admin(peer).map_err(|e| {
            if let Some(refused) = self.refused.note(peer.uid.unwrap_or(u32::MAX), true) {
                tracing::warn!(
                    uid = peer.uid,
                    call,
                    refused,
                    "AdminService call refused: {refused} call(s) of this caller; further refusals are summed up every {}s",
                    REFUSAL_LOG_INTERVAL.as_secs()
                );
            }
            Status::from(e)
        })
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

fn entry(info: EntryInfo) -> Entry {
    Entry {
        provider: info.key.provider.to_string(),
        // Identities and errors hold caller text (a file path with the cluster's name, a role
        // a ClusterProfile admitted): escaped like every status message.
        identity: controls_escaped(&info.key.identity).into_owned(),
        clusters: info.clusters,
        more_clusters: info.more_clusters,
        expires_at: info.expires_at.map(timestamp),
        refresh_at: info.refresh_at.map(timestamp),
        hits: info.hits,
        state: info.state.as_str().to_owned(),
        last_error: controls_escaped(&info.last_error.unwrap_or_default()).into_owned(),
        failures: info.failures,
        reasks: info.rejections.reasks,
        last_reask: info.rejections.last_reask.map(timestamp),
        rejected_credential_returned: info.rejections.returned_rejected,
        confirmed_rejections: info.rejections.confirmed,
        last_confirmed_rejection: info.rejections.last_confirmed.map(timestamp),
        last_reask_check: info
            .rejections
            .last_answer
            .as_ref()
            .map(Answer::describe)
            .unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_entries(
        &self,
        request: Request<ListEntriesRequest>,
    ) -> Result<Response<ListEntriesResponse>, Status> {
        self.authorize(&request, "ListEntries")?;
        let r = request.into_inner();
        self.check_provider(&r.provider)?;
        let after = PageToken::parse(&r.page_token)?;
        let page_size = match r.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => usize::try_from(n).unwrap_or(usize::MAX).min(MAX_PAGE_SIZE),
        };
        let listed = self.broker.cache().entries();
        let wanted = listed
            .into_iter()
            .filter(|e| r.provider.is_empty() || *e.key.provider == *r.provider)
            .filter(|e| after.as_ref().is_none_or(|a| a.precedes(&e.key)));
        let (mut entries, mut bytes, mut last, mut more) = (Vec::new(), 0, None, false);
        for info in wanted {
            if entries.len() == page_size {
                more = true;
                break;
            }
            let key = info.key.clone();
            let row = entry(info);
            let len = prost::Message::encoded_len(&row);
            if !entries.is_empty() && bytes + len > MAX_PAGE_BYTES {
                more = true;
                break;
            }
            bytes += len;
            last = Some(key);
            entries.push(row);
        }
        let next_page_token = match (more, last) {
            (true, Some(last)) => PageToken::after(&last),
            _ => String::new(),
        };
        Ok(Response::new(ListEntriesResponse {
            entries,
            next_page_token,
        }))
    }

    async fn invalidate(
        &self,
        request: Request<InvalidateRequest>,
    ) -> Result<Response<InvalidateResponse>, Status> {
        self.authorize(&request, "Invalidate")?;
        let r = request.into_inner();
        let selection = Selection::parse(r.provider.clone(), r.identity, r.all)?;
        self.check_provider(&r.provider)?;
        let invalidated = self.broker.cache().invalidate(|k| selection.matches(k));
        tracing::info!(%selection, invalidated, "AdminService: entries invalidated");
        Ok(Response::new(InvalidateResponse {
            invalidated: u32::try_from(invalidated).unwrap_or(u32::MAX),
        }))
    }

    async fn refresh(
        &self,
        request: Request<RefreshRequest>,
    ) -> Result<Response<RefreshResponse>, Status> {
        self.authorize(&request, "Refresh")?;
        let r = request.into_inner();
        let selection = Selection::parse(r.provider.clone(), r.identity, r.all)?;
        self.check_provider(&r.provider)?;
        let keys = self.broker.cache().keys(|k| selection.matches(k));
        let refreshes = keys.iter().map(|key| async move {
            let Some(provider) = self.broker.provider(&key.provider) else {
                return Err(format!(
                    "provider {:?} is no longer configured",
                    key.provider
                ));
            };
            self.broker
                .cache()
                .refresh(key, &provider)
                .await
                .map_err(|e| {
                    format!(
                        "provider {:?}, identity {:?}: {e}",
                        key.provider, key.identity
                    )
                })
        });
        let results = futures_util::future::join_all(refreshes).await;
        let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        let failed = u32::try_from(errors.len()).unwrap_or(u32::MAX);
        let refreshed = u32::try_from(keys.len()).unwrap_or(u32::MAX) - failed;
        tracing::info!(
            %selection,
            refreshed,
            failed,
            "AdminService: entries refreshed"
        );
        Ok(Response::new(RefreshResponse {
            refreshed,
            failed,
            errors,
        }))
    }

    async fn list_providers(
        &self,
        request: Request<ListProvidersRequest>,
    ) -> Result<Response<ListProvidersResponse>, Status> {
        self.authorize(&request, "ListProviders")?;
        let providers = self
            .broker
            .providers()
            .into_iter()
            .map(|c| {
                let health = self.broker.health().get(&c.config.name);
                ProviderStatus {
                    name: c.config.name.clone(),
                    r#type: c.config.kind().as_str().to_owned(),
                    ready: c.provider.available() && !health.failing,
                    last_success: health.last_success.map(timestamp),
                    last_error: health
                        .last_error
                        .as_ref()
                        .map(|(e, _)| e.clone())
                        .unwrap_or_default(),
                    state: health.state(c.provider.available()).to_owned(),
                    last_error_time: health.last_error.map(|(_, t)| timestamp(t)),
                }
            })
            .collect();
        Ok(Response::new(ListProvidersResponse { providers }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_are_explicit() {
        assert_eq!(
            Selection::parse(String::new(), String::new(), true).unwrap(),
            Selection::All
        );
        assert_eq!(
            Selection::parse("p".into(), String::new(), false).unwrap(),
            Selection::Provider("p".into())
        );
        let one = Selection::parse("p".into(), "id".into(), false).unwrap();
        assert!(one.matches(&CacheKey {
            provider: "p".into(),
            identity: "id".into()
        }));
        assert!(!one.matches(&CacheKey {
            provider: "p".into(),
            identity: "other".into()
        }));
        for (p, i, all) in [("", "", false), ("", "id", false), ("p", "", true)] {
            let err = Selection::parse(p.into(), i.into(), all).unwrap_err();
            assert_eq!(Status::from(err).code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn page_tokens_come_back_as_the_key_they_name_and_nothing_else_parses() {
        let key = CacheKey {
            provider: "p:1".into(),
            identity: "ünï 2:x\n".into(),
        };
        let token = PageToken::after(&key);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        let back = PageToken::parse(&token).unwrap().unwrap();
        assert_eq!(back.0, key);
        assert!(!back.precedes(&key), "a page starts after its token's key");
        let next = CacheKey {
            identity: format!("{}!", key.identity),
            ..key.clone()
        };
        assert!(back.precedes(&next));
        assert!(PageToken::parse("").unwrap().is_none());
        for bad in [
            "zz",
            "abc",
            "3a",
            "31",
            "393a70",
            "ff00",
            &"00".repeat(MAX_PAGE_BYTES + 1),
        ] {
            let err = PageToken::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert!(err.to_string().contains("page_token"), "{err}");
        }
    }

    /// A token naming a key in the form the broker uses, but made up (or edited, or from
    /// another process) was accepted: the contract says a page_token the broker did not give
    /// out is INVALID_SELECTION.
    #[test]
    fn a_page_token_this_broker_did_not_give_out_is_refused() {
        let key = CacheKey {
            provider: "p".into(),
            identity: "never-handed-out".into(),
        };
        let hex = |text: &[u8]| -> String { text.iter().map(|b| format!("{b:02x}")).collect() };
        let text = b"1:pnever-handed-out";
        let given = PageToken::after(&key);
        assert!(given.starts_with(&hex(text)));
        let made_up = hex(text);
        let mut edited = given.clone().into_bytes();
        edited[2] = if edited[2] == b'0' { b'1' } else { b'0' };
        let edited = String::from_utf8(edited).unwrap();
        let signed_elsewhere = format!("{}{}", hex(text), "00".repeat(PAGE_TAG_BYTES));
        for bad in [&made_up, &edited, &signed_elsewhere] {
            let err = PageToken::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert!(err.to_string().contains("page_token"), "{err}");
        }
    }
}
