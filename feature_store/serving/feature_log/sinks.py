"""Where the log's rows go: parquet files per entity type, date and hour (``FileSink``),
or a JSON record per row on a Kafka topic (``KafkaSink``); and the log's counters."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from prometheus_client import CollectorRegistry, Counter

from feature_store.errors import ConfigError
from feature_store.registry import Registry

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]


log = logging.getLogger(__name__)

ROW_GROUP = 16_384  # rows buffered per file before they are written as a row group
DROP_REASONS = ("queue_full", "front_queue_full", "sink_full", "sink_error", "unreadable")


class LogMetrics:
    """The log's counters (Prometheus; deployment totals in multiprocess mode)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        prefix = "feature_serving_log"
        self.rows = Counter(f"{prefix}_rows", "rows written to the serving log", registry=registry)
        self.dropped = Counter(
            f"{prefix}_dropped",
            "rows (or, queue_full and front_queue_full, answers) the serving log dropped, by "
            "reason: its queue full (a worker's, a native front's), the sink's buffer full, "
            "the sink failing, an answer that could not be read",
            ["reason"],
            registry=registry,
        )
        self.bytes = Counter(
            f"{prefix}_bytes", "bytes the serving log wrote (files closed, records produced)",
            registry=registry,
        )  # fmt: skip
        self.files = Counter(
            f"{prefix}_files", "log files rolled (closed and renamed)", registry=registry
        )
        self.sink_errors = Counter(
            f"{prefix}_sink_errors", "failures of the serving log's sink (a write, a delivery)",
            registry=registry,
        )  # fmt: skip
        for reason in DROP_REASONS:
            self.dropped.labels(reason)


class Sink(Protocol):
    def write(self, entity: str, rows: pa.Table, at: float) -> None: ...
    def tick(self, at: float) -> None: ...
    def close(self) -> None: ...


