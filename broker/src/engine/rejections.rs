//! Re-asks and rejections: client-go runs an exec plugin again before the expiry it was given
//! after the API server answered 401 (client-go `plugin/pkg/client/auth/exec`,
//! `maybeRefreshCreds`), from the same process with the same exec config and cluster. So
//! does a process that builds a second authenticator for the same cluster: client-go caches
//! authenticators on the whole exec config and cluster, and two configs that differ in a field
//! the plugin never sees (an `env` list empty or absent) get two. So when the same caller asks
//! again for the same entry before the come-back time the broker gave it (a **re-ask**), the
//! credential it was served may have been rejected, or may be fine: the cache asks the
//! cluster's API server ([`crate::engine::review`]) and fetches anew only when the server answers
//! 401 (a **confirmed rejection**), or when the request cannot be checked at all.
//!
//! Each cache entry remembers the callers it served (at most [`MAX_CALLERS_PER_ENTRY`] per uid,
//! for at most [`MAX_UIDS_PER_ENTRY`] uids), the last answer of a check (for one server and
//! credential, [`CheckKey`]), and the bounds on refreshes forced by rejections: at most one per
//! [`FORCED_REFRESH_INTERVAL`], doubling while the credentials those refreshes get are
//! rejected again, up to [`MAX_FORCED_REFRESH_INTERVAL`]. A caller that sends no
//! [`CallerId`] (an older shim, grpcurl) is served exactly as before.

use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

use crate::engine::review::Answer;
use crate::providers::{Credential, CredentialSecret};
use crate::request::ClusterInfo;
use crate::request::caller::CallerId;

/// Callers remembered per entry and uid; past it the one of that uid served longest ago is
/// forgotten (it is then a new caller: served from the cache). Per uid, so a uid can push out
/// only its own callers: 16 made-up callers from one uid used to push a real caller of
/// another out of a shared entry, whose next re-ask then looked like a first ask and got the
/// revoked token with no check. One client-go process asks once per cluster, so an entry per
/// cluster (EKS, AKS, a file per cluster) has one or two; an identity shared by a fleet (one
/// GCP token for every GKE cluster) keeps the most recently served sixteen of each uid. About
/// 100 bytes each ([`RECORD_BYTES`]), allocated only for entries asked with a caller.
pub const MAX_CALLERS_PER_ENTRY: usize = 16;
/// Uids whose callers an entry remembers. A pod has one uid asking (Kueue's); a few more are
/// a node's other clients. A further uid's callers are not remembered while these eight have
/// callers inside their come-back time (they are served as new callers, as before this
/// existed): remembering them would mean forgetting another uid's. At most
/// 8 × 16 × [`RECORD_BYTES`], about 13 KiB an entry, counted in `cache.maxBytes`.
pub const MAX_UIDS_PER_ENTRY: usize = 8;
/// What one remembered caller costs on the heap.
pub const RECORD_BYTES: usize = std::mem::size_of::<Record>();
/// At most one forced refresh per entry per this long: a cluster whose RBAC is broken gets a
/// 401 for every credential, and Kueue retries a disconnected cluster every 5 s at first
/// (its backoff grows to 320 s); the 30 s from the issue that asked for this keeps that to a
/// few upstream calls per minute at worst.
pub const FORCED_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// While the credentials forced refreshes get are rejected again, the interval doubles up to
/// this: ten minutes keeps a broken cluster at six upstream calls an hour, and a credential
/// revoked once is replaced at the first re-ask anyway.
pub const MAX_FORCED_REFRESH_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// A caller asking within this long of its come-back time is on time, not re-asking: the
/// come-back time is a whole second, and the broker's wall clock and monotonic clock (which
/// this module measures with) may drift apart by a little between the answer and the next
/// call.
pub const COME_BACK_SLACK: Duration = Duration::from_secs(1);
/// A credential's SHA-256: compares what a caller was served with what a fetch got, without
/// keeping the secret twice. Debug shows only that it is one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CredentialDigest([u8; 32]);

impl CredentialDigest {
    pub fn of(credential: &Credential) -> Self {
        let mut h = Sha256::new();
        match &credential.secret {
            CredentialSecret::Token(t) => {
                h.update(b"token\0");
                h.update(t.expose().as_bytes());
            }
            CredentialSecret::ClientCertificate {
                certificate_pem,
                key_pem,
            } => {
                h.update(b"cert\0");
                h.update((certificate_pem.len() as u64).to_le_bytes());
                h.update(certificate_pem.as_bytes());
                h.update(key_pem.expose().as_bytes());
            }
        }
        Self(h.finalize().into())
    }
}

impl std::fmt::Debug for CredentialDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialDigest([redacted])")
    }
}

/// A SHA-256 of what decides where and how a check connects: the request's server, CA data,
/// `tls-server-name`, `insecure-skip-tls-verify` and `proxy-url` (or that it has no cluster).
/// Two re-asks share a check, or its answer, only when these agree: a check against another
/// server says nothing of this one (a victim's re-ask used to join a check another uid had
/// started against a server of its own, and took its "unreachable").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterDigest([u8; 32]);

