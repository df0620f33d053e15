"""Window aggregations backfilled into training rows: each label row's answers computed from
the group's event history at the label's time exactly, as a read at that time answers them
(``windows.reference_answer``: the tiles after the one holding ``T - window`` through the
one holding ``T``), from the events at or before ``T`` (nothing after the label's time).

The events are in the form the aggregation backfill job takes (docs/aggregations.md): the
entity id, the event time (``event_time``, or ``--event-time-column``) and the record
fields the aggregates read. Per entity, its label rows and its events meet in one task
(a cogroup: one shuffle of each), and each label row's answer is computed over its
entity's events up to its time, in time order (no event is late). The cost per entity is
its label rows times its events (benchmarks/training_backfill.py measures plain groups
only).

An entity with no event at or before the label's time has no values (as a read of an
entity that never had one); otherwise ``count`` and ``sum`` answer 0 for an empty window
and the other functions null (status ``missing``). The group's event time is the newest
event in its longest window (none: null), and a value older than the group's ``max_age``
by that time is ``stale``, as a read marks it.
"""

from __future__ import annotations

import bisect
import math
import struct
from typing import TYPE_CHECKING, Any

from feature_store.errors import RequestError
from feature_store.layout import IdType
from feature_store.registry import FeatureGroup, Function
from feature_store.serialization.codecs import FeatureType
from feature_store.training_sources import ID, ROW, TIME, SourceSpec, spark_type
from feature_store.windows import MS, Event, field_types, reference_answer

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import Column, DataFrame, SparkSession

DEFAULT_TIME_COLUMN = "event_time"  # the aggregation backfill job's
_F32 = struct.Struct("<f")


def read_events(spark: SparkSession, spec: SourceSpec, group: FeatureGroup) -> DataFrame:
    """A group's events as (``id``, ``micros``: the event time, then each record field the
    aggregates read, as they read it), every column checked as a source's are."""
    from pyspark.sql import functions as F

    from feature_store.training_sources import open_source, source_time, takes

    assert group.aggregation is not None
    time_column = spec.time_column or DEFAULT_TIME_COLUMN
    frame, where = open_source(spark, spec)
    columns, schema = frame.columns, frame.schema
    id_column = spec.id_column or group.entity.join_key
    fields = field_types(group.aggregation, group)
    for name, flag in (
        (id_column, "the id column"),
        (time_column, "--event-time-column"),
        *((f, f"a field {group.name}'s aggregates read") for f in fields),
    ):
        if name not in columns:
            raise RequestError(f"{where}: no column {name!r} ({flag}); it has {', '.join(columns)}")
    for name, kind in fields.items():
        found = schema[name].dataType
        if not takes(kind, found):
            wanted = "an integer" if kind is FeatureType.INT else "a number"
            raise RequestError(
                f"{where}: column {name!r} has type {found.simpleString()}: the aggregates "
                f"of {group.name} read it as {wanted}"
            )
    when = source_time(frame, time_column, where)
    id_type = "long" if group.entity.id_type is IdType.INT else "string"
    cast = {FeatureType.INT: "long", FeatureType.DOUBLE: "double"}
    return frame.select(
        F.col(f"`{id_column}`").cast(id_type).alias("id"),
        F.unix_micros(when).alias("micros"),
        *[F.col(f"`{name}`").cast(cast[kind]).alias(name) for name, kind in fields.items()],
    ).where(F.col("id").isNotNull() & F.col("micros").isNotNull())


def answer_columns(group: FeatureGroup) -> list[tuple[str, str]]:
    """The output's columns of a group's answers and their Spark types (DDL): per feature
    its value and status, then the group's event time (unix seconds here)."""
    out = []
    for f in group.features:
        out.append((f"{group.name}__{f.name}", spark_type(f.type).simpleString()))
        out.append((f"{group.name}__{f.name}__status", "string"))
    out.append((f"{group.name}__event_time", "long"))
    return out


