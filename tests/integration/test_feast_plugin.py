"""Feast's own SDK with this project's online store plugin (``feature_store.feast``).

A Feast repository (two entities, int and string ids; three views of every mapped type,
one with a short ttl; a feature service across entities; a push source) is applied and
materialized with Feast's CLI into a real Redis. Then ``get_online_features`` must equal
the parquet files, ``feature-store serve`` reading the registry ``import-feast`` writes
for the same repository, and Feast's generic read path over the plugin's ``online_read``;
pushes are ordered by event time; ``feast apply`` without a view deletes its fields.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import feast
import numpy as np
import pandas as pd
import pytest
import redis
from feast.data_source import PushMode
from feast.infra.online_stores.online_store import OnlineStore
from feast.online_response import OnlineResponse
from feast.protos.feast.serving.ServingService_pb2 import FieldStatus

from feature_store import sample
from feature_store.client import FeatureClient
from feature_store.embedded import EmbeddedRedis
from feature_store.errors import RegistryError
from feature_store.feast.answers import Response
from feature_store.feast.online_store import (
    NAME,
    PINS_KEY,
    FeatureStoreRedisOnlineStore,
    FeatureStoreRedisOnlineStoreConfig,
    redis_url,
)
from feature_store.layout import entity_key, feature_field, freshness_field
from feature_store.registry import IdType
from feature_store.serving.process import ServingProcess

BIN = Path(sys.executable).parent
NOW = int(time.time())  # whole seconds: Feast warns of nanoseconds it drops
CONSUMERS = list(range(1, 21))
STORES = [f"s{i}" for i in range(1, 6)]
NULL_RATING = 7  # its rating is null in the parquet: NULL_VALUE
MISSING_ID, MISSING_STORE = 999, "nope"

DEFINITIONS = """
from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource, ValueType
from feast.types import Array, Bool, Float32, Float64, Int32, Int64, String

