"""The REST port on the extension's HTTP/1.1 front (``native/src/rest.rs``).

uvicorn on asyncio lets some of a thousand connections wait for seconds while it serves the
others (benchmarks/results/dataplane.md): which socket is read next is up to the selector.
The front's thread (tokio and hyper) accepts, parses and reads every connection; POSTs to
the fast routes (``FastPath.routes``) are checked (key, content type, size, body deadline),
queued in arrival order and announced on an eventfd; this loop takes every queued call at
once and answers each with the route's handler, the same function that ``FastPath`` and the
documented FastAPI routes call. Everything else (docs, registry, health, metrics, the
405s) goes through the front to uvicorn, which listens on a loopback port of its own.

``REST_FRONT=uvicorn`` (or ``FEATURE_STORE_NATIVE=off``) serves the port with uvicorn
alone, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from typing import TYPE_CHECKING

from feature_store.errors import ConfigError
from feature_store.native import native_enabled
from feature_store.serving.config import ServingSettings

if TYPE_CHECKING:
    from feature_store._native import RestCall
    from feature_store.serving.app import FastPath
    from feature_store.serving.json_answer import Answer, Route

log = logging.getLogger(__name__)

# the statuses the front answers itself, before a route's handler runs
REFUSALS = (400, 401, 403, 408, 413, 415, 503)


def rest_front_kind(settings: ServingSettings) -> str:
    """Who serves the REST port: "native" where the extension is on, else "uvicorn"."""
    return "native" if settings.rest_front == "native" and native_enabled() else "uvicorn"


def listen(host: str, port: int, reuse_port: bool, what: str) -> socket.socket:
    """A listening TCP socket on host:port for a native front. SO_REUSEPORT only where
    several workers share the port (``serve`` first checks that no one else holds it)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ConfigError(f"cannot serve {what} on {address}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(where)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        reason = "the port is in use" if e.errno == errno.EADDRINUSE else str(e)
        raise ConfigError(f"cannot serve {what} on {address}: {reason}") from None
    return sock


def refusals(fast: FastPath, route: Route) -> list[Answer]:
    return [fast.refusal(route, status) for status in REFUSALS]


class NativeRestFront:
    """The fast routes of ``fast`` on the extension's HTTP/1.1 front, on ``sock``; other
    requests through it to uvicorn on the loopback port ``backend``."""

    def __init__(
        self, fast: FastPath, sock: socket.socket, backend: int, settings: ServingSettings
    ) -> None:
        from feature_store import _native
        from feature_store.serving.grpc_server import tls_pem

        self.loop = asyncio.get_running_loop()
        self.routes = list(fast.routes.values())
        self.tasks: set[asyncio.Task[None]] = set()
        routes = [
            (
                path,
                int(route.role),
                [(a.status, a.body, list(a.headers)) for a in refusals(fast, route)],
            )
            for path, route in fast.routes.items()
        ]
        keys = [(key, int(role)) for key, role in fast.auth.keys]
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self.front = _native.RestFront(
                sock.detach(),
                self.wake,
                routes,
                keys,
                f"127.0.0.1:{backend}",
                settings.max_body_bytes,
                settings.request_body_timeout,
                settings.request_header_timeout,
                tls_pem(settings),
            )
        except ValueError as e:  # the PEM files, as rustls reads them
            os.close(self.wake)
            raise ConfigError(f"TLS of the REST port: {e}") from None
        except BaseException:
            os.close(self.wake)
            raise
        self.loop.add_reader(self.wake, self._take)

    def _take(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.wake)
        for call in self.front.take():
            task = self.loop.create_task(self._answer(call))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _answer(self, call: RestCall) -> None:
        route = self.routes[call.route]
        answer = await route.handler(call.authorization, call.body)  # handlers answer errors
        call.respond(answer.status, answer.body, list(answer.headers))

    async def stop(self, grace: float) -> None:
        # the loop keeps answering queued calls while the front's thread winds down
        await asyncio.to_thread(self.front.stop, grace)
        if self.wake >= 0:
            self.loop.remove_reader(self.wake)
            os.close(self.wake)
            self.wake = -1
