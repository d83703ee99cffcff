//! The table of entries: every entry filed under what it holds ([`Class`]), how many of each
//! class and what they weigh together, kept in step under one lock, and the evictions that
//! keep `cache.maxEntries`, [`MAX_REMEMBERED_FAILURES`] and `cache.maxBytes`. Lock order: the
//! table, then an entry; never an entry, then the table.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::entry::{Class, Slot};
use super::{CacheKey, Inner, MAX_REMEMBERED_FAILURES};
use crate::base::gate::Gate;

pub(super) struct Placed {
    pub(super) class: Class,
    pub(super) slot: Arc<Slot>,
    /// [`State::weight`] when last weighed.
    pub(super) weight: usize,
}

/// Every entry, and how many of each class, kept in step under one lock.
#[derive(Default)]
pub(super) struct Table {
    pub(super) slots: HashMap<CacheKey, Placed>,
    pub(super) counts: [usize; Class::ALL],
    /// The sum of the entries' weights.
    pub(super) bytes: usize,
    /// Per [`Bound`], what the last scan chose to drop next, the best last.
    victims: [Vec<Victim>; 2],
    /// Scans made, for the tests that hold them to one per [`VICTIMS_PER_SCAN`] evictions.
    #[cfg(test)]
    pub(super) scans: usize,
}

/// Entries one scan ranks for eviction. A scan visits every entry under the table's lock;
/// 64 of them keep that to one scan per 64 entries dropped, and the choice stays close to
/// exact: an entry asked for since the scan is skipped, and a scan is at most 64 evictions
/// old.
const VICTIMS_PER_SCAN: usize = 64;

/// The bound an eviction keeps.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// `cache.maxBytes`: any entry but a first fetch running.
    Bytes = 0,
    /// `cache.maxEntries`: entries that hold a credential.
    Held = 1,
}

impl Bound {
    fn drops(self, class: Class) -> bool {
        match self {
            Bound::Bytes => class != Class::Pending,
            Bound::Held => class == Class::Held,
        }
    }
}

/// An entry a scan chose, as it saw it.
struct Victim {
    key: CacheKey,
    class: Class,
    asked: Option<Instant>,
}

impl Table {
    pub(super) fn remove(&mut self, key: &CacheKey) -> Option<Placed> {
        let placed = self.slots.remove(key)?;
        self.counts[placed.class.index()] -= 1;
        self.bytes -= placed.weight;
        Some(placed)
    }

    /// Weighs the entry at `key` again.
    pub(super) fn reweigh(&mut self, key: &CacheKey, weight: usize) {
        if let Some(placed) = self.slots.get_mut(key) {
            self.bytes = self.bytes - placed.weight + weight;
            placed.weight = weight;
        }
    }

    /// Makes room under `cache.maxBytes`: forgets remembered failures, then drops credentials
    /// that can no longer be served, then the least recently used ones; never an entry that is
    /// fetching (its callers wait on it) and never `keep` (what just came in).
    pub(super) fn evict_bytes(&mut self, max: u64, keep: Option<&CacheKey>, now: Instant) {
        while u64::try_from(self.bytes).unwrap_or(u64::MAX) > max {
            let Some(victim) = self.victim(Bound::Bytes, keep, now) else {
                return;
            };
            self.remove(&victim);
        }
    }

    /// Makes room after a credential came in: drops the least recently used entry that holds
    /// one and is not fetching, those that can no longer be served first. Never `keep`.
    pub(super) fn evict_held(&mut self, max: u64, keep: &CacheKey, now: Instant) {
        while u64::try_from(self.counts[Class::Held.index()]).unwrap_or(u64::MAX) > max {
            let Some(victim) = self.victim(Bound::Held, Some(keep), now) else {
                return;
            };
            self.remove(&victim);
        }
    }

    /// The next entry to drop for `bound`: the best-ranked of the last scan's
    /// [`VICTIMS_PER_SCAN`] still as the scan saw it (there, of the same class, not fetching,
    /// not asked since), or the best of a new scan. One scan of the table per that many
    /// evictions: at the bound, a scan per new entry cost 0.3 ms under the table's lock at
    /// 3 000 entries, so every new cluster of a caller at `maxBytes` made every hit wait.
    fn victim(&mut self, bound: Bound, keep: Option<&CacheKey>, now: Instant) -> Option<CacheKey> {
        let mut scanned = false;
        loop {
            let Some(candidate) = self.victims[bound as usize].pop() else {
                if scanned {
                    return None;
                }
                scanned = true;
                self.victims[bound as usize] = self.scan(bound, keep, now);
                continue;
            };
            let Victim { key, class, asked } = candidate;
            if Some(&key) == keep {
                continue;
            }
            let Some(placed) = self.slots.get(&key) else {
                continue;
            };
            if placed.class != class {
                continue;
            }
            let st = placed.slot.lock();
            if st.inflight.is_none() && st.last_access == asked {
                drop(st);
                return Some(key);
            }
        }
    }

