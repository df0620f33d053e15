"""``feature-store stream``: a Kafka topic into Redis with Spark Structured Streaming.

    Kafka (JSON, Avro or Protobuf records) -> micro-batch (bounded) -> per partition
    (mapInArrow): decode, check, keep each entity's newest record, encode (ingest.records)
    -> guarded writes in chunked pipelines, retried (ingest.writer) -> invalidation notices
    -> the driver: quarantine the bad records, metrics, a progress line, the checkpoint

Every write goes through the ordering guard (``layout.WRITE_SCRIPT``), so redelivered,
duplicated or late records never put older values over newer ones. A group of window
aggregations takes its records as events instead: each is counted once into its entity's
tiles (``ingest.windows``; docs/aggregations.md).

Guarantees: at-least-once from Kafka (Spark's checkpoint holds the offsets; a micro-batch
replayed after a crash is written again, which the guard makes harmless, and its bad
records go to the same quarantine directory, each once) and "newest event wins" per entity
and group, across this job, the nightly job and push writes. An aggregated group's late
records are quarantined before their entities' states are written (those entities are
written by a second pass over the batch): a replay would find their events applied, and
could no longer tell them late. A bad record is quarantined with its reason, partition and
offset, never a failed stream. Not guaranteed: order among records of one entity with the
same event time in different Kafka partitions (the later write wins; within a partition,
the later offset); and the quarantine of an event late only after its entity's events from
another partition of the same batch (found by the second pass, so a crash right after it
loses that record's entry; it is not counted).
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_store import notices
from feature_store.batch import write_outcome
from feature_store.connection import RedisOptions
from feature_store.errors import FeatureStoreError, RequestError
from feature_store.ingest.records import (
    DEFAULT_EVENT_TIME_FIELD,
    Decoder,
    Encoded,
    Format,
    KeyFormat,
    RecordFormat,
    decode_events,
    encode_records,
    proto_message_class,
)
from feature_store.ingest.spec import MAX_RECORDS_PER_BATCH, BadReason, RetrySpec
from feature_store.ingest.stream_metrics import StreamMetrics, lag_bucket, lag_bucket_names
from feature_store.ingest.windows import write_events
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import SKIPPED
from feature_store.registry import FeatureGroup, Registry, load_registry, parse_registry

log = logging.getLogger(__name__)

KIND, REASON, DETAIL = "_stream_kind", "_stream_reason", "_stream_detail"
STATS = (
    "records",
    "written",
    "skipped",
    "superseded",
    "values",
    "lag_sum",
    "lag_max",
    "kafka_time_max",
    "replayed",  # an aggregated group's events applied before (a micro-batch written again)
    "late",  # an aggregated group's events past its lateness (also quarantined)
    "deferred",  # an aggregated group's entities written after their late records' quarantine
    *lag_bucket_names(),
)
OUTPUT = T.StructType(
    [
        T.StructField(KIND, T.StringType()),
        T.StructField("value", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField(REASON, T.StringType()),
        T.StructField(DETAIL, T.StringType()),
        *(T.StructField(name, T.DoubleType()) for name in STATS),
    ]
)

QUARANTINED = T.StructType(
    [f for f in OUTPUT.fields if f.name in ("value", "partition", "offset", REASON, DETAIL)]
)


@dataclass(frozen=True, slots=True)
class StreamJob:
    registry: Path
    group: str
    topic: str
    bootstrap_servers: str
    redis_url: str
    checkpoint: str
    redis: RedisOptions = field(default_factory=RedisOptions)
    format: Format = Format.JSON
    avro_schema: str | None = None  # the writer's schema (Avro JSON), for Format.AVRO
    proto_descriptor: bytes = b""  # a serialized FileDescriptorSet, for Format.PROTOBUF
    proto_message: str = ""
    confluent_framing: bool = False  # values framed by Confluent's Schema Registry serializers
    id_field: str | None = None  # default: the entity type's join key
    id_from_key: bool = False
    key_format: KeyFormat = KeyFormat.STRING
    event_time_field: str = DEFAULT_EVENT_TIME_FIELD
    event_time_from_kafka: bool = False
    renames: tuple[tuple[str, str], ...] = ()
    ignore_extra_fields: bool = False
    quarantine: str | None = None  # default: quarantine/<group>-stream
    starting_offsets: str = "earliest"  # where a new checkpoint starts: earliest or latest
    trigger_seconds: float = 0.5
    max_records_per_batch: int | None = MAX_RECORDS_PER_BATCH  # None: unbounded
    available_now: bool = False  # process what the topic holds, then stop
    chunk_size: int = 500
    retry: RetrySpec = field(default_factory=RetrySpec)
    kafka_options: dict[str, str] = field(default_factory=dict)
    progress_interval: float = 10.0
    metrics: StreamMetrics | None = None  # the driver's Prometheus series

    def record_format(self, group: FeatureGroup) -> RecordFormat:
        return RecordFormat(
            format=self.format,
            id_field="" if self.id_from_key else (self.id_field or group.entity.join_key),
            event_time_field="" if self.event_time_from_kafka else self.event_time_field,
            id_from_key=self.id_from_key,
            key_format=self.key_format,
            event_time_from_kafka=self.event_time_from_kafka,
            renames=self.renames,
            ignore_extra_fields=self.ignore_extra_fields,
            proto_descriptor=self.proto_descriptor,
            proto_message=self.proto_message,
            confluent_framing=self.confluent_framing,
        )


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """What a task needs to read records of one group (sent once per task)."""

    registry_text: str
    group: str
    format: RecordFormat
    redis_url: str
    chunk_size: int
    retry: RetrySpec
    redis: RedisOptions
    origin: str
    aggregated: bool = False  # the group is window aggregations (its records are events)


def write_records(
    spec: RecordSpec, batches: Iterator[pa.RecordBatch], *, defer_late: bool = False
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: one Kafka partition's rows of a micro-batch (value,
    key, partition, offset, timestamp; ``decoded`` for Avro) in; the bad records and one
    statistics row out. ``defer_late``: an aggregated group's entities with a late event
    are left unwritten (``ingest.windows``; ``_micro_batch``)."""
    group = parse_registry(spec.registry_text, source="stream").group(spec.group)
    target = spec.redis.target(spec.redis_url)
    writer = ChunkWriter(
        target, ttl_seconds=group.entity.ttl_seconds, chunk_size=spec.chunk_size, retry=spec.retry
    )
    decoder = Decoder(spec.format)
    stats = dict.fromkeys(STATS, 0.0)
    schema = _arrow_schema()
    try:
        # the task's whole share of the micro-batch at once (bounded by
        # --max-records-per-batch), so that each entity's newest record is the one written
        received = list(batches)
        if received and sum(b.num_rows for b in received):
            rows = pa.Table.from_batches(received)
            column = "decoded" if spec.format.format is Format.AVRO else "value"
            values = rows.column(column).to_pylist()
            stats["records"] += len(values)
            times = rows.column("timestamp").to_pylist()
            stats["kafka_time_max"] = max(t or 0.0 for t in times)
            if group.aggregation is not None:
                bad = _write_events(
                    writer, spec, group, rows, values, times, decoder, stats, defer_late
                )
            else:
                bad = _write_values(writer, spec, group, rows, values, times, decoder, stats)
            if bad:
                yield _bad_rows(schema, rows, bad, spec.format.format)
    finally:
        writer.close()
    yield pa.RecordBatch.from_pylist([{KIND: "stats", **stats}], schema=schema)


