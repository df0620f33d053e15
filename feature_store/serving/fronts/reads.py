"""Lookups without the L1 read and answered on the native fronts' threads.

Without the L1, a lookup cost the worker 3.2 times what Redis spends on it
(benchmarks/results/rest_front.md): parsing the body, checking the ids, building keys and
commands, splitting the replies into entries and writing the answer, all in Python around
one round trip. Here the front does that in the extension (``native/src/hits/``:
``Hits::plan``, ``Hits::render``) for each request in a form Python has answered before
(learned as ``hits.NativeHits`` learns them): it writes the lookup's commands, as
``roundtrip.pack`` writes them, and writes the answer from Redis's replies. A lookup of
anything but one whole group has a read of its own (``FrontLookups._read``): of each group
it asks for, the fields of the features asked and the group's write time, where its
handler reads the whole groups; a lookup over several groups of one entity reads them with
one command per id, as the handler does. The round trip goes one of two ways:

- on the front's own Redis connections (``native/src/front/redis.rs``, NATIVE_READS_CONNECTIONS
  per front): this module opens them with redis-py (its handshake) and hands their sockets
  over; the front reads on them without Python. Every 20 ms (hits.DRAIN_EVERY) ``drain`` takes
  their round trips into the policy of every read (the adaptive timeout, the breaker, the
  round-trip metrics) and sets what the front may do: use them only while the circuit is
  closed, within each size class's timeout. A round trip that fails drops its connection,
  its lookups take the other way, and a new connection is opened;
- sent by Python (no connection, the circuit not closed, a TLS or unix-socket URL): the
  front queues the lookup's commands; this loop takes every planned call of a wake-up at
  once and sends their commands in round trips of up to FLUSH_KEYS keys through
  ``StoreReads.send_packed`` (the breaker, the adaptive timeout, the pooled connections)
  and hands each call its replies' bytes back.

What is Python's stays Python's:

- Redis failing (a timeout, unreachable, the circuit open) is answered with the route's own
  error answer (``RestHandlers.fail`` for REST: the same status, message and Retry-After);
- a reply the front does not answer from (an error reply for a key that holds another type,
  a value only the Python reference decodes, a write time that is not one) goes to the
  route's handler, which reads again, names the fault and answers the entity with status
  "error". Such an entity costs two reads per request; data that clean costs none.

Only with one Redis node (``NativeRoundTrip``) and the debouncer's coalescing on
(``single_flight``); with the L1 on, the fronts answer hits (hits.py) and misses go through
the cache. ``NATIVE_READS=off``: every lookup without the L1 is answered by its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import redis

from feature_store.errors import StoreUnavailableError
from feature_store.serving.fronts.hits import FrontLookups
from feature_store.serving.l1.breaker import CircuitState
from feature_store.serving.l1.flight import FLUSH_KEYS
from feature_store.serving.l1.roundtrip import NativeRoundTrip

if TYPE_CHECKING:
    from feature_store._native import FrontRedis
    from feature_store.serving.runtime import ServingRuntime

log = logging.getLogger(__name__)
OPEN_EVERY = 1.0  # seconds between attempts to open the fronts' missing connections

# answers a planned call with the error Redis's failure deserves (the call, the error, and
# perf_counter() when its round trip started)
Fail = Callable[[Any, BaseException, float], None]


def planned_reads(runtime: ServingRuntime) -> bool:
    """Whether this worker's lookups without the L1 can be planned by its fronts."""
    reader = runtime.reader
    return (
        runtime.settings.native_reads
        and reader.cache is None
        and reader.single_flight
        and isinstance(reader.reads.round_trip, NativeRoundTrip)
    )


