"""Settings: built once at startup from the environment and command-line flags.

Every variable is ``FEATURE_STORE_<NAME>``. An unknown ``FEATURE_STORE_*`` variable or an
invalid value fails at startup with a message naming it, instead of being ignored.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from feature_store.connection import RedisOptions, RedisTarget
from feature_store.durability import Durability
from feature_store.errors import ConfigError

ENV_PREFIX = "FEATURE_STORE_"
# The longest duration a setting may name. Past it, sockets (time_t) and the native fronts'
# timers overflow; a year is longer than any timeout or TTL a feature store needs.
MAX_SECONDS = 365 * 24 * 3600


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "feature-store"


@dataclass(frozen=True, slots=True)
class Settings:
    redis_url: str | None = None  # None: start the embedded redis-server
    registry: Path = Path("features.yaml")
    data_dir: Path = field(default_factory=default_data_dir)  # the embedded Redis's files
    socket_timeout: float = 1.0  # seconds
    connect_timeout: float = 1.0
    max_connections: int = 64
    redis_retries: int = 1  # quick retries of a failed Redis call, before it is an error
    # replicas every write waits for: "replicas=N[,timeout=MS]" (feature_store.durability);
    # empty: Redis's asynchronous replication
    write_durability: str = ""
    native: str = "on"  # "off": answers by the Python reference (read by feature_store.native)
    # where `feature-store stream` and the embedded Kafka broker find their jars (a directory
    # with spark/ and broker/); None: the environment's kafka/ (feature_store.kafka)
    kafka_jars: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``FEATURE_STORE_*`` variables, then ``overrides`` that are not None."""
        values = env_values(ENV_PREFIX, {f.name for f in fields(cls)}, env, overrides)
        coerced: dict[str, Any] = {k: _coerce(k, v, cls) for k, v in values.items()}
        return cls(**coerced).validated()

    def validated(self) -> Settings:
        check_numbers(ENV_PREFIX, self, seconds=("socket_timeout", "connect_timeout"))
        for name in ("socket_timeout", "connect_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be positive")
        if self.redis_retries < 0:
            raise ConfigError(f"{ENV_PREFIX}REDIS_RETRIES must be 0 or more")
        if self.native.strip().lower() not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
            raise ConfigError(f"{ENV_PREFIX}NATIVE must be on or off, not {self.native!r}")
        if self.max_connections < 1:
            raise ConfigError(f"{ENV_PREFIX}MAX_CONNECTIONS must be at least 1")
        self.durability().fits(self.socket_timeout)
        if self.redis_url is not None:
            self.redis_target()  # fails now on a malformed URL
        return self

    def durability(self) -> Durability:
        try:
            return Durability.parse(self.write_durability)
        except ConfigError as e:
            raise ConfigError(f"{ENV_PREFIX}WRITE_DURABILITY: {e}") from None

    def redis_target(self) -> RedisTarget:
        if self.redis_url is None:
            raise ConfigError("no Redis URL is configured")
        return self.target(self.redis_url)

    def target(self, url: str) -> RedisTarget:
        """``url`` with these connection settings: timeouts, pool size, retries."""
        return self.redis_options().target(url)

    def redis_options(self) -> RedisOptions:
        return RedisOptions(
            socket_timeout=self.socket_timeout,
            connect_timeout=self.connect_timeout,
            max_connections=self.max_connections,
            retries=self.redis_retries,
            durability=self.durability(),
        )


def target_from_env(url: str) -> RedisTarget:
    """``url`` with the connection settings of the environment (``FEATURE_STORE_SOCKET_TIMEOUT``,
    ``…_CONNECT_TIMEOUT``, ``…_MAX_CONNECTIONS``, ``…_REDIS_RETRIES``,
    ``…_WRITE_DURABILITY``): what the library, the
    Feast plugin and every command open their connections with."""
    return Settings.from_env().target(url)


def check_numbers(prefix: str, settings: Any, seconds: Collection[str]) -> None:
    """Every float setting of the dataclass ``settings`` must be a finite number (``nan``
    passes every comparison and ``inf`` every bound, so they are refused here, by name), and
    those in ``seconds`` at most ``MAX_SECONDS``."""
    for f in fields(settings):
        if f.type != "float":
            continue
        value = getattr(settings, f.name)
        var = f"{prefix}{f.name.upper()}"
        if not math.isfinite(value):
            raise ConfigError(f"{var} must be a finite number, not {value!r}")
        if f.name in seconds and value > MAX_SECONDS:
            raise ConfigError(f"{var} must be at most {MAX_SECONDS:,} seconds (a year)")


def env_values(
    prefix: str,
    known: Collection[str],
    env: Mapping[str, str] | None,
    overrides: Mapping[str, object],
) -> dict[str, object]:
    """Raw settings: ``{prefix}NAME`` variables by lower-case name, then the overrides that
    are not None. An unknown name under the prefix, or among the overrides, is an error."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for var, raw in env.items():
        if not var.startswith(prefix):
            continue
        name = var[len(prefix) :].lower()
        if name not in known:
            raise ConfigError(
                f"unknown setting {var}; known: "
                + ", ".join(prefix + n.upper() for n in sorted(known))
            )
        values[name] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - set(known)
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    return values


def _coerce(name: str, value: object, cls: type[Settings]) -> object:
    kind = {f.name: f.type for f in fields(cls)}[name]
    if not isinstance(value, str):
        return value
    try:
        if kind == "float":
            return float(value)
        if kind == "int":
            return int(value)
        if kind == "Path":
            return Path(value)
        if kind == "Path | None":
            return Path(value) if value else None
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={value!r} is not a valid {kind}") from None
    return value or None
