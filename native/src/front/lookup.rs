//! A lookup on a front, decided once for both protocols: a hit in the L1 is answered at
//! once; a lookup with keys missing loads them on the front's own Redis connections
//! (`hits/load.rs`: single flight, decoded and stored here) and is answered from the L1
//! (replayed; an entry it found, evicted by another load before it answered, is loaded
//! once more); where the front cannot load them all (no connection or the circuit open,
//! a round trip failed, a reply only Python reads), Python loads those left, through its
//! policy (stale on error, the fault named), then the front replays. Without the L1, a
//! planned lookup is read on the front's own Redis connections, or (none usable) its
//! commands are sent by Python, and the answer is written from the replies (on a cluster,
//! none usable: the handler's). Anything else, or anything that does not come out as
//! planned, is the route's handler's (Python), which stays the one place where errors and
//! the cache's policy are decided.

use std::future::Future;
use std::sync::Arc;

use super::queue::{Reply, Waited, Work};
use super::redis::{Direct, Unread};
use super::served::{FROM_L1, FROM_REDIS};
use crate::hits::{Hits, Key, Looked, Missing, Passing};

/// How a lookup on a front ended.
pub(crate) enum Outcome<A> {
    /// answered here: the answer's bytes (a JSON body, a gRPC message), and where its
    /// values came from (`served::FROM_L1`, `FROM_REDIS`: some keys loaded for it)
    Here(Vec<u8>, u8),
    /// the route's handler answers it
    Handler,
    /// ended while Python had it: Python's answer (Redis failing: its error), or the
    /// server stopping, or the deadline passed
    Ended(Waited<A>),
}

/// The lookup of `api` in `request` against the L1 (`hits`) or, without the L1, on
/// the front's Redis connections (`direct`); `python` queues work for Python and waits
/// for its reply.
pub(crate) async fn lookup<A, Q, F>(
    hits: &Arc<Hits>,
    direct: &Arc<Direct>,
    api: u8,
    request: &[u8],
    python: Q,
) -> Outcome<A>
where
    Q: Fn(Work) -> F,
    F: Future<Output = Waited<A>>,
{
    let outcome = look(hits, direct, api, request, python).await;
    if hits.has_due() {
        // entries hit inside their refresh window: read again now, off this lookup's way
        tokio::spawn(refresh(Arc::clone(hits), Arc::clone(direct)));
    }
    outcome
}

/// Refresh ahead, on the front: the entries of its own hit inside their refresh window, or
/// outdated by their group's batch write (hit, or queued by Python's sweep:
/// `FrontRedis::refresh_outdated`), are read again on its connections while they still
/// answer (`Hits::take_due`), and stored as a miss's load is (most find the values they
/// hold: the entry is kept, with a new lifetime). A read that fails stores nothing: the
/// entries expire as they would have, and their next lookups load them (stale on error).
pub(crate) async fn refresh(hits: Arc<Hits>, direct: Arc<Direct>) {
    for (api, outdated, claim) in hits.take_due() {
        let commands = match hits.load_commands(&claim.mine) {
            Some(commands) => commands,
            None => continue,
        };
        if let Ok(replies) = direct.read(&commands).await {
            if hits.store_loaded(&claim, &replies, api).is_some() {
                hits.refreshed(claim.mine.len(), outdated);
            }
        }
    }
}

