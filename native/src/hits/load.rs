//! Misses loaded by the front itself: the keys a lookup found missing or expired are read
//! on the front's own Redis connections (`front/redis.rs`), decoded here, stored as entries
//! of their own (`Held::Own`: no Python object, one copy) and the lookup answered from
//! them, with no Python on the way.
//!
//! - **Single flight** (`flight.rs`). A key being loaded is claimed (`claim`): a lookup on
//!   any front that misses it meanwhile waits for that load instead of reading it again, up
//!   to the policy's wait (`Loading::wait`), and so does one that misses a key a load of
//!   Python's claimed (`PythonLoad`); a claim ends when its load stores or fails, or when
//!   the lookup that made it is dropped, so nothing stays locked. A key dropped while it
//!   loads (an invalidation: `disown`) is not stored.
//! - **What is stored** is what Python's loads store: the answer bytes of the API that asked
//!   (a JSON array, or gRPC records; both where the entry replaced had the other's; a
//!   compact cache's packed values), the packed values (a reload compares them, and Python
//!   answers from them: `HitCache::entry`), the present pattern and write time; an entity
//!   with nothing of the group is a negative entry (its own TTL; at 0 it answers only the
//!   lookup that loaded it); an aggregated group's answer holds until its next tile
//!   boundary. A key whose reply is an error, or holds a value or write time the native
//!   core does not read, is not stored: the lookup then takes Python's path, which names
//!   the fault.
//! - **A reload that finds what the entry held.** An entry of the front's own, expired and
//!   read again, whose stored values are those it packed (compared in place: `packs`), is
//!   kept as it is, with its new lifetime and write time: no answer bytes are made, copied
//!   or freed. Between a group's writes (a nightly job's, say) that is every reload; a
//!   value changed in Redis, noticed or not, makes a new entry.
//! - **Bounds** (`bounds.rs`). Every entry, loaded by a front or stored by Python, counts
//!   against the one cache's bounds in bytes and entries. At the bounds a new key a front
//!   loads is stored only at its second load (the doorkeeper: its first answers the lookup
//!   that made it, `Passing`, an entry made thin, without the packed values only a stored
//!   entry keeps), and entries past them are evicted by CLOCK (second chance): a hit marks
//!   its entry, and the hand passes over marked entries once before evicting them, and over
//!   the keys of loads whose lookups have not yet answered from them (`Pinned`): under a
//!   bound smaller than the loads in flight, a load is not evicted by the next one before
//!   it is served.
//! - The policy stays Python's: which nodes the front may read (the circuit), each round
//!   trip's timeout, the TTLs, and what counts (drained with what the front served). A
//!   round trip that fails serves the lookup's expired entries stale (`Hits::stale`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use once_cell::race::OnceBox;

use super::bounds::{admitted, evict, first_load, Owned};
use super::entry::{Held, Hit, NOT_WRITTEN, OUTDATED};
use super::flight::Claim;
use super::form::GroupRead;
use super::plan::{push_command, write_time, Commands};
use super::{Due, Hits, Key, GRPC, REST};
use crate::codecs::packs;
use crate::group::write_values;
use crate::time::unix_now_ms;

thread_local! {
    /// What a load writes each entry's bytes into before they are boxed (`Hits::entry`):
    /// its answer bytes, packed values, present pattern, and the other API's answer bytes.
    static SCRATCH: std::cell::RefCell<[Vec<u8>; 4]> = std::cell::RefCell::new(Default::default());
}

/// Python's settings for the misses the front loads (`HitCache::load_misses`).
pub struct Loading {
    pub ttl: f64,
    pub negative_ttl: f64,
    pub jitter: f64,
    pub refresh_ahead: f64, // the last share of a TTL in which a hit is noted for a refresh
    pub wait: Duration,     // how long a lookup waits for another's load of its keys
    pub max_stale: f64,     // seconds past its expiry an entry is served stale when a load fails
}

/// Entries a lookup loaded that were not stored (`admitted`): they answer that lookup
/// (`Hits::replay`), then go.
#[derive(Default)]
pub struct Passing(Vec<(Key, Hit)>); // sorted by key

