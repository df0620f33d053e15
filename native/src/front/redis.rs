//! Redis connections of a front's own: planned lookups (`Hits::plan`) read on the front's
//! thread, without Python.
//!
//! Python opens each connection (redis-py's handshake: AUTH, SELECT, HELLO, the client's
//! name) and hands its socket over (`add`, through `links.rs`'s `FrontRedis`). The front
//! runs one task per connection: it takes every lookup queued on it, writes their commands
//! in one write, reads the replies (one scan finds where each lookup's end) and hands each
//! lookup its bytes. The policy stays Python's: whether the front may use its connections
//! at all (the circuit closed), the time a round trip may take (the adaptive timeout of its
//! size class), and what the round trips tell (each one's time and keys, each failure) are
//! set and drained by Python (`serving/fronts/reads.py`). A round trip that fails or times
//! out drops its connection (unread replies would poison it) and its lookups take Python's
//! path; Python opens another.
//!
//! On Redis Cluster the connections and the policy are per master (a `Node` each, numbered
//! by Python) and Python hands over the slot table (`route`): a lookup's commands are
//! grouped by the master that owns each key's slot, one round trip per master, all sent
//! before any is awaited, and the replies put back in request order. A redirect (MOVED,
//! ASK: the slot moved under the table) or a slot no known master owns hands the lookup to
//! Python, whose cluster client follows it; the redirects are counted for Python, which
//! then learns the layout again and sends the new table. One slow master opens its own
//! circuit only: lookups whose keys it owns go to Python, the others stay here.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use super::slots::{slot_of, UNOWNED};
use crate::hits::Commands;
use crate::resp::resp_skip;

/// Bytes asked of the socket at a time.
const READ_SIZE: usize = 64 * 1024;

struct Job {
    command: Vec<u8>,
    count: usize,
    reply: oneshot::Sender<Result<Bytes, Unread>>,
}

/// Why a read has no replies: what the lookup does instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unread {
    /// Redis is failing, as Python's policy sees it: the node's circuit is open, or a round
    /// trip outlasted its timeout. An expired entry is answered stale, as Python's would be.
    Down,
    /// Nothing says Redis is failing: no connection (one closed under the front, by a
    /// restart or an idle timeout, or none opened yet), a connection that closed mid-read,
    /// a reply that is not RESP, a slot that moved or no master owns. Python's path, which
    /// opens connections and follows the cluster, reads it and tells.
    Elsewhere,
}

#[derive(Default)]
struct Drained {
    trips: Vec<(f64, usize)>, // each round trip's seconds and keys
    failures: u64,            // round trips Redis did not answer in time
}

/// Python's limits (`breaker.AdaptiveTimeouts`, `flight.FLUSH_KEYS`), set with `allowed`.
struct Policy {
    timeouts: Vec<(Option<usize>, Duration)>, // per size class: its most keys (None: more)
    flush_keys: usize,                        // keys per round trip at most
}

/// One Redis node's connections (the only node, or one master of a cluster) and what
/// Python decides for them.
struct Node {
    lines: Mutex<Vec<mpsc::UnboundedSender<Job>>>,
    next: AtomicU64,
    allowed: AtomicBool, // Python's circuit for this node is closed
    policy: Mutex<Policy>,
    drained: Mutex<Drained>,
}

/// A front's connections to Redis, per node, and the cluster's slot table.
pub struct Direct {
    pub(super) handle: Handle, // the front's runtime, where the connections' tasks run
    nodes: RwLock<Vec<Arc<Node>>>,
    route: RwLock<Option<Arc<Vec<u16>>>>, // each slot's node; None: one Redis, node 0
    redirected: AtomicU64,                // replies that were MOVED or ASK, since taken
}

impl Direct {
    pub fn new(handle: Handle) -> Self {
        Direct {
            handle,
            nodes: RwLock::new(Vec::new()),
            route: RwLock::new(None),
            redirected: AtomicU64::new(0),
        }
    }

    /// Node `index`, made (with the nodes before it) when Python first names it.
    fn node_made(&self, index: usize) -> Arc<Node> {
        if let Some(node) = self.node(index) {
            return node;
        }
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        while nodes.len() <= index {
            nodes.push(Arc::new(Node::new()));
        }
        Arc::clone(&nodes[index])
    }

