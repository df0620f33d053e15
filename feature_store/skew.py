"""``feature-store skew``: what was served against what the feature sources say should have
been served at that moment (training-serving skew), and why a value differs.

For each logged row of a group (a lookup that asked for some of its features), the
expected values are those of the group's source row of the entity that was newest at the
served time and within the group's ``max_age`` (training_sources.py's as-of join), as
serving would answer them (the features' codecs). Per feature, a logged value is:

- **equal**: the same value, or missing on both sides;
- **mismatched**: both have a value and they differ (numbers also give SMAPE);
- **served, missing in source**: served a value where the source has none (no row in
  ``max_age``, or a null cell);
- **missing, source has it**: served ``missing`` where the source has a value;
- not compared: served ``stale`` or ``error`` (serving said so itself), or a feature the
  source has no column of (the report lists those).

Why a value differs is read from the group's write time, which every logged row carries
(``<group>__event_time``), against the source row's event time:

- ``newer_than_source``: the value served was written after the source's newest row (a push
  write or the stream wrote around the pipeline, or the source lacks a snapshot);
- ``older_than_source``: the value served is from before the source's newest row (a stale
  snapshot: the nightly job's write did not land, or a cache served past its bound);
- ``not_in_store``: nothing was stored for the entity, where the source has a row;
- ``value_differs``: the same write, another value (a writer's bug, a value changed by
  hand);
- ``encoding``: the same write, values equal at float32: only the encoding differs (a
  codec's bug: a float stored as its float32's full digits, say);
- ``past_max_age`` (before the others): the write served was older than the group's
  ``max_age`` when it was served, yet served as ``present`` (a cache served past its
  bound).

Times are compared in whole seconds, the log's resolution.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.errors import RequestError
from feature_store.layout import IdType
from feature_store.registry import FeatureGroup, load_registry
from feature_store.serialization.codecs import FeatureType
from feature_store.training_sources import SourceSpec, as_of, read_source, served_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import types as T

KINDS = ("equal", "mismatched", "served_missing_in_source", "missing_when_source_has")
CAUSES = (
    "newer_than_source",
    "older_than_source",
    "not_in_store",
    "value_differs",
    "past_max_age",
    "encoding",
)
NUMBERS = (FeatureType.FLOAT, FeatureType.DOUBLE, FeatureType.INT)
EXPECTED = "__expected"
KEPT = 100  # mismatches listed in the report


@dataclass(frozen=True, slots=True)
class SkewJob:
    registry: Path
    log: str
    sources: tuple[SourceSpec, ...]
    start: datetime | None = None  # served at or after (--from)
    end: datetime | None = None  # served before (--to)


@dataclass(slots=True)
class FeatureSkew:
    compared: int = 0
    equal: int = 0
    mismatched: int = 0
    served_missing_in_source: int = 0
    missing_when_source_has: int = 0
    not_compared: int = 0  # served stale or error
    smape: float | None = None  # numbers: over the rows where both have a value

    @property
    def differing(self) -> int:
        return self.mismatched + self.served_missing_in_source + self.missing_when_source_has


@dataclass(slots=True)
class GroupSkew:
    rows: int = 0  # logged rows that asked for some of the group's features
    features: dict[str, FeatureSkew] = field(default_factory=dict)
    causes: dict[str, int] = field(default_factory=dict)  # differing values by cause
    not_in_source: list[str] = field(default_factory=list)  # features not compared

    @property
    def compared(self) -> int:
        return sum(f.compared for f in self.features.values())

    @property
    def differing(self) -> int:
        return sum(f.differing for f in self.features.values())

    @property
    def rate(self) -> float:
        return self.differing / self.compared if self.compared else 0.0


@dataclass(slots=True)
class SkewReport:
    groups: dict[str, GroupSkew] = field(default_factory=dict)
    mismatches: list[dict[str, object]] = field(default_factory=list)  # the first KEPT
    seconds: float = 0.0

    @property
    def compared(self) -> int:
        return sum(g.compared for g in self.groups.values())

    @property
    def differing(self) -> int:
        return sum(g.differing for g in self.groups.values())

    @property
    def rate(self) -> float:
        return self.differing / self.compared if self.compared else 0.0

    def as_json(self) -> dict[str, object]:
        from dataclasses import asdict

        doc = asdict(self)
        doc.update(compared=self.compared, differing=self.differing, rate=self.rate)
        return doc

    def markdown(self) -> str:
        out = [
            f"skew: {self.differing:,} of {self.compared:,} logged values differ from their "
            f"sources ({self.rate:.4%}) in {self.seconds:.1f} s",
            "",
            "| group | feature | compared | equal | mismatched | served, missing in source "
            "| missing, source has it | not compared | SMAPE |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, group in self.groups.items():
            for feature, f in group.features.items():
                smape = "-" if f.smape is None else f"{f.smape:.4f}"
                out.append(
                    f"| {name} | {feature} | {f.compared:,} | {f.equal:,} | {f.mismatched:,} | "
                    f"{f.served_missing_in_source:,} | {f.missing_when_source_has:,} | "
                    f"{f.not_compared:,} | {smape} |"
                )
        out.append("")
        for name, group in self.groups.items():
            causes = ", ".join(f"{c} {n:,}" for c, n in group.causes.items() if n) or "none"
            out.append(f"- {name}: {group.rows:,} logged rows; differing values by cause: {causes}")
            if group.not_in_source:
                out.append(
                    f"- {name}: not compared, the source has no column of: "
                    + ", ".join(group.not_in_source)
                )
        return "\n".join(out) + "\n"


def write_metrics(report: SkewReport, path: Path, now: float | None = None) -> None:
    """The report as Prometheus gauges in a text file (for node_exporter's textfile
    collector, or a push), written whole or not at all; deploy/prometheus/rules.yml alerts
    on them."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    values = Gauge(
        "feature_skew_values", "logged values by what the source says of them",
        ["group", "feature", "kind"], registry=registry,
    )  # fmt: skip
    differing = Gauge(
        "feature_skew_differing", "logged values that differ, by cause", ["group", "cause"],
        registry=registry,
    )  # fmt: skip
    ratio = Gauge(
        "feature_skew_differing_ratio", "the share of compared values that differ", ["group"],
        registry=registry,
    )  # fmt: skip
    smape = Gauge(
        "feature_skew_smape", "SMAPE of numbers where both have a value", ["group", "feature"],
        registry=registry,
    )  # fmt: skip
    rows = Gauge(
        "feature_skew_logged_rows", "logged rows of the group", ["group"], registry=registry
    )
    last = Gauge("feature_skew_last_run_timestamp_seconds", "when the check ran", registry=registry)
    for name, group in report.groups.items():
        rows.labels(name).set(group.rows)
        ratio.labels(name).set(group.rate)
        for cause, n in group.causes.items():
            differing.labels(name, cause).set(n)
        for feature, f in group.features.items():
            for kind in (*KINDS, "not_compared"):
                values.labels(name, feature, kind).set(getattr(f, kind))
            if f.smape is not None:
                smape.labels(name, feature).set(f.smape)
    last.set(time.time() if now is None else now)
    write_to_textfile(str(path), registry)


