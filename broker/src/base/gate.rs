//! A provider's upstream permits (`cache.maxConcurrentFetches`), shared so that no kind of
//! caller can starve another: a reserve only refreshes of held credentials may take, and the
//! rest handed out fairly between the uids whose misses wait for them.
//!
//! Why: misses, background refreshes and AdminService refreshes used to take permits first
//! come, first served. 64 misses whose plugin hung until its timeout made a legitimate
//! new-cluster miss wait 19.4 s, ~100 of them pushed it past the shim's 30 s, and held
//! credentials could not be refreshed meanwhile. Now:
//!
//! - a refresh of an entry that holds a credential may take any permit; a miss only one of the
//!   permits outside the reserve ([`reserve_of`]), so however many misses hang, held entries
//!   keep being refreshed;
//! - when a permit frees, refreshes waiting go first (oldest first), then the miss of the uid
//!   holding the fewest permits (oldest first among equals). A uid flooding misses holds what
//!   it holds, but another uid's miss gets the next permit that frees: it waits at most one
//!   upstream call (its timeout), not the flood's whole queue. Within one uid, misses are
//!   served in arrival order.
//!
//! Nothing is preempted and no permit is idle while anyone waits for one it may take, so a
//! lone caller (a Kueue cold start) still gets every permit outside the reserve.
//!
//! The cache's re-ask check slots are a gate too ([`Gate::for_checks`]): no reserve, the same
//! fair share between uids, and besides it a cap on the slots one uid may hold
//! ([`Bounds::per_uid`]) and on the checks that may wait ([`Gate::try_acquire`]), per uid and
//! in all. Why: one allowed uid re-asking about 1 300 entries (calls cancelled after 0.1 s)
//! held all 16 slots, so another uid's re-ask, whose API server answers in 200 ms, waited the
//! whole 5 s of its check for a slot and got the revoked token back, 3 times out of 3.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// The permits only refreshes of held credentials may take: an eighth of the gate (at least
/// one once there are two). Refreshes are rare next to a cold start's misses (1 000 clusters
/// with 15-minute tokens refresh about 2.4 times a second, 0.6 permits busy at 250 ms a call),
/// so 2 of the default 16 keep them flowing, while a cold start keeps 14 (1 000 clusters at
/// 250 ms a call: about 18 s, inside the shim's 30 s).
pub fn reserve_of(permits: usize) -> usize {
    match permits {
        0 | 1 => 0,
        n => (n / 8).max(1),
    }
}

/// How a gate bounds its callers besides its permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Permits the waiters of one uid ([`Purpose::Miss`]) may hold at once.
    pub per_uid: usize,
    /// Waiters of one uid [`Gate::try_acquire`] lets queue; past it, it refuses at once.
    pub waiting_per_uid: usize,
    /// Waiters [`Gate::try_acquire`] lets queue in all.
    pub waiting: usize,
}

impl Bounds {
    /// No bound but the permits (the upstream fetch gate: its waiters are bounded by the
    /// upstream timeout and by the callers, each waiting on its own call).
    pub const NONE: Self = Self {
        per_uid: usize::MAX,
        waiting_per_uid: usize::MAX,
        waiting: usize::MAX,
    };
}

/// Why [`Gate::try_acquire`] refused to queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error("{0} checks of this caller's uid are already waiting for a slot (its bound)")]
    Uid(usize),
    #[error("{0} checks are already waiting for a slot (the broker's bound)")]
    All(usize),
}

/// What a fetch is for, which decides the permits it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The entry holds a credential (refresh ahead, a changed source, a forced refresh, an
    /// operator's refresh): any permit.
    Refresh,
    /// The entry holds none: a permit outside the reserve, shared fairly between uids
    /// (`None`: no caller, e.g. an operator's refresh of a failed entry).
    Miss { uid: Option<u32> },
}

