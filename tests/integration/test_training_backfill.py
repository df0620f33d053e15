"""``feature-store training-set --backfill``: label rows the serving log does not cover
answered from the groups' sources, point in time (feature_store/training_sources.py), on a
real Spark, against a reference written plainly, row by row, with the features' own codecs:
the newest source row at or before the label's time and within the group's max_age, its
values as serving would answer them; a group the log answered keeps the logged values."""

from __future__ import annotations

import itertools
import math
import struct
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from feature_store.errors import EncodingError, RequestError
from feature_store.registry import FeatureGroup, parse_registry
from feature_store.serialization.codecs import FeatureType
from feature_store.serving.feature_log import arrow_schema
from feature_store.training import TrainingSetJob, build_training_set
from feature_store.training_sources import SourceSpec
from feature_store.windows import Event, reference_answer

REGISTRY = """\
version: 1
entities:
  consumer:
    prefix: c
    join_key: consumer_id
    id_type: int
    ttl: 7d
feature_groups:
  profile:
    entity: consumer
    max_age: 100s
    features:
      f: float
      d: double
      n: int
      e: embedding(3)
      s: string
  activity:
    entity: consumer
    features:
      li: int_list
      fl: float_list
      b: bool
"""
T0 = datetime(2026, 11, 1, tzinfo=UTC)
MAX_AGE = 100
runs = itertools.count()
# a Spark job per example: shrinking a failure would take many minutes; it is shown as found
UNSHRUNK = (Phase.explicit, Phase.reuse, Phase.generate)
registry = parse_registry(REGISTRY, source="test")
PROFILE, ACTIVITY = registry.groups["profile"], registry.groups["activity"]


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    path.write_text(REGISTRY)
    return path


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


# a source row: (entity id, event time in seconds from T0, {feature: value or None})
Row = tuple[int, int, dict[str, object]]
# a logged vector of profile: (request id, entity id, served at, float f)
Vector = tuple[str, int, int, float]
# a label: (entity id, its time in seconds from T0)
Label = tuple[int, int]

floats = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.1, 1e39, -0.0, 3.4028235e38]),  # past float32 (refused), the largest
)
PROFILE_VALUES = {
    "f": floats,
    "d": floats,
    "n": st.none() | st.integers(-(2**63), 2**63 - 1),
    "e": st.none() | st.lists(st.floats(-1e3, 1e3, width=32), min_size=2, max_size=4),
    "s": st.none() | st.text(max_size=5),
}
ACTIVITY_VALUES = {
    "li": st.none() | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
    "fl": st.none() | st.lists(st.floats(-1e300, 1e300), max_size=3),
    "b": st.none() | st.booleans(),
}
entity_ids = st.integers(1, 4)
times = st.integers(0, 30).map(lambda t: t * 10)  # snapshots and labels on one grid: ties


def rows_of(values: dict[str, st.SearchStrategy[object]]) -> st.SearchStrategy[list[Row]]:
    return st.lists(
        st.tuples(entity_ids, times, st.fixed_dictionaries(values)),
        min_size=1,
        max_size=16,
        unique_by=lambda r: (r[0], r[1]),
    )


def served(group: FeatureGroup, values: dict[str, object]) -> dict[str, object]:
    """What serving answers for values the nightly job wrote: each through its codec."""
    out: dict[str, object] = {}
    for f in group.features:
        value = values.get(f.name)
        if value is None:
            out[f.name], out[f"{f.name}__status"] = None, "missing"
            continue
        try:
            out[f.name] = f.codec.decode(f.codec.encode(value))
            out[f"{f.name}__status"] = "present"
        except EncodingError:
            out[f.name], out[f"{f.name}__status"] = None, "error"
    return out


def newest(rows: list[Row], eid: int, t: int, max_age: int | None) -> Row | None:
    before = [r for r in rows if r[0] == eid and r[1] <= t]
    if max_age is not None:
        before = [r for r in before if t - r[1] <= max_age]
    return max(before, key=lambda r: r[1], default=None)


