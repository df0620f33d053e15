//! Redis connections of a front's own: planned lookups (`Hits::plan`) read on the front's
//! thread, without Python.
//!
//! Python opens each connection (redis-py's handshake: AUTH, SELECT, HELLO, the client's
//! name) and hands its socket over (`add`). The front runs one task per connection: it takes
//! every lookup queued on it, writes their commands in one write, reads the replies (one
//! scan finds where each lookup's end) and hands each lookup its bytes. The policy stays
//! Python's: whether the front may use its connections at all (the circuit closed), the
//! time a round trip may take (the adaptive timeout of its size class), and what the round
//! trips tell (each one's time and keys, each failure) are set and drained by Python
//! (`serving/front_reads.py`). A round trip that fails or times out drops its connection
//! (unread replies would poison it) and its lookups take Python's path; Python opens another.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use pyo3::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::resp_skip;

/// Keys per round trip at most, as Python's reads (`flight.FLUSH_KEYS`).
const FLUSH_KEYS: usize = 1000;
/// Bytes asked of the socket at a time.
const READ_SIZE: usize = 64 * 1024;
/// Size classes of the adaptive timeout (`breaker.AdaptiveTimeouts.LIMITS`): up to 10,
/// 100, 1000 keys, more.
const LIMITS: [usize; 3] = [10, 100, 1000];

struct Job {
    command: Vec<u8>,
    count: usize,
    reply: oneshot::Sender<Option<Bytes>>,
}

#[derive(Default)]
struct Drained {
    trips: Vec<(f64, usize)>, // each round trip's seconds and keys
    failures: u64,            // round trips Redis did not answer in time
}

/// A front's connections to Redis and what Python decides for them.
pub struct Direct {
    handle: Handle, // the front's runtime, where the connections' tasks run
    lines: Mutex<Vec<mpsc::UnboundedSender<Job>>>,
    next: AtomicU64,
    allowed: AtomicBool,      // Python's circuit is closed
    timeouts: [AtomicU64; 4], // microseconds, per size class
    drained: Mutex<Drained>,
}

impl Direct {
    pub fn new(handle: Handle) -> Self {
        Direct {
            handle,
            lines: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            allowed: AtomicBool::new(false),
            timeouts: std::array::from_fn(|_| AtomicU64::new(100_000)),
            drained: Mutex::new(Drained::default()),
        }
    }

    /// Serve lookups on this connected socket (blocking or not), owned from now on.
    pub fn add(self: &Arc<Self>, socket: std::net::TcpStream) -> std::io::Result<()> {
        socket.set_nonblocking(true)?;
        socket.set_nodelay(true)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let direct = Arc::clone(self);
        self.handle.spawn(async move {
            if let Ok(stream) = TcpStream::from_std(socket) {
                direct.serve(stream, rx).await;
            }
        });
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        Ok(())
    }

    /// Python's decisions: whether the front may read, and each size class's timeout.
    pub fn set(&self, allowed: bool, timeouts: [f64; 4]) {
        for (slot, seconds) in self.timeouts.iter().zip(timeouts) {
            let micros = if seconds.is_finite() {
                (seconds.max(0.0) * 1e6) as u64
            } else {
                0
            };
            slot.store(micros, Ordering::Relaxed);
        }
        self.allowed.store(allowed, Ordering::Relaxed);
    }

    /// Live connections, and (since the last drain) each round trip's seconds and keys
    /// and the round trips that timed out.
    pub fn drain(&self) -> (usize, Vec<(f64, usize)>, u64) {
        let live = {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            lines.retain(|line| !line.is_closed());
            lines.len()
        };
        let drained = std::mem::take(&mut *self.drained.lock().unwrap_or_else(|e| e.into_inner()));
        (live, drained.trips, drained.failures)
    }

    /// Redis's replies to `command` (`count` commands), read on one of the connections;
    /// None when there is none, the circuit is not closed, or the round trip failed (the
    /// caller takes Python's path).
    pub async fn read(&self, command: Vec<u8>, count: usize) -> Option<Bytes> {
        if !self.allowed.load(Ordering::Relaxed) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let mut job = Job {
            command,
            count,
            reply: tx,
        };
        {
            let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            if lines.is_empty() {
                return None;
            }
            let first = self.next.fetch_add(1, Ordering::Relaxed) as usize;
            let mut sent = false;
            for i in 0..lines.len() {
                match lines[(first + i) % lines.len()].send(job) {
                    Ok(()) => {
                        sent = true;
                        break;
                    }
                    Err(mpsc::error::SendError(back)) => job = back, // that connection is gone
                }
            }
            if !sent {
                return None;
            }
        }
        rx.await.ok().flatten()
    }

