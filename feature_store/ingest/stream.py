"""``feature-store stream``: a Kafka topic into Redis with Spark Structured Streaming.

    Kafka (JSON records) -> micro-batch -> per partition (mapInArrow): parse, check, encode
    -> guarded writes in chunked pipelines, retried (ingest.writer) -> invalidation notices
    -> the driver: quarantine the bad records, a progress line, the checkpoint commit

A record is one JSON object: the entity id under the entity type's join key (or
``--id-field``), its event time under ``event_time`` (unix seconds or RFC 3339), and any of
the group's features; null removes a value, a feature left out is not touched (as push
writes). Every write goes through the ordering guard (``layout.WRITE_SCRIPT``), so
redelivered, duplicated or late records never put older values over newer ones.

Guarantees: at-least-once from Kafka (Spark's checkpoint holds the offsets; a micro-batch
replayed after a crash is written again, which the guard makes harmless) and "newest event
wins" per entity and group, across this job, the nightly job and push writes. A record that
is not a JSON object, lacks an id or event time, or holds a value its feature cannot take
is quarantined with its reason (parquet, with its Kafka partition and offset), never a
failed stream. Not guaranteed: order among records of one entity with the same event time
(the later arrival wins).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import cast

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as T

from feature_store import notices
from feature_store.batch import (
    Command,
    EntityId,
    event_time_seconds,
    plan_write,
    write_outcome,
)
from feature_store.connection import RedisTarget
from feature_store.errors import EncodingError, FeatureStoreError, RequestError
from feature_store.ingest.spec import BadReason, RetrySpec
from feature_store.ingest.writer import ChunkWriter
from feature_store.kafka import spark_connector_jars
from feature_store.layout import SKIPPED
from feature_store.registry import FeatureGroup, Registry, load_registry, parse_registry
from feature_store.serialization.json_floats import from_json_value, json_int

log = logging.getLogger(__name__)

DEFAULT_EVENT_TIME_FIELD = "event_time"
KIND, REASON, DETAIL = "_stream_kind", "_stream_reason", "_stream_detail"
STATS = ("records", "written", "skipped", "values", "lag_sum", "lag_max")
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


@dataclass(frozen=True, slots=True)
class StreamJob:
    registry: Path
    group: str
    topic: str
    bootstrap_servers: str
    redis_url: str
    checkpoint: str
    id_field: str | None = None  # default: the entity type's join key
    event_time_field: str = DEFAULT_EVENT_TIME_FIELD
    ignore_extra_fields: bool = False
    quarantine: str | None = None  # default: quarantine/<group>-stream
    starting_offsets: str = "earliest"  # where a new checkpoint starts: earliest or latest
    trigger_seconds: float = 0.5
    max_records_per_batch: int | None = None
    available_now: bool = False  # process what the topic holds, then stop
    chunk_size: int = 500
    retry: RetrySpec = field(default_factory=RetrySpec)
    kafka_options: dict[str, str] = field(default_factory=dict)
    progress_interval: float = 10.0


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """What a task needs to read records of one group (sent once per task)."""

    registry_text: str
    group: str
    id_field: str
    event_time_field: str
    ignore_extra_fields: bool
    redis_url: str
    chunk_size: int
    retry: RetrySpec
    origin: str


@dataclass(slots=True)
class Encoded:
    """A micro-batch partition's good records as guarded writes, and its bad ones."""

    commands: list[Command] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    counts: list[tuple[int, int]] = field(default_factory=list)  # values written, removed
    bad: list[tuple[int, BadReason, str]] = field(default_factory=list)  # index, why