def _write_values(
    writer: ChunkWriter,
    spec: RecordSpec,
    group: FeatureGroup,
    rows: pa.Table,
    values: list[bytes | str | None],
    times: list[float | None],
    decoder: Decoder,
    stats: dict[str, float],
) -> list[tuple[int, BadReason, str]]:
    """A plain group's share of a micro-batch: each entity's newest record as a guarded
    write; the bad records."""
    encoded = encode_records(
        group,
        spec.format,
        values,
        keys=rows.column("key").to_pylist() if spec.format.id_from_key else None,
        timestamps=times,
        decoder=decoder,
    )
    stats["superseded"] += encoded.superseded
    _write(writer, spec, encoded, stats)
    return encoded.bad


def _write_events(
    writer: ChunkWriter,
    spec: RecordSpec,
    group: FeatureGroup,
    rows: pa.Table,
    values: list[bytes | str | None],
    times: list[float | None],
    decoder: Decoder,
    stats: dict[str, float],
    defer_late: bool,
) -> list[tuple[int, BadReason, str]]:
    """An aggregated group's share of a micro-batch: its records as events into their
    entities' window state (``ingest.windows``); the bad and the late records."""
    events, bad = decode_events(
        group,
        spec.format,
        values,
        keys=rows.column("key").to_pylist() if spec.format.id_from_key else None,
        timestamps=times,
        partitions=rows.column("partition").to_pylist(),
        offsets=rows.column("offset").to_pylist(),
        decoder=decoder,
    )
    written = write_events(writer, group, events, defer_late=defer_late)
    stats["deferred"] += written.deferred
    stats["written"] += written.entities
    stats["values"] += written.counted
    stats["replayed"] += written.replayed
    stats["late"] += sum(1 for _, reason, _ in written.bad if reason is BadReason.TOO_LATE)
    _add_lags(stats, written.lags)
    writer.publish(notices.write_message(spec.origin, spec.group, list(events), time.time()))
    return sorted(bad + written.bad, key=lambda b: b[0])


