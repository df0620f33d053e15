"""``feature-store skew`` on what a real server logged: a group written to Redis as the
nightly job writes it, served with the log on, and each cause of skew injected into one
entity (a push write around the pipeline, a snapshot in the source that never reached
Redis, a float written by a wrong codec, a value written wrong, an entity never written).
The report must find exactly those entities, each with its cause, and nothing else; and a
value served past the group's max_age is told as such."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import redis
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from feature_store.embedded import EmbeddedRedis
from feature_store.layout import IdType, entity_key, feature_field
from feature_store.registry import parse_registry
from feature_store.serving.feature_log import arrow_schema
from feature_store.serving.process import ServingProcess
from feature_store.skew import SkewJob, measure_skew
from feature_store.store import FeatureStore
from feature_store.training_sources import SourceSpec

REGISTRY = """\
version: 1
entities:
  consumer: {prefix: skew, id_type: int, ttl: 7d, join_key: consumer_id}
feature_groups:
  profile:
    entity: consumer
    max_age: 1h
    features: {f: float, d: double, n: int, e: embedding(3), s: string}
"""
N = 12
# the entities each cause is injected into
AROUND, OLDER, ENCODED, WRONG, UNWRITTEN = 3, 5, 7, 8, 9
registry = parse_registry(REGISTRY, source="test")


def values(i: int, version: int = 0) -> dict[str, object]:
    return {"f": i / 10 + version, "d": i / 3, "n": i, "e": [i, 0.5, -1.0], "s": f"s{i}"}


def write_source(path: Path, rows: list[tuple[int, float, dict[str, object]]]) -> None:
    columns: dict[str, list[object]] = {"consumer_id": [], "event_timestamp": []}
    for i, at, vals in rows:
        columns["consumer_id"].append(i)
        columns["event_timestamp"].append(datetime.fromtimestamp(at, UTC))
        for name, value in vals.items():
            columns.setdefault(name, []).append(value)
    pq.write_table(pa.table(columns), path)


def test_skew_finds_each_injected_cause_in_exactly_its_entity(
    spark: SparkSession, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    path = tmp_path / "features.yaml"
    path.write_text(REGISTRY)
    now = int(time.time())  # whole seconds: the log's event times are
    snapshot, newer = now - 900, now - 300
    written = [(i, values(i), snapshot) for i in range(1, N + 1) if i != UNWRITTEN]
    with FeatureStore.connect(redis_server.url, registry) as store:
        store.write("profile", written)  # as the nightly job writes its snapshot
    # the source: the snapshot, and a newer one of OLDER's that never reached Redis
    write_source(
        tmp_path / "source.parquet",
        [(i, snapshot, values(i)) for i in range(1, N + 1)] + [(OLDER, newer, values(OLDER, 1))],
    )
    # ENCODED's float written with its float32's full digits (0.7 as 0.699999988...), where
    # the codec writes the shortest text; WRONG's as another value; their write times
    # left as they were
    client = redis.Redis.from_url(redis_server.url)
    full = repr(struct.unpack("<f", struct.pack("<f", ENCODED / 10))[0]).encode()
    client.hset(entity_key("skew", IdType.INT, ENCODED), feature_field("f"), full)
    client.hset(entity_key("skew", IdType.INT, WRONG), feature_field("f"), b"99.5")
    log = tmp_path / "log"
    with ServingProcess(
        redis_server.url,
        registry=path,
        args=["--feature-log", f"file://{log}", "--feature-log-roll-seconds", "1"],
        env={"FEATURE_SERVING_WARM_START_KEYS": "0"},
    ) as server, httpx.Client(base_url=server.rest_url) as http:  # fmt: skip
        pushed = http.post(
            "/v1/features/write",
            content=orjson.dumps(
                {"group": "profile", "rows": [{"id": AROUND, "values": {"f": 42.0}}]}
            ),
            headers={"content-type": "application/json"},
        )
        assert pushed.status_code == 200, pushed.text
        for _ in range(2):  # a miss, then a hit
            answer = http.post(
                "/v1/features/get",
                json={
                    "entity_type": "consumer",
                    "ids": list(range(1, N + 1)),
                    "groups": ["profile"],
                },
            )
            assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 20
        folder = log / "entity_type=consumer"
        while time.monotonic() < deadline:
            if folder.exists() and ds.dataset(folder, partitioning="hive").count_rows() >= 2 * N:
                break
            time.sleep(0.2)
    report = measure_skew(
        spark,
        SkewJob(path, str(log), (SourceSpec("profile", str(tmp_path / "source.parquet")),)),
    )
    group = report.groups["profile"]
    assert group.rows == 2 * N
    found: dict[str, set[int]] = {}
    for m in report.mismatches:
        found.setdefault(str(m["cause"]), set()).add(int(m["entity_id"]))  # type: ignore[call-overload]
    assert found == {
        "newer_than_source": {AROUND},
        "older_than_source": {OLDER},
        "encoding": {ENCODED},
        "value_differs": {WRONG},
        "not_in_store": {UNWRITTEN},
    }
    later = SkewJob(
        path,
        str(log),
        (SourceSpec("profile", str(tmp_path / "source.parquet")),),
        start=datetime.fromtimestamp(now + 3600, UTC),  # --from: after every lookup
    )
    assert measure_skew(spark, later).groups["profile"].rows == 0
    f = group.features["f"]
    # per lookup: AROUND's, OLDER's, ENCODED's and WRONG's f differ; UNWRITTEN's five
    # features are served missing where the source has them
    assert (f.mismatched, f.missing_when_source_has, f.equal) == (8, 2, 2 * (N - 5))
    assert group.features["d"].equal == 2 * (N - 1)
    assert group.causes == {
        "newer_than_source": 2,
        "older_than_source": 2,
        "not_in_store": 2 * 5,
        "value_differs": 2,
        "past_max_age": 0,
        "encoding": 2,
    }
    assert f.smape is not None
    assert f.smape > 0
    # the command: the report written, the summary printed, and --fail-above's exit code
    out = tmp_path / "report.json"
    command = [str(Path(sys.executable).parent / "feature-store"), "skew", "--registry"]
    command += [str(path), "--log", str(log), "--report", str(out), "--master", "local[1]"]
    command += ["--source", f"profile={tmp_path / 'source.parquet'}", "--fail-above", "0.01"]
    command += ["--metrics-file", str(tmp_path / "skew.prom")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr  # 18 of 120 values differ
    assert "above 1.000000%" in run.stderr
    assert "| profile | f | 24 | 14 | 8 | 0 | 2 | 0 |" in run.stdout
    assert orjson.loads(out.read_bytes())["differing"] == report.differing == 18
    gauges = {
        (sample_.name, tuple(sorted(sample_.labels.items()))): sample_.value
        for family in text_string_to_metric_families((tmp_path / "skew.prom").read_text())
        for sample_ in family.samples
    }
    assert gauges[("feature_skew_differing_ratio", (("group", "profile"),))] == 18 / 120
    cause = (("cause", "encoding"), ("group", "profile"))
    assert gauges[("feature_skew_differing", cause)] == 2
    kind = (("feature", "f"), ("group", "profile"), ("kind", "mismatched"))
    assert gauges[("feature_skew_values", kind)] == 8
    assert gauges[("feature_skew_last_run_timestamp_seconds", ())] >= now


def test_a_value_served_past_max_age_is_told_as_such(spark: SparkSession, tmp_path: Path) -> None:
    """What the server never does (it marks such a value stale), written into a log by hand:
    a value served as present two hours after its write, in a group of max_age 1h."""
    path = tmp_path / "features.yaml"
    path.write_text(REGISTRY)
    served, written = datetime(2026, 11, 1, 12, tzinfo=UTC), datetime(2026, 11, 1, 10, tzinfo=UTC)
    schema = arrow_schema(registry, registry.entities["consumer"])
    row = {
        "request_id": "r1",
        "served_at": served,
        "api": "rest",
        "entity_id": 1,
        "source": "l1",
        "profile__f": 0.5,
        "profile__f__status": "present",
        "profile__event_time": written,
    }
    folder = tmp_path / "log" / "entity_type=consumer" / "date=2026-11-01" / "hour=12"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=schema), folder / "part-0.parquet")
    # a source without the feature s: not compared, and said so
    lacking = {k: v for k, v in values(1).items() if k != "s"}
    write_source(tmp_path / "source.parquet", [(1, written.timestamp(), lacking)])
    report = measure_skew(
        spark,
        SkewJob(
            path, str(tmp_path / "log"), (SourceSpec("profile", str(tmp_path / "source.parquet")),)
        ),
    )
    assert [(m["feature"], m["cause"]) for m in report.mismatches] == [("f", "past_max_age")]
    assert report.groups["profile"].features["f"].served_missing_in_source == 1
    assert report.groups["profile"].not_in_source == ["s"]
    assert "s" not in report.groups["profile"].features
