"""The REST API against a real `feature-store serve` process and a real redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from feature_store import sample
from feature_store.client import (
    AsyncFeatureClient,
    FeatureClient,
    ServingRequestError,
)
from feature_store.embedded import EmbeddedRedis
from feature_store.serialization.codecs import encode_float32
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
NAMES = [f.name for f in sample.registry().groups[GROUP].features]


@pytest.fixture(scope="module")
def server(redis_server: EmbeddedRedis) -> Iterator[ServingProcess]:
    # No L1 here: every test flushes Redis, and this module checks the API contract.
    with ServingProcess(
        redis_server.url,
        args=["--no-cache", "--max-entities", "50"],
        env={"FEATURE_SERVING_MAX_BODY_BYTES": "4096"},
        grpc=False,
    ) as s:
        yield s


@pytest.fixture
def http(server: ServingProcess, redis_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.rest_url, timeout=10) as client:
        yield client


def write_sample(redis_url: str, n: int = 20, now: float | None = None) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(n), event_time=now)


def expected(redis_url: str, ids: list[int], features: list[str]) -> list[list[object]]:
    """The stored values as a JSON reader gets them from an answer: float lists in their
    shortest float32 decimals, which parse to the double nearest to that decimal."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        result = store.read(ENTITY, ids, features=features)
    return [[as_read(v) for v in row.values] for row in result.rows]


def as_read(value: object) -> object:
    if isinstance(value, list) and value and isinstance(value[0], float):
        return [float(encode_float32(x)) for x in value]
    return value


