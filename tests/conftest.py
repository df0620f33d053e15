"""Fixtures: real redis-server processes on free loopback ports, started once per session.

Tests get a flushed server (``redis_url``) or a flushed 3-master cluster (``cluster_url``).
Nothing here is faked: a test that needs Redis talks to a redis-server.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.cluster

from feature_store import sample
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.registry import Registry


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: EmbeddedCluster) -> str:
    for node in redis_cluster.nodes:
        with redis.Redis.from_url(node.url) as client:
            client.flushall()
    return redis_cluster.url


@pytest.fixture(scope="session")
def grpcurl() -> str:
    """grpcurl, as scripts/setup.sh installs it (into .venv/bin when not on PATH)."""
    found = shutil.which("grpcurl") or shutil.which(
        "grpcurl", path=str(Path(sys.executable).parent)
    )
    assert found is not None, "grpcurl is not installed: run ./scripts/setup.sh"
    return found


@pytest.fixture(scope="session")
def sample_registry() -> Registry:
    return sample.registry()


@pytest.fixture
def registry_file(tmp_path: Path) -> Path:
    path = tmp_path / "features.yaml"
    path.write_text(sample.registry_text())
    return path
