"""Window aggregations served: tiles written to a real Redis, answered over REST, gRPC and
Feast's API, with the L1 on and off, and by the library, equal to the reference at the
time of the read; a window slides with the clock through the L1; plain writes of an
aggregated group are refused."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from feature_store.client import FeatureClient, GrpcFeatureClient, ServingRequestError
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.records import EntityEvents
from feature_store.ingest.spec import RetrySpec
from feature_store.ingest.windows import write_events
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import entity_key
from feature_store.registry import FeatureGroup, Function, Registry, load_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore
from feature_store.windows import Event, reference_answer

REGISTRY = """
entities:
  consumer: {prefix: c, id_type: int, ttl: 30d}
feature_groups:
  consumer_profile:
    entity: consumer
    features: {tier: int}
  consumer_activity:
    entity: consumer
    aggregations:
      tile: 1m
      allowed_lateness: 10m
      features:
        orders_1h:      {function: count, window: 1h}
        spend_1h:       {function: sum,  of: order_total, window: 1h}
        basket_mean_1d: {function: mean, of: basket_size, window: 1d}
        max_spend_1d:   {function: max,  of: order_total, window: 1d}
        min_spend_1d:   {function: min,  of: order_total, window: 1d}
        last_stores_7d: {function: last_n, n: 5, of: store_id, window: 7d}
  consumer_clicks:
    entity: consumer
    aggregations:
      tile: 1s
      features:
        clicks_2s: {function: count, window: 2s}
"""
GROUP = "consumer_activity"
FEATURES = [
    "orders_1h",
    "spend_1h",
    "basket_mean_1d",
    "max_spend_1d",
    "min_spend_1d",
    "last_stores_7d",
]
IDS = list(range(1, 41))
# Feast's statuses: a value of a present entity that has none is NULL_VALUE
_FEAST_STATUS = {"PRESENT": "present", "NOT_FOUND": "missing", "NULL_VALUE": "missing"}


@pytest.fixture
def registry_path(tmp_path: Path) -> Path:
    path = tmp_path / "features.yaml"
    path.write_text(REGISTRY)
    return path


def _history(now: float, rng: random.Random) -> dict[int, list[Event]]:
    """Each entity's events over the last 8 days (entity 40 has none), out of order."""
    out: dict[int, list[Event]] = {}
    for entity in IDS[:-1]:
        events = []
        for n in range(rng.randint(0, 30)):
            back = rng.choice([rng.uniform(0, 3600), rng.uniform(0, 8 * 86400)])
            values: dict[str, float | int] = {"store_id": rng.randint(1, 9)}
            if rng.random() < 0.8:
                values["order_total"] = round(rng.uniform(1, 200), 2)
            if rng.random() < 0.8:
                values["basket_size"] = float(rng.randint(1, 12))
            events.append(Event(math.floor((now - back) * 1000), values, "0", n))
        out[entity] = events
    return out


def _write(redis_url: str, group: FeatureGroup, history: dict[int, list[Event]]) -> None:
    entity = group.entity
    events: EntityEvents = {
        entity_key(entity.prefix, entity.id_type, i): list(enumerate(evs))
        for i, evs in history.items()
    }
    writer = ChunkWriter(
        RedisTarget.parse(redis_url),
        ttl_seconds=entity.ttl_seconds,
        chunk_size=16,
        retry=RetrySpec(),
    )
    try:
        written = write_events(writer, group, events)
    finally:
        writer.close()
    assert written.entities == len(history)


def _close(got: object, want: object, function: Function) -> bool:
    if function in (Function.SUM, Function.MEAN) and got is not None and want is not None:
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)  # type: ignore[arg-type]
    return got == want


def _check_at_read_time(
    group: FeatureGroup,
    history: dict[int, list[Event]],
    read: Callable[[], list[tuple[list[object], list[str]]]],
) -> None:
    """``read()`` (values and statuses per id of IDS) equals the reference at the time
    of the read; a read that spans a tile boundary is made again."""
    assert group.aggregation is not None
    for _ in range(3):
        before = time.time()
        rows = read()
        after = time.time()
        want = [
            (
                reference_answer(group.aggregation, history.get(i, []), before),
                reference_answer(group.aggregation, history.get(i, []), after),
            )
            for i in IDS
        ]
        if all(a == b for a, b in want):
            break
    else:
        pytest.fail("three reads in a row spanned a tile boundary")
    functions = [a.function for a in group.aggregation.aggregates]
    for i, (values, statuses), (expected, _) in zip(IDS, rows, want, strict=True):
        if i not in history:  # nothing stored: the entity is missing, as in a plain group
            assert statuses == ["missing"] * len(FEATURES), (i, statuses)
            continue
        for got, exp, status, function in zip(values, expected, statuses, functions, strict=True):
            assert _close(got, exp, function), (i, function, got, exp)
            assert status == ("missing" if exp is None else "present"), (i, function, status)


@pytest.fixture
def stored(redis_url: str, registry_path: Path) -> tuple[Registry, dict[int, list[Event]]]:
    registry = load_registry(registry_path)
    history = _history(time.time(), random.Random(7))
    _write(redis_url, registry.group(GROUP), history)
    with FeatureStore.connect(redis_url, registry) as store:
        store.write("consumer_profile", [(i, {"tier": i % 3}) for i in IDS])
    return registry, history


