//! The native gRPC front: HTTP/2 and gRPC framing on a thread of its own, so that the hot
//! method (`GetFeatures`) costs what its lookup costs, not what grpc.aio's per-call
//! machinery does.
//!
//! The thread runs a single-threaded tokio runtime and the `h2` crate. A call to the hot
//! method is read whole, queued, and announced to Python by writing an eventfd that the
//! asyncio loop watches; the loop takes every queued call at once (`Front.take`), answers
//! each from the cache and the data plane's core, and hands the answer bytes back
//! (`Call.reply` / `Call.fail`), which wakes the stream's task here. Neither side waits for
//! the other's lock for long: this thread never holds the GIL.
//!
//! Every other method (WriteFeatures, GetRegistry, health checking, reflection) is passed
//! through, stream for stream, to the grpc.aio server listening on a loopback port: one
//! gRPC port for clients, with every method grpcio serves.
//!
//! With a certificate and key, the front speaks TLS (rustls, ALPN h2) and, with a client
//! CA, asks every client for a certificate that CA signed (mutual TLS). The hop to
//! grpc.aio stays on loopback, in plaintext.

use std::collections::VecDeque;
use std::net::TcpListener as StdListener;
use std::os::unix::io::{FromRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use crate::direct::{replies_of, Direct, FrontRedis};
use crate::hits::{HitCache, Hits, Looked, GRPC};
use crate::rest::{role_of, ROLE_READ};

// gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)
const OK: u32 = 0;
const DEADLINE_EXCEEDED: u32 = 4;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNIMPLEMENTED: u32 = 12;
const INTERNAL: u32 = 13;
const UNAVAILABLE: u32 = 14;

const UNREACHABLE: &str = "the gRPC server behind the front is not reachable";
/// A client that has not finished its TLS handshake by then is dropped.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// PEM bytes of TLS: the certificate chain, its key, and the client CA of mutual TLS.
pub(crate) type TlsPem = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

/// What Python answers a queued call with.
enum Answer {
    Message(Vec<u8>), // the gRPC frame: 5-byte prefix and the message
    Status(u32, String),
    Replies(Bytes), // a planned read: Redis's replies to its commands, the answer written here
    Loaded,         // a load: its keys are in the L1, the answer is written here
}

/// What a call queued by either front asks of Python.
pub(crate) enum Work {
    Answer,               // the handler answers it
    Read(Vec<u8>, usize), // send a planned read's commands (so many) to Redis
    Load(Vec<Vec<u8>>),   // load a lookup's missing keys into the L1
}

impl Work {
    /// As the calls Python takes hold it: commands, their count, keys to load.
    pub(crate) fn parts(self) -> (Vec<u8>, usize, Vec<Vec<u8>>) {
        match self {
            Work::Answer => (Vec::new(), 0, Vec::new()),
            Work::Read(command, count) => (command, count, Vec::new()),
            Work::Load(keys) => (Vec::new(), 0, keys),
        }
    }
}

struct Queued {
    request: Bytes,
    authorization: Option<String>,
    work: Work,
    reply: oneshot::Sender<Answer>,
}

struct Shared {
    queue: Mutex<VecDeque<Queued>>,
    wake_fd: RawFd,
    method: String,
    backend: String,
    upstream: Mutex<Option<SendRequest<Bytes>>>, // the connection to `backend`, once made
    max_request: usize,
    keys: Vec<(Vec<u8>, u8)>, // (key, role); empty without auth
    hits: Option<Arc<Hits>>,  // the L1's mirror, whose hits are answered here
    direct: Arc<Direct>,      // Redis connections of the front's own (planned reads)
}

impl Shared {
    fn push(&self, call: Queued) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = queue.is_empty();
        queue.push_back(call);
        drop(queue);
        if was_empty {
            // the loop drains the whole queue on each wake-up: one write per batch
            let one: u64 = 1;
            // SAFETY: wake_fd is an eventfd owned by the Python side for the front's life;
            // an eventfd write of 8 bytes cannot be partial, and a full counter (EAGAIN) means
            // a wake-up is already pending.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }
}

/// One call to the hot method, handed to Python: to answer, or (`count` > 0) a planned
/// lookup whose commands Python sends to Redis, handing back the replies, or (`loading`)
/// a lookup whose missing keys Python loads into the L1 before the front answers it.
#[pyclass(module = "feature_store._native")]
pub struct Call {
    #[pyo3(get)]
    authorization: Option<String>,
    request: Bytes,
    command: Vec<u8>,
    #[pyo3(get)]
    count: usize,
    load: Vec<Vec<u8>>,
    reply: Option<oneshot::Sender<Answer>>,
}

#[pymethods]
impl Call {
    /// The request message's bytes (without gRPC's 5-byte prefix).
    #[getter]
    fn request<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.request)
    }

    /// A planned lookup's Redis commands (RESP), `count` of them.
    #[getter]
    fn command<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.command)
    }

    /// Whether the call is a load: its missing keys (`keys`) for the L1.
    #[getter]
    fn loading(&self) -> bool {
        !self.load.is_empty()
    }

    /// A load's keys: each the group's index (2 bytes) and the entity's Redis key.
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.load.iter().map(|key| PyBytes::new(py, key)).collect()
    }

    /// Hand back Redis's replies to the commands: `buf[start:end]`, every reply whole.
    fn replies(&mut self, buf: &[u8], start: usize, end: usize) -> PyResult<()> {
        self.send(Answer::Replies(replies_of(buf, start, end)?))
    }

    /// A load's keys are in the L1: the front answers from it.
    fn loaded(&mut self) -> PyResult<()> {
        self.send(Answer::Loaded)
    }

    /// Answer with this message (serialized protobuf) and status OK.
    fn reply(&mut self, message: &[u8]) -> PyResult<()> {
        self.send(Answer::Message(frame(message)))
    }

    /// Answer with a gRPC status code and message, and no response message.
    fn fail(&mut self, code: u32, message: String) -> PyResult<()> {
        if code == OK || code > 16 {
            return Err(PyValueError::new_err(format!(
                "not an error status: {code}"
            )));
        }
        self.send(Answer::Status(code, message))
    }
}

