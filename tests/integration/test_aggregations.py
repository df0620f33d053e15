"""Window aggregations served: tiles written to a real Redis, answered over REST, gRPC and
Feast's API, with the L1 on and off, and by the library, equal to the reference at the
time of the read; a window slides with the clock through the L1; plain writes of an
aggregated group are refused."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from feature_store import sample
from feature_store.client import FeatureClient, GrpcFeatureClient, ServingRequestError
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.backfill import backfill_partition
from feature_store.ingest.records import EntityEvents
from feature_store.ingest.spec import ColumnSpec, RetrySpec, Source, TaskSpec
from feature_store.ingest.task import EXTRA
from feature_store.ingest.windows import write_events
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import IdType, entity_key
from feature_store.registry import FeatureGroup, Function, Registry, load_registry, parse_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore, read_plans
from feature_store.windows import Event, reference_answer

REGISTRY = sample.activity_registry_text(
    extra_groups="""\
  consumer_profile:
    entity: consumer
    features: {tier: int}
  consumer_clicks:
    entity: consumer
    aggregations:
      tile: 1s
      features:
        clicks_2s: {function: count, window: 2s}
"""
)
GROUP, FEATURES = sample.ACTIVITY_GROUP, sample.ACTIVITY_FEATURES
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
            events.append(Event(math.floor((now - back) * 1000), values, 0, n))
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
                    "entities": {"consumer_id": IDS},
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

        # answered on the native fronts' threads: the L1's hits, and without the L1 the
        # planned reads (the tiles answered there at the time of the read)
        fronts = _front_lookups(server.rest_url)
        if args:
            for api in ("rest", "grpc", "feast"):
                planned = fronts.get((api, "read"), 0) + fronts.get((api, "read_direct"), 0)
                assert planned > 0, (api, fronts)
        else:
            assert fronts.get(("rest", "hit"), 0) > 0, fronts
            assert fronts.get(("grpc", "hit"), 0) > 0, fronts
        # the registry says what each aggregated feature computes
        described = {g["name"]: g for g in rest.registry()["groups"]}  # type: ignore[index,union-attr]
        activity = described[GROUP]
        assert activity["aggregation"] == {"tile_seconds": 60, "allowed_lateness_seconds": 600}
        assert activity["features"][5]["aggregate"] == {
            "function": "last_n",
            "of": "store_id",
            "window_seconds": 7 * 86400,
            "n": 5,
        }
        assert "aggregation" not in described["consumer_profile"]
        # with a plain group of the same entity in one request: one read per entity
        for _ in range(3):  # taught, then planned (or hits) on the fronts
            both = rest.get("consumer", IDS[:5], features=["tier", "orders_1h"])
            alone = library.read("consumer", IDS[:5], ["orders_1h"])
            assert [r.values[0] for r in both.rows] == [i % 3 for i in IDS[:5]]
            assert [r.values[1] for r in both.rows] == [r.values[0] for r in alone.rows]
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
        _write(redis_url, group, {900: [Event(math.floor(now * 1000), {}, 0, 0)]})
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
    with ServingProcess(redis_url, registry=registry_path) as server:
        with (
            FeatureClient(server.rest_url, timeout=10) as client,
            pytest.raises(
                ServingRequestError, match="window aggregations, computed from events"
            ) as raised,
        ):
            client.write(GROUP, [(1, {"orders_1h": 3})])
        assert 400 <= raised.value.status < 500
        with (
            GrpcFeatureClient(server.grpc_target, timeout=10) as grpc_client,
            pytest.raises(ServingRequestError, match="computed from events"),
        ):
            grpc_client.write(GROUP, [(1, {"orders_1h": 3})])
        pushed = httpx.post(
            f"{server.rest_url}/push",
            json={"push_source_name": GROUP, "df": {"consumer_id": [1], "orders_1h": [3]}},
        )
        assert pushed.status_code == 400, pushed.text
        assert "computed from events" in pushed.text
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


PROPERTY_REGISTRY = """
entities:
  consumer: {{prefix: {prefix}, id_type: int, ttl: 30d, join_key: consumer_id}}
feature_groups:
  g:
    entity: consumer
    aggregations:
      tile: 1m
      allowed_lateness: 10m
      features:
        n_1h:    {{function: count, window: 1h}}
        sum_1h:  {{function: sum, of: x, window: 1h}}
        mean_1d: {{function: mean, of: x, window: 1d}}
        min_1d:  {{function: min, of: x, window: 1d}}
        max_1h:  {{function: max, of: x, window: 1h}}
        last_3:  {{function: last_n, n: 3, of: k, window: 7d}}
        k_10m:   {{function: count, of: k, window: 10m}}
