//! Python's side of the one L1 (`feature_store.serving.l1.native_cache.NativeCache`): the
//! entries Python's loads store (a form's first lookups, the warm start, a miss a front
//! could not load), views of any entry for Python's answers and policy, and what Python's
//! policy changes (invalidations, missed notices, batch writes, shadow checks). An entry a
//! front loaded and one Python stored live in the same table, under the same bounds and
//! the same eviction; only who refreshes it differs (`Hit::own`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use once_cell::race::OnceBox;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::bounds::evict;
use super::entry::{cost_seconds, cost_units, Held, Hit, BATCH_NOTICE, NOT_WRITTEN, OUTDATED};
use super::{Hits, Key, Set};

/// One entry Python stores (`HitCache::put_many`): its key (group index, 2 bytes
/// big-endian, then the Redis key), packed values (None: negative), values JSON and gRPC
/// records (None: not made yet), present pattern, write time, the seconds it stays fresh
/// and from which it is noted for Python's refresh policy, the seconds since it was read
/// from Redis, and how long that read took.
pub(super) type PutItem<'py> = (
    Bound<'py, PyBytes>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
    Option<i64>,
    f64,
    f64,
    f64,
    f64,
);

/// An entry as Python sees it (`HitCache::entry`): packed values (None: negative, or a
/// fault), values JSON and gRPC records (None: not made), present pattern, write time,
/// seconds to its expiry (negative: expired that long), seconds since it was read, its
/// load's seconds, the fault's text (None: none), whether a shadow check was drawn for it,
/// and whether a front loaded it.
pub(super) type View<'py> = (
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
    Option<i64>,
    f64,
    f64,
    f64,
    Option<Bound<'py, PyBytes>>,
    bool,
    bool,
);

/// A held bytes as a Python object: Python's own object again, or a copy of the entry's.
fn object<'py>(py: Python<'py>, held: &Held) -> Bound<'py, PyBytes> {
    match held {
        Held::Python(object) => object.bind(py).clone(),
        Held::Own(bytes) => PyBytes::new(py, bytes),
    }
}

/// Signed seconds from `from` to `to` (both `Hits::ticks`).
fn seconds_between(from: u64, to: u64) -> f64 {
    if to >= from {
        (to - from) as f64 / 1e9
    } else {
        -((from - to) as f64 / 1e9)
    }
}

impl Hits {
    /// `Hits::ticks` of `seconds` from `now` (negative: before it).
    fn ticks_after(&self, now: Instant, seconds: f64) -> u64 {
        if seconds >= 0.0 {
            self.ticks(now + crate::time::seconds(seconds))
        } else {
            self.ticks(
                now.checked_sub(crate::time::seconds(-seconds))
                    .unwrap_or(self.base),
            )
        }
    }

    /// Store entries Python loaded, under one lock (a round trip's), then evict past the
    /// bounds: the entries replaced and evicted (released by the caller, with the GIL),
    /// and how many were evicted.
    pub(super) fn put_python(&self, items: Vec<PutItem<'_>>) -> (Vec<Hit>, u64) {
        let now = Instant::now();
        let compact = self.compact;
        let hits: Vec<(Key, Hit)> = items
            .into_iter()
            .map(
                |(key, raw, json, wire, present, written_at, ttl, notice_in, ago, cost)| {
                    let negative = raw.is_none();
                    let held = |b: &Option<Bound<'_, PyBytes>>| b.as_ref().map(Held::new);
                    let (values, wire, raw) = if compact {
                        // a compact entry's values are its packed ones (none: negative)
                        let values = held(&raw).unwrap_or_else(|| Held::Own(Box::default()));
                        (Some(values), None, None)
                    } else {
                        (held(&json), held(&wire), held(&raw))
                    };
                    let hit = Hit {
                        values,
                        wire,
                        raw,
                        present: Held::new(&present),
                        written: written_at.unwrap_or(NOT_WRITTEN),
                        negative,
                        fault: false,
                        expires: self.ticks_after(now, ttl),
                        loaded: self.ticks_after(now, -ago),
                        notice_at: self.ticks_after(now, notice_in.min(ttl)),
                        noticed: AtomicBool::new(false),
                        visited: AtomicBool::new(false),
                        shadowed: AtomicBool::new(false),
                        ends: OnceBox::new(),
                        cost: cost_units(cost),
                    };
                    (Key::new(key.as_bytes()), hit)
                },
            )
            .collect();
        self.store(hits)
    }

