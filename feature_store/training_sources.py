"""Training rows the serving log does not cover, answered from the feature sources, point in
time (``feature-store training-set --backfill GROUP=PATH``): Feast's
``get_historical_features``, on this store's data and codecs.

A source is a group's rows in the nightly job's input form (parquet or CSV): the entity id
column, the group's feature columns by name, and each row's event time
(``event_timestamp``, or ``--event-time-column``); one entity may have many rows, one per
snapshot. A label row takes, per group, the newest source row of its entity whose event
time is at or before the label's time and no older than the group's ``max_age``: the
values a lookup at the label's time would have been answered with, fresh. It is the same
as-of join as the log's (training.py): label rows and source rows in one frame, ordered
per entity by time (a source row before a label row of the same time), each label row
taking the last source row before it; one shuffle per group, whatever the number of
snapshots.

Values are what serving would answer, not what the file holds: each goes through its
feature's codec as the nightly job writes it and serving reads it. A float feature is
stored as the shortest text of its float32 (``0.1`` comes back as the double 0.1, not
float32's 0.100000001...); embeddings and float lists are float32; ints, bools, strings and
int lists come back as they went. A null cell is a value the job does not write: status
``missing``. A value the codec refuses (a float past the float32 range, an embedding of
another dimension) is one the job would have quarantined: null, status ``error``.

A group of window aggregations has no stored values: its source is its event history, and
training_windows.py computes each label row's answers from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.errors import EncodingError, RequestError
from feature_store.layout import IdType
from feature_store.registry import FeatureGroup, Registry
from feature_store.serialization.codecs import Codec, FeatureType

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import types as T

ID, TIME = "__id", "__time"  # a label row's entity id and time, in the joins' frames
ROW = "__row"  # a label row's number, as read
SOURCE_SUFFIX = "__source"  # the output's column per group: "log", "backfill" or null
FROM_LOG, FROM_SOURCE = "log", "backfill"
EVENT = "__event_time"  # a source row's event time, in its struct


def spark_type(kind: FeatureType) -> T.DataType:
    from pyspark.sql import types as T

    return {
        FeatureType.FLOAT: T.DoubleType(),
        FeatureType.DOUBLE: T.DoubleType(),
        FeatureType.INT: T.LongType(),
        FeatureType.BOOL: T.BooleanType(),
        FeatureType.STRING: T.StringType(),
        FeatureType.EMBEDDING: T.ArrayType(T.FloatType()),
        FeatureType.FLOAT_LIST: T.ArrayType(T.FloatType()),
        FeatureType.INT_LIST: T.ArrayType(T.LongType()),
    }[kind]


def label_time(column: Column, kind: T.DataType) -> Column:
    """A label time as a timestamp: a timestamp or date as it is, text parsed, and a number
    as unix time in seconds, ms, µs or ns by its size (pandas' timestamps arrive as
    nanoseconds: spark.sql.legacy.parquet.nanosAsLong)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(kind, T.TimestampType | T.TimestampNTZType | T.DateType):
        return column.cast("timestamp")
    if isinstance(kind, T.StringType):
        return F.to_timestamp(column)
    if isinstance(kind, T.NumericType):
        x = column.cast("double")
        magnitude = F.abs(x)
        seconds = (
            F.when(magnitude >= 1e17, x / 1e9)
            .when(magnitude >= 1e14, x / 1e6)
            .when(magnitude >= 1e11, x / 1e3)
            .otherwise(x)
        )
        return F.timestamp_micros((seconds * 1e6).cast("long"))
    raise RequestError(f"the label time column has type {kind.simpleString()}: not a time")


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where a group's source rows are, and how they are read."""

    group: str
    path: str
    id_column: str | None = None  # default: the entity type's join key
    time_column: str | None = None  # default: event_timestamp (events: event_time)
    fmt: str | None = None  # parquet or csv; default: by the name's ending


def parse_backfills(values: list[str], flag: str = "--backfill") -> dict[str, str]:
    """``GROUP=PATH`` arguments, each group once."""
    out: dict[str, str] = {}
    for value in values:
        group, sep, path = value.partition("=")
        if not sep or not group or not path:
            raise RequestError(f"{flag} {value!r}: expected GROUP=PATH")
        if group in out:
            raise RequestError(f"{flag} names group {group!r} twice")
        out[group] = path
    return out