def reference(
    labels: list[Label], vectors: list[Vector], profile: list[Row], activity: list[Row]
) -> list[dict[str, object]]:
    out = []
    for eid, t in labels:
        row: dict[str, object] = {}
        logged = max(
            (v for v in vectors if v[1] == eid and v[2] <= t), key=lambda v: v[2], default=None
        )
        row["served_request_id"] = logged[0] if logged else None
        if logged is not None:
            row["profile__source"] = "log"
            row["profile__f"], row["profile__f__status"] = logged[3], "present"
        else:
            found = newest(profile, eid, t, MAX_AGE)
            row["profile__source"] = "backfill" if found else None
            values = served(PROFILE, found[2]) if found else {}
            for f in PROFILE.features:
                row[f"profile__{f.name}"] = values.get(f.name)
                row[f"profile__{f.name}__status"] = values.get(f"{f.name}__status")
            row["profile__event_time"] = at(found[1]) if found else None
        found = newest(activity, eid, t, None)
        row["activity__source"] = "backfill" if found else None
        values = served(ACTIVITY, found[2]) if found else {}
        for f in ACTIVITY.features:
            row[f"activity__{f.name}"] = values.get(f.name)
            row[f"activity__{f.name}__status"] = values.get(f"{f.name}__status")
        row["activity__event_time"] = at(found[1]) if found else None
        out.append(row)
    return out


def write_source(path: Path, group: FeatureGroup, rows: list[Row]) -> None:
    kinds = {
        "f": pa.float64(),
        "d": pa.float64(),
        "n": pa.int64(),
        "e": pa.list_(pa.float64()),
        "s": pa.string(),
        "li": pa.list_(pa.int64()),
        "fl": pa.list_(pa.float64()),
        "b": pa.bool_(),
    }
    columns = {
        "consumer_id": pa.array([r[0] for r in rows], pa.int64()),
        "event_timestamp": pa.array([at(r[1]) for r in rows], pa.timestamp("us", "UTC")),
    }
    for f in group.features:
        columns[f.name] = pa.array([r[2][f.name] for r in rows], kinds[f.name])
    pq.write_table(pa.table(columns), path)


def write_log(root: Path, vectors: list[Vector]) -> None:
    """A log written before the group activity existed: profile's f only."""
    schema = arrow_schema(registry, registry.entities["consumer"])
    schema = pa.schema([f for f in schema if not f.name.startswith("activity__")])
    rows = [
        {
            "request_id": rid,
            "served_at": at(t),
            "api": "rest",
            "entity_id": eid,
            "source": "l1",
            "profile__f": value,
            "profile__f__status": "present",
            "profile__event_time": T0,
        }
        for rid, eid, t, value in vectors
    ]
    folder = root / "entity_type=consumer" / "date=2026-11-01" / "hour=00"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-0.parquet")


def run(
    spark: SparkSession,
    registry_file: Path,
    tmp: Path,
    labels: list[Label],
    vectors: list[Vector] | None,
    profile: list[Row],
    activity: list[Row],
) -> tuple[list[dict[str, object]], object]:
    n = next(runs)
    log, out, path = tmp / f"log{n}", tmp / f"out{n}", tmp / f"labels{n}.parquet"
    if vectors is not None:
        write_log(log, vectors)
    write_source(tmp / f"profile{n}.parquet", PROFILE, profile)
    write_source(tmp / f"activity{n}.parquet", ACTIVITY, activity)
    pq.write_table(
        pa.table(
            {
                "consumer_id": pa.array([e for e, _ in labels], pa.int64()),
                "event_timestamp": pa.array([at(t) for _, t in labels], pa.timestamp("us", "UTC")),
                "row": pa.array(range(len(labels)), pa.int64()),
            }
        ),
        path,
    )
    job = TrainingSetJob(
        registry=registry_file,
        labels=str(path),
        log=str(log) if vectors is not None else None,
        output=str(out),
        backfill=(
            SourceSpec("profile", str(tmp / f"profile{n}.parquet")),
            SourceSpec("activity", str(tmp / f"activity{n}.parquet")),
        ),
    )
    report = build_training_set(spark, job)
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["row"])
    return rows, report


