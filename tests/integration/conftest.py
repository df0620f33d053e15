"""Fixtures of the integration tests beyond the session's servers (tests/conftest.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feature_store.embedded import EmbeddedRedis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A redis-server of the test's own (AOF on), for tests that kill, stop or reconfigure it."""
    with EmbeddedRedis(tmp_path / "redis") as server:
        yield server


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}"),
        cwd=d,
    )


def make_cert(d: Path, name: str, ca: str, san: str) -> None:
    openssl(
        *("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key"),
        *("-out", f"{name}.csr", "-subj", f"/CN={name}"),
        cwd=d,
    )
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key"),
        *("-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext"),
        cwd=d,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA and another, a server certificate for 127.0.0.1 and localhost, a client
    certificate the CA signed and a stranger's the other CA signed (openssl, at run time)."""
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    make_cert(d, "client", "ca", "DNS:model-server")
    make_cert(d, "stranger", "other-ca", "DNS:stranger")
    return d


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """Spark local[2] for one test module: UTC, no UI, two shuffle partitions."""
    from feature_store.ingest.job import spark_session

    session = spark_session(
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.session.timeZone": "UTC",
        },
        app_name="feature-store-tests",
    )
    yield session
    session.stop()
