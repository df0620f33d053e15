//! What the bounds keep of the front's own entries (`load.rs`): a new key is admitted by a
//! doorkeeper once they are at their bounds (`admitted`), and entries past them are
//! evicted by CLOCK (`evict`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use super::entry::Hit;
use super::load::{Flights, Loading, OWN_ENTRY};
use super::{Key, Map, Set};

/// The front's own entries: what they hold, the eviction's ring of their keys, and the
/// admission's doorkeeper.
#[derive(Default)]
pub(super) struct Owned {
    pub(super) bytes: usize,
    pub(super) count: usize,
    pub(super) ring: VecDeque<Key>,
    // keys loaded while the entries were at their bounds and not stored (`admitted`),
    // cleared once it holds as many keys as there are entries
    seen: Set<Key>,
}

/// What the eviction reads of an entry (`Hit`'s; the tests' own without Python objects).
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

/// Whether a new entry of `key` is stored: always while the front's own entries are below
/// their bounds, and once they are at them, only a key loaded before since the doorkeeper
/// was last cleared (TinyLFU's doorkeeper, as in Caffeine): a key loaded once (the long
/// tail, a scan, a cold start past the cache's size) costs no entry and evicts none; the
/// lookup that loaded it answers from it, then it goes. The doorkeeper holds the keys of
/// those first loads, and is cleared once it holds as many keys as there are entries.
/// `benchmarks/eviction.py` simulates it: on Zipf traces it raises CLOCK's hit rate at
/// every size and stores a few entries per 100 lookups where CLOCK alone stored most.
/// An entry replacing one of the key's (a reload, Python's) is always stored.
/// (`bytes`: what the entry would count for; `there`: the key has an entry.)
pub(super) fn admitted(
    owned: &mut Owned,
    key: &[u8],
    bytes: usize,
    there: bool,
    loading: &Loading,
) -> bool {
    let max_bytes = loading.max_bytes.load(Ordering::Relaxed);
    let max_entries = loading.max_entries.load(Ordering::Relaxed);
    let full = owned.count >= max_entries || owned.bytes.saturating_add(bytes) > max_bytes;
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
pub(super) fn first_load(owned: &Owned, key: &[u8], loading: &Loading) -> bool {
    let max_bytes = loading.max_bytes.load(Ordering::Relaxed);
    let max_entries = loading.max_entries.load(Ordering::Relaxed);
    let smallest = OWN_ENTRY + key.len();
    (owned.count >= max_entries || owned.bytes.saturating_add(smallest) > max_bytes)
        && !owned.seen.contains(key)
}

/// Evict the front's own entries past the bounds by CLOCK: the hand takes the oldest key;
/// an entry hit since it last passed gets a second chance (to the back), any other goes.
/// Keys in the ring whose entry went (or is now Python's) are dropped as the hand meets
/// them. The count of entries evicted.
pub(super) fn evict<E: Evictable>(
    entries: &mut Map<Key, E>,
    owned: &mut Owned,
    loading: &Loading,
    flights: &Flights,
) -> u64 {
    let mut evicted = 0;
    let mut passes = 0usize;
    let mut pinned = None;
    // a key being loaded or just loaded (its lookup not yet answered) is passed over
    let mut loaded = |key: &[u8]| {
        pinned
            .get_or_insert_with(|| flights.lock().unwrap_or_else(|e| e.into_inner()))
            .contains_key(key)
    };
    let max_bytes = loading.max_bytes.load(Ordering::Relaxed);
    let max_entries = loading.max_entries.load(Ordering::Relaxed);
    while (owned.bytes > max_bytes || owned.count > max_entries)
        && passes <= 2 * owned.ring.len() + 1
    {
        passes += 1;
        let key = match owned.ring.pop_front() {
            Some(key) => key,
            None => break,
        };
        match entries.get(&key) {
            Some(hit) if hit.own() => {
                if hit.visited().swap(false, Ordering::Relaxed) || loaded(&key) {
                    owned.ring.push_back(key); // a second chance
                    continue;
                }
                if let Some(hit) = entries.remove(&key) {
                    owned.bytes -= OWN_ENTRY + key.len() + hit.held();
                    owned.count -= 1;
                    evicted += 1;
                }
            }
            _ => {} // dropped or replaced by Python since
        }
    }
    // keys of entries gone stay in the ring until the hand meets them: past twice the
    // entries, keep only those of the front's own entries, once each
    if owned.ring.len() > 2 * owned.count + 1024 {
        let mut seen = Set::with_capacity_and_hasher(owned.count, Default::default());
        owned
            .ring
            .retain(|key| entries.get(key).map_or(false, E::own) && seen.insert(key.clone()));
    }
    evicted
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    fn loading(max_entries: usize) -> Loading {
        Loading {
            ttl: 1.0,
            negative_ttl: 1.0,
            jitter: 0.0,
            refresh_ahead: 0.0,
            max_bytes: usize::MAX.into(),
            max_entries: max_entries.into(),
            wait: Duration::from_secs(1),
            max_stale: 0.0,
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
        let loading = loading(2);
        let mut owned = Owned::default();
        let admit = |owned: &mut Owned, i: u8, there: bool| {
            admitted(owned, &key(i), OWN_ENTRY + 4, there, &loading)
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
        let mut owned = Owned::default();
        loading.max_bytes.store(OWN_ENTRY, Ordering::Relaxed);
        assert!(!admit(&mut owned, 7, false));
        assert!(admit(&mut owned, 7, false));
    }

    /// Ten entries, the bound five: the hand evicts the oldest not hit since it passed,
    /// and gives those hit a second chance; what is counted goes down with each.
    #[test]
    fn clock_evicts_the_oldest_unvisited_and_keeps_the_count() {
        let mut entries = Map::default();
        let mut owned = Owned::default();
        let flights = Flights::default();
        let per = OWN_ENTRY + 4 + 100;
        for i in 0u8..10 {
            owned.bytes += per;
            owned.count += 1;
            owned.ring.push_back(key(i));
            let visited = AtomicBool::new([0, 2, 4].contains(&i));
            entries.insert(key(i), Entry { visited, own: true });
        }
        assert_eq!(evict(&mut entries, &mut owned, &loading(5), &flights), 5);
        let mut kept: Vec<u8> = entries.keys().map(|k| k[3]).collect();
        kept.sort_unstable();
        // 1, 3, 5, 6 and 7 were the oldest not hit: they go; 0, 2 and 4 had a second chance
        assert_eq!(kept, vec![0, 2, 4, 8, 9]);
        assert_eq!((owned.count, owned.bytes), (5, 5 * per));
        // an entry Python dropped or took since leaves its key in the ring: the hand skips it
        entries.remove(&key(8));
        entries.insert(
            key(9),
            Entry {
                visited: AtomicBool::new(false),
                own: false,
            },
        );
        owned.count -= 2;
        owned.bytes -= 2 * per;
        assert_eq!(evict(&mut entries, &mut owned, &loading(1), &flights), 2);
        assert_eq!(owned.count, 1);
        assert_eq!(entries.len(), 2); // the one kept, and Python's
    }
}
