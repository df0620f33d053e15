"""Training sets from the serving log, and the Kafka log's sink (Spark).

``feature-store training-set`` joins label rows to the vectors the serving log holds:

- A label row that names a request (a non-null ``request_id``, or ``--request-id-column``)
  gets exactly that request's vector of its entity, or none when that request was not
  logged (sampled out, or lost).
- Every other label row gets the newest vector of its entity served at or before its time
  (point in time: nothing served after the label's time is used).

An as-of join without a range join: the label rows and the log's rows of the entity type
are put in one frame, ordered per entity by time (a log row before a label row of the same
time), and each label row takes the last log row before it (``last(..., ignorenulls)`` over
the window), so the work is one shuffle whatever the number of vectors per entity.

Where the log has none of a group's values for a label row, ``--backfill GROUP=PATH``
answers it from the group's source rows, point in time (training_sources.py), or a group of
window aggregations from its events (training_windows.py); ``<group>__source`` says which.

``feature-store log-sink`` reads the serving log's Kafka topic (``--feature-log
kafka://...``) and writes its records into the file sink's layout (parquet under
``DIR/entity_type=<name>/date=YYYY-MM-DD/hour=HH/``), checkpointed. Each micro-batch is
appended once; a batch run again after a failure may append its rows twice, which the
training set's joins do not mind (an exact join takes one row per request and entity, and
a duplicate is never newer than itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.errors import RequestError
from feature_store.layout import IdType
from feature_store.registry import EntityType, FeatureGroup, Registry, load_registry
from feature_store.serialization.codecs import FeatureType
from feature_store.training_sources import (
    FROM_LOG,
    FROM_SOURCE,
    ID,
    ROW,
    SOURCE_SUFFIX,
    TIME,
    SourceSpec,
    as_of,
    label_time,
    read_source,
    served_columns,
    source_groups,
    spark_type,
)
from feature_store.training_windows import read_events, window_answers

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import types as T

KIND, LABEL, VECTOR = "__kind", "__label", "__vector"
RID, EID = "__request_id", "__entity_id"
# the columns a training set adds to the label rows' own, besides the features'
SERVED_COLUMNS = ("served_request_id", "served_at", "served_api", "served_source")
LOG_COLUMNS = ("request_id", "served_at", "api", "source")


def feature_columns(registry: Registry, entity: EntityType) -> list[tuple[str, FeatureType | None]]:
    """The log's columns of an entity type's features, in schema order: each value
    column with its type, its status column and each group's event time (None)."""
    out: list[tuple[str, FeatureType | None]] = []
    for g in registry.groups.values():
        if g.entity.name == entity.name:
            for f in g.features:
                out += [(f"{g.name}__{f.name}", f.type), (f"{g.name}__{f.name}__status", None)]
            out.append((f"{g.name}__event_time", None))
    return out


# --- training sets --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainingSetJob:
    registry: Path
    labels: str
    log: str | None  # None: the label rows are answered from the sources alone
    output: str
    id_column: str | None = None  # default: the entity type's join key
    time_column: str = "event_timestamp"
    entity_type: str | None = None  # default: the one whose join key the labels carry
    request_id_column: str = "request_id"  # used where the labels have it
    labels_format: str | None = None  # parquet or csv; default: by the name's ending
    overwrite: bool = False
    # groups' sources for what the log does not cover (training_sources.py)
    backfill: tuple[SourceSpec, ...] = ()


