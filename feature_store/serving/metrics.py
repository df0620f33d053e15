"""Prometheus metrics of a serving process.

The cache counters are plain ints on the hot path (``CacheStats``) and are read by a
collector at scrape time, so a cache hit costs no metric call. Request latencies and Redis
round trips are histograms. Each app has its own ``CollectorRegistry``: with several
workers each process exposes its own figures (see docs/serving.md, "Metrics").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from feature_store.serving.breaker import CircuitState
from feature_store.serving.loader import CachedReader

PREFIX = "feature_serving"
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_HELP = {
    "hits": "L1 cache hits (entity groups served from memory)",
    "negative_hits": "L1 hits on cached missing entities",
    "misses": "L1 misses that started a Redis read",
    "deduplicated": "L1 misses that joined a Redis read already in flight (single-flight)",
    "coalesced": "keys that shared a Redis round trip with other keys",
    "round_trips": "pipelined Redis round trips of the read path",
    "keys_loaded": "entity groups read from Redis",
    "early_refreshes": "XFetch early refreshes of hot entries",
    "stale_serves": "entity groups served stale because Redis failed or the circuit was open",
    "failed_loads": "Redis reads that failed",
    "evictions": "entries evicted by the size bounds",
    "invalidations": "entries dropped by push-write invalidations",
    "bypasses": "entity groups read with the cache bypassed",
}


class ServingCollector(Collector):
    def __init__(self, reader: CachedReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        cache = self.reader.cache
        if cache is not None:
            stats = cache.stats
            for f in fields(stats):
                c = CounterMetricFamily(f"{PREFIX}_cache_{f.name}", _HELP[f.name])
                c.add_metric([], getattr(stats, f.name))
                yield c
            yield GaugeMetricFamily(
                f"{PREFIX}_cache_bytes", "estimated bytes held by the L1 cache", value=cache.bytes
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_cache_entries", "entries held by the L1 cache", value=len(cache)
            )
        breaker = self.reader.breaker
        state = GaugeMetricFamily(
            f"{PREFIX}_circuit_state", "1 for the circuit breaker's current state", labels=["state"]
        )
        for s in CircuitState:
            state.add_metric([s.value], 1.0 if breaker.state is s else 0.0)
        yield state
        opened = CounterMetricFamily(f"{PREFIX}_circuit_opened", "times the circuit opened")
        opened.add_metric([], breaker.opened)
        yield opened
        timeouts = GaugeMetricFamily(
            f"{PREFIX}_redis_timeout_seconds",
            "the current adaptive timeout of a Redis round trip, by keys per round trip",
            labels=["keys"],
        )
        for label, value in self.reader.timeout.labelled():
            timeouts.add_metric([label], value)
        yield timeouts


class ServingMetrics:
    def __init__(self, reader: CachedReader) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(ServingCollector(reader))
        self.requests = Histogram(
            f"{PREFIX}_request_seconds",
            "request latency in the server, by API and outcome",
            ["api", "method", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.entities = Counter(
            f"{PREFIX}_entities_served",
            "entities answered by feature lookups",
            ["api"],
            registry=self.registry,
        )
        self.round_trip = Histogram(
            f"{PREFIX}_redis_round_trip_seconds",
            "latency of pipelined Redis round trips of the read path",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        reader.on_round_trip = self._round_trip

    def _round_trip(self, seconds: float, nkeys: int) -> None:
        self.round_trip.observe(seconds)
