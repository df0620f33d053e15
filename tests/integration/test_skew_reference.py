"""``feature-store skew`` against a reference written plainly, row by row: random logs and
sources, and per feature and cause the counts, SMAPE and mismatches that the module's text
promises (feature_store/skew.py), on a real Spark.

A logged value copies what its source says should have been served (equal), or is another
value, the same float in another encoding, missing, stale or an error; its write time is
newer, older, equal to the source row's, absent, or past the group's max_age; labels of
``--from``/``--to`` cut the rows.
"""

from __future__ import annotations

import itertools
import math
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from feature_store.registry import parse_registry
from feature_store.serving.feature_log import arrow_schema
from feature_store.skew import CAUSES, KINDS, SkewJob, measure_skew
from feature_store.training_sources import SourceSpec

REGISTRY = """\
version: 1
entities:
  consumer: {prefix: c, id_type: int, ttl: 7d, join_key: consumer_id}
feature_groups:
  profile:
    entity: consumer
    max_age: 100s
    features: {f: float, n: int, e: embedding(2), s: string}
"""
MAX_AGE = 100
T0 = datetime(2026, 11, 1, tzinfo=UTC)
registry = parse_registry(REGISTRY, source="test")
PROFILE = registry.groups["profile"]
FEATURES = [f.name for f in PROFILE.features]
NUMBERS = {"f", "n"}
runs = itertools.count()
# a Spark job per example: shrinking a failure would take many minutes; it is shown as found
UNSHRUNK = (Phase.explicit, Phase.reuse, Phase.generate)

# a source row: (entity id, event time in seconds from T0, {feature: value or None})
Row = tuple[int, int, dict[str, object]]
# a logged row: (request id, entity id, served at, write time or None, {feature: (status,
# value)}), a feature the lookup did not ask for left out
Logged = tuple[str, int, int, int | None, dict[str, tuple[str, object]]]

times = st.integers(0, 30).map(lambda t: t * 10)  # one grid for everything: ties
entity_ids = st.integers(1, 4)
f32 = st.floats(-1e3, 1e3, width=32)
SOME = {
    "f": st.floats(-1e6, 1e6).map(lambda x: round(x, 3)),
    "n": st.integers(-(10**6), 10**6),
    "e": st.lists(f32, min_size=2, max_size=2),
    "s": st.text(max_size=4),
}
VALUES = {name: st.none() | values for name, values in SOME.items()}
# what a logged value is: the source's (when it has one), another, the same float in its
# float32's full digits, or served with a status that is not compared or missing
CHOICES = ("copy", "copy", "other", "encoded", "missing", "stale", "error", "unasked")


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def served(values: dict[str, object]) -> dict[str, tuple[str, object]]:
    """What serving answers for source values: each through its codec."""
    out: dict[str, tuple[str, object]] = {}
    for f in PROFILE.features:
        value = values.get(f.name)
        if value is None:
            out[f.name] = ("missing", None)
        else:
            out[f.name] = ("present", f.codec.decode(f.codec.encode(value)))
    return out


def newest(rows: list[Row], eid: int, t: int) -> Row | None:
    return max(
        (r for r in rows if r[0] == eid and r[1] <= t and t - r[1] <= MAX_AGE),
        key=lambda r: r[1],
        default=None,
    )