def _write(
    writer: ChunkWriter, spec: RecordSpec, encoded: Encoded, stats: dict[str, float]
) -> None:
    size = spec.chunk_size
    for start in range(0, len(encoded.commands), size):
        replies = writer.send(encoded.commands[start : start + size])
        done = time.time()
        keys = encoded.keys[start : start + size]
        outcome = write_outcome(encoded.counts[start : start + size], replies)
        stats["written"] += outcome.entities
        stats["skipped"] += outcome.skipped
        stats["values"] += outcome.values_written
        times = encoded.event_times[start : start + size]
        _add_lags(stats, [done - t for t, r in zip(times, replies, strict=True) if r != SKIPPED])
        # serving caches drop these keys now instead of at their TTL
        writer.publish(notices.write_message(spec.origin, spec.group, keys, done))


def _add_lags(stats: dict[str, float], lags: list[float]) -> None:
    """Event-to-written delays (seconds) into a task's statistics: their sum, their
    maximum and the histogram's buckets."""
    if lags:
        stats["lag_sum"] += sum(lags)
        stats["lag_max"] = max(stats["lag_max"], *lags)
        for lag in lags:
            stats[lag_bucket(lag)] += 1


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(OUTPUT)


def _bad_rows(
    schema: pa.Schema, rows: pa.Table, bad: list[tuple[int, BadReason, str]], fmt: Format
) -> pa.RecordBatch:
    values = rows.column("value").to_pylist()
    partitions = rows.column("partition").to_pylist()
    offsets = rows.column("offset").to_pylist()
    rows = [
        {
            KIND: "bad",
            "value": _shown(values[i], fmt),
            "partition": partitions[i],
            "offset": offsets[i],
            REASON: reason.value,
            DETAIL: detail,
        }
        for (i, reason, detail) in bad
    ]
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _shown(value: bytes | None, fmt: Format) -> str | None:
    """A bad record's value in the quarantine: JSON as its text, a binary format's bytes
    as base64 (``base64.b64decode`` gives them back)."""
    if value is None:
        return None
    if fmt is Format.JSON:
        return value.decode("utf-8", "replace")
    return base64.b64encode(value).decode()


# --- the driver ------------------------------------------------------------------------


def check_job(job: StreamJob, registry: Registry) -> FeatureGroup:
    """Stop at start, naming the problem, rather than quarantine every record."""
    if job.group not in registry.groups:
        known = ", ".join(sorted(registry.groups))
        raise RequestError(f"unknown feature group {job.group!r}; known: {known}")
    group = registry.groups[job.group]
    fmt = job.record_format(group)
    aggregation = group.aggregation
    # what a record's fields feed: the features, or what an aggregated group's aggregates read
    features = set(aggregation.fields) if aggregation else {f.name for f in group.features}
    fields = [n for n in (fmt.id_field, fmt.event_time_field) if n]
    if set(fields) & features or len(set(fields)) < len(fields):
        raise RequestError(
            f"the id field {fmt.id_field!r} and the event time field {fmt.event_time_field!r} "
            f"must differ from each other and from the features of {group.name!r}"
        )
    for source, feature in job.renames:
        if feature not in features:
            has = (
                f"no aggregate of {group.name!r} reads" if aggregation else f"{group.name!r} has no"
            )
            raise RequestError(f"--map {source}={feature}: {has} {feature!r}")
    if job.confluent_framing and job.format is Format.JSON:
        raise RequestError("--confluent-framing is for --format avro or protobuf")
    if job.format is Format.AVRO and not job.avro_schema:
        raise RequestError("--format avro needs --avro-schema FILE (the writer's schema)")
    if job.format is Format.PROTOBUF:
        if not job.proto_descriptor or not job.proto_message:
            raise RequestError(
                "--format protobuf needs --proto-descriptor FILE and --proto-message NAME"
            )
        proto_message_class(job.proto_descriptor, job.proto_message)  # names a missing one
    if job.starting_offsets not in ("earliest", "latest"):
        raise RequestError("--starting-offsets must be earliest or latest")
    if job.trigger_seconds < 0:
        raise RequestError("--trigger-seconds must be 0 (back to back) or more")
    if job.max_records_per_batch is not None and job.max_records_per_batch < 1:
        raise RequestError("--max-records-per-batch must be at least 1")
    return group


