"""The Redis side of one partition: chunks of entities, one pipeline each, retried.

Each entity is one call of the ordering guard (``layout.WRITE_SCRIPT``): it writes unless
Redis holds a newer event time for the entity's group, and says which. Every command of a
chunk is idempotent, so when Redis goes away in the middle of a pipeline the whole chunk
is sent again once it is back: whatever part of it had been applied is applied again with
the same bytes (an equal event time writes), and nothing newer is overwritten. Retries use
redis-py's own ``Retry`` with equal-jitter exponential backoff; the bound
(``RetrySpec.retries``) turns a long outage into a clear StoreUnavailableError instead of
a job that hangs.

On Redis Cluster a chunk's commands are grouped by the master that owns each key's slot
(redis-py's slot map) and each master's share is packed by hiredis and written on one of
its connections, every share written before any reply is read: the masters work on their
shares at once. redis-py's cluster pipeline checks and packs every argument in Python,
which cost more than Redis spent on the writes. A reply that says a slot moved (MOVED, ASK:
a reshard) sends the chunk again through that pipeline, which follows it and learns the
new owners; the commands are idempotent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

import redis
import redis.cluster
import redis.exceptions
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE

from feature_store import notices
from feature_store.batch import Command, WriteStats, write_outcome
from feature_store.connection import RedisTarget, SyncClient, translated_errors
from feature_store.errors import ConfigError, StoreError, StoreUnavailableError
from feature_store.ingest.encode import EncodedBatch
from feature_store.ingest.spec import RetrySpec
from feature_store.layout import WRITTEN, with_script
from feature_store.sending import (
    raised,
    redirected,
    scripts_resent,
    send_by_master,
    send_packed,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WriteCounters:
    """What one writer did; summed over partitions into the job's report."""

    entities: int = 0  # written
    values_written: int = 0
    values_removed: int = 0
    skipped: int = 0  # entities not written: Redis holds a newer event time for the group
    chunks: int = 0
    retries: int = 0
    redis_seconds: float = 0.0  # wall time inside pipeline round trips, retries included

    def add(self, stats: WriteStats) -> None:
        self.entities += stats.entities
        self.values_written += stats.values_written
        self.values_removed += stats.values_removed
        self.skipped += stats.skipped


class ChunkWriter:
    """Writes encoded batches in chunks of ``chunk_size`` entities, one pipeline per chunk."""

    def __init__(
        self,
        target: RedisTarget,
        *,
        ttl_seconds: int,
        chunk_size: int,
        retry: RetrySpec,
        ordered: bool = True,
    ) -> None:
        """``ordered`` False: plain HDEL/HSET/EXPIRE, last writer wins (a first load)."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.ordered = ordered
        self.target = target
        self.ttl_seconds = ttl_seconds
        self.chunk_size = chunk_size
        self.retry_spec = retry
        self.counters = WriteCounters()
        self.redirected = 0  # chunks sent again through redis-py's cluster pipeline (MOVED, ASK)
        self._client: SyncClient | None = None
        self._retry = Retry(
            EqualJitterBackoff(cap=retry.max_delay, base=retry.base_delay),
            retry.retries,
            supported_errors=(StoreUnavailableError,),
        )

    @property
    def client(self) -> SyncClient:
        if self._client is None:
            self._client = self.target.sync_client()
        return self._client

    def write(self, batch: EncodedBatch) -> None:
        for start in range(0, len(batch), self.chunk_size):
            stop = min(start + self.chunk_size, len(batch))
            replies = self._send(batch.commands(self.ttl_seconds, start, stop, self.ordered))
            counts = batch.counts(start, stop)
            if not self.ordered:  # HDEL/HSET/EXPIRE per entity: every one is written
                replies = [WRITTEN] * len(counts)
            self.counters.add(write_outcome(counts, replies))
            self.counters.chunks += 1

    def send(self, commands: list[Command]) -> list[object]:
        """One chunk's commands, retried as a whole; their replies."""
        return self._send(commands)

    def publish(self, message: bytes | None) -> None:
        """Tell serving instances (``feature_store.notices``); a failure is logged only:
        the write stands and their caches catch up within their TTL."""
        if message is None:
            return
        try:
            with translated_errors():
                self.client.publish(notices.CHANNEL, message)
        except StoreError as e:
            log.warning("could not tell serving instances about a write: %s", e)

    def _send(self, commands: list[Command]) -> list[object]:
        t0 = time.perf_counter()
        try:
            return self._retry.call_with_retry(lambda: self._attempt(commands), self._failed)
        except StoreUnavailableError as e:
            raise StoreUnavailableError(
                f"a chunk of {self.chunk_size} entities could not be written to "
                f"{self.target} after {self.retry_spec.retries} retries "
                f"(up to {self.retry_spec.max_total_wait():.1f}s of backoff): {e}"
            ) from e
        finally:
            self.counters.redis_seconds += time.perf_counter() - t0

    def _attempt(self, commands: list[Command]) -> list[object]:
        """The chunk's replies; commands Redis answered NOSCRIPT (a restart, SCRIPT FLUSH, a
        promoted replica) go again with the script's text. The first error reply is raised."""
        durability = self.target.durability
        with translated_errors():
            client = self.client
            if isinstance(client, redis.Redis) and HIREDIS_AVAILABLE:
                one = partial(send_packed, client, durability=durability)
                return raised(scripts_resent(one, commands))
            if isinstance(client, redis.RedisCluster) and HIREDIS_AVAILABLE:
                each = partial(send_by_master, client, durability=durability)
                replies = scripts_resent(each, commands)
                if not redirected(replies):
                    return raised(replies)
                self.redirected += 1
                if durability.asked:
                    # the pipeline below follows the redirect, but no WAIT can follow it
                    # on the connections it used: the layout is learnt again and the whole
                    # chunk (idempotent) retried on the new owners
                    raise StoreUnavailableError(
                        "the cluster's slots moved under a durable write; sending it again"
                    )
            if durability.asked:
                raise ConfigError(
                    "write durability needs hiredis (redis[hiredis]) for its per-master WAIT"
                )
            try:
                return _pipeline(client, commands)
            except redis.exceptions.NoScriptError:  # idempotent: the whole chunk again
                return _pipeline(client, [with_script(c) for c in commands])

    def _failed(self, error: Exception) -> None:
        self.counters.retries += 1
        log.warning("Redis write failed, retrying the chunk: %s", error)
        if not self.target.cluster:
            # a fresh client: the old pool may hold sockets to a server that restarted. A
            # cluster client keeps its own: it re-learns the topology after a failover
            # from every node it knows, where a new one would start from the URL's alone
            self.close()
        elif isinstance(self._client, redis.RedisCluster):
            # now, from every node it knows: redis-py re-learns it by itself when a pipeline
            # of plain commands fails, but not for script calls (EVALSHA), which would go
            # on to the dead master until the retries run out
            try:
                self._client.nodes_manager.initialize()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                log.debug("the cluster's topology could not be read yet", exc_info=True)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a dead connection must not hide the real error
                log.debug("closing the Redis client failed", exc_info=True)


def _pipeline(client: SyncClient, commands: list[Command]) -> list[object]:
    """redis-py's pipeline, raising on the first error reply: a cluster client re-learns
    its topology only from an error that is raised, after a failover."""
    pipe = client.pipeline(transaction=False)  # Redis Cluster: routed per node
    for cmd in commands:
        pipe.execute_command(*cmd)
    return pipe.execute()
