"""Every Redis URL form against a real server, and Redis errors in the project's terms."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from feature_store import sample
from feature_store.embedded import EmbeddedRedis, free_port
from feature_store.errors import StoreError, StoreUnavailableError
from feature_store.registry import Registry
from feature_store.store import AsyncFeatureStore, FeatureStore


def round_trip(url: str, registry: Registry) -> list[object]:
    with FeatureStore.connect(url, registry) as store:
        store.write(sample.GROUP, [(1, {"int_0": 42})])
        return store.read(sample.ENTITY, [1], ["int_0"]).rows[0].values


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A server of this test's own, for settings the shared one must not get."""
    with EmbeddedRedis(tmp_path / "redis", persistence=False) as server:
        yield server


def test_unix_socket(tmp_path: Path, sample_registry: Registry) -> None:
    sock = tmp_path / "r.sock"
    with EmbeddedRedis(tmp_path / "redis", extra_config={"unixsocket": str(sock)}):
        assert round_trip(f"unix://{sock}", sample_registry) == [42]


def test_password_and_acl_user(private_redis: EmbeddedRedis, sample_registry: Registry) -> None:
    admin = redis.Redis(port=private_redis.port or 0)
    admin.acl_setuser(
        "features", enabled=True, passwords=["+s3cret"], keys=["c:*"], commands=["+@all"]
    )
    admin.config_set("requirepass", "adminpw")
    port = private_redis.port
    assert round_trip(f"redis://features:s3cret@127.0.0.1:{port}", sample_registry) == [42]
    assert round_trip(f"redis://:adminpw@127.0.0.1:{port}", sample_registry) == [42]
    with pytest.raises(StoreError, match="refused the credentials"):
        round_trip(f"redis://features:wrong@127.0.0.1:{port}", sample_registry)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make certs")
def test_tls(tmp_path: Path, sample_registry: Registry) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    tls_port = free_port()
    tls = {
        "tls-port": str(tls_port),
        "tls-cert-file": str(cert),
        "tls-key-file": str(key),
        "tls-ca-cert-file": str(cert),
        "tls-auth-clients": "no",
    }
    with EmbeddedRedis(tmp_path / "redis", persistence=False, extra_config=tls):
        url = f"rediss://127.0.0.1:{tls_port}?ssl_ca_certs={cert}"
        assert round_trip(url, sample_registry) == [42]


def test_closed_port_is_unavailable(sample_registry: Registry) -> None:
    with pytest.raises(StoreUnavailableError, match="Redis is unavailable"):
        round_trip(f"redis://127.0.0.1:{free_port()}", sample_registry)


def aof_written(url: str, within: float = 10.0) -> None:
    """Wait until Redis has written its AOF buffer to the file. With appendfsync everysec,
    Redis holds the buffer back (up to 2 s) while a background fsync is slow, and a kill -9
    then loses those writes: a fresh run under load lost the last entity's that way."""
    deadline = time.monotonic() + within
    with redis.Redis.from_url(url) as client:
        while True:
            info = client.info("persistence")
            if info["aof_buffer_length"] == 0 and not info["aof_pending_bio_fsync"]:
                return
            assert time.monotonic() < deadline, f"the AOF was not written within {within} s"
            time.sleep(0.02)


def test_server_death_is_unavailable_then_recovers(
    tmp_path: Path, sample_registry: Registry
) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        with FeatureStore.connect(server.url, sample_registry) as store:
            store.write(sample.GROUP, sample.rows(5))
            aof_written(server.url)  # what a kill -9 keeps (everysec may hold the buffer)
            server.kill()
            with pytest.raises(StoreUnavailableError):
                store.read(sample.ENTITY, [1], ["int_0"])
            server.restart()  # same port, same data directory
            rows = store.read(sample.ENTITY, [0, 1, 4], ["int_0"]).rows
        assert [r.values[0] for r in rows] == [sample.features(i)["int_0"] for i in (0, 1, 4)]
    finally:
        server.stop()


async def test_async_errors_are_translated(sample_registry: Registry) -> None:
    store = AsyncFeatureStore.connect(f"redis://127.0.0.1:{free_port()}", sample_registry)
    async with store:
        with pytest.raises(StoreUnavailableError):
            await store.read(sample.ENTITY, [1], ["int_0"])


def test_embedded_data_survives_a_restart(tmp_path: Path, sample_registry: Registry) -> None:
    """AOF is on: what one run writes, the next run reads."""
    with EmbeddedRedis(tmp_path / "data") as first:
        round_trip(first.url, sample_registry)
    with (
        EmbeddedRedis(tmp_path / "data") as second,
        FeatureStore.connect(second.url, sample_registry) as store,
    ):
        assert store.read(sample.ENTITY, [1], ["int_0"]).rows[0].values == [42]
    assert (tmp_path / "data" / "appendonlydir").is_dir()


def test_second_embedded_attaches_to_the_running_one(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "data") as owner:
        other = EmbeddedRedis(tmp_path / "data")
        assert other.start() == owner.url
        other.stop()  # not the owner: leaves the server running
        assert redis.Redis(port=owner.port or 0).ping()


def test_missing_binary_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from feature_store.errors import EmbeddedRedisError

    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no redis-server on it
    with pytest.raises(EmbeddedRedisError, match="apt-get install -y redis-server"):
        EmbeddedRedis(tmp_path / "data").start()


def test_bad_config_reports_the_server_log(tmp_path: Path) -> None:
    from feature_store.errors import EmbeddedRedisError

    with pytest.raises(EmbeddedRedisError, match="redis-server exited at start"):
        EmbeddedRedis(tmp_path / "data", extra_config={"maxmemory-policy": "nonsense"}).start()
