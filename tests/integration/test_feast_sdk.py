"""Feast's own SDK, pointed at this server, reads what this server's REST API reads.

A Feast repository declares the standard shape (entity ``consumer``, join key
``consumer_id``; one 50-feature view: floats, ints, int lists, float arrays) with
``online_store: type: remote`` at a real serving process over a real Redis. Feast's
``get_online_features`` must return the same values as ``/v1/features/get`` for the same
entities, with Feast's statuses for missing ids, stale groups and absent values; its writes
(``write_to_online_store``, ``push``) land where ``/v1`` reads them; its errors come back as
Feast's exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import feast
import httpx
import numpy as np
import orjson
import pandas as pd
import pytest
import redis
from feast import types as ft
from feast.errors import FeastError, FeastPermissionError, FeatureViewNotFoundException
from feast.protos.feast.serving.ServingService_pb2 import FieldStatus

from feature_store import sample
from feature_store.client import FeatureClient
from feature_store.embedded import EmbeddedRedis
from feature_store.feast import remote
from feature_store.layout import entity_key
from feature_store.registry import Registry, load_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
STALE_ID = 4  # written two days ago: older than the group's max_age of 36 h
NO_VALUE_ID = 5  # holds the group, but not int_0
IDS = [1, 2, 3, STALE_ID, NO_VALUE_ID, 999]
PUSH_SOURCE = "consumer_push"

# the sample registry, with a feature service and a push source as Feast declares them
REGISTRY_EXTRA = f"""
feature_services:
  consumer_small: [{GROUP}:int_0, {GROUP}:float_00, {GROUP}:embedding_0]
"""


def feast_objects(registry: Registry) -> list[object]:
    """Feast's declarations of this project's standard shape (what a team on Feast has)."""
    entity = registry.entities[ENTITY]
    group = registry.groups[GROUP]
    kinds = {
        "float": ft.Float32,
        "int": ft.Int64,
        "int_list": ft.Array(ft.Int64),
        "embedding": ft.Array(ft.Float32),
    }
    source = feast.FileSource(
        name="consumer_source", path="consumer.parquet", timestamp_field="event_timestamp"
    )
    push = feast.PushSource(name=PUSH_SOURCE, batch_source=source)
    consumer = feast.Entity(
        name=entity.name, join_keys=[entity.join_key], value_type=feast.ValueType.INT64
    )
    view = feast.FeatureView(
        name=group.name,
        entities=[consumer],
        ttl=timedelta(seconds=group.max_age_seconds or 0),
        schema=[
            feast.Field(
                name=f.name,
                dtype=kinds[f.type.value],
                vector_length=f.dim or 0,
            )
            for f in group.features
        ],
        source=push,
    )
    service = feast.FeatureService(
        name="consumer_small", features=[view[["int_0", "float_00", "embedding_0"]]]
    )
    return [consumer, source, push, view, service]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingProcess]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as redis_server:
        yield from _serve(tmp_path_factory, redis_server.url)


def _serve(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[ServingProcess]:
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    text = sample.registry_text().replace(
        "    max_age: 36h", f"    max_age: 36h\n    push_source: {PUSH_SOURCE}", 1
    )
    path.write_text(text + REGISTRY_EXTRA)
    registry = load_registry(path, check_lock=False)
    rows = list(sample.rows(10))
    with FeatureStore.connect(redis_url, registry) as store:
        store.write(GROUP, [r for r in rows if r[0] != STALE_ID])
        store.write(
            GROUP, [r for r in rows if r[0] == STALE_ID], event_time=time.time() - 48 * 3600
        )
    with redis.Redis.from_url(redis_url) as r:
        e = registry.entities[ENTITY]
        r.hdel(
            entity_key(e.prefix, e.id_type, NO_VALUE_ID),
            registry.groups[GROUP].feature("int_0").field,
        )
    with ServingProcess(redis_url, registry=path) as process:
        yield process


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, server: ServingProcess) -> feast.FeatureStore:
    return feast_store(tmp_path_factory.mktemp("feast_repo"), server.rest_url)


def feast_store(repo: Path, url: str, auth: str = "", kind: str = "remote") -> feast.FeatureStore:
    """Feast's SDK with the online store ``kind`` at ``url``, the definitions applied."""
    (repo / "feature_store.yaml").write_text(
        "project: compat\n"
        "provider: local\n"
        "registry: registry.db\n"
        "entity_key_serialization_version: 3\n"
        "online_store:\n"
        f"  type: {kind}\n"
        f"  path: {url}\n"
        "offline_store:\n"
        "  type: file\n" + auth
    )
    fs = feast.FeatureStore(repo_path=str(repo))
    fs.apply(feast_objects(sample.registry()))
    return fs


