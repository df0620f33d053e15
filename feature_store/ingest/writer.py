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
from collections.abc import Callable
from dataclasses import dataclass

import redis
import redis.cluster
import redis.exceptions
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE

from feature_store import notices
from feature_store.batch import Command, WriteStats, write_outcome
from feature_store.connection import RedisTarget, SyncClient, missing_script, translated_errors
from feature_store.errors import StoreError, StoreUnavailableError
from feature_store.ingest.encode import EncodedBatch
from feature_store.ingest.spec import RetrySpec
from feature_store.layout import WRITTEN, with_script

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
        with translated_errors():
            client = self.client
            if isinstance(client, redis.Redis) and HIREDIS_AVAILABLE:
                return _raised(_scripts_resent(lambda c: _send_packed(client, c), commands))
            if isinstance(client, redis.RedisCluster) and HIREDIS_AVAILABLE:
                send = _scripts_resent(lambda c: _send_by_master(client, c), commands)
                redirected = (redis.exceptions.MovedError, redis.exceptions.AskError)
                if not any(isinstance(reply, redirected) for reply in send):
                    return _raised(send)
                self.redirected += 1
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


def _scripts_resent(
    send: Callable[[list[Command]], list[object]], commands: list[Command]
) -> list[object]:
    """``send(commands)``'s replies, the commands Redis answered NOSCRIPT sent again with
    the script's text."""
    replies = send(commands)
    if missing := missing_script(replies):
        again = send([with_script(commands[i]) for i in missing])
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    return replies


def _raised(replies: list[object]) -> list[object]:
    """The replies, or the first error reply raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _key(command: Command) -> bytes | str | int:
    """The key a write command is about: the guard's (EVALSHA/EVAL sha|script 1 key ...),
    or a plain command's first argument."""
    return command[3] if command[0] in ("EVALSHA", "EVAL") else command[1]


def _send_by_master(client: redis.RedisCluster, commands: list[Command]) -> list[object]:
    """``_send_packed`` on a cluster: each master's share of ``commands`` (by the slot of
    each one's key, as the client knows the slots) on one of its pooled connections, every
    share written before any reply is read. Every reply is read, an error reply (MOVED,
    ASK, NOSCRIPT among them) in its command's place."""
    import hiredis  # present: HIREDIS_AVAILABLE

    pack = hiredis.pack_command
    manager = client.nodes_manager
    shares: dict[str, tuple[redis.cluster.ClusterNode, list[int]]] = {}
    for i, command in enumerate(commands):
        node = manager.get_node_from_slot(client.keyslot(_key(command)))  # type: ignore[no-untyped-call]
        shares.setdefault(node.name, (node, []))[1].append(i)
    replies: list[object] = [None] * len(commands)
    held: list[tuple[redis.ConnectionPool, redis.Connection, list[int]]] = []
    try:
        for node, share in shares.values():
            pool = client.get_redis_connection(node).connection_pool
            conn = pool.get_connection()
            held.append((pool, conn, share))
            payload = b"".join([pack(commands[i]) for i in share])  # type: ignore[arg-type]
            conn.send_packed_command([payload], check_health=False)  # type: ignore[no-untyped-call]
        for _, conn, share in held:
            for i in share:
                try:
                    replies[i] = conn.read_response()
                except redis.exceptions.ResponseError as e:
                    replies[i] = e
    except BaseException:
        for _, conn, _ in held:
            conn.disconnect()  # type: ignore[no-untyped-call]  # a half-read reply stream
        raise
    finally:
        for pool, conn, _ in held:
            pool.release(conn)
    return replies


def _send_packed(client: redis.Redis, commands: list[Command]) -> list[object]:
    """One pipeline round trip on one pooled connection, packed by hiredis.

    What redis-py's ``Pipeline`` does for a non-transactional pipeline (send every packed
    command, then read every reply), without its per-argument Python checks, which cost
    more than the packing itself for calls of ~100 arguments. Every reply is read, an
    error reply in its command's place, so the connection stays in step.
    """
    import hiredis  # present: HIREDIS_AVAILABLE

    pack = hiredis.pack_command
    payload = b"".join([pack(cmd) for cmd in commands])  # type: ignore[arg-type]
    pool = client.connection_pool
    conn = pool.get_connection()
    replies: list[object] = []
    try:
        conn.send_packed_command([payload], check_health=False)  # type: ignore[no-untyped-call]
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as e:
                replies.append(e)
    except BaseException:
        conn.disconnect()  # type: ignore[no-untyped-call]  # a half-read reply stream
        raise
    finally:
        pool.release(conn)
    return replies