@dataclass(slots=True)
class TrainingReport:
    label_rows: int = 0
    by_request: int = 0  # joined to the request they name
    point_in_time: int = 0  # joined to the newest vector at or before their time
    no_vector: int = 0  # of all label rows: joined to nothing
    request_not_logged: int = 0  # of those: they name a request the log does not hold
    stale: dict[str, int] = field(default_factory=dict)  # per feature: rows served stale
    missing: dict[str, int] = field(default_factory=dict)  # per feature: rows served missing
    # per group with a source: rows whose values came from it (the log had none for them)
    backfilled: dict[str, int] = field(default_factory=dict)
    uncovered: int = 0  # rows with no values at all: neither logged nor in a source
    absent: dict[str, list[str]] = field(default_factory=dict)  # features a source lacks
    seconds: float = 0.0
    output: str = ""

    def lines(self) -> list[str]:
        out = [
            f"training set: {self.label_rows} label rows in {self.seconds:.1f} s "
            f"({self.label_rows / max(self.seconds, 1e-9):,.0f} rows/s) -> {self.output}",
            f"  {self.by_request} joined to the request they name, {self.point_in_time} to "
            "the newest vector served at or before their time",
            f"  {self.no_vector} with no vector"
            + (
                f" ({self.request_not_logged} name a request the log does not hold)"
                if self.request_not_logged
                else ""
            ),
        ]
        for group, n in self.backfilled.items():
            out.append(f"  {n} rows' values of {group} from its source (point in time)")
        if self.backfilled:
            out.append(f"  {self.uncovered} rows with no values, logged or in a source")
        for group, names in self.absent.items():
            out.append(f"  the source of {group} has no column of {', '.join(names)}: null")
        for title, counts in (("stale", self.stale), ("missing", self.missing)):
            shown = sorted(((n, f) for f, n in counts.items() if n), reverse=True)
            if shown:
                top = ", ".join(f"{f} {n}" for n, f in shown[:10])
                more = f" and {len(shown) - 10} more features" if len(shown) > 10 else ""
                out.append(f"  served {title}: {top}{more}")
        return out


def read_labels(spark: SparkSession, path: str, fmt: str | None) -> DataFrame:
    kind = fmt or ("csv" if path.lower().endswith((".csv", ".csv.gz")) else "parquet")
    if kind not in ("csv", "parquet"):
        raise RequestError(f"--labels-format {kind!r}: expected parquet or csv")
    if not Path(path).exists() and "://" not in path:
        raise RequestError(f"--labels {path}: no such file or directory")
    reader = spark.read
    if kind == "csv":
        return reader.option("header", "true").option("inferSchema", "true").csv(path)
    return reader.parquet(path)


def label_entity(registry: Registry, columns: list[str], job: TrainingSetJob) -> EntityType:
    """The labels' entity type: named, or the one whose join key (or ``--id-column``)
    they carry."""
    if job.entity_type is not None:
        if job.entity_type not in registry.entities:
            known = ", ".join(sorted(registry.entities))
            raise RequestError(f"--entity-type {job.entity_type!r} is unknown; known: {known}")
        return registry.entities[job.entity_type]
    keys = [e for e in registry.entities.values() if e.join_key in columns]
    if len(keys) == 1:
        return keys[0]
    if not keys:
        joins = ", ".join(f"{e.join_key} ({e.name})" for e in registry.entities.values())
        raise RequestError(
            f"the labels have no join key column ({joins}); name the entity type with "
            "--entity-type and the id column with --id-column"
        )
    raise RequestError(
        f"the labels carry the join keys of {', '.join(e.name for e in keys)}: name one "
        "with --entity-type"
    )


def read_log(
    spark: SparkSession, log: str | None, registry: Registry, entity: EntityType
) -> DataFrame:
    """The log's rows of ``entity``; none (in its schema) without a log."""
    if log is None:
        from pyspark.sql import types as T

        kinds = dict(feature_columns(registry, entity))
        schema = T.StructType(
            [
                T.StructField("request_id", T.StringType()),
                T.StructField("served_at", T.TimestampType()),
                T.StructField("api", T.StringType()),
                T.StructField(
                    "entity_id",
                    T.LongType() if entity.id_type is IdType.INT else T.StringType(),
                ),
                T.StructField("source", T.StringType()),
            ]
            + [T.StructField(name, _log_type(name, kind)) for name, kind in kinds.items()]
        )
        return spark.createDataFrame([], schema)
    root = f"{log.rstrip('/')}/entity_type={entity.name}"
    if "://" not in root and not Path(root).is_dir():
        raise RequestError(f"--log {log}: no log of entity type {entity.name!r} ({root})")
    frame = spark.read.option("mergeSchema", "true").parquet(root)
    return frame.drop("date", "hour")


def _log_type(name: str, kind: FeatureType | None) -> T.DataType:
    from pyspark.sql import types as T

    if kind is not None:
        return spark_type(kind)
    return T.TimestampType() if name.endswith("__event_time") else T.StringType()


