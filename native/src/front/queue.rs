//! Calls a front hands to Python: queued in arrival order, announced on an eventfd that the
//! asyncio loop watches, and taken all at once (`take`); Python answers each through the
//! call it holds (`Pending`), which wakes the connection's task on the front's thread.

use std::collections::VecDeque;
use std::os::unix::io::RawFd;
use std::sync::Mutex;

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// What a queued call asks of Python.
pub(crate) enum Work {
    Answer,               // the handler answers it
    Read(Vec<u8>, usize), // send a planned read's commands (so many) to Redis
    Load(Vec<Vec<u8>>),   // load a lookup's missing keys into the L1
}

/// What Python hands back for a queued call: the front's answer (`A`: its protocol's),
/// Redis's replies to a planned read's commands, or word that a load's keys are in the L1.
pub(crate) enum Reply<A> {
    Answer(A),
    Replies(Bytes),
    Loaded,
}

/// How waiting for Python ended.
pub(crate) enum Waited<A> {
    Reply(Reply<A>),
    Gone, // the call was dropped unanswered: the server is stopping
    Late, // the call's deadline passed first
}

struct Queued<A> {
    route: usize,
    authorization: Option<String>,
    request_id: String,
    request: Bytes,
    work: Work,
    reply: oneshot::Sender<Reply<A>>,
}

/// A front's queue of calls for Python.
pub(crate) struct Queue<A> {
    calls: Mutex<VecDeque<Queued<A>>>,
    wake_fd: RawFd,
}

impl<A> Queue<A> {
    /// `wake_fd`: an eventfd the Python side owns for the front's life.
    pub(crate) fn new(wake_fd: RawFd) -> Self {
        Queue {
            calls: Mutex::new(VecDeque::new()),
            wake_fd,
        }
    }

    /// Queue a call of `route` (its request bytes, Authorization header and request id)
    /// for Python.
    pub(crate) fn send(
        &self,
        route: usize,
        authorization: &Option<String>,
        request_id: &str,
        request: &Bytes,
        work: Work,
    ) -> oneshot::Receiver<Reply<A>> {
        let (tx, rx) = oneshot::channel();
        let call = Queued {
            route,
            authorization: authorization.clone(),
            request_id: request_id.to_owned(),
            request: request.clone(),
            work,
            reply: tx,
        };
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = calls.is_empty();
        calls.push_back(call);
        drop(calls);
        if was_empty {
            // the loop drains the whole queue on each wake-up: one write per batch
            let one: u64 = 1;
            // SAFETY: wake_fd is an eventfd owned by the Python side for the front's life;
            // an eventfd write of 8 bytes cannot be partial, and a full counter (EAGAIN) means
            // a wake-up is already pending.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
        rx
    }

    /// Every call queued since the last take, oldest first.
    pub(crate) fn take(&self) -> Vec<Pending<A>> {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls
            .drain(..)
            .map(|q| {
                let (command, count, load) = match q.work {
                    Work::Answer => (Vec::new(), 0, Vec::new()),
                    Work::Read(command, count) => (command, count, Vec::new()),
                    Work::Load(keys) => (Vec::new(), 0, keys),
                };
                Pending {
                    route: q.route,
                    authorization: q.authorization,
                    request_id: q.request_id,
                    request: q.request,
                    command,
                    count,
                    load,
                    reply: Some(q.reply),
                }
            })
            .collect()
    }
}

/// Python's reply to a call, `Waited::Late` when the call's deadline passed first.
pub(crate) async fn wait<A>(
    rx: oneshot::Receiver<Reply<A>>,
    deadline: Option<Instant>,
) -> Waited<A> {
    let reply = match deadline {
        Some(at) => match tokio::time::timeout_at(at, rx).await {
            Ok(reply) => reply,
            Err(_) => return Waited::Late,
        },
        None => rx.await,
    };
    match reply {
        Ok(reply) => Waited::Reply(reply),
        Err(_) => Waited::Gone,
    }
}

/// A call as Python holds it (inside each front's call class): to answer, or (`count` > 0)
/// a planned lookup whose commands Python sends to Redis, handing back the replies, or
/// (`loading`) a lookup whose missing keys Python loads into the L1 before the front
/// answers it.
pub(crate) struct Pending<A> {
    pub(crate) route: usize,
    pub(crate) authorization: Option<String>,
    pub(crate) request_id: String,
    request: Bytes,
    command: Vec<u8>,
    pub(crate) count: usize,
    load: Vec<Vec<u8>>,
    reply: Option<oneshot::Sender<Reply<A>>>,
}

impl<A> Pending<A> {
    /// The request's bytes (a JSON body, a gRPC message without its prefix).
    pub(crate) fn request<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.request)
    }

    /// A planned lookup's Redis commands (RESP), `count` of them.
    pub(crate) fn command<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.command)
    }

    /// Whether the call is a load: its missing keys (`keys`) for the L1.
    pub(crate) fn loading(&self) -> bool {
        !self.load.is_empty()
    }

    /// A load's keys: each the group's index (2 bytes) and the entity's Redis key.
    pub(crate) fn keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.load.iter().map(|key| PyBytes::new(py, key)).collect()
    }

    /// Hand back Redis's replies to the commands: `buf[start:end]`, every reply whole.
    pub(crate) fn replies(&mut self, buf: &[u8], start: usize, end: usize) -> PyResult<()> {
        let replies = buf
            .get(start..end)
            .map(Bytes::copy_from_slice)
            .ok_or_else(|| PyValueError::new_err("the replies are not inside the buffer"))?;
        self.send(Reply::Replies(replies))
    }

    /// A load's keys are in the L1: the front answers from it.
    pub(crate) fn loaded(&mut self) -> PyResult<()> {
        self.send(Reply::Loaded)
    }

    /// Answer the call.
    pub(crate) fn answer(&mut self, answer: A) -> PyResult<()> {
        self.send(Reply::Answer(answer))
    }

    fn send(&mut self, reply: Reply<A>) -> PyResult<()> {
        match self.reply.take() {
            // the client may have gone (deadline, reset): nothing to do then
            Some(tx) => {
                let _ = tx.send(reply);
                Ok(())
            }
            None => Err(PyRuntimeError::new_err("the call was already answered")),
        }
    }
}