    /// Store `hits` (replacing the keys' entries), then evict past the bounds.
    fn store(&self, hits: Vec<(Key, Hit)>) -> (Vec<Hit>, u64) {
        let mut old = Vec::with_capacity(hits.len());
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        for (key, hit) in hits {
            // an entry of the key's replaced in place: its key is in the ring already
            let replaced = match entries.get_mut(key.as_slice()) {
                Some(slot) => Some(std::mem::replace(slot, hit)),
                None => {
                    entries.insert(key.clone(), hit);
                    None
                }
            };
            if let Some(replaced) = &replaced {
                owned.remove(&key, replaced);
            }
            if let Some(hit) = entries.get(key.as_slice()) {
                owned.add(&key, hit, replaced.is_some());
            }
            old.extend(replaced);
        }
        let mut evicted = evict(&mut entries, &mut owned, &self.flights);
        let count = evicted.len() as u64;
        old.append(&mut evicted);
        (old, count)
    }

    /// Python found the data of the entity at `key` broken (`fault`: the reason and the
    /// message Python answers it with) and keeps that for `ttl` seconds: the fronts hand its
    /// lookups to Python (which answers the fault) instead of loading it again.
    pub(super) fn put_fault(&self, key: &[u8], ttl: f64, fault: &Bound<'_, PyBytes>) -> Vec<Hit> {
        let now = Instant::now();
        let expires = self.ticks_after(now, ttl);
        let hit = Hit {
            values: None,
            wire: None,
            raw: Some(Held::new(fault)),
            present: Held::Own(Box::default()),
            written: NOT_WRITTEN,
            negative: true,
            fault: true,
            expires,
            loaded: self.ticks(now),
            notice_at: expires,
            noticed: AtomicBool::new(false),
            visited: AtomicBool::new(false),
            shadowed: AtomicBool::new(false),
            ends: OnceBox::new(),
            cost: 0,
        };
        self.store(vec![(Key::new(key), hit)]).0
    }

