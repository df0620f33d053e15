//! The L1's single flight: a key being loaded, by a front's lookup or by Python, is claimed
//! (`Hits::claim_keys`), and a front's lookup that misses it meanwhile waits for that load
//! instead of reading it again (`load.rs`, `front/lookup.rs`). A claim ends when its load
//! stores or fails, or when what made it is dropped, so nothing stays locked; the keys stay
//! pinned (the eviction passes over them) until every lookup that loaded or waited for them
//! has answered from them.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use tokio::sync::watch;

use super::{Hits, Key, Map};

/// A key being loaded: what its waiters watch (its sender is dropped when the load ends),
/// and whether its entry was dropped while it loaded (an invalidation: what the load read
/// may be older than the write, so it is not stored).
pub(super) struct Flight {
    done: watch::Receiver<()>,
    pub(super) disowned: bool,
    loading: bool,          // its load runs (else: loaded or failed, and pinned only)
    pub(super) pins: usize, // the lookups that load or wait for it and have not answered yet
}

pub(super) type Flights = Mutex<Map<Key, Flight>>;

/// The keys of one lookup's misses: those it loads (`mine`), and the loads of others it
/// waits for (`waited`, `waiting`). Dropping it ends its own claims, whatever happened to
/// the load.
pub struct Claim<'h> {
    flights: &'h Flights,
    pub mine: Vec<Key>,
    senders: Vec<watch::Sender<()>>,
    pub waiting: Vec<watch::Receiver<()>>,
    waited: Vec<Key>,
}

impl<'h> Claim<'h> {
    /// The claims' loads are stored: their waiters go on, and the keys stay pinned (the
    /// eviction passes over them) until every lookup that loaded them or waited for them
    /// has answered from them (`Pinned`'s `Drop`), so that under a small bound a load is
    /// not evicted by the next before it is served.
    pub fn end(mut self) -> Pinned<'h> {
        loaded(self.flights, &self.mine);
        self.senders.clear(); // the waiters wake: their `changed()` ends
        Pinned {
            flights: self.flights,
            keys: std::mem::take(&mut self.mine),
            waited: std::mem::take(&mut self.waited),
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        loaded(self.flights, &self.mine); // (failed: `end` takes them when stored)
        unpin(self.flights, &self.mine, &self.waited);
        self.senders.clear(); // the waiters wake: their `changed()` ends
    }
}

/// The keys a lookup loaded and stored, and those it waited for, pinned until it has
/// answered (`Claim::end`).
pub struct Pinned<'h> {
    flights: &'h Flights,
    pub keys: Vec<Key>, // sorted
    waited: Vec<Key>,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        unpin(self.flights, &self.keys, &self.waited);
    }
}

/// The keys a load of Python's reads (`HitCache::claim`), claimed as a front's lookup
/// claims its misses: a front's lookup that misses one of them meanwhile waits for
/// Python's load (up to `Loading::wait`) instead of reading it again. The keys a front was
/// loading already are Python's to wait for in turn (`elsewhere`, `notify`), pinned until
/// it has. Its claims end with `end`, once Python has stored what it read, or when it is
/// dropped, whatever happened.
#[pyclass(module = "feature_store._native")]
pub struct PythonLoad {
    hits: Arc<Hits>,
    mine: Vec<Key>,
    senders: Vec<watch::Sender<()>>,
    waited: Vec<Key>, // the keys a front was loading, sorted
    waiting: Vec<watch::Receiver<()>>,
}

impl PythonLoad {
    /// Claim `keys` (sorted, each once): those no front is loading are this load's; the
    /// others are waited for (`notify`).
    pub(super) fn claim(hits: &Arc<Hits>, keys: &[Key]) -> Self {
        let mut claim = hits.claim_keys(keys);
        let load = PythonLoad {
            hits: Arc::clone(hits),
            mine: std::mem::take(&mut claim.mine),
            senders: std::mem::take(&mut claim.senders),
            waited: std::mem::take(&mut claim.waited),
            waiting: std::mem::take(&mut claim.waiting),
        };
        drop(claim); // holds nothing now
        load
    }