impl ClusterDigest {
    pub fn of(cluster: Option<&ClusterInfo>) -> Self {
        let mut h = Sha256::new();
        match cluster {
            None => h.update(b"none\0"),
            Some(c) => {
                h.update(b"cluster\0");
                for field in [
                    c.server.as_bytes(),
                    c.certificate_authority_data.as_slice(),
                    c.tls_server_name.as_bytes(),
                    c.proxy_url.as_bytes(),
                ] {
                    h.update((field.len() as u64).to_le_bytes());
                    h.update(field);
                }
                h.update([u8::from(c.insecure_skip_tls_verify)]);
            }
        }
        Self(h.finalize().into())
    }
}

/// What a check is about: a credential, checked with one server as a request describes it.
/// The cache runs one check per key at a time and reuses an answer only for the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CheckKey {
    pub credential: CredentialDigest,
    pub cluster: ClusterDigest,
}

/// What a request from a known caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reask {
    /// Not a re-ask (a new caller, or on time): serve as usual.
    No,
    /// A re-ask about a credential the entry no longer holds (another caller's rejection or a
    /// refresh already replaced it): serve the current one, no check, no fetch.
    Superseded,
    /// A re-ask about what the entry holds: ask the API server before anything else.
    Held,
}

/// What to do about a rejection (confirmed, or a re-ask that could not be checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Fetch anew (or join the fetch running).
    Refresh,
    /// A forced refresh ran too recently: serve what is held (or join a fetch already
    /// running) and fetch again no sooner than `next_in`.
    Hold { next_in: Duration },
}

/// A caller (of a uid) and what it was last served.
#[derive(Debug, Clone, Copy)]
struct Record {
    uid: Option<u32>,
    caller: CallerId,
    come_back: Instant,
    credential: CredentialDigest,
}

/// Per entry: the callers served, the last check, and the state of the refreshes rejections
/// forced.
#[derive(Debug, Default)]
pub struct Memory {
    /// Oldest served first.
    callers: Vec<Record>,
    reasks: u64,
    last_reask: Option<SystemTime>,
    confirmed: u64,
    last_confirmed: Option<SystemTime>,
    /// The last check's answer, about what, and when it came.
    answered: Option<(Instant, CheckKey, Answer)>,
    /// When the last forced refresh started.
    forced_at: Option<Instant>,
    /// The credential the last forced refresh got.
    forced_got: Option<CredentialDigest>,
    /// Forced refreshes in a row whose credential was rejected in turn.
    streak: u32,
    /// The callers whose re-asks forced the refreshes of the streak: only their re-asks wait
    /// the doubled interval. Any other caller's first forced refresh waits the base interval,
    /// so a caller that forges re-asks (against a server of its own that answers 401) stretches
    /// only its own wait, never a genuine client's recovery. At most
    /// [`MAX_CALLERS_PER_ENTRY`], the oldest dropped.
    streak_callers: Vec<CallerId>,
    /// The rejected credential a forced refresh running now is to replace.
    pending: Option<CredentialDigest>,
    returned_rejected: bool,
}

/// What operators see of an entry's re-asks and rejections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RejectionInfo {
    /// Re-asks: a known caller asking again before its come-back time.
    pub reasks: u64,
    pub last_reask: Option<SystemTime>,
    /// Re-asks the API server answered 401 to (checks, not callers: several callers
    /// re-asking about one credential make one).
    pub confirmed: u64,
    pub last_confirmed: Option<SystemTime>,
    /// What the last check found.
    pub last_answer: Option<Answer>,
    /// The last forced refresh got back the very credential that was rejected.
    pub returned_rejected: bool,
}

