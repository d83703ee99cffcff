//! Re-asks through the cache ([`crate::engine::rejections`] has the rules): a caller asking again
//! before its come-back time waits for one check of the held credential with the cluster's
//! API server ([`crate::engine::review`]), single-flight per credential and server, holding one of the
//! check slots shared fairly between uids; the check's answer is acted on once.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::time::Instant;

use super::entry::State;
use super::entry::{Inflight, PendingCheck, Slot};
use super::{Ask, CHECK_WAIT, Cache};
use crate::base::gate::{Full, Permit, Purpose};
use crate::engine::rejections::{CheckKey, ClusterDigest, Reask, Verdict};
use crate::engine::review::{Answer, CHECK_TIMEOUT};
use crate::providers::BoxFuture;
use crate::request::caller::CallerId;

/// What a re-ask about the credential held needs, found under the entry's lock.
pub(super) enum CheckStep {
    /// The same check (credential and server) is running: wait for its answer.
    Join(PendingCheck),
    /// None is: wait for a check slot, then start it.
    Start(CheckKey),
}

/// What the cache does about a rejection, for its log line.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// Joins the fetch running for the entry.
    Join,
    /// Started a forced refresh.
    Fetch,
    /// Serves what it holds: the entry is backing off after upstream failures.
    BackingOff,
    /// Serves what it holds: a forced refresh ran recently; the next is allowed after this.
    Hold(Duration),
    /// The rejected credential was already replaced: callers get the new one.
    Replaced,
}

impl Next {
    fn describe(self) -> &'static str {
        match self {
            Self::Join => "joining the fetch running",
            Self::Fetch => "fetching a new credential",
            Self::BackingOff => {
                "the upstream is failing (backing off), serving the cached credential"
            }
            Self::Hold(_) => "a forced refresh ran recently, serving the cached credential",
            Self::Replaced => "serving the credential fetched since",
        }
    }
}

/// A re-ask's answer found under the entry's lock, without waiting: `Ok(None)` when this is
/// no re-ask (a first ask, a caller that says nothing of itself, nothing servable held), the
/// answer of a recent check about the same credential and server ([`super::CHECK_REUSE`]), or
/// the check to join or start.
pub(super) fn answer(
    st: &mut State,
    ask: &Ask<'_>,
    now: Instant,
) -> Result<Option<Answer>, CheckStep> {
    let (Some(caller), Some(fresh)) = (ask.caller.id, &st.current) else {
        return Ok(None);
    };
    if !fresh.servable(now) {
        return Ok(None);
    }
    let digest = fresh.digest;
    let memory = st.rejections.get_or_insert_default();
    match memory.reask(&caller, ask.caller.uid(), now, digest) {
        Reask::Held => {
            let about = CheckKey {
                credential: digest,
                cluster: ClusterDigest::of(ask.req.cluster.as_ref()),
            };
            match memory
                .recent_answer(now, &about, super::CHECK_REUSE)
                .cloned()
            {
                Some(answer) => Ok(Some(answer)),
                None => Err(match st.checking.iter().find(|(k, _)| *k == about) {
                    Some((_, running)) => CheckStep::Join(running.clone()),
                    None => CheckStep::Start(about),
                }),
            }
        }
        Reask::No | Reask::Superseded => Ok(None),
    }
}

impl Cache {
    /// Waits for a check slot for the caller's re-ask: at most [`CHECK_WAIT`], and only while its
    /// uid and the broker have room in the queue. Holds nothing while it waits but its place.
    /// Without a slot, the re-ask is answered "unreachable" (the credential held stays in
    /// service, as when its server cannot be asked), logged, and not counted as a check.
    pub(super) async fn check_slot(&self, ask: &Ask<'_>) -> Result<Permit, Answer> {
        let uid = ask.caller.uid();
        let why = match tokio::time::timeout(
            CHECK_WAIT,
            self.inner.checks.try_acquire(Purpose::Miss { uid }),
        )
        .await
        {
            Ok(Ok(permit)) => return Ok(permit),
            Ok(Err(full @ (Full::Uid(_) | Full::All(_)))) => full.to_string(),
            Err(_elapsed) => format!("every check slot stayed busy for {}s", CHECK_WAIT.as_secs()),
        };
        tracing::info!(
            provider = crate::base::text::quote(&ask.req.provider),
            cluster = crate::base::text::quote(&ask.req.cluster_label()),
            caller_pid = ask.caller.id.map(|c| c.pid),
            uid,
            why,
            "re-ask not checked: no check slot; serving the credential held"
        );
        Err(Answer::Unreachable(why))
    }