def _by_hour(entity: str, rows: pa.Table) -> list[tuple[tuple[str, str, str], pa.Table]]:
    """The rows by the date and hour (UTC) they were served: one part, but at an hour's
    turn."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    served = rows.column("served_at").cast("int64")
    hours = pc.divide(served, 3_600_000)
    first, last = pc.min(hours).as_py(), pc.max(hours).as_py()

    def key(hour: int) -> tuple[str, str, str]:
        stamp = time.gmtime(hour * 3600)
        return entity, time.strftime("%Y-%m-%d", stamp), time.strftime("%H", stamp)

    if first == last:
        return [(key(first), rows)]
    return [(key(h), rows.filter(pc.equal(hours, h))) for h in range(first, last + 1)]


@dataclass(slots=True)
class _Open:
    """A file being written: its hidden name, its final name, its writer."""

    tmp: Path
    final: Path
    handle: Any
    writer: Any
    opened: float
    rows: int = 0


class FileSink:
    """Parquet files per entity type, date and hour, rolled by time and size, renamed into
    place when complete."""

    def __init__(
        self,
        root: Path,
        registry: Registry,
        metrics: LogMetrics,
        worker: str,
        roll_seconds: float,
        roll_bytes: int,
    ) -> None:
        try:
            import pyarrow  # noqa: F401  (fails here, at startup, where it is missing)
        except ImportError:
            raise ConfigError(
                "--feature-log file:// needs pyarrow: pip install 'feature-store[log]'"
            ) from None

        self.root = root
        self.registry = registry
        self.metrics = metrics
        self.worker = worker
        self.roll_seconds = roll_seconds
        self.roll_bytes = roll_bytes
        self._open: dict[tuple[str, str, str], _Open] = {}
        self._buffers: dict[tuple[str, str, str], list[pa.Table]] = {}
        self._seq = itertools.count()
        root.mkdir(parents=True, exist_ok=True)

    def write(self, entity: str, rows: pa.Table, at: float) -> None:
        """Rows of one entity type (``schema``), by the date and hour they were served."""
        for key, part in _by_hour(entity, rows):
            buffer = self._buffers.get(key)
            if buffer is None:
                buffer = self._buffers[key] = []
            buffer.append(part)
            if sum(t.num_rows for t in buffer) >= ROW_GROUP:
                self._flush(key, at)

    def _flush(self, key: tuple[str, str, str], at: float) -> None:
        import pyarrow as pa

        tables = self._buffers.pop(key, None)
        if not tables:
            return
        rows = sum(t.num_rows for t in tables)
        f = self._open.get(key)
        try:
            if f is None:
                f = self._open[key] = self._create(key, at, tables[0].schema)
            f.writer.write_table(pa.concat_tables(tables))
            f.rows += rows
        except Exception:
            log.warning("the serving log could not write %d rows", rows, exc_info=True)
            self.metrics.sink_errors.inc()
            self.metrics.dropped.labels("sink_error").inc(rows)
            self._discard(key)
            return
        if f.handle.tell() >= self.roll_bytes:
            self._roll(key)

    def _create(self, key: tuple[str, str, str], at: float, schema: pa.Schema) -> _Open:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        entity, date, hour = key
        folder = self.root / f"entity_type={entity}" / f"date={date}" / f"hour={hour}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{self.worker}-{next(self._seq):06d}.parquet"
        tmp = folder / f".{name}.tmp"
        handle = open(tmp, "wb")  # noqa: SIM115  (closed when rolled or discarded)
        # statistics of the columns a reader filters on (time, entity, request) alone: those
        # of every feature column cost a quarter of the write
        writer = pq.ParquetWriter(
            handle,
            schema,
            compression="zstd",
            write_statistics=["served_at", "entity_id", "request_id"],
        )
        return _Open(tmp, folder / name, handle, writer, at)

    def _roll(self, key: tuple[str, str, str]) -> None:
        f = self._open.pop(key)
        try:
            f.writer.close()
            size = f.handle.tell()
            f.handle.close()
            os.replace(f.tmp, f.final)  # readers skip the hidden name: never a partial file
        except Exception:
            log.warning("the serving log could not close %s", f.tmp, exc_info=True)
            self.metrics.sink_errors.inc()
            self.metrics.dropped.labels("sink_error").inc(f.rows)
            with contextlib.suppress(OSError):
                f.handle.close()
                f.tmp.unlink()
            return
        self.metrics.rows.inc(f.rows)
        self.metrics.bytes.inc(size)
        self.metrics.files.inc()

    def _discard(self, key: tuple[str, str, str]) -> None:
        f = self._open.pop(key, None)
        if f is not None:
            self.metrics.dropped.labels("sink_error").inc(f.rows)
            with contextlib.suppress(Exception):
                f.handle.close()
                f.tmp.unlink()

    def tick(self, at: float) -> None:
        """Roll the files that are due: their first row is a roll interval old (rows still
        buffered are written first)."""
        for key in set(self._open) | set(self._buffers):
            f = self._open.get(key)
            tables = self._buffers.get(key)
            since = f.opened if f is not None else self._first(tables) if tables else at
            if at - since >= self.roll_seconds:
                self._flush(key, since)
                if key in self._open:
                    self._roll(key)

    @staticmethod
    def _first(tables: list[pa.Table]) -> float:
        return float(tables[0].column("served_at")[0].value) / 1000

    def close(self) -> None:
        at = time.time()
        for key in list(self._buffers):
            self._flush(key, at)
        for key in list(self._open):
            self._roll(key)


class KafkaSink:
    """A JSON record per row on a topic, produced asynchronously (keyed by entity id)."""

    def __init__(
        self, bootstrap: str, topic: str, metrics: LogMetrics, buffered: int = 100_000
    ) -> None:
        try:
            from confluent_kafka import Producer
        except ImportError:
            raise ConfigError(
                "--feature-log kafka:// needs confluent-kafka: pip install 'feature-store[log]'"
            ) from None
        self.topic = topic
        self.metrics = metrics
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "queue.buffering.max.messages": buffered,
                "message.timeout.ms": 30_000,
                "compression.type": "zstd",
            }
        )

    def _delivered(self, error: object, message: Any) -> None:
        if error is not None:
            self.metrics.sink_errors.inc()
            self.metrics.dropped.labels("sink_error").inc()
        else:
            self.metrics.rows.inc()
            self.metrics.bytes.inc(len(message.value()))

    def write(self, entity: str, rows: pa.Table, at: float) -> None:
        import pyarrow as pa

        # times as numbers (served_at in ms, event times in seconds), as the sink job reads
        for i, f in enumerate(rows.schema):
            if pa.types.is_timestamp(f.type):
                rows = rows.set_column(i, f.name, rows.column(i).cast(pa.int64()))
        produce = self.producer.produce
        for row in rows.to_pylist():
            row["entity_type"] = entity
            try:
                produce(
                    self.topic,
                    orjson.dumps(row),
                    str(row["entity_id"]).encode(),
                    on_delivery=self._delivered,
                )
            except BufferError:
                self.metrics.dropped.labels("sink_full").inc()
        self.producer.poll(0)

    def tick(self, at: float) -> None:
        self.producer.poll(0)

    def close(self) -> None:
        left = self.producer.flush(5.0)
        if left:
            self.metrics.dropped.labels("sink_error").inc(left)