/// One provider's permits.
#[derive(Debug, Clone)]
pub struct Gate {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    permits: usize,
    reserve: usize,
    bounds: Bounds,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    in_use: usize,
    misses_in_use: usize,
    /// Miss permits held, per uid (entries at zero are removed).
    held: HashMap<Option<u32>, usize>,
    waiting: Vec<Waiter>,
    next_seq: u64,
}

#[derive(Debug)]
struct Waiter {
    seq: u64,
    purpose: Purpose,
    grant: oneshot::Sender<Permit>,
}

/// A permit; given back when dropped.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    purpose: Purpose,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let granted = {
            let mut st = self.shared.lock();
            st.take_back(self.purpose);
            self.shared.grant_waiting(&mut st)
        };
        // Outside the lock: a grant whose waiter has just gone comes back here as a dropped
        // permit, and is given back in turn.
        self.shared.send(granted);
    }
}

impl Gate {
    /// A gate of `permits` (at least one).
    pub fn new(permits: usize) -> Self {
        let permits = permits.max(1);
        Self::with(permits, reserve_of(permits), Bounds::NONE)
    }

    /// The re-ask check slots: `slots` (at least one), no reserve, every check a
    /// [`Purpose::Miss`] of its caller's uid. One uid holds at most all but an eighth of them
    /// (as [`reserve_of`] counts it), so while a single uid keeps checks running, another
    /// uid's check starts at once; the waiting is bounded by `waiting` (its `per_uid` is
    /// ignored: that cap is this one).
    pub fn for_checks(slots: usize, waiting: Bounds) -> Self {
        let slots = slots.max(1);
        Self::with(
            slots,
            0,
            Bounds {
                per_uid: slots - reserve_of(slots),
                ..waiting
            },
        )
    }

    fn with(permits: usize, reserve: usize, bounds: Bounds) -> Self {
        Self {
            shared: Arc::new(Shared {
                permits,
                reserve,
                bounds: Bounds {
                    per_uid: bounds.per_uid.max(1),
                    ..bounds
                },
                state: Mutex::default(),
            }),
        }
    }

    /// Waits for a permit `purpose` may take, however many wait already. Cancel-safe: a
    /// waiter dropped before its grant leaves the queue, and a grant it never received is
    /// given back.
    pub async fn acquire(&self, purpose: Purpose) -> Permit {
        match self.enter(purpose, false) {
            Ok(permit) => permit.await,
            Err(_) => unreachable!("an entry that ignores the waiting bounds is never refused"),
        }
    }

    /// [`Gate::acquire`] within the waiting bounds: refused at once, without queueing, when
    /// `purpose`'s uid already has [`Bounds::waiting_per_uid`] waiters queued or the gate
    /// [`Bounds::waiting`]. A waiter holds its place in the queue and nothing else.
    pub async fn try_acquire(&self, purpose: Purpose) -> Result<Permit, Full> {
        Ok(self.enter(purpose, true)?.await)
    }

    /// Takes a permit now, or queues (checking the waiting bounds when `bounded`) and returns
    /// the wait for it.
    fn enter(
        &self,
        purpose: Purpose,
        bounded: bool,
    ) -> Result<impl std::future::Future<Output = Permit> + '_, Full> {
        let (rx, seq) = {
            let mut st = self.shared.lock();
            if st.waiting.is_empty() && self.shared.may_take(&st, purpose) {
                st.give(purpose);
                let permit = Permit {
                    shared: Arc::clone(&self.shared),
                    purpose,
                };
                return Ok(futures_util::future::Either::Left(std::future::ready(
                    permit,
                )));
            }
            if bounded {
                self.shared.room_to_wait(&mut st, purpose)?;
            }
            let (grant, rx) = oneshot::channel();
            let seq = st.next_seq;
            st.next_seq += 1;
            st.waiting.push(Waiter {
                seq,
                purpose,
                grant,
            });
            // Another kind may have room although waiters are queued (a refresh past misses
            // waiting for a permit outside the reserve).
            let granted = self.shared.grant_waiting(&mut st);
            drop(st);
            self.shared.send(granted);
            (rx, seq)
        };
        let queued = Queued {
            shared: &self.shared,
            seq,
        };
        Ok(futures_util::future::Either::Right(async move {
            // The whole guard moves in (a closure would capture only the field it names).
            let mut queued = queued;
            let permit = rx.await;
            queued.seq = u64::MAX;
            match permit {
                Ok(permit) => permit,
                // The sender lives in the queue until it sends; the gate outlives this future.
                Err(_) => unreachable!("a queued waiter's sender is dropped only after it sent"),
            }
        }))
    }

    /// Permits held now: (all, by misses).
    pub fn in_use(&self) -> (usize, usize) {
        let st = self.shared.lock();
        (st.in_use, st.misses_in_use)
    }
}