def test_get_subset_matches_the_store_and_marks_missing(http: httpx.Client, redis_url: str) -> None:
    write_sample(redis_url)
    features = ["float_00", "consumer_features:int_1", "int_list_2", "embedding_1"]
    r = http.post(
        "/v1/features/get",
        json={"entity_type": ENTITY, "ids": [3, 7, 12345], "features": features},
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["entity_type"] == ENTITY
    assert doc["features"] == ["float_00", "int_1", "int_list_2", "embedding_1"]
    want = expected(redis_url, [3, 7], doc["features"])
    assert [row["values"] for row in doc["results"][:2]] == want
    assert [row["id"] for row in doc["results"]] == [3, 7, 12345]
    assert doc["results"][0]["statuses"] == ["present"] * 4
    assert isinstance(doc["results"][0]["values"][3], list)
    assert len(doc["results"][0]["values"][3]) == sample.EMBEDDING_DIM
    assert 0 <= doc["results"][0]["ages"][GROUP] < 60
    missing = doc["results"][2]
    assert missing["values"] == [None] * 4
    assert missing["statuses"] == ["missing"] * 4
    assert missing["ages"] == {GROUP: None}


def test_get_by_group_returns_every_feature_in_registry_order(
    http: httpx.Client, redis_url: str
) -> None:
    write_sample(redis_url)
    r = http.post("/v1/features/get", json={"entity_type": ENTITY, "ids": [1], "groups": [GROUP]})
    assert r.status_code == 200
    doc = r.json()
    names = [f.name for f in sample.registry().groups[GROUP].features]
    assert doc["features"] == names
    assert doc["results"][0]["values"] == expected(redis_url, [1], names)[0]


def test_values_older_than_max_age_read_stale(http: httpx.Client, redis_url: str) -> None:
    write_sample(redis_url, n=3, now=time.time() - 3 * 86400)  # max_age is 36h
    r = http.post(
        "/v1/features/get", json={"entity_type": ENTITY, "ids": [0], "features": ["float_01"]}
    )
    row = r.json()["results"][0]
    assert row["statuses"] == ["stale"]
    assert row["values"][0] is not None
    assert row["ages"][GROUP] >= 3 * 86400
    whole = http.post(
        "/v1/features/get", json={"entity_type": ENTITY, "ids": [0, 99], "groups": [GROUP]}
    ).json()["results"]
    assert whole[0]["statuses"] == ["stale"] * 50
    assert whole[0]["values"] == expected(redis_url, [0], [f"{GROUP}:{n}" for n in NAMES])[0]
    assert whole[1]["statuses"] == ["missing"] * 50
    assert whole[1]["values"] == [None] * 50
    assert whole[1]["ages"] == {GROUP: None}


def test_push_write_then_read_and_null_removes(http: httpx.Client, redis_url: str) -> None:
    write_sample(redis_url, n=2)
    r = http.post(
        "/v1/features/write",
        json={
            "group": GROUP,
            "rows": [
                {"id": 1, "values": {"float_00": 0.25, "int_0": None, "embedding_0": [0.5] * 32}}
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "entities": 1,
        "values_written": 2,
        "values_removed": 1,
        "skipped": 0,
        "skipped_ids": [],
    }
    got = http.post(
        "/v1/features/get",
        json={"entity_type": ENTITY, "ids": [1], "features": ["float_00", "int_0", "embedding_0"]},
    ).json()["results"][0]
    assert got["values"] == [0.25, None, [0.5] * 32]
    assert got["statuses"] == ["present", "missing", "present"]


def test_push_writes_are_ordered_by_event_time(http: httpx.Client) -> None:
    def write(*rows: dict[str, object]) -> dict[str, object]:
        r = http.post("/v1/features/write", json={"group": GROUP, "rows": list(rows)})
        assert r.status_code == 200, r.text
        answer: dict[str, object] = r.json()
        return answer

    assert write(
        {"id": 1, "values": {"int_0": 5}, "event_time": "2026-01-01T00:00:00Z"},
        {"id": 2, "values": {"int_0": 6}, "event_time": 1767225600.5},
        {"id": 3, "values": {"int_0": 7}},  # now
    ) == {"entities": 3, "values_written": 3, "values_removed": 0, "skipped": 0, "skipped_ids": []}
    assert write(
        {"id": 1, "values": {"int_0": None}, "event_time": "2025-12-31T23:59:59+00:00"},  # older
        {"id": 2, "values": {"int_0": 60}, "event_time": 1767225600.5},  # equal: a correction
        {"id": 3, "values": {"int_0": 70}, "event_time": 1767225600},  # older than "now"
    ) == {
        "entities": 1,
        "values_written": 1,
        "values_removed": 0,
        "skipped": 2,
        "skipped_ids": [1, 3],
    }
    got = http.post(
        "/v1/features/get", json={"entity_type": ENTITY, "ids": [1, 2, 3], "features": ["int_0"]}
    ).json()["results"]
    assert [r["values"] for r in got] == [[5], [60], [7]]
    # the age is the age of the data: from the event time, not from the write
    assert got[0]["ages"][GROUP] >= time.time() - 1767225600 - 5
    assert got[2]["ages"][GROUP] <= 5


BAD_GETS = [
    (b"{", 400, "malformed_body", "not valid JSON"),
    (b"[1, 2]", 400, "malformed_body", "JSON object"),
    (
        b'{"entity_type": "consumer", "groups": ["consumer_features"]}',
        400,
        "malformed_body",
        "'ids'",
    ),
    (
        b'{"entity_type": "consumer", "ids": 5, "groups": ["consumer_features"]}',
        400,
        "malformed_body",
        "'ids' must be an array",
    ),
    (b'{"ids": [1], "groups": ["consumer_features"]}', 400, "malformed_body", "'entity_type'"),
    (
        b'{"entity_type": "consumer", "ids": [], "groups": ["consumer_features"]}',
        400,
        "empty_batch",
        "no entity ids",
    ),
    (
        orjson.dumps({"entity_type": "consumer", "ids": list(range(51)), "groups": [GROUP]}),
        413,
        "batch_too_large",
        "51 entity ids is more than the limit of 50",
    ),
    (
        b'{"entity_type": "consumer", "ids": ["abc"], "groups": ["consumer_features"]}',
        400,
        "invalid_id",
        "has int ids",
    ),
    (
        b'{"entity_type": "consumer", "ids": [true], "groups": ["consumer_features"]}',
        400,
        "invalid_id",
        "has int ids",
    ),
    (
        b'{"entity_type": "consumer", "ids": [1.5], "groups": ["consumer_features"]}',
        400,
        "invalid_id",
        "has int ids",
    ),
    (
        b'{"entity_type": "consumer", "ids": [1], "features": ["float_00", "nope"]}',
        400,
        "unknown_feature",
        "'nope'",
    ),
    (
        b'{"entity_type": "consumer", "ids": [1], "groups": ["nope"]}',
        400,
        "unknown_feature",
        "group 'nope'",
    ),
    (
        b'{"entity_type": "shop", "ids": [1], "features": ["float_00"]}',
        400,
        "unknown_entity_type",
        "'shop'",
    ),
    (b'{"entity_type": "consumer", "ids": [1], "feature": []}', 400, "malformed_body", "feature"),
    (b'{"entity_type": "consumer", "ids": [1], "groups": null}', 400, "malformed_body", "groups"),
    (
        b'{"entity_type": "consumer", "ids": [1], "features": "float_00"}',
        400,
        "malformed_body",
        "'features' must be an array",
    ),
    (
        b'{"entity_type": "consumer", "ids": [1], "features": [1]}',
        400,
        "malformed_body",
        "array of strings",
    ),
    (
        b'{"entity_type": "consumer", "ids": [1], "groups": ["consumer_features"], '
        b'"bypass_cache": "yes"}',
        400,
        "malformed_body",
        "'bypass_cache'",
    ),
]


@pytest.mark.parametrize(("body", "status", "code", "text"), BAD_GETS)
def test_bad_get_requests_get_a_4xx_naming_the_problem(
    http: httpx.Client, body: bytes, status: int, code: str, text: str
) -> None:
    r = http.post("/v1/features/get", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    assert text in error["message"]


BAD_WRITES = [
    ({"group": "nope", "rows": [{"id": 1, "values": {"float_00": 1.0}}]}, "unknown_feature"),
    ({"group": GROUP, "rows": []}, "empty_batch"),
    ({"group": GROUP, "rows": [{"values": {}}]}, "malformed_body"),
    ({"group": GROUP, "rows": [{"id": 1, "values": [1]}]}, "malformed_body"),
    ({"group": GROUP, "rows": [{"id": "x", "values": {"float_00": 1.0}}]}, "invalid_id"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {"nope": 1.0}}]}, "bad_request"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {"float_00": "high"}}]}, "invalid_value"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {"embedding_0": [1.0, 2.0]}}]}, "invalid_value"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {"int_0": 2**70}}]}, "invalid_value"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {}, "event_time": "soon"}]}, "bad_request"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {}, "event_time": -5}]}, "bad_request"),
    ({"group": GROUP, "rows": [{"id": 1, "values": {}, "event_time": 4e9}]}, "bad_request"),
    (
        {"group": GROUP, "rows": [{"id": 1, "values": {}, "event_time": "2026-01-01T00:00:00"}]},
        "bad_request",
    ),
    ({"group": GROUP, "rows": [{"id": 1, "values": {}, "event_time": [1]}]}, "bad_request"),
]