def encode_records(
    group: FeatureGroup,
    records: Sequence[bytes | None],
    *,
    id_field: str,
    event_time_field: str = DEFAULT_EVENT_TIME_FIELD,
    ignore_extra_fields: bool = False,
    now: float | None = None,
) -> Encoded:
    """Each record as one guarded write (``batch.plan_write``), or a bad record and why."""
    now = time.time() if now is None else now
    features = {f.name: f for f in group.features}
    reserved = {id_field, event_time_field}
    out = Encoded()
    rows: list[tuple[EntityId, dict[str, object], float]] = []
    positions: list[int] = []  # each row's index in ``records``
    for i, raw in enumerate(records):
        try:
            doc = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError as e:
            out.bad.append((i, BadReason.MALFORMED_RECORD, f"not JSON: {e}"))
            continue
        if not isinstance(doc, dict):
            out.bad.append((i, BadReason.MALFORMED_RECORD, "not a JSON object"))
            continue
        entity_id = doc.get(id_field)
        if entity_id is None:
            out.bad.append((i, BadReason.NULL_ID, f"no {id_field!r}"))
            continue
        event_time = doc.get(event_time_field)
        if event_time is None:
            out.bad.append((i, BadReason.NULL_EVENT_TIME, f"no {event_time_field!r}"))
            continue
        unknown = [k for k in doc if k not in features and k not in reserved]
        if unknown and not ignore_extra_fields:
            names = ", ".join(repr(k) for k in unknown)
            out.bad.append((i, BadReason.UNKNOWN_FIELD, f"group {group.name!r} has no {names}"))
            continue
        values = {k: from_json_value(features[k].type, v) for k, v in doc.items() if k in features}
        try:
            seconds = event_time_seconds(event_time, now)
        except RequestError as e:
            out.bad.append((i, BadReason.INVALID_EVENT_TIME, str(e)))
            continue
        rows.append((cast(EntityId, json_int(entity_id)), values, seconds))
        positions.append(i)
    try:  # one plan for the lot: a bad value is rare
        plans = [(rows, plan_write(group, rows, now=now))]
    except (EncodingError, RequestError):  # find it, and keep the rest
        plans = []
        for i, row in zip(positions, rows, strict=True):
            try:
                plans.append(([row], plan_write(group, [row], now=now)))
            except EncodingError as e:
                out.bad.append((i, BadReason.INVALID_VALUE, str(e)))
            except RequestError as e:
                out.bad.append((i, BadReason.INVALID_ID, str(e)))
        out.bad.sort(key=lambda b: b[0])
    for planned, plan in plans:
        out.commands += plan.commands
        out.keys += plan.keys
        out.counts += plan.counts
        out.event_times += [row[2] for row in planned]
    return out