impl Passing {
    /// Add the entries of another load of the same lookup.
    pub fn join(&mut self, mut other: Passing) {
        if !other.0.is_empty() {
            self.0.append(&mut other.0);
            self.0.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<&Hit> {
        let at = self.0.binary_search_by(|(k, _)| k.as_slice().cmp(key));
        at.ok().map(|at| &self.0[at].1)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// What a load made of one key's reply: a new entry, or the same as the front's own entry
/// there (its stored values read again), kept with a new lifetime and write time (`at` and
/// `was`: where its packed values are and its write time, so that an entry that replaced it
/// meanwhile is told apart).
pub(super) enum Made {
    New(Hit),
    Same { at: usize, was: i64, written: i64 },
}

/// An entry loaded now is fresh for `ttl` seconds, and noted for a refresh in the last
/// `refresh_ahead` share of them.
fn live(hit: &mut Hit, ttl: f64, loading: &Loading, after: &impl Fn(f64) -> u64) {
    hit.loaded = after(0.0);
    hit.expires = after(ttl);
    let window = if hit.negative {
        0.0
    } else {
        ttl * loading.refresh_ahead
    };
    hit.notice_at = after(ttl - window);
}

impl Hits {
    /// Python's settings for the misses, if the front loads them.
    pub fn loading(&self) -> Option<&Loading> {
        self.loading.get()
    }

    pub(super) fn set_loading(&self, loading: Loading) -> bool {
        self.loading.set(loading).is_ok()
    }

    /// Claim the `keys` (sorted, each once) of a lookup's misses: the ones no other lookup
    /// is loading are this one's to load.
    pub fn claim(&self, keys: &[Key]) -> Claim<'_> {
        let claim = self.claim_keys(keys);
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.misses += keys.len() as u64;
        served.deduplicated += claim.waiting.len() as u64;
        claim
    }

    /// Whether entries of the front's own were hit inside their refresh window since the
    /// last `take_due`.
    pub fn has_due(&self) -> bool {
        self.has_due.load(Ordering::Acquire)
    }

    /// The front's own entries hit inside their refresh window, to be read again while they
    /// still answer (refresh ahead: a hot entry never expires), and those outdated by their
    /// group's batch write (hit, or queued by Python's sweep), per API whose answer bytes
    /// they hold and per reason, each claimed: those another load has in flight are left to
    /// it (a refresh waits for nothing). Not misses: counted as refreshed once stored.
    pub fn take_due(&self) -> Vec<(u8, bool, Claim<'_>)> {
        let mut due = {
            let mut queued = self.due.lock().unwrap_or_else(|e| e.into_inner());
            self.has_due.store(false, Ordering::Release);
            std::mem::take(&mut *queued)
        };
        due.sort_unstable(); // by API, reason, then key: each claim's keys sorted
        due.dedup();
        let mut claims = Vec::new();
        for (api, outdated) in [(REST, false), (REST, true), (GRPC, false), (GRPC, true)] {
            let keys: Vec<Key> = due
                .iter()
                .filter(|d| d.0 == api && d.1 == outdated)
                .map(|d| d.2.clone())
                .collect();
            if keys.is_empty() {
                continue;
            }
            let mut claim = self.claim_keys(&keys);
            // (not waited for: dropping them unpins them)
            claim.waiting.clear();
            if !claim.mine.is_empty() {
                claims.push((api, outdated, claim));
            }
        }
        claims
    }

    /// A refresh's load stored (`take_due`): counted, as refresh ahead's or (`outdated`) a
    /// batch write's.
    pub fn refreshed(&self, keys: usize, outdated: bool) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        if outdated {
            served.generation_refreshed += keys as u64;
        } else {
            served.refreshed += keys as u64;
        }
    }

    /// Queue the front's own entries of `keys` that their group's batch write outdated
    /// (`OUTDATED`) and no hit has queued yet, to be read again (`take_due`): Python's sweep
    /// after a batch write, at its pace. How many were queued.
    pub fn queue_outdated(&self, keys: &[Vec<u8>]) -> usize {
        let mut due = Vec::new();
        // at most MAX_NOTED queued: a key left out keeps its mark unset, and its next hit
        // queues it
        let room = super::MAX_NOTED
            .saturating_sub(self.due.lock().unwrap_or_else(|e| e.into_inner()).len());
        {
            let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
            for key in keys {
                if due.len() >= room {
                    break;
                }
                if let Some(hit) = entries.get(key.as_slice()) {
                    if hit.own()
                        && hit.notice_at == OUTDATED
                        && !hit.noticed.swap(true, Ordering::Relaxed)
                    {
                        due.push(Due::of(key, hit));
                    }
                }
            }
        }
        let queued = due.len();
        if queued > 0 {
            self.due
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .append(&mut due);
            self.has_due.store(true, Ordering::Release);
        }
        queued
    }

    /// The commands reading `keys` (a group index, 2 bytes, then the Redis key): each
    /// group's whole read, one command per key. None where a group's read is not defined.
    pub fn load_commands(&self, keys: &[Key]) -> Option<Commands> {
        let reads = self.reads.read().unwrap_or_else(|e| e.into_inner());
        let mut commands = Commands::with_capacity(keys.len());
        for key in keys {
            let read = reads.get(&u16::from_be_bytes([*key.first()?, *key.get(1)?]))?;
            push_command(&mut commands, read, &key[2..]);
        }
        Some(commands)
    }

    /// Store the entries of `claim`'s keys from Redis's replies to their `load_commands`
    /// (`buf`), loaded for a lookup of `api`. Keys whose reply is not one the native core
    /// reads are left out (Python's path loads them), and so are those dropped while they
    /// loaded. The entries the admission did not store, which answer the lookup only; None
    /// where `buf` is not those replies.
    pub fn store_loaded(&self, claim: &Claim<'_>, buf: &[u8], api: u8) -> Option<Passing> {
        let keys = &claim.mine;
        // per key: dropped while it loaded (not stored), and waited for by other lookups
        // (stored whatever the admission says: they answer from the cache)
        let (disowned, waited): (Vec<bool>, Vec<bool>) = {
            let flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter()
                .map(|key| {
                    flights
                        .get(key.as_slice())
                        .map_or((true, false), |f| (f.disowned, f.pins > 1))
                })
                .unzip()
        };
        let loading = self.loading.get()?;
        // keys whose entry will most likely answer this lookup only (the doorkeeper's first
        // loads at the bounds): made without the packed values, which only a stored entry
        // keeps (for a reload's compare and Python's answers); a compact entry's are its answer
        let first: Vec<bool> = if self.compact {
            vec![false; keys.len()]
        } else {
            let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter()
                .zip(&waited)
                .map(|(key, &waited)| !waited && first_load(&owned, key))
                .collect()
        };
        let reads = self.reads.read().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let now_ms = unix_now_ms();
        let mut made = Vec::with_capacity(keys.len());
        let (mut slots, mut order, mut answered) = (Vec::new(), Vec::new(), Vec::new());
        let mut pos = 0;
        // the entries there: a load keeps the other API's answer bytes an entry had, and an
        // entry of its own whose stored values are those read again is kept as it is
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        for (((key, &disowned), &waited), &first) in
            keys.iter().zip(&disowned).zip(&waited).zip(&first)
        {
            let read = reads.get(&u16::from_be_bytes([key[0], key[1]]))?;
            let (error, next) = read.shape.read(buf, pos, &mut slots, &mut order).ok()?;
            pos = next;
            if error.is_some() || disowned {
                continue; // a key of another type (Python names it), or invalidated
            }
            let there = entries.get(key.as_slice());
            let thin = first && there.is_none();
            if let Some(made_one) = self.entry(
                read,
                &slots,
                now_ms,
                &mut answered,
                api,
                there,
                thin,
                loading,
            ) {
                made.push((key.as_slice(), made_one, waited));
            }
        }
        drop(entries);
        if pos != buf.len() {
            return None;
        }
        drop(reads);
        let passing = self.insert_own(made, now, loading);
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.round_trips += 1;
        served.keys_loaded += keys.len() as u64;
        served.passed += passing.len() as u64;
        Some(passing)
    }

    /// An entry of group read `read` from one reply's `slots`, with its lifetime (as
    /// `HitCache::put_many` takes one) not yet set, or (`Made::Same`) the entry `there`
    /// again: None where the native core does not read it. `thin`: made to answer its
    /// lookup only, without the packed values.
    #[allow(clippy::too_many_arguments)]
    fn entry<'a>(
        &self,
        read: &GroupRead,
        slots: &[Option<&'a [u8]>],
        now_ms: i64,
        answered: &'a mut Vec<Option<Vec<u8>>>,
        api: u8,
        there: Option<&Hit>,
        thin: bool,
        loading: &Loading,
    ) -> Option<(Made, f64)> {
        let refs: Vec<Option<&[u8]>>;
        let (types, stored, written, negative, until) = if read.windowed(0) {
            let negative = slots.first()?.is_none();
            let (types, written) = read.answered(0, slots, now_ms, answered)?;
            refs = answered.iter().map(|v| v.as_deref()).collect();
            // the answer holds until the next tile boundary
            let tile = read.windows.first()?.as_ref()?.0.tile_ms.max(1);
            let boundary = (now_ms.div_euclid(tile) + 1) * tile;
            let until = Some((boundary - now_ms).max(0) as f64 / 1000.0);
            (types, &refs[..], written, negative, until)
        } else {
            let (types, stored, written) = read.group(0, slots)?;
            let written = write_time(written)?;
            let negative = written.is_none() && stored.iter().all(Option::is_none);
            (types, stored, written, negative, None)
        };
        let base = if negative {
            loading.negative_ttl
        } else {
            loading.ttl
        };
        // a negative TTL of 0: the entry answers the lookup that loaded it, and no other
        let mut ttl = (base * (1.0 + loading.jitter * (self.unit_random() - 0.5))).max(0.0);
        if let Some(until) = until {
            ttl = ttl.min(until);
        }
        // the entry there is the front's own, of the values read again (an entry expired
        // between a group's writes: most reloads) and holds this API's answer bytes: it is
        // kept, with no bytes made, copied or freed (an aggregated group's answer changes
        // with time: always made again)
        if let Some(hit) = there.filter(|hit| hit.own() && until.is_none()) {
            let held = if self.compact { &hit.values } else { &hit.raw };
            let answers = self.compact
                || if api == GRPC {
                    hit.wire.is_some()
                } else {
                    hit.values.is_some()
                };
            let same = if negative {
                hit.negative
            } else {
                !hit.negative
                    && held
                        .as_ref()
                        .map_or(false, |raw| packs(raw.bytes(), stored.iter().copied()))
            };
            if same && answers {
                let at = held.as_ref().map_or(0, |raw| raw.bytes().as_ptr() as usize);
                let written = written.unwrap_or(NOT_WRITTEN);
                let was = hit.written;
                return Some((Made::Same { at, was, written }, ttl));
            }
        }
        // a load for one API keeps the other API's answer bytes the entry there had, so that
        // lookups of both keep hitting
        let both = !self.compact
            && there.map_or(false, |hit| {
                if api == GRPC {
                    hit.values.is_some()
                } else {
                    hit.wire.is_some()
                }
            });
        let stored = stored.iter().copied();
        // written into buffers kept per thread, then boxed at their size: one allocation each
        // (a Vec grown then shrunk to a box took three)
        SCRATCH
            .with(|scratch| {
                let scratch = &mut *scratch.borrow_mut();
                for buffer in scratch.iter_mut() {
                    buffer.clear();
                }
                let [out, packed, present, other] = scratch;
                let own = |bytes: &Vec<u8>| Held::Own(Box::from(bytes.as_slice()));
                let (mut values, mut wire, mut raw) = (None, None, None);
                if self.compact {
                    write_values(types, stored, false, other, present, Some(packed)).ok()?;
                    values = Some(if negative {
                        Held::Own(Box::default())
                    } else {
                        own(packed)
                    });
                } else {
                    let pack = if thin { None } else { Some(&mut *packed) };
                    write_values(types, stored.clone(), api == GRPC, out, present, pack).ok()?;
                    if !negative && !thin {
                        raw = Some(own(packed));
                    }
                    // a negative entry's bytes are a few: both APIs' are kept
                    if both || negative {
                        let ignored = packed; // the present pattern is the same: written once
                        ignored.clear();
                        write_values(types, stored, api != GRPC, other, ignored, None).ok()?;
                        if api == GRPC {
                            values = Some(own(other));
                        } else {
                            wire = Some(own(other));
                        }
                    }
                    if api == GRPC {
                        wire = Some(own(out));
                    } else {
                        values = Some(own(out));
                    }
                }
                Some((values, wire, raw, own(present)))
            })
            .map(|(values, wire, raw, present)| {
                let hit = Hit {
                    values,
                    wire,
                    raw,
                    present,
                    written: written.unwrap_or(NOT_WRITTEN),
                    negative,
                    fault: false,
                    expires: 0,
                    loaded: 0,
                    notice_at: 0,
                    noticed: AtomicBool::new(false),
                    visited: AtomicBool::new(false),
                    shadowed: AtomicBool::new(false),
                    ends: OnceBox::new(),
                    cost: 0,
                };
                (Made::New(hit), ttl)
            })
    }

    /// Store entries the front loaded `now`, each fresh for its TTL and noted for a refresh
    /// in the last `refresh_ahead` share of it, those admitted (`admitted`); then evict
    /// past the bounds. The entries not admitted, which answer their lookup only.
    fn insert_own(
        &self,
        made: Vec<(&[u8], (Made, f64), bool)>,
        now: Instant,
        loading: &Loading,
    ) -> Passing {
        let mut passing = Vec::new();
        if made.is_empty() {
            return Passing(passing);
        }
        let after = |s: f64| self.ticks(now + crate::time::seconds(s));
        let mut old = Vec::with_capacity(made.len());
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        for (key, (made, ttl), waited) in made {
            let mut hit = match made {
                // (a thin entry is never stored: the doorkeeper still notes its key)
                Made::New(hit)
                    if !waited
                        && (!admitted(
                            &mut owned,
                            key,
                            Owned::charge(key, hit.held_bytes()),
                            entries.contains_key(key),
                        ) || hit.thin(self.compact)) =>
                {
                    passing.push((Key::new(key), hit));
                    continue;
                }
                Made::New(hit) => hit,
                Made::Same { at, was, written } => {
                    // the same entry, if it is still there (else: not stored; the lookup
                    // finds it missing, and Python's path loads it)
                    if let Some(hit) = entries.get_mut(key).filter(|hit| {
                        let held = if self.compact { &hit.values } else { &hit.raw };
                        hit.own()
                            && hit.written == was
                            && held.as_ref().map_or(0, |b| b.bytes().as_ptr() as usize) == at
                    }) {
                        hit.written = written;
                        live(hit, ttl, loading, &after);
                        hit.noticed.store(false, Ordering::Relaxed);
                        hit.shadowed.store(false, Ordering::Relaxed); // a new load's
                    }
                    continue;
                }
            };
            live(&mut hit, ttl, loading, &after);
            // an entry of the key's replaced in place: its key is not boxed again (and is
            // in the ring already)
            let replaced = match entries.get_mut(key) {
                Some(slot) => Some(std::mem::replace(slot, hit)),
                None => entries.insert(key.into(), hit),
            };
            if let Some(replaced) = &replaced {
                owned.remove(key, replaced);
            }
            if let Some(hit) = entries.get(key) {
                owned.add(key, hit, replaced.is_some());
            }
            old.extend(replaced);
        }
        let mut evicted = evict(&mut entries, &mut owned, &self.flights);
        drop(owned);
        drop(entries);
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .evictions += evicted.len() as u64;
        // the entries replaced and evicted (Python's bytes are released when it next holds
        // the GIL)
        old.append(&mut evicted);
        drop(old);
        passing.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Passing(passing)
    }

    /// The entries: how many, the bytes they are counted for, and how many of them the
    /// fronts loaded themselves.
    pub(super) fn size(&self) -> (usize, usize, usize) {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        (owned.count, owned.bytes, owned.own)
    }

    /// A draw in [0, 1) (the TTL's jitter).
    fn unit_random(&self) -> f64 {
        (self.next_random() >> 11) as f64 / (1u64 << 53) as f64
    }
}