def same(got: object, want: object) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return got == want or (math.isnan(got) and math.isnan(want))
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, datetime) and isinstance(got, datetime):
        return got.replace(tzinfo=UTC) == want
    return got == want


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Label], list[Vector] | None, list[Row], list[Row]]:
    profile = draw(rows_of(PROFILE_VALUES))
    activity = draw(rows_of(ACTIVITY_VALUES))
    vectors = None
    if draw(st.booleans()):
        served_at = draw(st.lists(st.tuples(entity_ids, times), max_size=6, unique=True))
        vectors = [(f"q{i}", e, t, float(i)) for i, (e, t) in enumerate(served_at)]
    # an entity of no source (5), duplicate labels, labels before, at and after snapshots
    labels = draw(st.lists(st.tuples(st.integers(1, 5), times), min_size=5, max_size=30))
    return labels, vectors, profile, activity


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=UNSHRUNK,
)
@given(cases())
def test_backfill_equals_the_reference_row_by_row(
    spark: SparkSession,
    registry_file: Path,
    tmp_path: Path,
    case: tuple[list[Label], list[Vector] | None, list[Row], list[Row]],
) -> None:
    labels, vectors, profile, activity = case
    rows, report = run(spark, registry_file, tmp_path, labels, vectors, profile, activity)
    expected = reference(labels, vectors or [], profile, activity)
    assert len(rows) == len(labels)
    for row, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            assert same(row[name], value), (name, row[name], value, row)
    from_source = sum(w["profile__source"] == "backfill" for w in expected)
    assert report.backfilled["profile"] == from_source  # type: ignore[attr-defined]
    nothing = sum(w["profile__source"] is None and w["activity__source"] is None for w in expected)
    assert report.uncovered == nothing  # type: ignore[attr-defined]


def test_a_snapshot_at_the_labels_time_is_used_one_after_is_not_nor_one_past_max_age(
    spark: SparkSession, registry_file: Path, tmp_path: Path
) -> None:
    values = {"f": 0.1, "d": 0.1, "n": 1, "e": [1.0, 2.0, 3.0], "s": "a"}
    profile: list[Row] = [(1, 100, values), (1, 200, {**values, "f": 2.5}), (1, 201, values)]
    labels: list[Label] = [(1, 200), (1, 99), (1, 300), (1, 301 + MAX_AGE)]
    rows, _ = run(spark, registry_file, tmp_path, labels, None, profile, [])
    assert [r["profile__f"] for r in rows] == [2.5, None, 0.1, None]
    assert [r["profile__source"] for r in rows] == ["backfill", None, "backfill", None]
    # float32's 0.1 is 0.100000001...; served, as the nightly job's short text, it is 0.1
    assert rows[2]["profile__f"] == 0.1
    assert rows[2]["profile__e"] == [1.0, 2.0, 3.0]
    assert rows[2]["profile__e__status"] == "present"
    assert rows[1]["profile__e__status"] is None


def bad_source(tmp: Path, name: str, columns: dict[str, pa.Array]) -> str:
    path = tmp / f"{name}.parquet"
    pq.write_table(pa.table(columns), path)
    return str(path)


def test_a_bad_source_is_refused_naming_its_file_and_column_and_nothing_is_written(
    spark: SparkSession, registry_file: Path, tmp_path: Path
) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("consumer_id,event_timestamp\n1,2026-11-01T00:00:30Z\n")
    ids = pa.array([1], pa.int64())
    when = pa.array([T0], pa.timestamp("us", "UTC"))
    cases = {
        "no id": ({"event_timestamp": when, "f": pa.array([1.0])}, "no column 'consumer_id'"),
        "no time": ({"consumer_id": ids, "f": pa.array([1.0])}, "no column 'event_timestamp'"),
        "text float": (
            {"consumer_id": ids, "event_timestamp": when, "f": pa.array(["1.5"])},
            "column 'f' has type string, which feature profile.f \\(float\\) cannot take",
        ),
        "bool time": (
            {"consumer_id": ids, "event_timestamp": pa.array([True]), "f": pa.array([1.0])},
            "column 'event_timestamp' has type boolean, not a time",
        ),
    }
    for name, (columns, message) in cases.items():
        path = bad_source(tmp_path, name.replace(" ", "_"), columns)
        out = tmp_path / f"out_{name.replace(' ', '_')}"
        job = TrainingSetJob(
            registry=registry_file,
            labels=str(labels),
            log=None,
            output=str(out),
            backfill=(SourceSpec("profile", path),),
        )
        with pytest.raises(RequestError, match=f"--backfill profile={path}: {message}"):
            build_training_set(spark, job)
        assert not out.exists(), name
    job = TrainingSetJob(registry=registry_file, labels=str(labels), log=None, output="x")
    with pytest.raises(RequestError, match="nothing to join"):
        build_training_set(spark, job)
    good = bad_source(tmp_path, "good", {"consumer_id": ids, "event_timestamp": when})
    flagged = tmp_path / "flagged.csv"
    flagged.write_text("consumer_id,event_timestamp\n1,true\n")
    job = TrainingSetJob(
        registry=registry_file,
        labels=str(flagged),
        log=None,
        output=str(tmp_path / "out_flagged"),
        backfill=(SourceSpec("profile", good),),
    )
    message = f"--labels {flagged}: column 'event_timestamp' \\(--time-column\\) has type boolean"
    with pytest.raises(RequestError, match=message):
        build_training_set(spark, job)
    assert not (tmp_path / "out_flagged").exists()
    job = TrainingSetJob(
        registry=registry_file,
        labels=str(labels),
        log=None,
        output="x",
        backfill=(SourceSpec("nope", path),),
    )
    with pytest.raises(RequestError, match="--backfill nope: no such group"):
        build_training_set(spark, job)