    fn node(&self, index: usize) -> Option<Arc<Node>> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        nodes.get(index).map(Arc::clone)
    }

    /// Serve lookups of node `index` on this connected socket (blocking or not), owned
    /// from now on.
    pub fn add(&self, socket: std::net::TcpStream, index: usize) -> std::io::Result<()> {
        socket.set_nonblocking(true)?;
        socket.set_nodelay(true)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let node = self.node_made(index);
        let serving = Arc::clone(&node);
        self.handle.spawn(async move {
            if let Ok(stream) = TcpStream::from_std(socket) {
                serving.serve(stream, rx).await;
            }
        });
        node.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        Ok(())
    }

    /// The cluster's slot table (each slot's node, `UNOWNED` for none), or None for one
    /// Redis.
    pub fn route(&self, table: Option<Vec<u16>>) {
        *self.route.write().unwrap_or_else(|e| e.into_inner()) = table.map(Arc::new);
    }

    /// Whether lookups are routed by slot (a cluster): Python's own path for a lookup
    /// the front does not read is then its handler's, through the cluster client.
    pub fn routed(&self) -> bool {
        self.route
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// MOVED and ASK replies since the last call.
    pub fn redirects(&self) -> u64 {
        self.redirected.swap(0, Ordering::Relaxed)
    }

    /// Redis's replies to `plan`'s commands, in its order; why not when a node it needs
    /// has no connection or an open circuit, a round trip failed, or (a cluster) a slot
    /// moved.
    pub async fn read(&self, plan: &Commands) -> Result<Bytes, Unread> {
        let route = self.route.read().unwrap_or_else(|e| e.into_inner()).clone();
        let route = match route {
            None => {
                let node = self.node(0).ok_or(Unread::Elsewhere)?;
                return node.read(plan.command.clone(), plan.count).await;
            }
            Some(route) => route,
        };
        // the commands by owning master, in request order within each
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::with_capacity(4);
        for (i, &(start, end)) in plan.keys.iter().enumerate() {
            let owner = route[slot_of(&plan.command[start..end]) as usize];
            if owner == UNOWNED {
                return Err(Unread::Elsewhere);
            }
            match groups.iter_mut().find(|(n, _)| *n == owner) {
                Some((_, members)) => members.push(i),
                None => groups.push((owner, vec![i])),
            }
        }
        // one round trip per master, all sent before any is awaited
        let mut waiting = Vec::with_capacity(groups.len());
        for (owner, members) in &groups {
            let command = if groups.len() == 1 {
                plan.command.clone()
            } else {
                let mut command = Vec::new();
                for &i in members {
                    let end = plan
                        .starts
                        .get(i + 1)
                        .copied()
                        .unwrap_or(plan.command.len());
                    command.extend_from_slice(&plan.command[plan.starts[i]..end]);
                }
                command
            };
            let node = self.node(*owner as usize).ok_or(Unread::Elsewhere)?;
            waiting.push(node.send(command, members.len())?);
        }
        let mut replies = Vec::with_capacity(groups.len());
        for rx in waiting {
            replies.push(rx.await.unwrap_or(Err(Unread::Elsewhere))?);
        }
        // each reply's place; a redirect hands the lookup to Python
        let mut spans = vec![(0usize, 0usize, 0usize); plan.count]; // (round trip, start, end)
        for (g, ((_, members), buf)) in groups.iter().zip(&replies).enumerate() {
            let mut pos = 0;
            for &i in members {
                let next = match resp_skip(buf, pos) {
                    Ok(Some(next)) => next,
                    _ => return Err(Unread::Elsewhere),
                };
                let reply = &buf[pos..next];
                if reply.starts_with(b"-MOVED ") || reply.starts_with(b"-ASK ") {
                    self.redirected.fetch_add(1, Ordering::Relaxed);
                    return Err(Unread::Elsewhere);
                }
                spans[i] = (g, pos, next);
                pos = next;
            }
        }
        if replies.len() == 1 {
            return replies.pop().ok_or(Unread::Elsewhere);
        }
        let mut out = BytesMut::with_capacity(replies.iter().map(Bytes::len).sum());
        for &(g, start, end) in &spans {
            out.extend_from_slice(&replies[g][start..end]);
        }
        Ok(out.freeze())
    }

    /// Python's decisions for node `index`: whether the front may read on it, each size
    /// class's most keys (None: the rest) and timeout in seconds, and the most keys per
    /// round trip.
    pub fn set(
        &self,
        index: usize,
        allowed: bool,
        timeouts: Vec<(Option<usize>, f64)>,
        flush_keys: usize,
    ) {
        let node = self.node_made(index);
        let timeouts = timeouts
            .into_iter()
            .map(|(keys, seconds)| (keys, crate::time::seconds(seconds)))
            .collect();
        *node.policy.lock().unwrap_or_else(|e| e.into_inner()) = Policy {
            timeouts,
            flush_keys: flush_keys.max(1),
        };
        node.allowed.store(allowed, Ordering::Relaxed);
    }

    /// Node `index`'s live connections, and (since the last drain) each round trip's
    /// seconds and keys and the round trips that timed out.
    pub fn drain(&self, index: usize) -> (usize, Vec<(f64, usize)>, u64) {
        match self.node(index) {
            Some(node) => node.drain(),
            None => (0, Vec::new(), 0),
        }
    }
}

impl Node {
    fn new() -> Self {
        Node {
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

    fn drain(&self) -> (usize, Vec<(f64, usize)>, u64) {
        let live = {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            lines.retain(|line| !line.is_closed());
            lines.len()
        };
        let drained = std::mem::take(&mut *self.drained.lock().unwrap_or_else(|e| e.into_inner()));
        (live, drained.trips, drained.failures)
    }

    /// Redis's replies to `command` (`count` commands), read on one of the connections;
    /// why not when there is none, the circuit is not closed, or the round trip failed.
    async fn read(&self, command: Vec<u8>, count: usize) -> Result<Bytes, Unread> {
        self.send(command, count)?
            .await
            .unwrap_or(Err(Unread::Elsewhere))
    }

    /// `command` (`count` commands) queued on one of the connections: where its replies
    /// will come. Why not when there is no connection or the circuit is not closed.
    fn send(
        &self,
        command: Vec<u8>,
        count: usize,
    ) -> Result<oneshot::Receiver<Result<Bytes, Unread>>, Unread> {
        if !self.allowed.load(Ordering::Relaxed) {
            return Err(Unread::Down);
        }
        let (tx, rx) = oneshot::channel();
        let mut job = Job {
            command,
            count,
            reply: tx,
        };
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let first = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        for i in 0..lines.len() {
            match lines[(first + i) % lines.len()].send(job) {
                Ok(()) => return Ok(rx),
                Err(mpsc::error::SendError(back)) => job = back, // that connection is gone
            }
        }
        Err(Unread::Elsewhere)
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
                    let why = if failed.is_err() {
                        self.drained
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .failures += 1;
                        Unread::Down
                    } else {
                        Unread::Elsewhere
                    };
                    for job in batch {
                        let _ = job.reply.send(Err(why));
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
                let _ = job.reply.send(Ok(replies.slice(start..end)));
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