def run_stream(
    spark: SparkSession, job: StreamJob, progress: Callable[[str], None] | None = None
) -> None:
    """Run until stopped (or, with ``available_now``, until the topic is drained)."""
    registry = load_registry(job.registry)
    group = check_job(job, registry)
    from feature_store.ingest.job import check_redis

    check_redis(job.redis.target(job.redis_url), registry)
    spec = RecordSpec(
        registry_text=job.registry.read_text(encoding="utf-8"),
        group=group.name,
        format=job.record_format(group),
        redis_url=job.redis_url,
        chunk_size=job.chunk_size,
        retry=job.retry,
        redis=job.redis,
        origin=notices.new_origin(),
        aggregated=group.aggregation is not None,
    )
    quarantine = job.quarantine or os.path.join("quarantine", f"{group.name}-stream")
    emit = progress or (lambda line: None)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", job.bootstrap_servers)
        .option("subscribe", job.topic)
        .option("startingOffsets", job.starting_offsets)
    )
    if job.max_records_per_batch is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(job.max_records_per_batch))
    for key, value in job.kafka_options.items():
        reader = reader.option(key, value)
    source = reader.load().select(*_columns(job))
    each = partial(_micro_batch, spark, spec, quarantine, emit, job.metrics)
    writer = source.writeStream.foreachBatch(each).option("checkpointLocation", job.checkpoint)
    if job.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{job.trigger_seconds} seconds")
    query = writer.start()
    last_line = time.monotonic()
    while query.isActive:
        query.awaitTermination(1)
        if job.metrics is not None:
            job.metrics.add_progress(_offsets_behind(query.lastProgress))
        due = job.progress_interval and time.monotonic() - last_line >= job.progress_interval
        if due and query.isActive:
            emit(_behind(query.lastProgress))
            last_line = time.monotonic()
    exception = query.exception()
    if exception is not None:
        raise FeatureStoreError(f"the stream stopped: {exception}")


