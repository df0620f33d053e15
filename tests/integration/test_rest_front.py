"""The native REST front (native/src/front/rest.rs) against real clients: the same answers as
uvicorn alone for every kind of request (the fast routes' answers and refusals, the routes
passed through to uvicorn, auth), HTTP/1.1 pipelining and chunked bodies, a thousand
connections at once all answered, and several workers on one port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from feature_store import sample
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
KEYS = {"FEATURE_SERVING_READ_KEYS": "reader-key-1", "FEATURE_SERVING_ADMIN_KEYS": "admin-key-1"}
ENV = {
    "FEATURE_SERVING_SHADOW_FRACTION": "0",
    "FEATURE_SERVING_WARM_START_KEYS": "0",
    "FEATURE_SERVING_MAX_BODY_BYTES": "4096",
    **KEYS,
}
READER = {"authorization": "Bearer reader-key-1"}
ADMIN = {"authorization": "Bearer admin-key-1"}
JSON = {"content-type": "application/json"}
AGES = re.compile(rb'"ages":\{[^}]*\}')
N = 100


@pytest.fixture(scope="module")
def fronts(redis_server: object) -> Iterator[tuple[ServingProcess, ServingProcess]]:
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    with (
        ServingProcess(url, env={**ENV, "FEATURE_SERVING_REST_FRONT": "native"}) as native,
        ServingProcess(url, env={**ENV, "FEATURE_SERVING_REST_FRONT": "uvicorn"}) as plain,
    ):
        yield native, plain


def get_body(ids: list[int], **more: object) -> bytes:
    return orjson.dumps({"entity_type": ENTITY, "ids": ids, "groups": [GROUP], **more})


# (method, path, headers, body): every kind of request a client sends to the REST port
REQUESTS: list[tuple[str, str, dict[str, str], bytes]] = [
    ("POST", "/v1/features/get", {**READER, **JSON}, get_body([1, 2, 3])),
    ("POST", "/v1/features/get?x=1", {**READER, **JSON}, get_body([4, 999_999])),
    ("POST", "/v1/features/get", {**READER, **JSON}, b'{"entity_type":'),
    ("POST", "/v1/features/get", {**READER, **JSON}, b"[1]"),
    ("POST", "/v1/features/get", {**READER, **JSON}, get_body([1], features=["nope"])),
    ("POST", "/v1/features/get", {**READER, **JSON}, get_body([1], bypass_cache=True)),
    ("POST", "/v1/features/get", {**ADMIN, **JSON}, get_body([1], bypass_cache=True)),
    ("POST", "/v1/features/get", JSON, get_body([1])),
    ("POST", "/v1/features/get", {"authorization": "Bearer wrong", **JSON}, get_body([1])),
    ("POST", "/v1/features/get", {"authorization": "Basic reader-key-1", **JSON}, get_body([1])),
    ("POST", "/v1/features/get", {**READER, "content-type": "text/plain"}, get_body([1])),
    ("POST", "/v1/features/get", {**READER, "content-type": "Application/JSON; x=1"}, b"{}"),
    ("POST", "/v1/features/get", {**READER, **JSON}, b" " * 5000),
    ("POST", "/v1/features/write", {**READER, **JSON}, b"{}"),
    ("POST", "/v1/features/write", {**ADMIN, **JSON}, b'{"group":"nope","rows":[]}'),
    ("GET", "/v1/features/get", READER, b""),
    ("PUT", "/v1/features/write", ADMIN, b"{}"),
    ("GET", "/v1/registry", READER, b""),
    ("GET", "/v1/registry", {}, b""),
    ("GET", "/healthz", {}, b""),
    ("GET", "/readyz", {}, b""),
    ("GET", "/nowhere", {}, b""),
    ("GET", "/openapi.json", {}, b""),
    ("POST", "/get-online-features", {**READER, **JSON}, b'{"features":["x:y"]}'),
    ("POST", "/get-online-features", {**READER, "content-type": "text/plain"}, b"{}"),
    ("GET", "/health", {}, b""),
]
HEADERS = ("content-type", "www-authenticate", "allow", "retry-after")


@pytest.mark.parametrize(("method", "path", "headers", "body"), REQUESTS)
def test_the_native_front_answers_as_uvicorn_does(
    fronts: tuple[ServingProcess, ServingProcess],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
) -> None:
    answers = []
    for server in fronts:
        r = httpx.request(method, server.rest_url + path, headers=headers, content=body)
        answers.append(
            (
                r.status_code,
                {h: r.headers.get(h) for h in HEADERS},
                AGES.sub(b"", r.content),
            )
        )
    assert answers[0] == answers[1]
    assert answers[0][0] != 500


def _read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """``count`` HTTP/1.1 answers with Content-Length bodies, in the order they come."""
    data = b""
    out: list[tuple[int, bytes]] = []
    while len(out) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1")
            length = int(re.search(r"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
            if len(data) >= head_end + 4 + length:
                out.append((int(head.split()[1]), data[head_end + 4 : head_end + 4 + length]))
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(out)} answers"
        data += chunk
    return out


def _post(path: str, body: bytes, headers: dict[str, str] = READER) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_pipelined_requests_are_answered_in_order(
    fronts: tuple[ServingProcess, ServingProcess],
) -> None:
    native = fronts[0]
    batch = [
        _post("/v1/features/get", get_body([7])),
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",  # passed through, between two fast ones
        _post("/v1/features/get", get_body([8, 9])),
        _post("/v1/features/get", b"{nope"),
    ]
    with socket.create_connection(("127.0.0.1", native.port), timeout=10) as sock:
        sock.sendall(b"".join(batch))  # all at once: the answers must keep their order
        answers = _read_answers(sock, len(batch))
    assert [status for status, _ in answers] == [200, 200, 200, 400]
    assert [r["id"] for r in orjson.loads(answers[0][1])["results"]] == [7]
    assert orjson.loads(answers[1][1]) == {"status": "ok"}
    assert [r["id"] for r in orjson.loads(answers[2][1])["results"]] == [8, 9]
    assert orjson.loads(answers[3][1])["error"]["code"] == "malformed_body"


def test_chunked_bodies_are_read_and_limited(
    fronts: tuple[ServingProcess, ServingProcess],
) -> None:
    native = fronts[0]

    def chunks(body: bytes) -> Iterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    url = native.rest_url + "/v1/features/get"
    r = httpx.post(url, headers={**READER, **JSON}, content=chunks(get_body([3, 4])))
    assert r.status_code == 200, r.text
    assert [row["id"] for row in r.json()["results"]] == [3, 4]
    big = get_body([3], features=["int_0"] * 1000)  # past the 4,096-byte limit
    r = httpx.post(url, headers={**READER, **JSON}, content=chunks(big))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "batch_too_large"


async def _one_request_each(port: int, connections: int) -> list[tuple[int, list[int]]]:
    async def one(i: int) -> tuple[int, list[int]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            ids = [i % N, (i * 7) % N]
            writer.write(_post("/v1/features/get", get_body(ids)))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
            body = orjson.loads(await reader.readexactly(length))
            at = body["features"].index("int_0")
            values = [row["values"][at] for row in body["results"]]
            assert values == [sample.features(n)["int_0"] for n in ids]
            return int(head.split()[1]), [row["id"] for row in body["results"]]
        finally:
            writer.close()

    opened: list[asyncio.Task[tuple[int, list[int]]]] = []
    for i in range(connections):
        opened.append(asyncio.ensure_future(one(i)))
        if i % 100 == 99:
            await asyncio.sleep(0)  # let the accept queue drain a little
    return await asyncio.wait_for(asyncio.gather(*opened), 120)


def test_a_thousand_connections_at_once_are_all_answered(
    fronts: tuple[ServingProcess, ServingProcess],
) -> None:
    answers = asyncio.run(_one_request_each(fronts[0].port, 1000))
    assert len(answers) == 1000
    assert all(status == 200 for status, _ in answers)
    assert [ids for _, ids in answers] == [[i % N, (i * 7) % N] for i in range(1000)]


def _fronts_of(pid: int) -> list[int]:
    """The processes under ``pid`` (uvicorn's supervisor) that run a REST front thread."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [
        int(c)
        for c in children
        if any(
            (t / "comm").read_text().strip() == "rest-front"
            for t in Path(f"/proc/{c}/task").iterdir()
        )
    ]


def _established_to(port: int, pid: int) -> int:
    """How many of ``pid``'s sockets are established connections on local ``port``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            inodes.add(fields[9])
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:[") and target[8:-1] in inodes:
                count += 1
    return count


def test_two_workers_share_the_port(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(20))
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    with ServingProcess(redis_url, args=["--workers", "2"], env=env) as server:
        assert server.process is not None
        clients = [httpx.Client() for _ in range(40)]
        try:
            for i, client in enumerate(clients):  # 40 connections held open
                r = client.post(
                    server.rest_url + "/v1/features/get", content=get_body([i % 20]), headers=JSON
                )
                assert r.status_code == 200
                assert r.json()["results"][0]["id"] == i % 20
            workers = _fronts_of(server.process.pid)
            assert len(workers) == 2
            held = [_established_to(server.port, pid) for pid in workers]
            # SO_REUSEPORT spreads connections over both workers' fronts
            assert sum(held) == 40, held
            assert min(held) > 0, held
        finally:
            for client in clients:
                client.close()
        r = httpx.get(server.rest_url + "/metrics")  # passed through to a worker's uvicorn
        assert r.status_code == 200
        assert 'feature_serving_entities_served_total{api="rest"} 40.0' in r.text