/// The Python class of a front's calls: a newtype of `Pending<A>` with the methods every
/// front's calls have (`authorization`, the request under the name `$request`, `command`,
/// `count`, `loading`, `keys`, `replies`, `loaded`), then the front's own (`$($own)*`:
/// how it answers). One `#[pymethods]` block per class, as pyo3 takes them.
macro_rules! call_class {
    ($call:ident, $request:ident, { $($own:tt)* }) => {
        #[pymethods]
        impl $call {
            #[getter]
            fn authorization(&self) -> Option<String> {
                self.0.authorization.clone()
            }

            /// The lookup's request id (the client's, or one the front made).
            #[getter]
            fn request_id(&self) -> String {
                self.0.request_id.clone()
            }

            /// The request's bytes (a JSON body; a gRPC message without its prefix).
            #[getter]
            fn $request<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
                self.0.request(py)
            }

            /// A planned lookup's Redis commands (RESP), `count` of them.
            #[getter]
            fn command<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
                self.0.command(py)
            }

            #[getter]
            fn count(&self) -> usize {
                self.0.count
            }

            /// Whether the call is a load: its missing keys (`keys`) for the L1.
            #[getter]
            fn loading(&self) -> bool {
                self.0.loading()
            }

            /// A load's keys: each the group's index (2 bytes) and the entity's Redis key.
            #[getter]
            fn keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
                self.0.keys(py)
            }

            /// Hand back Redis's replies to the commands: `buf[start:end]`, every reply
            /// whole.
            fn replies(&mut self, buf: &[u8], start: usize, end: usize) -> PyResult<()> {
                self.0.replies(buf, start, end)
            }

            /// A load's keys are in the L1: the front answers from it.
            fn loaded(&mut self) -> PyResult<()> {
                self.0.loaded()
            }

            $($own)*
        }
    };
}
pub(crate) use call_class;
