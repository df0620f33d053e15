"""Each ``FEATURE_STORE_*`` connection setting reaches the connections a user's program opens.

README documents ``FEATURE_STORE_REDIS_RETRIES``, ``…_SOCKET_TIMEOUT``, ``…_CONNECT_TIMEOUT``
and ``…_MAX_CONNECTIONS`` for every command and the library. Each test here observes the
setting's effect, through ``feature-store get`` (a real process) and through the library
(``FeatureStore.connect`` with a URL), against loopback listeners that misbehave as a
failing Redis does: one closes every connection, one never answers, one never accepts.
Timings are only bounded from below: a timeout of 2 s must have waited 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from feature_store import AsyncFeatureStore, FeatureStore, sample
from feature_store.errors import StoreError, StoreTimeoutError, StoreUnavailableError

FEATURE_STORE = str(Path(sys.executable).parent / "feature-store")
GET = ["get", "consumer", "1", "--registry", "sample", "-g", sample.GROUP]


class Listener:
    """A loopback TCP listener that counts connections and closes or holds each one."""

    def __init__(self, *, hold: bool) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted = 0
        self.held: list[socket.socket] = []
        self.hold = hold
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            if self.hold:
                self.held.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def closing() -> Iterator[Listener]:
    listener = Listener(hold=False)
    yield listener
    listener.close()


@pytest.fixture
def silent() -> Iterator[Listener]:
    listener = Listener(hold=True)
    yield listener
    listener.close()


@pytest.fixture
def full_backlog() -> Iterator[str]:
    """A port whose accept queue is full: a connect's SYN is dropped, the connect hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield f"redis://127.0.0.1:{port}"
    for s in (*fillers, server):
        s.close()


def get(url: str, **settings: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATURE_")}
    env["FEATURE_STORE_REDIS_URL"] = url
    env.update({f"FEATURE_STORE_{k.upper()}": v for k, v in settings.items()})
    started = time.monotonic()
    run = subprocess.run(
        [FEATURE_STORE, *GET], env=env, capture_output=True, text=True, timeout=120
    )
    return run, time.monotonic() - started


def test_redis_retries_reach_the_get_command(closing: Listener) -> None:
    run, _ = get(closing.url, redis_retries="0")
    assert run.returncode == 2
    assert "Redis is unavailable" in run.stderr
    once = closing.accepted
    assert once >= 1
    run, _ = get(closing.url, redis_retries="3")
    assert run.returncode == 2
    assert closing.accepted - once == 4 * once  # each attempt, then three retries


def test_redis_retries_reach_the_library(
    closing: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = []
    for retries in ("0", "2"):
        monkeypatch.setenv("FEATURE_STORE_REDIS_RETRIES", retries)
        before = closing.accepted
        with (
            FeatureStore.connect(closing.url, sample.registry()) as store,
            pytest.raises(StoreUnavailableError),
        ):
            store.read(sample.ENTITY, [1], groups=[sample.GROUP])
        counts.append(closing.accepted - before)
    assert counts[1] == 3 * counts[0]


def test_socket_timeout_reaches_the_get_command(silent: Listener) -> None:
    run, elapsed = get(silent.url, redis_retries="0", socket_timeout="2.5")
    assert run.returncode == 2
    assert "did not answer in time" in run.stderr
    assert elapsed >= 2.5  # the default (1 s) would have given up before


def test_socket_timeout_reaches_the_library(
    silent: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEATURE_STORE_REDIS_RETRIES", "0")
    monkeypatch.setenv("FEATURE_STORE_SOCKET_TIMEOUT", "2.5")
    started = time.monotonic()
    with (
        FeatureStore.connect(silent.url, sample.registry()) as store,
        pytest.raises(StoreTimeoutError),
    ):
        store.read(sample.ENTITY, [1], groups=[sample.GROUP])
    assert time.monotonic() - started >= 2.5


def test_connect_timeout_reaches_the_get_command(full_backlog: str) -> None:
    run, elapsed = get(full_backlog, redis_retries="0", connect_timeout="2.5")
    assert run.returncode == 2
    assert "Timeout connecting" in run.stderr
    assert elapsed >= 2.5


def test_max_connections_bounds_the_library_pool(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 reads at once on an asyncio store: with 2 connections allowed, redis-py's pool
    refuses the third; with the default 64, all are answered."""

    async def reads() -> list[object]:
        async with AsyncFeatureStore.connect(redis_url, sample.registry()) as store:
            return await asyncio.gather(
                *(store.read(sample.ENTITY, [i], groups=[sample.GROUP]) for i in range(20)),
                return_exceptions=True,
            )

    answers = asyncio.run(reads())
    assert not [a for a in answers if isinstance(a, BaseException)]
    monkeypatch.setenv("FEATURE_STORE_MAX_CONNECTIONS", "2")
    answers = asyncio.run(reads())
    refused = [a for a in answers if isinstance(a, BaseException)]
    assert refused
    assert all(isinstance(a, StoreError) for a in refused)