@pytest.fixture(scope="module")
def rest(server: ServingProcess) -> Iterator[FeatureClient]:
    with FeatureClient(server.rest_url) as client:
        yield client


def same(feast_value: object, ours: object) -> bool:
    """Equal values; floats compared as float32, the type they are stored as: Feast's SDK
    reads the shortest float32 decimal as a double (0.13437633), this project's client
    widens an embedding's float32, and a written value may have been a double."""
    if isinstance(ours, float) or (isinstance(ours, list) and ours and isinstance(ours[0], float)):
        return bool(np.array_equal(np.float32(feast_value), np.float32(ours)))
    return feast_value == ours


def refs(features: list[str]) -> list[str]:
    return [f"{GROUP}:{f}" for f in features]


ALL = [f.name for f in sample.registry().groups[GROUP].features]
FEAST_STATUS = {"present": FieldStatus.PRESENT, "stale": FieldStatus.OUTSIDE_MAX_AGE}


def test_feast_sdk_reads_the_values_rest_reads(
    store: feast.FeatureStore, rest: FeatureClient
) -> None:
    response = store.get_online_features(
        features=refs(ALL), entity_rows=[{"consumer_id": i} for i in IDS]
    )
    got = response.to_dict()
    expected = rest.get(ENTITY, IDS, groups=[GROUP])
    assert got["consumer_id"] == IDS
    assert set(got) == {"consumer_id", *ALL}
    statuses = {
        name: list(column.statuses)
        for name, column in zip(
            response.proto.metadata.feature_names.val, response.proto.results, strict=True
        )
    }
    seen = set()
    for row_index, row in enumerate(expected.rows):
        for name, value, status in zip(expected.features, row.values, row.statuses, strict=True):
            assert same(got[name][row_index], value), (row.id, name)
            if row.id == 999:
                seen.add("NOT_FOUND")
                assert statuses[name][row_index] == FieldStatus.NOT_FOUND
            elif value is None:  # the entity holds the group, not this value
                seen.add("NULL_VALUE")
                assert statuses[name][row_index] == FieldStatus.NULL_VALUE, (row.id, name)
            else:
                seen.add(status)
                assert statuses[name][row_index] == FEAST_STATUS[status], (row.id, name)
    assert seen == {"NOT_FOUND", "NULL_VALUE", "present", "stale"}
    assert got["int_0"][IDS.index(NO_VALUE_ID)] is None
    # types as Feast's SDK reads them: floats stay floats (0.0, never an int 0)
    assert isinstance(got["float_00"][0], float)
    assert isinstance(got["int_0"][0], int)
    assert all(isinstance(x, float) for x in got["embedding_0"][0])
    assert len(got["embedding_0"][0]) == 32
    assert all(isinstance(x, int) for x in got["int_list_0"][0])
    # the stale entity's values are given, marked OUTSIDE_MAX_AGE
    stale_row = IDS.index(STALE_ID)
    assert statuses["float_00"][stale_row] == FieldStatus.OUTSIDE_MAX_AGE
    assert got["float_00"][stale_row] is not None