"""
_RUNS = itertools.count()
T_BASE = 1_700_000_000.0  # in the past: event times ahead of the clock are refused

arrivals = st.lists(
    st.tuples(
        st.integers(1, 4),  # entity
        st.integers(0, 8 * 86_400_000),  # ms after T_BASE
        st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)),
        st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    arrivals,
    st.lists(st.integers(1, 15), max_size=4),
    st.lists(st.integers(0, 9 * 86_400_000), min_size=1, max_size=4),
)
def test_the_stream_s_and_the_backfill_s_served_answers_equal_the_reference(
    redis_url: str,
    raw: list[tuple[int, int, float | None, int | None]],
    cuts: list[int],
    reads: list[int],
) -> None:
    """Random events (out of order, repeated, late past the bound, several entities)
    written as the stream writes them (micro-batches, one of them written twice) and as
    the backfill writes the events the stream counted, each into its own keys, read back
    from Redis at several times: both equal the reference."""
    run = next(_RUNS)
    note(f"{raw=} {cuts=} {reads=}")
    stream_registry = parse_registry(PROPERTY_REGISTRY.format(prefix=f"ps{run}"))
    backfill_text = PROPERTY_REGISTRY.format(prefix=f"pb{run}")
    group = stream_registry.group("g")
    assert group.aggregation is not None
    history: dict[int, list[Event]] = {}
    arrived: list[tuple[int, Event]] = []
    for offset, (entity, t, x, k) in enumerate(raw):
        values = {n: v for n, v in (("x", x), ("k", k)) if v is not None}
        event = Event(int(T_BASE * 1000) + t, values, 0, offset)
        history.setdefault(entity, []).append(event)
        arrived.append((entity, event))

    # the stream's writes: micro-batches in arrival order, the first written twice
    writer = ChunkWriter(
        RedisTarget.parse(redis_url), ttl_seconds=3600, chunk_size=3, retry=RetrySpec()
    )
    try:
        at = 0
        for n, size in enumerate([*cuts, len(arrived)]):
            batch = arrived[at : at + size]
            at += len(batch)
            events: EntityEvents = {}
            for i, (entity, event) in enumerate(batch):
                events.setdefault(entity_key(f"ps{run}", IdType.INT, entity), []).append((i, event))
            for _ in range(2 if n == 0 else 1):
                write_events(writer, group, events)
    finally:
        writer.close()

    # the backfill's: the counted events, in a table sorted by (entity, time), in batches
    counted = _counted(group.aggregation.lateness_seconds, history)
    rows = sorted(
        (
            {"consumer_id": e, "event_time": ev.time_ms / 1000, **_xk(ev)}
            for e, evs in counted.items()
            for ev in evs
        ),
        key=lambda r: (r["consumer_id"], r["event_time"]),
    )  # fmt: skip
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("consumer_id", pa.int64()),
                ("event_time", pa.float64()),
                ("x", pa.float64()),
                ("k", pa.int64()),
            ]
        ),
    )
    spec = TaskSpec(
        registry_text=backfill_text,
        registry_source="property",
        group="g",
        id_column="consumer_id",
        id_source=Source.NATIVE,
        columns=(ColumnSpec("k", "k"), ColumnSpec("x", "x")),
        redis_url=redis_url,
        written_at=0.0,
        event_time_column="event_time",
        chunk_size=2,
        aggregated=True,
    )
    out_schema = pa.schema([*table.schema, *(pa.field(n, t) for n, t in EXTRA)])
    batches = table.to_batches(max_chunksize=max(1, len(rows) // 3 or 1))
    out = pa.Table.from_batches(list(backfill_partition(spec, out_schema, iter(batches))))
    assert out.column("_ingest_kind").to_pylist() == ["stats"]  # no bad row

    backfill_registry = parse_registry(backfill_text)
    names = [f.name for f in group.features]
    ids = sorted(history) or [1]
    with (
        FeatureStore.connect(redis_url, stream_registry) as a,
        FeatureStore.connect(redis_url, backfill_registry) as b,
    ):
        # reads from the newest event less the lateness on (``windows.prune``)
        newest = max((e.time_ms for e in arrived_events(arrived)), default=int(T_BASE * 1000))
        for offset in reads:
            now = (newest - group.aggregation.lateness_seconds * 1000 + offset) / 1000
            want = [reference_answer(group.aggregation, history.get(i, []), now) for i in ids]
            for store in (a, b):
                (result,) = read_plans(store.client, [store.plan("consumer", ids, names)], now=now)
                for i, row, expected in zip(ids, result.rows, want, strict=True):
                    if i not in counted:  # no event counted: nothing stored for the backfill
                        continue
                    for got, exp, a_ in zip(
                        row.values, expected, group.aggregation.aggregates, strict=True
                    ):
                        where = (store is a and "stream") or "backfill"
                        assert _close(got, exp, a_.function), (where, now, i, a_, got, exp)


def arrived_events(arrived: list[tuple[int, Event]]) -> list[Event]:
    return [e for _, e in arrived]


def _xk(event: Event) -> dict[str, float | int | None]:
    return {n: event.values.get(n) for n in "xk"}


def _counted(lateness: int, history: dict[int, list[Event]]) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = {}
    for entity, events in history.items():
        newest: int | None = None
        for e in events:
            if newest is not None and e.time_ms < newest - lateness * 1000:
                continue
            out.setdefault(entity, []).append(e)
            newest = e.time_ms if newest is None else max(newest, e.time_ms)
    return out


@pytest.mark.cluster
def test_on_a_redis_cluster(cluster_url: str, registry_path: Path) -> None:
    """Tiles written through the cluster's masters (the compare-and-set script routed by
    its key) and answered by a server's fronts (their planned reads routed by slot) and by
    the library, as the reference says."""
    registry = load_registry(registry_path)
    group = registry.group(GROUP)
    history = _history(time.time(), random.Random(11))
    _write(cluster_url, group, history)
    with (
        ServingProcess(cluster_url, registry=registry_path, args=["--no-cache"]) as server,
        FeatureClient(server.rest_url, timeout=10) as rest,
        FeatureStore.connect(cluster_url, registry) as library,
    ):
        for _ in range(3):

            def via_rest() -> list[tuple[list[object], list[str]]]:
                got = rest.get("consumer", IDS, features=FEATURES)
                return [(r.values, r.statuses) for r in got.rows]

            def via_library() -> list[tuple[list[object], list[str]]]:
                got = library.read("consumer", IDS, FEATURES)
                return [(r.values, r.statuses) for r in got.rows]

            for read in (via_rest, via_library):
                _check_at_read_time(group, history, read)
        fronts = _front_lookups(server.rest_url)
        assert fronts.get(("rest", "read_direct"), 0) > 0, fronts