/// A waiter's place in the queue, removed if its future is dropped first.
struct Queued<'a> {
    shared: &'a Shared,
    seq: u64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.seq != u64::MAX {
            self.shared.lock().waiting.retain(|w| w.seq != self.seq);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Counts are updated together before anything can panic: keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn may_take(&self, st: &State, purpose: Purpose) -> bool {
        st.in_use < self.permits
            && match purpose {
                Purpose::Refresh => true,
                Purpose::Miss { uid } => {
                    st.misses_in_use < self.permits - self.reserve
                        && st.held.get(&uid).copied().unwrap_or(0) < self.bounds.per_uid
                }
            }
    }

    /// Whether one more waiter of `purpose`'s uid may queue: waiters that gave up are
    /// cleared first, so only live ones count.
    fn room_to_wait(&self, st: &mut State, purpose: Purpose) -> Result<(), Full> {
        st.waiting.retain(|w| !w.grant.is_closed());
        if st.waiting.len() >= self.bounds.waiting {
            return Err(Full::All(st.waiting.len()));
        }
        let uid = match purpose {
            Purpose::Miss { uid } => Some(uid),
            Purpose::Refresh => None,
        };
        let own = st
            .waiting
            .iter()
            .filter(|w| matches!(w.purpose, Purpose::Miss { uid: u } if Some(u) == uid))
            .count();
        if uid.is_some() && own >= self.bounds.waiting_per_uid {
            return Err(Full::Uid(own));
        }
        Ok(())
    }

    /// Takes the waiters to grant now, best first, counting their permits as given.
    fn grant_waiting(&self, st: &mut State) -> Vec<(oneshot::Sender<Permit>, Purpose)> {
        let mut granted = Vec::new();
        loop {
            st.waiting.retain(|w| !w.grant.is_closed());
            let best = st
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, w)| self.may_take(st, w.purpose))
                .min_by_key(|(_, w)| match w.purpose {
                    Purpose::Refresh => (0, 0, w.seq),
                    Purpose::Miss { uid } => (1, st.held.get(&uid).copied().unwrap_or(0), w.seq),
                })
                .map(|(i, _)| i);
            let Some(i) = best else { break };
            let waiter = st.waiting.remove(i);
            st.give(waiter.purpose);
            granted.push((waiter.grant, waiter.purpose));
        }
        granted
    }

    fn send(self: &Arc<Self>, granted: Vec<(oneshot::Sender<Permit>, Purpose)>) {
        for (grant, purpose) in granted {
            // A waiter gone since: the permit comes back, dropped (given back).
            let _ = grant.send(Permit {
                shared: Arc::clone(self),
                purpose,
            });
        }
    }
}

impl State {
    fn give(&mut self, purpose: Purpose) {
        self.in_use += 1;
        if let Purpose::Miss { uid } = purpose {
            self.misses_in_use += 1;
            *self.held.entry(uid).or_default() += 1;
        }
    }

