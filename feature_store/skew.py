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
- ``value_differs``: the same write, another value (a codec or a writer's bug).

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
CAUSES = ("newer_than_source", "older_than_source", "not_in_store", "value_differs")
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


@dataclass(slots=True)
class SkewReport:
    groups: dict[str, GroupSkew] = field(default_factory=dict)
    mismatches: list[dict[str, object]] = field(default_factory=list)  # the first KEPT
    seconds: float = 0.0

    @property
    def compared(self) -> int:
        return sum(f.compared for g in self.groups.values() for f in g.features.values())

    @property
    def differing(self) -> int:
        return sum(f.differing for g in self.groups.values() for f in g.features.values())

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

    from feature_store.training import ID, TIME, spark_type

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
    cause = (
        F.when(F.col(EXPECTED).isNull() | (seconds > theirs), F.lit(CAUSES[0]))
        .when(F.col("__served_time").isNull(), F.lit(CAUSES[2]))
        .when(seconds < theirs, F.lit(CAUSES[1]))
        .otherwise(F.lit(CAUSES[3]))
    )
    sums: list[Column] = [F.count(F.lit(1)).alias("rows")]
    differing: list[Column] = []
    for i, f in enumerate(compared):
        column = f"{name}__{f.name}"
        got, status = F.col(f"`{column}`"), F.col(f"`{column}__status`")
        want, want_status = expected[column], expected[f"{column}__status"]
        has, has_want = status == "present", want_status == "present"
        kinds = {
            "equal": (has & has_want & got.eqNullSafe(want)) | ((status == "missing") & ~has_want),
            "mismatched": has & has_want & ~got.eqNullSafe(want),
            "served_missing_in_source": has & ~has_want,
            "missing_when_source_has": (status == "missing") & has_want,
        }
        kinds = {k: F.coalesce(v, F.lit(False)) for k, v in kinds.items()}
        sums += [F.sum(v.cast("long")).alias(f"{k}{i}") for k, v in kinds.items()]
        sums.append(F.sum(status.isin("stale", "error").cast("long")).alias(f"skipped{i}"))
        differs = kinds["mismatched"] | kinds["served_missing_in_source"]
        differs = differs | kinds["missing_when_source_has"]
        for c in CAUSES:
            sums.append(F.sum((differs & (cause == c)).cast("long")).alias(f"{c}{i}"))
        if f.type in NUMBERS:
            a, b = got.cast("double"), want.cast("double")
            term = F.when(a == b, 0.0).otherwise(F.abs(a - b) / ((F.abs(a) + F.abs(b)) / 2))
            sums.append(F.avg(F.when(has & has_want, term)).alias(f"smape{i}"))
        differing.append(
            F.when(
                differs,
                F.struct(
                    F.lit(f.name).alias("feature"),
                    F.to_json(F.struct(got.alias("v"))).alias("served"),
                    F.to_json(F.struct(want.alias("v"))).alias("expected"),
                    status.alias("served_status"),
                    want_status.alias("expected_status"),
                    cause.alias("cause"),
                ),
            )
        )
    totals = joined.agg(*sums).collect()[0]
    skew = GroupSkew(rows=totals["rows"], not_in_source=list(absent))
    skew.causes = dict.fromkeys(CAUSES, 0)
    for i, f in enumerate(compared):
        counts = {k: totals[f"{k}{i}"] or 0 for k in KINDS}
        feature = FeatureSkew(
            compared=sum(counts.values()), not_compared=totals[f"skipped{i}"] or 0, **counts
        )
        if f.type in NUMBERS:
            feature.smape = totals[f"smape{i}"]
        skew.features[f.name] = feature
        for c in CAUSES:
            skew.causes[c] += totals[f"{c}{i}"] or 0
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


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
