"""One entity whose stored data cannot be read fails only itself, on every read path.

Three kinds of broken entity are planted in a real Redis beside healthy ones: a group write
time that is not a unix time, a value that does not decode as its type, and a key that
holds a string instead of a hash. Every path answers the batch: the broken entity's values
get status ``error`` and the answer's ``errors`` names it and why, while every other entity
is answered exactly as the library reads it. Paths: REST and gRPC (the native front and
grpc.aio), the sync and asyncio clients, ``FeatureStore.read``, with the L1 on and off,
native and ``FEATURE_STORE_NATIVE=off``.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
import redis
from scrape import metric

from feature_store import sample
from feature_store.batch import ERROR, EntityError, FaultReason
from feature_store.client import (
    AsyncFeatureClient,
    AsyncGrpcFeatureClient,
    FeatureClient,
    FeatureResult,
    GrpcFeatureClient,
)
from feature_store.connection import RedisTarget
from feature_store.layout import entity_key
from feature_store.serving.config import ServingSettings
from feature_store.serving.process import ServingProcess
from feature_store.serving.runtime import ServingRuntime
from feature_store.store import AsyncFeatureStore, FeatureStore

ERRORS = "feature_serving_entity_errors_total"

GROUP, ENTITY = sample.GROUP, sample.ENTITY
REGISTRY = sample.registry()
FRESHNESS = REGISTRY.groups[GROUP].freshness_field
INT_0 = REGISTRY.groups[GROUP].feature("int_0")
BROKEN = {
    3: FaultReason.CORRUPT_WRITE_TIME,
    5: FaultReason.UNDECODABLE_VALUE,
    7: FaultReason.WRONG_TYPE,
}
MESSAGES = {3: "c:3: the write time of group", 5: "c:5 feature 'int_0'", 7: "WRONGTYPE"}
IDS = [1, 2, 3, 4, 5, 6, 7, 9]
PICKED = ["int_0", "float_00", "embedding_0"]


def key(i: int) -> bytes:
    return entity_key(REGISTRY.entities[ENTITY].prefix, REGISTRY.entities[ENTITY].id_type, i)


def plant(url: str) -> None:
    """Ten healthy entities, then three of them broken, each its own way."""
    with FeatureStore.connect(url, REGISTRY) as store:
        store.write(GROUP, sample.rows(10))
    with redis.Redis.from_url(url) as r:
        r.hset(key(3), FRESHNESS, b"garbage")
        r.hset(key(5), INT_0.field, b"x1")
        r.delete(key(7))
        r.set(key(7), b"not a hash")


def check(result: FeatureResult, reference: FeatureResult | None, features: list[str]) -> None:
    """Broken entities: every value None with status error, and named in ``errors``;
    the others: what the library reads (``reference``), value for value."""
    assert [r.id for r in result.rows] == IDS
    for row in result.rows:
        if row.id in BROKEN:
            assert row.statuses == [ERROR] * len(features), row.id
            assert row.values == [None] * len(features)
            assert row.ages.get(GROUP) is None  # gRPC leaves an unknown age out
    errors = sorted((e.entity_id, e.group, e.reason) for e in result.errors)
    assert errors == [(i, GROUP, reason) for i, reason in sorted(BROKEN.items())]
    for e in result.errors:
        assert MESSAGES[e.entity_id] in e.message, e  # type: ignore[index]
    if reference is not None:
        expected = {r.id: r for r in reference.rows}
        for row in result.rows:
            if row.id not in BROKEN:
                assert (row.values, row.statuses) == (
                    expected[row.id].values,
                    expected[row.id].statuses,
                )
                assert 0 <= row.ages[GROUP] <= 60  # type: ignore[operator]  # written just now


def library(url: str, features: list[str]) -> FeatureResult:
    """The library's read of IDS as a FeatureResult, for comparison with the servers'."""
    with FeatureStore.connect(url, REGISTRY) as store:
        result = store.read(ENTITY, IDS, features)
    from feature_store.client import FeatureRow

    return FeatureResult(
        result.entity_type,
        tuple(f.name for f in result.features),
        [FeatureRow(r.entity_id, r.values, r.statuses, r.ages) for r in result.rows],
        result.errors,
    )


SERVERS = {
    "native, L1 on": {},
    "native, L1 off": {"FEATURE_SERVING_CACHE": "off"},
    "reference, L1 on": {"FEATURE_STORE_NATIVE": "off"},
    "reference, L1 off": {"FEATURE_STORE_NATIVE": "off", "FEATURE_SERVING_CACHE": "off"},
    "grpc.aio front, L1 on": {"FEATURE_SERVING_GRPC_FRONT": "grpcio"},
}


@pytest.mark.parametrize("env", SERVERS.values(), ids=SERVERS.keys())
def test_a_broken_entity_fails_only_itself_on_every_path(
    redis_url: str, env: dict[str, str]
) -> None:
    plant(redis_url)
    everything = [f.name for f in REGISTRY.groups[GROUP].features]
    whole, picked = library(redis_url, everything), library(redis_url, PICKED)
    check(whole, None, everything)  # the library itself isolates them
    with (
        ServingProcess(redis_url, env=env) as server,
        FeatureClient(server.rest_url, timeout=5) as rest,
        GrpcFeatureClient(server.grpc_target, timeout=5) as grpc_client,
    ):
        for _ in range(2):  # the second time from the L1 where it is on
            check(rest.get(ENTITY, IDS, groups=[GROUP]), whole, everything)
            check(grpc_client.get(ENTITY, IDS, groups=[GROUP]), whole, everything)
            check(rest.get(ENTITY, IDS, PICKED), picked, PICKED)
            check(grpc_client.get(ENTITY, IDS, PICKED), picked, PICKED)

        async def asynchronous() -> tuple[FeatureResult, FeatureResult]:
            async with (
                AsyncFeatureClient(server.rest_url, timeout=5) as a_rest,
                AsyncGrpcFeatureClient(server.grpc_target, timeout=5) as a_grpc,
            ):
                return await asyncio.gather(
                    a_rest.get(ENTITY, IDS, groups=[GROUP]), a_grpc.get(ENTITY, IDS, PICKED)
                )

        by_rest, by_grpc = asyncio.run(asynchronous())
        check(by_rest, whole, everything)
        check(by_grpc, picked, PICKED)

        # the raw answer: 200, an "errors" list; none when no broken entity is asked for
        raw = httpx.post(
            f"{server.rest_url}/v1/features/get",
            json={"entity_type": ENTITY, "ids": [1, 7], "features": ["int_0"]},
        )
        assert raw.status_code == 200
        doc = raw.json()
        assert doc["results"][1]["statuses"] == ["error"]
        assert doc["errors"] == [
            {
                "id": 7,
                "group": GROUP,
                "reason": "wrong_type",
                "message": doc["errors"][0]["message"],
            }
        ]
        clean = httpx.post(
            f"{server.rest_url}/v1/features/get", json={"entity_type": ENTITY, "ids": [1, 2]}
        ).json()
        assert "errors" not in clean

        text = httpx.get(f"{server.rest_url}/metrics").text
        for reason in ("corrupt_write_time", "undecodable_value"):
            assert metric(text, f'{ERRORS}{{api="rest",reason="{reason}"}}') == 5
            assert metric(text, f'{ERRORS}{{api="grpc",reason="{reason}"}}') == 5
        assert metric(text, f'{ERRORS}{{api="rest",reason="wrong_type"}}') == 6

        # a push write mends entity 5: served at once (its cached fault entry is dropped)
        rest.write(GROUP, [(5, {"int_0": 55})])
        mended = rest.get(ENTITY, [5], ["int_0"])
        assert (mended.rows[0].values, mended.errors) == ([55], [])


async def test_a_coalesced_load_serves_the_neighbours_of_a_broken_entity(redis_url: str) -> None:
    """Concurrent requests whose misses share one round trip: the broken entity's waiters
    get its fault, every other waiter its values; the fault is cached like a missing
    entity (negative TTL), never as values."""
    plant(redis_url)
    settings = ServingSettings(invalidation=False, cache_negative_ttl=0.5)
    runtime = ServingRuntime(REGISTRY, RedisTarget.parse(redis_url), settings)
    await runtime.start()
    try:
        reader = runtime.reader
        assert reader.cache is not None
        round_trips = reader.cache.stats.round_trips
        keys = [[(GROUP, key(i))] for i in IDS]
        answers = await asyncio.gather(*(reader.get(k) for k in keys))
        assert reader.cache.stats.round_trips == round_trips + 1  # one coalesced read
        for i, (resolved,) in zip(IDS, answers, strict=True):
            entry = resolved.entry
            if i in BROKEN:
                assert entry.fault is not None
                assert entry.fault.reason is BROKEN[i]
                assert entry.raw is None
                assert entry.values is None
            else:
                assert entry.fault is None
                assert entry.values is not None
                assert (
                    entry.values[REGISTRY.groups[GROUP].features.index(INT_0)]
                    == sample.features(i)["int_0"]
                )
        cached = reader.cache.peek((GROUP, key(5)))
        assert cached is not None
        assert cached.fault is not None
        assert cached.expires_at - cached.loaded_at <= 0.5 * 1.5  # the negative TTL
        assert reader.cache.stats.error_hits == 0
        await reader.get([(GROUP, key(3))])  # a cached fault: a hit, counted apart
        assert reader.cache.stats.error_hits == 1
        with redis.Redis.from_url(redis_url) as r:  # mended behind the cache's back
            r.hset(key(5), INT_0.field, b"55")
        await asyncio.sleep(0.8)  # past the negative TTL: read again, now good
        (fixed,) = await reader.get([(GROUP, key(5))])
        assert fixed.entry.fault is None
        assert fixed.entry.values is not None
    finally:
        await runtime.stop()


async def test_the_async_library_read_isolates_a_broken_entity(redis_url: str) -> None:
    plant(redis_url)
    async with AsyncFeatureStore.connect(redis_url, REGISTRY) as store:
        result = await store.read(ENTITY, IDS, ["int_0"])
    by_id = {r.entity_id: r for r in result.rows}
    assert [by_id[i].statuses for i in BROKEN] == [[ERROR]] * 3
    assert by_id[1].values == [sample.features(1)["int_0"]]
    assert {(e.entity_id, e.reason) for e in result.errors} == set(BROKEN.items())
    assert all(isinstance(e, EntityError) for e in result.errors)


def test_the_cli_prints_the_batch_and_names_the_broken_entity(
    redis_url: str, registry_file: object
) -> None:
    import subprocess
    import sys

    plant(redis_url)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "feature_store.cli",
            "get",
            "--redis-url",
            redis_url,
            "--registry",
            str(registry_file),
            "--json",
            ENTITY,
            "1",
            "7",
            "--groups",
            GROUP,
        ],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [line["id"] for line in lines] == [1, 7]
    assert set(lines[1]["statuses"].values()) == {"error"}
    assert b"error: entity 7 group consumer_features" in done.stderr