# --- window aggregations, from their event history ------------------------------------

WINDOWS = """\
version: 1
entities:
  consumer:
    prefix: c
    join_key: consumer_id
    id_type: int
    ttl: 7d
feature_groups:
  activity:
    entity: consumer
    max_age: 30m
    aggregations:
      tile: 1m
      features:
        orders_1h: {function: count, window: 1h}
        rated_10m: {function: count, of: rating, window: 10m}
        spend_1h: {function: sum, of: amount, window: 1h}
        mean_10m: {function: mean, of: amount, window: 10m}
        max_1h: {function: max, of: amount, window: 1h}
        min_10m: {function: min, of: rating, window: 10m}
        stores_1h: {function: last_n, n: 3, of: store, window: 1h}
        ratings_1h: {function: last_n, n: 2, of: rating, window: 1h, type: float_list}
"""
windowed = parse_registry(WINDOWS, source="test")
ACTIVITY_WINDOWS = windowed.groups["activity"]
# an event: (entity id, its time in seconds from T0, amount, rating, store)
WindowEvent = tuple[int, int, float | None, float | None, int | None]


def window_reference(labels: list[Label], events: list[WindowEvent]) -> list[dict[str, object]]:
    """Each label's answers from its entity's events at or before its time, plainly."""
    group = ACTIVITY_WINDOWS
    assert group.aggregation is not None
    out = []
    for eid, t in labels:
        mine = sorted((e for e in events if e[0] == eid and e[1] <= t), key=lambda e: e[1])
        row: dict[str, object] = {"activity__source": "backfill" if mine else None}
        history = [
            Event(
                time_ms=int(at(s).timestamp()) * 1000,
                values={
                    k: v
                    for k, v in (("amount", amount), ("rating", rating), ("store", store))
                    if v is not None
                },
            )
            for _, s, amount, rating, store in mine
        ]
        now = at(t).timestamp()
        values = reference_answer(group.aggregation, history, now) if mine else None
        longest = [e for e in mine if e[1] // 60 > (t - 3600) // 60]
        newest = max((e[1] for e in longest), default=None)
        stale = newest is not None and t - newest > 1800
        for i, f in enumerate(group.features):
            value = None if values is None else values[i]
            if f.type is FeatureType.FLOAT_LIST and value is not None:
                value = [struct.unpack("<f", struct.pack("<f", v))[0] for v in value]  # type: ignore[union-attr]
            row[f"activity__{f.name}"] = value
            status = None if values is None else "missing" if value is None else "present"
            row[f"activity__{f.name}__status"] = (
                "stale" if stale and status == "present" else status
            )
        row["activity__event_time"] = None if newest is None else at(newest)
        out.append(row)
    return out


@st.composite
def window_cases(draw: st.DrawFn) -> tuple[list[Label], list[WindowEvent]]:
    amounts = st.none() | st.floats(-1e6, 1e6, allow_nan=False)
    events = draw(
        st.lists(
            st.tuples(
                entity_ids,
                st.integers(0, 7200),
                amounts,
                amounts,
                st.none() | st.integers(-(2**40), 2**40),
            ),
            max_size=30,
            unique_by=lambda e: (e[0], e[1]),  # one event a second per entity: last_n's order
        )
    )
    labels = draw(
        st.lists(
            st.tuples(
                st.integers(1, 5),
                st.integers(0, 9000) | st.sampled_from([e[1] for e in events] or [0]),
            ),
            min_size=3,
            max_size=20,
        )
    )
    return labels, events


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=UNSHRUNK,
)
@given(window_cases())
def test_window_aggregations_are_backfilled_at_each_labels_time_as_a_read_answers(
    spark: SparkSession, tmp_path: Path, case: tuple[list[Label], list[WindowEvent]]
) -> None:
    labels, events = case
    n = next(runs)
    registry_path = tmp_path / f"windows{n}.yaml"
    registry_path.write_text(WINDOWS)
    source, labels_path = tmp_path / f"events{n}.parquet", tmp_path / f"wlabels{n}.parquet"
    pq.write_table(
        pa.table(
            {
                "consumer_id": pa.array([e[0] for e in events], pa.int64()),
                "event_time": pa.array([at(e[1]) for e in events], pa.timestamp("us", "UTC")),
                "amount": pa.array([e[2] for e in events], pa.float64()),
                "rating": pa.array([e[3] for e in events], pa.float64()),
                "store": pa.array([e[4] for e in events], pa.int64()),
            }
        ),
        source,
    )
    pq.write_table(
        pa.table(
            {
                "consumer_id": pa.array([e for e, _ in labels], pa.int64()),
                "event_timestamp": pa.array([at(t) for _, t in labels], pa.timestamp("us", "UTC")),
                "row": pa.array(range(len(labels)), pa.int64()),
            }
        ),
        labels_path,
    )
    out = tmp_path / f"wout{n}"
    job = TrainingSetJob(
        registry=registry_path,
        labels=str(labels_path),
        log=None,
        output=str(out),
        backfill=(SourceSpec("activity", str(source)),),
    )
    report = build_training_set(spark, job)
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["row"])
    expected = window_reference(labels, events)
    for row, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            if name in ("activity__spend_1h", "activity__mean_10m") and value is not None:
                assert row[name] == pytest.approx(value, rel=1e-9, abs=1e-6), (name, row, want)
            else:
                assert same(row[name], value), (name, row[name], value, row)
    assert report.backfilled["activity"] == sum(  # type: ignore[attr-defined]
        w["activity__source"] is not None for w in expected
    )