def parse_time(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise RequestError(f"{flag} {text!r}: not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise RequestError(f"{flag} {text!r}: give a time zone (Z or +00:00)")
    return parsed


def measure_skew(spark: SparkSession, job: SkewJob) -> SkewReport:
    """Compare every logged value of the sources' groups with its source (the module's
    text)."""
    from feature_store.training import read_log

    started = time.monotonic()
    registry = load_registry(job.registry)
    if not job.sources:
        raise RequestError("give at least one --source GROUP=PATH")
    report = SkewReport()
    for spec in job.sources:
        if spec.group not in registry.groups:
            known = ", ".join(sorted(registry.groups))
            raise RequestError(f"--source {spec.group}: no such group; known: {known}")
        group = registry.groups[spec.group]
        if group.aggregation is not None:
            raise RequestError(
                f"--source {spec.group}: a group of window aggregations has no stored values "
                "to compare"
            )
        source, absent = read_source(spark, spec, group)
        log = read_log(spark, job.log, registry, group.entity)
        skew, kept = _group_skew(log, source, group, absent, job, KEPT - len(report.mismatches))
        report.groups[group.name] = skew
        report.mismatches += kept
    report.seconds = time.monotonic() - started
    return report


def _group_skew(
    log: DataFrame,
    source: DataFrame,
    group: FeatureGroup,
    absent: list[str],
    job: SkewJob,
    keep: int,
) -> tuple[GroupSkew, list[dict[str, object]]]:
    from pyspark.sql import functions as F

    from feature_store.training_sources import ID, TIME, spark_type

    name = group.name
    compared = [f for f in group.features if f.name not in absent]
    statuses = [f"{name}__{f.name}__status" for f in group.features]
    types: dict[str, str | T.DataType] = {f"{name}__event_time": "timestamp"}
    types |= dict.fromkeys(statuses, "string")
    types |= {f"{name}__{f.name}": spark_type(f.type) for f in group.features}
    for column, kind in types.items():
        if column not in log.columns:  # the group was added after the log was written
            log = log.withColumn(column, F.lit(None).cast(kind))
    rows = log.where(F.coalesce(*[F.col(f"`{s}`") for s in statuses]).isNotNull())
    if job.start is not None:
        rows = rows.where(F.col("served_at") >= F.lit(job.start))
    if job.end is not None:
        rows = rows.where(F.col("served_at") < F.lit(job.end))
    id_type = "long" if group.entity.id_type is IdType.INT else "string"
    rows = rows.select(
        F.col("entity_id").cast(id_type).alias(ID),
        F.col("served_at").cast("timestamp").alias(TIME),
        F.col("request_id"),
        F.col(f"`{name}__event_time`").alias("__served_time"),
        *[F.col(f"`{name}__{f.name}`") for f in compared],
        *[F.col(f"`{name}__{f.name}__status`") for f in compared],
    )
    # read twice (the counts, then the differing values listed): computed once
    joined = as_of(rows, source, group.max_age_seconds, EXPECTED).persist()
    expected = dict(served_columns(group, F.col(EXPECTED)))
    seconds = F.col("__served_time").cast("long")
    theirs = F.col(f"{EXPECTED}.__event_time").cast("long")
    age = F.col(TIME).cast("long") - seconds  # of the write served, when it was served
    cause = F.when(F.lit(False), None)
    if group.max_age_seconds is not None:
        cause = F.when(age > group.max_age_seconds, F.lit("past_max_age"))
    cause = (
        cause.when(F.col(EXPECTED).isNull() | (seconds > theirs), F.lit("newer_than_source"))
        .when(F.col("__served_time").isNull(), F.lit("not_in_store"))
        .when(seconds < theirs, F.lit("older_than_source"))
        .otherwise(F.lit("value_differs"))
    )
    # one small record per logged value (its feature, kind, cause and SMAPE term), counted
    # by a group-by: a few expressions per feature, where one sum per feature, kind and cause
    # was slower (benchmarks/training_backfill.py)
    cells: list[Column] = []
    differing: list[Column] = []
    for i, f in enumerate(compared):
        column = f"{name}__{f.name}"
        got, status = F.col(f"`{column}`"), F.col(f"`{column}__status`")
        want, want_status = expected[column], expected[f"{column}__status"]
        # no source row in max_age: its status is null, which is not "present"
        has, has_want = status == "present", F.coalesce(want_status == "present", F.lit(False))
        same = got.eqNullSafe(want)
        verdict = (
            F.when(status.isin("stale", "error"), F.lit("not_compared"))
            .when(has & has_want & same, F.lit("equal"))
            .when((status == "missing") & ~has_want, F.lit("equal"))
            .when(has & has_want, F.lit("mismatched"))
            .when(has, F.lit("served_missing_in_source"))
            .when((status == "missing") & has_want, F.lit("missing_when_source_has"))
        )
        differs = verdict.isin("mismatched", "served_missing_in_source", "missing_when_source_has")
        # the same write, values equal at float32: only their encoding differs
        alike = _float32(got, f.type).eqNullSafe(_float32(want, f.type))
        why = F.when((cause == "value_differs") & alike, F.lit("encoding")).otherwise(cause)
        term = F.lit(None).cast("double")
        if f.type in NUMBERS:
            a, b = got.cast("double"), want.cast("double")
            smape = F.when(a == b, 0.0).otherwise(F.abs(a - b) / ((F.abs(a) + F.abs(b)) / 2))
            term = F.when(has & has_want, smape)
        cells.append(
            F.struct(
                F.lit(i).alias("i"),
                verdict.alias("kind"),
                F.when(differs, why).alias("cause"),
                term.alias("term"),
            )
        )
        differing.append(
            F.when(
                differs,
                F.struct(
                    F.lit(f.name).alias("feature"),
                    F.to_json(F.struct(got.alias("v"))).alias("served"),
                    F.to_json(F.struct(want.alias("v"))).alias("expected"),
                    status.alias("served_status"),
                    want_status.alias("expected_status"),
                    why.alias("cause"),
                ),
            )
        )
    counted = (
        (
            joined.select(F.inline(F.array(*cells)))
            .where(F.col("kind").isNotNull())
            .groupBy("i", "kind", "cause")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum("term").alias("terms"),
                F.count("term").alias("numbers"),
            )
            .collect()
        )
        if cells
        else []
    )
    skew = GroupSkew(rows=joined.count(), not_in_source=list(absent))
    skew.causes = dict.fromkeys(CAUSES, 0)
    features = [FeatureSkew() for _ in compared]
    terms = [[0.0, 0] for _ in compared]
    for r in counted:
        feature = features[r["i"]]
        setattr(feature, r["kind"], getattr(feature, r["kind"]) + r["n"])
        if r["cause"] is not None:
            skew.causes[r["cause"]] += r["n"]
        terms[r["i"]][0] += r["terms"] or 0.0
        terms[r["i"]][1] += r["numbers"]
    for f, feature, (total, numbers) in zip(compared, features, terms, strict=True):
        feature.compared = sum(getattr(feature, k) for k in KINDS)
        if f.type in NUMBERS and numbers:
            feature.smape = total / numbers
        skew.features[f.name] = feature
    kept: list[dict[str, object]] = []
    if keep > 0 and differing:
        listed = (
            joined.select(
                F.col(ID).alias("entity_id"),
                F.col("request_id"),
                F.col(TIME).alias("served_at"),
                F.col("__served_time").alias("served_event_time"),
                F.col(f"{EXPECTED}.__event_time").alias("expected_event_time"),
                F.explode(F.filter(F.array(*differing), lambda x: x.isNotNull())).alias("d"),
            )
            .limit(keep)
            .collect()
        )
        for r in listed:
            d = r["d"]
            kept.append(
                {
                    "group": name,
                    "feature": d["feature"],
                    "entity_id": r["entity_id"],
                    "request_id": r["request_id"],
                    "served_at": _iso(r["served_at"]),
                    "served": json.loads(d["served"]).get("v"),
                    "expected": json.loads(d["expected"]).get("v"),
                    "served_status": d["served_status"],
                    "expected_status": d["expected_status"],
                    "served_event_time": _iso(r["served_event_time"]),
                    "expected_event_time": _iso(r["expected_event_time"]),
                    "cause": d["cause"],
                }
            )
    joined.unpersist()
    return skew, kept


def _float32(value: Column, kind: FeatureType) -> Column:
    """A value at float32, where it is a float or floats; as it is otherwise."""
    if kind in (FeatureType.FLOAT, FeatureType.DOUBLE):
        return value.cast("float")
    if kind in (FeatureType.EMBEDDING, FeatureType.FLOAT_LIST):
        return value.cast("array<float>")
    return value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