    /// The fronts' loads this load waits for (`elsewhere`), taken to be waited for on a
    /// front's runtime (`front::links::FrontRedis::notify`).
    pub(crate) fn take_waiting(&mut self) -> Vec<watch::Receiver<()>> {
        std::mem::take(&mut self.waiting)
    }

    fn finish(&mut self) {
        let flights = &self.hits.flights;
        loaded(flights, &self.mine);
        unpin(flights, &self.mine, &self.waited);
        self.mine.clear();
        self.waited.clear();
        self.waiting.clear();
        self.senders.clear(); // the fronts' waiters wake: their `changed()` ends
    }
}

#[pymethods]
impl PythonLoad {
    /// Python's load has stored what it read (or failed): the fronts' lookups waiting for
    /// it go on, and answer from the cache.
    fn end(&mut self) {
        self.finish();
    }

    /// How many of the keys this load claimed (the others a front was loading already).
    fn __len__(&self) -> usize {
        self.mine.len()
    }

    /// The keys a front was loading already (group index, 2 bytes, then the Redis key).
    fn elsewhere<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, pyo3::types::PyBytes>> {
        let keys = self.waited.iter();
        keys.map(|k| pyo3::types::PyBytes::new(py, k)).collect()
    }
}

impl Drop for PythonLoad {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The loads of `mine` ended (stored, or failed): a lookup that misses them now loads them
/// again rather than wait.
fn loaded(flights: &Flights, mine: &[Key]) {
    if mine.is_empty() {
        return;
    }
    let mut flights = flights.lock().unwrap_or_else(|e| e.into_inner());
    for key in mine {
        if let Some(flight) = flights.get_mut(key.as_slice()) {
            flight.loading = false;
        }
    }
}

/// A lookup is done with `mine` and `waited`: a key no other lookup still pins is no
/// longer in flight.
fn unpin(flights: &Flights, mine: &[Key], waited: &[Key]) {
    if mine.is_empty() && waited.is_empty() {
        return;
    }
    let mut flights = flights.lock().unwrap_or_else(|e| e.into_inner());
    for key in mine.iter().chain(waited) {
        if let Some(flight) = flights.get_mut(key.as_slice()) {
            flight.pins -= 1;
            if flight.pins == 0 {
                flights.remove(key.as_slice());
            }
        }
    }
}

impl Hits {
    pub(super) fn claim_keys(&self, keys: &[Key]) -> Claim<'_> {
        let mut claim = Claim {
            flights: &self.flights,
            mine: Vec::with_capacity(keys.len()),
            senders: Vec::new(),
            waiting: Vec::new(),
            waited: Vec::new(),
        };
        // one channel for the claim's keys: their load ends together
        let (tx, done) = watch::channel(());
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            match flights.get_mut(key.as_slice()) {
                Some(flight) if flight.loading => {
                    flight.pins += 1;
                    claim.waiting.push(flight.done.clone());
                    claim.waited.push(key.clone());
                }
                // its load ended, and the lookups it answers pin it still: this one loads it
                // again (its entry expired since, or went)
                Some(flight) => {
                    flight.pins += 1;
                    flight.loading = true;
                    flight.disowned = false;
                    flight.done = done.clone();
                    claim.mine.push(key.clone());
                }
                None => {
                    let flight = Flight {
                        done: done.clone(),
                        disowned: false,
                        loading: true,
                        pins: 1,
                    };
                    flights.insert(key.clone(), flight);
                    claim.mine.push(key.clone());
                }
            }
        }
        if !claim.mine.is_empty() {
            claim.senders.push(tx);
        }
        drop(flights);
        claim
    }

    /// A key's entry was dropped (an invalidation, `HitCache::discard`; all of them:
    /// None): a load of it in flight does not store what it read.
    pub(super) fn disown(&self, key: Option<&[u8]>) {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        match key {
            Some(key) => {
                if let Some(flight) = flights.get_mut(key) {
                    flight.disowned = true;
                }
            }
            None => flights
                .values_mut()
                .for_each(|flight| flight.disowned = true),
        }
    }
}
