"""The Redis side of one partition: chunks of entities, one pipeline each, retried.

Every command of a chunk (HDEL, HSET, EXPIRE) is idempotent, so when Redis goes away in
the middle of a pipeline the whole chunk is sent again once it is back: whatever part of
it had been applied is applied again with the same bytes. Retries use redis-py's own
``Retry`` with equal-jitter exponential backoff; the bound (``RetrySpec.retries``) turns a
long outage into a clear StoreUnavailableError instead of a job that hangs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
import redis.exceptions
from redis.backoff import EqualJitterBackoff
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE

from feature_store.batch import Command
from feature_store.connection import RedisTarget, SyncClient, translated_errors
from feature_store.errors import StoreUnavailableError
from feature_store.ingest.encode import EncodedBatch
from feature_store.ingest.spec import RetrySpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WriteCounters:
    """What one writer did; summed over partitions into the job's report."""

    entities: int = 0
    values_written: int = 0
    values_removed: int = 0
    chunks: int = 0
    retries: int = 0
    redis_seconds: float = 0.0  # wall time inside pipeline round trips, retries included


class ChunkWriter:
    """Writes encoded batches in chunks of ``chunk_size`` entities, one pipeline per chunk."""

    def __init__(
        self,
        target: RedisTarget,
        *,
        ttl_seconds: int,
        chunk_size: int,
        retry: RetrySpec,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.target = target
        self.ttl_seconds = ttl_seconds
        self.chunk_size = chunk_size
        self.retry_spec = retry
        self.counters = WriteCounters()
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
            self._send(batch.commands(self.ttl_seconds, start, stop))
            self.counters.entities += stop - start
            self.counters.chunks += 1
        self.counters.values_written += batch.values_written
        self.counters.values_removed += batch.values_removed

    def _send(self, commands: list[Command]) -> None:
        t0 = time.perf_counter()
        try:
            self._retry.call_with_retry(lambda: self._execute(commands), self._failed)
        except StoreUnavailableError as e:
            raise StoreUnavailableError(
                f"a chunk of {self.chunk_size} entities could not be written to "
                f"{self.target} after {self.retry_spec.retries} retries "
                f"(up to {self.retry_spec.max_total_wait():.1f}s of backoff): {e}"
            ) from e
        finally:
            self.counters.redis_seconds += time.perf_counter() - t0

    def _execute(self, commands: list[Command]) -> None:
        with translated_errors():
            client = self.client
            if isinstance(client, redis.Redis) and HIREDIS_AVAILABLE:
                _send_packed(client, commands)
                return
            pipe = client.pipeline(transaction=False)  # Redis Cluster: routed per node
            for cmd in commands:
                pipe.execute_command(*cmd)
            pipe.execute()

    def _failed(self, error: Exception) -> None:
        self.counters.retries += 1
        log.warning("Redis write failed, retrying the chunk: %s", error)
        if not self.target.cluster:
            # a fresh client: the old pool may hold sockets to a server that restarted. A
            # cluster client keeps its own: it re-learns the topology after a failover
            # from every node it knows, where a new one would start from the URL's alone
            self.close()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a dead connection must not hide the real error
                log.debug("closing the Redis client failed", exc_info=True)


def _send_packed(client: redis.Redis, commands: list[Command]) -> None:
    """One pipeline round trip on one pooled connection, packed by hiredis.

    What redis-py's ``Pipeline`` does for a non-transactional pipeline (send every packed
    command, then read every reply), without its per-argument Python checks, which cost
    more than the packing itself for HSETs of ~100 arguments. Every reply is read even
    after an error reply, so the connection stays in step; the first error is raised.
    """
    import hiredis  # present: HIREDIS_AVAILABLE

    pack = hiredis.pack_command
    payload = b"".join([pack(cmd) for cmd in commands])  # type: ignore[arg-type]
    pool = client.connection_pool
    conn = pool.get_connection()
    first_error: redis.exceptions.ResponseError | None = None
    try:
        conn.send_packed_command([payload], check_health=False)  # type: ignore[no-untyped-call]
        for _ in commands:
            try:
                conn.read_response()
            except redis.exceptions.ResponseError as e:
                first_error = first_error or e
    except BaseException:
        conn.disconnect()  # type: ignore[no-untyped-call]  # a half-read reply stream
        raise
    finally:
        pool.release(conn)
    if first_error is not None:
        raise first_error