    fn timeout(&self, keys: usize) -> Duration {
        let class = LIMITS
            .iter()
            .position(|&l| keys <= l)
            .unwrap_or(LIMITS.len());
        Duration::from_micros(self.timeouts[class].load(Ordering::Relaxed))
    }

    /// One connection's task: batches of the lookups queued on it, until a round trip fails.
    async fn serve(&self, mut stream: TcpStream, mut jobs: mpsc::UnboundedReceiver<Job>) {
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        let mut command = Vec::with_capacity(READ_SIZE);
        while let Some(first) = jobs.recv().await {
            let mut keys = first.count;
            let mut batch = vec![first];
            while keys < FLUSH_KEYS {
                match jobs.try_recv() {
                    Ok(job) => {
                        keys += job.count;
                        batch.push(job);
                    }
                    Err(_) => break,
                }
            }
            command.clear();
            for job in &batch {
                command.extend_from_slice(&job.command);
            }
            let started = Instant::now();
            let exchange = exchange(&mut stream, &command, &batch, &mut buf);
            let ends = match tokio::time::timeout(self.timeout(keys), exchange).await {
                Ok(Some(ends)) => ends,
                failed => {
                    // Redis did not answer in time: a failure for the breaker. A connection
                    // that closed or broke (a Redis restart, say) is not one: Python's path,
                    // which its lookups take now, tells whether Redis is there.
                    if failed.is_err() {
                        self.drained
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .failures += 1;
                    }
                    for job in batch {
                        let _ = job.reply.send(None);
                    }
                    return; // the connection goes: its replies may still come
                }
            };
            let elapsed = started.elapsed().as_secs_f64();
            self.drained
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .trips
                .push((elapsed, keys));
            let replies = buf.split().freeze();
            let mut start = 0;
            for (job, end) in batch.into_iter().zip(ends) {
                let _ = job.reply.send(Some(replies.slice(start..end)));
                start = end;
            }
        }
    }
}

/// Write `command`, read the replies of every job's commands into `buf`: where each job's
/// replies end. None when the connection fails or Redis sends what is not RESP.
async fn exchange(
    stream: &mut TcpStream,
    command: &[u8],
    batch: &[Job],
    buf: &mut BytesMut,
) -> Option<Vec<usize>> {
    buf.clear();
    stream.write_all(command).await.ok()?;
    let mut ends = Vec::with_capacity(batch.len());
    let mut pos = 0;
    for job in batch {
        let mut left = job.count;
        while left > 0 {
            match resp_skip(buf, pos).ok()? {
                Some(next) => {
                    pos = next;
                    left -= 1;
                }
                None => {
                    buf.reserve(READ_SIZE);
                    if stream.read_buf(buf).await.ok()? == 0 {
                        return None; // Redis closed the connection
                    }
                }
            }
        }
        ends.push(pos);
    }
    if pos != buf.len() {
        return None; // bytes past the last reply
    }
    Some(ends)
}

/// `buf[start..end]`: the replies Python hands back for a planned read (`RestCall.replies`,
/// `Call.replies`).
pub(crate) fn replies_of(buf: &[u8], start: usize, end: usize) -> PyResult<Bytes> {
    buf.get(start..end)
        .map(Bytes::copy_from_slice)
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err("the replies are not inside the buffer")
        })
}

/// A front's Redis connections, for Python: it opens them and sets and drains their policy.
#[pyclass(frozen, module = "feature_store._native")]
pub struct FrontRedis {
    pub(crate) direct: Arc<Direct>,
}

#[pymethods]
impl FrontRedis {
    /// Read planned lookups on this connected TCP socket (its fd, owned from now on).
    fn add(&self, fd: std::os::unix::io::RawFd) -> PyResult<()> {
        // SAFETY: the caller gives up the socket (socket.detach()); it is ours to close.
        let socket =
            unsafe { <std::net::TcpStream as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        Ok(self.direct.add(socket)?)
    }

    /// Whether the front may read (the circuit is closed), and the timeout (seconds) of a
    /// round trip of up to 10, 100, 1000 and more keys.
    fn set(&self, allowed: bool, timeouts: [f64; 4]) {
        self.direct.set(allowed, timeouts);
    }

    /// `(live connections, [(seconds, keys)] of the round trips, round trips timed out)`
    /// since the last drain.
    fn drain(&self) -> (usize, Vec<(f64, usize)>, u64) {
        self.direct.drain()
    }
}
