//! The native REST front: HTTP/1.1 (hyper) on a thread of its own, so that a lookup over
//! REST costs what its lookup costs, and a thousand connections are served in the order
//! their requests arrived instead of by the luck of an overloaded asyncio loop's reads.
//!
//! POSTs to the fast routes (`/v1/features/get`, `/v1/features/write`, Feast's) are read
//! here: the API key is checked before the body is read (the same rule as
//! `auth.Authenticator`, whose Python code stays the reference and answers again inside the
//! handler), then the content type, the body's size and its deadline. A request that passes
//! is queued and announced to Python on an eventfd, as the gRPC front's calls are; the loop
//! answers it with the route's handler (`RestCall.respond`). The refusals here (401, 403,
//! 408, 413, 415) are answers Python rendered once per route, so each message lives once.
//!
//! Every other request (the documentation, the registry, health, metrics, other methods) is
//! passed on to uvicorn on a loopback port, body and answer streamed both ways.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::os::unix::io::{FromRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::HttpBody;
use hyper::client::HttpConnector;
use hyper::server::conn::Http;
use hyper::service::service_fn;
use hyper::{Body, Client, Method, Request, Response, StatusCode};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::direct::{replies_of, Direct, FrontRedis};
use crate::front::{tls_acceptor, TlsPem, Work, TLS_HANDSHAKE_TIMEOUT};
use crate::hits::{HitCache, Hits, Looked};

const UNREACHABLE: &[u8] =
    br#"{"error":{"code":"unavailable","message":"the HTTP server behind the front is not reachable"}}"#;

/// Roles, as `auth.Role`: 0 none, 1 read, 2 admin.
const ROLE_NONE: u8 = 0;
pub(crate) const ROLE_READ: u8 = 1;
const ROLE_ADMIN: u8 = 2;

/// An answer: status, headers besides content-type and content-length, body (JSON).
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
}

/// A fast route: its path, the role it needs, and its refusals by status.
struct Route {
    path: String,
    role: u8,
    refusals: Vec<(u16, Answer)>,
}

impl Route {
    fn refusal(&self, status: u16) -> Answer {
        self.refusals
            .iter()
            .find(|(s, _)| *s == status)
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| Answer {
                status,
                headers: Vec::new(),
                body: Bytes::new(),
            })
    }
}

/// What Python hands back for a queued call: its answer, or (a planned read) Redis's
/// replies to the call's commands, which the front writes the answer from, or (a load)
/// word that the keys it asked for are in the L1.
enum Reply {
    Answer(Answer),
    Replies(Bytes),
    Loaded,
}

struct Queued {
    route: usize,
    authorization: Option<String>,
    body: Bytes,
    work: Work,
    reply: oneshot::Sender<Reply>,
}

/// The routes whose lookups the mirror answers: each its index and its API (`hits::REST`,
/// `hits::FEAST`).
type Lookups = Vec<(usize, u8)>;

struct Shared {
    queue: Mutex<VecDeque<Queued>>,
    wake_fd: RawFd,
    routes: Vec<Route>,
    keys: Vec<(Vec<u8>, u8)>,
    backend: String, // "127.0.0.1:port" of uvicorn
    client: Client<HttpConnector, Body>,
    max_body: usize,
    body_timeout: Duration,
    hits: Option<(Lookups, Arc<Hits>)>, // the lookup routes, and the L1's mirror
    direct: Arc<Direct>,                // Redis connections of the front's own (planned reads)
}

impl Shared {
    fn push(&self, call: Queued) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = queue.is_empty();
        queue.push_back(call);
        drop(queue);
        if was_empty {
            let one: u64 = 1;
            // SAFETY: as in front.rs: an eventfd the Python side owns for the front's life;
            // an 8-byte write cannot be partial, EAGAIN means a wake-up is pending.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }
}

/// The role an Authorization header grants (`auth.Authenticator.role`): admin for everyone
/// without keys; else "Bearer <key>" (scheme in any case, the key trimmed) compared with
/// every key in constant time, the highest role of the keys it equals.
pub(crate) fn role_of(keys: &[(Vec<u8>, u8)], authorization: Option<&str>) -> u8 {
    if keys.is_empty() {
        return ROLE_ADMIN;
    }
    let header = match authorization {
        Some(h) if !h.is_empty() => h,
        _ => return ROLE_NONE,
    };
    let (scheme, token) = match header.find(' ') {
        Some(i) => (&header[..i], &header[i + 1..]),
        None => (header, ""),
    };
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return ROLE_NONE;
    }
    let candidate = token.trim().as_bytes();
    let mut role = ROLE_NONE;
    for (key, key_role) in keys {
        if equal_in_constant_time(key, candidate) && *key_role > role {
            role = *key_role;
        }
    }
    role
}

fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `role_of` for the property tests that hold it to `auth.Authenticator.role`.
#[pyfunction]
#[pyo3(signature = (keys, authorization))]
pub fn rest_role(keys: Vec<(Vec<u8>, u8)>, authorization: Option<&str>) -> u8 {
    role_of(&keys, authorization)
}

/// One POST to a fast route, handed to Python: to answer, or (`count` > 0) a planned
/// lookup whose commands Python sends to Redis, handing back the replies, or (`loading`)
/// a lookup whose missing keys Python loads into the L1 before the front answers it.
#[pyclass(module = "feature_store._native")]
pub struct RestCall {
    #[pyo3(get)]
    route: usize,
    #[pyo3(get)]
    authorization: Option<String>,
    body: Bytes,
    command: Vec<u8>,
    #[pyo3(get)]
    count: usize,
    load: Vec<Vec<u8>>,
    reply: Option<oneshot::Sender<Reply>>,
}

#[pymethods]
impl RestCall {
    /// The request body.
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.body)
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
        let replies = replies_of(buf, start, end)?;
        self.send(Reply::Replies(replies))
    }

    /// A load's keys are in the L1: the front answers from it.
    fn loaded(&mut self) -> PyResult<()> {
        self.send(Reply::Loaded)
    }

    /// Answer with this status, these extra headers and this JSON body.
    fn respond(
        &mut self,
        status: u16,
        body: &[u8],
        headers: Vec<(String, String)>,
    ) -> PyResult<()> {
        if StatusCode::from_u16(status).is_err() {
            return Err(PyValueError::new_err(format!(
                "not an HTTP status: {status}"
            )));
        }
        self.send(Reply::Answer(Answer {
            status,
            headers,
            body: Bytes::copy_from_slice(body),
        }))
    }
}

impl RestCall {
    fn send(&mut self, reply: Reply) -> PyResult<()> {
        match self.reply.take() {
            Some(tx) => {
                let _ = tx.send(reply); // the client may have gone: nothing to do then
                Ok(())
            }
            None => Err(PyRuntimeError::new_err("the call was already answered")),
        }
    }
}

/// A route as Python describes it: path, role, and its refusals (status, body, headers).
type RouteSpec = (String, u8, Vec<(u16, Vec<u8>, Vec<(String, String)>)>);