def _columns(job: StreamJob) -> list[Column]:
    """What each task gets of a Kafka row; an Avro value also decoded by Spark's
    ``from_avro`` (its fields as JSON text, null where the bytes do not fit the schema)."""
    columns = [
        F.col("value"),
        F.col("key"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").cast("double").alias("timestamp"),
    ]
    if job.format is Format.AVRO:
        from pyspark.sql.avro.functions import from_avro

        value = F.col("value")
        if job.confluent_framing:  # magic byte 0 and a schema id, then the record
            framed = F.expr("substring(value, 1, 1) = X'00' AND length(value) >= 5")
            value = F.when(framed, F.expr("substring(value, 6)"))
        decoded = from_avro(value, job.avro_schema or "", {"mode": "PERMISSIVE"})
        columns.append(F.to_json(decoded, {"ignoreNullFields": "false"}).alias("decoded"))
    return columns


def _micro_batch(
    spark: SparkSession,
    spec: RecordSpec,
    quarantine: str,
    emit: Callable[[str], None],
    metrics: StreamMetrics | None,
    frame: DataFrame,
    batch_id: int,
) -> None:
    t0 = time.monotonic()
    path = os.path.join(quarantine, f"batch={batch_id}")
    write = partial(write_records, spec, defer_late=spec.aggregated)
    stats, found = _gathered(frame.mapInArrow(write, OUTPUT).collect())
    bad, added = _quarantine(spark, path, found, None)
    if stats["deferred"]:
        # an aggregated group's entities with a late event, left unwritten: their late
        # records are quarantined above, before any state holds their offsets (a replay
        # would find those events applied, and could no longer tell them late); the batch
        # again: the entities written the first time are skipped (every event applied)
        first = stats
        stats, found = _gathered(frame.mapInArrow(partial(write_records, spec), OUTPUT).collect())
        for name in ("written", "values", "lag_sum", *lag_bucket_names()):
            stats[name] += first[name]
        stats["replayed"] -= first["values"]  # counted the first time, replayed the second
        stats["lag_max"] = max(stats["lag_max"], first["lag_max"])
        # late only after its entity's events from another partition of the batch
        bad, more = _quarantine(spark, path, found, bad)
        added += more
    seconds = time.monotonic() - t0
    if metrics is not None:
        reasons: dict[str, int] = {}
        for r in added:  # each record counted once, replayed or not
            reasons[r[REASON]] = reasons.get(r[REASON], 0) + 1
        metrics.add_batch(stats, reasons, seconds)
    written = int(stats["written"])
    if spec.aggregated:
        counted = int(stats["values"])
        mean_lag = stats["lag_sum"] / counted if counted else 0.0
        emit(
            f"stream: batch {batch_id}: {int(stats['records']):,} records, {counted:,} events "
            f"counted into {written:,} entities, {int(stats['replayed']):,} replayed (applied "
            f"before), {int(stats['late']):,} too late, {len(bad):,} bad or late"
            + (f" -> {quarantine}" if bad else "")
            + f"; event to written: mean {mean_lag:.3f} s, max {stats['lag_max']:.3f} s; "
            f"{seconds:.2f} s"
        )
        return
    mean_lag = stats["lag_sum"] / written if written else 0.0
    emit(
        f"stream: batch {batch_id}: {int(stats['records']):,} records, {written:,} written, "
        f"{int(stats['superseded']):,} superseded (a newer record in the batch), "
        f"{int(stats['skipped']):,} skipped (older than stored), {len(bad):,} bad"
        + (f" -> {quarantine}" if bad else "")
        + f"; event to written: mean {mean_lag:.3f} s, max {stats['lag_max']:.3f} s; "
        f"{seconds:.2f} s"
    )


def _gathered(rows: list[Row]) -> tuple[dict[str, float], list[Row]]:
    """The tasks' statistics rows summed (their maximums kept), and their bad records."""
    stats = dict.fromkeys(STATS, 0.0)
    bad: list[Row] = []
    for row in rows:
        if row[KIND] == "bad":
            bad.append(row)
            continue
        for name in STATS:
            value = float(row[name] or 0.0)
            maximum = name in ("lag_max", "kafka_time_max")
            stats[name] = max(stats[name], value) if maximum else stats[name] + value
    return stats, bad


def _quarantine(
    spark: SparkSession, path: str, rows: list[Row], held: list[Row] | None
) -> tuple[list[Row], list[Row]]:
    """Add a micro-batch's bad records to its quarantine directory, each once (by partition
    and offset): those it holds (``held``; None: read from it) stay, the new ones are
    appended. A replayed batch (the same id, the same offsets after a restart) adds none
    of the records it quarantined before, and drops none its replay no longer finds late
    (their events were applied before the restart). The directory's records, and those
    added."""
    if held is None:
        if not rows:
            return [], []
        held = _read_quarantine(spark, path)
    seen = {(r["partition"], r["offset"]) for r in held}
    new = []
    for r in rows:
        if (r["partition"], r["offset"]) not in seen:
            seen.add((r["partition"], r["offset"]))
            new.append(r)
    if new:
        data = [[r[c] for c in QUARANTINED.fieldNames()] for r in new]
        mode = "append" if held else "overwrite"
        spark.createDataFrame(data, QUARANTINED).write.mode(mode).parquet(path)
    return held + new, new


def _read_quarantine(spark: SparkSession, path: str) -> list[Row]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hadoop_path):
        return []
    return spark.read.schema(QUARANTINED).parquet(path).collect()


def _offsets_behind(progress: dict[str, object] | None) -> int | None:
    """The most records any source partition is behind, from a query's last progress."""
    if not progress:
        return None
    behind = None
    for source in progress.get("sources", []):  # type: ignore[attr-defined]
        value = (source.get("metrics") or {}).get("maxOffsetsBehindLatest")
        if value is not None:
            behind = max(behind or 0, int(value))
    return behind


def _behind(progress: dict[str, object] | None) -> str:
    """Kafka's lag from the last micro-batch's progress: records not yet read."""
    if not progress:
        return "stream: waiting for the first micro-batch"
    behind = []
    for source in progress.get("sources", []):  # type: ignore[attr-defined]
        metrics = source.get("metrics") or {}
        behind.append(metrics.get("maxOffsetsBehindLatest", "?"))
    rate = progress.get("processedRowsPerSecond", 0.0)
    return f"stream: behind latest: {', '.join(map(str, behind))} records; {rate:,.0f} records/s"


__all__ = ["StreamJob", "run_stream"]