def test_the_command_backfills_from_a_csv_source(registry_file: Path, tmp_path: Path) -> None:
    """``feature-store training-set --backfill`` as a user runs it: a CSV source whose
    event times are RFC 3339 text under another name, no log, the report as JSON."""
    (tmp_path / "labels.csv").write_text(
        "consumer_id,event_timestamp\n1,2026-11-01T00:01:00Z\n1,2026-11-01T00:00:30Z\n2,2026-11-01T00:01:00Z\n"
    )
    (tmp_path / "profile.csv").write_text("consumer_id,when,f,n\n1,2026-11-01T00:00:40Z,0.1,7\n")
    command = [str(Path(sys.executable).parent / "feature-store"), "training-set"]
    command += ["--registry", str(registry_file), "--labels", str(tmp_path / "labels.csv")]
    command += ["--backfill", f"profile={tmp_path / 'profile.csv'}", "--event-time-column", "when"]
    command += ["--output", str(tmp_path / "out"), "--report", str(tmp_path / "report.json")]
    command += ["--master", "local[1]"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "1 rows' values of profile from its source" in run.stdout
    rows = pq.read_table(tmp_path / "out").to_pylist()
    got = sorted(
        (r["event_timestamp"], r["consumer_id"], r["profile__f"], r["profile__source"])
        for r in rows
    )
    assert [g[1:] for g in got] == [(1, None, None), (1, 0.1, "backfill"), (2, None, None)]
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["backfilled"] == {"profile": 1}
    assert report["absent"] == {"profile": ["d", "e", "s"]}