def full_digits(value: float) -> float:
    """``value`` as its float32 is, in full (0.1 as 0.100000001...): equal at float32."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def same(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def at_float32(value: object) -> object:
    if isinstance(value, float):
        return full_digits(value)
    if isinstance(value, list):
        return [full_digits(v) for v in value]
    return value


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Row], list[Logged], int | None, int | None]:
    source = draw(
        st.lists(
            st.tuples(entity_ids, times, st.fixed_dictionaries(VALUES)),
            max_size=12,
            unique_by=lambda r: (r[0], r[1]),
        )
    )
    logged: list[Logged] = []
    for i in range(draw(st.integers(1, 10))):
        eid, t = draw(entity_ids), draw(times)
        row = newest(source, eid, t)
        want = served(row[2]) if row is not None else {}
        # the write served: the source row's, another time (newer, older, past max_age) or
        # none (nothing stored)
        written = draw(st.sampled_from(["same", "other", "none"]))
        w = (
            None
            if written == "none"
            else row[1]
            if written == "same" and row is not None
            else draw(st.integers(0, t // 10).map(lambda x: x * 10))
        )
        values: dict[str, tuple[str, object]] = {}
        for name in FEATURES:
            choice = draw(st.sampled_from(CHOICES))
            status, value = want.get(name, ("missing", None))
            if choice == "unasked":
                continue
            if choice in ("missing", "stale", "error"):
                other = draw(VALUES[name]) if choice == "stale" else None
                values[name] = (choice, other)
            elif choice == "encoded" and name == "f" and status == "present":
                assert isinstance(value, float)
                values[name] = ("present", full_digits(value))
            elif choice == "copy":
                values[name] = (status, value)
            else:
                other = draw(SOME[name])
                values[name] = ("present", served({name: other})[name][1])
        logged.append((f"q{i}", eid, t, w, values))
    start = draw(st.none() | times)
    end = draw(st.none() | times)
    return source, logged, start, end


def reference(
    source: list[Row], logged: list[Logged], start: int | None, end: int | None
) -> tuple[int, dict[str, dict[str, int]], dict[str, int], dict[str, float | None], set[tuple]]:
    """Per skew.py's text: the rows counted, per feature the kinds, the causes, SMAPE per
    number feature, and every differing value as (request, feature, cause)."""
    rows = 0
    kinds = {name: dict.fromkeys((*KINDS, "not_compared"), 0) for name in FEATURES}
    causes = dict.fromkeys(CAUSES, 0)
    terms: dict[str, list[float]] = {name: [] for name in NUMBERS}
    differing: set[tuple] = set()
    for rid, eid, t, w, values in logged:
        if not values or (start is not None and t < start) or (end is not None and t >= end):
            continue
        rows += 1
        row = newest(source, eid, t)
        want = served(row[2]) if row is not None else {}
        theirs = row[1] if row is not None else None
        if w is not None and t - w > MAX_AGE:
            cause = "past_max_age"
        elif theirs is None or (w is not None and w > theirs):
            cause = "newer_than_source"
        elif w is None:
            cause = "not_in_store"
        elif w < theirs:
            cause = "older_than_source"
        else:
            cause = "value_differs"
        for name, (status, got) in values.items():
            want_status, expected = want.get(name, ("missing", None))
            has, has_want = status == "present", want_status == "present"
            if status in ("stale", "error"):
                kind = "not_compared"
            elif (has and has_want and same(got, expected)) or (
                status == "missing" and not has_want
            ):
                kind = "equal"
            elif has and has_want:
                kind = "mismatched"
            elif has:
                kind = "served_missing_in_source"
            else:
                kind = "missing_when_source_has"
            kinds[name][kind] += 1
            if has and has_want and name in NUMBERS:
                a, b = float(got), float(expected)  # type: ignore[arg-type]
                terms[name].append(0.0 if a == b else abs(a - b) / ((abs(a) + abs(b)) / 2))
            if kind in KINDS[1:]:
                why = cause
                if why == "value_differs" and same(at_float32(got), at_float32(expected)):
                    why = "encoding"
                causes[why] += 1
                differing.add((rid, name, why))
    smape = {name: (sum(v) / len(v) if v else None) for name, v in terms.items()}
    return rows, kinds, causes, smape, differing


def write_log(root: Path, logged: list[Logged]) -> None:
    schema = arrow_schema(registry, registry.entities["consumer"])
    rows = []
    for rid, eid, t, w, values in logged:
        row: dict[str, object] = {
            "request_id": rid,
            "served_at": at(t),
            "api": "rest",
            "entity_id": eid,
            "source": "l1",
            "profile__event_time": None if w is None else at(w),
        }
        for name, (status, value) in values.items():
            row[f"profile__{name}"], row[f"profile__{name}__status"] = value, status
        rows.append(row)
    folder = root / "entity_type=consumer" / "date=2026-11-01" / "hour=00"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-0.parquet")


def write_source(path: Path, rows: list[Row]) -> None:
    kinds = {"f": pa.float64(), "n": pa.int64(), "e": pa.list_(pa.float64()), "s": pa.string()}
    columns = {
        "consumer_id": pa.array([r[0] for r in rows], pa.int64()),
        "event_timestamp": pa.array([at(r[1]) for r in rows], pa.timestamp("us", "UTC")),
    }
    for name in FEATURES:
        columns[name] = pa.array([r[2][name] for r in rows], kinds[name])
    pq.write_table(pa.table(columns), path)


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    path.write_text(REGISTRY)
    return path


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=UNSHRUNK,
)
@given(cases())
def test_skew_equals_the_reference_row_by_row(
    spark: SparkSession,
    registry_file: Path,
    tmp_path: Path,
    case: tuple[list[Row], list[Logged], int | None, int | None],
) -> None:
    source, logged, start, end = case
    n = next(runs)
    log, path = tmp_path / f"log{n}", tmp_path / f"source{n}.parquet"
    write_log(log, logged)
    write_source(path, source)
    job = SkewJob(
        registry_file,
        str(log),
        (SourceSpec("profile", str(path)),),
        start=None if start is None else at(start),
        end=None if end is None else at(end),
    )
    report = measure_skew(spark, job)
    rows, kinds, causes, smape, differing = reference(source, logged, start, end)
    group = report.groups["profile"]
    assert group.rows == rows
    assert group.causes == causes
    for name in FEATURES:
        feature = group.features[name]
        got = {kind: getattr(feature, kind) for kind in kinds[name]}
        assert got == kinds[name], (name, got, kinds[name])
        assert feature.compared == sum(kinds[name][k] for k in KINDS)
        if name in NUMBERS:
            want = smape[name]
            assert (feature.smape is None) == (want is None), (name, feature.smape, want)
            if want is not None:
                assert feature.smape is not None
                assert math.isclose(feature.smape, want, rel_tol=1e-9, abs_tol=1e-12)
    listed = {(m["request_id"], m["feature"], m["cause"]) for m in report.mismatches}
    assert listed == differing
