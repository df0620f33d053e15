"""Serving settings: environment, overrides, and clear errors."""

from __future__ import annotations

import pytest

from feature_store.errors import ConfigError
from feature_store.serving.config import ServingSettings


def test_defaults_and_environment() -> None:
    s = ServingSettings.from_env(
        {
            "FEATURE_SERVING_PORT": "9000",
            "FEATURE_SERVING_CACHE": "off",
            "FEATURE_SERVING_CACHE_TTL": "1.5",
            "FEATURE_SERVING_GRPC_PORT": "none",
            "FEATURE_SERVING_READ_KEYS": "aaaaaaaaaa, bbbbbbbbbb",
            "FEATURE_SERVING_GC_THRESHOLD": "1000,10,10",
            "OTHER": "ignored",
        },
        port=9001,
    )
    assert s.port == 9001  # flags win over the environment
    assert s.cache is False
    assert s.cache_ttl == 1.5
    assert s.grpc_port is None
    assert s.read_keys == ("aaaaaaaaaa", "bbbbbbbbbb")
    assert s.auth_enabled
    assert s.gc_threshold == (1000, 10, 10)
    assert ServingSettings.from_json(s.to_json()) == s
    assert not ServingSettings.from_env({}).auth_enabled


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FEATURE_SERVING_PROT": "1"}, "unknown setting FEATURE_SERVING_PROT"),
        ({"FEATURE_SERVING_PORT": "x"}, "FEATURE_SERVING_PORT='x' is not a valid int"),
        ({"FEATURE_SERVING_CACHE": "maybe"}, "FEATURE_SERVING_CACHE='maybe'"),
        ({"FEATURE_SERVING_CACHE_TTL": "0"}, "FEATURE_SERVING_CACHE_TTL must be positive"),
        ({"FEATURE_SERVING_CACHE_JITTER": "1.5"}, "FEATURE_SERVING_CACHE_JITTER"),
        # nan passes every comparison and inf every bound: refused by name
        ({"FEATURE_SERVING_CACHE_TTL": "nan"}, "FEATURE_SERVING_CACHE_TTL must be a finite"),
        ({"FEATURE_SERVING_CACHE_JITTER": "nan"}, "FEATURE_SERVING_CACHE_JITTER must be a fin"),
        ({"FEATURE_SERVING_CACHE_MAX_STALE": "inf"}, "FEATURE_SERVING_CACHE_MAX_STALE must be a"),
        ({"FEATURE_SERVING_XFETCH_BETA": "-inf"}, "FEATURE_SERVING_XFETCH_BETA must be a fin"),
        # past a year, sockets and the native fronts' timers overflow
        ({"FEATURE_SERVING_CACHE_TTL": "1e20"}, "FEATURE_SERVING_CACHE_TTL must be at most"),
        ({"FEATURE_SERVING_REQUEST_BODY_TIMEOUT": "1e10"}, "REQUEST_BODY_TIMEOUT must be at most"),
        ({"FEATURE_SERVING_REDIS_TIMEOUT_FACTOR": "0"}, "REDIS_TIMEOUT_FACTOR must be positive"),
        ({"FEATURE_SERVING_MAX_ENTITIES": "0"}, "FEATURE_SERVING_MAX_ENTITIES"),
        ({"FEATURE_SERVING_ADMIN_KEYS": "short"}, "FEATURE_SERVING_ADMIN_KEYS"),
        ({"FEATURE_SERVING_GC_THRESHOLD": "1,2"}, "three positive integers"),
        ({"FEATURE_SERVING_GRPC_FRONT": "tonic"}, "FEATURE_SERVING_GRPC_FRONT must be native"),
        ({"FEATURE_SERVING_CACHE_FORM": "small"}, "FEATURE_SERVING_CACHE_FORM must be answers"),
        ({"FEATURE_SERVING_INVALIDATION_DEADLINE": "-1"}, "INVALIDATION_DEADLINE must not be neg"),
        (
            {"FEATURE_SERVING_REDIS_TIMEOUT_MIN": "2", "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "1"},
            "FEATURE_SERVING_REDIS_TIMEOUT_MIN",
        ),
    ],
)
def test_invalid_settings_fail_with_the_variable_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ServingSettings.from_env(env)


def test_flags_are_checked_like_the_environment() -> None:
    with pytest.raises(ConfigError, match="FEATURE_SERVING_CACHE_TTL must be a finite number"):
        ServingSettings.from_env({}, cache_ttl=float("inf"))
    year = 365 * 24 * 3600
    assert ServingSettings.from_env({}, cache_ttl=year, cache_max_stale=year).cache_ttl == year
    assert ServingSettings.from_env({}, refresh_rate=1e12).refresh_rate == 1e12  # not seconds
