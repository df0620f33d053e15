//! A lookup on a front, decided once for both protocols: a hit in the L1's mirror is
//! answered at once; a lookup with keys missing is handed to Python to load them, then
//! answered from the mirror (replayed); without the L1, a planned lookup is read on the
//! front's own Redis connections, or (none usable) its commands are sent by Python, and
//! the answer is written from the replies (on a cluster, none usable: the handler's). Anything else, or anything that does not come
//! out as planned, is the route's handler's (Python), which stays the one place where
//! errors, misses and the cache's policy are decided.

use std::future::Future;

use super::queue::{Reply, Waited, Work};
use super::redis::Direct;
use super::served::{FROM_L1, FROM_REDIS};
use crate::hits::{Hits, Looked};

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

/// The lookup of `api` in `request` against the mirror (`hits`) or, without the L1, on
/// the front's Redis connections (`direct`); `python` queues work for Python and waits
/// for its reply.
pub(crate) async fn lookup<A, Q, F>(
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
            return match python(Work::Load(missing.keys.clone())).await {
                Waited::Reply(Reply::Loaded) => match hits.replay(request, api, &missing) {
                    Some(answer) => Outcome::Here(answer, FROM_REDIS),
                    None => Outcome::Handler, // evicted or dropped again
                },
                waited => Outcome::Ended(waited),
            };
        }
        None => {}
    }
    let mut plan = match hits.plan(api, request) {
        Some(plan) => plan,
        None => return Outcome::Handler,
    };
    if let Some(replies) = direct.read(&plan).await {
        return match hits.render(&plan, &replies, true) {
            Some(answer) => Outcome::Here(answer, FROM_REDIS),
            None => Outcome::Handler, // a reply the handler answers (it reads again)
        };
    }
    if direct.routed() {
        // a cluster: Python's cluster client reads it (it follows MOVED and ASK)
        return Outcome::Handler;
    }
    let command = Work::Read(std::mem::take(&mut plan.command), plan.count);
    match python(command).await {
        Waited::Reply(Reply::Replies(replies)) => match hits.render(&plan, &replies, false) {
            Some(answer) => Outcome::Here(answer, FROM_REDIS),
            None => Outcome::Handler,
        },
        waited => Outcome::Ended(waited),
    }
}
