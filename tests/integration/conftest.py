"""Fixtures of the integration tests beyond the session's servers (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from feature_store.embedded import EmbeddedRedis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A redis-server of the test's own (AOF on), for tests that kill, stop or reconfigure it."""
    with EmbeddedRedis(tmp_path / "redis") as server:
        yield server