    /// Up to [`VICTIMS_PER_SCAN`] entries `bound` may drop, the best to drop last: remembered
    /// failures first (for `maxBytes`), then those that can no longer be served, then the
    /// least recently used.
    fn scan(&mut self, bound: Bound, keep: Option<&CacheKey>, now: Instant) -> Vec<Victim> {
        #[cfg(test)]
        {
            self.scans += 1;
        }
        let mut found: Vec<_> = self
            .slots
            .iter()
            .filter(|(key, placed)| bound.drops(placed.class) && Some(*key) != keep)
            .filter_map(|(key, placed)| {
                let st = placed.slot.lock();
                let servable = st.current.as_ref().is_some_and(|f| f.servable(now));
                let rank = (placed.class == Class::Held, servable, st.last_access);
                st.inflight
                    .is_none()
                    .then_some((rank, key, placed.class, st.last_access))
            })
            .collect();
        if found.len() > VICTIMS_PER_SCAN {
            found.select_nth_unstable_by_key(VICTIMS_PER_SCAN, |(rank, ..)| *rank);
            found.truncate(VICTIMS_PER_SCAN);
        }
        // Best last: `pop` takes it.
        found.sort_unstable_by_key(|(rank, ..)| std::cmp::Reverse(*rank));
        found
            .into_iter()
            .map(|(_, key, class, asked)| Victim {
                key: key.clone(),
                class,
                asked,
            })
            .collect()
    }

    /// Forgets the least recently asked quarter of the remembered failures once there are
    /// more than [`MAX_REMEMBERED_FAILURES`] (a batch, so a flood of failures costs one scan
    /// per quarter of the bound).
    pub(super) fn evict_failed(&mut self) {
        if self.counts[Class::Failed.index()] <= MAX_REMEMBERED_FAILURES {
            return;
        }
        let mut failed: Vec<(Option<Instant>, CacheKey)> = self
            .slots
            .iter()
            .filter(|(_, placed)| placed.class == Class::Failed)
            .filter_map(|(key, placed)| {
                let st = placed.slot.lock();
                st.inflight.is_none().then(|| (st.last_access, key.clone()))
            })
            .collect();
        failed.sort_unstable_by_key(|(at, _)| *at);
        let excess = self.counts[Class::Failed.index()] - MAX_REMEMBERED_FAILURES * 3 / 4;
        for (_, key) in failed.into_iter().take(excess) {
            self.remove(&key);
        }
    }
}

impl Inner {
    pub(super) fn table(&self) -> MutexGuard<'_, Table> {
        // Every operation leaves the table consistent before it can panic (the counts are
        // updated with the map), so keep serving.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry for `key` and its class, if any.
    pub(super) fn slot(&self, key: &CacheKey) -> Option<(Arc<Slot>, Class)> {
        let table = self.table();
        let placed = table.slots.get(key)?;
        Some((Arc::clone(&placed.slot), placed.class))
    }

    /// The entry for `key`, created empty (its first fetch is about to start) if missing.
    pub(super) fn slot_for(&self, key: &CacheKey) -> (Arc<Slot>, Class) {
        let mut table = self.table();
        if let Some(placed) = table.slots.get(key) {
            return (Arc::clone(&placed.slot), placed.class);
        }
        let slot = Arc::new(Slot::default());
        let weight = slot.lock().weight(key);
        table.counts[Class::Pending.index()] += 1;
        table.bytes += weight;
        table.slots.insert(
            key.clone(),
            Placed {
                class: Class::Pending,
                slot: Arc::clone(&slot),
                weight,
            },
        );
        (slot, Class::Pending)
    }

    /// Files the entry under what it now holds, then applies the bounds. A slot that has
    /// meanwhile been dropped or replaced (invalidated, evicted) is left alone.
    pub(super) fn reclassify(&self, key: &CacheKey, slot: &Arc<Slot>) {
        let mut table = self.table();
        let Some(placed) = table.slots.get_mut(key) else {
            return;
        };
        if !Arc::ptr_eq(&placed.slot, slot) {
            return;
        }
        let (was, now, weight) = {
            let st = slot.lock();
            (placed.class, st.class(), st.weight(key))
        };
        placed.class = now;
        table.counts[was.index()] -= 1;
        table.counts[now.index()] += 1;
        table.reweigh(key, weight);
        let at = Instant::now();
        if now == Class::Held {
            table.evict_held(self.settings.max_entries, key, at);
        }
        table.evict_failed();
        table.evict_bytes(self.settings.max_bytes, Some(key), at);
    }

    /// The provider's gate, created with `maxConcurrentFetches` permits on first use.
    pub(super) fn gate(&self, provider: &Arc<str>) -> Gate {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates
            .entry(Arc::clone(provider))
            .or_insert_with(|| Gate::new(self.settings.max_concurrent_fetches))
            .clone()
    }
}