def test_feature_service_and_full_feature_names(
    store: feast.FeatureStore, rest: FeatureClient
) -> None:
    got = store.get_online_features(
        features=store.get_feature_service("consumer_small"),
        entity_rows={"consumer_id": [1, 2]},
        full_feature_names=True,
    ).to_dict()
    names = ["int_0", "float_00", "embedding_0"]
    assert set(got) == {"consumer_id", *(f"{GROUP}__{n}" for n in names)}
    expected = rest.get(ENTITY, [1, 2], names)
    for i, row in enumerate(expected.rows):
        for name, value in zip(names, row.values, strict=True):
            assert same(got[f"{GROUP}__{name}"][i], value)


def frame(rows: list[tuple[int, dict[str, object]]]) -> pd.DataFrame:
    """Rows as the frame Feast's SDK writes: the join key, every feature, the event time."""
    return pd.DataFrame(
        {
            "consumer_id": [i for i, _ in rows],
            **{name: [values[name] for _, values in rows] for name in ALL},
            "event_timestamp": [pd.Timestamp.now(tz="UTC")] * len(rows),
        }
    )


def test_feast_writes_land_where_v1_reads_them(
    store: feast.FeatureStore, rest: FeatureClient, server: ServingProcess
) -> None:
    rows = list(sample.rows(4, seed=7, start=101))
    store.write_to_online_store(GROUP, frame(rows[:2]))  # Feast's SDK: /write-to-online-store
    store.push(PUSH_SOURCE, frame(rows[2:]))  # Feast's push, online
    ids = [i for i, _ in rows]
    got = rest.get(ENTITY, ids, groups=[GROUP])
    for row, (_, values) in zip(got.rows, rows, strict=True):
        for name, value in zip(got.features, row.values, strict=True):
            assert same(value, values[name]), (row.id, name)
        assert {s.value for s in row.statuses} <= {"present", "missing"}
    # Feast's HTTP /push, as a non-Python client sends it; columns no group takes are named
    answer = httpx.post(
        f"{server.rest_url}/push",
        json={
            "push_source_name": PUSH_SOURCE,
            "df": {
                "consumer_id": [105],
                "int_0": [9],
                "event_timestamp": [datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")],
                "typo": [1],
            },
            "to": "online",
        },
    )
    assert answer.status_code == 200, answer.text
    assert orjson.loads(answer.content)["ignored_columns"] == ["typo"]
    assert rest.get(ENTITY, [105], ["int_0"]).rows[0].values == [9]
    bad = {"push_source_name": PUSH_SOURCE, "df": {"consumer_id": [105], "event_timestamp": ["x"]}}
    answer = httpx.post(f"{server.rest_url}/push", json=bad)
    assert answer.status_code == 400
    assert "not an RFC 3339 time" in answer.text


def test_errors_reach_feast_as_feast_exceptions(
    store: feast.FeatureStore, server: ServingProcess
) -> None:
    with pytest.raises(FeatureViewNotFoundException, match="no_such_view"):
        store.get_online_features(features=["no_such_view:x"], entity_rows=[{"consumer_id": 1}])
    with pytest.raises(FeatureViewNotFoundException, match="has no feature nope"):
        store.get_online_features(features=[f"{GROUP}:nope"], entity_rows=[{"consumer_id": 1}])
    with pytest.raises(FeastError, match="int ids"):
        store.get_online_features(features=refs(["int_0"]), entity_rows=[{"consumer_id": "x"}])
    base = server.rest_url
    for body, status, needle in [
        ({"entities": {"consumer_id": [1]}}, 400, "name the features"),
        (
            {"entities": {"consumer_id": [1, 2], "x": [1]}, "features": refs(["int_0"])},
            400,
            "differ",
        ),
        ({"entities": {"other_id": [1]}, "features": refs(["int_0"])}, 400, "consumer_id"),
        ({"entities": {"consumer_id": []}, "features": refs(["int_0"])}, 400, "no entity ids"),
        ({"push_source_name": "nope", "df": {"consumer_id": [1]}}, 422, "nope"),
    ]:
        path = "/push" if "push_source_name" in body else "/get-online-features"
        answer = httpx.post(base + path, json=body)
        assert answer.status_code == status, (body, answer.text)
        detail = orjson.loads(orjson.loads(answer.content))  # Feast's error: a JSON string
        assert set(detail) == {"module", "class", "message"}
        assert needle in detail["message"], detail
    offline = httpx.post(
        base + "/push",
        json={"push_source_name": PUSH_SOURCE, "df": {"consumer_id": [1]}, "to": "offline"},
    )
    assert offline.status_code == 400
    assert "online store" in offline.text
    assert httpx.get(base + "/health").status_code == 200


def test_the_sdk_sends_an_api_key_as_a_static_bearer_token(
    tmp_path: Path, server: ServingProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/feast.md: ``auth: {type: oidc, token_env_var: ...}`` carries a key."""
    read, admin = "read-key-0123456789", "admin-key-0123456789"
    env = {"FEATURE_SERVING_READ_KEYS": read, "FEATURE_SERVING_ADMIN_KEYS": admin}
    with ServingProcess(server.redis_url, registry=server.registry, env=env, grpc=False) as keyed:
        auth = "auth:\n  type: oidc\n  token_env_var: FEAST_API_KEY\n"
        fs = feast_store(tmp_path, keyed.rest_url, auth)
        monkeypatch.setenv("FEAST_API_KEY", read)
        got = fs.get_online_features(features=refs(["int_0"]), entity_rows=[{"consumer_id": 1}])
        assert got.to_dict()["int_0"] == [dict(sample.rows(2))[1]["int_0"]]
        with pytest.raises(FeastPermissionError, match="admin"):  # a read key cannot push
            fs.push(PUSH_SOURCE, frame(list(sample.rows(1, start=1))))
        monkeypatch.setenv("FEAST_API_KEY", "wrong-key-0123456789")
        with pytest.raises(FeastPermissionError):
            fs.get_online_features(features=refs(["int_0"]), entity_rows=[{"consumer_id": 1}])


TYPED = remote.NAME


def test_the_typed_online_store_answers_what_remote_answers(
    tmp_path: Path, store: feast.FeatureStore, server: ServingProcess
) -> None:
    """feature_store.feast.remote: the same request, values made from the declared types,
    the server's event timestamps kept."""
    typed = feast_store(tmp_path, server.rest_url, kind=TYPED)
    rows = [{"consumer_id": i} for i in IDS]
    got = typed.get_online_features(features=refs(ALL), entity_rows=rows)
    want = store.get_online_features(features=refs(ALL), entity_rows=rows)
    got_dict, want_dict = got.to_dict(), want.to_dict()
    assert list(got_dict) == list(want_dict)
    for name in want_dict:
        for a, b in zip(got_dict[name], want_dict[name], strict=True):
            assert same(a, b), name
    assert [list(r.statuses) for r in got.proto.results] == [
        list(r.statuses) for r in want.proto.results
    ]
    # the declared types: a Float32 feature is a float_val, an Int64 list an int64_list_val
    vectors = dict(zip(got.proto.metadata.feature_names.val, got.proto.results, strict=True))
    assert vectors["float_00"].values[0].WhichOneof("val") == "float_val"
    assert vectors["int_list_0"].values[0].WhichOneof("val") == "int64_list_val"
    assert vectors["embedding_0"].values[0].WhichOneof("val") == "float_list_val"
    stamps = got.to_dict(include_event_timestamps=True)["int_0__ts"]
    assert stamps[IDS.index(STALE_ID)] < stamps[0] - 40 * 3600  # written 48 h before
    assert stamps[IDS.index(999)] == 0
    service = typed.get_online_features(
        features=typed.get_feature_service("consumer_small"),
        entity_rows={"consumer_id": [1]},
        full_feature_names=True,
    ).to_dict()
    assert isinstance(service[f"{GROUP}__int_0"][0], int)
    with pytest.raises(FeatureViewNotFoundException):
        typed.get_online_features(features=["nope:x"], entity_rows=[{"consumer_id": 1}])