    /// Starts the check of `about` (the credential the entry holds, with the re-ask's
    /// server) holding `permit`, or joins the one another caller started while this one
    /// waited for its slot (the slot then goes back at once). `None` when the entry no longer
    /// holds that credential. The check runs in its own task, so it completes (and its answer
    /// is acted on once) whatever the callers waiting on it do; its [`CHECK_TIMEOUT`] counts
    /// from here, and only now are the request copied and the check's client and trust built.
    pub(super) fn start_check(
        &self,
        slot: &Arc<Slot>,
        ask: &Ask<'_>,
        about: CheckKey,
        permit: Permit,
    ) -> Option<PendingCheck> {
        let mut st = slot.lock();
        let now = Instant::now();
        let credential = match &st.current {
            Some(fresh) if fresh.digest == about.credential && fresh.servable(now) => {
                fresh.credential.clone()
            }
            _ => return None,
        };
        if let Some((_, running)) = st.checking.iter().find(|(k, _)| *k == about) {
            return Some(running.clone());
        }
        let caller = ask.caller.id?;
        let cache = Cache {
            inner: Arc::clone(&self.inner),
        };
        let slot = Arc::clone(slot);
        let owned = ask.owned();
        let task = tokio::spawn(async move {
            let check = (cache.inner.checker).check(owned.req.cluster.as_ref(), &credential);
            let answer = match tokio::time::timeout(CHECK_TIMEOUT, check).await {
                Ok(answer) => answer,
                Err(_elapsed) => {
                    Answer::Unreachable(format!("no answer within {}s", CHECK_TIMEOUT.as_secs()))
                }
            };
            drop(permit);
            let fetch = cache.checked(&slot, &owned.ask(), caller, about, &answer);
            (answer, fetch)
        });
        let joined: BoxFuture<'static, _> = Box::pin(async move {
            task.await
                .unwrap_or_else(|e| (Answer::Unreachable(format!("the check failed: {e}")), None))
        });
        let shared = joined.shared();
        st.checking.push((about, shared.clone()));
        Some(shared)
    }

    /// Acts on a check's answer once: a rejection (or a re-ask that cannot be checked) starts
    /// the forced refresh when the bounds allow; then logs it and reports it. Returns the
    /// fetch the re-askers are to join: the one it started, or one already running.
    fn checked(
        &self,
        slot: &Arc<Slot>,
        ask: &Ask<'_>,
        caller: CallerId,
        about: CheckKey,
        answer: &Answer,
    ) -> Option<Inflight> {
        let caller_pid = caller.pid;
        let req = ask.req;
        let (next, fetch) = {
            let mut guard = slot.lock();
            let st = &mut *guard;
            st.checking.retain(|(k, _)| *k != about);
            let now = Instant::now();
            let verdict = st
                .rejections
                .get_or_insert_default()
                .answered(now, about, answer, &caller);
            let holds = st
                .current
                .as_ref()
                .is_some_and(|f| f.digest == about.credential && f.servable(now));
            match verdict {
                None => (None, None),
                Some(_) if st.inflight.is_some() => (Some(Next::Join), st.inflight.clone()),
                Some(_) if !holds => (Some(Next::Replaced), None),
                Some(Verdict::Hold { next_in }) => (Some(Next::Hold(next_in)), None),
                Some(Verdict::Refresh) if st.retry_at.is_some_and(|at| now < at) => {
                    (Some(Next::BackingOff), None)
                }
                Some(Verdict::Refresh) => {
                    let fetch = self.start_fetch(slot, st, ask, None, false);
                    (Some(Next::Fetch), Some(fetch))
                }
            }
        };
        let provider_name = crate::base::text::quote(&req.provider);
        let cluster = crate::base::text::quote(&req.cluster_label());
        let server =
            crate::base::text::quote(req.cluster.as_ref().map_or("", |c| c.server.as_str()));
        let what = next.map(Next::describe).unwrap_or_default();
        let next_forced_refresh_in = match next {
            Some(Next::Hold(d)) => Some(d),
            _ => None,
        };
        match answer {
            Answer::Accepted(status) => tracing::debug!(
                provider = provider_name,
                cluster,
                caller_pid,
                status,
                "re-ask: the API server accepts the credential held (a second client in the same process); serving it"
            ),
            Answer::Rejected => tracing::warn!(
                provider = provider_name,
                cluster,
                server,
                caller_pid,
                ?next_forced_refresh_in,
                "rejection confirmed: the API server answered 401 to the credential the caller was served; {what}"
            ),
            Answer::Unreachable(why) => tracing::info!(
                provider = provider_name,
                cluster,
                server,
                caller_pid,
                why = crate::base::text::quote(why),
                "re-ask not checked: the API server could not be asked; serving the credential held (client-go cannot reach it either)"
            ),
            Answer::Unchecked(why) => tracing::warn!(
                provider = provider_name,
                cluster,
                caller_pid,
                why = crate::base::text::quote(why),
                ?next_forced_refresh_in,
                "re-ask taken as a rejection without a check; {what}"
            ),
        }
        if let Some(observer) = &self.inner.observer {
            observer.reask_checked(&req.provider, answer);
        }
        fetch
    }
}
