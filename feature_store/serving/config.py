"""Settings of the serving process: ports, limits, the L1 cache, Redis trouble, API keys.

Built once at startup from ``FEATURE_SERVING_*`` environment variables and the flags of
``feature-store serve``, then injected. The Redis URL, registry path and connection
settings stay in the core ``feature_store.settings.Settings`` (``FEATURE_STORE_*``); this
prefix is separate so that the core keeps rejecting unknown ``FEATURE_STORE_*`` names.
An unknown ``FEATURE_SERVING_*`` variable or an invalid value fails at startup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from feature_store import notices
from feature_store.errors import ConfigError
from feature_store.settings import check_numbers, env_values

ENV_PREFIX = "FEATURE_SERVING_"
# How `serve --workers N` hands the parent's settings to its worker processes.
WORKER_ENV = "_FEATURE_SERVING_WORKER_CONFIG"


@dataclass(frozen=True, slots=True)
class ServingSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int | None = 50051  # None: no gRPC server
    # "native": GetFeatures on the extension's HTTP/2 front, other methods passed through to
    # grpc.aio on a loopback port; "grpcio": every method on grpc.aio (also when the
    # extension is off or missing)
    grpc_front: str = "native"
    # "native": the REST port on the extension's HTTP/1.1 front (the fast POST routes
    # answered through it, the rest passed on to uvicorn on a loopback port); "uvicorn":
    # uvicorn serves the port (also when the extension is off or missing)
    rest_front: str = "native"
    # with a native front and the L1: lookups whose every entity is a fresh entry answered
    # on the front's thread from the entries' bytes, REST and gRPC (serving/fronts/hits.py)
    native_hits: bool = True
    # with native hits: the L1's misses loaded by the front itself on its own Redis
    # connections, decoded and stored in the extension (native/src/hits/load.rs)
    native_loads: bool = True
    # with a native front, the L1 off and one Redis node: the front writes a lookup's Redis
    # commands and its answer, Python only sends the bytes (serving/fronts/reads.py)
    native_reads: bool = True
    # Redis connections each front reads on by itself, without Python, for its planned reads
    # and its loads (redis:// only: a TLS or unix-socket URL, or 0, leaves them to Python)
    native_reads_connections: int = 2
    workers: int = 1

    # request limits
    max_entities: int = 1000
    max_features: int = 1000
    max_body_bytes: int = 8 * 1024 * 1024
    # a connection whose request headers, or whose body, do not arrive in time is closed
    # (408 for a body): slow clients cannot hold connections open indefinitely
    request_header_timeout: float = 10.0
    request_body_timeout: float = 10.0

    # L1 cache
    cache: bool = True
    cache_ttl: float = 30.0  # seconds a loaded entity group is served without asking Redis
    cache_jitter: float = 0.1  # TTL varies by +-5% so that keys loaded together expire apart
    cache_negative_ttl: float = 2.0  # for entities with no value in the group
    cache_max_bytes: int = 256 * 1024 * 1024
    cache_max_entries: int = 1_000_000
    cache_max_stale: float = 300.0  # how long past expiry a value may be served if Redis fails
    # what an entry keeps: "answers", its packed values and their answer bytes (REST's JSON
    # at load, gRPC's records once asked), about 2.9 KB per standard entity; "compact", the
    # packed values only (about 1.4 KB), each hit writing its answer from them
    cache_form: str = "answers"
    xfetch_beta: float = 1.0  # >1 refreshes hot keys earlier, 0 disables early refresh
    cache_refresh_ahead: float = 0.2  # a hit in this last share of a TTL reloads (batched)
    single_flight: bool = True  # off only to measure what the debouncer saves
    invalidation: bool = True  # publish and follow invalidations (feature_store.notices)
    invalidation_channel: str = notices.CHANNEL  # writers outside serving use the default
    # seconds the subscription may hear nothing, not even a PONG, before it counts as lost
    # (a silent partition: the cache is expired as after a drop); 0: no health check
    invalidation_deadline: float = 3.0
    refresh_rate: float = 5000.0  # keys/s refreshed in the background after a batch write
    shadow_fraction: float = 0.01  # of cache hits re-read from Redis and compared
    # at most this many shadow reads a second per worker (and one per entry per load);
    # 0: no bound
    shadow_max_per_second: float = 0.1
    warm_start_keys: int = 50_000  # hot keys loaded before serving (0: no warm start)
    warm_start_seconds: float = 10.0  # readiness waits no longer than this for them
    warm_snapshot_interval: float = 30.0  # seconds between hot-key snapshots (0: at stop only)

    # Redis trouble
    redis_timeout_min: float = 0.1  # floor of the adaptive timeout
    redis_timeout_max: float = 1.0  # cap of the adaptive timeout (and the first timeout)
    redis_timeout_percentile: float = 99.9
    redis_timeout_factor: float = 3.0  # timeout = percentile of observed latency x factor
    breaker_failures: int = 5  # failures within the window that open the circuit
    breaker_window: float = 10.0
    breaker_open: float = 0.5  # first open period; doubles per failed probe up to the max
    # a probe every half second while Redis is down: serving resumes within about 0.5 s of
    # Redis being back, where a longer backoff outlasted the fault (4 s more after a 3 s
    # failover with 10 s; with 1 s, reads failed for more than a second past the last heal
    # of a flapping link, benchmarks/partitions.py); a probe is one read, which a down
    # Redis does not notice
    breaker_open_max: float = 0.5

    # TLS on both ports: PEM files of the server's certificate (chain) and key; with a
    # client CA, clients must present a certificate it signed (mutual TLS)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None

    # auth: no keys at all means no auth
    read_keys: tuple[str, ...] = ()
    admin_keys: tuple[str, ...] = ()  # writes and cache bypass; also allowed to read

    # the serving log (serving/feature_log/): file:///DIR or kafka://HOST:PORT/TOPIC; a row
    # per served entity of the sampled lookups (by request id), rolled every so many
    # seconds or bytes; at most so many bytes of answers queued per worker (more are
    # dropped, and counted)
    feature_log: str | None = None
    feature_log_sample: float = 1.0
    feature_log_roll_seconds: float = 60.0
    feature_log_roll_bytes: int = 128 * 1024 * 1024
    feature_log_queue_bytes: int = 32 * 1024 * 1024

    # garbage collection of the serving worker (see docs/serving.md, "GC")
    gc_freeze: bool = True
    gc_threshold: tuple[int, int, int] = (50_000, 50, 1000)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ServingSettings:
        """Settings from ``FEATURE_SERVING_*`` variables, then ``overrides`` that are not None."""
        values = env_values(ENV_PREFIX, {f.name for f in fields(cls)}, env, overrides)
        coerced: dict[str, Any] = {k: _coerce(k, v) for k, v in values.items()}
        return cls(**coerced).validated()

    def validated(self) -> ServingSettings:
        def fail(name: str, message: str) -> ConfigError:
            return ConfigError(f"{ENV_PREFIX}{name.upper()} {message}")

        check_numbers(ENV_PREFIX, self, seconds=_SECONDS)
        for name in ("port", "workers", "max_entities", "max_features", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise fail(name, "must be at least 1")
        if not 0 <= self.port <= 65535:
            raise fail("port", "must be a TCP port")
        if self.grpc_port is not None and not 0 <= self.grpc_port <= 65535:
            raise fail("grpc_port", "must be a TCP port")
        if self.grpc_front not in ("native", "grpcio"):
            raise fail("grpc_front", "must be native or grpcio")
        if self.rest_front not in ("native", "uvicorn"):
            raise fail("rest_front", "must be native or uvicorn")
        if self.cache_form not in ("answers", "compact"):
            raise fail("cache_form", "must be answers or compact")
        for name in (
            "cache_ttl",
            "redis_timeout_min",
            "redis_timeout_max",
            "breaker_open",
            "request_header_timeout",
            "request_body_timeout",
            "redis_timeout_factor",
        ):
            if getattr(self, name) <= 0:
                raise fail(name, "must be positive")
        if self.feature_log is not None:
            parse_target(self.feature_log)
        if not 0 <= self.feature_log_sample <= 1:
            raise fail("feature_log_sample", "must be in [0, 1]")
        if self.feature_log_roll_seconds <= 0:
            raise fail("feature_log_roll_seconds", "must be positive")
        for name in ("feature_log_roll_bytes", "feature_log_queue_bytes"):
            if getattr(self, name) < 1:
                raise fail(name, "must be at least 1")
        if not 0 <= self.shadow_fraction <= 1:
            raise fail("shadow_fraction", "must be in [0, 1]")
        if not self.shadow_max_per_second >= 0:
            raise fail("shadow_max_per_second", "must be 0 (no bound) or more")
        if self.refresh_rate <= 0:
            raise fail("refresh_rate", "must be positive")
        if self.warm_start_keys < 0:
            raise fail("warm_start_keys", "must not be negative")
        if not 0 <= self.native_reads_connections <= 64:
            raise fail("native_reads_connections", "must be in [0, 64]")
        if self.warm_start_seconds <= 0:
            raise fail("warm_start_seconds", "must be positive")
        if self.warm_snapshot_interval < 0:
            raise fail("warm_snapshot_interval", "must not be negative")
        for name in (
            "cache_negative_ttl",
            "cache_max_stale",
            "xfetch_beta",
            "breaker_window",
            "invalidation_deadline",
        ):
            if getattr(self, name) < 0:
                raise fail(name, "must not be negative")
        if not 0 <= self.cache_jitter < 1:
            raise fail("cache_jitter", "must be in [0, 1)")
        if not 0 <= self.cache_refresh_ahead < 1:
            raise fail("cache_refresh_ahead", "must be in [0, 1)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise fail("tls_cert", "and FEATURE_SERVING_TLS_KEY go together: set both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise fail("tls_client_ca", "needs TLS: set FEATURE_SERVING_TLS_CERT and _KEY too")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path is not None:
                try:
                    with open(path, "rb") as f:
                        pem = f.read()
                except OSError as e:
                    raise fail(name, f"cannot be read: {path}: {e.strerror}") from None
                if b"-----BEGIN " not in pem:
                    raise fail(name, f"is not a PEM file: {path}")
        if self.cache_max_bytes < 1 or self.cache_max_entries < 1:
            raise ConfigError(
                f"{ENV_PREFIX}CACHE_MAX_BYTES and {ENV_PREFIX}CACHE_MAX_ENTRIES must be positive"
            )
        if self.redis_timeout_min > self.redis_timeout_max:
            raise fail("redis_timeout_min", "must not exceed FEATURE_SERVING_REDIS_TIMEOUT_MAX")
        if not 50 <= self.redis_timeout_percentile < 100:
            raise fail("redis_timeout_percentile", "must be in [50, 100)")
        if self.breaker_failures < 1:
            raise fail("breaker_failures", "must be at least 1")
        if self.breaker_open_max < self.breaker_open:
            raise fail("breaker_open_max", "must be at least FEATURE_SERVING_BREAKER_OPEN")
        for name in ("read_keys", "admin_keys"):
            for key in getattr(self, name):
                if len(key) < 8 or any(c.isspace() or c == "," for c in key):
                    raise fail(name, "entries must be 8+ characters without spaces or commas")
        return self

    @property
    def auth_enabled(self) -> bool:
        return bool(self.read_keys or self.admin_keys)

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> ServingSettings:
        raw = orjson.loads(text)
        coerced: dict[str, Any] = {k: _coerce(k, v) for k, v in raw.items()}
        return cls(**coerced).validated()


# the float settings that are durations (the others are shares, rates and factors)
_SECONDS = frozenset(
    f.name
    for f in fields(ServingSettings)
    if f.type == "float"
    and f.name
    not in (
        "cache_jitter",
        "xfetch_beta",
        "cache_refresh_ahead",
        "refresh_rate",
        "shadow_fraction",
        "shadow_max_per_second",
        "feature_log_sample",
        "redis_timeout_percentile",
        "redis_timeout_factor",
    )
)
_KINDS = {f.name: str(f.type) for f in fields(ServingSettings)}


def _coerce(name: str, value: object) -> object:
    kind = _KINDS.get(name)
    if kind is None:
        raise ConfigError(f"unknown serving setting {name!r}")
    var = f"{ENV_PREFIX}{name.upper()}"
    if kind.startswith("tuple[str"):
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        if isinstance(value, list | tuple):
            return tuple(str(v) for v in value)
    if kind.startswith("tuple[int"):
        parts = value.split(",") if isinstance(value, str) else value
        try:
            t = tuple(int(p) for p in parts)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            raise ConfigError(
                f"{var}={value!r}: expected three integers like 50000,50,1000"
            ) from None
        if len(t) != 3 or min(t) < 1:
            raise ConfigError(f"{var}={value!r}: expected three positive integers")
        return t
    if not isinstance(value, str):
        return value
    try:
        if kind == "bool":
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "float":
            return float(value)
        if kind == "int":
            return int(value)
        if kind == "int | None":
            return None if value.strip().lower() in ("", "none", "off") else int(value)
    except ValueError:
        raise ConfigError(f"{var}={value!r} is not a valid {kind}") from None
    return value


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed ``--feature-log`` URL: a directory (file) or a Kafka topic."""

    kind: str  # "file" or "kafka"
    path: Path | None = None
    bootstrap: str | None = None
    topic: str | None = None


def parse_target(url: str) -> Target:
    """``file:///DIR`` or ``kafka://HOST:PORT/TOPIC``; ConfigError says what is wrong."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(f"--feature-log {url!r}: a directory is file:///absolute/path")
        return Target("file", path=Path(parts.path))
    if parts.scheme == "kafka":
        topic = parts.path.strip("/")
        if not parts.netloc or not topic or "/" in topic:
            raise ConfigError(f"--feature-log {url!r}: a topic is kafka://HOST:PORT/TOPIC")
        return Target("kafka", bootstrap=parts.netloc, topic=topic)
    raise ConfigError(f"--feature-log {url!r}: expected file:///DIR or kafka://HOST:PORT/TOPIC")


def tls_pem(settings: ServingSettings) -> tuple[bytes, bytes, bytes | None] | None:
    """PEM bytes of the TLS certificate, its key and the client CA (None without TLS)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    ca = Path(settings.tls_client_ca).read_bytes() if settings.tls_client_ca else None
    return Path(settings.tls_cert).read_bytes(), Path(settings.tls_key).read_bytes(), ca
