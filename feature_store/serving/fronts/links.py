"""The native fronts' own Redis connections, and the policy they are read under.

The fronts read Redis on connections of their own (``native/src/front/redis.rs``, held
through ``native/src/front/links.rs``, NATIVE_READS_CONNECTIONS per front): the L1's misses
they load themselves (``native/src/hits/load.rs``) and, without the L1, their planned reads
(reads.py). This module opens those connections with redis-py (its handshake: AUTH, SELECT,
HELLO, the client's name) and hands their sockets over; the fronts read on them without
Python. Every 20 ms (hits.DRAIN_EVERY) ``sync`` takes their round trips into the policy of
every read (the adaptive timeout, the breaker, the round-trip metrics) and sets what the
fronts may do: use them only while the circuit is closed, within each size class's timeout.
A round trip that fails drops its connection, its lookups take Python's path, and a new
connection is opened. Only a ``redis://`` URL's (not TLS, not a unix socket).

On Redis Cluster (``ClusterRoundTrip``) the fronts hold connections to every master,
``NATIVE_READS_CONNECTIONS`` each, numbered here (``ClusterRoutes``), and the table of which
master owns each hash slot, built from redis-py's cluster client's slot map: a lookup's
commands go to their masters in one round trip each, all at once. The table is built again
when the client learns the layout, at once when a front met a redirect (MOVED, ASK: that
lookup went to Python, whose cluster client followed it and learns the layout), and every
ROUTE_EVERY seconds; the layout itself is learnt again every LEARN_EVERY seconds, and every
LEARN_AGAIN seconds after redirects and while a circuit is open, Python's or a master's (a
master cut off by a partition answers nothing, not even a redirect, while its replica
takes over). Each master has its own breaker and adaptive timeouts for the fronts' round
trips: a slow or dead master's lookups go to Python while the others stay on the fronts.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio.cluster

from feature_store.serving.l1.breaker import AdaptiveTimeouts, CircuitBreaker, CircuitState
from feature_store.serving.l1.flight import FLUSH_KEYS
from feature_store.serving.l1.roundtrip import ClusterRoundTrip, node_url

if TYPE_CHECKING:
    from feature_store._native import FrontRedis
    from feature_store.serving.runtime import ServingRuntime

log = logging.getLogger(__name__)
OPEN_EVERY = 1.0  # seconds between attempts to open the fronts' missing connections
ROUTE_EVERY = 2.0  # seconds between builds of a cluster's slot table from the client's map
ROUTE_AGAIN = 0.1  # seconds at least between builds while redirects come
LEARN_EVERY = 30.0  # seconds between learnings of a cluster's layout (CLUSTER SLOTS)
LEARN_AGAIN = 1.0  # seconds at least between learnings after redirects
SLOTS = 16384
UNOWNED = 0xFFFF  # a slot no known master owns, in the fronts' table


@dataclass
class Node:
    """A Redis node the fronts read on: the only one, or a master of a cluster; its
    policy (the breaker and adaptive timeouts of the fronts' round trips to it)."""

    index: int
    host: str
    port: int
    breaker: CircuitBreaker
    timeout: AdaptiveTimeouts
    wanted: bool = True  # a master now (a node that lost its slots keeps its number)


@dataclass
class ClusterRoutes:
    """A cluster's masters as the fronts number them, and the slot table built from the
    cluster client's map (see the module's text)."""

    client: redis.asyncio.cluster.RedisCluster
    # Python's reads' policy, which each master's copies
    like: tuple[CircuitBreaker, AdaptiveTimeouts]
    nodes: dict[str, Node] = field(default_factory=dict)  # by name, host:port
    epoch: int | None = -1  # of the client's map the table was built from
    routed: float = float("-inf")  # when it was built
    learnt: float = float("-inf")  # when the layout was last learnt
    learning: asyncio.Task[None] | None = None

    def table(self, now: float, redirected: int) -> bytes | None:
        """The slot table, when it is to be built again (else None)."""
        manager = self.client.nodes_manager
        idle = self.learning is None or self.learning.done()
        # a circuit open, Python's (its reads time out) or a master's, may mean a master was
        # replaced: behind a partition it answers nothing, no redirect ever comes, and its
        # slots' reads would fail until it is back, however soon its replica took over
        troubled = self.like[0].state is not CircuitState.CLOSED or any(
            n.wanted and n.breaker.state is not CircuitState.CLOSED for n in self.nodes.values()
        )
        again = redirected or troubled
        if idle and now >= self.learnt + (LEARN_AGAIN if again else LEARN_EVERY):
            self.learnt = now
            self.learning = asyncio.get_running_loop().create_task(self._learn())
        # redis-py's count of the layouts it learnt (None where a version has none: the
        # table is then built on the schedule and after redirects only)
        epoch = getattr(manager, "_epoch", None)
        due = now >= self.routed + (ROUTE_AGAIN if redirected else ROUTE_EVERY)
        if epoch == self.epoch and not due:
            return None
        self.epoch, self.routed = epoch, now
        masters: dict[int, int] = {}  # id(node) -> its number
        table = array.array("H", [UNOWNED]) * SLOTS
        for slot, owners in manager.slots_cache.items():
            if not owners:
                continue
            master = owners[0]
            index = masters.get(id(master))
            if index is None:
                index = masters[id(master)] = self.node(master.host, int(master.port)).index
            table[slot] = index
        owning = set(masters.values())
        for node in self.nodes.values():
            node.wanted = node.index in owning
        if sys.byteorder != "little":
            table.byteswap()
        return table.tobytes()

    def node(self, host: str, port: int) -> Node:
        name = f"{host}:{port}"
        node = self.nodes.get(name)
        if node is None:
            breaker, timeout = self.like
            node = self.nodes[name] = Node(
                len(self.nodes),
                host,
                port,
                CircuitBreaker(
                    breaker.threshold, breaker.window, breaker.base_open, breaker.open_max
                ),
                AdaptiveTimeouts(*timeout.settings),
            )
        return node

    async def _learn(self) -> None:
        try:
            await self.client.nodes_manager.initialize()
        except Exception as e:  # the cluster unreachable: its reads say so; learnt again later
            log.debug("could not learn the Redis Cluster's layout: %s", e)


class FrontLinks:
    """The Redis connections of one worker's fronts and their policy (see the module's
    text): opened here, read on by the fronts, drained every few tens of ms (``sync``)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        self.reads = runtime.reader.reads
        # the fronts' own connections (FrontRedis), a redis:// URL's only (see front/redis.rs)
        self.url = runtime.target.url
        self.connect_timeout = runtime.target.connect_timeout
        tcp = urlsplit(self.url).scheme == "redis"
        self.connections = runtime.settings.native_reads_connections if tcp else 0
        self.fronts: list[FrontRedis] = []
        self.connections_gauge = runtime.metrics.front_connections
        self.redirects_counter = runtime.metrics.cluster_redirects
        round_trip = self.reads.round_trip
        # a cluster's masters and slot table; one Redis: node 0, under the reads' own policy
        self.routes = (
            ClusterRoutes(round_trip.client, (self.reads.breaker, self.reads.timeout))
            if isinstance(round_trip, ClusterRoundTrip)
            else None
        )
        parts = urlsplit(self.url)
        self.single = Node(
            0, parts.hostname or "", parts.port or 6379, self.reads.breaker, self.reads.timeout
        )
        self._opening: asyncio.Task[None] | None = None
        self._next_open = 0.0
        self._closing = False
        self._warned = False  # that a connection could not be opened (then at debug level)

    def attach(self, front: FrontRedis) -> None:
        """A front's connections, kept at ``connections`` while the circuit is closed."""
        if self.connections:
            self.fronts.append(front)

    def sync(self) -> None:
        """What the fronts' round trips tell goes to the policy (the adaptive timeout, the
        breaker, the round-trip metrics), and the policy's state back to the fronts. On a
        cluster, the slot table too."""
        if not self.fronts:
            return
        now = time.monotonic()
        routes = self.routes
        if routes is None:
            nodes = [self.single]
        else:
            redirected = sum(front.redirects() for front in self.fronts)
            if redirected:
                self.redirects_counter.inc(redirected)
            table = routes.table(now, redirected)
            if table is not None:
                for front in self.fronts:
                    front.route(table)
            nodes = list(routes.nodes.values())
        observe = self.reads.on_round_trip
        # on a cluster, Python's reads learn their timeout from the fronts' round trips to
        # every master too: with the fronts answering, Python reads only what they hand
        # over, too rarely to learn a timeout of its own, and it stayed at its cap (1 s):
        # a lookup handed over while a master hung took 1.1 s
        also = self.reads.timeout if routes is not None else None
        short = []
        connections = 0
        for node in nodes:
            breaker, timeout = node.breaker, node.timeout
            for front in self.fronts:
                live, trips, late = front.drain(node.index)
                connections += live
                for seconds, keys in trips:
                    timeout.observe(seconds, keys)
                    if also is not None:
                        also.observe(seconds, keys)
                    if observe is not None:
                        observe(seconds, keys)
                if trips:
                    breaker.success()
                for _ in range(late):  # Redis did not answer in time
                    breaker.failure()
                if node.wanted and live < self.connections:
                    short.append((front, node, self.connections - live))
            allowed = self._allowed(breaker) and node.wanted
            timeouts = timeout.bounded()
            for front in self.fronts:
                front.set(allowed, timeouts, FLUSH_KEYS, node.index)
        self.connections_gauge.set(connections)
        # connections are opened while Python's own circuit is closed (Redis answers)
        closed = self.reads.breaker.state is CircuitState.CLOSED
        opening = self._opening is None and not self._closing
        if short and closed and opening and now >= self._next_open:
            self._next_open = now + OPEN_EVERY
            self._opening = asyncio.get_running_loop().create_task(self._open(short))

    def _allowed(self, breaker: CircuitBreaker) -> bool:
        """Whether the fronts may read on a node: its circuit closed. One Redis: the reads'
        own circuit, which Python's reads probe. A cluster's master: its own, which only
        the fronts' round trips tell; past its open time, they probe it (half-open) until
        one answers (closed) or fails (open again, for longer)."""
        if breaker.state is CircuitState.CLOSED:
            return True
        if self.routes is None:
            return False
        return breaker.state is CircuitState.HALF_OPEN or breaker.allow()

    async def _open(self, short: list[tuple[FrontRedis, Node, int]]) -> None:
        try:
            for front, node, missing in short:
                for _ in range(missing):
                    front.add(await asyncio.to_thread(self._connect, node), node.index)
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

    def _connect(self, node: Node) -> int:
        """A connection made by redis-py (its handshake: AUTH, SELECT, HELLO), its socket
        given up to the caller."""
        url = self.url if self.routes is None else node_url(self.url, node.host, node.port)
        client = redis.Redis.from_url(
            url, socket_connect_timeout=self.connect_timeout, socket_timeout=1.0
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
        if self.routes is not None and self.routes.learning is not None:
            self.routes.learning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.routes.learning
        if self._opening is not None:
            self._opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opening
