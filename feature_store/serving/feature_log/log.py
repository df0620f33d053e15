"""One worker's serving log: request ids, the queue answers are offered to, and the thread
that reads them into rows and hands them to the sink."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from feature_store.native import native_enabled
from feature_store.registry import Registry
from feature_store.serving.config import parse_target
from feature_store.serving.feature_log.ids import given_id, sampled, threshold
from feature_store.serving.feature_log.rows import (
    FROM_L1,
    FROM_REDIS,
    AnswerRows,
    NativePart,
    Part,
    Served,
    arrow_schema,
)
from feature_store.serving.feature_log.sinks import FileSink, KafkaSink, LogMetrics, Sink

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from feature_store.serving.service import Lookup

log = logging.getLogger(__name__)

TICK = 0.1  # seconds the log thread sleeps when both queues are empty


class FeatureLog:
    """One worker's request ids and serving log (``logging`` False: request ids only)."""

    def __init__(
        self,
        registry: Registry,
        url: str | None = None,
        *,
        sample: float = 1.0,
        roll_seconds: float = 60.0,
        roll_bytes: int = 128 * 1024 * 1024,
        queue_bytes: int = 32 * 1024 * 1024,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry
        self.prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self.target = parse_target(url) if url else None
        self.logging = self.target is not None
        self.threshold = threshold(sample)
        self.capacity = queue_bytes
        self._queued = 0  # bytes of answers queued (under _counting, with the log thread)
        self.roll_seconds = roll_seconds
        self.roll_bytes = roll_bytes
        self._queue: deque[Served] = deque()
        self._front_dropped = 0  # the native fronts' drops counted so far
        self._counting = threading.Lock()
        self.metrics = LogMetrics(metrics) if self.logging else None
        self._queue_full = self.metrics.dropped.labels("queue_full") if self.metrics else None
        self.native: Any = None
        if native_enabled():
            from feature_store._native import ServedLog

            self.native = ServedLog(self.prefix, self.threshold, queue_bytes, self.logging)
        self.rows = AnswerRows(registry)
        self._schemas: dict[str, pa.Schema] = {}
        self._sink: Sink | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()

    # --- on the serving thread

    def request_id(self, given: str | None) -> str:
        """The client's request id, or a new one (this worker's prefix and a counter)."""
        return given_id(given) or f"{self.prefix}{next(self._ids):016x}"

    def offer(self, api: int, request_id: str, answer: bytes, lookups: Sequence[Lookup]) -> None:
        """Offer an answer to the log (kept if its request id is sampled and the queue has
        room; else dropped and counted). Never waits."""
        if not self.logging or not sampled(request_id, self.threshold):
            return
        with self._counting:
            full = self._queued + len(answer) > self.capacity
            if not full:
                self._queued += len(answer)
        if full:
            assert self._queue_full is not None
            self._queue_full.inc()
            return
        sources = [_sources(lookup) for lookup in lookups]
        now = lookups[0].now if lookups else int(time.time())
        self._queue.append(
            Served(api, request_id, time.time_ns() // 1_000_000, now, sources, answer)
        )

    # --- the log thread

    def start(self) -> None:
        """Open the sink (failing here, at startup, when it cannot be) and start the thread."""
        if self.target is None or self._thread is not None:
            return
        assert self.metrics is not None
        if self.target.kind == "file":
            assert self.target.path is not None
            self._sink = FileSink(
                self.target.path,
                self.registry,
                self.metrics,
                f"{self.prefix[:8]}{os.getpid()}",
                self.roll_seconds,
                self.roll_bytes,
            )
        else:
            assert self.target.bootstrap is not None
            assert self.target.topic is not None
            self._sink = KafkaSink(self.target.bootstrap, self.target.topic, self.metrics)
        self._thread = threading.Thread(target=self._run, name="feature-log", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the sink's files (or flush its records)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        assert self._sink is not None
        sink = self._sink
        while True:
            stopping = self._stop.is_set()
            taken = self._take()
            if taken:
                self._write(sink, taken)
            self.count_drops()
            try:
                sink.tick(time.time())
            except Exception:
                log.warning("the serving log's sink failed", exc_info=True)
            if stopping:
                break
            if not taken:
                self._stop.wait(TICK)
        try:
            sink.close()
        except Exception:
            log.warning("the serving log's sink failed to close", exc_info=True)
        self.count_drops()

    def _take(self) -> list[Served]:
        queue = self._queue
        taken = [queue.popleft() for _ in range(len(queue))]
        with self._counting:
            self._queued -= sum(len(s.answer) for s in taken)
        if self.native is not None:
            for api, request_id, served_at, source, answer in self.native.take():
                taken.append(Served(api, request_id, served_at, served_at // 1000, source, answer))
        return taken

    def _write(self, sink: Sink, taken: list[Served]) -> None:
        import pyarrow as pa

        assert self.metrics is not None
        parts: dict[tuple[str, object], Part | NativePart] = {}
        for served in taken:
            try:
                self.rows.add(served, parts)
            except Exception:
                log.warning("the serving log could not read an answer", exc_info=True)
                self.metrics.dropped.labels("unreadable").inc()
        by_entity: dict[str, list[Part | NativePart]] = {}
        for (entity, _), part in parts.items():
            by_entity.setdefault(entity, []).append(part)
        at = time.time()
        for entity, entity_parts in by_entity.items():
            rows = sum(p.rows for p in entity_parts)
            try:
                schema = self.schema(entity)
                table = pa.concat_tables([p.table(schema) for p in entity_parts])
                sink.write(entity, table, at)
            except Exception:
                log.warning("the serving log's sink failed", exc_info=True)
                self.metrics.sink_errors.inc()
                self.metrics.dropped.labels("sink_error").inc(rows)

    def schema(self, entity: str) -> pa.Schema:
        found = self._schemas.get(entity)
        if found is None:
            found = self._schemas[entity] = arrow_schema(
                self.registry, self.registry.entities[entity]
            )
        return found

    def count_drops(self) -> None:
        """Count the native fronts' drops (the log thread, and each scrape: a stalled sink
        stalls the thread, and the drops must show then most of all)."""
        if self.native is None or self.metrics is None:
            return
        with self._counting:
            front = self.native.dropped
            if front > self._front_dropped:
                self.metrics.dropped.labels("front_queue_full").inc(front - self._front_dropped)
                self._front_dropped = front


def _sources(lookup: Lookup) -> bytes:
    """Per entity of a lookup: FROM_REDIS where a group's entry was loaded for it."""
    started = lookup.started
    return bytes(
        FROM_REDIS if any(r.entry.loaded_at >= started for r in row) else FROM_L1
        for row in lookup.entries
    )
