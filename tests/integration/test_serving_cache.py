"""The L1 cache on real Redis: single-flight, coalescing, cancellation, negative caching,
invalidation, bypass. Redis reads are counted by the server (INFO commandstats)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Iterator
from typing import cast

import orjson
import pytest
import redis

from feature_store import sample
from feature_store.client import AsyncGrpcFeatureClient, FeatureClient
from feature_store.connection import RedisTarget
from feature_store.errors import StoreTimeoutError
from feature_store.layout import entity_key
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.api.grpc_server import FeatureServicer
from feature_store.serving.api.rest_api import RestHandlers
from feature_store.serving.auth import Authenticator
from feature_store.serving.config import ServingSettings
from feature_store.serving.l1.cache import (
    BYTES_OBJECT,
    CacheKey,
    Entry,
    L1Store,
    LRUCache,
    entry_size,
)
from feature_store.serving.l1.loader import settled
from feature_store.serving.process import ServingProcess
from feature_store.serving.runtime import ServingRuntime
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
REGISTRY = sample.registry()


def entity_reads(url: str) -> int:
    """Entity reads (HMGET or HGETALL) the Redis server has executed since its stats reset."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


def reset_stats(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.config_resetstat()


def key(entity_id: int) -> CacheKey:
    return (GROUP, entity_key("c", REGISTRY.entities[ENTITY].id_type, entity_id))


# these tests count the reads Redis executes: no shadow reads (shadow mode re-reads 1% of hits)
NO_SHADOW = {"FEATURE_SERVING_SHADOW_FRACTION": "0"}


def write_sample(url: str, n: int = 100) -> None:
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(n))


def same_load(a: Entry, b: Entry) -> bool:
    """Whether two entries are one load's: the native cache makes an ``Entry`` on each
    look, with its read time on Python's clock (to within its conversion)."""
    return a.raw == b.raw and abs(a.loaded_at - b.loaded_at) < 1e-3


# each test of the cache's policy runs on both stores: the one in the extension, and the
# pure-Python reference of its semantics
STORES = [
    pytest.param(
        "native",
        marks=pytest.mark.skipif(not native_enabled(), reason="the extension is off"),
    ),
    "reference",
]


