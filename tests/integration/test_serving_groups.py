"""Requests across several feature groups of one entity type, and XFetch early refresh."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import orjson
import pytest
import redis

from feature_store.connection import RedisTarget
from feature_store.registry import Registry, parse_registry
from feature_store.serving.api.rest_api import _picked_rows
from feature_store.serving.config import ServingSettings
from feature_store.serving.runtime import ServingRuntime
from feature_store.serving.service import Lookup
from feature_store.store import FeatureStore

REGISTRY_TEXT = """
version: 1
entities:
  shop:
    prefix: s
    id_type: string
    ttl: 7d
feature_groups:
  daily:
    entity: shop
    max_age: 1d
    features:
      orders: int
      rating: float
      tags: int_list
  realtime:
    entity: shop
    max_age: 10m
    features:
      open: bool
      queue: int
      name: string
"""


@pytest.fixture
def registry() -> Registry:
    return parse_registry(REGISTRY_TEXT)


@pytest.fixture
async def runtime(redis_url: str, registry: Registry) -> AsyncIterator[ServingRuntime]:
    # no background reads (shadow checks, XFetch): tests here count the reads Redis serves
    settings = ServingSettings(invalidation=False, shadow_fraction=0.0, xfetch_beta=0.0)
    rt = ServingRuntime(registry, RedisTarget.parse(redis_url), settings)
    await rt.start()
    yield rt
    await rt.stop()


def entity_reads(url: str) -> int:
    """Entity reads (HMGET or HGETALL) the Redis server has executed since its stats reset."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


def answer_rows(lookup: Lookup) -> list[tuple[list[object], list[str], dict[str, int | None]]]:
    """(values, statuses, ages) of each row as the REST answer writes them."""
    rows = [orjson.loads(r) for r in _picked_rows(lookup)]
    return [(r["values"], r["statuses"], r["ages"]) for r in rows]


async def test_features_of_two_groups_one_read_per_entity_and_per_group_staleness(
    runtime: ServingRuntime, redis_url: str, registry: Registry
) -> None:
    now = time.time()
    with FeatureStore.connect(redis_url, registry) as store:
        store.write("daily", [("a", {"orders": 5, "rating": 4.5, "tags": [1, 2]})], event_time=now)
        # written 20 minutes ago: past realtime's max_age of 10 minutes
        store.write("realtime", [("a", {"open": True, "queue": 3})], event_time=now - 1200)
        store.write("realtime", [("b", {"open": False, "name": "bee"})], event_time=now)
        store.client.config_resetstat()
    lookup = await runtime.service.lookup(
        "shop", ["a", "b", "c"], ["queue", "daily:rating", "name", "tags", "open"]
    )
    assert entity_reads(redis_url) == 3  # one read per entity covers both groups
    proj = lookup.projection
    assert proj.names == ("queue", "rating", "name", "tags", "open")
    rows = answer_rows(lookup)
    values_a, statuses_a, ages_a = rows[0]
    assert values_a == [3, 4.5, None, [1, 2], True]
    assert statuses_a == ["stale", "present", "missing", "present", "stale"]
    assert ages_a["realtime"] is not None
    assert ages_a["realtime"] >= 1200
    assert ages_a["daily"] is not None
    assert ages_a["daily"] < 60
    values_b, statuses_b, ages_b = rows[1]
    assert values_b == [None, None, "bee", None, False]
    assert statuses_b == ["missing", "missing", "present", "missing", "present"]
    assert ages_b["daily"] is None
    assert rows[2][1] == ["missing"] * 5
    # all cached now, for both groups
    await runtime.service.lookup("shop", ["a", "b", "c"], ["queue", "rating"])
    assert entity_reads(redis_url) == 3


@pytest.mark.parametrize(
    "options",
    [{"cache": False}, {"cache": False, "single_flight": False}, {"single_flight": False}],
    ids=["L1 off", "L1 off, no debouncer", "no debouncer"],
)
async def test_one_read_per_entity_covers_its_groups_on_every_path(
    redis_url: str, registry: Registry, options: dict[str, bool]
) -> None:
    """Without the L1 (its flushes), or without the debouncer (each lookup's own round
    trip), one command per entity reads both of its groups, as with both on; an entity
    named twice is read once, and every row has its values."""
    settings = ServingSettings(invalidation=False, warm_start_keys=0, **options)
    rt = ServingRuntime(registry, RedisTarget.parse(redis_url), settings)
    with FeatureStore.connect(redis_url, registry) as store:
        store.write("daily", [("a", {"orders": 5, "rating": 4.5})])
        store.write("realtime", [("a", {"queue": 3}), ("b", {"name": "bee"})])
        store.client.config_resetstat()
    try:
        ids = ["a", "b", "a", "c"]
        lookup = await rt.service.lookup("shop", ids, ["queue", "daily:orders", "name"])
        assert entity_reads(redis_url) == 3  # a, b and c: each once, both groups
        got = [values for values, _, _ in answer_rows(lookup)]
        assert got == [[3, 5, None], [None, None, "bee"], [3, 5, None], [None, None, None]]
    finally:
        await rt.stop()