impl Memory {
    /// The bytes it holds on the heap beside its own (what `cache.maxBytes` counts).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.callers.capacity() * std::mem::size_of::<Record>()
            + self.streak_callers.capacity() * std::mem::size_of::<CallerId>()
            + match &self.answered {
                Some((_, _, Answer::Unreachable(why) | Answer::Unchecked(why))) => why.len(),
                _ => 0,
            }
    }

    /// Judges a request from `caller`, connected as `uid`, while the entry holds `current`,
    /// counting a re-ask. Only a record of the same uid counts: a caller id claimed from
    /// another uid is another caller.
    pub fn reask(
        &mut self,
        caller: &CallerId,
        uid: Option<u32>,
        now: Instant,
        current: CredentialDigest,
    ) -> Reask {
        let Some(record) = self
            .callers
            .iter()
            .find(|r| r.caller == *caller && r.uid == uid)
        else {
            return Reask::No;
        };
        if now + COME_BACK_SLACK >= record.come_back {
            return Reask::No;
        }
        self.reasks = self.reasks.saturating_add(1);
        self.last_reask = Some(SystemTime::now());
        if record.credential != current {
            return Reask::Superseded;
        }
        Reask::Held
    }

    /// The last check's answer about `key` (the credential held, with this request's
    /// server), if it came within `reuse`: re-asks about the same credential and server right
    /// after a check take its answer instead of asking again.
    pub fn recent_answer(&self, now: Instant, key: &CheckKey, reuse: Duration) -> Option<&Answer> {
        match &self.answered {
            Some((at, about, answer)) if about == key && now < *at + reuse => Some(answer),
            _ => None,
        }
    }

    /// A check about `key` (the credential held, with one server), for `caller`'s re-ask,
    /// answered; for a rejection (or a re-ask that cannot be checked) says whether to fetch
    /// anew now, and when it does, starts the interval. The interval doubles with the streak
    /// only for the callers that forced it.
    pub fn answered(
        &mut self,
        now: Instant,
        key: CheckKey,
        answer: &Answer,
        caller: &CallerId,
    ) -> Option<Verdict> {
        let current = key.credential;
        self.answered = Some((now, key, answer.clone()));
        if *answer == Answer::Rejected {
            self.confirmed = self.confirmed.saturating_add(1);
            self.last_confirmed = Some(SystemTime::now());
        }
        if !answer.forces_refresh() {
            return None;
        }
        // The credential a forced refresh got is rejected again: back off further.
        let again = self.forced_got == Some(current);
        let streak = if again { self.streak } else { 0 };
        let own = again && self.streak_callers.contains(caller);
        if let Some(forced_at) = self.forced_at {
            let next = forced_at + interval(if own { streak } else { 0 });
            if now < next {
                return Some(Verdict::Hold {
                    next_in: next - now,
                });
            }
        }
        self.streak = if again { streak.saturating_add(1) } else { 0 };
        if !again {
            self.streak_callers.clear();
        }
        if !self.streak_callers.contains(caller) {
            if self.streak_callers.len() >= MAX_CALLERS_PER_ENTRY {
                self.streak_callers.remove(0);
            }
            self.streak_callers.push(*caller);
        }
        self.forced_at = Some(now);
        self.pending = Some(current);
        Some(Verdict::Refresh)
    }

    /// Remembers that `caller`, connected as `uid`, was served `credential` and told to come
    /// back at `come_back`. Past [`MAX_CALLERS_PER_ENTRY`] for that uid, its own caller served
    /// longest ago is forgotten; a uid beyond [`MAX_UIDS_PER_ENTRY`] is not remembered.
    pub fn served(
        &mut self,
        caller: CallerId,
        uid: Option<u32>,
        now: Instant,
        come_back: Instant,
        credential: CredentialDigest,
    ) {
        // Callers past their come-back time can no longer re-ask early: they go first.
        self.callers.retain(|r| {
            !(r.caller == caller && r.uid == uid) && now + COME_BACK_SLACK < r.come_back
        });
        let own = self.callers.iter().filter(|r| r.uid == uid).count();
        if own >= MAX_CALLERS_PER_ENTRY {
            if let Some(oldest) = self.callers.iter().position(|r| r.uid == uid) {
                self.callers.remove(oldest);
            }
        } else if own == 0 {
            let mut uids: Vec<Option<u32>> = self.callers.iter().map(|r| r.uid).collect();
            uids.sort_unstable();
            uids.dedup();
            if uids.len() >= MAX_UIDS_PER_ENTRY {
                return;
            }
        }
        if self.callers.is_empty() {
            self.callers.reserve_exact(1);
        }
        self.callers.push(Record {
            uid,
            caller,
            come_back,
            credential,
        });
    }

    /// A fetch for the entry got `credential`. Returns, for a forced refresh, whether it got
    /// back the very credential that was rejected.
    pub fn fetched(&mut self, credential: CredentialDigest) -> Option<bool> {
        let Some(rejected) = self.pending.take() else {
            if self.forced_got != Some(credential) {
                self.returned_rejected = false;
            }
            return None;
        };
        self.forced_got = Some(credential);
        self.returned_rejected = credential == rejected;
        Some(self.returned_rejected)
    }

    /// A fetch for the entry failed: a forced refresh among them is over (its interval
    /// stands).
    pub fn failed(&mut self) {
        self.pending = None;
    }

    pub fn info(&self) -> RejectionInfo {
        RejectionInfo {
            reasks: self.reasks,
            last_reask: self.last_reask,
            confirmed: self.confirmed,
            last_confirmed: self.last_confirmed,
            last_answer: self.answered.as_ref().map(|(_, _, a)| a.clone()),
            returned_rejected: self.returned_rejected,
        }
    }

    #[cfg(test)]
    fn callers(&self) -> Vec<CallerId> {
        self.callers.iter().map(|r| r.caller).collect()
    }

    #[cfg(test)]
    fn callers_of(&self, uid: Option<u32>) -> Vec<CallerId> {
        self.callers
            .iter()
            .filter(|r| r.uid == uid)
            .map(|r| r.caller)
            .collect()
    }
}

/// The wait after a forced refresh when `streak` forced refreshes in a row got credentials
/// that were rejected in turn.
fn interval(streak: u32) -> Duration {
    FORCED_REFRESH_INTERVAL
        .saturating_mul(1 << streak.min(16))
        .min(MAX_FORCED_REFRESH_INTERVAL)
}

#[cfg(test)]
mod tests;
