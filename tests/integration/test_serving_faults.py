"""Redis going away under a serving process: stale values or a fast 503, then recovery.

The server gets its own redis-server, which the test kills and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import httpx
import pytest
from scrape import metric

from feature_store import sample
from feature_store.client import (
    FeatureClient,
    GrpcFeatureClient,
    ServingUnavailableError,
)
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.config import ServingSettings
from feature_store.serving.l1.cache import Entry, L1Store
from feature_store.serving.process import ServingProcess
from feature_store.serving.runtime import ServingRuntime
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
# A short TTL so the cached entry is expired when Redis dies; it stays servable (stale).
SERVER_ENV = {
    "FEATURE_SERVING_CACHE_TTL": "0.2",
    "FEATURE_SERVING_CACHE_JITTER": "0",
    "FEATURE_SERVING_CACHE_MAX_STALE": "600",
    "FEATURE_SERVING_BREAKER_FAILURES": "3",
    "FEATURE_SERVING_BREAKER_OPEN": "0.2",
    "FEATURE_SERVING_BREAKER_OPEN_MAX": "0.5",
}


def _held(cache: L1Store) -> list[Entry]:
    """The entries a cache holds (either store: ``keys`` then ``peek``)."""
    entries = [cache.peek(k) for k in cache.keys(None)]
    return [e for e in entries if e is not None]


def test_redis_killed_gives_stale_values_or_503_then_recovers(own_redis: EmbeddedRedis) -> None:
    with FeatureStore.connect(own_redis.url, sample.registry()) as store:
        store.write(GROUP, sample.rows(20))
    with (
        ServingProcess(own_redis.url, env=SERVER_ENV) as server,
        # the client's timeout bounds every call below: a hang fails the test
        FeatureClient(server.rest_url, timeout=5) as client,
        GrpcFeatureClient(server.grpc_target, timeout=5) as grpc_client,
    ):
        warm = client.get(ENTITY, [1, 2], features=["float_00", "int_0"])
        assert [s.value for s in warm.rows[0].statuses] == ["present", "present"]

        own_redis.kill()
        time.sleep(0.3)  # past the cache TTL: the entries are expired but kept

        for _ in range(5):  # enough failures to open the circuit
            stale = client.get(ENTITY, [1, 2], features=["float_00", "int_0"])
            assert stale.rows[0].values == warm.rows[0].values
            assert [s.value for s in stale.rows[0].statuses] == ["stale", "stale"]
        whole = client.get(ENTITY, [1], groups=[GROUP]).rows[0]
        assert [s.value for s in whole.statuses] == ["stale"] * 50
        grpc_stale = grpc_client.get(ENTITY, [1], features=["float_00", "int_0"])
        assert [s.value for s in grpc_stale.rows[0].statuses] == ["stale", "stale"]

        # never cached: no value to fall back on, so a 503 (UNAVAILABLE over gRPC)
        r = httpx.post(
            f"{server.rest_url}/v1/features/get",
            json={"entity_type": ENTITY, "ids": [3], "features": ["float_00"]},
            timeout=5,
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "redis_unavailable"
        assert "Retry-After" in r.headers
        with pytest.raises(ServingUnavailableError):
            grpc_client.get(ENTITY, [4], features=["float_00"])
        assert httpx.get(f"{server.rest_url}/readyz", timeout=5).status_code == 503
        metrics = httpx.get(f"{server.rest_url}/metrics", timeout=5).text
        assert metric(metrics, "feature_serving_circuit_opened_total") >= 1
        assert metric(metrics, "feature_serving_cache_stale_serves_total") >= 10

        own_redis.restart()
        recovered = None
        for _ in range(250):  # the breaker probes again within its open period: bounded poll
            try:
                recovered = client.get(ENTITY, [3], features=["float_00"])
                break
            except ServingUnavailableError:
                time.sleep(0.02)
        assert recovered is not None
        assert recovered.rows[0].values == [sample.features(3)["float_00"]]
        fresh = client.get(ENTITY, [1, 2], features=["float_00", "int_0"])
        assert [s.value for s in fresh.rows[0].statuses] == ["present", "present"]
        assert httpx.get(f"{server.rest_url}/readyz", timeout=5).status_code == 200


def test_a_lookup_of_fresh_and_expired_entries_with_redis_dead_is_served_stale(
    own_redis: EmbeddedRedis,
) -> None:
    """Five fresh entries and five expired ones, whole-group lookups (the form the native
    fronts answer from the L1): Redis dead, the five expired ones do not load, and the
    handler answers the lookup with them stale and the others present, REST and gRPC,
    without trying Redis again for them (each served stale once)."""
    with FeatureStore.connect(own_redis.url, sample.registry()) as store:
        store.write(GROUP, sample.rows(20))
    env = {
        **SERVER_ENV,
        "FEATURE_SERVING_CACHE_TTL": "3",
        "FEATURE_SERVING_CACHE_REFRESH_AHEAD": "0",
        "FEATURE_SERVING_XFETCH_BETA": "0",
        "FEATURE_SERVING_INVALIDATION": "off",
    }
    with (
        ServingProcess(own_redis.url, env=env) as server,
        FeatureClient(server.rest_url, timeout=5) as client,
        GrpcFeatureClient(server.grpc_target, timeout=5) as grpc_client,
    ):
        expired, fresh = [6, 7, 8, 9, 10], [1, 2, 3, 4, 5]
        for _ in range(2):  # loaded, then answered by the front: the form is learned
            client.get(ENTITY, expired, groups=[GROUP])
        time.sleep(3.2)  # past their TTL: expired, kept for stale-on-error
        for _ in range(2):
            client.get(ENTITY, fresh, groups=[GROUP])
        own_redis.kill()
        stale = "feature_serving_cache_stale_serves_total"
        before = metric(httpx.get(f"{server.rest_url}/metrics", timeout=5).text, stale)
        for answer in (
            client.get(ENTITY, fresh + expired, groups=[GROUP]),
            grpc_client.get(ENTITY, fresh + expired, groups=[GROUP]),
        ):
            statuses = [{s.value for s in row.statuses} for row in answer.rows]
            assert statuses == [{"present"}] * 5 + [{"stale"}] * 5
            for i, row in zip(fresh + expired, answer.rows, strict=True):
                assert row.values[0] == sample.features(i)["float_00"]
        after = metric(httpx.get(f"{server.rest_url}/metrics", timeout=5).text, stale)
        assert after == before + 10


def test_without_a_cache_a_dead_redis_is_a_fast_503(own_redis: EmbeddedRedis) -> None:
    with (
        ServingProcess(own_redis.url, args=["--no-cache"], env=SERVER_ENV) as server,
        FeatureClient(server.rest_url, timeout=5) as client,
    ):
        own_redis.kill()
        for _ in range(6):
            with pytest.raises(ServingUnavailableError):
                client.get(ENTITY, [1], features=["float_00"])
        metrics = httpx.get(f"{server.rest_url}/metrics", timeout=5).text
        assert metric(metrics, "feature_serving_circuit_opened_total") >= 1
        own_redis.restart()
        for _ in range(250):
            try:
                result = client.get(ENTITY, [1], features=["float_00"])
                break
            except ServingUnavailableError:
                time.sleep(0.02)
        else:
            raise AssertionError("serving did not recover after Redis came back")
        assert [s.value for s in result.rows[0].statuses] == ["missing"]


@pytest.mark.parametrize("native", ["on", "off"])
def test_a_hung_redis_costs_the_adaptive_timeout_not_a_hang(
    own_redis: EmbeddedRedis, native: str
) -> None:
    """SIGSTOP: connections stay open but nothing answers, the worst case for a caller.
    Native off, the round trip's deadline is the reference's asyncio.timeout."""
    with FeatureStore.connect(own_redis.url, sample.registry()) as store:
        store.write(GROUP, sample.rows(5))
    assert own_redis.process is not None
    pid = own_redis.process.pid
    env = {
        **SERVER_ENV,
        "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "0.3",
        "FEATURE_STORE_NATIVE": native,
    }
    with (
        ServingProcess(own_redis.url, env=env) as server,
        FeatureClient(server.rest_url, timeout=5) as client,
    ):
        warm = client.get(ENTITY, [1], features=["int_0"])
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.3)
            stale = client.get(ENTITY, [1], features=["int_0"])
            assert stale.rows[0].values == warm.rows[0].values
            assert [s.value for s in stale.rows[0].statuses] == ["stale"]
            # a timeout's error, after one deadline (not "unavailable" after two)
            with pytest.raises(ServingUnavailableError, match="Redis did not answer"):
                client.get(ENTITY, [2], features=["int_0"])
        finally:
            os.kill(pid, signal.SIGCONT)
        for _ in range(250):
            result = client.get(ENTITY, [1], features=["int_0"])
            if result.rows[0].statuses[0].value == "present":
                break
            time.sleep(0.02)
        assert [s.value for s in result.rows[0].statuses] == ["present"]


async def test_losing_the_invalidation_channel_expires_the_cache(own_redis: EmbeddedRedis) -> None:
    """Invalidations published while the subscription was down are lost: reload everything."""
    with FeatureStore.connect(own_redis.url, sample.registry()) as store:
        store.write(GROUP, sample.rows(3))
    rt = ServingRuntime(
        sample.registry(), RedisTarget.parse(own_redis.url), ServingSettings(cache_ttl=600)
    )
    await rt.start()
    try:
        assert rt.listener is not None
        assert rt.listener.subscribed.is_set()
        await rt.service.lookup(ENTITY, [1, 2], ["int_0"])
        cache = rt.reader.cache
        assert cache is not None
        assert all(e.expires_at > cache.clock() + 500 for e in _held(cache))
        own_redis.kill()
        for _ in range(500):  # bounded: the listener notices the lost connection
            if not rt.listener.subscribed.is_set():
                break
            await asyncio.sleep(0.01)
        own_redis.restart()
        await asyncio.wait_for(rt.listener.subscribed.wait(), 30)
        assert len(cache) == 2  # kept, for stale-on-error
        assert all(e.expires_at <= cache.clock() for e in _held(cache))
        again = await rt.service.lookup(ENTITY, [1], ["int_0"])
        assert again.entries[0][0].entry.expires_at > cache.clock() + 500  # reloaded
    finally:
        await rt.stop()


@pytest.mark.parametrize("deadline", [1.0, 0.0])
async def test_the_subscriptions_deadline_is_a_setting(
    own_redis: EmbeddedRedis, deadline: float
) -> None:
    """INVALIDATION_DEADLINE reaches the listener: a deadline of 1 s finds a silent cut of
    the subscription before the default's 3 s could; 0 turns the check off, and the cut
    goes unseen for as long as the default takes to see it."""
    from feature_store.serving.l1.invalidation import HEALTH_DEADLINE, HEALTH_INTERVAL

    with FeatureStore.connect(own_redis.url, sample.registry()) as store:
        store.write(GROUP, sample.rows(3))
    proxy = FreezingProxy(own_redis.port or 0)
    url = await proxy.start()
    settings = ServingSettings(cache_ttl=600, invalidation_deadline=deadline)
    rt = ServingRuntime(sample.registry(), RedisTarget.parse(url), settings)
    await rt.start()
    try:
        assert rt.listener is not None
        await rt.service.lookup(ENTITY, [1], ["int_0"])
        await asyncio.sleep(0.5)
        proxy.freeze()
        # the default hears a PONG at least every PING interval, so it cannot find the cut
        # before its deadline less an interval, and finds it within its deadline and a few
        # intervals (the test above)
        looked = (
            HEALTH_DEADLINE - HEALTH_INTERVAL if deadline else HEALTH_DEADLINE + 3 * HEALTH_INTERVAL
        )
        for _ in range(int(looked / 0.1)):  # bounded
            if rt.listener.gaps:
                break
            await asyncio.sleep(0.1)
        assert rt.listener.gaps == ({"silent": 1} if deadline else {})
    finally:
        await rt.stop()
        await proxy.stop()


class FreezingProxy:
    """A TCP proxy to Redis whose open connections can be frozen: bytes stop flowing both
    ways without a close or an error, as across a partition (packets dropped). Connections
    made after the freeze flow again: the partition healed for them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.frozen: set[asyncio.Event] = set()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def freeze(self) -> None:
        for cut in self.frozen:
            cut.set()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        cut = asyncio.Event()
        self.frozen.add(cut)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if cut.is_set():
                    await asyncio.sleep(3600)  # dropped: nothing more passes, nothing closes
                dst.write(data)
                await dst.drain()

        try:
            with contextlib.suppress(Exception):
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            writer.close()
            up_writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_a_silent_partition_of_the_subscription_is_detected_and_expires_the_cache(
    own_redis: EmbeddedRedis,
) -> None:
    """A partition does not drop the subscribed connection: it hangs, and a notice published
    meanwhile never arrives. The listener PINGs a quiet subscription and, hearing nothing
    by its deadline, subscribes again and expires the cache, as after any drop; the gap is
    counted (feature_serving_invalidation_gaps_total{kind="silent"})."""
    from feature_store.serving.l1.invalidation import HEALTH_DEADLINE

    with FeatureStore.connect(own_redis.url, sample.registry()) as store:
        store.write(GROUP, sample.rows(3))
    proxy = FreezingProxy(own_redis.port or 0)
    url = await proxy.start()
    rt = ServingRuntime(sample.registry(), RedisTarget.parse(url), ServingSettings(cache_ttl=600))
    await rt.start()
    try:
        assert rt.listener is not None
        await rt.service.lookup(ENTITY, [1, 2], ["int_0"])
        cache = rt.reader.cache
        assert cache is not None
        assert all(e.expires_at > cache.clock() + 500 for e in _held(cache))
        await asyncio.sleep(HEALTH_DEADLINE)  # quiet, but healthy: PONGs keep it
        assert rt.listener.gaps == {}
        received = rt.listener.received
        proxy.freeze()
        frozen_at = time.monotonic()
        with FeatureStore.connect(own_redis.url, sample.registry()) as store:
            store.write(GROUP, [(1, {"int_0": 4242})])  # its notice is lost in the partition
        for _ in range(100):  # bounded: the deadline and a ping interval, then a new subscription
            if rt.listener.gaps.get("silent") and rt.listener.subscribed.is_set():
                break
            await asyncio.sleep(0.1)
        detected = time.monotonic() - frozen_at
        assert rt.listener.gaps == {"silent": 1}
        assert rt.listener.received == received  # the notice never came
        assert detected < HEALTH_DEADLINE + 3.0
        # every entry expired: the next lookup reloads what the lost notice was about
        assert all(e.expires_at <= cache.clock() for e in _held(cache))
        # the metric (read from its registry: a scrape's text depends on the process's
        # multiprocess mode, which other tests of the session may have set)
        gaps = rt.metrics.registry.get_sample_value(
            "feature_serving_invalidation_gaps_total", {"kind": "silent"}
        )
        assert gaps == 1
    finally:
        await rt.stop()
        await proxy.stop()