@pytest.mark.parametrize(("body", "code"), BAD_WRITES)
def test_bad_writes_get_a_400_and_write_nothing(
    http: httpx.Client, redis_url: str, body: dict[str, object], code: str
) -> None:
    r = http.post("/v1/features/write", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        assert store.client.dbsize() == 0


def test_unknown_route_and_method_use_the_error_format(http: httpx.Client) -> None:
    r = http.get("/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    r = http.get("/v1/features/get")
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_registry_health_readiness_metrics_openapi(http: httpx.Client) -> None:
    reg = http.get("/v1/registry").json()
    assert reg["entities"][0]["name"] == ENTITY
    group = reg["groups"][0]
    assert group["name"] == GROUP
    assert group["max_age_seconds"] == 36 * 3600
    types = {f["name"]: (f["type"], f["dim"]) for f in group["features"]}
    assert types["embedding_0"] == ("embedding", 32)
    assert types["int_list_0"] == ("int_list", None)
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["redis"] == "ok"
    http.post("/v1/features/get", json={"entity_type": ENTITY, "ids": [1], "groups": [GROUP]})
    metrics = http.get("/metrics").text
    assert 'feature_serving_request_seconds_count{api="rest",code="200",method="get"}' in metrics
    assert "feature_serving_circuit_state" in metrics
    openapi = http.get("/openapi.json").json()
    assert "/v1/features/get" in openapi["paths"]
    assert "GetFeaturesRequest" in openapi["components"]["schemas"]


def test_sync_and_async_clients_return_typed_results(
    server: ServingProcess, redis_url: str
) -> None:
    write_sample(redis_url, n=5)
    with FeatureClient(server.rest_url, timeout=5) as client:
        result = client.get(ENTITY, [2, 999], features=["float_03", "int_list_0"])
        assert result.features == ("float_03", "int_list_0")
        assert result.rows[0].values == expected(redis_url, [2], ["float_03", "int_list_0"])[0]
        assert [s.value for s in result.rows[1].statuses] == ["missing", "missing"]
        with pytest.raises(ServingRequestError) as err:
            client.get(ENTITY, ["x"], features=["float_03"])
        assert err.value.code == "invalid_id"
        assert client.registry()["groups"]  # type: ignore[index]


async def test_async_client(server: ServingProcess, redis_url: str) -> None:
    write_sample(redis_url, n=5)
    async with AsyncFeatureClient(server.rest_url, timeout=5) as client:
        result = await client.get(ENTITY, [4], groups=[GROUP])
        assert result.as_dicts()[0]["int_0"] == sample.features(4)["int_0"]
        stats = await client.write(GROUP, [(4, {"int_0": 7})])
        assert stats.values_written == 1
        again = await client.get(ENTITY, [4], features=["int_0"])
        assert again.rows[0].values == [7]


def test_naming_no_features_reads_every_feature_of_the_entity_type(http: httpx.Client) -> None:
    r = http.post("/v1/features/get", json={"entity_type": "consumer", "ids": [1]})
    assert r.status_code == 200, r.text
    group = sample.registry().groups[sample.GROUP]
    assert r.json()["features"] == [f.name for f in group.features]
    assert r.json()["types"] == [f.type.value for f in group.features]
