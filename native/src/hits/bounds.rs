//! What the L1's bounds keep of its entries, whoever stored them (a front's load, or
//! Python's: `HitCache::put_many`): a new key a front loads is admitted by a doorkeeper
//! once the entries are at their bounds (`admitted`), and entries past them are evicted by
//! CLOCK (`evict`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use super::entry::Hit;
use super::flight::Flights;
use super::{Key, Map, Set};

/// What an entry costs besides its key and bytes: the entry and its key's box in the
/// table's slot (a table that grows by doubling is up to half empty), the eviction ring's
/// copy of the key, and the allocator's share of each of its five boxes. Measured with
/// benchmarks/l1_memory.py: charged 192 bytes, an entry took 1.42x the bytes counted in
/// RSS and the byte bound did not hold; charged 640, 1.06x, and it holds
/// (benchmarks/results/l1_memory_loads.md).
pub(super) const ENTRY: usize = 640;

/// The L1's entries: what they hold, the bounds (bytes, entries), the eviction's ring of
/// their keys (every entry's key is in it at least once), and the admission's doorkeeper.
pub(super) struct Owned {
    pub(super) bytes: usize,
    pub(super) count: usize,
    // of them, those the fronts loaded themselves (`Hit::own`): the admin page's
    pub(super) own: usize,
    pub(super) max_bytes: usize,
    pub(super) max_entries: usize,
    pub(super) ring: VecDeque<Key>,
    // keys loaded while the entries were at their bounds and not stored (`admitted`),
    // cleared once it holds as many keys as there are entries
    seen: Set<Key>,
}

impl Default for Owned {
    fn default() -> Self {
        Owned {
            bytes: 0,
            count: 0,
            own: 0,
            max_bytes: usize::MAX,
            max_entries: usize::MAX,
            ring: VecDeque::new(),
            seen: Set::default(),
        }
    }
}

impl Owned {
    /// What an entry of `key` holding `held` bytes counts for against the byte bound.
    pub(super) fn charge(key: &[u8], held: usize) -> usize {
        ENTRY + key.len() + held
    }

    /// An entry of `key` was stored (its key already in the ring: `ringed`).
    pub(super) fn add<E: Evictable>(&mut self, key: &[u8], hit: &E, ringed: bool) {
        self.bytes += Self::charge(key, hit.held());
        self.count += 1;
        self.own += usize::from(hit.own());
        if !ringed {
            self.ring.push_back(Key::new(key));
        }
    }

    /// An entry of `key` was dropped or replaced (its key stays in the ring until the hand
    /// meets it).
    pub(super) fn remove<E: Evictable>(&mut self, key: &[u8], hit: &E) {
        self.bytes -= Self::charge(key, hit.held());
        self.count -= 1;
        self.own -= usize::from(hit.own());
    }

    /// Every entry was dropped: the bounds stay.
    pub(super) fn clear(&mut self) {
        *self = Owned {
            max_bytes: self.max_bytes,
            max_entries: self.max_entries,
            ..Owned::default()
        };
    }
}

/// What the bounds read of an entry (`Hit`'s; the tests' own without Python objects).
pub(super) trait Evictable {
    fn own(&self) -> bool;
    fn visited(&self) -> &AtomicBool;
    fn held(&self) -> usize;
}

impl Evictable for Hit {
    fn own(&self) -> bool {
        Hit::own(self)
    }
    fn visited(&self) -> &AtomicBool {
        &self.visited
    }
    fn held(&self) -> usize {
        self.held_bytes()
    }
}

/// Whether a new entry of `key` a front loaded is stored: always while the entries are
/// below their bounds, and once they are at them, only a key loaded before since the doorkeeper
/// was last cleared (TinyLFU's doorkeeper, as in Caffeine): a key loaded once (the long
/// tail, a scan, a cold start past the cache's size) costs no entry and evicts none; the
/// lookup that loaded it answers from it, then it goes. The doorkeeper holds the keys of
/// those first loads, and is cleared once it holds as many keys as there are entries.
/// `benchmarks/eviction.py` simulates it: on Zipf traces it raises CLOCK's hit rate at
/// every size and stores a few entries per 100 lookups where CLOCK alone stored most.
/// An entry replacing one of the key's (a reload) is always stored, and so is every entry
/// Python stores (its loads are few: a form's first lookups, the warm start).
/// (`bytes`: what the entry would count for; `there`: the key has an entry.)
pub(super) fn admitted(owned: &mut Owned, key: &[u8], bytes: usize, there: bool) -> bool {
    let full =
        owned.count >= owned.max_entries || owned.bytes.saturating_add(bytes) > owned.max_bytes;
    if !full || there || owned.seen.contains(key) {
        return true;
    }
    if owned.seen.len() >= owned.count.max(1) {
        owned.seen.clear();
    }
    owned.seen.insert(Key::new(key));
    false
}

/// Whether a new entry of `key` will most likely not be stored (`admitted`): the entries
/// are at their bounds even for the smallest entry, and the doorkeeper has not seen the
/// key. A load makes such an entry without what only a stored entry keeps (`load.rs`).
pub(super) fn first_load(owned: &Owned, key: &[u8]) -> bool {
    let smallest = Owned::charge(key, 0);
    (owned.count >= owned.max_entries || owned.bytes.saturating_add(smallest) > owned.max_bytes)
        && !owned.seen.contains(key)
}