def source_groups(registry: Registry, entity: str, specs: list[SourceSpec]) -> list[FeatureGroup]:
    """The groups the sources fill, each of the labels' entity type and not aggregated."""
    groups = []
    for spec in specs:
        if spec.group not in registry.groups:
            known = ", ".join(sorted(registry.groups))
            raise RequestError(f"--backfill {spec.group}: no such group; known: {known}")
        group = registry.groups[spec.group]
        if group.entity.name != entity:
            raise RequestError(
                f"--backfill {spec.group}: the group's entity type is {group.entity.name!r}, "
                f"the labels' is {entity!r}"
            )
        groups.append(group)
    return groups


def read_source(
    spark: SparkSession, spec: SourceSpec, group: FeatureGroup
) -> tuple[DataFrame, list[str]]:
    """A source's rows as (``id``, ``time``, ``values``: a struct of the group's feature
    columns as the file types them, null where it has none, and the row's event time), and
    the features it has no column of. Every column is checked: a missing id or time column,
    a feature column of a type the feature cannot take, or a time column that is not one is
    refused, naming the file and column."""
    from pyspark.sql import functions as F

    frame, where = open_source(spark, spec)
    columns = frame.columns
    id_column = spec.id_column or group.entity.join_key
    time_column = spec.time_column or "event_timestamp"
    for name, flag in ((id_column, "the id column"), (time_column, "--event-time-column")):
        if name not in columns:
            raise RequestError(f"{where}: no column {name!r} ({flag}); it has {', '.join(columns)}")
    schema = frame.schema
    when = source_time(frame, time_column, where)
    values, absent = [], []
    for feature in group.features:
        if feature.name not in columns:  # a feature the source does not have: null
            values.append(F.lit(None).cast(spark_type(feature.type)).alias(feature.name))
            absent.append(feature.name)
            continue
        found = schema[feature.name].dataType
        if not takes(feature.type, found):
            raise RequestError(
                f"{where}: column {feature.name!r} has type {found.simpleString()}, which "
                f"feature {group.name}.{feature.name} ({feature.type.value}) cannot take"
            )
        values.append(F.col(f"`{feature.name}`").alias(feature.name))
    id_type = "long" if group.entity.id_type is IdType.INT else "string"
    rows = frame.select(
        F.col(f"`{id_column}`").cast(id_type).alias("id"),
        when.alias("time"),
        F.struct(*values, when.alias(EVENT)).alias("values"),
    ).where(F.col("id").isNotNull() & F.col("time").isNotNull())
    return rows, absent


def open_source(spark: SparkSession, spec: SourceSpec) -> tuple[DataFrame, str]:
    """A source's rows as its file has them, and how errors name it."""
    kind = spec.fmt or ("csv" if spec.path.lower().endswith((".csv", ".csv.gz")) else "parquet")
    where = f"--backfill {spec.group}={spec.path}"
    if not Path(spec.path).exists() and "://" not in spec.path:
        raise RequestError(f"{where}: no such file or directory")
    reader = spark.read
    if kind == "csv":
        return reader.option("header", "true").option("inferSchema", "true").csv(spec.path), where
    return reader.parquet(spec.path), where


def source_time(frame: DataFrame, column: str, where: str) -> Column:
    """A source's event time column as a timestamp; refused, naming the file and column,
    where it is not a time."""
    from pyspark.sql import functions as F

    kind = frame.schema[column].dataType
    try:
        return label_time(F.col(f"`{column}`"), kind)
    except RequestError:
        raise RequestError(
            f"{where}: column {column!r} has type {kind.simpleString()}, not a time "
            "(a timestamp, unix time as a number, or RFC 3339 text)"
        ) from None


def takes(kind: FeatureType, found: T.DataType) -> bool:
    """Whether a feature of ``kind`` takes a source column of Spark type ``found``."""
    from pyspark.sql import types as T

    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if kind in (FeatureType.FLOAT, FeatureType.DOUBLE):
        return isinstance(found, T.NumericType)
    if kind is FeatureType.INT:
        return isinstance(found, integral)
    if kind is FeatureType.BOOL:
        return isinstance(found, T.BooleanType)
    if kind is FeatureType.STRING:
        return isinstance(found, T.StringType)
    if not isinstance(found, T.ArrayType):
        return False
    if kind is FeatureType.INT_LIST:
        return isinstance(found.elementType, integral)
    return isinstance(found.elementType, T.NumericType)  # embeddings, float lists


