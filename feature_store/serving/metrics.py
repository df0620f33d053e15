"""Prometheus metrics of a serving deployment.

The cache counters are plain ints on the hot path (``CacheStats``), so a cache hit costs no
metric call. Request latencies and Redis round trips are histograms.

- One worker: a collector reads the ints at scrape time.
- Several workers (``serve --workers N``, which sets ``PROMETHEUS_MULTIPROC_DIR``):
  prometheus-client's multiprocess mode. Each worker copies its ints into counters and
  gauges backed by files in that directory, every ``SYNC_EVERY`` seconds and before it
  answers a scrape; a scrape of any worker adds up every worker's files. Counters and
  histograms are deployment totals; the cache's size, the circuit and the adaptive
  timeouts are per worker (a ``pid`` label), and vanish when their worker stops.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from feature_store.batch import EntityError
from feature_store.serving.l1.breaker import CircuitState
from feature_store.serving.l1.cache import CacheStats
from feature_store.serving.l1.loader import CachedReader

PREFIX = "feature_serving"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own variable
SYNC_EVERY = 1.0  # seconds between a worker's copies of its counters in multiprocess mode
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
    "error_hits": "L1 hits on cached entities whose stored data cannot be read (status error)",
    "front_hits": "of the hits and negative hits, those answered on a native front's "
    "thread without Python (NATIVE_HITS)",
    "misses": "L1 misses that started a Redis read",
    "deduplicated": "L1 misses that joined a Redis read already in flight (single-flight)",
    "coalesced": "keys that shared a Redis round trip with other keys",
    "round_trips": "pipelined Redis round trips of the read path",
    "keys_loaded": "entity groups read from Redis",
    "early_refreshes": "XFetch early refreshes of hot entries",
    "stale_serves": "entity groups served stale because Redis failed or the circuit was open",
    "failed_loads": "Redis reads that failed",
    "evictions": "entries evicted by the size bounds",
    "not_admitted": (
        "keys a front loaded while its entries were at their bounds and did not store: their "
        "first load since its doorkeeper was cleared (they answered the lookup that loaded them)"
    ),
    "invalidations": "entries dropped by push-write invalidations",
    "bypasses": "entity groups read with the cache bypassed",
    "generation_refreshes": "entries refreshed because a batch write of their group was announced",
    "shadow_checks": "cache hits re-read from Redis and compared (shadow mode)",
    "shadow_mismatches": "shadow checks whose cached values or write time differed from Redis",
    "shadow_skipped": (
        "cache hits drawn for a shadow check but not read: the entry was checked since it was "
        "loaded, or the worker's checks per second were spent"
    ),
    "warm_loaded": "entries loaded into the cache by the warm start",
}


_WRITTEN = (
    "unix time of the group's last write announced to serving: the nightly job's batch "
    "write, or the stream writer's or a push write's; absent until one is announced"
)
_MAX_AGE = "the group's max_age from the registry (values older are served as stale)"


def max_ages(reader: CachedReader) -> list[tuple[str, float]]:
    return [
        (name, float(g.max_age_seconds))
        for name, g in reader.registry.groups.items()
        if g.max_age_seconds is not None
    ]


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
            entries, held = cache.size()
            yield GaugeMetricFamily(
                f"{PREFIX}_cache_bytes", "estimated bytes held by the L1 cache", value=held
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_cache_entries", "entries held by the L1 cache", value=entries
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
        written = GaugeMetricFamily(
            f"{PREFIX}_group_batch_written_seconds", _WRITTEN, labels=["group"]
        )
        for group, at in self.reader.last_writes.items():
            written.add_metric([group], at)
        yield written
        max_age = GaugeMetricFamily(f"{PREFIX}_group_max_age_seconds", _MAX_AGE, labels=["group"])
        for group, seconds in max_ages(self.reader):
            max_age.add_metric([group], seconds)
        yield max_age


class ServingMetrics:
    def __init__(self, reader: CachedReader, *, multiprocess: bool | None = None) -> None:
        self.reader = reader
        self.multiprocess = (
            bool(os.environ.get(MULTIPROCESS_ENV)) if multiprocess is None else (multiprocess)
        )
        self.registry = CollectorRegistry(auto_describe=True)
        if self.multiprocess:
            self._shared = _SharedStats(self.registry)
        else:
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
        self.front_lookups = Counter(
            f"{PREFIX}_front_lookups",
            "lookups answered on a native front's thread, by API and how: from the L1's "
            "entries (hit, NATIVE_HITS; hit_loaded once Python loaded the lookup's missing "
            "keys) or, without the L1, written from Redis's replies to "
            "the commands the front wrote (NATIVE_READS), sent by Python (read) or on the "
            "front's own connections (read_direct)",
            ["api", "how"],
            registry=self.registry,
        )
        self.front_connections = Gauge(
            f"{PREFIX}_front_redis_connections",
            "Redis connections the native fronts read planned lookups on by themselves",
            registry=self.registry,
            multiprocess_mode="liveall",
        )
        self.cluster_redirects = Counter(
            f"{PREFIX}_cluster_redirects",
            "on Redis Cluster, replies saying a slot moved (MOVED, ASK) that the native fronts "
            "met; each handed its lookup to Python and the slot table was built again",
            registry=self.registry,
        )
        self.round_trip = Histogram(
            f"{PREFIX}_redis_round_trip_seconds",
            "latency of pipelined Redis round trips of the read path",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.shadow_age = Histogram(
            f"{PREFIX}_shadow_mismatch_age_seconds",
            "how long a cache entry had been cached when a shadow check found it differed",
            buckets=(0.1, 1, 5, 10, 30, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.entity_errors = Counter(
            f"{PREFIX}_entity_errors",
            "entity groups answered with status error (stored data that cannot be read), "
            "by API and reason",
            ["api", "reason"],
            registry=self.registry,
        )
        self.invalidation_gaps = Counter(
            f"{PREFIX}_invalidation_gaps",
            "times the invalidation subscription was lost and the L1 expired, by kind: error "
            "(the connection failed) or silent (nothing heard, not even a PONG, within the "
            "health deadline: a partition)",
            ["kind"],
            registry=self.registry,
        )
        reader.on_round_trip = self._round_trip
        reader.on_shadow_mismatch = self.shadow_age.observe
        # what brings counters kept elsewhere up to date before a scrape (the serving log's)
        self.on_render: list[Callable[[], None]] = []

    def count_errors(self, api: str, errors: Sequence[EntityError]) -> None:
        for e in errors:
            self.entity_errors.labels(api, e.reason.value).inc()

    def _round_trip(self, seconds: float, nkeys: int) -> None:
        self.round_trip.observe(seconds)

    def sync(self) -> None:
        """Multiprocess mode: copy this worker's plain counters into the shared files."""
        if self.multiprocess:
            self._shared.sync(self.reader)

    def render(self) -> bytes:
        """The text a scrape gets: this worker's figures, or with several, the deployment's."""
        for update in self.on_render:
            update()
        if not self.multiprocess:
            return bytes(generate_latest(self.registry))
        self.sync()
        merged = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return bytes(generate_latest(merged))

    def close(self) -> None:
        """At worker exit: the last counts, and this worker's gauges leave the totals."""
        if self.multiprocess:
            self.sync()
            prometheus_multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


