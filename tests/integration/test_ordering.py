"""The event-time guard against real Redis (one node and a 3-master cluster): whatever order
writes arrive in, and however often, each entity ends with its newest event's values."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feature_store import sample
from feature_store.errors import StoreError
from feature_store.layout import entity_key, freshness_field
from feature_store.registry import Registry
from feature_store.store import AsyncFeatureStore, FeatureStore

GROUP = sample.GROUP


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def url(request: pytest.FixtureRequest) -> str:
    fixture = "redis_url" if request.param == "single" else "cluster_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def store(url: str, sample_registry: Registry) -> Iterator[FeatureStore]:
    with FeatureStore.connect(url, sample_registry, notify=False) as s:
        yield s


def _raw(url: str) -> redis.Redis | redis.RedisCluster:
    if "cluster" in url:
        return redis.RedisCluster.from_url(url.split("?")[0])
    return redis.Redis.from_url(url)


def _value(store: FeatureStore, entity_id: int) -> object:
    result = store.read(sample.ENTITY, [entity_id], features=["int_0"])
    return result.rows[0].values[0]


def _key(store: FeatureStore, entity_id: int) -> bytes:
    entity = store.registry.group(GROUP).entity
    return entity_key(entity.prefix, entity.id_type, entity_id)


def _stored_time(store: FeatureStore, url: str, entity_id: int) -> bytes | None:
    client = _raw(url)
    try:
        return client.hget(_key(store, entity_id), freshness_field(GROUP))  # type: ignore[return-value]
    finally:
        client.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    events=st.lists(
        st.tuples(
            st.integers(0, 3),  # entity
            st.integers(1_600_000_000_000, 1_600_000_000_020),  # event time, ms: many ties
            st.integers(0, 1000),  # the value
        ),
        min_size=1,
        max_size=30,
    ),
    chunk=st.integers(1, 7),
    base=st.integers(0, 10**9),
)
def test_newest_event_wins_in_any_order(
    store: FeatureStore, events: list[tuple[int, int, int]], chunk: int, base: int
) -> None:
    """Events sent in the order given (out of order, duplicated), in chunks of any size:
    each entity ends with the value of its newest event; of equal event times the one
    written last wins. Skipped rows are exactly those older than one already written."""
    ids = {e: base * 10 + e for e in range(4)}
    for entity_id in ids.values():  # examples may share ids: start from nothing
        store.client.delete(_key(store, entity_id))
    rows = [(ids[e], {"int_0": v}, t / 1000) for e, t, v in events]
    stats = store.write(GROUP, rows, chunk_size=chunk)

    newest: dict[int, tuple[int, int]] = {}
    skipped = 0
    for e, t, v in events:
        if e in newest and t < newest[e][0]:
            skipped += 1
        else:
            newest[e] = (t, v)
    assert stats.skipped == skipped
    assert stats.entities == len(events) - skipped
    for e, (_, v) in newest.items():
        assert _value(store, ids[e]) == v


def test_older_write_changes_nothing_and_is_counted(store: FeatureStore, url: str) -> None:
    first = store.write(GROUP, [(1, {"int_0": 5, "float_00": 2.5})], event_time=2000.5)
    assert (first.entities, first.skipped) == (1, 0)
    older = store.write(GROUP, [(1, {"int_0": 9, "float_00": None})], event_time=1999)
    assert (older.entities, older.values_written, older.values_removed, older.skipped) == (
        0,
        0,
        0,
        1,
    )
    result = store.read(sample.ENTITY, [1], features=["int_0", "float_00"])
    assert result.rows[0].values == [5, 2.5]  # the older removal did not land either
    assert _stored_time(store, url, 1) == b"2000.5"


def test_equal_event_time_writes_so_a_correction_lands(store: FeatureStore, url: str) -> None:
    store.write(GROUP, [(2, {"int_0": 5})], event_time=3000)
    again = store.write(GROUP, [(2, {"int_0": 6})], event_time=3000)
    assert (again.entities, again.skipped) == (1, 0)
    assert _value(store, 2) == 6
    newer = store.write(GROUP, [(2, {"int_0": 7})], event_time=3000.001)
    assert (newer.entities, _value(store, 2)) == (1, 7)
    assert _stored_time(store, url, 2) == b"3000.001"


def test_a_stored_time_that_is_not_a_number_counts_as_none(store: FeatureStore, url: str) -> None:
    key = _key(store, 3)
    client = _raw(url)
    try:
        client.hset(key, mapping={freshness_field(GROUP): b"garbage"})
        stats = store.write(GROUP, [(3, {"int_0": 1})], event_time=10)
        assert (stats.entities, stats.skipped) == (1, 0)
        assert client.hget(key, freshness_field(GROUP)) == b"10"
        assert client.ttl(key) > 0  # the write set the entity's expiry
    finally:
        client.close()


def test_a_key_of_another_type_fails_the_write_clearly(store: FeatureStore, url: str) -> None:
    key = _key(store, 4)
    client = _raw(url)
    try:
        client.set(key, b"not a hash")
        with pytest.raises(StoreError, match="WRONGTYPE"):
            store.write(GROUP, [(4, {"int_0": 1})])
        assert client.get(key) == b"not a hash"
    finally:
        client.delete(key)
        client.close()


def test_the_script_is_loaded_again_after_redis_forgets_it(
    store: FeatureStore, url: str, sample_registry: Registry
) -> None:
    """A restart or SCRIPT FLUSH empties Redis's script cache: every writer loads the
    script again and sends the refused commands once more (sync and asyncio)."""
    client = _raw(url)
    try:
        store.write(GROUP, [(5, {"int_0": 1})], event_time=100)
        client.script_flush()
        stats = store.write(GROUP, [(5, {"int_0": 2}), (6, {"int_0": 3})], event_time=101)
        assert (stats.entities, _value(store, 5), _value(store, 6)) == (2, 2, 3)

        async def run() -> tuple[int, int]:
            client.script_flush()
            async with AsyncFeatureStore.connect(url, sample_registry, notify=False) as s:
                stats = await s.write(GROUP, [(5, {"int_0": 4}), (6, {})], event_time=99)
            return stats.entities, stats.skipped

        assert asyncio.run(run()) == (0, 2)  # loaded again, then the guard said "older"
        assert _value(store, 5) == 2
    finally:
        client.close()


def test_racing_writers_never_regress_a_value(url: str, sample_registry: Registry) -> None:
    """Two writers (a "nightly job" of old snapshots and a "stream" of newer events) on the
    same entities at once, each in its own order: the newest event wins everywhere."""
    ids = list(range(100, 160))
    rng = random.Random(7)
    stream = [(i, {"int_0": t}, 5000 + t) for t in range(20) for i in ids]
    rng.shuffle(stream)
    nightly = [(i, {"int_0": -1}, 4999) for i in ids] * 3
    errors: list[BaseException] = []

    def run(rows: list[tuple[int, dict[str, object], int]]) -> None:
        try:
            with FeatureStore.connect(url, sample_registry, notify=False) as s:
                for start in range(0, len(rows), 37):
                    s.write(GROUP, rows[start : start + 37], chunk_size=13)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(rows,)) for rows in (stream, nightly)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    with FeatureStore.connect(url, sample_registry, notify=False) as s:
        result = s.read(sample.ENTITY, ids, features=["int_0"])
    assert [r.values[0] for r in result.rows] == [19] * len(ids)
