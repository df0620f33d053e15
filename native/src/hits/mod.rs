//! The worker's one L1, and lookups answered on the fronts' threads without the GIL: L1
//! hits, the L1's misses loaded on the fronts' own connections, and (without the L1)
//! planned reads.
//!
//! `Hits` holds the L1's entries: per (group, entity key) the values' JSON and gRPC records,
//! whichever it has made, its packed values, present pattern, write time, expiry and the
//! refresh policy's notice. An entry a front loaded holds bytes of its own; one Python stored
//! (`store.rs`: a form's first lookups, the warm start, a miss only Python reads) holds
//! Python's own bytes objects, not copied; both live in one table under one bound
//! (`bounds.rs`), and Python sees either as its `Entry` (`HitCache::entry`). A `POST
//! /v1/features/get` in the common form (one group's features, ids of the entity's type, no
//! bypass) whose every entity is a fresh entry is answered here from those bytes, as are
//! gRPC's and Feast's lookups of one group, and lookups over several groups of one entity
//! (a form's `Part`s: each group's values picked from its entries, gathered in `Cells`,
//! written as Feast's columns or as rows, `Rows`). With the L1 compact (`CACHE_FORM=compact`)
//! an entry holds its packed values instead, and each answer writes the values' JSON or gRPC
//! records from them, as Python's `GroupCodec` does. A request of a known form with entries
//! missing or expired is loaded by the front (`load.rs`, single flight: `flight.rs`); the
//! keys it cannot load (or whose entries lack its API's answer bytes) go to Python alone
//! (`Looked::Missing`), which loads them into the same L1 through its policy, and the front
//! answers from it (`Hits::replay`). Any other request (an id Python would refuse, a form
//! not seen yet, a malformed body, keys that did not load) goes to Python as before, which
//! answers it and stays the one place where errors and the cache's policy are decided.
//!
//! The policy stays Python's: a hit here on an entry Python stored, inside its refresh
//! window (refresh ahead, XFetch, an announced batch write), and a sample of hits (shadow
//! checks) are noted for Python, which runs the same `Refresher.on_notice` and
//! `ShadowChecker.check` a hit in Python would; but the fronts' own entries, hit inside
//! their refresh-ahead window, they read again themselves (`front/lookup.rs`: `take_due`),
//! so that a hot entry stays theirs. A form is learned from Python's own answer to it: the
//! head of the answer and how an id becomes a key are Python's bytes, not rebuilt here.

mod answer;
mod asked;
mod bounds;
mod cache;
mod cells;
mod entry;
mod flight;
mod form;
mod key;
mod load;
mod plan;
mod split;
mod store;
mod writer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use once_cell::sync::OnceCell;
use std::time::Instant;

use self::asked::{Asked, Id};
use self::entry::{Hit, BATCH_NOTICE, OUTDATED};
use self::form::{Form, GroupRead};
pub(crate) use self::key::Key;
use self::writer::HitWriter;
use crate::codecs::{json_i64, same};
use crate::time::unix_now;
pub(crate) use cache::HitCache;
pub(crate) use flight::PythonLoad;
pub(crate) use load::{Loading, Passing};
pub(crate) use plan::Commands;

/// The L1's maps (entries, loads in flight, forms, reads, the doorkeeper): foldhash, keyed
/// per map from a random seed per process, in place of std's SipHash. Their keys are the
/// entities' Redis keys, which callers choose, so the hash must be keyed (a fixed one, as
/// FxHash, lets a caller choose keys that collide); SipHash-1-3 also resists a caller who
/// sees timings, but it was about 2% of a miss's CPU (`perf`), for the entries' keys of 11
/// bytes. foldhash is hashbrown's own default (0.15 on), and builds with Rust 1.60.
pub(super) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(super) type Set<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// The APIs whose lookups are answered here: this one's REST and gRPC, and Feast's
/// `/get-online-features` (its column-shaped answer: `Cells`).
pub const REST: u8 = 0;
pub const GRPC: u8 = 1;
pub const FEAST: u8 = 2;
const APIS: usize = 3;

