//! The native gRPC front: HTTP/2 and gRPC framing (the `h2` crate), so that the hot method
//! (`GetFeatures`) costs what its lookup costs, not what grpc.aio's per-call machinery does.
//!
//! A call to the hot method is read whole, then looked up (`lookup.rs`) or queued for
//! Python (`queue.rs`): the loop takes every queued call at once (`GrpcFront.take`), answers
//! each from the cache and the data plane's core, and hands the answer bytes back
//! (`GrpcCall.reply` / `GrpcCall.fail`), which wakes the stream's task here.
//!
//! Every other method (WriteFeatures, GetRegistry, health checking, reflection) is passed
//! through, stream for stream, to the grpc.aio server listening on a loopback port: one
//! gRPC port for clients, with every method grpcio serves. With a certificate and key, the
//! front speaks TLS (ALPN h2; `tls.rs`).

use std::os::unix::io::RawFd;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::net::TcpStream;

use super::auth::Keys;
use super::coalesce::{Coalesce, Turns};
use super::links::FrontRedis;
use super::lookup::{lookup, Outcome};
use super::queue::{call_class, wait, Pending, Queue, Reply, Waited, Work};
use super::redis::Direct;
use super::serve::{self, Closing, Serving, Socket};
use super::served::{Served, ServedLog};
use super::tls::{self, TlsPem};
use crate::hits::{HitCache, Hits, GRPC};

// gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)
const OK: u32 = 0;
const DEADLINE_EXCEEDED: u32 = 4;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNIMPLEMENTED: u32 = 12;
const INTERNAL: u32 = 13;
const UNAVAILABLE: u32 = 14;

/// The metadata of a lookup's request id.
const REQUEST_ID: &str = "x-request-id";

const UNREACHABLE: &str = "the gRPC server behind the front is not reachable";

/// What Python answers a call with.
enum Answer {
    Message(Vec<u8>), // the gRPC frame: 5-byte prefix and the message
    Status(u32, String),
}

struct Shared {
    queue: Queue<Answer>,
    method: String,
    backend: String,
    upstream: Mutex<Option<SendRequest<Bytes>>>, // the connection to `backend`, once made
    max_request: usize,
    keys: Keys,
    role: u8,                // the role a lookup answered here needs
    hits: Option<Arc<Hits>>, // the worker's L1, whose hits are answered here
    direct: Arc<Direct>,     // Redis connections of the front's own (planned reads)
    served: Arc<Served>,     // request ids, and the log of answers given here
}

/// One call to the hot method, handed to Python (see `queue::Pending`).
#[pyclass(module = "feature_store._native")]
pub struct GrpcCall(Pending<Answer>);

call_class!(GrpcCall, request, {
    /// Answer with this message (serialized protobuf) and status OK.
    fn reply(&mut self, message: &[u8]) -> PyResult<()> {
        self.0.answer(Answer::Message(frame(message)))
    }

    /// Answer with a gRPC status code and message, and no response message.
    fn fail(&mut self, code: u32, message: String) -> PyResult<()> {
        if code == OK || code > 16 {
            return Err(PyValueError::new_err(format!(
                "not an error status: {code}"
            )));
        }
        self.0.answer(Answer::Status(code, message))
    }
});

/// The front: a listening socket, served on its own thread until `stop`.
#[pyclass(module = "feature_store._native")]
pub struct GrpcFront {
    shared: Arc<Shared>,
    serving: Serving,
}

#[pymethods]
impl GrpcFront {
    /// Serve on `listen_fd` (a bound, listening TCP socket, now owned by the front). Calls to
    /// `method` (e.g. "/pkg.Service/Method") are queued for `take`, announced on `wake_fd`;
    /// other methods go to the gRPC server at `backend` ("127.0.0.1:port").
    ///
    /// `tls`: PEM bytes of the certificate chain, its private key and optionally a client
    /// CA (mutual TLS); None serves plaintext HTTP/2. `keys`: the API keys, (key, role)
    /// pairs, and the role everyone has without keys; `role`: the role a lookup answered
    /// here needs. `hits`: the worker's L1, whose hits are answered here for callers whose
    /// key has that role. `served`: the worker's request ids and serving log.
    #[new]
    #[pyo3(signature = (listen_fd, wake_fd, method, backend, max_request, keys, role, served, tls=None, hits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        listen_fd: RawFd,
        wake_fd: RawFd,
        method: String,
        backend: String,
        max_request: usize,
        keys: (Vec<(Vec<u8>, u8)>, u8),
        role: u8,
        served: PyRef<'_, ServedLog>,
        tls: Option<TlsPem>,
        hits: Option<PyRef<'_, HitCache>>,
    ) -> PyResult<Self> {
        let acceptor = tls::acceptor(tls, b"h2")?;
        let listener = serve::listener(listen_fd)?;
        let runtime = serve::runtime()?;
        let shared = Arc::new(Shared {
            queue: Queue::new(wake_fd),
            method,
            backend,
            upstream: Mutex::new(None),
            max_request,
            keys: Keys::new(keys.0, keys.1),
            role,
            hits: hits.map(|cache| Arc::clone(&cache.hits)),
            direct: Arc::new(Direct::new(runtime.handle().clone())),
            served: Arc::clone(&served.served),
        });
        let serving = Arc::clone(&shared);
        let serving = Serving::start("grpc-front", runtime, move |closed| {
            serve::accept(listener, closed, acceptor, move |socket, closed| {
                connection(socket, Arc::clone(&serving), closed)
            })
        })?;
        Ok(GrpcFront { shared, serving })
    }

    /// The front's own Redis connections (planned reads without Python).
    #[getter]
    fn redis(&self) -> FrontRedis {
        FrontRedis::of(&self.shared.direct)
    }

    /// Every call queued since the last take, oldest first.
    fn take(&self) -> Vec<GrpcCall> {
        self.shared.queue.take().into_iter().map(GrpcCall).collect()
    }

    /// Stop accepting, tell clients to go away (GOAWAY), let calls in flight finish for up
    /// to `grace` seconds, then close: calls unfinished by then go with their connections
    /// (clients see UNAVAILABLE).
    fn stop(&self, py: Python<'_>, grace: f64) {
        self.serving.stop(py, grace);
        self.take(); // calls queued still: their streams are gone with the thread
    }
}

