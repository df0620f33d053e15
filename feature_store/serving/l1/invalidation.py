"""Invalidation of L1 entries across serving instances, over Redis pub/sub.

Writers publish on one channel (``feature_store.notices``): push writes and small library
writes the keys they wrote, the Spark job and large library writes a group's generation.
Every instance (every worker process) follows the channel on a dedicated connection: it
drops the named entries, or marks the group's older entries for a background refresh.
Pub/sub delivers at most once: while the subscription is down (Redis restarting, a network
blip) messages are lost, so after every (re)subscription the instance expires its whole
cache. Entries then reload on next use, and stay available for stale-on-error meanwhile.

A partition does not drop the subscription: the connection hangs without an error, and
notices published meanwhile are lost without a sign. So the listener PINGs its subscribed
connection whenever it has heard nothing for ``HEALTH_INTERVAL`` (a third of the deadline
where that is shorter); nothing heard for its deadline (``HEALTH_DEADLINE`` by default, the
setting ``invalidation_deadline``; no notice, no PONG) is a gap: the connection is dropped
and the subscription made again, which expires the cache as after any drop. Gaps are
counted by kind (``gaps``: ``error``, the connection failed; ``silent``, it hung). A
deadline of 0 turns the check off: a hung subscription is then found only when its
connection fails (benchmarks/invalidation_gap.py measures both).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.asyncio.client import PubSub

from feature_store import notices
from feature_store.connection import AsyncClient, RedisTarget, translated_errors
from feature_store.serving.l1.cache import CacheKey

log = logging.getLogger(__name__)


class Publisher:
    """Tells other serving instances which entries a push write changed (a Protocol seam)."""

    async def publish(self, group: str, keys: Sequence[bytes]) -> None:
        return None


RETRY_MIN, RETRY_MAX = 0.2, 5.0
HEALTH_INTERVAL = 1.0  # seconds without a message before the listener PINGs
HEALTH_DEADLINE = 3.0  # seconds without a message or a PONG: the subscription is lost
# (the default of the setting invalidation_deadline)
STOP_WAIT = 0.5  # seconds ``stop`` waits for the listener's task after each cancel
STOP_TRIES = 8  # cancels before ``stop`` gives up on the task (it then ends at its next read)


class SilentGap(redis.exceptions.ConnectionError):
    """The subscribed connection answered nothing, not even a PING, within the deadline."""


def pubsub_client(target: RedisTarget) -> redis.asyncio.Redis:
    """A plain connection for pub/sub, to the node the URL names."""
    return redis.asyncio.Redis.from_url(target.url, socket_connect_timeout=target.connect_timeout)


class Subscriptions:
    """Where the listener subscribes: the URL's node; in a cluster, any live node.

    Cluster PUBLISH reaches every node, so any node will do, but not always the same one:
    when the node the listener followed dies (a failover), the next attempt takes the next
    node of the cluster client's current view of the cluster.
    """

    def __init__(self, target: RedisTarget, cluster: AsyncClient | None = None) -> None:
        self.target = target
        self.cluster = cluster if isinstance(cluster, redis.asyncio.cluster.RedisCluster) else None
        self._turn = 0

    def connect(self) -> redis.asyncio.Redis:
        if self.cluster is None:
            return pubsub_client(self.target)
        nodes = sorted((n.host, n.port) for n in self.cluster.get_nodes())
        if not nodes:
            return pubsub_client(self.target)
        host, port = nodes[self._turn % len(nodes)]
        self._turn += 1
        parts = urlsplit(self.target.url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
        url = urlunsplit(parts._replace(netloc=netloc, query=""))
        return redis.asyncio.Redis.from_url(url, socket_connect_timeout=self.target.connect_timeout)


class RedisPublisher(Publisher):
    def __init__(self, client: AsyncClient, channel: str, origin: str) -> None:
        self.client = client
        self.channel = channel
        self.origin = origin

    async def publish(self, group: str, keys: Sequence[bytes]) -> None:
        message = notices.keys_message(self.origin, group, keys, time.time())
        with translated_errors():
            await self.client.publish(self.channel, message)


class InvalidationListener:
    """Follows the channel in a background task, reconnecting forever with backoff."""

    def __init__(
        self,
        subscriptions: Subscriptions,
        channel: str,
        invalidate: Callable[[list[CacheKey]], object],
        invalidate_all: Callable[[], object],
        new_generation: Callable[[str, float], object],
        new_write: Callable[[str, float], object] | None = None,
        deadline: float = HEALTH_DEADLINE,
    ) -> None:
        self.subscriptions = subscriptions
        self.deadline = deadline  # 0: no health check
        self.interval = min(HEALTH_INTERVAL, deadline / 3) if deadline else HEALTH_INTERVAL
        self.client: redis.asyncio.Redis | None = None
        self.channel = channel
        self.invalidate = invalidate
        self.invalidate_all = invalidate_all
        self.new_generation = new_generation
        self.new_write = new_write
        self.subscribed = asyncio.Event()
        self.received = 0
        self.gaps: Counter[str] = Counter()  # subscriptions lost, by kind: error, silent
        self.on_gap: Callable[[str], object] | None = None  # metrics
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop following, within STOP_TRIES x STOP_WAIT seconds. A cancel can be lost in
        redis-py's read of the subscription: in the full suite, a worker stopping after a
        silent partition waited forever, its task "cancelling" but reading on. So the task
        is also told to end (it does at its next read, within HEALTH_INTERVAL), cancelled
        again until it has, and the client's close is bounded too."""
        self._stopping = True
        task = self._task
        if task is not None:
            for _ in range(STOP_TRIES):
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=STOP_WAIT)
                if done:
                    if not task.cancelled():
                        task.exception()  # taken: it ends here either way
                    break
            else:
                log.warning("the invalidation listener did not stop; left to end on its own")
        if self.client is not None:
            try:
                async with asyncio.timeout(STOP_WAIT):
                    await self.client.aclose()
            except (TimeoutError, redis.exceptions.RedisError, OSError) as e:
                log.warning("could not close the invalidation subscription: %r", e)

    async def _run(self) -> None:
        delay = RETRY_MIN
        first = True
        while not self._stopping:
            if self.client is not None:
                with contextlib.suppress(Exception):
                    await self.client.aclose()
            self.client = self.subscriptions.connect()
            pubsub: PubSub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                if not first:
                    # messages published while we were away are lost: reload everything
                    self.invalidate_all()
                    log.info("invalidation channel back; cached entries expired")
                first = False
                self.subscribed.set()
                delay = RETRY_MIN
                await self._follow(pubsub)
            except (redis.exceptions.RedisError, OSError) as e:
                self.subscribed.clear()
                first = False
                kind = "silent" if isinstance(e, SilentGap) else "error"
                self.gaps[kind] += 1
                if self.on_gap is not None:
                    self.on_gap(kind)
                log.warning("invalidation channel lost (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]

    async def _follow(self, pubsub: PubSub) -> None:
        """Apply notices until the connection fails or falls silent (``SilentGap``)."""
        loop = asyncio.get_running_loop()
        heard = pinged = loop.time()
        deadline, interval = self.deadline, self.interval
        while not self._stopping:
            message = await pubsub.get_message(timeout=interval)
            now = loop.time()
            if message is not None:
                heard = now
                if message.get("type") == "message":
                    self._apply(message["data"])
                continue
            if not deadline:
                continue
            if now - heard >= deadline:
                raise SilentGap(
                    f"nothing heard on the subscription for {now - heard:.1f} s, not even a "
                    "PONG (a partition?)"
                )
            if now - pinged >= interval:
                await pubsub.ping()
                pinged = now

    def _apply(self, data: bytes) -> None:
        doc = notices.parse(data)
        if doc is None:
            log.warning("ignored a malformed invalidation message: %r", data[:200])
            return
        self.received += 1
        group = str(doc["group"])
        keys = doc.get("keys")
        if isinstance(keys, list):
            self.invalidate([(group, k.encode()) for k in keys])
            written = doc.get("written")
            if written is not None and self.new_write is not None:
                self.new_write(group, float(written))  # type: ignore[arg-type]
        else:
            self.new_generation(group, float(doc["generation"]))  # type: ignore[arg-type]
