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
//! (`serving/fronts/reads.py`). A round trip that fails or times out drops its connection
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

use crate::resp::resp_skip;

/// Bytes asked of the socket at a time.
const READ_SIZE: usize = 64 * 1024;

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
    allowed: AtomicBool, // Python's circuit is closed
    policy: Mutex<Policy>,
    drained: Mutex<Drained>,
}

/// Python's limits (`breaker.AdaptiveTimeouts`, `flight.FLUSH_KEYS`), set with `allowed`.
struct Policy {
    timeouts: Vec<(Option<usize>, Duration)>, // per size class: its most keys (None: more)
    flush_keys: usize,                        // keys per round trip at most
}

impl Direct {
    pub fn new(handle: Handle) -> Self {
        Direct {
            handle,
            lines: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            allowed: AtomicBool::new(false),
            policy: Mutex::new(Policy {
                timeouts: Vec::new(),
                flush_keys: 1,
            }),
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

    /// Python's decisions: whether the front may read, each size class's most keys (None:
    /// the rest) and timeout in seconds, and the most keys per round trip.
    pub fn set(&self, allowed: bool, timeouts: Vec<(Option<usize>, f64)>, flush_keys: usize) {
        let timeouts = timeouts
            .into_iter()
            .map(|(keys, seconds)| (keys, crate::time::seconds(seconds)))
            .collect();
        *self.policy.lock().unwrap_or_else(|e| e.into_inner()) = Policy {
            timeouts,
            flush_keys: flush_keys.max(1),
        };
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

    /// The most keys one round trip may carry.
    fn flush_keys(&self) -> usize {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flush_keys
    }

    /// The time limit of a round trip of `keys` keys: its size class's.
    fn timeout(&self, keys: usize) -> Duration {
        let policy = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        let class = policy
            .timeouts
            .iter()
            .find(|(most, _)| most.map_or(true, |most| keys <= most))
            .or_else(|| policy.timeouts.last());
        class.map_or(Duration::from_millis(100), |&(_, t)| t)
    }

    /// One connection's task: batches of the lookups queued on it, until a round trip fails.
    async fn serve(&self, mut stream: TcpStream, mut jobs: mpsc::UnboundedReceiver<Job>) {
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        let mut command = Vec::with_capacity(READ_SIZE);
        while let Some(first) = jobs.recv().await {
            let mut keys = first.count;
            let mut batch = vec![first];
            let flush_keys = self.flush_keys();
            while keys < flush_keys {
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

/// A front's Redis connections, for Python: it opens them and sets and drains their policy.
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
    /// Read planned lookups on this connected TCP socket (its fd, owned from now on).
    fn add(&self, fd: std::os::unix::io::RawFd) -> PyResult<()> {
        // SAFETY: the caller gives up the socket (socket.detach()); it is ours to close.
        let socket =
            unsafe { <std::net::TcpStream as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        Ok(self.direct.add(socket)?)
    }

    /// Whether the front may read (the circuit is closed), each size class of round trips
    /// as (its most keys, None for the rest; its timeout in seconds), and the most keys
    /// one round trip carries.
    fn set(&self, allowed: bool, timeouts: Vec<(Option<usize>, f64)>, flush_keys: usize) {
        self.direct.set(allowed, timeouts, flush_keys);
    }

    /// `(live connections, [(seconds, keys)] of the round trips, round trips timed out)`
    /// since the last drain.
    fn drain(&self) -> (usize, Vec<(f64, usize)>, u64) {
        self.direct.drain()
    }
}