impl Call {
    fn send(&mut self, answer: Answer) -> PyResult<()> {
        match self.reply.take() {
            // the client may have gone (deadline, reset): nothing to do then
            Some(tx) => {
                let _ = tx.send(answer);
                Ok(())
            }
            None => Err(PyRuntimeError::new_err("the call was already answered")),
        }
    }
}

/// The front: a listening socket, served on its own thread until `stop`.
#[pyclass(module = "feature_store._native")]
pub struct Front {
    shared: Arc<Shared>,
    closing: watch::Sender<Option<Duration>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl Front {
    /// Serve on `listen_fd` (a bound, listening TCP socket, now owned by the front). Calls to
    /// `method` (e.g. "/pkg.Service/Method") are queued for `take`, announced on `wake_fd`;
    /// other methods go to the gRPC server at `backend` ("127.0.0.1:port").
    ///
    /// `tls`: PEM bytes of the certificate chain, its private key and optionally a client
    /// CA (mutual TLS); None serves plaintext HTTP/2. `hits`: the L1's mirror, whose hits
    /// are answered here for callers whose key (`keys`: (key, role) pairs) may read.
    #[new]
    #[pyo3(signature = (listen_fd, wake_fd, method, backend, max_request, tls=None, keys=Vec::new(), hits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        listen_fd: RawFd,
        wake_fd: RawFd,
        method: String,
        backend: String,
        max_request: usize,
        tls: Option<TlsPem>,
        keys: Vec<(Vec<u8>, u8)>,
        hits: Option<PyRef<'_, HitCache>>,
    ) -> PyResult<Self> {
        let acceptor = match tls {
            Some((cert, key, client_ca)) => {
                Some(tls_acceptor(&cert, &key, client_ca.as_deref(), b"h2")?)
            }
            None => None,
        };
        // SAFETY: the caller passes a listening socket it has given up (socket.detach()).
        let listener = unsafe { StdListener::from_raw_fd(listen_fd) };
        listener.set_nonblocking(true)?;
        let runtime = crate::front_runtime()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            wake_fd,
            method,
            backend,
            upstream: Mutex::new(None),
            max_request,
            keys,
            hits: hits.map(|cache| Arc::clone(&cache.hits)),
            direct: Arc::new(Direct::new(runtime.handle().clone())),
        });
        let (closing, closed) = watch::channel(None);
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("grpc-front".into())
            .spawn(move || runtime.block_on(serve(listener, serving, closed, acceptor)))?;
        Ok(Front {
            shared,
            closing,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The front's own Redis connections (planned reads without Python).
    #[getter]
    fn redis(&self) -> FrontRedis {
        FrontRedis {
            direct: Arc::clone(&self.shared.direct),
        }
    }

    /// Every call queued since the last take, oldest first.
    fn take(&self) -> Vec<Call> {
        let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue
            .drain(..)
            .map(|q| {
                let (command, count, load) = q.work.parts();
                Call {
                    authorization: q.authorization,
                    request: q.request,
                    command,
                    count,
                    load,
                    reply: Some(q.reply),
                }
            })
            .collect()
    }

    /// Stop accepting, tell clients to go away (GOAWAY), let calls in flight finish for up
    /// to `grace` seconds, then close: calls unfinished by then go with their connections
    /// (clients see UNAVAILABLE).
    fn stop(&self, py: Python<'_>, grace: f64) {
        let grace = crate::seconds(grace);
        let _ = self.closing.send(Some(grace));
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            py.allow_threads(move || {
                let _ = thread.join();
            });
        }
        self.take(); // calls queued still: their streams are gone with the thread
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.closing.send(Some(Duration::ZERO));
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The TLS side of a front: the server's certificate chain and key, `alpn` (h2 here,
/// http/1.1 for the REST front), and with a client CA, client certificates it signed required.
pub(crate) fn tls_acceptor(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
    alpn: &[u8],
) -> PyResult<TlsAcceptor> {
    let bad = |what: &str, e: &dyn std::fmt::Display| PyValueError::new_err(format!("{what}: {e}"));
    let chain: Vec<rustls::Certificate> = rustls_pemfile::certs(&mut &cert[..])
        .map_err(|e| bad("the TLS certificate is not PEM", &e))?
        .into_iter()
        .map(rustls::Certificate)
        .collect();
    if chain.is_empty() {
        return Err(PyValueError::new_err(
            "the TLS certificate file holds no certificate",
        ));
    }
    let mut keys = rustls_pemfile::read_all(&mut &key[..])
        .map_err(|e| bad("the TLS key is not PEM", &e))?
        .into_iter()
        .filter_map(|item| match item {
            rustls_pemfile::Item::PKCS8Key(k)
            | rustls_pemfile::Item::RSAKey(k)
            | rustls_pemfile::Item::ECKey(k) => Some(rustls::PrivateKey(k)),
            _ => None,
        });
    let key = keys
        .next()
        .ok_or_else(|| PyValueError::new_err("the TLS key file holds no private key"))?;
    let builder = rustls::ServerConfig::builder().with_safe_defaults();
    let builder = match client_ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for der in rustls_pemfile::certs(&mut &pem[..])
                .map_err(|e| bad("the client CA is not PEM", &e))?
            {
                roots
                    .add(&rustls::Certificate(der))
                    .map_err(|e| bad("the client CA is not a usable certificate", &e))?;
            }
            if roots.is_empty() {
                return Err(PyValueError::new_err(
                    "the client CA file holds no certificate",
                ));
            }
            let verifier = rustls::server::AllowAnyAuthenticatedClient::new(roots);
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| bad("the TLS certificate and key do not fit", &e))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn serve(
    listener: StdListener,
    shared: Arc<Shared>,
    mut closed: Closing,
    acceptor: Option<TlsAcceptor>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(_) => return,
    };
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((socket, _)) = accepted {
                    let _ = socket.set_nodelay(true);
                    let (shared, closed) = (Arc::clone(&shared), closed.clone());
                    match acceptor.clone() {
                        None => {
                            connections.spawn(connection(socket, shared, closed));
                        }
                        Some(acceptor) => {
                            connections.spawn(async move {
                                // a handshake that fails (plaintext, an unknown CA) ends here
                                let handshake = tokio::time::timeout(
                                    TLS_HANDSHAKE_TIMEOUT,
                                    acceptor.accept(socket),
                                );
                                if let Ok(Ok(stream)) = handshake.await {
                                    connection(stream, shared, closed).await;
                                }
                            });
                        }
                    }
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = closed.changed() => break,
        }
    }
    drop(listener);
    // connections send GOAWAY and finish their calls; those that take longer are cut
    let grace = closed.borrow().unwrap_or(Duration::ZERO);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// None while serving; the grace period for calls in flight once stopping.
type Closing = watch::Receiver<Option<Duration>>;

async fn connection<S>(socket: S, shared: Arc<Shared>, mut closed: Closing)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = match h2::server::Builder::new()
        .max_concurrent_streams(1000)
        .initial_window_size(1 << 20)
        .initial_connection_window_size(4 << 20)
        .handshake::<_, Bytes>(socket)
        .await
    {
        Ok(conn) => conn,
        Err(_) => return,
    };
    let mut closing = closed.borrow().is_some();
    if closing {
        conn.graceful_shutdown();
    }
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((request, respond))) => {
                    tokio::spawn(stream(request, respond, Arc::clone(&shared)));
                }
                _ => break, // closed, or a connection error (h2 has sent GOAWAY)
            },
            changed = closed.changed(), if !closing => {
                closing = true;
                if changed.is_ok() {
                    conn.graceful_shutdown();
                }
            }
        }
    }
}