#[derive(Default)]
struct Served {
    seconds: [Vec<f64>; APIS], // each answer's time, for the request histogram, per API
    entities: [u64; APIS],
    direct: [u64; APIS], // of the answers, planned reads read on the front's own connections
    loaded: [u64; APIS], // of the answers, hits once Python loaded the lookup's missing keys
    hits: u64,
    negative_hits: u64,
    refresh: Vec<Vec<u8>>, // keys hit inside their refresh window
    shadow: Vec<Vec<u8>>,  // keys sampled for a shadow check
    // the misses the front loaded itself (`load.rs`): keys missed, of them those that waited
    // for another lookup's load, keys stored, round trips, entries evicted
    misses: u64,
    deduplicated: u64,
    keys_loaded: u64,
    round_trips: u64,
    evictions: u64,
    stale_serves: u64, // expired entries served stale: Redis failing on a load
    refreshed: u64,    // the front's own entries it refreshed ahead of their expiry
    // the front's own entries it read again after their group's batch write (`OUTDATED`)
    generation_refreshed: u64,
    // keys loaded while the front's entries were at their bounds and not stored: their
    // first load since the doorkeeper was cleared (`load::admitted`)
    passed: u64,
}

const MAX_FORMS: usize = 1024;
const MAX_NOTED: usize = 100_000; // per drain: Python drains every few tens of ms

/// An entry of the front's own to be read again (`Hits::take_due`): its key, the API whose
/// answer bytes it holds, and whether its group's batch write made it due (`OUTDATED`)
/// rather than its refresh window.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Due(u8, bool, Key);

impl Due {
    fn of(key: &[u8], hit: &Hit) -> Self {
        let api = if hit.values.is_some() { REST } else { GRPC };
        Due(api, hit.notice_at == OUTDATED, Key::new(key))
    }
}

/// What a lookup found in the L1.
pub enum Looked {
    /// every entity a fresh entry: the answer
    Answer(Vec<u8>),
    /// some missing, expired or (gRPC) without records: Python loads them, then `replay`
    Missing(Missing),
}

/// The keys (group index and Redis key, sorted, each once) a lookup found missing.
pub struct Missing {
    pub keys: Vec<Key>,
    /// of them, those to be read from Redis (no entry, or an expired one; sorted)
    pub absent: Vec<Key>,
    started: Instant,
}

pub struct Hits {
    /// without the L1: lookups are planned (`plan`), never looked up in `entries`
    pub planning: bool,
    /// entries hold their packed values only (`CACHE_FORM=compact`)
    compact: bool,
    reads: RwLock<Map<u16, Arc<GroupRead>>>,
    entries: RwLock<Map<Key, Hit>>,
    base: Instant, // `ticks` count from here
    forms: RwLock<Map<Vec<u8>, Arc<Form>>>,
    served: Mutex<Served>,
    shadow_below: u64, // a hit is sampled when a random u64 is below this
    rng: AtomicU64,
    max_ids: usize,
    max_string_id: usize,
    /// the front loads misses itself (`load.rs`), with these settings of Python's
    loading: OnceCell<Loading>,
    owned: Mutex<bounds::Owned>,
    flights: flight::Flights,
    /// the front's own entries hit inside their refresh window, to be read again by the
    /// front (`take_due`), each with the API whose answer bytes it holds and whether it is
    /// read again for its group's batch write (`OUTDATED`)
    due: Mutex<Vec<Due>>,
    has_due: AtomicBool,
}

/// The key of a form: the API, and the request's entity type, features and groups as sent.
fn form_key(api: u8, entity: &str, features: &[&str], groups: &[&str]) -> Vec<u8> {
    let mut key = Vec::with_capacity(64);
    key.push(api);
    key.extend_from_slice(entity.as_bytes());
    for (mark, names) in [(1u8, features), (2u8, groups)] {
        for name in names {
            key.push(mark);
            key.extend_from_slice(name.as_bytes());
        }
    }
    key
}