/// The front: a listening socket, served on its own thread until `stop`.
#[pyclass(module = "feature_store._native")]
pub struct RestFront {
    shared: Arc<Shared>,
    closing: watch::Sender<Option<Duration>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[pymethods]
impl RestFront {
    /// Serve on `listen_fd` (a bound, listening TCP socket, now owned by the front). POSTs
    /// to the routes' paths are queued for `take` and announced on `wake_fd`; everything
    /// else goes to the HTTP server at `backend` ("127.0.0.1:port").
    ///
    /// `keys`: (key, role) pairs, empty without auth. `tls`: PEM bytes of the certificate
    /// chain, its key and optionally a client CA; None serves plaintext. `hits`: the lookup
    /// routes, each (its index, its API: `hits::REST` or `hits::FEAST`), and the L1's
    /// mirror, whose hits (or, without the L1, planned reads) are answered here.
    #[new]
    #[pyo3(signature = (listen_fd, wake_fd, routes, keys, backend, max_body, body_timeout, header_timeout, tls=None, hits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        listen_fd: RawFd,
        wake_fd: RawFd,
        routes: Vec<RouteSpec>,
        keys: Vec<(Vec<u8>, u8)>,
        backend: String,
        max_body: usize,
        body_timeout: f64,
        header_timeout: f64,
        tls: Option<TlsPem>,
        hits: Option<(Lookups, PyRef<'_, HitCache>)>,
    ) -> PyResult<Self> {
        let seconds = |what: &str, s: f64| {
            if s.is_finite() && s > 0.0 {
                Ok(crate::seconds(s))
            } else {
                Err(PyValueError::new_err(format!(
                    "{what} must be a positive number of seconds"
                )))
            }
        };
        let body_timeout = seconds("body_timeout", body_timeout)?;
        let header_timeout = seconds("header_timeout", header_timeout)?;
        let acceptor = match tls {
            Some((cert, key, client_ca)) => Some(tls_acceptor(
                &cert,
                &key,
                client_ca.as_deref(),
                b"http/1.1",
            )?),
            None => None,
        };
        // SAFETY: the caller passes a listening socket it has given up (socket.detach()).
        let listener = unsafe { StdListener::from_raw_fd(listen_fd) };
        listener.set_nonblocking(true)?;
        let routes = routes
            .into_iter()
            .map(|(path, role, refusals)| Route {
                path,
                role,
                refusals: refusals
                    .into_iter()
                    .map(|(status, body, headers)| {
                        (
                            status,
                            Answer {
                                status,
                                headers,
                                body: Bytes::from(body),
                            },
                        )
                    })
                    .collect(),
            })
            .collect();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let runtime = crate::front_runtime()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            wake_fd,
            routes,
            keys,
            backend,
            client,
            max_body,
            body_timeout,
            hits: hits.map(|(routes, cache)| (routes, Arc::clone(&cache.hits))),
            direct: Arc::new(Direct::new(runtime.handle().clone())),
        });
        let (closing, closed) = watch::channel(None);
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("rest-front".into())
            .spawn(move || {
                runtime.block_on(serve(listener, serving, closed, acceptor, header_timeout))
            })?;
        Ok(RestFront {
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
    fn take(&self) -> Vec<RestCall> {
        let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue
            .drain(..)
            .map(|q| {
                let (command, count, load) = q.work.parts();
                RestCall {
                    route: q.route,
                    authorization: q.authorization,
                    body: q.body,
                    command,
                    count,
                    load,
                    reply: Some(q.reply),
                }
            })
            .collect()
    }

    /// Stop accepting, let requests in flight finish for up to `grace` seconds (idle
    /// keep-alive connections close at once), then close.
    fn stop(&self, py: Python<'_>, grace: f64) {
        let grace = crate::seconds(grace);
        let _ = self.closing.send(Some(grace));
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            py.allow_threads(move || {
                let _ = thread.join();
            });
        }
        self.take(); // calls still queued: their connections are gone with the thread
    }
}

impl Drop for RestFront {
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

type Closing = watch::Receiver<Option<Duration>>;

async fn serve(
    listener: StdListener,
    shared: Arc<Shared>,
    mut closed: Closing,
    acceptor: Option<TlsAcceptor>,
    header_timeout: Duration,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(_) => return,
    };
    let mut http = Http::new();
    // the deadline runs from the moment the connection waits for a request's head, so it
    // also closes keep-alive connections idle for that long
    http.http1_only(true)
        .http1_keep_alive(true)
        .http1_header_read_timeout(header_timeout);
    let http = Arc::new(http);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((socket, _)) = accepted {
                    let _ = socket.set_nodelay(true);
                    let (shared, closed, http) = (Arc::clone(&shared), closed.clone(), Arc::clone(&http));
                    match acceptor.clone() {
                        None => {
                            connections.spawn(connection(socket, shared, closed, http));
                        }
                        Some(acceptor) => {
                            connections.spawn(async move {
                                let handshake = tokio::time::timeout(
                                    TLS_HANDSHAKE_TIMEOUT,
                                    acceptor.accept(socket),
                                );
                                if let Ok(Ok(stream)) = handshake.await {
                                    connection(stream, shared, closed, http).await;
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
    let grace = closed.borrow().unwrap_or(Duration::ZERO);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

async fn connection<S>(socket: S, shared: Arc<Shared>, mut closed: Closing, http: Arc<Http>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| handle(request, Arc::clone(&shared)));
    let conn = http.serve_connection(socket, service);
    tokio::pin!(conn);
    let mut closing = closed.borrow().is_some();
    if closing {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            changed = closed.changed(), if !closing => {
                closing = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

async fn handle(request: Request<Body>, shared: Arc<Shared>) -> Result<Response<Body>, Infallible> {
    if request.method() == Method::POST {
        let path = request.uri().path();
        if let Some(index) = shared.routes.iter().position(|r| r.path == path) {
            return Ok(respond(fast(request, index, &shared).await));
        }
    }
    Ok(pass_through(request, &shared).await)
}

/// A POST to a fast route: key, content type, size, body deadline, then Python's handler.
async fn fast(request: Request<Body>, index: usize, shared: &Shared) -> Answer {
    let route = &shared.routes[index];
    let (parts, mut body) = request.into_parts();
    let authorization = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // the key before the body: a caller without one does not get to send 8 MiB
    let role = role_of(&shared.keys, authorization.as_deref());
    if role == ROLE_NONE {
        return route.refusal(401);
    }
    if role < route.role {
        return route.refusal(403);
    }
    let json = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .map_or(false, |v| {
            let media = v.as_bytes().split(|&b| b == b';').next().unwrap_or(b"");
            std::str::from_utf8(media)
                .map_or(false, |m| m.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        return route.refusal(415);
    }
    let declared = body.size_hint().exact().unwrap_or(0) as usize;
    if declared > shared.max_body {
        return route.refusal(413);
    }
    let limit = shared.max_body;
    let read = tokio::time::timeout(shared.body_timeout, async {
        let mut data = BytesMut::with_capacity(declared);
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|_| None)?; // the client went away
            if data.len() + chunk.len() > limit {
                return Err(Some(413));
            }
            data.extend_from_slice(&chunk);
        }
        Ok(data.freeze())
    });
    let data = match read.await {
        Ok(Ok(data)) => data,
        Ok(Err(Some(status))) => return route.refusal(status),
        Ok(Err(None)) => return route.refusal(400),
        Err(_) => return route.refusal(408),
    };
    let lookup = shared.hits.as_ref().and_then(|(routes, hits)| {
        let &(_, api) = routes.iter().find(|&&(route, _)| route == index)?;
        Some((api, hits))
    });
    if let Some((api, hits)) = lookup {
        let ok = |body: Vec<u8>| Answer {
            status: 200,
            headers: Vec::new(),
            body: Bytes::from(body),
        };
        match hits.answer(api, &data) {
            Some(Looked::Answer(body)) => return ok(body),
            Some(Looked::Missing(missing)) => {
                let load = Work::Load(missing.keys.clone());
                match queue(shared, index, &authorization, &data, load).await {
                    Ok(Reply::Loaded) => {
                        if let Some(body) = hits.replay(&data, api, &missing) {
                            return ok(body);
                        } // else evicted or dropped again: Python answers it
                    }
                    Ok(Reply::Answer(answer)) => return answer, // Python answered it
                    Ok(Reply::Replies(_)) | Err(_) => return route.refusal(503),
                }
                return handled(shared, route, index, &authorization, &data).await;
            }
            None => {}
        }
        if let Some(mut plan) = hits.plan(api, &data) {
            if let Some(replies) = shared.direct.read(plan.command.clone(), plan.count).await {
                match hits.render(&plan, &replies, true) {
                    Some(body) => return ok(body),
                    None => return handled(shared, route, index, &authorization, &data).await,
                }
            }
            let command = std::mem::take(&mut plan.command);
            let queued = queue(
                shared,
                index,
                &authorization,
                &data,
                Work::Read(command, plan.count),
            );
            match queued.await {
                Ok(Reply::Replies(replies)) => {
                    if let Some(body) = hits.render(&plan, &replies, false) {
                        return ok(body);
                    } // else Python answers it, reading again
                }
                Ok(Reply::Answer(answer)) => return answer, // Redis failed: Python's error
                Ok(Reply::Loaded) | Err(_) => return route.refusal(503), // stopping
            }
        }
    }
    handled(shared, route, index, &authorization, &data).await
}

/// The route's handler's answer.
async fn handled(
    shared: &Shared,
    route: &Route,
    index: usize,
    authorization: &Option<String>,
    body: &Bytes,
) -> Answer {
    match queue(shared, index, authorization, body, Work::Answer).await {
        Ok(Reply::Answer(answer)) => answer,
        Ok(_) | Err(_) => route.refusal(503), // the server is stopping
    }
}

/// Queue a call for Python.
fn queue(
    shared: &Shared,
    route: usize,
    authorization: &Option<String>,
    body: &Bytes,
    work: Work,
) -> oneshot::Receiver<Reply> {
    let (tx, rx) = oneshot::channel();
    shared.push(Queued {
        route,
        authorization: authorization.clone(),
        body: body.clone(),
        work,
        reply: tx,
    });
    rx
}

fn respond(answer: Answer) -> Response<Body> {
    let mut response = Response::builder()
        .status(answer.status)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    for (name, value) in &answer.headers {
        response = response.header(name.as_str(), value.as_str());
    }
    response
        .body(Body::from(answer.body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Hop-by-hop headers (RFC 9110 7.6.1): this connection's, not the backend's.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Anything else: the same request to uvicorn on its loopback port, the answer streamed back.
async fn pass_through(request: Request<Body>, shared: &Shared) -> Response<Body> {
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = match format!("http://{}{}", shared.backend, path).parse() {
        Ok(uri) => uri,
        Err(_) => return unreachable(),
    };
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    match shared
        .client
        .request(Request::from_parts(parts, body))
        .await
    {
        Ok(mut response) => {
            for name in HOP_BY_HOP {
                response.headers_mut().remove(name);
            }
            response
        }
        Err(_) => unreachable(),
    }
}

fn unreachable() -> Response<Body> {
    Response::builder()
        .status(503)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Body::from(Bytes::from_static(UNREACHABLE)))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        let keys = vec![(b"r".to_vec(), 1), (b"a".to_vec(), 2)];
        assert_eq!(role_of(&[], None), ROLE_ADMIN);
        assert_eq!(role_of(&keys, None), ROLE_NONE);
        assert_eq!(role_of(&keys, Some("Bearer r")), 1);
        assert_eq!(role_of(&keys, Some("bearer  a ")), 2);
        assert_eq!(role_of(&keys, Some("Basic a")), ROLE_NONE);
        assert_eq!(role_of(&keys, Some("Bearer")), ROLE_NONE);
    }
}