async fn stream(request: Request<RecvStream>, respond: SendResponse<Bytes>, shared: Arc<Shared>) {
    if request.uri().path() == shared.method {
        hot(request, respond, &shared).await;
    } else {
        pass_through(request, respond, &shared).await;
    }
}

async fn hot(request: Request<RecvStream>, mut respond: SendResponse<Bytes>, shared: &Shared) {
    let (parts, mut body) = request.into_parts();
    let is_grpc = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .map_or(false, |v| v.as_bytes().starts_with(b"application/grpc"));
    if !is_grpc {
        let response = Response::builder().status(415).body(()).unwrap_or_default();
        let _ = respond.send_response(response, true);
        return;
    }
    let deadline = parts
        .headers
        .get("grpc-timeout")
        .and_then(|v| grpc_timeout(v.as_bytes()));
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(_) => return, // the client reset the stream
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        if data.len() + chunk.len() > shared.max_request + 5 {
            let limit = shared.max_request;
            let message = format!("the request is larger than the limit of {limit} bytes");
            return status(&mut respond, RESOURCE_EXHAUSTED, &message);
        }
        data.put(chunk);
    }
    let request = match unframe(data.freeze()) {
        Ok(request) => request,
        Err((code, message)) => return status(&mut respond, code, message),
    };
    let authorization = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let started = tokio::time::Instant::now();
    let deadline = deadline.map(|limit| started + limit);
    if let Some(hits) = &shared.hits {
        // a caller without a key that may read goes to Python, which says why
        if role_of(&shared.keys, authorization.as_deref()) >= ROLE_READ {
            match hits.answer(GRPC, &request) {
                Some(Looked::Answer(message)) => {
                    return send_message(&mut respond, frame(&message));
                }
                Some(Looked::Missing(missing)) => {
                    let load = Work::Load(missing.keys.clone());
                    let rx = queue(shared, &request, &authorization, load);
                    match wait(rx, deadline).await {
                        Some(Ok(Answer::Loaded)) => {
                            if let Some(message) = hits.replay(&request, GRPC, &missing) {
                                return send_message(&mut respond, frame(&message));
                            } // else evicted or dropped again: Python answers it
                        }
                        answer => return answered(&mut respond, answer),
                    }
                    let rx = queue(shared, &request, &authorization, Work::Answer);
                    return answered(&mut respond, wait(rx, deadline).await);
                }
                None => {}
            }
            if let Some(mut plan) = hits.plan(GRPC, &request) {
                if let Some(replies) = shared.direct.read(plan.command.clone(), plan.count).await {
                    if let Some(message) = hits.render(&plan, &replies, true) {
                        return send_message(&mut respond, frame(&message));
                    }
                    let rx = queue(shared, &request, &authorization, Work::Answer);
                    return answered(&mut respond, wait(rx, deadline).await);
                }
                let command = Work::Read(std::mem::take(&mut plan.command), plan.count);
                let rx = queue(shared, &request, &authorization, command);
                match wait(rx, deadline).await {
                    Some(Ok(Answer::Replies(replies))) => {
                        if let Some(message) = hits.render(&plan, &replies, false) {
                            return send_message(&mut respond, frame(&message));
                        } // else Python answers it, reading again
                    }
                    answer => return answered(&mut respond, answer),
                }
            }
        }
    }
    let rx = queue(shared, &request, &authorization, Work::Answer);
    let answer = wait(rx, deadline).await;
    answered(&mut respond, answer)
}

