"""The stream job's Prometheus series, served by its driver on ``--metrics-port``.

Spark tasks count what they read and wrote and return it with their bad records; the driver
adds each micro-batch's counts here and reads Kafka's lag from the query's progress. The
series and the alerts on them are in docs/streaming.md ("Metrics and alerts") and
deploy/prometheus/rules.yml.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

PREFIX = "feature_stream"
# event to written, seconds: the buckets each task counts its writes into
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


def lag_bucket_names() -> tuple[str, ...]:
    return (*(f"lag_le_{b:g}" for b in LAG_BUCKETS), "lag_le_inf")


def lag_bucket(seconds: float) -> str:
    """The name of the first bucket ``seconds`` falls in (not cumulative)."""
    for bound in LAG_BUCKETS:
        if seconds <= bound:
            return f"lag_le_{bound:g}"
    return "lag_le_inf"


class _LagHistogram(Collector):
    """``feature_stream_event_to_written_seconds``, from bucket counts the tasks made
    (prometheus-client's Histogram observes one value at a time, on this process)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.counts = dict.fromkeys(lag_bucket_names(), 0.0)
        self.total = 0.0
        self.lock = threading.Lock()

    def add(self, stats: Mapping[str, float]) -> None:
        with self.lock:
            for name in self.counts:
                self.counts[name] += stats.get(name, 0.0)
            self.total += stats.get("lag_sum", 0.0)

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            f"{PREFIX}_event_to_written_seconds",
            "from a record's event time to its write into Redis (records written)",
            labels=["group"],
        )
        with self.lock:
            cumulative, buckets = 0.0, []
            for bound, name in zip((*map(str, LAG_BUCKETS), "+Inf"), self.counts, strict=True):
                cumulative += self.counts[name]
                buckets.append((bound, cumulative))
            family.add_metric([self.group], buckets, self.total)
        yield family


class StreamMetrics:
    """The series of one stream job (one group, one topic)."""

    def __init__(self, group: str, topic: str, registry: CollectorRegistry | None = None) -> None:
        self.group, self.topic = group, topic
        self.registry = registry or CollectorRegistry()
        labels = {"group": group, "topic": topic}
        names = list(labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, names, registry=self.registry)

        self.read = counter("records_read", "records read from Kafka").labels(**labels)
        self.written = counter("records_written", "records written into Redis").labels(**labels)
        self.skipped = counter(
            "records_skipped", "records not written: Redis held a newer event of the entity"
        ).labels(**labels)
        self.superseded = counter(
            "records_superseded",
            "records not written: a newer record of the entity came in the same micro-batch",
        ).labels(**labels)
        self.quarantined = Counter(
            f"{PREFIX}_records_quarantined",
            "bad records written to the quarantine, by reason",
            [*names, "reason"],
            registry=self.registry,
        )
        self.batches = Histogram(
            f"{PREFIX}_batch_seconds",
            "a micro-batch's duration",
            names,
            buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=self.registry,
        ).labels(**labels)
        self.lag_records = Gauge(
            f"{PREFIX}_lag_records",
            "Kafka records not yet read (the largest over the topic's partitions)",
            names,
            registry=self.registry,
        ).labels(**labels)
        self.lag_seconds = Gauge(
            f"{PREFIX}_lag_seconds",
            "how far behind the topic the job reads: now minus the Kafka timestamp of the "
            "newest record read, while records are waiting; 0 when caught up",
            names,
            registry=self.registry,
        ).labels(**labels)
        self.last_write = Gauge(
            f"{PREFIX}_last_write_seconds",
            "unix time of the last micro-batch that wrote into Redis",
            names,
            registry=self.registry,
        ).labels(**labels)
        self.lag = _LagHistogram(group)
        self.registry.register(self.lag)
        self._kafka_time = 0.0

    def serve(self, port: int, host: str) -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def add_batch(self, stats: Mapping[str, float], bad: Mapping[str, int], seconds: float) -> None:
        """One micro-batch's counts, as the driver gathered them from its tasks."""
        self.read.inc(stats.get("records", 0.0))
        self.written.inc(stats.get("written", 0.0))
        self.skipped.inc(stats.get("skipped", 0.0))
        self.superseded.inc(stats.get("superseded", 0.0))
        for reason, count in bad.items():
            self.quarantined.labels(group=self.group, topic=self.topic, reason=reason).inc(count)
        self.lag.add(stats)
        self.batches.observe(seconds)
        if stats.get("written", 0.0) > 0:
            self.last_write.set(time.time())
        self._kafka_time = max(self._kafka_time, stats.get("kafka_time_max", 0.0))

    def add_progress(self, behind: int | None, now: float | None = None) -> None:
        """Kafka's lag, from the query's last progress: records behind, and how old the
        newest record read is while some are behind."""
        if behind is None:
            return
        self.lag_records.set(behind)
        now = time.time() if now is None else now
        waiting = behind > 0 and self._kafka_time > 0
        self.lag_seconds.set(max(0.0, now - self._kafka_time) if waiting else 0.0)


__all__ = ["LAG_BUCKETS", "StreamMetrics", "lag_bucket", "lag_bucket_names"]