consumer = Entity(name="consumer", join_keys=["consumer_id"], value_type=ValueType.INT64)
store = Entity(name="store", join_keys=["store_id"], value_type=ValueType.STRING)
consumer_source = FileSource(
    name="consumer_source", path="data/consumer.parquet", timestamp_field="event_timestamp"
)
consumer_push = PushSource(name="consumer_push", batch_source=consumer_source)
consumer_profile = FeatureView(
    name="consumer_profile",
    entities=[consumer],
    ttl=timedelta(days=2),
    schema=[
        Field(name="rating", dtype=Float32),
        Field(name="lifetime_spend", dtype=Float64),
        Field(name="orders", dtype=Int64),
        Field(name="age", dtype=Int32),
        Field(name="vip", dtype=Bool),
        Field(name="city", dtype=String),
        Field(name="embedding", dtype=Array(Float32), vector_length=4),
        Field(name="recent_stores", dtype=Array(Int64)),
    ],
    source=consumer_push,
)
consumer_recent = FeatureView(
    name="consumer_recent",
    entities=[consumer],
    ttl=timedelta(hours=1),
    schema=[Field(name="clicks_1h", dtype=Int64)],
    source=FileSource(
        name="recent_source", path="data/recent.parquet", timestamp_field="event_timestamp"
    ),
)
store_stats = FeatureView(
    name="store_stats",
    entities=[store],
    ttl=timedelta(days=1),
    schema=[Field(name="open_orders", dtype=Int32), Field(name="score", dtype=Float32)],
    source=FileSource(
        name="store_source", path="data/store.parquet", timestamp_field="event_timestamp"
    ),
)
ranking = FeatureService(
    name="ranking", features=[consumer_profile[["rating", "embedding"]], store_stats]
)
"""

PROFILE = ["rating", "lifetime_spend", "orders", "age", "vip", "city", "embedding", "recent_stores"]
FLOAT32 = {"rating", "embedding", "score"}


def frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(3)
    hour_ago = pd.Timestamp(NOW - 3600, unit="s", tz="UTC")
    n = len(CONSUMERS)
    ratings: list[float | None] = [float(x) for x in rng.random(n).astype(np.float32)]
    ratings[CONSUMERS.index(NULL_RATING)] = None
    consumer = pd.DataFrame(
        {
            "consumer_id": CONSUMERS,
            "rating": pd.array(ratings, dtype="Float32"),
            "lifetime_spend": rng.random(n) * 1e4,
            "orders": rng.integers(0, 10**12, n),
            "age": rng.integers(18, 90, n).astype(np.int32),
            "vip": rng.random(n) > 0.5,
            "city": [f"city-{i % 4}" for i in range(n)],
            "embedding": [list(rng.random(4).astype(np.float32)) for _ in range(n)],
            "recent_stores": [list(rng.integers(0, 10**9, i % 5)) for i in range(n)],
            "event_timestamp": [hour_ago] * n,
        }
    )
    recent = pd.DataFrame(
        {
            "consumer_id": CONSUMERS,
            "clicks_1h": rng.integers(0, 100, n),  # written 3 h ago: past the 1 h ttl
            "event_timestamp": [pd.Timestamp(NOW - 3 * 3600, unit="s", tz="UTC")] * n,
        }
    )
    stores = pd.DataFrame(
        {
            "store_id": STORES,
            "open_orders": rng.integers(0, 50, len(STORES)).astype(np.int32),
            "score": rng.random(len(STORES)).astype(np.float32),
            "event_timestamp": [hour_ago] * len(STORES),
        }
    )
    return {"consumer": consumer, "recent": recent, "store": stores}


def write_repo(path: Path, url: str, definitions: str = DEFINITIONS) -> Path:
    """A Feast repository of ``definitions`` on the plugin at ``url`` (data: the caller's)."""
    return sample.feast_repo(
        path, f"  type: {NAME}\n  connection_string: {url}", definitions=definitions
    )


def cli(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(BIN / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def data() -> dict[str, pd.DataFrame]:
    return frames()


@pytest.fixture(scope="module")
def repo(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: EmbeddedRedis,
    data: dict[str, pd.DataFrame],
) -> Path:
    path = write_repo(tmp_path_factory.mktemp("repo"), redis_server.url)
    for name, frame in data.items():
        frame.to_parquet(path / "data" / f"{name}.parquet")
    cli("feast", "apply", cwd=path)
    out = cli("feast", "materialize", "2000-01-01T00:00:00", "2100-01-01T00:00:00", cwd=path)
    assert "wrote 20 row(s)" in out  # the plugin's log line, in Feast's output
    return path


def close(fs: feast.FeatureStore) -> None:
    """Close the plugin's connections (Feast has no call for it)."""
    store = fs._get_provider().online_store
    assert isinstance(store, FeatureStoreRedisOnlineStore)
    store.disconnect()


@pytest.fixture(scope="module")
def fs(repo: Path) -> Iterator[feast.FeatureStore]:
    store = feast.FeatureStore(repo_path=str(repo))
    yield store
    close(store)


@pytest.fixture(scope="module")
def server(
    repo: Path, redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServingProcess]:
    """``feature-store serve`` on the registry ``import-feast`` writes for the repository,
    with a long L1 TTL: only the plugin's notices can refresh what it caches."""
    registry = tmp_path_factory.mktemp("serve") / "features.yaml"
    cli("feature-store", "import-feast", str(repo), "--output", str(registry), cwd=repo)
    with ServingProcess(
        redis_server.url, registry=registry, args=["--cache-ttl", "600"], grpc=False
    ) as process:
        yield process


def same(got: Any, want: Any, float32: bool) -> bool:
    if want is None or (isinstance(want, float) and np.isnan(want)):
        return got is None
    if float32:
        return bool(np.array_equal(np.float32(got), np.float32(want)))
    if isinstance(want, np.ndarray | list):
        return list(got) == [x.item() if hasattr(x, "item") else x for x in want]
    return bool(got == (want.item() if hasattr(want, "item") else want))


def refs(view: str, names: list[str]) -> list[str]:
    return [f"{view}:{n}" for n in names]


def test_materialized_values_read_back_equal_to_the_parquet(
    fs: feast.FeatureStore, data: dict[str, pd.DataFrame]
) -> None:
    ids = [*CONSUMERS, MISSING_ID]
    response = fs.get_online_features(
        features=[*refs("consumer_profile", PROFILE), "consumer_recent:clicks_1h"],
        entity_rows=[{"consumer_id": i} for i in ids],
    )
    assert isinstance(response, Response)  # the plugin's own path answered
    got = response.to_dict(include_event_timestamps=True)
    frame = data["consumer"].set_index("consumer_id")
    for name in PROFILE:
        for i, value in zip(ids, got[name], strict=True):
            want = None if i == MISSING_ID else frame.loc[i, name]
            if name == "rating" and i == NULL_RATING:
                want = None
            assert same(value, want, name in FLOAT32), (i, name, value, want)
    recent = data["recent"].set_index("consumer_id")
    assert got["clicks_1h"][:-1] == [int(recent.loc[i, "clicks_1h"]) for i in CONSUMERS]
    statuses = dict(
        zip(response.proto.metadata.feature_names.val, response.proto.results, strict=True)
    )
    last = len(ids) - 1
    assert list(statuses["consumer_id"].statuses) == [FieldStatus.PRESENT] * len(ids)
    assert statuses["orders"].statuses[0] == FieldStatus.PRESENT
    assert statuses["orders"].statuses[last] == FieldStatus.NOT_FOUND
    assert statuses["rating"].statuses[CONSUMERS.index(NULL_RATING)] == FieldStatus.NULL_VALUE
    assert statuses["clicks_1h"].statuses[0] == FieldStatus.OUTSIDE_MAX_AGE  # 3 h > 1 h ttl
    # event times: the rows' own (materialized from the parquet), 0 where none
    assert got["orders__ts"][0] == int(NOW - 3600)
    assert got["clicks_1h__ts"][0] == int(NOW - 3 * 3600)
    assert got["orders__ts"][last] == 0
    # Feast's own reading of the proto answers what the plugin's to_dict does
    feasts = OnlineResponse(response.proto, feature_types=response._feature_types)
    assert feasts.to_dict(include_event_timestamps=True) == got
    assert list(fs.get_online_features(
        features=["consumer_profile:orders"], entity_rows=[{"consumer_id": 1}]
    ).to_df()["orders"]) == [int(frame.loc[1, "orders"])]  # fmt: skip


def test_a_feature_service_across_two_entities_with_full_names(
    fs: feast.FeatureStore, data: dict[str, pd.DataFrame]
) -> None:
    got = fs.get_online_features(
        features=fs.get_feature_service("ranking"),
        entity_rows={"consumer_id": [1, 2, MISSING_ID], "store_id": ["s1", MISSING_STORE, "s3"]},
        full_feature_names=True,
    ).to_dict()
    assert set(got) == {
        "consumer_id",
        "store_id",
        "consumer_profile__rating",
        "consumer_profile__embedding",
        "store_stats__open_orders",
        "store_stats__score",
    }
    stores = data["store"].set_index("store_id")
    assert got["store_stats__open_orders"] == [int(stores.loc["s1", "open_orders"]), None,
                                               int(stores.loc["s3", "open_orders"])]  # fmt: skip
    assert same(got["store_stats__score"][2], stores.loc["s3", "score"], True)
    assert got["consumer_profile__embedding"][2] is None
    assert got["store_id"] == ["s1", MISSING_STORE, "s3"]


def test_the_plugin_answers_what_feature_store_serve_answers(
    fs: feast.FeatureStore, server: ServingProcess
) -> None:
    ids = [*CONSUMERS, MISSING_ID]
    got = fs.get_online_features(
        features=refs("consumer_profile", PROFILE), entity_rows={"consumer_id": ids}
    ).to_dict()
    with FeatureClient(server.rest_url) as client:
        rest = client.get("consumer", ids, groups=["consumer_profile"])
        stores = client.get("store", [*STORES, MISSING_STORE], groups=["store_stats"])
    for row_index, row in enumerate(rest.rows):
        for name, value in zip(rest.features, row.values, strict=True):
            assert same(got[name][row_index], value, name in FLOAT32), (row.id, name)
    theirs = fs.get_online_features(
        features=["store_stats:open_orders", "store_stats:score"],
        entity_rows={"store_id": [*STORES, MISSING_STORE]},
    ).to_dict()
    for row_index, row in enumerate(stores.rows):
        for name, value in zip(stores.features, row.values, strict=True):
            assert same(theirs[name][row_index], value, name in FLOAT32), (row.id, name)


def test_the_fast_path_equals_feasts_generic_path_over_online_read(
    fs: feast.FeatureStore,
) -> None:
    """Feast's generic ``get_online_features`` (its request resolution, ``online_read``
    per view, its response building) reads the same values and times; the statuses differ
    only where this project says more (OUTSIDE_MAX_AGE, NULL_VALUE for PRESENT or
    NOT_FOUND)."""
    store = fs._get_provider().online_store
    assert isinstance(store, FeatureStoreRedisOnlineStore)
    features = [*refs("consumer_profile", PROFILE), "consumer_recent:clicks_1h"]
    rows = {"consumer_id": [3, NULL_RATING, MISSING_ID, 3]}
    fast = fs.get_online_features(features=features, entity_rows=rows)
    generic = OnlineStore.get_online_features(
        store, fs.config, features, rows, fs.registry, fs.project
    )
    a, b = fast.to_dict(include_event_timestamps=True), generic.to_dict(True)
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith("__ts"):
            want = b[name]
            if name == "rating__ts":  # the generic path has no time for a value not read
                want[1] = a[name][1]
            assert a[name] == want, name
            continue
        for x, y in zip(a[name], b[name], strict=True):
            assert same(x, y, name in FLOAT32), name
    fast_status = dict(zip(fast.proto.metadata.feature_names.val, fast.proto.results, strict=True))
    for name, vector in zip(generic.proto.metadata.feature_names.val, generic.proto.results,
                            strict=True):  # fmt: skip
        for ours, theirs in zip(fast_status[name].statuses, vector.statuses, strict=True):
            assert (ours, theirs) in {
                (FieldStatus.PRESENT, FieldStatus.PRESENT),
                (FieldStatus.NOT_FOUND, FieldStatus.NOT_FOUND),
                (FieldStatus.NULL_VALUE, FieldStatus.NOT_FOUND),
                (FieldStatus.OUTSIDE_MAX_AGE, FieldStatus.PRESENT),
            }, (name, ours, theirs)


def test_pushes_are_ordered_by_event_time_and_reach_servings_cache(
    fs: feast.FeatureStore,
    server: ServingProcess,
    data: dict[str, pd.DataFrame],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def push(orders: int, at: float) -> None:
        row = data["consumer"][data["consumer"]["consumer_id"] == 11].copy()
        row["orders"] = orders
        row["event_timestamp"] = pd.Timestamp(int(at), unit="s", tz="UTC")
        fs.push("consumer_push", row, to=PushMode.ONLINE)  # Feast pushes every column

    def orders() -> list[object]:
        return fs.get_online_features(
            features=["consumer_profile:orders"], entity_rows=[{"consumer_id": 11}]
        ).to_dict()["orders"]

    with FeatureClient(server.rest_url) as client:
        client.get("consumer", [11], ["orders"])  # cached for 600 s
        push(41, time.time())
        assert orders() == [41]
        deadline = time.monotonic() + 10
        while client.get("consumer", [11], ["orders"]).rows[0].values != [41]:
            assert time.monotonic() < deadline, "serving still answers the old value"
            time.sleep(0.1)
        with caplog.at_level(logging.WARNING, logger="feature_store.feast.online_store"):
            push(40, time.time() - 60)  # older than what Redis holds: skipped
        assert orders() == [41]
        assert any("1 of 1 row(s) skipped" in r.getMessage() for r in caplog.records)
        push(42, time.time() + 1)
        assert orders() == [42]


def test_apply_without_a_view_deletes_its_fields_and_keeps_prefixes(
    tmp_path: Path, redis_url: str, data: dict[str, pd.DataFrame], request: pytest.FixtureRequest
) -> None:
    """A removed view's fields leave every hash of its entity; the other view's stay. An
    entity added later gets a new prefix and never moves the others' keys."""
    repo = write_repo(tmp_path, redis_url)
    for name, frame in data.items():
        frame.to_parquet(repo / "data" / f"{name}.parquet")
    fs = feast.FeatureStore(repo_path=str(repo))
    request.addfinalizer(lambda: close(fs))
    cli("feast", "apply", cwd=repo)
    fs.materialize(datetime(2000, 1, 1, tzinfo=UTC), datetime.now(UTC) + timedelta(days=1))
    r = redis.Redis.from_url(redis_url)
    request.addfinalizer(r.close)
    assert r.hgetall(PINS_KEY) == {b"consumer": b"c", b"store": b"s"}
    key = entity_key("c", IdType.INT, 1)
    assert r.hexists(key, feature_field("clicks_1h"))
    # a new entity whose name starts like "store" ("st..." would be the shortest otherwise)
    removed = DEFINITIONS.replace("consumer_recent = FeatureView(", "_unused = dict(", 1).replace(
        "ranking = FeatureService(",
        'session = Entity(name="session_entity", join_keys=["session_id"], '
        "value_type=ValueType.INT64)\n"
        'sessions = FeatureView(name="sessions", entities=[session], schema=['
        'Field(name="pages", dtype=Int64)], source=FileSource(name="session_source", '
        'path="data/store.parquet", timestamp_field="event_timestamp"))\n'
        "ranking = FeatureService(",
    )
    (repo / "definitions.py").write_text(removed)
    cli("feast", "apply", cwd=repo)
    close(fs)
    assert not r.hexists(key, feature_field("clicks_1h"))
    assert not r.hexists(key, freshness_field("consumer_recent"))
    assert r.hexists(key, feature_field("orders"))
    pins = r.hgetall(PINS_KEY)
    assert (pins[b"consumer"], pins[b"store"]) == (b"c", b"s")
    assert pins[b"session_entity"] not in (b"c", b"s")
    fs = feast.FeatureStore(repo_path=str(repo))
    request.addfinalizer(lambda: close(fs))
    fs.write_to_online_store(
        "sessions",
        pd.DataFrame(
            {"session_id": [5], "pages": [3], "event_timestamp": [pd.Timestamp.now(tz="UTC")]}
        ),
    )
    got = fs.get_online_features(
        features=["sessions:pages", "store_stats:open_orders"],
        entity_rows={"session_id": [5], "store_id": ["s1"]},
    ).to_dict()
    assert got["pages"] == [3]
    assert got["open_orders"][0] == int(
        data["store"].set_index("store_id").loc["s1", "open_orders"]
    )
    fs.teardown()
    assert r.hlen(PINS_KEY) == 0
    assert not r.exists(key)


def test_a_view_that_does_not_map_stops_feast_apply_naming_it(
    tmp_path: Path, redis_url: str
) -> None:
    definitions = DEFINITIONS.replace(
        'Field(name="city", dtype=String),', 'Field(name="city", dtype=String),\n'
        '        Field(name="photo", dtype=Bytes),',
    ).replace("Bool, Float32", "Bool, Bytes, Float32")  # fmt: skip
    repo = write_repo(tmp_path, redis_url, definitions=definitions)
    done = subprocess.run(
        [str(BIN / "feast"), "apply"], cwd=repo, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert "feature_views.consumer_profile.features.photo: type Bytes" in done.stderr
    fs = feast.FeatureStore(repo_path=str(repo))
    assert fs.list_feature_views() == []  # none applied
    close(fs)


def test_a_redis_cluster(
    tmp_path: Path, cluster_url: str, data: dict[str, pd.DataFrame], request: pytest.FixtureRequest
) -> None:
    repo = write_repo(tmp_path, cluster_url)
    for name, frame in data.items():
        frame.to_parquet(repo / "data" / f"{name}.parquet")
    cli("feast", "apply", cwd=repo)
    cli("feast", "materialize", "2000-01-01T00:00:00", "2100-01-01T00:00:00", cwd=repo)
    fs = feast.FeatureStore(repo_path=str(repo))
    request.addfinalizer(lambda: close(fs))
    got = fs.get_online_features(
        features=["consumer_profile:orders", "store_stats:open_orders"],
        entity_rows={"consumer_id": CONSUMERS[:5], "store_id": STORES},
    ).to_dict()
    frame = data["consumer"].set_index("consumer_id")
    assert got["orders"] == [int(frame.loc[i, "orders"]) for i in CONSUMERS[:5]]
    stores = data["store"].set_index("store_id")
    assert got["open_orders"] == [int(stores.loc[s, "open_orders"]) for s in STORES]


def test_connection_strings_in_either_form() -> None:
    def url(text: str, kind: str = "redis") -> str:
        return redis_url(
            FeatureStoreRedisOnlineStoreConfig(connection_string=text, redis_type=kind)
        )

    assert url("redis://h:1/2") == "redis://h:1/2"
    assert url("redis://h:1", "redis_cluster") == "redis://h:1?cluster=true"
    assert url("h:1,password=p w,ssl=true") == "rediss://:p%20w@h:1"
    assert url("a:1,b:2", "redis_cluster") == "redis://a:1?cluster=true&nodes=b:2"
    with pytest.raises(RegistryError, match="no host"):
        url("password=x")


@pytest.mark.parametrize(
    "path",
    [
        "feature_store.feast.online_store.FeatureStoreRedisOnlineStore",
        "feature_store.feast_redis.FeatureStoreRedisOnlineStore",  # earlier releases' path
        "feature_store.feast.remote.FeatureStoreOnlineStore",
        "feature_store.feast_online.FeatureStoreOnlineStore",
    ],
)
def test_feast_loads_each_store_by_its_documented_type(path: str) -> None:
    """Feast resolves ``online_store.type`` to a class and its ``...Config`` by the dotted
    path; a ``feature_store.yaml`` written for an earlier release keeps working."""
    from feast.repo_config import RepoConfig

    config = RepoConfig(
        project="p",
        provider="local",
        registry="data/registry.db",
        online_store={"type": path, "connection_string": "redis://127.0.0.1:6379"}
        if "Redis" in path
        else {"type": path, "path": "http://127.0.0.1:8000"},
        entity_key_serialization_version=3,
    )
    from feast.infra.online_stores.helpers import get_online_store_from_config

    store_class = path.rsplit(".", 1)[1]
    assert type(config.online_store).__name__ == store_class + "Config"
    assert config.online_store.type == path
    # and the store itself, found as Feast finds it: beside its config class
    assert type(get_online_store_from_config(config.online_store)).__name__ == store_class