async fn connection(socket: Socket, shared: Arc<Shared>, closed: Closing) {
    // the task's polls, counted for the socket's gathered writes (`Coalesce`)
    let turn = Arc::new(AtomicU64::new(0));
    let socket = Coalesce::new(socket, Arc::clone(&turn));
    Turns::new(serve_connection(socket, shared, closed), turn).await;
}

async fn serve_connection(socket: Coalesce<Socket>, shared: Arc<Shared>, mut closed: Closing) {
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
    // metadata x-request-id: the client's, or one made here; sent back in the headers
    let given = parts.headers.get(REQUEST_ID).map(|v| v.as_bytes());
    let request_id = shared.served.request_id(given);
    let id = Some(request_id.as_str());
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
            return status(&mut respond, RESOURCE_EXHAUSTED, &message, id);
        }
        data.put(chunk);
    }
    let request = match unframe(data.freeze()) {
        Ok(request) => request,
        Err((code, message)) => return status(&mut respond, code, message, id),
    };
    let authorization = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let deadline = deadline.map(|limit| tokio::time::Instant::now() + limit);
    let python = |work: Work| {
        wait(
            shared
                .queue
                .send(0, &authorization, &request_id, &request, work),
            deadline,
        )
    };
    // a caller without a key that may read goes to Python, which says why
    let outcome = match &shared.hits {
        Some(hits) if shared.keys.allows(authorization.as_deref(), shared.role) => {
            lookup(hits, &shared.direct, GRPC, &request, python).await
        }
        _ => Outcome::Handler,
    };
    let waited = match outcome {
        Outcome::Here(message, source) => {
            shared.served.offer(GRPC, &request_id, source, &message);
            return send_message(&mut respond, frame(&message), &request_id);
        }
        Outcome::Handler => python(Work::Answer).await,
        Outcome::Ended(waited) => waited,
    };
    match waited {
        Waited::Late => status(&mut respond, DEADLINE_EXCEEDED, "Deadline Exceeded", id),
        Waited::Reply(Reply::Answer(Answer::Message(frame))) => {
            send_message(&mut respond, frame, &request_id)
        }
        Waited::Reply(Reply::Answer(Answer::Status(code, message))) => {
            status(&mut respond, code, &message, id)
        }
        // replies without a plan, loaded without a load: not sent by Python; the stream
        // goes as at shutdown
        Waited::Reply(Reply::Replies(_) | Reply::Loaded) | Waited::Gone => {
            status(&mut respond, UNAVAILABLE, "the server is shutting down", id)
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

/// Status 200 (with the request id), the framed message, then the trailers of status OK.
fn send_message(respond: &mut SendResponse<Bytes>, frame: Vec<u8>, request_id: &str) {
    let response = Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(REQUEST_ID, request_id)
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
fn status(respond: &mut SendResponse<Bytes>, code: u32, message: &str, request_id: Option<&str>) {
    let mut response = Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("grpc-status", code)
        .body(())
        .unwrap_or_default();
    if let Some(value) = request_id.and_then(|id| HeaderValue::from_str(id).ok()) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
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
        None => return status(&mut respond, UNAVAILABLE, UNREACHABLE, None),
    };
    // the request's stream, copied on a task of its own: bidirectional methods (reflection)
    // send more as answers arrive
    if !body.is_end_stream() {
        tokio::spawn(copy(body, upstream));
    }
    let response = match response.await {
        Ok(response) => response,
        Err(_) => return status(&mut respond, UNAVAILABLE, UNREACHABLE, None),
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