@pytest.fixture(params=STORES)
async def runtime(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[ServingRuntime]:
    settings = ServingSettings(
        invalidation=False, cache_negative_ttl=5.0, xfetch_beta=0.0, shadow_fraction=0.0
    )
    rt = ServingRuntime(
        sample.registry(),
        RedisTarget.parse(redis_url),
        settings,
        reference_l1=request.param == "reference",
    )
    await rt.start()
    yield rt
    await rt.stop()


async def test_a_thousand_concurrent_misses_on_one_key_make_one_redis_read(
    runtime: ServingRuntime, redis_url: str
) -> None:
    write_sample(redis_url, 10)
    reset_stats(redis_url)
    results = await asyncio.gather(*(runtime.reader.get([key(3)]) for _ in range(1000)))
    assert entity_reads(redis_url) == 1
    assert {id(r[0].entry) for r in results} == {id(results[0][0].entry)}
    stats = runtime.reader.cache.stats  # type: ignore[union-attr]
    assert (stats.misses, stats.deduplicated, stats.round_trips) == (1, 999, 1)
    assert results[0][0].entry.values is not None
    assert results[0][0].entry.values[0] == sample.features(3)["float_00"]


async def test_an_entry_keeps_the_answer_of_the_api_whose_lookup_loaded_it(
    runtime: ServingRuntime, redis_url: str
) -> None:
    """A gRPC lookup's miss keeps the values' gRPC records and no JSON, a REST lookup's the
    JSON and no records; the other API's first answer makes its own, kept and counted
    against the bound, and a refresh reloads an entry in the form it had."""
    write_sample(redis_url, 10)
    cache = runtime.reader.cache
    assert cache is not None
    body = orjson.dumps({"entity_type": ENTITY, "groups": [GROUP], "ids": [1, 2]})
    request = pb.GetFeaturesRequest(entity_type=ENTITY, groups=[GROUP], int_ids=[1, 2])
    rest = RestHandlers(runtime, Authenticator((), ()))
    grpc = FeatureServicer(runtime)
    await runtime.reader.get([key(1)], proto=True)
    await runtime.reader.get([key(2)])
    g, r = cache.peek(key(1)), cache.peek(key(2))
    assert g is not None
    assert g.raw is not None
    assert r is not None
    assert r.raw is not None
    assert (g.json, g.wire) == (None, g.fmt.proto(g.raw))
    assert (r.json, r.wire) == (r.fmt.json(r.raw), None)
    before = cache.bytes
    answer = await rest.get(None, body)
    assert answer.status == 200
    g = cache.peek(key(1))
    assert g is not None
    assert g.raw is not None
    assert g.json == g.fmt.json(g.raw)  # made by the REST answer, and kept
    assert cache.bytes == before + len(g.json) + BYTES_OBJECT
    if isinstance(cache, LRUCache):
        assert g.size == entry_size(g)
    assert [row["values"] for row in orjson.loads(answer.body)["results"]] == [
        orjson.loads(g.json),
        orjson.loads(cast(bytes, r.json)),
    ]
    await grpc.answer(request, None, 0.0)
    r = cache.peek(key(2))
    assert r is not None
    assert r.raw is not None
    assert r.wire == r.fmt.proto(r.raw)
    assert cache.bytes == before + len(g.json) + len(r.wire) + 2 * BYTES_OBJECT
    # a refresh: the entry loaded for gRPC and never answered over REST stays records alone
    (only_grpc,) = await runtime.reader.get([key(3)], proto=True)
    runtime.reader._reload(key(3))
    await _reloaded(cache, key(3), only_grpc.entry.loaded_at)
    reloaded = cache.peek(key(3))
    assert reloaded is not None
    assert reloaded.json is None
    assert reloaded.wire is not None


async def _reloaded(cache: L1Store, k: CacheKey, loaded_at: float) -> None:
    """Wait for the entry of ``k`` to be one read after ``loaded_at`` (a reload's)."""
    for _ in range(100):
        entry = cache.peek(k)
        if entry is not None and entry.loaded_at > loaded_at:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{k!r} was not reloaded")


async def test_entries_loaded_for_an_answer_from_the_packed_values_keep_no_answer_bytes(
    runtime: ServingRuntime, redis_url: str
) -> None:
    """Feast's API and picked features answer from the packed values: the entries they load
    keep neither JSON nor gRPC records, and are not the dearer for it; a REST lookup of
    the whole group then makes its JSON, and a refresh of one nobody else asked for keeps
    it bare."""
    write_sample(redis_url, 10)
    cache = runtime.reader.cache
    assert cache is not None
    service = runtime.service
    feast = await service.lookup(ENTITY, [1], groups=[GROUP], answers=False)
    picked = await service.lookup(ENTITY, [2], features=["float_00", "embedding_0"])
    for i, lookup in ((1, feast), (2, picked)):
        ((resolved,),) = lookup.entries
        for entry in (resolved.entry, cache.peek(key(i))):
            assert entry is not None
            assert entry.raw is not None
            assert (entry.json, entry.wire) == (None, None)
            if isinstance(cache, LRUCache):
                assert entry.size == entry_size(entry)
    body = orjson.dumps({"entity_type": ENTITY, "groups": [GROUP], "ids": [1]})
    before = cache.bytes
    assert (await RestHandlers(runtime, Authenticator((), ())).get(None, body)).status == 200
    bare = cache.peek(key(1))
    assert bare is not None
    assert bare.json == bare.fmt.json(cast(bytes, bare.raw))
    assert cache.bytes == before + len(bare.json) + BYTES_OBJECT
    runtime.reader._reload(key(2))
    await _reloaded(cache, key(2), picked.entries[0][0].entry.loaded_at)
    reloaded = cache.peek(key(2))
    assert reloaded is not None
    assert (reloaded.json, reloaded.wire) == (None, None)


@pytest.mark.parametrize("single_flight", [True, False])
async def test_without_the_l1_lookups_answered_from_the_packed_values_read_them_bare(
    redis_url: str, single_flight: bool
) -> None:
    """Without the L1 (requests coalesced into shared round trips, or each read alone),
    Feast's API and picked features read their entries without answer bytes too: nothing
    keeps them, and the values' JSON costs more to make than any other part of a read. A
    REST lookup of the whole group in the same round trip still gets its JSON, and a gRPC
    one its records."""
    write_sample(redis_url, 10)
    settings = ServingSettings(cache=False, single_flight=single_flight, invalidation=False)
    rt = ServingRuntime(sample.registry(), RedisTarget.parse(redis_url), settings)
    await rt.start()
    try:
        service = rt.service
        feast, picked, rest, grpc = await asyncio.gather(
            service.lookup(ENTITY, [1, 3], groups=[GROUP], answers=False),
            service.lookup(ENTITY, [2], features=["float_00", "embedding_0"]),
            service.lookup(ENTITY, [1], groups=[GROUP]),
            service.lookup(ENTITY, [2], groups=[GROUP], proto=True),
        )
        for lookup in (feast, picked):
            for (resolved,) in lookup.entries:
                assert resolved.entry.raw is not None
                assert (resolved.entry.json, resolved.entry.wire) == (None, None)
        ((whole,),) = rest.entries
        assert whole.entry.json == whole.entry.fmt.json(cast(bytes, whole.entry.raw))
        ((records,),) = grpc.entries
        assert records.entry.json is None
        assert records.entry.wire == records.entry.fmt.proto(cast(bytes, records.entry.raw))
    finally:
        await rt.stop()


async def test_misses_of_concurrent_requests_share_one_round_trip(
    runtime: ServingRuntime, redis_url: str
) -> None:
    write_sample(redis_url, 100)
    reset_stats(redis_url)
    requests = [[key(i), key(i + 1)] for i in range(0, 100, 2)]
    results = await asyncio.gather(*(runtime.reader.get(r) for r in requests))
    stats = runtime.reader.cache.stats  # type: ignore[union-attr]
    assert stats.round_trips == 1  # 50 requests, 100 keys, one pipeline
    assert stats.coalesced == 99
    assert entity_reads(redis_url) == 100
    assert all(r.entry.values is not None for pair in results for r in pair)
    # all cached now: the same requests again cost nothing
    await asyncio.gather(*(runtime.reader.get(r) for r in requests))
    assert entity_reads(redis_url) == 100
    assert stats.hits == 100


async def test_a_cancelled_caller_does_not_cancel_the_shared_read(
    runtime: ServingRuntime, redis_url: str
) -> None:
    write_sample(redis_url, 10)
    reset_stats(redis_url)
    first = asyncio.ensure_future(runtime.reader.get([key(5)]))
    second = asyncio.ensure_future(runtime.reader.get([key(5)]))
    await asyncio.sleep(0)  # both are waiting on the one load now
    first.cancel()
    resolved = await second
    assert first.cancelled()
    assert resolved[0].entry.values is not None
    assert entity_reads(redis_url) == 1
    assert runtime.reader.cache.peek(key(5)) is not None  # type: ignore[union-attr]


async def test_a_cancelled_batch_leaves_the_loads_it_shares_to_their_other_callers(
    runtime: ServingRuntime, redis_url: str
) -> None:
    write_sample(redis_url, 40)
    reset_stats(redis_url)
    first = asyncio.ensure_future(runtime.reader.get([key(i) for i in range(40)]))
    await asyncio.sleep(0)  # its 40 loads are queued
    second = asyncio.ensure_future(runtime.reader.get([key(i) for i in range(10, 30)]))
    await asyncio.sleep(0)  # waiting on 20 of them
    first.cancel()
    resolved = await second
    assert first.cancelled()
    assert [r.entry.values[0] for r in resolved] == [  # type: ignore[index]
        sample.features(i)["float_00"] for i in range(10, 30)
    ]
    assert entity_reads(redis_url) == 40  # one read each, the cancelled caller's included
    cache = runtime.reader.cache
    assert cache is not None
    assert all(cache.peek(key(i)) is not None for i in range(40))


async def test_a_failed_load_nobody_waits_for_leaves_no_unretrieved_error(
    runtime: ServingRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """An early refresh's load is awaited by nobody: its failure is not logged by asyncio
    as "exception was never retrieved" (the loads have no done callback to consume it)."""
    flight = runtime.reader.flight
    assert flight is not None
    breaker = runtime.reader.breaker
    for _ in range(100):  # open the circuit: each load fails at once
        breaker.failure()
    assert not breaker.allow()
    load = flight.schedule(key(1), store=True)
    assert load.future.done()
    del load
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


@pytest.mark.parametrize("store", STORES)
async def test_missing_entities_are_cached_with_their_own_ttl(redis_url: str, store: str) -> None:
    settings = ServingSettings(
        invalidation=False, cache_negative_ttl=0.3, cache_ttl=60.0, cache_jitter=0.0
    )
    target = RedisTarget.parse(redis_url)
    rt = ServingRuntime(sample.registry(), target, settings, reference_l1=store == "reference")
    assert rt.reader.cache is not None
    try:
        reset_stats(redis_url)
        for _ in range(3):
            (r,) = await rt.reader.get([key(777)])
            assert r.entry.negative
        assert entity_reads(redis_url) == 1
        assert rt.reader.cache.stats.negative_hits == 2
        await asyncio.sleep(0.4)  # past the negative TTL, far from the positive one
        await rt.reader.get([key(777)])
        assert entity_reads(redis_url) == 2
    finally:
        await rt.stop()


async def test_invalidate_drops_the_entry_and_a_racing_read_cannot_refill_it(
    runtime: ServingRuntime, redis_url: str
) -> None:
    write_sample(redis_url, 10)
    reader = runtime.reader
    assert reader.cache is not None
    await reader.get([key(1)])
    assert reader.cache.peek(key(1)) is not None
    # a read in flight when a write invalidates the key must not store its older value
    reader.cache.discard(key(1))
    pending = asyncio.ensure_future(reader.get([key(1)]))
    await asyncio.sleep(0)
    reader.invalidate([key(1)])
    await pending
    assert reader.cache.peek(key(1)) is None


async def test_a_lookup_handed_on_after_a_load_takes_what_the_load_settled(
    runtime: ServingRuntime, redis_url: str
) -> None:
    """A front hands its handler a lookup whose load it cannot answer from (an entry not
    kept, a read that failed): inside ``settled``, the handler's read of those keys takes
    the load's entry, or raises its error, and asks Redis nothing; a fresh entry still
    wins, and outside the block the keys are read as usual."""
    write_sample(redis_url, 10)
    reader = runtime.reader
    cache = reader.cache
    assert cache is not None
    (loaded,) = await reader.get([key(1)])
    cache.discard(key(1))  # not kept, as with a negative TTL of 0
    await reader.get([key(3)])  # fresh
    failure = StoreTimeoutError("Redis did not answer in 0.1 s")
    reset_stats(redis_url)
    misses = cache.stats.misses
    with settled({key(1): loaded, key(2): failure, key(3): failure}):
        (again, fresh) = await reader.get([key(1), key(3)])
        assert again is loaded
        held = cache.peek(key(3))
        assert held is not None
        assert same_load(fresh.entry, held)
        assert not fresh.stale
        with pytest.raises(StoreTimeoutError) as raised:
            await reader.get([key(2)])
        assert raised.value is failure
    assert entity_reads(redis_url) == 0
    assert cache.stats.misses == misses  # the load that settled them counted them
    (r,) = await reader.get([key(2)])
    assert entity_reads(redis_url) == 1
    assert r.entry.values is not None
    assert r.entry.values[0] == sample.features(2)["float_00"]


async def test_bypass_reads_redis_and_sees_writes_made_elsewhere(
    runtime: ServingRuntime, redis_url: str
) -> None:
    write_sample(redis_url, 10)
    service = runtime.service
    before = await service.lookup(ENTITY, [2], ["int_0"])
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, [(2, {"int_0": 424242})])  # not through serving: no invalidation
    cached = await service.lookup(ENTITY, [2], ["int_0"])
    assert same_load(cached.entries[0][0].entry, before.entries[0][0].entry)  # cached
    fresh = await service.lookup(ENTITY, [2], ["int_0"], bypass=True)
    values = fresh.entries[0][0].entry.values
    assert values is not None
    assert values[sample.INTS.index("int_0") + len(sample.FLOATS)] == 424242


# --- through real servers ----------------------------------------------------------------


@pytest.fixture
def two_servers(redis_url: str) -> Iterator[tuple[ServingProcess, ServingProcess]]:
    with (
        ServingProcess(redis_url, args=["--cache-ttl", "600"], grpc=False) as a,
        ServingProcess(redis_url, args=["--cache-ttl", "600"], grpc=False) as b,
    ):
        yield a, b


async def test_stampede_on_a_cold_entity_reads_redis_once(redis_url: str) -> None:
    """1,000 concurrent calls on one HTTP/2 channel: they arrive together, as in a stampede."""
    write_sample(redis_url, 10)
    with ServingProcess(redis_url, env=NO_SHADOW) as server:
        reset_stats(redis_url)
        async with AsyncGrpcFeatureClient(server.grpc_target, timeout=60) as client:
            results = await asyncio.gather(
                *(client.get(ENTITY, [7], groups=[GROUP]) for _ in range(1000))
            )
        assert entity_reads(redis_url) == 1
        with FeatureClient(server.rest_url, timeout=5) as rest:
            again = rest.get(ENTITY, [7], groups=[GROUP]).rows[0]
        assert (again.values, again.statuses) == (
            results[0].rows[0].values,
            results[0].rows[0].statuses,
        )
        assert entity_reads(redis_url) == 1
    want = sample.features(7)["float_05"]
    assert all(r.as_dicts()[0]["float_05"] == want for r in results)


def test_push_write_invalidates_the_cache_of_every_instance(
    two_servers: tuple[ServingProcess, ServingProcess], redis_url: str
) -> None:
    a, b = two_servers
    write_sample(redis_url, 10)
    with FeatureClient(a.rest_url, timeout=5) as ca, FeatureClient(b.rest_url, timeout=5) as cb:
        old = sample.features(4)["int_0"]
        assert ca.get(ENTITY, [4], features=["int_0"]).rows[0].values == [old]
        assert cb.get(ENTITY, [4], features=["int_0"]).rows[0].values == [old]
        # a write that tells no one is not seen while cached: b really caches
        with FeatureStore.connect(redis_url, sample.registry(), notify=False) as store:
            store.write(GROUP, [(4, {"int_0": -1})])
        assert cb.get(ENTITY, [4], features=["int_0"]).rows[0].values == [old]
        ca.write(GROUP, [(4, {"int_0": 99})])
        assert ca.get(ENTITY, [4], features=["int_0"]).rows[0].values == [99]
        seen = None
        for _ in range(200):  # pub/sub delivery is asynchronous: poll, bounded
            seen = cb.get(ENTITY, [4], features=["int_0"]).rows[0].values
            if seen == [99]:
                break
            time.sleep(0.02)
        assert seen == [99]


async def test_rest_stampede_of_a_thousand_connections_reads_redis_once(redis_url: str) -> None:
    """1,000 keep-alive connections send the same request together (HTTP/1.1, no client lib)."""
    write_sample(redis_url, 10)
    body = b'{"entity_type": "consumer", "ids": [8], "groups": ["consumer_features"]}'
    request = (
        b"POST /v1/features/get HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    with ServingProcess(redis_url, grpc=False, env=NO_SHADOW) as server:
        conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(1000)]
        reset_stats(redis_url)

        async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            answer = await reader.readexactly(length)
            assert head.startswith(b"HTTP/1.1 200"), head
            return answer

        try:
            answers = await asyncio.gather(*(one(r, w) for r, w in conns))
        finally:
            for _, w in conns:
                w.close()
            await asyncio.gather(*(w.wait_closed() for _, w in conns), return_exceptions=True)
        assert entity_reads(redis_url) == 1
    # ages may tick over a second boundary between answers; values and statuses may not
    rows = [orjson.loads(a)["results"][0] for a in answers]
    assert {orjson.dumps([r["values"], r["statuses"]]) for r in rows} == {
        orjson.dumps([rows[0]["values"], rows[0]["statuses"]])
    }
    assert rows[0]["statuses"] == ["present"] * 50


def test_a_write_through_an_instance_without_cache_still_invalidates_the_others(
    redis_url: str,
) -> None:
    write_sample(redis_url, 10)
    with (
        ServingProcess(redis_url, args=["--no-cache"], grpc=False) as writer,
        ServingProcess(redis_url, args=["--cache-ttl", "600"], grpc=False) as reader,
        FeatureClient(writer.rest_url, timeout=5) as cw,
        FeatureClient(reader.rest_url, timeout=5) as cr,
    ):
        assert cr.get(ENTITY, [6], features=["int_0"]).rows[0].values == [
            sample.features(6)["int_0"]
        ]
        cw.write(GROUP, [(6, {"int_0": 4242})])
        seen = None
        for _ in range(200):  # pub/sub delivery is asynchronous: poll, bounded
            seen = cr.get(ENTITY, [6], features=["int_0"]).rows[0].values
            if seen == [4242]:
                break
            time.sleep(0.02)
        assert seen == [4242]
