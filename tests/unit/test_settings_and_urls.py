"""Settings from the environment, and Redis URL parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from feature_store.connection import RedisTarget
from feature_store.errors import ConfigError
from feature_store.settings import Settings


def test_settings_from_env_and_overrides() -> None:
    s = Settings.from_env(
        {"FEATURE_STORE_REDIS_URL": "redis://h:1", "FEATURE_STORE_SOCKET_TIMEOUT": "0.5", "X": "1"},
        data_dir=Path("/tmp/x"),
        max_connections=None,  # None means "not given": the default stays
    )
    assert s.redis_url == "redis://h:1"
    assert s.socket_timeout == 0.5
    assert s.data_dir == Path("/tmp/x")
    assert s.max_connections == 64


def test_no_url_means_embedded() -> None:
    assert Settings.from_env({}).redis_url is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FEATURE_STORE_REDIS_ULR": "x"}, "unknown setting FEATURE_STORE_REDIS_ULR"),
        ({"FEATURE_STORE_SOCKET_TIMEOUT": "fast"}, "FEATURE_STORE_SOCKET_TIMEOUT='fast' is not"),
        ({"FEATURE_STORE_SOCKET_TIMEOUT": "0"}, "FEATURE_STORE_SOCKET_TIMEOUT must be positive"),
        ({"FEATURE_STORE_SOCKET_TIMEOUT": "nan"}, "FEATURE_STORE_SOCKET_TIMEOUT must be a finite"),
        ({"FEATURE_STORE_CONNECT_TIMEOUT": "1e20"}, "CONNECT_TIMEOUT must be at most"),
        ({"FEATURE_STORE_MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS must be at least 1"),
        ({"FEATURE_STORE_REDIS_URL": "http://x"}, "scheme must be redis://"),
    ],
)
def test_bad_settings_fail_at_startup_naming_them(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().redis_url = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("url", "clean", "cluster"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", False),
        ("rediss://user:pw@host:6380", "rediss://user:pw@host:6380", False),
        ("unix:///tmp/redis.sock?db=0", "unix:///tmp/redis.sock?db=0", False),
        ("redis://h:1?cluster=true", "redis://h:1", True),
        (
            "redis://h:1?cluster=0&health_check_interval=5",
            "redis://h:1?health_check_interval=5",
            False,
        ),
    ],
)
def test_url_forms(url: str, clean: str, cluster: bool) -> None:
    target = RedisTarget.parse(url)
    assert (target.url, target.cluster) == (clean, cluster)


def test_bad_urls() -> None:
    with pytest.raises(ConfigError, match="cluster='maybe'"):
        RedisTarget.parse("redis://h?cluster=maybe")
    with pytest.raises(ConfigError, match="Redis Cluster needs"):
        RedisTarget.parse("unix:///s.sock?cluster=true")


def test_password_is_redacted_in_messages() -> None:
    assert "secret" not in str(RedisTarget.parse("redis://u:secret@h:1"))
    with pytest.raises(ConfigError) as info:
        RedisTarget.parse("http://u:secret@h:1")
    assert "secret" not in str(info.value)


def test_every_documented_setting_is_accepted_by_every_command() -> None:
    """Each ``FEATURE_STORE_*`` and ``FEATURE_SERVING_*`` name the docs give is a known
    setting, so setting it as documented never stops a command as unknown."""
    import re
    from dataclasses import fields

    from feature_store.serving.config import ServingSettings

    root = Path(__file__).resolve().parents[2]
    docs = [root / "README.md", *(root / "docs").glob("*.md")]
    pattern = r"FEATURE_(STORE|SERVING)_([A-Z0-9_]+)"
    named = {m for d in docs for m in re.findall(pattern, d.read_text())}
    assert ("STORE", "KAFKA_JARS") in named
    known = {
        "STORE": {f.name for f in fields(Settings)},
        "SERVING": {f.name for f in fields(ServingSettings)},
    }
    unknown = sorted(f"FEATURE_{p}_{n}" for p, n in named if n.lower() not in known[p])
    assert unknown == []
    assert Settings.from_env({"FEATURE_STORE_KAFKA_JARS": "/opt/jars"}).kafka_jars == Path(
        "/opt/jars"
    )
