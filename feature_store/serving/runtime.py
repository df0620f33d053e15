"""One serving worker's parts, built from settings and wired together.

The FastAPI app and the gRPC server of a worker share one runtime, hence one L1 cache,
one Redis connection pool and one circuit breaker.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid

import redis.asyncio

from feature_store.connection import AsyncClient, RedisTarget
from feature_store.errors import StoreError, StorePermissionError
from feature_store.native import native_enabled
from feature_store.registry import Registry
from feature_store.serving.config import ServingSettings
from feature_store.serving.feature_log import FeatureLog
from feature_store.serving.l1.breaker import AdaptiveTimeouts, CircuitBreaker
from feature_store.serving.l1.cache import L1Store, LRUCache
from feature_store.serving.l1.invalidation import (
    InvalidationListener,
    RedisPublisher,
    Subscriptions,
    pubsub_client,
)
from feature_store.serving.l1.loader import CachedReader
from feature_store.serving.l1.roundtrip import CONNECTION_WAIT, ClusterRoundTrip, round_trip_for
from feature_store.serving.l1.warm import WarmStart
from feature_store.serving.metrics import SYNC_EVERY, ServingMetrics
from feature_store.serving.service import FeatureService
from feature_store.serving.siblings import Siblings
from feature_store.serving.writer import Writer
from feature_store.store import AsyncFeatureStore

log = logging.getLogger(__name__)


class ServingRuntime:
    """``reference_l1``: the L1 in Python (``LRUCache``, the reference of the native one's
    semantics) even where the extension is built: for tests of the policy's own state."""

    def __init__(
        self,
        registry: Registry,
        target: RedisTarget,
        settings: ServingSettings,
        *,
        reference_l1: bool = False,
    ) -> None:
        self.registry = registry
        self.target = target
        self.settings = settings
        self.store = AsyncFeatureStore(registry, _client(target))
        client = self.store.client
        round_trip = round_trip_for(client, target)
        cache = _l1(registry, settings, reference_l1) if settings.cache else None
        self.reader = CachedReader(
            registry,
            round_trip,
            cache=cache,
            breaker=CircuitBreaker(
                settings.breaker_failures,
                settings.breaker_window,
                settings.breaker_open,
                settings.breaker_open_max,
            ),
            timeout=AdaptiveTimeouts(
                settings.redis_timeout_min,
                settings.redis_timeout_max,
                settings.redis_timeout_percentile,
                settings.redis_timeout_factor,
            ),
            xfetch_beta=settings.xfetch_beta,
            single_flight=settings.single_flight,
            refresh_rate=settings.refresh_rate,
            shadow_fraction=settings.shadow_fraction,
            shadow_max_per_second=settings.shadow_max_per_second,
            refresh_ahead=settings.cache_refresh_ahead,
        )
        self.listener: InvalidationListener | None = None
        # with `serve --workers N`: the workers, for readiness (siblings.py)
        self.siblings: Siblings | None = None
        publisher = None
        if settings.invalidation:
            # an instance without a cache still tells the others about its writes
            # in a cluster, the cluster client publishes (it follows failovers)
            publisher = RedisPublisher(
                client if target.cluster else pubsub_client(target),
                settings.invalidation_channel,
                uuid.uuid4().hex,
            )
            if settings.cache:
                self.listener = InvalidationListener(
                    Subscriptions(target, client),
                    settings.invalidation_channel,
                    self.reader.invalidate,
                    self.reader.invalidate_all,
                    self.reader.new_generation,
                    self.reader.new_write,
                    settings.invalidation_deadline,
                )
        self._publisher = publisher
        self.service = FeatureService(
            registry, self.reader, Writer(client, target.durability), settings, publisher
        )
        self.metrics = ServingMetrics(self.reader)
        if self.listener is not None:
            self.listener.on_gap = lambda kind: self.metrics.invalidation_gaps.labels(kind).inc()
        # request ids, and with FEATURE_SERVING_FEATURE_LOG the serving log (feature_log/)
        self.served = FeatureLog(
            registry,
            settings.feature_log,
            sample=settings.feature_log_sample,
            roll_seconds=settings.feature_log_roll_seconds,
            roll_bytes=settings.feature_log_roll_bytes,
            queue_bytes=settings.feature_log_queue_bytes,
            metrics=self.metrics.registry,
        )
        self.metrics.on_render.append(self.served.count_drops)
        self._metrics_task: asyncio.Task[None] | None = None
        self.warm = (
            WarmStart(registry, self.reader, client, settings.warm_start_keys)
            if settings.cache and settings.warm_start_keys > 0
            else None
        )
        self._snapshot_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.served.start()
        if self.listener is not None:
            self.listener.start()
        if self.metrics.multiprocess:
            self._metrics_task = asyncio.get_running_loop().create_task(self._sync_metrics())
        try:
            async with asyncio.timeout(self.settings.redis_timeout_max * 2):
                await self.store.check_server()
        except StorePermissionError as e:  # managed Redis often refuses CONFIG GET
            log.warning("could not check the server's listpack settings: %s", e)
        except (StoreError, TimeoutError) as e:
            # serving starts anyway: readiness reports Redis, and reads recover when it is back
            log.warning("Redis is not reachable at startup: %s", e)
        if self.listener is not None:
            try:
                async with asyncio.timeout(2.0):
                    await self.listener.subscribed.wait()
            except TimeoutError:
                log.warning("not yet subscribed to the invalidation channel")
        if self.warm is not None:
            await self._warm_up(self.warm)

    async def _warm_up(self, warm: WarmStart) -> None:
        """Load the hot set of running workers before serving, within the time budget."""
        t0 = time.monotonic()
        budget = self.settings.warm_start_seconds
        try:
            async with asyncio.timeout(budget):
                await warm.load()
        except TimeoutError:
            log.warning("warm start: stopped at its budget of %.1f s", budget)
        except StoreError as e:
            log.warning("warm start: Redis failed (%s); starting with what is loaded", e)
        loaded = sum(warm.loaded.values())
        if loaded:
            log.warning(
                "warm start: %d entries loaded in %.2f s (%s)",
                loaded,
                time.monotonic() - t0,
                ", ".join(f"{g}: {n}" for g, n in warm.loaded.items()),
            )
        if self.settings.warm_snapshot_interval > 0:
            self._snapshot_task = asyncio.get_running_loop().create_task(
                warm.snapshots_every(self.settings.warm_snapshot_interval)
            )

    async def ready(self) -> bool:
        """Every worker of the server answers (``siblings``), and Redis answers a PING."""
        if self.siblings is not None and not self.siblings.all_serving():
            return False
        return await self.redis_answers()

    async def redis_answers(self) -> bool:
        try:
            async with asyncio.timeout(min(0.5, self.settings.redis_timeout_max)):
                return await self.store.ping()
        except (StoreError, TimeoutError):
            return False

    async def _sync_metrics(self) -> None:
        while True:
            await asyncio.sleep(SYNC_EVERY)
            self.metrics.sync()

    async def save_warm(self) -> None:
        """The freshest hot set, for the worker that replaces this one: taken once, at
        shutdown, while the cache (and the fronts' entries) are still whole."""
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            self._snapshot_task = None
        warm, self.warm = self.warm, None
        if warm is not None:
            try:
                async with asyncio.timeout(1.0):
                    await warm.snapshot()
            except (StoreError, TimeoutError) as e:
                log.warning("could not save the warm-start snapshot at shutdown: %s", e)

    async def stop(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
        await self.save_warm()
        # the log's last rows, before the metrics' last counts
        await asyncio.get_running_loop().run_in_executor(None, self.served.stop)
        self.metrics.close()
        await self.service.close()
        await self.reader.close()
        if self.listener is not None:
            await self.listener.stop()
        if self._publisher is not None and self._publisher.client is not self.store.client:
            await self._publisher.client.aclose()
        if isinstance(self.reader.reads.round_trip, ClusterRoundTrip):
            await self.reader.reads.round_trip.aclose()
        await self.store.close()


def _l1(registry: Registry, settings: ServingSettings, reference: bool) -> L1Store:
    """The worker's L1: in the extension, shared with the native fronts (native_cache.py),
    or, with ``FEATURE_STORE_NATIVE=off`` (or ``reference``), the pure-Python reference."""
    keep_answers = settings.cache_form == "answers"
    if reference or not native_enabled():
        return LRUCache(
            settings.cache_max_bytes,
            settings.cache_max_entries,
            settings.cache_ttl,
            settings.cache_negative_ttl,
            settings.cache_jitter,
            settings.cache_max_stale,
            keep_answers=keep_answers,
        )
    from feature_store.serving.l1.native_cache import NativeCache
    from feature_store.serving.l1.spec import GroupSpec

    return NativeCache(
        {name: GroupSpec.of(g, registry).fmt for name, g in registry.groups.items()},
        max_bytes=settings.cache_max_bytes,
        max_entries=settings.cache_max_entries,
        ttl=settings.cache_ttl,
        negative_ttl=settings.cache_negative_ttl,
        jitter=settings.cache_jitter,
        max_stale=settings.cache_max_stale,
        keep_answers=keep_answers,
        max_ids=settings.max_entities,
        shadow_fraction=settings.shadow_fraction,
    )


def _client(target: RedisTarget) -> AsyncClient:
    """The store client's connections; on a single node, a pool that waits when all are busy.

    redis-py's default pool raises at once when ``max_connections`` are in use, which under
    a burst of misses (the cache off, many bypasses) turns into 503s and opens the circuit
    although Redis is healthy. Waiting instead is bounded by the pool's own timeout
    (roundtrip.CONNECTION_WAIT), so that a wait for a free connection (local overload) is
    told apart from a connect that hangs (Redis failing, which the breaker counts).
    """
    if target.cluster:
        return target.async_client()
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        target.url,
        max_connections=target.max_connections,
        timeout=CONNECTION_WAIT,
        **target.connection_options(),
    )
    return redis.asyncio.Redis.from_pool(pool)  # the client owns and closes the pool


def tune_gc(settings: ServingSettings) -> None:
    """Keep full collections off the request path (docs/serving.md, "GC").

    Called once the worker has loaded everything it keeps for its lifetime: freezing moves
    those objects out of the collector's view, and the higher thresholds make collections
    of young objects rarer (most request garbage is freed by reference counting anyway).
    """
    if not settings.gc_freeze:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*settings.gc_threshold)
    log.info("gc frozen (%d objects), thresholds %s", gc.get_freeze_count(), settings.gc_threshold)