def build_training_set(
    spark: SparkSession, job: TrainingSetJob, progress: Callable[[str], None] | None = None
) -> TrainingReport:
    """Join the labels to the log (see the module's docstring), write the output (parquet)
    and report what was joined."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.monotonic()
    registry = load_registry(job.registry)
    labels = read_labels(spark, job.labels, job.labels_format)
    columns = labels.columns
    entity = label_entity(registry, columns, job)
    id_column = job.id_column or entity.join_key
    for name, flag in ((id_column, "--id-column"), (job.time_column, "--time-column")):
        if name not in columns:
            raise RequestError(
                f"the labels have no column {name!r} ({flag}); they have {', '.join(columns)}"
            )
    if job.log is None and not job.backfill:
        raise RequestError("nothing to join the labels to: give --log, --backfill, or both")
    groups = [g for g in registry.groups.values() if g.entity.name == entity.name]
    backfilled = source_groups(registry, entity.name, list(job.backfill))
    features = [name for name, _ in feature_columns(registry, entity)]
    origins = [f"{g.name}{SOURCE_SUFFIX}" for g in groups]
    clash = sorted(set(columns) & {*features, *SERVED_COLUMNS, *origins})
    if clash:
        raise RequestError(f"the labels already have columns the output adds: {', '.join(clash)}")
    sources, absent = [], {}
    for spec, group in zip(job.backfill, backfilled, strict=True):
        if group.aggregation is not None:  # its event history (training_windows.py)
            sources.append(read_events(spark, spec, group))
            continue
        rows, absent[group.name] = read_source(spark, spec, group)
        sources.append(rows)
    log = read_log(spark, job.log, registry, entity)
    for name in features:  # a feature added since the log was written: null in it
        if name not in log.columns:
            log = log.withColumn(name, F.lit(None))
    id_type = "long" if entity.id_type is IdType.INT else "string"
    # the label row travels whole (a struct) beside its id, time and number
    label = F.struct(*[F.col(f"`{c}`") for c in columns])
    time_kind = labels.schema[job.time_column].dataType
    try:
        when = label_time(F.col(f"`{job.time_column}`"), time_kind)
    except RequestError:
        raise RequestError(
            f"--labels {job.labels}: column {job.time_column!r} (--time-column) has type "
            f"{time_kind.simpleString()}, not a time"
        ) from None
    rows = labels.select(
        label.alias(LABEL),
        F.col(f"`{id_column}`").cast(id_type).alias(ID),
        when.alias(TIME),
        # numbered as read (the same numbers however often a plan reads it again), for
        # what is computed apart and joined back to its row (training_windows.py)
        F.monotonically_increasing_id().alias(ROW),
    )
    served = [F.col(c).alias(s) for c, s in zip(LOG_COLUMNS, SERVED_COLUMNS, strict=True)]
    vector = F.struct(*served, *[F.col(f"`{c}`") for c in features])
    vector_type = log.select(vector.alias(VECTOR)).schema[VECTOR].dataType
    named = job.request_id_column in columns
    parts = []
    if named:
        asked = F.col(f"{LABEL}.`{job.request_id_column}`").cast("string")
        exact_rows = rows.where(asked.isNotNull())
        rows = rows.where(asked.isNull())
        logged = log.dropDuplicates(["request_id", "entity_id"]).select(
            F.col("request_id").alias(RID),
            F.col("entity_id").cast(id_type).alias(EID),
            vector.alias(VECTOR),
        )
        parts.append(
            exact_rows.join(
                logged, (asked == F.col(RID)) & (F.col(ID) == F.col(EID)), "left"
            ).select(LABEL, ID, TIME, ROW, VECTOR)
        )
    if job.log is None:  # no vectors: the sources answer every row, no join to make
        parts.append(rows.select(LABEL, ID, TIME, ROW, F.lit(None).cast(vector_type).alias(VECTOR)))
    # point in time: labels and vectors in one frame, per entity in time order, a vector
    # before a label of the same time; each label takes the last vector before it
    wanted = rows.select(
        LABEL, ID, TIME, ROW, F.lit(1).alias(KIND), F.lit(None).cast(vector_type).alias(VECTOR)
    )
    vectors = log.select(
        F.lit(None).cast(rows.schema[LABEL].dataType).alias(LABEL),
        F.lit(None).cast("long").alias(ROW),
        F.col("entity_id").cast(id_type).alias(ID),
        F.col("served_at").cast("timestamp").alias(TIME),
        F.lit(0).alias(KIND),
        vector.alias(VECTOR),
    )
    order = (
        Window.partitionBy(ID)
        .orderBy(F.col(TIME).asc_nulls_first(), F.col(KIND))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    if job.log is not None:
        parts.append(
            wanted.unionByName(vectors)
            .withColumn(
                VECTOR,
                F.when(F.col(TIME).isNotNull(), F.last(VECTOR, ignorenulls=True).over(order)),
            )
            .where(F.col(KIND) == 1)
            .select(LABEL, ID, TIME, ROW, VECTOR)
        )
    joined = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    # what the log does not cover, from the groups' sources (training_sources.py)
    backfill: dict[str, tuple[list[tuple[str, Column]], Column]] = {}
    for i, (group, source) in enumerate(zip(backfilled, sources, strict=True)):
        scratch = f"__backfill{i}"
        if group.aggregation is not None:
            joined, answers, found = window_answers(joined, source, group, scratch)
            backfill[group.name] = (answers, found)
            continue
        joined = as_of(joined, source, group.max_age_seconds, scratch)
        values = F.col(scratch)
        backfill[group.name] = (served_columns(group, values), values.isNotNull())
    out = joined.select(f"{LABEL}.*", *_output(groups, backfill))
    out.write.mode("overwrite" if job.overwrite else "errorifexists").parquet(job.output)
    report = _report(
        spark.read.parquet(job.output), features, job.request_id_column, named, list(backfill)
    )
    report.absent = {g: names for g, names in absent.items() if names}
    report.seconds = time.monotonic() - started
    report.output = job.output
    if progress is not None:
        for line in report.lines():
            progress(line)
    return report


def _output(
    groups: list[FeatureGroup], backfill: dict[str, tuple[list[tuple[str, Column]], Column]]
) -> list[Column]:
    """The output's columns besides the label's: what was served (the log's), then each
    group's values (logged, or where the log has none of the group's, its source's), then
    where each group's came from."""
    from pyspark.sql import functions as F

    def logged(name: str) -> Column:
        return F.col(f"{VECTOR}.`{name}`")

    out = [logged(name) for name in SERVED_COLUMNS]
    origins = []
    for group in groups:
        statuses = [logged(f"{group.name}__{f.name}__status") for f in group.features]
        covered = F.coalesce(*statuses).isNotNull()  # the log answered some of the group
        origin = F.when(covered, F.lit(FROM_LOG))
        if group.name in backfill:
            columns, found = backfill[group.name]
            out += [F.when(covered, logged(n)).otherwise(c).alias(n) for n, c in columns]
            origin = origin.when(found, F.lit(FROM_SOURCE))
        else:
            names = [f"{group.name}__{f.name}" for f in group.features]
            out += [logged(n).alias(n) for name in names for n in (name, f"{name}__status")]
            out.append(logged(f"{group.name}__event_time").alias(f"{group.name}__event_time"))
        origins.append(origin.alias(f"{group.name}{SOURCE_SUFFIX}"))
    return out + origins


def _report(
    out: DataFrame, features: list[str], rid: str, named: bool, backfilled: list[str]
) -> TrainingReport:
    from pyspark.sql import functions as F

    has = F.col("served_at").isNotNull()
    asked = F.col(f"`{rid}`").isNotNull() if named else F.lit(False)
    statuses = [c for c in features if c.endswith("__status")]
    sums = [F.count(F.lit(1)).alias("rows"), F.sum((~has).cast("long")).alias("none")]
    sums += [F.sum((asked & has).cast("long")).alias("exact")]
    sums += [F.sum((asked & ~has).cast("long")).alias("unlogged")]
    for i, c in enumerate(statuses):
        sums.append(F.sum((F.col(f"`{c}`") == "stale").cast("long")).alias(f"s{i}"))
        sums.append(F.sum((F.col(f"`{c}`") == "missing").cast("long")).alias(f"m{i}"))
    for i, group in enumerate(backfilled):
        origin = F.col(f"`{group}{SOURCE_SUFFIX}`")
        sums.append(F.sum((origin == FROM_SOURCE).cast("long")).alias(f"b{i}"))
    if backfilled:
        # no group's values, logged or from a source
        origins = [c for c in out.columns if c.endswith(SOURCE_SUFFIX)]
        nothing = F.coalesce(*[F.col(f"`{c}`") for c in origins]).isNull()
        sums.append(F.sum(nothing.cast("long")).alias("uncovered"))
    got = out.agg(*sums).collect()[0]
    rows, none, exact = got["rows"], got["none"] or 0, got["exact"] or 0
    return TrainingReport(
        label_rows=rows,
        by_request=exact,
        point_in_time=rows - none - exact,
        no_vector=none,
        request_not_logged=got["unlogged"] or 0,
        stale={c[: -len("__status")]: got[f"s{i}"] or 0 for i, c in enumerate(statuses)},
        missing={c[: -len("__status")]: got[f"m{i}"] or 0 for i, c in enumerate(statuses)},
        backfilled={g: got[f"b{i}"] or 0 for i, g in enumerate(backfilled)},
        uncovered=(got["uncovered"] or 0) if backfilled else 0,
    )


# --- the Kafka log's sink ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogSinkJob:
    registry: Path
    topic: str
    bootstrap_servers: str
    output: str
    checkpoint: str
    starting_offsets: str = "earliest"
    trigger_seconds: float = 10.0
    available_now: bool = False  # write what the topic holds, then stop
    kafka_options: dict[str, str] = field(default_factory=dict)


def record_schema(registry: Registry) -> T.StructType:
    """The serving log's Kafka record (``served.KafkaSink``): every entity type's columns,
    the entity id as text (each entity type casts its own)."""
    from pyspark.sql import types as T

    fields = [
        T.StructField("request_id", T.StringType()),
        T.StructField("served_at", T.LongType()),  # unix ms
        T.StructField("api", T.StringType()),
        T.StructField("entity_type", T.StringType()),
        T.StructField("entity_id", T.StringType()),
        T.StructField("source", T.StringType()),
    ]
    seen = set()
    for entity in registry.entities.values():
        for name, kind in feature_columns(registry, entity):
            if name in seen:
                continue
            seen.add(name)
            if kind is not None:
                fields.append(T.StructField(name, spark_type(kind)))
            elif name.endswith("__status"):
                fields.append(T.StructField(name, T.StringType()))
            else:
                fields.append(T.StructField(name, T.LongType()))  # event time, unix seconds
    return T.StructType(fields)


def write_log_batch(frame: DataFrame, registry: Registry, output: str) -> int:
    """One micro-batch of records (a ``json`` column) appended in the file sink's layout;
    the rows written."""
    from pyspark.sql import functions as F

    parsed = frame.select(F.from_json("json", record_schema(registry)).alias("r")).select("r.*")
    parsed = parsed.where(F.col("entity_type").isNotNull()).persist()
    written = 0
    try:
        for entity in registry.entities.values():
            rows = parsed.where(F.col("entity_type") == entity.name)
            id_type = "long" if entity.id_type is IdType.INT else "string"
            served = F.timestamp_millis(F.col("served_at"))
            columns = [
                F.col("request_id"),
                served.alias("served_at"),
                F.col("api"),
                F.col("entity_id").cast(id_type).alias("entity_id"),
                F.col("source"),
            ]
            for name, kind in feature_columns(registry, entity):
                if kind is None and not name.endswith("__status"):
                    columns.append(F.timestamp_seconds(F.col(name)).alias(name))
                else:
                    columns.append(F.col(name))
            columns += [
                F.date_format(served, "yyyy-MM-dd").alias("date"),
                F.date_format(served, "HH").alias("hour"),
            ]
            out = rows.select(*columns)
            count = out.count()
            if count:
                out.write.mode("append").partitionBy("date", "hour").parquet(
                    f"{output.rstrip('/')}/entity_type={entity.name}"
                )
                written += count
    finally:
        parsed.unpersist()
    return written


def run_log_sink(
    spark: SparkSession, job: LogSinkJob, progress: Callable[[str], None] | None = None
) -> None:
    """Read the topic into the file sink's layout until stopped (or, ``available_now``,
    until what the topic holds is written)."""
    registry = load_registry(job.registry)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", job.bootstrap_servers)
        .option("subscribe", job.topic)
        .option("startingOffsets", job.starting_offsets)
        .option("failOnDataLoss", "false")
    )
    for key, value in job.kafka_options.items():
        reader = reader.option(key, value)
    frame = reader.load().selectExpr("CAST(value AS STRING) AS json")

    def batch(df: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        written = write_log_batch(df, registry, job.output)
        if progress is not None and written:
            progress(f"log-sink: batch {batch_id}: {written} rows in {time.monotonic() - t0:.1f} s")

    writer = frame.writeStream.foreachBatch(batch).option("checkpointLocation", job.checkpoint)
    if job.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{job.trigger_seconds} seconds")
    query = writer.start()
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
