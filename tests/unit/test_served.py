"""The serving log's pure parts (feature_store/serving/feature_log/): request ids, sampling
(Python's and the extension's the same), the sink URL, and the file sink's rolling with
real parquet files: nothing visible before a file is complete, then all of it."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from feature_store import sample
from feature_store.errors import ConfigError
from feature_store.native import native_enabled
from feature_store.serving.config import ServingSettings, parse_target
from feature_store.serving.feature_log import FeatureLog, arrow_schema
from feature_store.serving.feature_log.ids import EVERY, given_id, sampled, threshold
from feature_store.serving.feature_log.sinks import ROW_GROUP, FileSink, LogMetrics

GROUP = sample.GROUP


def test_a_clients_request_id_is_kept_when_it_is_one_we_keep() -> None:
    assert given_id("abc-123_XYZ.1") == "abc-123_XYZ.1"
    assert given_id("x" * 128) == "x" * 128
    for bad in (None, "", "x" * 129, "a b", "é", "tab\there", "new\nline"):
        assert given_id(bad) is None, bad


def test_made_request_ids_are_unique_and_carry_the_workers_prefix() -> None:
    log = FeatureLog(sample.registry())
    other = FeatureLog(sample.registry())
    made = [log.request_id(None) for _ in range(1000)] + [other.request_id(None)]
    assert len(set(made)) == len(made)
    assert all(m.startswith(log.prefix) and len(m) == 32 for m in made[:-1])
    assert log.request_id("given-1") == "given-1"
    assert log.request_id("not one we keep") != "not one we keep"


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_sampling_takes_the_fraction_of_many_requests(fraction: float) -> None:
    limit = threshold(fraction)
    n = 200_000
    taken = sum(sampled(f"{i:032x}", limit) for i in range(n))
    if fraction in (0.0, 1.0):
        assert taken == n * fraction
        return
    sigma = math.sqrt(n * fraction * (1 - fraction))
    assert abs(taken - n * fraction) < 5 * sigma, (taken, n * fraction)


def test_sampling_is_decided_by_the_request_id_alone() -> None:
    limit = threshold(0.3)
    ids = [f"req-{i}" for i in range(1000)]
    assert [sampled(i, limit) for i in ids] == [sampled(i, limit) for i in ids]
    assert threshold(1.0) == EVERY
    assert threshold(0.0) == 0


@pytest.mark.skipif(not native_enabled(), reason="the extension is off")
@given(st.text(min_size=1, max_size=60), st.floats(0.0, 1.0))
def test_the_fronts_sample_the_requests_python_samples(request_id: str, fraction: float) -> None:
    from feature_store._native import ServedLog

    limit = threshold(fraction)
    assert ServedLog("p", limit, 10, True).sampled(request_id) == sampled(request_id, limit)


def test_sink_urls_are_checked() -> None:
    assert parse_target("file:///var/log/features").path == Path("/var/log/features")
    kafka = parse_target("kafka://127.0.0.1:9092/served")
    assert (kafka.bootstrap, kafka.topic) == ("127.0.0.1:9092", "served")
    for bad in ("file://relative/dir", "kafka://host:1/", "kafka:///topic", "s3://b/k", "dir"):
        with pytest.raises(ConfigError, match="--feature-log"):
            parse_target(bad)
    with pytest.raises(ConfigError, match="FEATURE_SERVING_FEATURE_LOG_SAMPLE"):
        ServingSettings.from_env({"FEATURE_SERVING_FEATURE_LOG_SAMPLE": "1.5"})
    with pytest.raises(ConfigError, match="--feature-log"):
        ServingSettings.from_env({"FEATURE_SERVING_FEATURE_LOG": "ftp://x"})


def _rows(n: int, served_at_ms: int, start: int = 0) -> pa.Table:
    registry = sample.registry()
    rows = [
        {
            "request_id": f"r{i}",
            "served_at": served_at_ms,
            "api": "rest",
            "entity_id": i,
            "source": "l1",
            f"{GROUP}__float_00": float(i),
            f"{GROUP}__float_00__status": "present",
            f"{GROUP}__embedding_0": [0.5] * sample.EMBEDDING_DIM,
            f"{GROUP}__event_time": served_at_ms // 1000 - 5,
        }
        for i in range(start, start + n)
    ]
    return pa.Table.from_pylist(rows, schema=arrow_schema(registry, registry.entities["consumer"]))


def _sink(tmp_path: Path, roll_seconds: float = 60.0, roll_bytes: int = 1 << 30) -> FileSink:
    metrics = LogMetrics(CollectorRegistry())
    return FileSink(tmp_path, sample.registry(), metrics, "w1", roll_seconds, roll_bytes)


def _visible(root: Path) -> int:
    folder = root / "entity_type=consumer"
    if not folder.exists():
        return 0
    return int(ds.dataset(folder, partitioning="hive").count_rows())


def _hidden(root: Path) -> list[str]:
    return [f for _, _, files in os.walk(root) for f in files if f.startswith(".")]


def test_a_file_is_seen_only_once_it_is_rolled_and_then_whole(tmp_path: Path) -> None:
    sink = _sink(tmp_path, roll_seconds=5)
    now = time.time()
    ms = int(now * 1000)
    sink.write("consumer", _rows(ROW_GROUP + 10, ms), now)  # one row group written
    assert _hidden(tmp_path)
    assert _visible(tmp_path) == 0
    sink.tick(now + 1)
    assert _visible(tmp_path) == 0
    sink.tick(now + 6)  # its first row is a roll interval old: closed and renamed
    assert _visible(tmp_path) == ROW_GROUP + 10
    assert not _hidden(tmp_path)
    table = ds.dataset(tmp_path / "entity_type=consumer", partitioning="hive").to_table()
    assert table.schema.field("served_at").type.unit == "ms"
    first = table.slice(0, 1).to_pylist()[0]
    assert first[f"{GROUP}__float_00"] == 0.0
    assert first[f"{GROUP}__float_01"] is None
    assert first[f"{GROUP}__float_01__status"] is None  # not asked
    assert first["date"] == time.strftime("%Y-%m-%d", time.gmtime(now))


def test_rows_buffered_alone_are_written_when_due(tmp_path: Path) -> None:
    sink = _sink(tmp_path, roll_seconds=2)
    now = time.time()
    sink.write("consumer", _rows(3, int(now * 1000)), now)
    sink.tick(now + 1)
    assert _visible(tmp_path) == 0
    assert not _hidden(tmp_path)
    sink.tick(now + 2.5)
    assert _visible(tmp_path) == 3


def test_files_roll_by_size_and_split_by_hour(tmp_path: Path) -> None:
    metrics = LogMetrics(CollectorRegistry())
    sink = FileSink(tmp_path, sample.registry(), metrics, "w1", 3600, roll_bytes=1)
    hour = 3600 * 1000
    base = (int(time.time() * 1000) // hour) * hour
    sink.write("consumer", _rows(ROW_GROUP, base + 10), time.time())  # full: written, rolled
    assert _visible(tmp_path) == ROW_GROUP
    sink.write("consumer", _rows(5, base - 10, start=ROW_GROUP), time.time())  # the hour before
    sink.close()
    hours = sorted(p.name for p in (tmp_path / "entity_type=consumer").glob("date=*/hour=*"))
    assert len(hours) == 2
    assert _visible(tmp_path) == ROW_GROUP + 5
    assert len(list((tmp_path / "entity_type=consumer").glob("date=*/hour=*/part-*.parquet"))) == 2


def test_every_feature_type_has_a_column_type() -> None:
    registry = sample.registry()
    schema = arrow_schema(registry, registry.entities[sample.ENTITY])
    names = schema.names
    assert names[:5] == ["request_id", "served_at", "api", "entity_id", "source"]
    for f in registry.groups[GROUP].features:
        assert f"{GROUP}__{f.name}" in names
        assert f"{GROUP}__{f.name}__status" in names


def test_a_full_queue_drops_and_counts_without_waiting() -> None:
    from feature_store.serving.service import Lookup

    registry = CollectorRegistry()
    log = FeatureLog(sample.registry(), "file:///nonexistent", queue_bytes=10, metrics=registry)
    lookup = Lookup(None, [], [], 0, [])  # type: ignore[arg-type]
    for i in range(12):  # the log thread is not running: nothing is taken
        log.offer(0, f"r{i}", b"{}", (lookup,))  # 2 bytes each: 5 fit
    assert len(log._queue) == 5
    dropped = registry.get_sample_value(
        "feature_serving_log_dropped_total", {"reason": "queue_full"}
    )
    assert dropped == 7


def test_non_finite_floats_answered_as_text_are_logged_as_numbers() -> None:
    from feature_store.native import REST
    from feature_store.serving.feature_log import Served

    log = FeatureLog(sample.registry())
    answer = orjson.dumps(
        {
            "entity_type": "consumer",
            "features": ["float_00", "embedding_0", "int_0"],
            "types": ["float", "embedding", "int"],
            "results": [
                {
                    "id": 7,
                    "values": ["NaN", ["Infinity", 1.5], 3],
                    "statuses": ["present", "present", "present"],
                    "ages": {GROUP: 10},
                },
                {
                    "id": 8,
                    "values": [None, None, None],
                    "statuses": ["missing", "missing", "missing"],
                    "ages": {GROUP: None},
                },
            ],
        }
    )
    parts: dict[tuple[str, object], object] = {}
    log.rows.add(Served(REST, "r", 1_000_000, 1000, 0, answer), parts)  # type: ignore[arg-type]
    (part,) = parts.values()
    rows = part.table(log.schema("consumer")).to_pylist()  # type: ignore[attr-defined]
    assert math.isnan(rows[0][f"{GROUP}__float_00"])
    assert rows[0][f"{GROUP}__embedding_0"] == [math.inf, 1.5]
    assert rows[0][f"{GROUP}__event_time"].timestamp() == 990
    assert rows[1][f"{GROUP}__int_0"] is None
    assert rows[1][f"{GROUP}__int_0__status"] == "missing"
    assert rows[1][f"{GROUP}__event_time"] is None
