"""What the extension's two fronts share on the Python side (``grpc.NativeFront``,
``rest.NativeRestFront``): their listening socket, TLS, and how their calls are taken.

A front's thread queues each call and writes an eventfd; this loop reads it, takes every
queued call at once, and answers each on a task of its own. The front's thread never
holds the GIL, and neither side waits for the other's lock for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from feature_store.errors import ConfigError
from feature_store.serving.l1.loader import settled

if TYPE_CHECKING:
    from feature_store.serving.fronts.hits import NativeHits
    from feature_store.serving.fronts.reads import FrontReads


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


class QueuedCalls:
    """The loop's side of a native front: ``start`` makes the front (given the eventfd it
    announces calls on); subclasses answer each call in ``answer``."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.wake = -1
        self.tasks: set[asyncio.Task[None]] = set()
        self.front: Any = None  # the extension's front: take() and stop(grace)
        self.reads: FrontReads | None = None  # where its planned lookups are sent
        self.l1: NativeHits | None = None  # the L1 its lookups' missing keys load into
        self.proto = False  # whether its answers are gRPC's (a load makes their records)

    def start(self, make: Callable[[int], Any], port: str) -> None:
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self.front = make(self.wake)
        except ValueError as e:  # the PEM files, as rustls reads them
            self._close()
            raise ConfigError(f"TLS of the {port}: {e}") from None
        except BaseException:
            self._close()
            raise
        self.loop.add_reader(self.wake, self._take)

    def _take(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.wake)
        self.dispatch(self.front.take())

    def dispatch(self, calls: list[Any]) -> None:
        """Answer the calls of one take: the planned lookups (``count`` > 0) sent together
        (``FrontReads.read``, failures answered by ``fail_planned``), every other call on a
        task of its own: a load (``loading``) or the handler's answer."""
        planned = [call for call in calls if call.count]
        if planned:
            assert self.reads is not None
            self.spawn(self.reads.read(planned, self.fail_planned))
            calls = [call for call in calls if not call.count]
        for call in calls:
            self.spawn(self.load(call) if call.loading else self.answer(call))

    async def load(self, call: Any) -> None:
        """A lookup the front found keys missing for: they are loaded into the L1 and the
        front answers it from there; the handler answers it where they cannot be (Redis
        failing, an entity's data broken: it names why, or serves what is stale), with
        what the load resolved for them."""
        assert self.l1 is not None
        resolved = await self.l1.fill(call.keys, self.proto)
        if resolved is None:
            call.loaded()
            return
        with settled(resolved):  # the handler does not read those keys again
            await self.answer(call)

    def fail_planned(self, call: Any, error: BaseException, t0: float) -> None:
        """Answer a planned lookup whose round trip failed with its route's error."""
        raise NotImplementedError

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, call: Any) -> None:
        raise NotImplementedError

    async def stop(self, grace: float) -> None:
        # the loop keeps answering queued calls while the front's thread winds down
        await asyncio.to_thread(self.front.stop, grace)
        if self.wake >= 0:  # a second stop finds it closed
            self.loop.remove_reader(self.wake)
            self._close()

    def _close(self) -> None:
        if self.wake >= 0:
            os.close(self.wake)
            self.wake = -1
