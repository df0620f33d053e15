//! Python's side of a front's Redis connections (`serving/fronts/links.py` opens and
//! governs them): the handle it holds (`FrontRedis`) to add connections, route a cluster's
//! slots, set and drain their policy, and run on the front's runtime the L1's work that
//! reads on them (refreshes of entries a batch write outdated) or waits for their loads (a
//! load of Python's that found keys a front is loading). The connections themselves are
//! `redis.rs`'s; the reads they serve, `lookup.rs`'s.

use std::sync::Arc;

use pyo3::prelude::*;

use super::lookup::refresh;
use super::redis::Direct;
use super::slots::SLOTS;
use crate::hits::{HitCache, PythonLoad};

/// A front's Redis connections, for Python: it opens them, hands over the cluster's slot
/// table, sets and drains their policy, and has the L1's work that needs them run on the
/// front's runtime.
#[pyclass(frozen, module = "feature_store._native")]
pub struct FrontRedis {
    direct: Arc<Direct>,
}

impl FrontRedis {
    pub(crate) fn of(direct: &Arc<Direct>) -> Self {
        FrontRedis {
            direct: Arc::clone(direct),
        }
    }
}

#[pymethods]
impl FrontRedis {
    /// Read planned lookups of node `node` (0: the only one) on this connected TCP socket
    /// (its fd, owned from now on).
    #[pyo3(signature = (fd, node=0))]
    fn add(&self, fd: std::os::unix::io::RawFd, node: usize) -> PyResult<()> {
        // SAFETY: the caller gives up the socket (socket.detach()); it is ours to close.
        let socket =
            unsafe { <std::net::TcpStream as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        Ok(self.direct.add(socket, node)?)
    }

    /// Route lookups by hash slot: `table` holds each of the 16,384 slots' node as a
    /// little-endian u16 (65,535: no known master); None: one Redis, node 0.
    #[pyo3(signature = (table))]
    fn route(&self, table: Option<&[u8]>) -> PyResult<()> {
        let table = match table {
            None => None,
            Some(bytes) if bytes.len() == 2 * SLOTS => Some(
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Some(bytes) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "a slot table is {} bytes, not {}",
                    2 * SLOTS,
                    bytes.len()
                )))
            }
        };
        self.direct.route(table);
        Ok(())
    }

    /// MOVED and ASK replies the front met since the last call (each handed its lookup to
    /// Python): the slot table is out of date.
    fn redirects(&self) -> u64 {
        self.direct.redirects()
    }

    /// Whether node `node`'s connections may be read on (its circuit is closed), each size
    /// class of round trips as (its most keys, None for the rest; its timeout in seconds),
    /// and the most keys one round trip carries.
    #[pyo3(signature = (allowed, timeouts, flush_keys, node=0))]
    fn set(
        &self,
        allowed: bool,
        timeouts: Vec<(Option<usize>, f64)>,
        flush_keys: usize,
        node: usize,
    ) {
        self.direct.set(node, allowed, timeouts, flush_keys);
    }

    /// `(live connections, [(seconds, keys)] of the round trips, round trips timed out)`
    /// of node `node` since the last drain.
    #[pyo3(signature = (node=0))]
    fn drain(&self, node: usize) -> (usize, Vec<(f64, usize)>, u64) {
        self.direct.drain(node)
    }

    /// Queue the front's own entries of `keys` (group index, 2 bytes, then the Redis key)
    /// that their group's batch write outdated, to be read again on this front's runtime
    /// (`front::lookup::refresh`), where the front may answer no lookup to start it: Python's
    /// sweep after a batch write, at its pace. Those of `keys` whose entries Python stored,
    /// for Python's policy.
    fn refresh_outdated(&self, cache: &HitCache, keys: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        let hits = &cache.hits;
        if hits.queue_outdated(&keys) > 0 {
            let run = refresh(Arc::clone(hits), Arc::clone(&self.direct));
            self.direct.handle.spawn(run);
        }
        hits.not_own(keys)
    }

    /// Write 1 to the eventfd `fd` once the fronts' loads of `load`'s keys a front was
    /// loading already (`PythonLoad.elsewhere`) have ended, or `timeout` seconds have passed:
    /// waited for on this front's runtime, without the GIL. The write goes to a duplicate of
    /// `fd`, closed after it, so that Python may close its own at any time (its wait given
    /// up) without the number reaching another file.
    fn notify(&self, mut load: PyRefMut<'_, PythonLoad>, fd: i32, timeout: f64) -> PyResult<()> {
        use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: dup of a descriptor Python holds open for this call; the duplicate is
        // this task's alone, closed when the task ends (run or dropped at shutdown)
        let own = unsafe { libc::dup(fd) };
        if own < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: `own` is a new descriptor nothing else owns
        let own = unsafe { OwnedFd::from_raw_fd(own) };
        let waiting = load.take_waiting();
        let wait = crate::time::seconds(timeout);
        self.direct.handle.spawn(async move {
            let loads = async {
                for mut rx in waiting {
                    let _ = rx.changed().await; // ends when that load's claim does
                }
            };
            let _ = tokio::time::timeout(wait, loads).await;
            let one: u64 = 1;
            // SAFETY: `own` is this task's duplicate of an eventfd, open while it lives; an
            // eventfd write of 8 bytes is never partial (a full counter: EAGAIN, and Python
            // has been woken already)
            unsafe {
                libc::write(
                    own.as_raw_fd(),
                    &one as *const u64 as *const libc::c_void,
                    8,
                )
            };
        });
        Ok(())
    }
}