/// Whether `keys` (sorted) hold `key`: a lookup's few loaded keys compared in turn, each in
/// a word or two (`same`: a binary search's `memcmp` calls were 1.3% of a miss in `perf`),
/// more of them by a binary search.
fn holds(keys: &[Key], key: &[u8]) -> bool {
    if keys.len() <= 16 {
        return keys.iter().any(|k| {
            let k = k.as_slice();
            k.len() == key.len() && same(k, key)
        });
    }
    keys.binary_search_by(|k| k.as_slice().cmp(key)).is_ok()
}

fn cache_key(out: &mut Vec<u8>, group: u16, prefix: &[u8], id: &Id<'_>) {
    out.clear();
    out.extend_from_slice(&group.to_be_bytes());
    out.extend_from_slice(prefix);
    match id {
        Id::Int(n) => json_i64(out, *n), // the digits of Python's f"{prefix}:{n}"
        Id::Str(s) => out.extend_from_slice(s.as_bytes()),
    }
}

impl Hits {
    /// A time as nanoseconds since `base`: 8 bytes in a `Hit` where an `Instant` is 16.
    fn ticks(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn next_random(&self) -> u64 {
        // splitmix64 over an atomic counter: one sample per hit, no lock
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The answer to a lookup of `api` (a `POST /v1/features/get` or Feast
    /// `/get-online-features` body, a `GetFeaturesRequest` message) if every entity is a
    /// fresh hit, or the keys Python must load first. A gRPC lookup's entries answer once
    /// they hold their gRPC records (or, compact, can write them); the others', their JSON.
    pub fn answer(&self, api: u8, request: &[u8]) -> Option<Looked> {
        if self.planning {
            return None;
        }
        self.lookup(&Asked::parse(api, request)?, None)
    }

    /// The answer to a lookup whose `missing` keys Python (or the front) has loaded since
    /// `answer` found them; None (Python answers) where an entry is still not here. The hits
    /// counted are those of the other keys: the loads counted theirs. `stored`: the keys
    /// (sorted) this lookup's own load stored just now, which answer it even where they are
    /// not to be kept (a negative TTL of 0); every other entry must be fresh.
    /// `passing`: entries it loaded that were not stored (`load::admitted`), sorted by key.
    pub fn replay(
        &self,
        request: &[u8],
        api: u8,
        missing: &Missing,
        stored: Option<&[Key]>,
        passing: &Passing,
    ) -> Option<Vec<u8>> {
        let mut asked = Asked::parse(api, request)?;
        asked.started = missing.started; // the answer's time includes the load
        match self.lookup_within(&asked, Some(&missing.keys), stored, passing, 0)? {
            Looked::Answer(answer) => Some(answer),
            Looked::Missing(_) => None,
        }
    }

    /// The answer to a lookup whose `missing` keys could not be read (Redis failing),
    /// with the expired entries of those keys kept less than `max_stale` seconds past their
    /// expiry served stale; None where one has none (Python answers).
    pub fn stale(
        &self,
        request: &[u8],
        api: u8,
        missing: &Missing,
        max_stale: f64,
    ) -> Option<Vec<u8>> {
        let mut asked = Asked::parse(api, request)?;
        asked.started = missing.started;
        let grace = u64::try_from(crate::time::seconds(max_stale).as_nanos()).unwrap_or(u64::MAX);
        match self.lookup_within(&asked, None, None, &Passing::default(), grace)? {
            Looked::Answer(answer) => Some(answer),
            Looked::Missing(_) => None,
        }
    }

    /// `loaded`: a replay, after Python loaded these keys (sorted).
    fn lookup(&self, asked: &Asked<'_>, loaded: Option<&[Key]>) -> Option<Looked> {
        self.lookup_within(asked, loaded, None, &Passing::default(), 0)
    }

    /// `stored`: of the loaded keys, those stored just now for this lookup, and `passing`,
    /// those loaded for it and not stored (see `replay`); `grace`: ticks past its expiry
    /// within which an entry is served stale (0: none).
    fn lookup_within(
        &self,
        asked: &Asked<'_>,
        loaded: Option<&[Key]>,
        stored: Option<&[Key]>,
        passing: &Passing,
        grace: u64,
    ) -> Option<Looked> {
        let (api, ids, started) = (asked.api, &asked.ids, asked.started);
        let form = self.form(asked)?;
        let now = unix_now();
        let now_ticks = self.ticks(started);
        // the answer's buffer, made at its first entity: a lookup that finds keys missing
        // (a miss, before its load) writes none
        let mut out = Vec::new();
        let start = |out: &mut Vec<u8>| {
            if out.is_empty() {
                out.reserve(form.head.len() + ids.len() * 1300 + 2);
                out.extend_from_slice(&form.head);
            }
        };
        let mut key = Vec::with_capacity(form.prefix.len() + 24);
        let mut writer = if self.compact {
            let reads = self.reads.read().unwrap_or_else(|e| e.into_inner());
            HitWriter::new(api, &form, Some(&reads), now, ids.len())?
        } else {
            HitWriter::new(api, &form, None, now, ids.len())?
        };
        let compact = self.compact;
        let (mut hits, mut negative, mut stale_serves) = (0u64, 0u64, 0u64);
        let mut missing: Vec<Key> = Vec::new();
        let mut absent: Vec<Key> = Vec::new();
        let mut refresh = Vec::new();
        let mut due = Vec::new();
        let mut shadow = Vec::new();
        {
            let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
            let mut noted: Vec<(&Hit, Vec<u8>)> = Vec::new();
            // the front refreshes its own entries itself (it loads misses); a batch write's
            // notice (`BATCH_NOTICE`) and Python's entries go to Python's policy
            let refreshes = self.loading.get().is_some();
            // each entity's entry of each of the form's groups (one, but for Feast's lookups
            // over several views)
            let keyed = ids
                .iter()
                .enumerate()
                .flat_map(|(i, id)| form.parts.iter().enumerate().map(move |p| (i, id, p)));
            for (i, id, (p, part)) in keyed {
                cache_key(&mut key, part.group, &form.prefix, id);
                let found = entries.get(key.as_slice()).or_else(|| passing.get(&key));
                let hit = match found {
                    // an entry just loaded for this lookup answers it even if it is not to be
                    // kept (a negative TTL of 0)
                    Some(hit)
                        if (now_ticks < hit.expires.saturating_add(grace)
                            || stored.map_or(false, |l| holds(l, &key)))
                            && !hit.fault
                            && (compact
                                || if api == GRPC {
                                    hit.wire.is_some()
                                } else {
                                    hit.values.is_some()
                                }) =>
                    {
                        hit
                    }
                    _ if loaded.is_some() => return None, // gone again: Python answers
                    _ => {
                        // to be read from Redis: none, or expired; not a fresh entry without
                        // this API's answer bytes (Python makes them from its values), nor an
                        // entity whose data Python found broken (Python answers it)
                        // (the front's own entries are read again: Python holds nothing to
                        // make the other API's bytes from, and the load keeps both then)
                        if found.map_or(true, |hit| now_ticks >= hit.expires || hit.own()) {
                            absent.push(Key::new(&key));
                            if let Some(hit) = found.filter(|hit| hit.own()) {
                                // its load compares and replays them once Redis answers
                                hit.prefetch(api, compact);
                            }
                        }
                        missing.push(Key::new(&key));
                        continue;
                    }
                };
                if !missing.is_empty() {
                    continue; // no answer before the load: only what is missing matters
                }
                let stale = now_ticks >= hit.expires && grace > 0;
                start(&mut out);
                writer.entity(&mut out, i, id, p, hit, stale)?;
                if stale {
                    stale_serves += 1;
                    continue;
                }
                if let Some(loaded) = loaded {
                    if holds(loaded, &key) {
                        continue; // counted by Python's load
                    }
                }
                if !hit.visited.load(Ordering::Relaxed) {
                    hit.visited.store(true, Ordering::Relaxed); // the eviction's second chance
                }
                if hit.negative {
                    negative += 1;
                    continue;
                }
                hits += 1;
                if now_ticks >= hit.notice_at && !hit.noticed.load(Ordering::Relaxed) {
                    noted.push((hit, key.clone()));
                }
                // drawn uniformly over hits, and each entry at most once per load
                if self.shadow_below > 0
                    && self.next_random() < self.shadow_below
                    && !hit.shadowed.swap(true, Ordering::Relaxed)
                {
                    shadow.push(key.clone());
                }
            }
            if !missing.is_empty() {
                missing.sort_unstable();
                missing.dedup();
                absent.sort_unstable();
                absent.dedup();
                return Some(Looked::Missing(Missing {
                    keys: missing,
                    absent,
                    started,
                }));
            }
            // each list holds at most MAX_NOTED keys between drains: an entry left out for
            // want of room keeps its mark unset, and its next hit notes it
            let (mut due_room, mut refresh_room) = if noted.is_empty() {
                (0, 0)
            } else {
                let queued = self.due.lock().unwrap_or_else(|e| e.into_inner()).len();
                let listed = self.served.lock().unwrap_or_else(|e| e.into_inner());
                (
                    MAX_NOTED.saturating_sub(queued),
                    MAX_NOTED.saturating_sub(listed.refresh.len()),
                )
            };
            for (hit, key) in noted {
                let front = refreshes && hit.own() && hit.notice_at != BATCH_NOTICE;
                let room = if front {
                    &mut due_room
                } else {
                    &mut refresh_room
                };
                if *room == 0 || hit.noticed.swap(true, Ordering::Relaxed) {
                    continue; // once per load, by whichever answer comes first
                }
                *room -= 1;
                if front {
                    due.push(Due::of(&key, hit));
                } else {
                    refresh.push(key);
                }
            }
        }
        start(&mut out);
        writer.finish(&mut out, ids)?;
        let mut served = self.served(api, started, ids.len());
        served.loaded[api as usize] += u64::from(loaded.is_some());
        served.hits += hits;
        served.negative_hits += negative;
        served.stale_serves += stale_serves;
        served.refresh.append(&mut refresh); // within its room (above)
        if served.shadow.len() < MAX_NOTED {
            served.shadow.append(&mut shadow);
        }
        drop(served);
        if !due.is_empty() {
            let mut queued = self.due.lock().unwrap_or_else(|e| e.into_inner());
            queued.append(&mut due); // within its room (above)
            self.has_due.store(true, Ordering::Release);
        }
        Some(Looked::Answer(out))
    }
}

impl Hits {
    /// The form learned for this request, if its ids are ones Python would take.
    fn form(&self, asked: &Asked<'_>) -> Option<Arc<Form>> {
        let ids = &asked.ids;
        if ids.is_empty() || ids.len() > self.max_ids {
            return None;
        }
        let key = form_key(asked.api, asked.entity, &asked.features, &asked.groups);
        let form = {
            let forms = self.forms.read().unwrap_or_else(|e| e.into_inner());
            Arc::clone(forms.get(&key)?)
        };
        for id in ids {
            match id {
                Id::Int(_) if form.int_ids => {}
                Id::Str(s) if !form.int_ids && !s.is_empty() && s.len() <= self.max_string_id => {}
                _ => return None, // Python says why
            }
        }
        Some(form)
    }

    /// Count an answer given here (for the request histogram and the entities served).
    fn served(
        &self,
        api: u8,
        started: Instant,
        entities: usize,
    ) -> std::sync::MutexGuard<'_, Served> {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.seconds[api as usize].push(started.elapsed().as_secs_f64());
        served.entities[api as usize] += entities as u64;
        served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_finds_exactly_the_keys_held_in_turn_or_by_search() {
        // keys of many lengths (a word's edges), a few held and many held
        let all: Vec<Vec<u8>> = (0u8..60)
            .map(|i| (0..usize::from(i % 20 + 1)).map(|j| i ^ j as u8).collect())
            .collect();
        for held in [3usize, 16, 17, 40] {
            let mut keys: Vec<Key> = all.iter().take(held).map(|k| Key::new(k)).collect();
            keys.sort();
            for (i, key) in all.iter().enumerate() {
                assert_eq!(holds(&keys, key), i < held, "{held} {key:?}");
                let mut near = key.clone();
                *near.last_mut().unwrap() ^= 0x80; // the last byte differs
                assert!(!holds(&keys, &near) || all.iter().take(held).any(|k| *k == near));
            }
        }
    }
}
