"""What runs inside each Spark task (``mapInArrow``): encode, write, and account.

A task's output is small: its quarantined rows (the input columns plus a reason), then
one statistics row. The driver sums the statistics rows into the report, so the counts
are exactly those of the tasks that succeeded, even if Spark re-ran some of them.
"""

from __future__ import annotations

import cProfile
import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark import Accumulator

from feature_store.connection import RedisTarget
from feature_store.ingest.encode import BatchEncoder, FloatMemos
from feature_store.ingest.spec import BadReason, TaskSpec
from feature_store.ingest.writer import ChunkWriter, WriteCounters
from feature_store.registry import FeatureGroup, Registry, parse_registry

KIND = "_ingest_kind"  # "bad" or "stats"
REASON = "_ingest_reason"
DETAIL = "_ingest_detail"
# statistics columns of the "stats" row, all bigint except the *_s seconds (double)
STATS: tuple[tuple[str, pa.DataType], ...] = (
    ("_ingest_rows", pa.int64()),
    ("_ingest_entities", pa.int64()),
    ("_ingest_written", pa.int64()),
    ("_ingest_removed", pa.int64()),
    ("_ingest_skipped", pa.int64()),  # entities Redis holds newer event times for
    ("_ingest_bad", pa.int64()),
    ("_ingest_chunks", pa.int64()),
    ("_ingest_retries", pa.int64()),
    ("_ingest_read_s", pa.float64()),  # waiting for Spark to hand over the next batch
    ("_ingest_encode_s", pa.float64()),
    ("_ingest_redis_s", pa.float64()),
)
EXTRA: tuple[tuple[str, pa.DataType], ...] = (
    (KIND, pa.string()),
    (REASON, pa.string()),
    (DETAIL, pa.string()),
    *STATS,
)


class Counters(NamedTuple):
    """Spark accumulators for the progress line; the report sums the statistics rows."""

    rows: Accumulator[int]
    entities: Accumulator[int]
    values: Accumulator[int]


# Float encodings are shared by every task a (reused) Python worker runs.
_MEMOS = FloatMemos()


@lru_cache(maxsize=4)
def registry_of(text: str, source: str, digest: str) -> Registry:
    del digest  # part of the cache key only
    return parse_registry(text, source=source)


def task_group(spec: TaskSpec) -> FeatureGroup:
    """The task's feature group, its registry parsed once per worker."""
    digest = hashlib.sha256(spec.registry_text.encode()).hexdigest()
    return registry_of(spec.registry_text, spec.registry_source, digest).group(spec.group)


def task_writer(spec: TaskSpec, group: FeatureGroup) -> ChunkWriter:
    """The task's writer: its own small pool of connections to Redis."""
    target = RedisTarget.parse(
        spec.redis_url,
        socket_timeout=spec.socket_timeout,
        connect_timeout=spec.connect_timeout,
        max_connections=spec.max_connections,
        retries=spec.redis_retries,
        durability=spec.durability,
    )
    return ChunkWriter(
        target,
        ttl_seconds=group.entity.ttl_seconds,
        chunk_size=spec.chunk_size,
        retry=spec.retry,
        ordered=spec.ordered,
    )


def write_partition(
    spec: TaskSpec, schema: pa.Schema, counters: Counters, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: ``schema`` is the output's (input columns + EXTRA)."""
    if spec.profile_dir is None:
        yield from _write_partition(spec, schema, counters, batches)
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield from _write_partition(spec, schema, counters, batches)
    finally:
        profiler.disable()
        Path(spec.profile_dir).mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(os.path.join(spec.profile_dir, f"task-{os.getpid()}-{_task_id()}.prof"))


def _task_id() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return str(time.monotonic_ns())
    return f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.attemptNumber()}"


def _write_partition(
    spec: TaskSpec, schema: pa.Schema, counters: Counters, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    group = task_group(spec)
    encoder = BatchEncoder(
        group,
        spec.id_column,
        spec.columns,
        spec.written_at,
        id_source=spec.id_source,
        memos=_MEMOS,
        event_time_column=spec.event_time_column,
    )
    writer = task_writer(spec, group)
    rows = bad = 0
    read_s = encode_s = 0.0
    try:
        t0 = time.perf_counter()
        for batch in batches:
            t1 = time.perf_counter()
            read_s += t1 - t0
            rows += batch.num_rows
            encoded = encoder.encode(batch)
            encode_s += time.perf_counter() - t1
            before = writer.counters.entities, writer.counters.values_written
            writer.write(encoded)
            counters.rows.add(batch.num_rows)
            counters.entities.add(writer.counters.entities - before[0])
            counters.values.add(writer.counters.values_written - before[1])
            if encoded.bad:
                bad += len(encoded.bad)
                yield quarantine(
                    schema, batch, [(b.index, b.reason, b.detail) for b in encoded.bad]
                )
            t0 = time.perf_counter()
    finally:
        writer.close()
    yield stats_row(schema, rows, bad, writer.counters, read_s, encode_s)


def quarantine(
    schema: pa.Schema, batch: pa.RecordBatch, bad: Sequence[tuple[int, BadReason, str]]
) -> pa.RecordBatch:
    """The bad rows of ``batch`` (index, reason, detail) as output rows."""
    n = len(bad)
    indices = pa.array([i for i, _, _ in bad], pa.int64())
    extra = {
        KIND: pa.array(["bad"] * n, pa.string()),
        REASON: pa.array([r.value for _, r, _ in bad], pa.string()),
        DETAIL: pa.array([d for _, _, d in bad], pa.string()),
    }
    arrays = []
    for f in schema:
        if f.name in extra:
            arrays.append(extra[f.name])
        elif f.name in batch.schema.names:
            column = batch.column(f.name).take(indices)
            arrays.append(column if column.type == f.type else column.cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def stats_row(
    schema: pa.Schema,
    rows: int,
    bad: int,
    counters: WriteCounters,
    read_s: float,
    encode_s: float,
) -> pa.RecordBatch:
    values: dict[str, object] = {
        KIND: "stats",
        "_ingest_rows": rows,
        "_ingest_entities": counters.entities,
        "_ingest_written": counters.values_written,
        "_ingest_removed": counters.values_removed,
        "_ingest_skipped": counters.skipped,
        "_ingest_bad": bad,
        "_ingest_chunks": counters.chunks,
        "_ingest_retries": counters.retries,
        "_ingest_read_s": read_s,
        "_ingest_encode_s": encode_s,
        "_ingest_redis_s": counters.redis_seconds,
    }
    arrays = [
        pa.array([values[f.name]], f.type) if f.name in values else pa.nulls(1, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