/// Queue a call for Python.
fn queue(
    shared: &Shared,
    request: &Bytes,
    authorization: &Option<String>,
    work: Work,
) -> oneshot::Receiver<Answer> {
    let (tx, rx) = oneshot::channel();
    shared.push(Queued {
        request: request.clone(),
        authorization: authorization.clone(),
        work,
        reply: tx,
    });
    rx
}

/// Python's answer, None when the call's deadline passed first.
async fn wait(
    rx: oneshot::Receiver<Answer>,
    deadline: Option<tokio::time::Instant>,
) -> Option<Result<Answer, oneshot::error::RecvError>> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, rx).await.ok(),
        None => Some(rx.await),
    }
}

fn answered(
    respond: &mut SendResponse<Bytes>,
    answer: Option<Result<Answer, oneshot::error::RecvError>>,
) {
    match answer {
        None => status(respond, DEADLINE_EXCEEDED, "Deadline Exceeded"),
        Some(Ok(Answer::Message(frame))) => send_message(respond, frame),
        Some(Ok(Answer::Status(code, message))) => status(respond, code, &message),
        // replies without a plan, loaded without a load: not sent by Python; the stream
        // goes as at shutdown
        Some(Ok(Answer::Replies(_) | Answer::Loaded)) | Some(Err(_)) => {
            status(respond, UNAVAILABLE, "the server is shutting down")
        }
    }
}