def as_of(rows: DataFrame, source: DataFrame, max_age: int | None, out: str) -> DataFrame:
    """``rows`` (with the columns ``ID`` and ``TIME`` of training.py) with a column
    ``out``: the values of the newest source row of the same id at or before that time and
    within ``max_age`` seconds of it, or null."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    kind = "__source_kind"
    values_type = source.schema["values"].dataType
    wanted = rows.withColumn(kind, F.lit(1)).withColumn(out, F.lit(None).cast(values_type))
    others = [
        F.lit(None).cast(f.dataType).alias(f.name)
        for f in rows.schema.fields
        if f.name not in (ID, TIME)
    ]
    offered = source.select(
        *others,
        F.col("id").alias(ID),
        F.col("time").alias(TIME),
        F.lit(0).alias(kind),
        F.col("values").alias(out),
    )
    order = (
        Window.partitionBy(ID)
        .orderBy(F.col(TIME).asc_nulls_first(), F.col(kind))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    newest = F.when(F.col(TIME).isNotNull(), F.last(out, ignorenulls=True).over(order))
    joined = wanted.unionByName(offered).withColumn(out, newest).where(F.col(kind) == 1)
    if max_age is not None:
        age = F.col(TIME).cast("double") - F.col(f"{out}.{EVENT}").cast("double")
        joined = joined.withColumn(out, F.when(age <= max_age, F.col(out)))
    return joined.drop(kind)


def served_columns(group: FeatureGroup, values: Column) -> list[tuple[str, Column]]:
    """The output's columns of ``group`` from a source row's ``values`` (a struct; null: no
    row): each value as serving would answer it and its status, and the event time."""
    from pyspark.sql import functions as F

    out = []
    for feature in group.features:
        raw = values[feature.name]
        refused = refuses(feature.codec, raw)
        served = F.when(~refused, served_value(feature.codec, raw)).cast(spark_type(feature.type))
        status = (
            F.when(values.isNull(), None)
            .when(raw.isNull(), "missing")
            .when(refused, "error")
            .otherwise("present")
        )
        out.append((f"{group.name}__{feature.name}", served))
        out.append((f"{group.name}__{feature.name}__status", status))
    out.append((f"{group.name}__event_time", values[EVENT]))
    return out


def _past_float32(x: Column) -> Column:
    """A finite double that float32 rounds to an infinity (the codec refuses it)."""
    from pyspark.sql import functions as F

    inf = F.lit(float("inf"))
    return (F.abs(x.cast("float")) == inf) & (F.abs(x.cast("double")) != inf)


def refuses(codec: Codec, raw: Column) -> Column:
    """Whether the nightly job's codec refuses a (non-null) source value: the row is
    quarantined, never written."""
    from pyspark.sql import functions as F

    kind = codec.type
    if kind is FeatureType.FLOAT:
        return F.coalesce(_past_float32(raw), F.lit(False))
    if kind in (FeatureType.EMBEDDING, FeatureType.FLOAT_LIST):
        past = F.exists(raw, _past_float32)
        if kind is FeatureType.EMBEDDING:
            past = past | (F.size(raw) != F.lit(codec.dim))
        return F.coalesce(past, F.lit(False))
    return F.lit(False)


def served_value(codec: Codec, raw: Column) -> Column:
    """What serving answers for a source value the nightly job wrote (the module's text)."""
    from pyspark.sql import functions as F

    if codec.type is FeatureType.FLOAT:
        x = raw.cast("double")
        return F.when(F.isnan(x) | (F.abs(x) == F.lit(float("inf"))), x).otherwise(_float32_text(x))
    return raw  # float32 lists by the cast; ints, bools, strings and int lists as they went


def _float32_text(raw: Column) -> Column:
    """A finite float as serving answers it: the double of the shortest text of its float32
    (codecs.encode_float32, then decode_float), each distinct value encoded once."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf  # type: ignore[attr-defined]

    def served(values: pd.Series) -> pd.Series:
        return values.map(_served_floats(values.unique()))

    # Spark reads the kind of UDF from the hints, which this module's postponed annotations
    # leave as text
    served.__annotations__ = {"values": pd.Series, "return": pd.Series}
    served = pandas_udf("double")(served)
    return served(raw)  # type: ignore[no-any-return]


def _served_floats(distinct: Iterable[float]) -> Mapping[float, float]:
    from feature_store.serialization.codecs import decode_float, encode_float32

    out: dict[float, float] = {}
    for x in distinct:
        try:
            out[x] = decode_float(encode_float32(float(x)))
        except EncodingError:  # past float32's range: refused before this is used
            out[x] = float("nan")
    return out
