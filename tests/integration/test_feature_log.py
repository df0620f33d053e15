"""The serving log against real servers (``serve --feature-log``): request ids given, made
and sent back; every answer's values in the log as answered, on REST, gRPC and Feast's API,
with the L1 on (native hits among them), off (native planned reads) and in Python alone;
sampling by request id, exact; a stalled or missing sink costs no lookup; a worker killed
loses only what it had not rolled; the Kafka sink, its log-sink job and a training set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pandas as pd
import pyarrow.dataset as ds
import pytest
from scrape import metric

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.kafka import EmbeddedKafka
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.registry import parse_registry
from feature_store.serving.feature_log import sampled, threshold
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP = sample.GROUP
EXTRA = """\
  store: {prefix: s, id_type: string, ttl: 7d, join_key: store_id}

feature_groups:
  consumer_recent:
    entity: consumer
    max_age: 1h
    features: {visits: int, score_now: double}
  store_daily:
    entity: store
    features: {rating: float, city: string}
"""
REGISTRY = sample.registry_text().replace("\nfeature_groups:\n", "\n" + EXTRA, 1)
N = 20
JSON = {"content-type": "application/json"}
GRPC_STATUSES = ("unspecified", "present", "missing", "stale", "error")
FEAST_STATUSES = {"PRESENT": "present", "NOT_FOUND": "missing", "OUTSIDE_MAX_AGE": "stale"}

REST_BODIES: list[dict[str, object]] = [
    {"entity_type": "consumer", "ids": [1, 2, 3], "groups": [GROUP]},
    {
        "entity_type": "consumer",
        "ids": [2, 4, 999_999],
        "features": ["float_00", "int_0", "int_list_0", "embedding_0", "visits", "score_now"],
    },
    {"entity_type": "store", "ids": ["s1", "s2", "nope"], "groups": ["store_daily"]},
]
GRPC_REQUESTS = [
    pb.GetFeaturesRequest(entity_type="consumer", int_ids=[5, 6], groups=[GROUP]),
    pb.GetFeaturesRequest(entity_type="consumer", int_ids=[4, 7], features=["float_01", "visits"]),
]
FEAST_BODIES: list[dict[str, object]] = [
    {
        "features": ["consumer_features:float_02", "consumer_recent:visits", "store_daily:city"],
        "entities": {"consumer_id": [1, 2], "store_id": ["s1", "s3"]},
        "full_feature_names": True,
    },
    {"features": ["consumer_features:int_1", "store_daily:rating"],
     "entities": {"consumer_id": [3], "store_id": ["s2"]}},
]  # fmt: skip


@pytest.fixture(scope="module")
def registry_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    path.write_text(REGISTRY)
    return path


@pytest.fixture(scope="module")
def written(redis_server: EmbeddedRedis, registry_path: Path) -> str:
    redis_url = redis_server.url
    registry = parse_registry(REGISTRY)
    now = time.time()
    with FeatureStore.connect(redis_url, registry) as store:
        store.write(GROUP, sample.rows(N))
        # even ids last written two hours ago: stale (max_age 1h)
        recent = [
            (i, {"visits": i, "score_now": i / 3}, now - (7200 if i % 2 == 0 else 10))
            for i in range(1, N)
        ]
        store.write("consumer_recent", recent)
        store.write(
            "store_daily", [(f"s{i}", {"rating": i / 4, "city": f"c{i}"}) for i in range(1, 5)]
        )
    return redis_url


def _server(url: str, registry: Path, log: str, *args: str, **env: str) -> ServingProcess:
    return ServingProcess(
        url,
        registry=registry,
        args=["--feature-log", log, "--feature-log-roll-seconds", "1", *args],
        env={"FEATURE_SERVING_WARM_START_KEYS": "0", "FEATURE_SERVING_SHADOW_FRACTION": "0", **env},
    )


def log_rows(root: Path, entity: str) -> list[dict[str, object]]:
    folder = root / f"entity_type={entity}"
    if not folder.exists():
        return []
    return list(ds.dataset(folder, partitioning="hive").to_table().to_pylist())


def wait_for_rows(root: Path, count: int, entities: tuple[str, ...] = ("consumer", "store")) -> int:
    deadline = time.monotonic() + 20
    while True:
        seen = sum(len(log_rows(root, e)) for e in entities)
        if seen >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


def _same(logged: object, answered: object) -> bool:
    if answered is None:
        return logged is None
    if isinstance(answered, list):
        return (
            isinstance(logged, list)
            and len(logged) == len(answered)
            and all(_same(a, b) for a, b in zip(logged, answered, strict=True))
        )
    if isinstance(answered, float) and isinstance(logged, float):
        return logged == answered or np.float32(logged) == np.float32(answered)
    return logged == answered


def _check_row(
    row: dict[str, object], columns: list[str], values: list[object], statuses: list[str]
) -> None:
    for column, value, status in zip(columns, values, statuses, strict=True):
        assert _same(row[column], value), (column, row[column], value)
        assert row[f"{column}__status"] == status, (column, row[f"{column}__status"], status)


def _grpc_value(v: pb.Value) -> object:
    kind = v.WhichOneof("kind")
    if kind is None:
        return None
    if kind in ("float_list", "int_list"):
        return list(getattr(v, kind).values)
    return getattr(v, kind)


MODES = {
    "l1_native": ((), {}),
    "no_l1_native": (("--no-cache",), {}),
    "python": ((), {"FEATURE_STORE_NATIVE": "off"}),
    "l1_python_hits": ((), {"FEATURE_SERVING_NATIVE_HITS": "off"}),
}


@pytest.fixture(scope="module", params=list(MODES))
def logged_server(
    request: pytest.FixtureRequest,
    written: str,
    registry_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, ServingProcess, Path]]:
    mode = request.param
    if mode != "python" and not native_enabled():
        pytest.skip("the extension is off")
    args, env = MODES[mode]
    root = tmp_path_factory.mktemp(f"log-{mode}")
    with _server(written, registry_path, f"file://{root}", *args, **env) as server:
        yield mode, server, root


def test_the_log_holds_every_answer_as_it_was_answered(
    logged_server: tuple[str, ServingProcess, Path],
) -> None:
    mode, server, root = logged_server
    answers: dict[str, tuple[str, object]] = {}
    expected = 0
    with (
        httpx.Client(base_url=server.rest_url) as http,
        grpc.insecure_channel(server.grpc_target) as channel,
    ):
        stub = FeatureServiceStub(channel)
        for round_ in range(3):  # the second and third: hits (on the front, with the L1)
            for i, body in enumerate(REST_BODIES):
                rid = f"{mode}-rest-{i}-{round_}"
                r = http.post(
                    "/v1/features/get",
                    content=orjson.dumps(body),
                    headers={**JSON, "x-request-id": rid},
                )
                assert r.status_code == 200
                assert r.headers["x-request-id"] == rid
                answers[rid] = ("rest", r.json())
                expected += len(body["ids"])  # type: ignore[arg-type]
            for i, req in enumerate(GRPC_REQUESTS):
                rid = f"{mode}-grpc-{i}-{round_}"
                reply, call = stub.GetFeatures.with_call(req, metadata=(("x-request-id", rid),))
                assert dict(call.initial_metadata())["x-request-id"] == rid
                answers[rid] = ("grpc", reply)
                expected += len(req.int_ids)
            for i, body in enumerate(FEAST_BODIES):
                rid = f"{mode}-feast-{i}-{round_}"
                r = http.post(
                    "/get-online-features",
                    content=orjson.dumps(body),
                    headers={**JSON, "x-request-id": rid},
                )
                assert r.status_code == 200
                assert r.headers["x-request-id"] == rid
                answers[rid] = ("feast", r.json())
                expected += sum(len(v) for v in body["entities"].values())  # type: ignore[attr-defined]
    assert wait_for_rows(root, expected) == expected
    rows: dict[str, list[dict[str, object]]] = defaultdict(list)
    for entity in ("consumer", "store"):
        for row in log_rows(root, entity):
            row["entity_type"] = entity
            rows[str(row["request_id"])].append(row)
    assert set(rows) == set(answers)
    registry = parse_registry(REGISTRY)
    for rid, (api, answer) in answers.items():
        logged = rows[rid]
        assert {r["api"] for r in logged} == {api}
        if api == "rest":
            assert isinstance(answer, dict)
            entity = answer["entity_type"]
            features = registry.features_of(entity)
            columns = [f"{features[n].group}__{n}" for n in answer["features"]]
            assert len(logged) == len(answer["results"])
            for row, result in zip(logged, answer["results"], strict=True):
                assert row["entity_id"] == result["id"]
                assert row["entity_type"] == entity
                _check_row(row, columns, result["values"], result["statuses"])
                for group, age in result["ages"].items():
                    stamp = row[f"{group}__event_time"]
                    if age is None:
                        assert stamp is None
                    else:
                        served = row["served_at"].timestamp()  # type: ignore[attr-defined]
                        assert abs(served - age - stamp.timestamp()) <= 1.5  # type: ignore[attr-defined]
        elif api == "grpc":
            assert isinstance(answer, pb.GetFeaturesResponse)
            features = registry.features_of(answer.entity_type)
            columns = [f"{features[n].group}__{n}" for n in answer.features]
            assert len(logged) == len(answer.rows)
            for row, result in zip(logged, answer.rows, strict=True):
                assert row["entity_id"] == result.id.int_id
                values = [_grpc_value(v) for v in result.values]
                _check_row(row, columns, values, [GRPC_STATUSES[s] for s in result.statuses])
        else:
            assert isinstance(answer, dict)
            names = answer["metadata"]["feature_names"]
            results = answer["results"]
            keys = [n for n in names if n in ("consumer_id", "store_id")]
            by_entity = {"consumer_id": "consumer", "store_id": "store"}
            for k, key in enumerate(keys):
                mine = [r for r in logged if r["entity_type"] == by_entity[key]]
                assert [r["entity_id"] for r in mine] == results[k]["values"]
                for j, name in enumerate(names[len(keys) :]):
                    group, _, feature = name.partition("__")
                    if not feature:
                        feature, group = name, None
                    entity = by_entity[key]
                    if feature not in registry.features_of(entity):
                        continue
                    group = registry.features_of(entity)[feature].group
                    column = results[len(keys) + j]
                    for i, row in enumerate(mine):
                        assert _same(row[f"{group}__{feature}"], column["values"][i])
                        assert (
                            row[f"{group}__{feature}__status"]
                            == FEAST_STATUSES[column["statuses"][i]]
                        )
    statuses = {r.get("consumer_recent__visits__status") for rs in rows.values() for r in rs}
    assert {"present", "stale", "missing"} <= statuses
    sources = {(r["api"], r["source"]) for rs in rows.values() for r in rs}
    if mode.startswith("no_l1"):
        assert {s for _, s in sources} == {"redis"}
    else:
        assert ("rest", "l1") in sources
        assert ("grpc", "l1") in sources
        assert ("rest", "redis") in sources
    if mode == "l1_native":  # the front answered hits itself, and they are in the log
        assert metric(server, "feature_serving_cache_front_hits_total") > 0
    if mode == "no_l1_native":
        assert metric(server, "feature_serving_front_lookups_total") > 0
    assert metric(server, "feature_serving_log_rows_total") == expected
    assert metric(server, "feature_serving_log_dropped_total") == 0


@pytest.mark.parametrize("native", [True, False])
def test_request_ids_are_given_back_or_made(
    written: str, registry_path: Path, tmp_path: Path, native: bool
) -> None:
    if native and not native_enabled():
        pytest.skip("the extension is off")
    env = {} if native else {"FEATURE_STORE_NATIVE": "off"}
    body = orjson.dumps(REST_BODIES[0])
    with (
        _server(written, registry_path, f"file://{tmp_path}", **env) as server,
        httpx.Client(base_url=server.rest_url) as http,
        grpc.insecure_channel(server.grpc_target) as channel,
    ):
        stub = FeatureServiceStub(channel)
        made = set()
        for _i in range(20):  # hits from the second on
            r = http.post("/v1/features/get", content=body, headers=JSON)
            made.add(r.headers["x-request-id"])
            _, call = stub.GetFeatures.with_call(GRPC_REQUESTS[0])
            made.add(dict(call.initial_metadata())["x-request-id"])
        assert len(made) == 40
        assert all(len(m) == 32 for m in made)
        for bad in ("x" * 129, "has space"):
            r = http.post("/v1/features/get", content=body, headers={**JSON, "x-request-id": bad})
            assert r.headers["x-request-id"] not in (bad, "")
            assert len(r.headers["x-request-id"]) == 32
            _, call = stub.GetFeatures.with_call(
                GRPC_REQUESTS[0], metadata=(("x-request-id", bad),)
            )
            assert dict(call.initial_metadata())["x-request-id"] != bad
        # an error answer carries the id too
        r = http.post(
            "/v1/features/get",
            content=b'{"entity_type":"nope","ids":[1]}',
            headers={**JSON, "x-request-id": "bad-1"},
        )
        assert r.status_code == 400
        assert r.headers["x-request-id"] == "bad-1"
        r = http.post("/get-online-features", content=orjson.dumps(FEAST_BODIES[1]), headers=JSON)
        assert len(r.headers["x-request-id"]) == 32


def test_sampling_logs_exactly_the_sampled_requests(
    written: str, registry_path: Path, tmp_path: Path
) -> None:
    fraction = 0.3
    limit = threshold(fraction)
    with (
        _server(
            written, registry_path, f"file://{tmp_path}", "--feature-log-sample", str(fraction)
        ) as server,
        httpx.Client(base_url=server.rest_url) as http,
        grpc.insecure_channel(server.grpc_target) as channel,
    ):
        stub = FeatureServiceStub(channel)
        sent = []
        for i in range(300):
            rid = f"sample-{i}"
            if i % 2:
                http.post(
                    "/v1/features/get",
                    content=orjson.dumps(REST_BODIES[0]),
                    headers={**JSON, "x-request-id": rid},
                )
            else:
                stub.GetFeatures(GRPC_REQUESTS[0], metadata=(("x-request-id", rid),))
            sent.append(rid)
        chosen = {rid for rid in sent if sampled(rid, limit)}
        expected = sum(3 if int(rid.split("-")[1]) % 2 else 2 for rid in chosen)
        assert wait_for_rows(tmp_path, expected, ("consumer",)) == expected
        time.sleep(1.5)  # nothing more comes
        logged = {str(r["request_id"]) for r in log_rows(tmp_path, "consumer")}
        assert logged == chosen
        assert 0.2 < len(chosen) / len(sent) < 0.4


def _drops(server: ServingProcess) -> float:
    return metric(server, "feature_serving_log_dropped_total")


def test_a_stalled_sink_drops_rows_and_costs_no_lookup(
    written: str, registry_path: Path, tmp_path: Path
) -> None:
    """The log thread blocks opening its next file (a FIFO nobody reads, where the file
    would go): the queues fill, rows are dropped and counted, lookups go on."""
    with (
        _server(
            written,
            registry_path,
            f"file://{tmp_path}",
            FEATURE_SERVING_FEATURE_LOG_QUEUE_BYTES="20000",
        ) as server,
        httpx.Client(base_url=server.rest_url) as http,
    ):
        assert server.process is not None
        r = http.post("/v1/features/get", content=orjson.dumps(REST_BODIES[0]), headers=JSON)
        prefix = r.headers["x-request-id"][:8]
        now = time.gmtime()
        folder = tmp_path / "entity_type=consumer" / time.strftime("date=%Y-%m-%d/hour=%H", now)
        folder.mkdir(parents=True, exist_ok=True)
        fifo = folder / f".part-{prefix}{server.process.pid}-000000.parquet.tmp"
        os.mkfifo(fifo)
        time.sleep(2.5)  # the roll is due: the log thread opens the FIFO and waits
        started = time.monotonic()
        codes = [
            http.post(
                "/v1/features/get", content=orjson.dumps(REST_BODIES[0]), headers=JSON
            ).status_code
            for _ in range(300)
        ]
        took = time.monotonic() - started
        assert codes == [200] * 300
        assert _drops(server) > 0

        # let the thread go: read the FIFO until the writer closes it
        def drain() -> None:
            with open(fifo, "rb") as f:
                f.read()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive()
        print(f"300 lookups in {took:.2f} s with the sink stalled")


def test_a_sink_that_is_gone_drops_rows_and_comes_back(
    written: str, registry_path: Path, tmp_path: Path
) -> None:
    root = tmp_path / "log"
    with (
        _server(written, registry_path, f"file://{root}") as server,
        httpx.Client(base_url=server.rest_url) as http,
    ):
        body = orjson.dumps(REST_BODIES[0])
        assert http.post("/v1/features/get", content=body, headers=JSON).status_code == 200
        assert wait_for_rows(root, 3, ("consumer",)) == 3
        os.rename(root, tmp_path / "moved")
        root.write_text("not a directory")  # where the log was: its files cannot be made
        for _ in range(10):
            assert http.post("/v1/features/get", content=body, headers=JSON).status_code == 200
        deadline = time.monotonic() + 10
        while (
            metric(server, "feature_serving_log_sink_errors_total") == 0
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert metric(server, "feature_serving_log_sink_errors_total") > 0
        assert metric(server, 'feature_serving_log_dropped_total{reason="sink_error"}') == 30
        root.unlink()
        os.rename(tmp_path / "moved", root)
        assert http.post("/v1/features/get", content=body, headers=JSON).status_code == 200
        assert wait_for_rows(root, 6, ("consumer",)) == 6


def test_a_killed_worker_loses_only_what_it_had_not_rolled(
    written: str, registry_path: Path, tmp_path: Path
) -> None:
    server = _server(written, registry_path, f"file://{tmp_path}").start()
    try:
        body = orjson.dumps(REST_BODIES[0])
        with httpx.Client(base_url=server.rest_url) as http:
            for i in range(50):
                http.post(
                    "/v1/features/get",
                    content=body,
                    headers={**JSON, "x-request-id": f"before-{i}"},
                )
            assert wait_for_rows(tmp_path, 150, ("consumer",)) == 150  # rolled: in place
            for i in range(50):
                http.post(
                    "/v1/features/get", content=body, headers={**JSON, "x-request-id": f"after-{i}"}
                )
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
    finally:
        server.stop()
    rows = log_rows(tmp_path, "consumer")  # the complete files read whole: none is partial
    before = [r for r in rows if str(r["request_id"]).startswith("before-")]
    after = [r for r in rows if str(r["request_id"]).startswith("after-")]
    assert len(before) == 150
    # pandas reads the log as it is: the partitions, the dictionary columns as categoricals
    frame = pd.read_parquet(tmp_path / "entity_type=consumer")
    assert len(frame) == len(rows)
    assert set(frame["api"].astype(str)) == {"rest"}
    assert {"date", "hour", f"{GROUP}__float_00"} <= set(frame.columns)
    assert len(after) <= 150
    assert len(after) % 3 == 0


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    with EmbeddedKafka(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


def test_the_kafka_log_through_log_sink_into_a_training_set(
    written: str, registry_path: Path, tmp_path: Path, kafka: EmbeddedKafka
) -> None:
    topic = "served-features"
    with (
        _server(written, registry_path, f"kafka://{kafka.bootstrap}/{topic}") as server,
        httpx.Client(base_url=server.rest_url) as http,
    ):
        for i in range(20):
            http.post(
                "/v1/features/get",
                content=orjson.dumps(REST_BODIES[1]),
                headers={**JSON, "x-request-id": f"k-{i}"},
            )
            http.post(
                "/get-online-features",
                content=orjson.dumps(FEAST_BODIES[0]),
                headers={**JSON, "x-request-id": f"kf-{i}"},
            )
        deadline = time.monotonic() + 30
        while (
            metric(server, "feature_serving_log_rows_total") < 140 and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert metric(server, "feature_serving_log_rows_total") == 140
    out = tmp_path / "log"
    cli = [sys.executable, "-m", "feature_store.cli"]
    spark = [
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
    ]
    done = subprocess.run(
        [*cli, "log-sink", "--registry", str(registry_path), "--topic", topic,
         "--bootstrap-servers", kafka.bootstrap, "--output", str(out),
         "--checkpoint", str(tmp_path / "cp"), "--available-now", *spark],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    consumers, stores = log_rows(out, "consumer"), log_rows(out, "store")
    assert len(consumers) == 20 * 3 + 20 * 2
    assert len(stores) == 20 * 2
    # keyed by entity id: a request's rows may come back in another order
    mine = sorted((r for r in consumers if r["request_id"] == "k-3"), key=lambda r: r["entity_id"])
    assert [r["entity_id"] for r in mine] == [2, 4, 999_999]
    assert mine[2][f"{GROUP}__float_00__status"] == "missing"
    assert [r["consumer_recent__visits__status"] for r in mine] == ["stale", "stale", "missing"]
    # a training set from it: one label by request, one point in time, one too early
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "consumer_id,event_timestamp,label,request_id\n"
        "2,2100-01-01T00:00:00Z,1,k-3\n"
        "4,2100-01-01T00:00:00Z,0,\n"
        "4,2000-01-01T00:00:00Z,1,\n"
    )
    done = subprocess.run(
        [*cli, "training-set", "--registry", str(registry_path), "--labels", str(labels),
         "--log", str(out), "--output", str(tmp_path / "training"), *spark],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 joined to the request they name, 1 to the newest vector" in done.stdout
    assert "1 with no vector" in done.stdout
    table = ds.dataset(tmp_path / "training").to_table().to_pylist()
    by_label = {(r["consumer_id"], r["event_timestamp"].year): r for r in table}
    early, named, timed = by_label[4, 2000], by_label[2, 2100], by_label[4, 2100]
    assert early["served_at"] is None
    assert early[f"{GROUP}__float_00"] is None
    assert named["served_request_id"] == "k-3"
    assert named["consumer_recent__visits"] == 2
    assert str(timed["served_request_id"]).startswith("k-")
    assert timed["consumer_recent__visits"] == 4
    assert timed["consumer_recent__visits__status"] == "stale"