/// A response message in gRPC's framing: the 5-byte prefix (not compressed, length).
fn frame(message: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(message.len() + 5);
    frame.push(0);
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// Status 200, the framed message, then the trailers of status OK.
fn send_message(respond: &mut SendResponse<Bytes>, frame: Vec<u8>) {
    let response = Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(())
        .unwrap_or_default();
    if let Ok(mut send) = respond.send_response(response, false) {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        if send.send_data(Bytes::from(frame), false).is_ok() {
            let _ = send.send_trailers(trailers);
        }
    }
}

/// The one message of a unary request, without its 5-byte prefix.
fn unframe(data: Bytes) -> Result<Bytes, (u32, &'static str)> {
    if data.len() < 5 {
        return Err((INTERNAL, "the request has no complete gRPC message"));
    }
    if data[0] != 0 {
        return Err((UNIMPLEMENTED, "compressed requests are not supported"));
    }
    let length = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    if data.len() - 5 != length {
        return Err((INTERNAL, "the request is not one gRPC message"));
    }
    Ok(data.slice(5..))
}

/// A "Trailers-Only" answer: HTTP 200 and the gRPC status in one HEADERS frame.
fn status(respond: &mut SendResponse<Bytes>, code: u32, message: &str) {
    let mut response = Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("grpc-status", code)
        .body(())
        .unwrap_or_default();
    if let Ok(value) = HeaderValue::from_bytes(&percent_encode(message)) {
        response.headers_mut().insert("grpc-message", value);
    }
    let _ = respond.send_response(response, true);
}

/// grpc-message's encoding: bytes outside printable ASCII, and '%', as %XX.
fn percent_encode(message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// grpc-timeout: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Another method: the same stream, both ways, with the gRPC server on the loopback port.
async fn pass_through(
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    shared: &Shared,
) {
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut forward = Request::builder()
        .method(parts.method)
        .uri(format!("http://{}{}", shared.backend, path))
        .body(())
        .unwrap_or_default();
    *forward.headers_mut() = parts.headers;
    let sent = match backend(shared).await {
        Some(mut backend) => backend.send_request(forward, body.is_end_stream()).ok(),
        None => None,
    };
    let (response, upstream) = match sent {
        Some(sent) => sent,
        None => return status(&mut respond, UNAVAILABLE, UNREACHABLE),
    };
    // the request's stream, copied on a task of its own: bidirectional methods (reflection)
    // send more as answers arrive
    if !body.is_end_stream() {
        tokio::spawn(copy(body, upstream));
    }
    let response = match response.await {
        Ok(response) => response,
        Err(_) => return status(&mut respond, UNAVAILABLE, UNREACHABLE),
    };
    let (parts, body) = response.into_parts();
    let ended = body.is_end_stream();
    let send = match respond.send_response(Response::from_parts(parts, ()), ended) {
        Ok(send) => send,
        Err(_) => return,
    };
    if !ended {
        copy(body, send).await;
    }
}

/// One direction of a passed-through stream: its data (flow-control capacity given back as
/// it is read), then its trailers or its end; a broken stream resets the other side.
async fn copy(mut from: RecvStream, mut to: SendStream<Bytes>) {
    while let Some(chunk) = from.data().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(_) => return to.send_reset(h2::Reason::INTERNAL_ERROR),
        };
        let _ = from.flow_control().release_capacity(chunk.len());
        if to.send_data(chunk, false).is_err() {
            return;
        }
    }
    let _ = match from.trailers().await {
        Ok(Some(trailers)) => to.send_trailers(trailers),
        Ok(None) => to.send_data(Bytes::new(), true),
        Err(_) => return to.send_reset(h2::Reason::INTERNAL_ERROR),
    };
}

/// The HTTP/2 connection to the gRPC server that passed-through calls share, ready for
/// one more stream; a new one when there is none yet or the last one failed.
async fn backend(shared: &Shared) -> Option<SendRequest<Bytes>> {
    let kept = shared
        .upstream
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(kept) = kept {
        if let Ok(ready) = kept.ready().await {
            return Some(ready);
        }
    }
    let ready = connect(&shared.backend).await?.ready().await.ok()?;
    *shared.upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(ready.clone());
    Some(ready)
}

async fn connect(backend: &str) -> Option<SendRequest<Bytes>> {
    let socket = TcpStream::connect(backend).await.ok()?;
    let _ = socket.set_nodelay(true);
    let (send, connection) = h2::client::handshake(socket).await.ok()?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Some(send)
}