@pytest.mark.parametrize("args", [[], ["--no-cache"]], ids=["l1", "no-l1"])
def test_rest_grpc_feast_and_the_library_answer_as_the_reference(
    redis_url: str,
    registry_path: Path,
    stored: tuple[Registry, dict[int, list[Event]]],
    args: list[str],
) -> None:
    registry, history = stored
    group = registry.group(GROUP)
    with (
        ServingProcess(redis_url, registry=registry_path, args=args) as server,
        FeatureClient(server.rest_url, timeout=10) as rest,
        GrpcFeatureClient(server.grpc_target, timeout=10) as grpc_client,
        FeatureStore.connect(redis_url, registry) as library,
    ):
        for _ in range(3):  # the L1's hits (and the native fronts' once taught) too

            def via_rest() -> list[tuple[list[object], list[str]]]:
                got = rest.get("consumer", IDS, features=FEATURES)
                return [(r.values, r.statuses) for r in got.rows]

            def via_grpc() -> list[tuple[list[object], list[str]]]:
                got = grpc_client.get("consumer", IDS, groups=[GROUP])
                return [(r.values, r.statuses) for r in got.rows]

            def via_feast() -> list[tuple[list[object], list[str]]]:
                body = {
                    "entities": {"consumer": IDS},
                    "features": [f"{GROUP}:{f}" for f in FEATURES],
                }
                answer = httpx.post(f"{server.rest_url}/get-online-features", json=body).json()
                columns = answer["results"][1:]
                return [
                    (
                        [c["values"][n] for c in columns],
                        [_FEAST_STATUS[c["statuses"][n]] for c in columns],
                    )
                    for n in range(len(IDS))
                ]

            def via_library() -> list[tuple[list[object], list[str]]]:
                got = library.read("consumer", IDS, FEATURES)
                return [(r.values, r.statuses) for r in got.rows]

            for read in (via_rest, via_grpc, via_feast, via_library):
                _check_at_read_time(group, history, read)

        # the L1's hits are answered on the native fronts' threads; without the L1, the
        # fronts' planned reads leave aggregated groups to their handlers
        fronts = _front_lookups(server.rest_url)
        if args:
            assert not any(how.startswith("read") for _, how in fronts), fronts
        else:
            assert fronts.get(("rest", "hit"), 0) > 0, fronts
            assert fronts.get(("grpc", "hit"), 0) > 0, fronts
        # with a plain group of the same entity in one request: one read per entity
        both = rest.get("consumer", IDS[:5], features=["tier", "orders_1h"])
        assert [r.values[0] for r in both.rows] == [i % 3 for i in IDS[:5]]
        # an aggregated feature's age: the time since the newest event in its windows
        row = rest.get("consumer", [IDS[0]], groups=[GROUP]).rows[0]
        newest = max(
            e.time_ms for e in history[IDS[0]] if e.time_ms > (time.time() - 7 * 86400) * 1000
        )
        assert abs(row.ages[GROUP] - (time.time() - newest / 1000)) <= 2


def _front_lookups(url: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("feature_serving_front_lookups_total{"):
            labels, value = line[len("feature_serving_front_lookups_total{") :].split("} ")
            parts = dict(p.split("=") for p in labels.split(","))
            out[parts["api"].strip('"'), parts["how"].strip('"')] = float(value)
    return out


def test_a_window_slides_with_the_clock_through_the_l1(redis_url: str, registry_path: Path) -> None:
    """An event counted in a 2 s window is gone from it within the next tile boundaries,
    though the L1's TTL is 300 s and nothing was written since."""
    registry = load_registry(registry_path)
    group = registry.group("consumer_clicks")
    env = {"FEATURE_SERVING_CACHE_TTL": "300", "FEATURE_SERVING_SHADOW_FRACTION": "0"}
    with (
        ServingProcess(redis_url, registry=registry_path, env=env, grpc=False) as server,
        FeatureClient(server.rest_url, timeout=10) as client,
    ):
        now = time.time()
        _write(redis_url, group, {900: [Event(math.floor(now * 1000), {}, "0", 0)]})
        seen = [client.get("consumer", [900], features=["clicks_2s"]).rows[0].values[0]]
        deadline = time.monotonic() + 10
        while seen[-1] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            seen.append(client.get("consumer", [900], features=["clicks_2s"]).rows[0].values[0])
        ended = time.time()
        assert seen[0] == 1
        assert seen[-1] == 0, seen
        # counted through the end of the tile after the event's: gone by the one after
        assert ended <= math.floor(now) + 3 + 0.5, (ended - now, seen)
        stats = httpx.get(f"{server.rest_url}/metrics", timeout=10).text
        assert "feature_serving" in stats


def test_plain_writes_of_an_aggregated_group_are_refused(
    redis_url: str, registry_path: Path
) -> None:
    registry = load_registry(registry_path)
    with ServingProcess(redis_url, registry=registry_path, grpc=False) as server:
        with (
            FeatureClient(server.rest_url, timeout=10) as client,
            pytest.raises(
                ServingRequestError, match="window aggregations, computed from events"
            ) as raised,
        ):
            client.write(GROUP, [(1, {"orders_1h": 3})])
        assert 400 <= raised.value.status < 500
    with (
        FeatureStore.connect(redis_url, registry) as store,
        pytest.raises(Exception, match="computed from events"),
    ):
        store.write(GROUP, [(1, {"orders_1h": 3})])


def test_unreadable_tiles_are_that_entity_s_error(
    redis_url: str, registry_path: Path, redis_server: EmbeddedRedis
) -> None:
    registry = load_registry(registry_path)
    group = registry.group(GROUP)
    key = entity_key("c", group.entity.id_type, 777)
    with FeatureStore.connect(redis_url, registry) as store:
        store.client.hset(key, group.windows_field, b"garbage")  # type: ignore[attr-defined]
    with (
        ServingProcess(redis_url, registry=registry_path, grpc=False) as server,
        FeatureClient(server.rest_url, timeout=10) as client,
    ):
        got = client.get("consumer", [777, 1], features=["orders_1h"])
        assert got.rows[0].statuses == ["error"]
        assert got.rows[1].statuses == ["missing"]
