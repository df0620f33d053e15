"""The native round trip's reading of replies from a real Redis, whatever the sizes of the
socket's reads: each lookup's replies end where a whole-buffer scan says, and the bytes are
Redis's own, byte for byte (replies split across reads, values longer than a read, many
lookups in one round trip)."""

from __future__ import annotations

import os
import signal
import socket
import time
from urllib.parse import urlparse

import hiredis
import pytest
import redis
import redis.asyncio

from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.l1 import roundtrip
from feature_store.serving.l1.roundtrip import NativeRoundTrip, resp_scan


def command(*args: bytes) -> bytes:
    return hiredis.pack_command(args)


def lookups(url: str) -> tuple[bytes, list[int]]:
    """Commands of 40 lookups (1 to 5 commands each): hashes of short and long values,
    a missing key, an echo of 200 KB."""
    with redis.Redis.from_url(url) as client:
        for i in range(30):
            client.hset(f"rt:{i}", mapping={f"f{j}": b"v" * (j * 37 * i % 3000) for j in range(9)})
    parts, counts = [], []
    for i in range(40):
        n = 1 + i % 5
        for j in range(n):
            if (i + j) % 11 == 10:
                parts.append(command(b"ECHO", b"x" * 200_000))
            elif (i + j) % 7 == 6:
                parts.append(command(b"HGETALL", b"rt:missing"))
            else:
                parts.append(command(b"HMGET", f"rt:{(i + j) % 30}".encode(), b"f1", b"f8", b"f9"))
        counts.append(n)
    return b"".join(parts), counts


@pytest.mark.parametrize("read_size", [1, 5, 4096, 1 << 16, 1 << 22])
async def test_replies_are_redis_bytes_at_every_read_size(
    redis_url: str, read_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, counts = lookups(redis_url)
    monkeypatch.setattr(roundtrip, "READ_SIZE", read_size)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        protocol = int((await client.execute_command("HELLO"))[b"proto"])  # the client's RESP
        expected = raw_replies(redis_url, protocol, data, sum(counts))
        got, ends = await NativeRoundTrip(client).packed(data, counts, 30.0)
    finally:
        await client.aclose()
    assert got == expected
    pos, want_ends = 0, []  # where each lookup's replies end, by a scan of the whole
    for count in counts:
        pos, found = resp_scan(expected, pos, count)
        assert found == count
        want_ends.append(pos)
    assert ends == want_ends
    assert ends[-1] == len(expected)


def raw_replies(url: str, protocol: int, data: bytes, count: int) -> bytes:
    """Redis's replies to ``data`` over a plain socket in RESP ``protocol``, read until
    ``count`` are whole."""
    parsed = urlparse(url)
    assert parsed.hostname is not None
    assert parsed.port is not None
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall(command(b"HELLO", str(protocol).encode()) + data)
        buf = b""
        while resp_scan(buf, 0, count + 1)[1] < count + 1:
            chunk = sock.recv(1 << 20)
            assert chunk, "Redis closed the connection"
            buf += chunk
    hello, _ = resp_scan(buf, 0, 1)
    return buf[hello:]


async def test_a_round_trip_that_must_connect_ends_at_its_deadline_when_redis_hangs(
    own_redis: EmbeddedRedis,
) -> None:
    """A Redis that accepts connections but does not answer (SIGSTOP, a partition): a round
    trip that has to make its connection ends at its deadline, the connect left to finish
    on its own. It took redis-py's handshake timeout (the socket timeout, 1 s) twice, with
    its retry, which a lookup's 0.3 s budget knew nothing of."""
    target = RedisTarget.parse(own_redis.url)
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        own_redis.url, max_connections=4, timeout=1.0, **target.connection_options()
    )
    client = redis.asyncio.Redis.from_pool(pool)  # no connection made yet
    assert own_redis.process is not None
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await NativeRoundTrip(client).packed(command(b"PING"), [1], 0.2)
        assert time.monotonic() - started < 0.9  # well before one socket timeout
    finally:
        os.kill(own_redis.process.pid, signal.SIGCONT)
        await client.aclose()