/// Evict entries past the bounds by CLOCK: the hand takes the oldest key; an entry hit
/// since it last passed gets a second chance (to the back), any other goes. Keys in the
/// ring whose entry went are dropped as the hand meets them. The entries evicted (their
/// Python objects, if any, are released by the caller: with the GIL, or deferred by pyo3
/// to the next time it is held).
pub(super) fn evict<E: Evictable>(
    entries: &mut Map<Key, E>,
    owned: &mut Owned,
    flights: &Flights,
) -> Vec<E> {
    let mut evicted = Vec::new();
    let mut passes = 0usize;
    let mut pinned = None;
    // a key being loaded or just loaded (its lookup not yet answered) is passed over
    let mut loaded = |key: &[u8]| {
        pinned
            .get_or_insert_with(|| flights.lock().unwrap_or_else(|e| e.into_inner()))
            .contains_key(key)
    };
    while (owned.bytes > owned.max_bytes || owned.count > owned.max_entries)
        && passes <= 2 * owned.ring.len() + 1
    {
        passes += 1;
        let key = match owned.ring.pop_front() {
            Some(key) => key,
            None => break,
        };
        // (a key whose entry was dropped since is dropped from the ring here)
        if let Some(hit) = entries.get(&key) {
            if hit.visited().swap(false, Ordering::Relaxed) || loaded(&key) {
                owned.ring.push_back(key); // a second chance
                continue;
            }
            if let Some(hit) = entries.remove(&key) {
                owned.remove(&key, &hit);
                evicted.push(hit);
            }
        }
    }
    // keys of entries gone stay in the ring until the hand meets them: past twice the
    // entries, keep only those of entries there, once each
    if owned.ring.len() > 2 * owned.count + 1024 {
        let mut seen = Set::with_capacity_and_hasher(owned.count, Default::default());
        owned
            .ring
            .retain(|key| entries.contains_key(key) && seen.insert(key.clone()));
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Entry {
        visited: AtomicBool,
        own: bool,
    }

    impl Evictable for Entry {
        fn own(&self) -> bool {
            self.own
        }
        fn visited(&self) -> &AtomicBool {
            &self.visited
        }
        fn held(&self) -> usize {
            100
        }
    }

    fn bounded(max_entries: usize) -> Owned {
        Owned {
            max_entries,
            ..Owned::default()
        }
    }

    fn key(i: u8) -> Key {
        Key::new(&[0, 0, b'k', i])
    }

    /// Below the bounds every new key is stored; at them, a key's first load since the
    /// doorkeeper was cleared is not, its second is, a key with an entry there always is,
    /// and the doorkeeper forgets once it holds as many keys as there are entries.
    #[test]
    fn the_doorkeeper_admits_a_key_loaded_twice_while_the_cache_is_full() {
        let mut owned = bounded(2);
        let admit = |owned: &mut Owned, i: u8, there: bool| {
            admitted(owned, &key(i), Owned::charge(&key(i), 0), there)
        };
        assert!(admit(&mut owned, 1, false));
        owned.count = 2; // at the bound of entries
        assert!(!admit(&mut owned, 3, false));
        assert!(admit(&mut owned, 3, false));
        assert!(admit(&mut owned, 4, true)); // a reload replaces the entry there
        assert!(!admit(&mut owned, 5, false)); // the doorkeeper: 3 and 5
        assert!(!admit(&mut owned, 6, false)); // cleared, then 6
        assert!(!admit(&mut owned, 3, false)); // forgotten
        assert!(admit(&mut owned, 6, false));
        // the bound in bytes counts too
        let mut owned = Owned {
            max_bytes: Owned::charge(&key(7), 0) - 1,
            ..Owned::default()
        };
        assert!(!admit(&mut owned, 7, false));
        assert!(admit(&mut owned, 7, false));
    }

    /// Ten entries, the bound five: the hand evicts the oldest not hit since it passed,
    /// and gives those hit a second chance, whoever stored them; what is counted (and of
    /// it, the fronts' own) goes down with each.
    #[test]
    fn clock_evicts_the_oldest_unvisited_and_keeps_the_count() {
        let mut entries = Map::default();
        let mut owned = bounded(5);
        let flights = Flights::default();
        let per = Owned::charge(&key(0), 100);
        for i in 0u8..10 {
            let visited = AtomicBool::new([0, 2, 4].contains(&i));
            let entry = Entry {
                visited,
                own: i % 2 == 0, // the fronts' loads and Python's, in turn
            };
            owned.add(&key(i), &entry, false);
            entries.insert(key(i), entry);
        }
        assert_eq!((owned.count, owned.own), (10, 5));
        assert_eq!(evict(&mut entries, &mut owned, &flights).len(), 5);
        let mut kept: Vec<u8> = entries.keys().map(|k| k[3]).collect();
        kept.sort_unstable();
        // 1, 3, 5, 6 and 7 were the oldest not hit: they go; 0, 2 and 4 had a second chance
        assert_eq!(kept, vec![0, 2, 4, 8, 9]);
        assert_eq!((owned.count, owned.bytes, owned.own), (5, 5 * per, 4));
        // an entry dropped since leaves its key in the ring: the hand skips it
        let gone = entries.remove(&key(8)).unwrap();
        owned.remove(&key(8), &gone);
        owned.max_entries = 1;
        assert_eq!(evict(&mut entries, &mut owned, &flights).len(), 3);
        assert_eq!((owned.count, owned.bytes), (1, per));
        assert_eq!(entries.len(), 1);
    }
}