class _SharedStats:
    """The collector's figures as file-backed metrics of prometheus-client's multiprocess
    mode: counters get this worker's increments since the last sync, gauges its values."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counters = {
            f.name: Counter(f"{PREFIX}_cache_{f.name}", _HELP[f.name], registry=registry)
            for f in fields(CacheStats)
        }
        self.opened = Counter(
            f"{PREFIX}_circuit_opened", "times the circuit opened", registry=registry
        )
        self.synced: dict[str, int] = dict.fromkeys(self.counters, 0)
        self.synced_opened = 0
        self.bytes = Gauge(
            f"{PREFIX}_cache_bytes",
            "estimated bytes held by the L1 cache, per worker",
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.entries = Gauge(
            f"{PREFIX}_cache_entries",
            "entries held by the L1 cache, per worker",
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.state = Gauge(
            f"{PREFIX}_circuit_state",
            "1 for the circuit breaker's current state, per worker",
            ["state"],
            registry=registry,
            multiprocess_mode="liveall",
        )
        self.timeouts = Gauge(
            f"{PREFIX}_redis_timeout_seconds",
            "the current adaptive timeout of a Redis round trip, by keys per round trip",
            ["keys"],
            registry=registry,
            multiprocess_mode="liveall",
        )
        # deployment-wide: the newest any worker heard of, the registry's (the same in all)
        self.written = Gauge(
            f"{PREFIX}_group_batch_written_seconds",
            _WRITTEN,
            ["group"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.max_age = Gauge(
            f"{PREFIX}_group_max_age_seconds",
            _MAX_AGE,
            ["group"],
            registry=registry,
            multiprocess_mode="livemax",
        )

    def sync(self, reader: CachedReader) -> None:
        cache = reader.cache
        if cache is not None:
            for name, counter in self.counters.items():
                value = getattr(cache.stats, name)
                if value > self.synced[name]:
                    counter.inc(value - self.synced[name])
                    self.synced[name] = value
            entries, held = cache.size()
            self.bytes.set(held)
            self.entries.set(entries)
        breaker = reader.breaker
        if breaker.opened > self.synced_opened:
            self.opened.inc(breaker.opened - self.synced_opened)
            self.synced_opened = breaker.opened
        for s in CircuitState:
            self.state.labels(s.value).set(1.0 if breaker.state is s else 0.0)
        for label, value in reader.timeout.labelled():
            self.timeouts.labels(label).set(value)
        for group, at in reader.last_writes.items():
            self.written.labels(group).set(at)
        for group, seconds in max_ages(reader):
            self.max_age.labels(group).set(seconds)