/// `lookup`'s decision chain (the module's text), before any refresh it leaves due.
async fn look<A, Q, F>(
    hits: &Hits,
    direct: &Direct,
    api: u8,
    request: &[u8],
    python: Q,
) -> Outcome<A>
where
    Q: Fn(Work) -> F,
    F: Future<Output = Waited<A>>,
{
    match hits.answer(api, request) {
        Some(Looked::Answer(answer)) => return Outcome::Here(answer, FROM_L1),
        Some(Looked::Missing(missing)) => {
            if let Some(answer) = load_here(hits, direct, api, request, &missing).await {
                return Outcome::Here(answer, FROM_REDIS);
            }
            // Python's path, for the keys still missing
            let missing = match hits.answer(api, request) {
                Some(Looked::Missing(left)) => left,
                Some(Looked::Answer(answer)) => return Outcome::Here(answer, FROM_REDIS),
                None => return Outcome::Handler,
            };
            return match python(Work::Load(
                missing.keys.iter().map(|k| k.to_vec()).collect(),
            ))
            .await
            {
                Waited::Reply(Reply::Loaded) => {
                    match hits.replay(request, api, &missing, None, &Default::default()) {
                        Some(answer) => Outcome::Here(answer, FROM_REDIS),
                        None => Outcome::Handler, // evicted or dropped again
                    }
                }
                waited => Outcome::Ended(waited),
            };
        }
        None => {}
    }
    let mut plan = match hits.plan(api, request) {
        Some(plan) => plan,
        None => return Outcome::Handler,
    };
    if let Ok(replies) = direct.read(&plan.commands).await {
        return match hits.render(&plan, &replies, true) {
            Some(answer) => Outcome::Here(answer, FROM_REDIS),
            None => Outcome::Handler, // a reply the handler answers (it reads again)
        };
    }
    if direct.routed() {
        // a cluster: Python's cluster client reads it (it follows MOVED and ASK)
        return Outcome::Handler;
    }
    let command = Work::Read(
        std::mem::take(&mut plan.commands.command),
        plan.commands.count,
    );
    match python(command).await {
        Waited::Reply(Reply::Replies(replies)) => match hits.render(&plan, &replies, false) {
            Some(answer) => Outcome::Here(answer, FROM_REDIS),
            None => Outcome::Handler,
        },
        waited => Outcome::Ended(waited),
    }
}

/// The lookup's `missing` keys to be read from Redis loaded on the front's connections
/// (those another lookup is loading: waited for), and its answer from the L1; None where
/// the front does not load misses, or they did not all load, or others are Python's to
/// complete (Python's path then takes those left). An entry the lookup found fresh but
/// another load evicted before it answered (a bound smaller than the loads in flight) is
/// loaded once more, with what it loaded first still pinned.
async fn load_here(
    hits: &Hits,
    direct: &Direct,
    api: u8,
    request: &[u8],
    missing: &Missing,
) -> Option<Vec<u8>> {
    let loading = hits.loading()?;
    let mut pins = Vec::new(); // what this lookup loaded, pinned until it answers
    let mut passing = Passing::default(); // what it loaded and the cache did not admit
    let mut left: Option<Missing> = None;
    for again in [true, false] {
        let missing = left.as_ref().unwrap_or(missing);
        if missing.absent.is_empty() {
            return None; // entries Python completes (answer bytes, a cached fault)
        }
        let mut claim = hits.claim(&missing.absent);
        let waiting = std::mem::take(&mut claim.waiting);
        if !claim.mine.is_empty() {
            let commands = hits.load_commands(&claim.mine)?;
            let replies = match direct.read(&commands).await {
                Ok(replies) => replies,
                Err(why) => {
                    drop(claim);
                    if direct.routed() || why == Unread::Elsewhere {
                        // a cluster: a moved slot or a master down whose replica took over,
                        // which Python's cluster client follows (and serves stale if it
                        // cannot); or a connection closed under the front with nothing
                        // saying Redis is down: Python's path reads it on a new one
                        return None;
                    }
                    // one Redis failing (a timeout, the circuit open): stale will do
                    return hits.stale(request, api, missing, loading.max_stale);
                }
            };
            passing.join(hits.store_loaded(&claim, &replies, api)?);
        }
        // their waiters go on; pinned until answered below
        pins.push(claim.end());
        // the keys it loaded, sorted: its one load's (most lookups), or both rounds'
        let union;
        let stored: &[Key] = match pins.as_slice() {
            [only] => &only.keys,
            all => {
                let mut keys: Vec<Key> = all.iter().flat_map(|p| p.keys.clone()).collect();
                keys.sort_unstable();
                union = keys;
                &union
            }
        };
        if !waiting.is_empty() {
            let others = async {
                for mut rx in waiting {
                    let _ = rx.changed().await; // ends when that load's claim does
                }
            };
            let _ = tokio::time::timeout(loading.wait, others).await;
        }
        if let Some(answer) = hits.replay(request, api, missing, Some(stored), &passing) {
            return Some(answer);
        }
        if !again {
            break;
        }
        left = match hits.answer(api, request)? {
            // what it loaded is pinned: one of those missing was not stored (a reply only
            // Python reads, a write meanwhile), and Python's path takes it
            Looked::Missing(mut now) => {
                now.absent.retain(|key| stored.binary_search(key).is_err());
                Some(now)
            }
            Looked::Answer(answer) => return Some(answer),
        };
    }
    None
}
