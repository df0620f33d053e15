//! The native fronts: the gRPC port (HTTP/2, `grpc.rs`) and the REST port (HTTP/1.1,
//! `rest.rs`), each on a thread of its own that never holds the GIL.
//!
//! A front reads every connection, answers what it can without Python (a lookup whose
//! entities are fresh cache entries, or one it plans and reads on its own Redis
//! connections: `lookup.rs`), and queues the rest for the asyncio loop in arrival order,
//! announced on an eventfd (`queue.rs`). Other methods and routes pass through to the
//! Python server (grpc.aio, uvicorn) on a loopback port. What the two protocols share lives
//! here once: the queue and its calls, the thread's life and the accept loop (`serve.rs`),
//! TLS (`tls.rs`), API keys (`auth.rs`), the lookup's decision chain, the front's Redis
//! connections (`redis.rs`) and Python's handle on them (`links.rs`), a cluster's hash slots (`slots.rs`) and the gRPC front's
//! gathered writes (`coalesce.rs`). The protocol files keep only their framing, routes and
//! statuses.

pub(crate) mod auth;
pub(crate) mod coalesce;
pub(crate) mod grpc;
pub(crate) mod links;
pub(crate) mod lookup;
pub(crate) mod queue;
pub(crate) mod redis;
pub(crate) mod rest;
pub(crate) mod serve;
pub(crate) mod served;
pub(crate) mod slots;
pub(crate) mod tls;