    fn take_back(&mut self, purpose: Purpose) {
        self.in_use -= 1;
        if let Purpose::Miss { uid } = purpose {
            self.misses_in_use -= 1;
            if let Some(n) = self.held.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(&uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MISS_A: Purpose = Purpose::Miss { uid: Some(1) };
    const MISS_B: Purpose = Purpose::Miss { uid: Some(2) };

    /// Polls `fut` once on paused time: `Some` if it is ready at once.
    async fn now<T>(fut: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::time::timeout(Duration::from_millis(1), fut)
            .await
            .ok()
    }

    #[test]
    fn the_reserve_is_an_eighth_and_never_the_whole_gate() {
        let reserves: Vec<usize> = [1, 2, 7, 8, 16, 17, 4096].map(reserve_of).to_vec();
        assert_eq!(reserves, [0, 1, 1, 1, 2, 2, 512]);
    }

    #[tokio::test(start_paused = true)]
    async fn misses_never_take_the_reserve_and_refreshes_get_it() {
        let gate = Gate::new(16);
        let mut misses = Vec::new();
        for _ in 0..14 {
            misses.push(now(gate.acquire(MISS_A)).await.expect("a free permit"));
        }
        assert!(now(gate.acquire(MISS_A)).await.is_none(), "the reserve");
        assert!(now(gate.acquire(MISS_B)).await.is_none(), "for every uid");
        let r1 = now(gate.acquire(Purpose::Refresh)).await.expect("reserve");
        let _r2 = now(gate.acquire(Purpose::Refresh)).await.expect("reserve");
        assert_eq!(gate.in_use(), (16, 14));
        // Full: a refresh waits, and goes before every miss once a permit frees.
        let waiting_miss = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(MISS_B).await }
        });
        let waiting_refresh = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(Purpose::Refresh).await }
        });
        tokio::task::yield_now().await;
        drop(misses.pop());
        let _r3 = waiting_refresh.await.unwrap();
        assert!(!waiting_miss.is_finished());
        // A refresh's permit frees: the miss takes it, being the 14th miss.
        drop(r1);
        let _m = waiting_miss.await.unwrap();
        assert_eq!(gate.in_use(), (16, 14));
    }

    /// Red-team finding (issue 20, item 5): misses took permits first come, first served, so
    /// one caller's hanging misses queued another's behind all of them. Now the uid holding
    /// fewer permits gets the next one that frees.
    #[tokio::test(start_paused = true)]
    async fn a_free_permit_goes_to_the_uid_holding_fewest() {
        let gate = Gate::new(16);
        let mut held: Vec<Permit> = Vec::new();
        for _ in 0..14 {
            held.push(gate.acquire(MISS_A).await);
        }
        // 50 more of A's misses queue, then one of B's.
        let mut a_waiting = Vec::new();
        for _ in 0..50 {
            let gate = gate.clone();
            a_waiting.push(tokio::spawn(async move { gate.acquire(MISS_A).await }));
        }
        tokio::task::yield_now().await;
        let b = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(MISS_B).await }
        });
        tokio::task::yield_now().await;
        drop(held.pop());
        let b_permit = tokio::time::timeout(Duration::from_millis(1), b)
            .await
            .expect("B's miss gets the first permit freed")
            .unwrap();
        assert!(a_waiting.iter().all(|t| !t.is_finished()));
        // Back to A's, oldest first, as permits free.
        drop(b_permit);
        tokio::task::yield_now().await;
        assert!(a_waiting[0].is_finished());
        assert!(a_waiting[1..].iter().all(|t| !t.is_finished()));
        for t in a_waiting {
            t.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_holds_nothing() {
        let gate = Gate::new(1);
        let held = gate.acquire(MISS_A).await;
        assert!(now(gate.acquire(MISS_B)).await.is_none());
        assert!(gate.shared.lock().waiting.is_empty(), "left the queue");
        // Granted, then dropped before it ran: the permit comes back.
        let late = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(MISS_B).await }
        });
        tokio::task::yield_now().await;
        drop(held);
        late.abort();
        let _ = late.await;
        assert_eq!(gate.in_use(), (0, 0));
        assert!(now(gate.acquire(MISS_A)).await.is_some());
    }
}