def calls(url: str, command: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_read_of_most_of_the_hash_is_an_hgetall(
    runtime: ServingRuntime, redis_url: str, registry: Registry
) -> None:
    """The shop hash holds 8 fields (6 features, 2 freshness). One group is 4 of them: HMGET;
    both groups are all 8: HGETALL. Counted by the server; values the same either way."""
    with FeatureStore.connect(redis_url, registry) as store:
        store.write("daily", [("a", {"orders": 5, "rating": 4.5, "tags": [1, 2]})])
        store.write("realtime", [("a", {"open": True, "queue": 3, "name": "ay"})])
        store.client.config_resetstat()
    one = await runtime.service.lookup("shop", ["a"], ["orders", "tags"])
    assert (calls(redis_url, "hmget"), calls(redis_url, "hgetall")) == (1, 0)
    both = await runtime.service.lookup("shop", ["a"], ["queue", "name"], ["daily"])
    # daily is cached now, so only realtime is read: 4 of 8 fields, still an HMGET
    assert (calls(redis_url, "hmget"), calls(redis_url, "hgetall")) == (2, 0)
    fresh = await runtime.service.lookup("shop", ["a"], ["queue", "orders"], bypass=True)
    assert calls(redis_url, "hgetall") == 1
    assert answer_rows(one)[0][0] == [5, [1, 2]]
    assert answer_rows(both)[0][0] == [5, 4.5, [1, 2], 3, "ay"]
    assert answer_rows(fresh)[0][0] == [3, 5]


class _LowDraw(random.Random):
    def random(self) -> float:
        return 1e-12  # -ln(u) = 27.6: any measured load cost makes the refresh due


async def test_xfetch_refreshes_a_hot_entry_before_it_expires(
    redis_url: str, registry: Registry
) -> None:
    settings = ServingSettings(
        invalidation=False, xfetch_beta=1e6, cache_jitter=0.0, shadow_fraction=0.0
    )
    rt = ServingRuntime(registry, RedisTarget.parse(redis_url), settings)
    # XFetch draws u in (0, 1) and refreshes when cost x beta x -ln(u) covers the time left.
    # Pin the draw low: with beta alone the refresh is only likely (a fast load, ~0.3 ms,
    # leaves a one-in-ten chance of no refresh at a 30 s TTL).
    rt.reader.rng = _LowDraw()
    try:
        with FeatureStore.connect(redis_url, registry) as store:
            store.write("daily", [("x", {"orders": 1})])
        first = await rt.service.lookup("shop", ["x"], ["orders"])
        entry = first.entries[0][0].entry
        with FeatureStore.connect(redis_url, registry) as store:
            store.write("daily", [("x", {"orders": 2})])
        # the refresh is due; the caller still gets the cached entry
        hit = (await rt.service.lookup("shop", ["x"], ["orders"])).entries[0][0].entry
        assert (hit.raw, hit.values) == (entry.raw, entry.values)
        cache = rt.reader.cache
        assert cache is not None
        assert cache.stats.early_refreshes == 1
        for _ in range(200):  # the refresh runs in the background: bounded wait
            refreshed = cache.peek(("daily", b"s:x"))
            if refreshed is not None and refreshed.loaded_at > entry.loaded_at + 1e-3:
                break
            await asyncio.sleep(0.01)
        assert refreshed is not None
        assert refreshed.values is not None
        assert refreshed.values[0] == 2
    finally:
        await rt.stop()


async def test_hot_entries_are_refreshed_ahead_in_batches_and_never_miss(
    redis_url: str, registry: Registry
) -> None:
    """Over four TTLs of steady reads, with expiries scattered by jitter: every entry is
    reloaded before it expires (no miss after the first read), in few round trips. The
    refresh window (at least 0.75 s: half of the shortest jittered TTL) is wide enough that
    a loaded machine's stalls between two reads do not outlast it."""
    settings = ServingSettings(
        invalidation=False,
        shadow_fraction=0.0,
        xfetch_beta=0.0,
        cache_ttl=2.0,
        cache_jitter=0.5,
        cache_refresh_ahead=0.5,
    )
    rt = ServingRuntime(registry, RedisTarget.parse(redis_url), settings)
    ids = [f"r{i}" for i in range(300)]
    try:
        with FeatureStore.connect(redis_url, registry) as store:
            store.write("daily", [(i, {"orders": 1}) for i in ids])
        cache = rt.reader.cache
        assert cache is not None
        await rt.service.lookup("shop", ids, groups=["daily"])
        assert cache.stats.misses == 300
        loads_before = cache.stats.keys_loaded
        deadline = time.monotonic() + 8.0  # four TTLs
        reads = 0
        gap = 0.0  # the longest time between two reads
        last = time.monotonic()
        while time.monotonic() < deadline:
            await rt.service.lookup("shop", ids, groups=["daily"])
            reads += 1
            gap, last = max(gap, time.monotonic() - last), time.monotonic()
            await asyncio.sleep(0.05)
        stats = cache.stats
        assert reads > 50
        assert stats.misses == 300, f"an entry expired under steady reads (gap {gap:.2f} s)"
        refreshed = stats.keys_loaded - loads_before
        assert refreshed >= 300 * 3  # each entry reloaded about once per TTL
        # one round trip per refresh tick at most, not one per entry
        assert stats.round_trips - 1 <= refreshed / 10
    finally:
        await rt.stop()


async def test_without_the_l1_concurrent_requests_share_round_trips_not_reads(
    redis_url: str, registry: Registry
) -> None:
    """With the L1 off, the reads of the requests of one loop tick go to Redis together (a
    few round trips for many requests), and a request never waits for a read that was
    sent before it arrived."""
    settings = ServingSettings(invalidation=False, cache=False, warm_start_keys=0)
    rt = ServingRuntime(registry, RedisTarget.parse(redis_url), settings)
    ids = [f"c{i}" for i in range(40)]
    with FeatureStore.connect(redis_url, registry) as store:
        store.write("daily", [(i, {"orders": n}) for n, i in enumerate(ids)])
    sent: list[int] = []
    hold, held, release = False, asyncio.Event(), asyncio.Event()
    round_trip = rt.reader.round_trip

    async def counted(reads, answer_within):  # type: ignore[no-untyped-def]
        sent.append(len(reads))
        if hold:  # this round trip waits before it is sent, until released
            held.set()
            await release.wait()
        return await round_trip(reads, answer_within)

    rt.reader.round_trip = counted  # StoreReads sends through it
    try:
        # 100 requests of 10 ids at once, some ids twice in a request: one flush
        batches = [[ids[(r + k * 3) % 40] for k in range(10)] + [ids[r % 40]] for r in range(100)]
        answers = await asyncio.gather(*(rt.service.lookup("shop", b, ["orders"]) for b in batches))
        for batch, lookup in zip(batches, answers, strict=True):
            values = [row[0].entry.values for row in lookup.entries]
            assert [v[0] if v else None for v in values] == [int(i[1:]) for i in batch]
        assert len(sent) <= 3, sent  # not 100
        # a read in flight (held before it is sent) is not shared with a later request
        hold = True
        first = asyncio.ensure_future(rt.service.lookup("shop", ids[:2], ["orders"]))
        await asyncio.wait_for(held.wait(), 10)
        hold = False
        with FeatureStore.connect(redis_url, registry) as store:
            store.write("daily", [(ids[0], {"orders": 777})])
        later = await asyncio.wait_for(rt.service.lookup("shop", ids[:1], ["orders"]), 10)
        assert later.entries[0][0].entry.values[0] == 777
        assert not first.done()
        release.set()
        await asyncio.wait_for(first, 10)
    finally:
        release.set()
        await rt.stop()


@pytest.mark.parametrize("cache", [True, False])
async def test_an_entity_named_twice_gets_its_own_values_every_time(
    redis_url: str, registry: Registry, cache: bool
) -> None:
    """One read per key per flush: a request naming an entity twice (cache bypassed, or no
    cache), beside a cached request for it, gets that entity's values in every row."""
    settings = ServingSettings(invalidation=False, cache=cache, warm_start_keys=0)
    rt = ServingRuntime(registry, RedisTarget.parse(redis_url), settings)
    with FeatureStore.connect(redis_url, registry) as store:
        store.write("daily", [("d1", {"orders": 1, "rating": 1.5}), ("d2", {"orders": 2})])
    try:
        ids = ["d1", "d2", "d1", "d1", "nobody", "d2"]
        bypass, plain = await asyncio.gather(
            rt.service.lookup("shop", ids, ["orders", "rating"], bypass=True),
            rt.service.lookup("shop", ids[:2], ["orders", "rating"]),
        )
        for lookup in (bypass, plain):
            got = [values for values, _, _ in answer_rows(lookup)]
            want = {"d1": [1, 1.5], "d2": [2, None], "nobody": [None, None]}
            assert got == [want[i] for i in lookup.ids]
    finally:
        await rt.stop()
