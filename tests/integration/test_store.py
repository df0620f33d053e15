"""The store client against real Redis: one node and a 3-master cluster, sync and asyncio."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from feature_store import sample
from feature_store.batch import MISSING, PRESENT, STALE
from feature_store.errors import RequestError
from feature_store.layout import entity_key, freshness_field
from feature_store.registry import Registry
from feature_store.serialization.codecs import to_float32
from feature_store.store import AsyncFeatureStore, FeatureStore

IDS = list(range(40))


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def url(request: pytest.FixtureRequest) -> str:
    fixture = "redis_url" if request.param == "single" else "cluster_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def store(url: str, sample_registry: Registry) -> Iterator[FeatureStore]:
    with FeatureStore.connect(url, sample_registry) as s:
        yield s


def expected(entity_id: int) -> dict[str, object]:
    """What a read returns for a sample entity: floats come back at float32 precision."""
    out: dict[str, object] = {}
    for name, value in sample.features(entity_id).items():
        if isinstance(value, float):
            out[name] = to_float32(value)
        elif name.startswith("embedding"):
            out[name] = [to_float32(x) for x in value]  # type: ignore[attr-defined]
        else:
            out[name] = value
    return out


def as_float32(d: dict[str, object]) -> dict[str, object]:
    return {k: to_float32(v) if isinstance(v, float) else v for k, v in d.items()}


def test_sample_data_round_trips_exactly(store: FeatureStore) -> None:
    stats = store.write(sample.GROUP, sample.rows(len(IDS)), chunk_size=7)
    assert (stats.entities, stats.values_written, stats.values_removed) == (40, 2000, 0)
    result = store.read(sample.ENTITY, IDS, groups=[sample.GROUP])
    assert [r.entity_id for r in result.rows] == IDS
    for entity_id, got in zip(IDS, result.as_dicts(), strict=True):
        assert as_float32(got) == expected(entity_id)
    assert all(s is PRESENT for r in result.rows for s in r.statuses)


async def test_async_client_reads_what_sync_wrote(url: str, sample_registry: Registry) -> None:
    with FeatureStore.connect(url, sample_registry) as sync:
        sync.write(sample.GROUP, sample.rows(10))
        expected_rows = sync.read(sample.ENTITY, list(range(12)), ["float_03", "int_list_1"]).rows
    async with AsyncFeatureStore.connect(url, sample_registry) as store:
        result = await store.read(sample.ENTITY, list(range(12)), ["float_03", "int_list_1"])
        await store.write(sample.GROUP, [(11, {"float_03": 1.5})])
        again = await store.read(sample.ENTITY, [11], ["float_03"])
    # the same values and statuses; ages are whole seconds, and one may turn between reads
    assert [(r.entity_id, r.values, r.statuses) for r in result.rows] == [
        (r.entity_id, r.values, r.statuses) for r in expected_rows
    ]
    for got, want in zip(result.rows, expected_rows, strict=True):
        assert got.ages.keys() == want.ages.keys()
        for group, age in got.ages.items():  # None: nothing stored
            before = want.ages[group]
            assert (age is None) == (before is None), (got, want)
            assert age is None or before is None or 0 <= age - before <= 1, (got, want)
    assert result.rows[11].statuses == [MISSING, MISSING]
    assert again.rows[0].values == [1.5]


@pytest.mark.parametrize(
    ("features", "command"),
    [(["int_0", "float_01"], "hmget"), (sample.FLOATS, "hgetall")],
)
def test_a_batch_is_one_command_per_entity(
    redis_url: str, sample_registry: Registry, features: list[str], command: str
) -> None:
    """No extra commands per batch; counted by the server, not by the code under test."""
    admin = redis.Redis.from_url(redis_url)
    with FeatureStore.connect(redis_url, sample_registry) as store:
        store.write(sample.GROUP, sample.rows(100))
        admin.config_resetstat()
        result = store.read(sample.ENTITY, list(range(100)), features)
    stats = admin.info("commandstats")
    ours = {k for k in stats if not k.startswith(("cmdstat_config", "cmdstat_info"))}
    assert ours == {f"cmdstat_{command}"}
    assert stats[f"cmdstat_{command}"]["calls"] == 100
    assert list(result.as_dicts()[7]) == features  # only what was asked, in that order
    assert as_float32(result.as_dicts()[7]) == {k: expected(7)[k] for k in features}


def test_null_removes_the_field_and_omitted_is_untouched(store: FeatureStore) -> None:
    store.write(sample.GROUP, [(1, {"float_00": 1.0, "int_0": 5, "int_list_0": [1, 2]})])
    stats = store.write(sample.GROUP, [(1, {"float_00": None, "int_0": 6})])
    assert (stats.values_written, stats.values_removed) == (1, 1)
    row = store.read(sample.ENTITY, [1], ["float_00", "int_0", "int_list_0"]).rows[0]
    assert row.values == [None, 6, [1, 2]]
    assert row.statuses == [MISSING, PRESENT, PRESENT]


def test_every_write_sets_the_entity_ttl(redis_url: str, sample_registry: Registry) -> None:
    admin = redis.Redis.from_url(redis_url)
    with FeatureStore.connect(redis_url, sample_registry) as store:
        store.write(sample.GROUP, [(5, {"int_0": 1})])
        admin.persist(b"c:5")
        store.write(sample.GROUP, [(5, {"int_1": 2})])
    ttl = sample_registry.entity(sample.ENTITY).ttl_seconds
    assert ttl - 5 <= admin.ttl(b"c:5") <= ttl


def test_stale_against_max_age(store: FeatureStore, sample_registry: Registry) -> None:
    max_age = sample_registry.group(sample.GROUP).max_age_seconds
    assert max_age is not None
    store.write(sample.GROUP, [(1, {"int_0": 1})], event_time=time.time() - max_age - 60)
    store.write(sample.GROUP, [(2, {"int_0": 2})])
    rows = store.read(sample.ENTITY, [1, 2], ["int_0", "int_1"]).rows
    assert rows[0].statuses == [STALE, MISSING]
    assert rows[0].ages[sample.GROUP] >= max_age + 60  # type: ignore[operator]
    assert rows[1].statuses == [PRESENT, MISSING]


def test_entity_hash_uses_the_layout(redis_url: str, sample_registry: Registry) -> None:
    """The bytes in Redis are the layout's: 4-byte fields, codec values, a freshness field."""
    admin = redis.Redis.from_url(redis_url)
    with FeatureStore.connect(redis_url, sample_registry) as store:
        store.write(sample.GROUP, [(9, {"float_00": 0.0, "float_01": 0.25})], event_time=1234)
    group = sample_registry.group(sample.GROUP)
    key = entity_key("c", sample_registry.entity("consumer").id_type, 9)
    assert admin.hgetall(key) == {
        group.feature("float_00").field: b"0",
        group.feature("float_01").field: b"0.25",
        freshness_field(sample.GROUP): b"1234",
    }
    assert admin.object("encoding", key) == b"listpack"


def test_full_sample_entity_stays_listpack(redis_url: str, sample_registry: Registry) -> None:
    admin = redis.Redis.from_url(redis_url)
    with FeatureStore.connect(redis_url, sample_registry) as store:
        store.write(sample.GROUP, sample.rows(3))
    assert {admin.object("encoding", f"c:{i}") for i in range(3)} == {b"listpack"}


def test_bad_requests_are_request_errors(store: FeatureStore) -> None:
    with pytest.raises(RequestError, match="no feature 'nope'"):
        store.read(sample.ENTITY, [1], ["nope"])
    with pytest.raises(RequestError, match="not an int64"):
        store.read(sample.ENTITY, ["1"], ["int_0"])
    with pytest.raises(RequestError, match="no entity ids"):
        store.read(sample.ENTITY, [], ["int_0"])


def test_check_server_warns_about_a_low_listpack_limit(
    redis_url: str, sample_registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(redis_url)
    old = admin.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
    try:
        admin.config_set("hash-max-listpack-value", 64)
        with FeatureStore.connect(redis_url, sample_registry) as store:
            store.check_server()
        assert "hash-max-listpack-value is 64 but this registry's values need 131" in caplog.text
    finally:
        admin.config_set("hash-max-listpack-value", old)