    /// The entry of `key` as Python sees it (see `View`); `touch`: a hit, which gives it
    /// the eviction's second chance.
    pub(super) fn view<'py>(&self, py: Python<'py>, key: &[u8], touch: bool) -> Option<View<'py>> {
        let now = self.ticks(Instant::now());
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let hit = entries.get(key)?;
        if touch && !hit.visited.load(Ordering::Relaxed) {
            hit.visited.store(true, Ordering::Relaxed);
        }
        let bytes = |held: &Option<Held>| held.as_ref().map(|h| object(py, h));
        let (raw, json, wire, fault) = if hit.fault {
            (None, None, None, bytes(&hit.raw))
        } else if hit.negative {
            let json = if self.compact {
                None
            } else {
                bytes(&hit.values)
            };
            (None, json, bytes(&hit.wire), None)
        } else if self.compact {
            (bytes(&hit.values), None, None, None)
        } else {
            (bytes(&hit.raw), bytes(&hit.values), bytes(&hit.wire), None)
        };
        if raw.is_none() && !hit.negative {
            return None; // an entry only a front answers from (none is stored: `Hit::thin`)
        }
        Some((
            raw,
            json,
            wire,
            object(py, &hit.present),
            hit.written_at(),
            seconds_between(now, hit.expires),
            seconds_between(hit.loaded, now),
            cost_seconds(hit.cost),
            fault,
            hit.shadowed.load(Ordering::Relaxed),
            hit.own(),
        ))
    }

    /// The answer bytes an entry of `key` was made without, made by Python on first use
    /// (its values JSON, its gRPC records), kept on it and counted against the bounds; false
    /// where `key` has no entry with values (or the cache is compact: answers are written
    /// each time).
    pub(super) fn add_answers(
        &self,
        key: &[u8],
        json: Option<&Bound<'_, PyBytes>>,
        wire: Option<&Bound<'_, PyBytes>>,
    ) -> (bool, Vec<Hit>) {
        if self.compact {
            return (false, Vec::new());
        }
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        let hit = match entries.get_mut(key).filter(|hit| !hit.fault) {
            Some(hit) => hit,
            None => return (false, Vec::new()),
        };
        owned.remove(key, &*hit);
        if let (None, Some(json)) = (&hit.values, json) {
            hit.values = Some(Held::new(json));
        }
        if let (None, Some(wire)) = (&hit.wire, wire) {
            hit.wire = Some(Held::new(wire));
        }
        owned.add(key, &*hit, true);
        let evicted = evict(&mut entries, &mut owned, &self.flights);
        (true, evicted)
    }

    /// Drop the entry of `key` (an invalidation): a load of it in flight does not store
    /// what it read. The entry dropped.
    pub(super) fn drop_entry(&self, key: &[u8]) -> Option<Hit> {
        let old = {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            let old = entries.remove(key);
            if let Some(hit) = &old {
                self.owned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(key, hit);
            }
            old
        };
        self.disown(Some(key));
        old
    }

    /// Drop every entry; loads in flight store nothing.
    pub(super) fn drop_all(&self) -> Vec<Hit> {
        let old = {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            self.owned.lock().unwrap_or_else(|e| e.into_inner()).clear();
            std::mem::take(&mut *entries)
        };
        self.disown(None);
        old.into_values().collect()
    }

    /// Every entry due for reload, as when invalidations may have been missed: each
    /// expires where it is, so that a lookup loads it again and, if Redis fails, is answered
    /// with it stale. Loads in flight are not stored.
    pub(super) fn expire_every(&self) {
        let now = self.ticks(Instant::now());
        {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            for hit in entries.values_mut() {
                hit.expires = hit.expires.min(now);
            }
        }
        self.disown(None);
    }

    /// The keys of group `group`'s entries, those stored last first (the eviction ring's
    /// order, newest first).
    pub(super) fn group_keys(&self, group: u16) -> Vec<Key> {
        let prefix = group.to_be_bytes();
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = Set::with_capacity_and_hasher(owned.count, Default::default());
        owned
            .ring
            .iter()
            .rev()
            .filter(|key| key.starts_with(&prefix) && entries.contains_key(key.as_slice()))
            .filter(|key| seen.insert((*key).clone()))
            .cloned()
            .collect()
    }

    /// A batch write of `group` was announced: every entry Python stored is noted on its
    /// next hit, for Python's policy; every one a front loaded is outdated (`OUTDATED`),
    /// read again by a front on its next hit or when Python's sweep queues it.
    pub(super) fn notice_group(&self, group: u16) {
        let prefix = group.to_be_bytes();
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        for (key, hit) in entries.iter_mut() {
            if key.starts_with(&prefix) {
                hit.notice_at = if hit.own() { OUTDATED } else { BATCH_NOTICE };
                *hit.noticed.get_mut() = false;
            }
        }
    }

    /// Note the entry of `key` for Python's policy again, `notice_in` seconds from now (a
    /// note for a batch write it is newer than: at its own refresh window again).
    pub(super) fn notice_again(&self, key: &[u8], notice_in: f64) {
        let at = self.ticks_after(Instant::now(), notice_in.max(0.0));
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = entries.get_mut(key) {
            hit.notice_at = at.min(hit.expires);
            *hit.noticed.get_mut() = false;
        }
    }

    /// A shadow check was drawn for the entry of `key`: none again until it is loaded anew.
    pub(super) fn mark_shadowed(&self, key: &[u8]) {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = entries.get(key) {
            hit.shadowed.store(true, Ordering::Relaxed);
        }
    }

    /// Of `keys`, those whose entries a front did not load (Python's policy reloads them).
    pub(crate) fn not_own(&self, keys: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        keys.into_iter()
            .filter(|key| entries.get(key.as_slice()).map_or(false, |hit| !hit.own()))
            .collect()
    }

    /// The bounds (bytes, entries) of every entry, kept from now on.
    pub(super) fn set_bounds(&self, max_bytes: usize, max_entries: usize) -> Vec<Hit> {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.max_bytes = max_bytes;
        owned.max_entries = max_entries;
        evict(&mut entries, &mut owned, &self.flights)
    }
}
