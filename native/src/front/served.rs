//! The serving log's side on the fronts: request ids, and the answers given here.
//!
//! Every lookup a front takes gets a request id: the client's `x-request-id` (1 to 128
//! visible ASCII characters), or one made here (`ServedLog.prefix` and a counter, as Python
//! makes its own), sent back in the same header or metadata. A lookup the front answers
//! itself (a cache hit, a planned read) is offered to the log when its request id is
//! sampled (xxh32 of the id below the fraction, the same test as Python's): the answer's
//! bytes are queued, bounded, for the worker's log thread, which turns them into rows. A
//! full queue drops the answer and counts it; the front never waits for the log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use xxhash_rust::xxh32::xxh32;

use crate::time::unix_now_ms;

/// The longest request id taken from a client.
const MAX_ID: usize = 128;

/// Where an answer's values came from.
pub(crate) const FROM_L1: u8 = 0;
pub(crate) const FROM_REDIS: u8 = 1;

/// A client's request id, if it is one we keep: 1 to 128 visible ASCII characters.
pub(crate) fn given_id(value: Option<&[u8]>) -> Option<String> {
    let value = value?;
    let ok = !value.is_empty()
        && value.len() <= MAX_ID
        && value.iter().all(|b| (0x21..0x7f).contains(b));
    if ok {
        std::str::from_utf8(value).ok().map(str::to_owned)
    } else {
        None
    }
}

struct Item {
    api: u8,
    request_id: String,
    served_at_ms: i64,
    source: u8,
    answer: Vec<u8>,
}

pub(crate) struct Served {
    prefix: String,
    next: AtomicU64,
    threshold: u64,  // sampled: xxh32(id) < threshold (2^32: every request)
    capacity: usize, // bytes of answers queued at most
    items: Mutex<(VecDeque<Item>, usize)>, // the answers, and their bytes
    dropped: AtomicU64,
    logging: bool,
}

impl Served {
    /// The request id of a lookup: the client's, or a new one.
    pub(crate) fn request_id(&self, given: Option<&[u8]>) -> String {
        given_id(given).unwrap_or_else(|| {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            format!("{}{:016x}", self.prefix, n)
        })
    }

    fn sampled(&self, request_id: &str) -> bool {
        self.threshold >= 1 << 32 || u64::from(xxh32(request_id.as_bytes(), 0)) < self.threshold
    }

    /// Offer an answer given on a front (`api`: `hits::REST`, `GRPC`, `FEAST`) to the log.
    pub(crate) fn offer(&self, api: u8, request_id: &str, source: u8, answer: &[u8]) {
        if !self.logging || !self.sampled(request_id) {
            return;
        }
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        if items.1 + answer.len() > self.capacity {
            drop(items);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        items.1 += answer.len();
        items.0.push_back(Item {
            api,
            request_id: request_id.to_owned(),
            served_at_ms: unix_now_ms(),
            source,
            answer: answer.to_vec(),
        });
    }
}

/// A queued answer as Python takes it: (api, request id, served at in unix ms, source
/// (0: the L1, 1: Redis), the answer's bytes).
type Taken<'py> = (u8, String, i64, u8, Bound<'py, PyBytes>);

/// The log's queue of the fronts of one worker, shared by its REST and gRPC fronts.
#[pyclass(module = "feature_store._native")]
pub struct ServedLog {
    pub(crate) served: Arc<Served>,
}

#[pymethods]
impl ServedLog {
    /// `prefix`: what the request ids made here start with (unique to the worker);
    /// `threshold`: sampled when xxh32(id) < threshold (2^32 for every request, 0 for
    /// none); `capacity`: bytes of answers queued at most; `logging` False: request ids only.
    #[new]
    fn new(prefix: String, threshold: u64, capacity: usize, logging: bool) -> Self {
        ServedLog {
            served: Arc::new(Served {
                prefix,
                next: AtomicU64::new(0),
                threshold,
                capacity,
                items: Mutex::new((VecDeque::new(), 0)),
                dropped: AtomicU64::new(0),
                logging,
            }),
        }
    }

    /// Every answer queued since the last take, oldest first.
    fn take<'py>(&self, py: Python<'py>) -> Vec<Taken<'py>> {
        let items: Vec<Item> = {
            let mut queued = self.served.items.lock().unwrap_or_else(|e| e.into_inner());
            queued.1 = 0;
            queued.0.drain(..).collect()
        };
        items
            .into_iter()
            .map(|i| {
                let answer = PyBytes::new(py, &i.answer);
                (i.api, i.request_id, i.served_at_ms, i.source, answer)
            })
            .collect()
    }

    /// Answers dropped since the start because the queue was full.
    #[getter]
    fn dropped(&self) -> u64 {
        self.served.dropped.load(Ordering::Relaxed)
    }

    /// Whether the id is sampled (the test Python makes too).
    fn sampled(&self, request_id: &str) -> bool {
        self.served.sampled(request_id)
    }
}