class FrontReads(FrontLookups):
    """The planned reads of one worker's fronts (see the module's text)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        super().__init__(runtime, planning=True)
        self.reads = runtime.reader.reads
        # the fronts' own connections (FrontRedis), a redis:// URL's only (see front/redis.rs)
        self.url = runtime.target.url
        self.connect_timeout = runtime.target.connect_timeout
        tcp = urlsplit(self.url).scheme == "redis"
        self.connections = runtime.settings.native_reads_connections if tcp else 0
        self.fronts: list[FrontRedis] = []
        self.connections_gauge = runtime.metrics.front_connections
        self._opening: asyncio.Task[None] | None = None
        self._next_open = 0.0
        self._closing = False
        self._warned = False  # that a connection could not be opened (then at debug level)

    # --- the fronts' own connections -------------------------------------------------

    def attach(self, front: FrontRedis) -> None:
        """A front's connections, kept at ``connections`` while the circuit is closed."""
        if self.connections:
            self.fronts.append(front)

    def drain(self) -> tuple[list[bytes], list[bytes], int, int]:
        """Count what the fronts answered; what their connections' round trips tell goes to
        the policy (the adaptive timeout, the breaker, the round-trip metrics), and the
        policy's state back to the fronts."""
        drained = super().drain()
        reads = self.reads
        breaker, timeout, observe = reads.breaker, reads.timeout, reads.on_round_trip
        short = []
        connections = 0
        for front in self.fronts:
            live, trips, late = front.drain()
            connections += live
            for seconds, keys in trips:
                timeout.observe(seconds, keys)
                if observe is not None:
                    observe(seconds, keys)
            if trips:
                breaker.success()
            for _ in range(late):  # Redis did not answer in time
                breaker.failure()
            if live < self.connections:
                short.append((front, self.connections - live))
        self.connections_gauge.set(connections)
        closed = breaker.state is CircuitState.CLOSED
        timeouts = timeout.bounded()
        for front in self.fronts:
            front.set(closed, timeouts, FLUSH_KEYS)
        now = time.monotonic()
        opening = self._opening is None and not self._closing
        if short and closed and opening and now >= self._next_open:
            self._next_open = now + OPEN_EVERY
            self._opening = asyncio.get_running_loop().create_task(self._open(short))
        return drained

    async def _open(self, short: list[tuple[FrontRedis, int]]) -> None:
        try:
            for front, missing in short:
                for _ in range(missing):
                    front.add(await asyncio.to_thread(self._connect))
        except Exception as e:  # Redis unreachable: a drain tries again OPEN_EVERY seconds on
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(
                level,
                "could not open a Redis connection for the native fronts (%s); their lookups "
                "without the L1 are sent by Python until one opens",
                e,
            )
        finally:
            self._opening = None

    def _connect(self) -> int:
        """A connection made by redis-py (its handshake: AUTH, SELECT, HELLO), its socket
        given up to the caller."""
        client = redis.Redis.from_url(
            self.url, socket_connect_timeout=self.connect_timeout, socket_timeout=1.0
        )
        conn = cast(redis.Connection, client.connection_pool.make_connection())
        try:
            conn.connect()  # type: ignore[no-untyped-call]
            sock: socket.socket | None = conn._sock
            if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
                raise ValueError("not a TCP connection")
            conn._sock = None  # the connection forgets it: closing it leaves the socket open
            return sock.detach()
        finally:
            conn.disconnect()  # type: ignore[no-untyped-call]
            client.close()

    async def close(self) -> None:
        self._closing = True
        if self._opening is not None:
            self._opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opening
        await super().close()

    # --- planned reads Python sends ---------------------------------------------------

    async def read(self, calls: Sequence[Any], fail: Fail) -> None:
        """Send the commands of ``calls`` (each with ``command``, ``count`` and
        ``replies``) in round trips of up to FLUSH_KEYS keys; every call is answered."""
        chunks: list[list[Any]] = []
        size = FLUSH_KEYS
        for call in calls:
            if size + call.count > FLUSH_KEYS:
                chunks.append([])
                size = 0
            chunks[-1].append(call)
            size += call.count
        await asyncio.gather(*(self._chunk(chunk, fail) for chunk in chunks))

    async def _chunk(self, calls: list[Any], fail: Fail) -> None:
        t0 = time.perf_counter()
        try:
            data = b"".join([call.command for call in calls])
            buf, ends = await self.reads.send_packed(data, [call.count for call in calls])
            start = 0
            for call, end in zip(calls, ends, strict=True):
                call.replies(buf, start, end)
                start = end
        except BaseException as error:
            failure: BaseException = error
            if isinstance(error, asyncio.CancelledError):  # at shutdown
                failure = StoreUnavailableError("the serving process is shutting down")
            for call in calls:
                # RuntimeError: answered already (the failure came after its replies)
                with contextlib.suppress(RuntimeError):
                    fail(call, failure, t0)
            if not isinstance(error, Exception):
                raise