def write_records(spec: RecordSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: Kafka rows (value, partition, offset) in; the bad
    records and one statistics row out."""
    group = parse_registry(spec.registry_text, source="stream").group(spec.group)
    target = RedisTarget.parse(spec.redis_url, max_connections=2)
    writer = ChunkWriter(
        target, ttl_seconds=group.entity.ttl_seconds, chunk_size=spec.chunk_size, retry=spec.retry
    )
    stats = dict.fromkeys(STATS, 0.0)
    schema = _arrow_schema()
    try:
        for batch in batches:
            values = batch.column("value").to_pylist()
            stats["records"] += len(values)
            encoded = encode_records(
                group,
                values,
                id_field=spec.id_field,
                event_time_field=spec.event_time_field,
                ignore_extra_fields=spec.ignore_extra_fields,
            )
            _write(writer, spec, encoded, stats)
            if encoded.bad:
                yield _bad_rows(schema, batch, encoded)
    finally:
        writer.close()
    yield pa.RecordBatch.from_pylist([{KIND: "stats", **stats}], schema=schema)


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
        lags = [done - t for t, reply in zip(times, replies, strict=True) if reply != SKIPPED]
        if lags:
            stats["lag_sum"] += sum(lags)
            stats["lag_max"] = max(stats["lag_max"], *lags)
        # serving caches drop these keys now instead of at their TTL
        writer.publish(notices.write_message(spec.origin, spec.group, keys, done))


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(OUTPUT)


def _bad_rows(schema: pa.Schema, batch: pa.RecordBatch, encoded: Encoded) -> pa.RecordBatch:
    values = batch.column("value").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    rows = [
        {
            KIND: "bad",
            "value": None if values[i] is None else values[i].decode("utf-8", "replace"),
            "partition": partitions[i],
            "offset": offsets[i],
            REASON: reason.value,
            DETAIL: detail,
        }
        for (i, reason, detail) in encoded.bad
    ]
    return pa.RecordBatch.from_pylist(rows, schema=schema)


# --- the driver ------------------------------------------------------------------------


def check_job(job: StreamJob, registry: Registry) -> FeatureGroup:
    """Stop at start, naming the problem, rather than quarantine every record."""
    if job.group not in registry.groups:
        known = ", ".join(sorted(registry.groups))
        raise RequestError(f"unknown feature group {job.group!r}; known: {known}")
    group = registry.groups[job.group]
    id_field = job.id_field or group.entity.join_key
    clash = {id_field, job.event_time_field} & {f.name for f in group.features}
    if clash or id_field == job.event_time_field:
        raise RequestError(
            f"the id field {id_field!r} and the event time field {job.event_time_field!r} must "
            f"differ from each other and from the features of {group.name!r}"
        )
    if job.starting_offsets not in ("earliest", "latest"):
        raise RequestError("--starting-offsets must be earliest or latest")
    if job.trigger_seconds < 0:
        raise RequestError("--trigger-seconds must be 0 (back to back) or more")
    return group


def run_stream(
    spark: SparkSession, job: StreamJob, progress: Callable[[str], None] | None = None
) -> None:
    """Run until stopped (or, with ``available_now``, until the topic is drained)."""
    registry = load_registry(job.registry)
    group = check_job(job, registry)
    from feature_store.ingest.job import check_redis

    check_redis(RedisTarget.parse(job.redis_url), registry)
    spec = RecordSpec(
        registry_text=job.registry.read_text(encoding="utf-8"),
        group=group.name,
        id_field=job.id_field or group.entity.join_key,
        event_time_field=job.event_time_field,
        ignore_extra_fields=job.ignore_extra_fields,
        redis_url=job.redis_url,
        chunk_size=job.chunk_size,
        retry=job.retry,
        origin=notices.new_origin(),
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
    source = reader.load().select("value", "partition", "offset")
    each = partial(_micro_batch, spark, spec, quarantine, emit)
    writer = source.writeStream.foreachBatch(each).option("checkpointLocation", job.checkpoint)
    if job.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{job.trigger_seconds} seconds")
    query = writer.start()
    while query.isActive:
        query.awaitTermination(max(1, round(job.progress_interval)))
        if job.progress_interval and query.isActive:
            emit(_behind(query.lastProgress))
    exception = query.exception()
    if exception is not None:
        raise FeatureStoreError(f"the stream stopped: {exception}")


def _micro_batch(
    spark: SparkSession,
    spec: RecordSpec,
    quarantine: str,
    emit: Callable[[str], None],
    frame: DataFrame,
    batch_id: int,
) -> None:
    t0 = time.monotonic()
    rows = frame.mapInArrow(partial(write_records, spec), OUTPUT).collect()
    stats = dict.fromkeys(STATS, 0.0)
    bad: list[Row] = []
    for row in rows:
        if row[KIND] == "bad":
            bad.append(row)
            continue
        for name in STATS:
            value = float(row[name] or 0.0)
            stats[name] = max(stats[name], value) if name == "lag_max" else stats[name] + value
    if bad:
        columns = ["value", "partition", "offset", REASON, DETAIL]
        schema = T.StructType([f for f in OUTPUT.fields if f.name in columns])
        data = [[r[c] for c in columns] for r in bad]
        spark.createDataFrame(data, schema).write.mode("append").parquet(quarantine)
    written = int(stats["written"])
    mean_lag = stats["lag_sum"] / written if written else 0.0
    emit(
        f"stream: batch {batch_id}: {int(stats['records']):,} records, {written:,} written, "
        f"{int(stats['skipped']):,} skipped (older than stored), {len(bad):,} bad"
        + (f" -> {quarantine}" if bad else "")
        + f"; event to written: mean {mean_lag:.3f} s, max {stats['lag_max']:.3f} s; "
        f"{time.monotonic() - t0:.2f} s"
    )


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


def connector_conf() -> dict[str, str]:
    """Spark settings that put the Kafka source on the classpath."""
    return {"spark.jars": ",".join(spark_connector_jars())}


__all__ = ["StreamJob", "connector_conf", "encode_records", "run_stream"]
