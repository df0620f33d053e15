//! The native REST front: HTTP/1.1 (hyper), so that a lookup over REST costs what its
//! lookup costs, and a thousand connections are served in the order their requests arrived
//! instead of by the luck of an overloaded asyncio loop's reads.
//!
//! POSTs to the fast routes (`/v1/features/get`, `/v1/features/write`, Feast's) are read
//! here: the API key is checked before the body is read (`auth.rs`), then the content type,
//! the body's size and its deadline. A lookup is then looked up (`lookup.rs`); a request
//! that needs Python is queued (`queue.rs`) and the loop answers it with the route's
//! handler (`RestCall.respond`). The refusals here (401, 403, 408, 413, 415) are answers
//! Python rendered once per route, so each message lives once.
//!
//! Every other request (the documentation, the registry, health, metrics, other methods) is
//! passed on to uvicorn on a loopback port, body and answer streamed both ways.

use std::convert::Infallible;
use std::os::unix::io::RawFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::HttpBody;
use hyper::client::HttpConnector;
use hyper::server::conn::Http;
use hyper::service::service_fn;
use hyper::{Body, Client, Method, Request, Response, StatusCode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::auth::Keys;
use super::links::FrontRedis;
use super::lookup::{lookup, Outcome};
use super::queue::{call_class, wait, Pending, Queue, Reply, Waited, Work};
use super::redis::Direct;
use super::serve::{self, Closing, Serving, Socket};
use super::served::{Served, ServedLog};
use super::tls::{self, TlsPem};
use crate::hits::{HitCache, Hits};

const UNREACHABLE: &[u8] =
    br#"{"error":{"code":"unavailable","message":"the HTTP server behind the front is not reachable"}}"#;

/// The header of a lookup's request id.
const REQUEST_ID: &str = "x-request-id";

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

/// The routes whose lookups are answered here: each its index and its API (`hits::REST`,
/// `hits::FEAST`).
type Lookups = Vec<(usize, u8)>;

struct Shared {
    queue: Queue<Answer>,
    routes: Vec<Route>,
    keys: Keys,
    backend: String, // "127.0.0.1:port" of uvicorn
    client: Client<HttpConnector, Body>,
    max_body: usize,
    body_timeout: Duration,
    hits: Option<(Lookups, Arc<Hits>)>, // the lookup routes, and the worker's L1
    direct: Arc<Direct>,                // Redis connections of the front's own (planned reads)
    served: Arc<Served>,                // request ids, and the log of answers given here
}

/// One POST to a fast route, handed to Python (see `queue::Pending`).
#[pyclass(module = "feature_store._native")]
pub struct RestCall(Pending<Answer>);

call_class!(RestCall, body, {
    /// The route's index.
    #[getter]
    fn route(&self) -> usize {
        self.0.route
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
        self.0.answer(Answer {
            status,
            headers,
            body: Bytes::copy_from_slice(body),
        })
    }
});

/// A route as Python describes it: path, role, and its refusals (status, body, headers).
type RouteSpec = (String, u8, Vec<(u16, Vec<u8>, Vec<(String, String)>)>);

/// The front: a listening socket, served on its own thread until `stop`.
#[pyclass(module = "feature_store._native")]
pub struct RestFront {
    shared: Arc<Shared>,
    serving: Serving,
}

#[pymethods]
impl RestFront {
    /// Serve on `listen_fd` (a bound, listening TCP socket, now owned by the front). POSTs
    /// to the routes' paths are queued for `take` and announced on `wake_fd`; everything
    /// else goes to the HTTP server at `backend` ("127.0.0.1:port").
    ///
    /// `keys`: the API keys, (key, role) pairs, and the role everyone has without keys.
    /// `tls`: PEM bytes of the certificate chain, its key and optionally a client CA; None
    /// serves plaintext. `hits`: the lookup routes, each (its index, its API: `hits::REST`
    /// or `hits::FEAST`), and the worker's L1, whose hits (or, without the L1, planned
    /// reads) are answered here. `served`: the worker's request ids and serving log.
    #[new]
    #[pyo3(signature = (listen_fd, wake_fd, routes, keys, backend, max_body, body_timeout, header_timeout, served, tls=None, hits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        listen_fd: RawFd,
        wake_fd: RawFd,
        routes: Vec<RouteSpec>,
        keys: (Vec<(Vec<u8>, u8)>, u8),
        backend: String,
        max_body: usize,
        body_timeout: f64,
        header_timeout: f64,
        served: PyRef<'_, ServedLog>,
        tls: Option<TlsPem>,
        hits: Option<(Lookups, PyRef<'_, HitCache>)>,
    ) -> PyResult<Self> {
        let seconds = |what: &str, s: f64| {
            if s.is_finite() && s > 0.0 {
                Ok(crate::time::seconds(s))
            } else {
                Err(PyValueError::new_err(format!(
                    "{what} must be a positive number of seconds"
                )))
            }
        };
        let body_timeout = seconds("body_timeout", body_timeout)?;
        let header_timeout = seconds("header_timeout", header_timeout)?;
        let acceptor = tls::acceptor(tls, b"http/1.1")?;
        let listener = serve::listener(listen_fd)?;
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
        let runtime = serve::runtime()?;
        let shared = Arc::new(Shared {
            queue: Queue::new(wake_fd),
            routes,
            keys: Keys::new(keys.0, keys.1),
            backend,
            client,
            max_body,
            body_timeout,
            hits: hits.map(|(routes, cache)| (routes, Arc::clone(&cache.hits))),
            direct: Arc::new(Direct::new(runtime.handle().clone())),
            served: Arc::clone(&served.served),
        });
        let mut http = Http::new();
        // the deadline runs from the moment the connection waits for a request's head, so it
        // also closes keep-alive connections idle for that long
        http.http1_only(true)
            .http1_keep_alive(true)
            .http1_header_read_timeout(header_timeout);
        let http = Arc::new(http);
        let serving = Arc::clone(&shared);
        let serving = Serving::start("rest-front", runtime, move |closed| {
            serve::accept(listener, closed, acceptor, move |socket, closed| {
                connection(socket, Arc::clone(&serving), closed, Arc::clone(&http))
            })
        })?;
        Ok(RestFront { shared, serving })
    }

    /// The front's own Redis connections (planned reads without Python).
    #[getter]
    fn redis(&self) -> FrontRedis {
        FrontRedis::of(&self.shared.direct)
    }

    /// Every call queued since the last take, oldest first.
    fn take(&self) -> Vec<RestCall> {
        self.shared.queue.take().into_iter().map(RestCall).collect()
    }

    /// Stop accepting, let requests in flight finish for up to `grace` seconds (idle
    /// keep-alive connections close at once), then close.
    fn stop(&self, py: Python<'_>, grace: f64) {
        self.serving.stop(py, grace);
        self.take(); // calls still queued: their connections are gone with the thread
    }
}

async fn connection(socket: Socket, shared: Arc<Shared>, mut closed: Closing, http: Arc<Http>) {
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

/// A POST to a fast route, its answer with the request's id (`x-request-id`: the client's,
/// or one made here; Python's handlers send back the one they are given).
async fn fast(request: Request<Body>, index: usize, shared: &Shared) -> Answer {
    let given = request.headers().get(REQUEST_ID).map(|v| v.as_bytes());
    let request_id = shared.served.request_id(given);
    let mut answer = answer(request, index, shared, &request_id).await;
    if !answer
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case(REQUEST_ID))
    {
        answer.headers.push((REQUEST_ID.to_owned(), request_id));
    }
    answer
}

/// A POST to a fast route: key, content type, size, body deadline, then the lookup (its
/// answer offered to the log) or Python's handler.
async fn answer(request: Request<Body>, index: usize, shared: &Shared, request_id: &str) -> Answer {
    let route = &shared.routes[index];
    let (parts, mut body) = request.into_parts();
    let authorization = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // the key before the body: a caller without one does not get to send 8 MiB
    match shared.keys.role(authorization.as_deref()) {
        None => return route.refusal(401),
        Some(role) if role < route.role => return route.refusal(403),
        Some(_) => {}
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
    let python = |work: Work| {
        wait(
            shared
                .queue
                .send(index, &authorization, request_id, &data, work),
            None,
        )
    };
    let looked_up = shared.hits.as_ref().and_then(|(routes, hits)| {
        let &(_, api) = routes.iter().find(|&&(route, _)| route == index)?;
        Some((api, hits))
    });
    let outcome = match looked_up {
        Some((api, hits)) => lookup(hits, &shared.direct, api, &data, python).await,
        None => Outcome::Handler,
    };
    let waited = match outcome {
        Outcome::Here(body, source) => {
            if let Some((api, _)) = looked_up {
                shared.served.offer(api, request_id, source, &body);
            }
            return Answer {
                status: 200,
                headers: Vec::new(),
                body: Bytes::from(body),
            };
        }
        Outcome::Handler => python(Work::Answer).await,
        Outcome::Ended(waited) => waited,
    };
    match waited {
        // the handler's answer, or Redis's failure as the route answers it
        Waited::Reply(Reply::Answer(answer)) => answer,
        // the server is stopping (or a reply Python does not send)
        Waited::Reply(Reply::Replies(_) | Reply::Loaded) | Waited::Gone | Waited::Late => {
            route.refusal(503)
        }
    }
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
