"""The REST port on the extension's HTTP/1.1 front (``native/src/front/rest.rs``).

uvicorn on asyncio lets some of a thousand connections wait for seconds while it serves the
others (benchmarks/results/dataplane.md): which socket is read next is up to the selector.
The front's thread (tokio and hyper) accepts, parses and reads every connection; POSTs to
the fast routes (``FastPath.routes``) are checked (key, content type, size, body deadline),
queued in arrival order and announced on an eventfd; this loop takes every queued call at
once and answers each with the route's handler, the same function that ``FastPath`` and the
documented FastAPI routes call. Everything else (docs, registry, health, metrics, the
405s) goes through the front to uvicorn, which listens on a loopback port of its own.

With the L1 on, a lookup whose every entity is a fresh entry is answered on the front's
thread from the entries' bytes, without Python (hits.py, ``NATIVE_HITS``). With it off, the
front writes a lookup's Redis commands and its answer, and this loop sends the bytes
(front_reads.py, ``NATIVE_READS``). Both for ``/v1/features/get`` and for Feast's
``/get-online-features`` (its column-shaped answer; feast_api.py teaches its forms).

``REST_FRONT=uvicorn`` (or ``FEATURE_STORE_NATIVE=off``) serves the port with uvicorn
alone, as before.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from feature_store.native import FEAST, REST, native_enabled
from feature_store.serving.api.feast_api import LOOKUP as FEAST_LOOKUP
from feature_store.serving.config import ServingSettings
from feature_store.serving.fronts.calls import QueuedCalls
from feature_store.serving.fronts.hits import NativeHits
from feature_store.serving.fronts.reads import Fail, FrontReads

if TYPE_CHECKING:
    from feature_store._native import RestCall, ServedLog
    from feature_store.serving.api.fast import FastPath
    from feature_store.serving.api.json_answer import Answer, Route

# the lookup routes the front answers (hits.py, front_reads.py), with their APIs
LOOKUPS = {"/v1/features/get": REST, FEAST_LOOKUP: FEAST}
# the statuses the front answers itself, before a route's handler runs
REFUSALS = (400, 401, 403, 408, 413, 415, 503)


def rest_front_kind(settings: ServingSettings) -> str:
    """Who serves the REST port: "native" where the extension is on, else "uvicorn"."""
    return "native" if settings.rest_front == "native" and native_enabled() else "uvicorn"


def refusals(fast: FastPath, route: Route) -> list[Answer]:
    return [fast.refusal(route, status) for status in REFUSALS]


class NativeRestFront(QueuedCalls):
    """The fast routes of ``fast`` on the extension's HTTP/1.1 front, on ``sock``; other
    requests through it to uvicorn on the loopback port ``backend``."""

    def __init__(
        self,
        fast: FastPath,
        sock: socket.socket,
        backend: int,
        settings: ServingSettings,
        hits: NativeHits | FrontReads | None = None,
        fail: Fail | None = None,
        served: ServedLog | None = None,
    ) -> None:
        from feature_store import _native
        from feature_store.serving.config import tls_pem

        super().__init__()
        assert served is not None, "the worker's request ids and log (FeatureLog.native)"
        self.routes = list(fast.routes.values())
        routes = [
            (
                path,
                int(route.role),
                [(a.status, a.body, list(a.headers)) for a in refusals(fast, route)],
            )
            for path, route in fast.routes.items()
        ]
        lookups = [(i, LOOKUPS[path]) for i, path in enumerate(fast.routes) if path in LOOKUPS]
        self.hits = hits if lookups else None
        self.reads = hits if isinstance(hits, FrontReads) else None
        self.l1 = hits if isinstance(hits, NativeHits) else None
        self.fail = fail
        self.start(
            lambda wake: _native.RestFront(
                sock.detach(),
                wake,
                routes,
                fast.auth.native(),
                f"127.0.0.1:{backend}",
                settings.max_body_bytes,
                settings.request_body_timeout,
                settings.request_header_timeout,
                served,
                tls_pem(settings),
                (lookups, self.hits.native) if self.hits is not None else None,
            ),
            "REST port",
        )
        if hits is not None:
            hits.attach(self.front.redis)

    def fail_planned(self, call: RestCall, error: BaseException, t0: float) -> None:
        assert self.fail is not None
        self.fail(call, error, t0)

    async def answer(self, call: RestCall) -> None:
        route = self.routes[call.route]
        # handlers answer errors
        answer = await route.handler(call.authorization, call.body, call.request_id)
        call.respond(answer.status, answer.body, list(answer.headers))
