"""``feature-store training-set``'s joins (feature_store/training.py) on a real Spark,
against a reference written plainly: a label row naming a request gets that request's
vector of its entity or none; any other gets the newest vector of its entity served at or
before its time, never one served after it."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from feature_store import sample
from feature_store.errors import RequestError
from feature_store.serving.feature_log import arrow_schema
from feature_store.training import TrainingSetJob, build_training_set

GROUP = sample.GROUP
T0 = datetime(2026, 11, 1, tzinfo=UTC)
runs = itertools.count()


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    path.write_text(sample.registry_text())
    return path


# a vector: (request id, entity id, served at in seconds from T0, its float_00)
Vector = tuple[str, int, int, float]
# a label: (entity id, its time in seconds from T0, the request it names or None)
Label = tuple[int, int, str | None]


def write_log(root: Path, vectors: list[Vector]) -> None:
    reg = sample.registry()
    schema = arrow_schema(reg, reg.entities[sample.ENTITY])
    rows = [
        {
            "request_id": rid,
            "served_at": T0 + timedelta(seconds=at),
            "api": "rest",
            "entity_id": eid,
            "source": "l1",
            f"{GROUP}__float_00": value,
            f"{GROUP}__float_00__status": "present" if value >= 0 else "stale",
            f"{GROUP}__event_time": T0,
        }
        for rid, eid, at, value in vectors
    ]
    # two files in two hours' folders, as the file sink writes them
    half = len(rows) // 2
    for i, part in enumerate((rows[:half], rows[half:])):
        folder = root / f"entity_type={sample.ENTITY}" / "date=2026-11-01" / f"hour=0{i}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(part, schema=schema), folder / "part-0.parquet")


def reference(labels: list[Label], vectors: list[Vector]) -> list[tuple[str, float] | None]:
    out: list[tuple[str, float] | None] = []
    for eid, at, rid in labels:
        if rid is not None:
            found = [v for v in vectors if v[0] == rid and v[1] == eid]
        else:
            before = [v for v in vectors if v[1] == eid and v[2] <= at]
            newest = max((v[2] for v in before), default=None)
            found = [v for v in before if v[2] == newest]
        out.append((found[0][0], found[0][3]) if found else None)
    return out


def run(
    spark: SparkSession, registry: Path, tmp: Path, labels: list[Label], vectors: list[Vector]
) -> tuple[list[dict[str, object]], object]:
    n = next(runs)
    log, out, path = tmp / f"log{n}", tmp / f"out{n}", tmp / f"labels{n}.parquet"
    write_log(log, vectors)
    pq.write_table(
        pa.table(
            {
                "consumer_id": pa.array([e for e, _, _ in labels], pa.int64()),
                "event_timestamp": pa.array(
                    [T0 + timedelta(seconds=t) for _, t, _ in labels], pa.timestamp("us", "UTC")
                ),
                "request_id": pa.array([r for _, _, r in labels], pa.string()),
                "row": pa.array(range(len(labels)), pa.int64()),
            }
        ),
        path,
    )
    job = TrainingSetJob(registry=registry, labels=str(path), log=str(log), output=str(out))
    report = build_training_set(spark, job)
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["row"])
    return rows, report


entity_ids = st.integers(1, 4)
times = st.integers(0, 40)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Label], list[Vector]]:
    served = draw(st.lists(st.tuples(entity_ids, times), min_size=1, max_size=25, unique=True))
    vectors = [(f"q{i}", e, t, float(i)) for i, (e, t) in enumerate(served)]
    names = st.sampled_from([v[0] for v in vectors] + ["q-unlogged"])
    labels = draw(
        st.lists(st.tuples(entity_ids, times, st.none() | names), min_size=1, max_size=20)
    )
    return labels, vectors


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases())
def test_the_join_equals_the_reference_and_never_looks_ahead(
    spark: SparkSession, registry_file: Path, tmp_path: Path, case: tuple[list[Label], list[Vector]]
) -> None:
    labels, vectors = case
    rows, report = run(spark, registry_file, tmp_path, labels, vectors)
    expected = reference(labels, vectors)
    assert len(rows) == len(labels)
    for row, want, (_, at, rid) in zip(rows, expected, labels, strict=True):
        got = None
        if row["served_at"] is not None:
            got = (row["served_request_id"], row[f"{GROUP}__float_00"])
        assert got == want, (row, want)
        if rid is None and row["served_at"] is not None:
            served = row["served_at"]
            if served.tzinfo is None:  # Spark's timestamps in parquet: UTC, without a zone
                served = served.replace(tzinfo=UTC)
            assert served <= T0 + timedelta(seconds=at)  # nothing from the future
    assert report.no_vector == sum(w is None for w in expected)  # type: ignore[attr-defined]
    assert report.by_request == sum(  # type: ignore[attr-defined]
        w is not None and label[2] is not None for w, label in zip(expected, labels, strict=True)
    )


def test_a_vector_served_at_the_labels_time_is_used_one_after_is_not(
    spark: SparkSession, registry_file: Path, tmp_path: Path
) -> None:
    vectors = [("a", 1, 10, 1.0), ("b", 1, 20, 2.0), ("c", 1, 21, -3.0)]
    labels: list[Label] = [(1, 20, None), (1, 9, None), (1, 30, None), (2, 30, None)]
    rows, report = run(spark, registry_file, tmp_path, labels, vectors)
    assert [r["served_request_id"] for r in rows] == ["b", None, "c", None]
    assert report.no_vector == 2  # type: ignore[attr-defined]
    assert report.stale == {**report.stale, f"{GROUP}__float_00": 1}  # type: ignore[attr-defined]


def test_labels_without_their_columns_are_refused_by_name(
    spark: SparkSession, registry_file: Path, tmp_path: Path
) -> None:
    write_log(tmp_path / "log", [("a", 1, 10, 1.0), ("b", 2, 10, 1.0)])
    path = tmp_path / "labels.csv"
    path.write_text("consumer_id,when,label\n1,2026-11-01T00:00:30Z,1\n")
    job = TrainingSetJob(
        registry=registry_file,
        labels=str(path),
        log=str(tmp_path / "log"),
        output=str(tmp_path / "o"),
    )
    with pytest.raises(RequestError, match="no column 'event_timestamp' \\(--time-column\\)"):
        build_training_set(spark, job)
    job = TrainingSetJob(
        registry=registry_file,
        labels=str(path),
        log=str(tmp_path / "log"),
        output=str(tmp_path / "o"),
        time_column="when",
    )
    report = build_training_set(spark, job)
    assert report.point_in_time == 1
    with pytest.raises(RequestError, match="no log of entity type 'consumer'"):
        build_training_set(
            spark,
            TrainingSetJob(
                registry_file,
                str(path),
                str(tmp_path / "none"),
                str(tmp_path / "p"),
                time_column="when",
            ),
        )