def window_answers(
    rows: DataFrame, events: DataFrame, group: FeatureGroup, out: str
) -> tuple[DataFrame, list[tuple[str, Column]], Column]:
    """``rows`` (with training.py's ``ID``, ``TIME`` and ``ROW``) with their answers in columns
    ``out__0``, ``out__1``, ... and ``out`` (whether the entity had an event by the row's
    time), the output's columns of the group read from them, and that flag."""
    from pyspark.sql import functions as F

    columns = answer_columns(group)
    asked = rows.select(F.col(ID).alias("id"), F.col(ROW), F.unix_micros(TIME).alias("micros"))
    flat = [f"{out}__{k}" for k in range(len(columns))]
    schema = ", ".join(
        [f"{ROW} long", f"{out} boolean"]
        + [f"{name} {kind}" for name, (_, kind) in zip(flat, columns, strict=True)]
    )
    answered = (
        asked.where(F.col("micros").isNotNull())
        .groupBy("id")
        .cogroup(events.groupBy("id"))
        .applyInPandas(_answerer(group, out, flat, ROW), schema)
    )
    joined = rows.join(answered, ROW, "left")
    read = [(name, F.col(f)) for f, (name, _) in zip(flat, columns, strict=True)]
    name, seconds = read[-1]
    read[-1] = (name, F.timestamp_seconds(seconds))
    return joined, read, F.coalesce(F.col(out), F.lit(False))


def _answerer(group: FeatureGroup, out: str, flat: list[str], row_column: str) -> Any:
    """The cogroup's function: an entity's label rows and events in, each row's answers
    out (``answer_at``), a column each."""
    import pandas as pd

    def answers(labels: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
        events = events.sort_values("micros", kind="stable")
        fields = [c for c in events.columns if c not in ("id", "micros")]
        history = [
            Event(
                time_ms=int(micros) // 1000,
                values={f: v for f, v in zip(fields, values, strict=True) if not _null(v)},
            )
            for micros, *values in events[["micros", *fields]].itertuples(index=False)
        ]
        times = [e.time_ms for e in history]
        rows, had = [], []
        cells: list[list[object]] = [[] for _ in flat]
        for row, micros in labels[[row_column, "micros"]].itertuples(index=False):
            at_ms = int(micros) // 1000
            seen = history[: bisect.bisect_right(times, at_ms)]
            values = answer_at(group, seen, at_ms) if seen else [None] * len(flat)
            rows.append(row)
            had.append(bool(seen))
            for column, value in zip(cells, values, strict=True):
                column.append(value)
        frame = {row_column: pd.Series(rows, dtype="int64"), out: pd.Series(had, dtype=bool)}
        for name, column in zip(flat, cells, strict=True):
            frame[name] = pd.Series(column, dtype=object)
        return pd.DataFrame(frame)

    return answers


def _null(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def answer_at(group: FeatureGroup, events: list[Event], at_ms: int) -> list[object]:
    """One label row's answers at ``at_ms`` from its entity's events up to then (in time
    order): per feature its value and status, then the group's event time (unix seconds:
    the newest event in its longest window; None without one)."""
    aggregation = group.aggregation
    assert aggregation is not None
    values = reference_answer(aggregation, events, at_ms / MS)
    tile = aggregation.tile_seconds * MS
    longest = max(a.window_seconds for a in aggregation.aggregates) * MS
    low = ((at_ms - longest) // tile + 1) * tile
    newest = max((e.time_ms for e in events if low <= e.time_ms), default=None)
    stale = (
        group.max_age_seconds is not None
        and newest is not None
        and at_ms - newest > group.max_age_seconds * MS
    )
    out: list[object] = []
    for f, a, value in zip(group.features, aggregation.aggregates, values, strict=True):
        if a.function is Function.LAST_N and f.type is FeatureType.FLOAT_LIST and value:
            value = [_F32.unpack(_F32.pack(float(v)))[0] for v in value]  # type: ignore[union-attr]
        out.append(value)
        out.append("missing" if value is None else "stale" if stale else "present")
    out.append(None if newest is None else newest // MS)
    return out
