"""One bad key, one bad client or one sick Redis must not take down answers for anyone else.

Each test plants the trouble for real (bad bytes in Redis, a key of the wrong type, a
SIGSTOPped redis-server, a second server on the same port) against `feature-store serve`
processes or the reader itself, and checks that the other keys, requests and servers are
unaffected.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import redis
from scrape import metric

from feature_store import sample
from feature_store.client import FeatureClient
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.errors import (
    EncodingError,
    FeatureStoreError,
    StoreError,
    StorePermissionError,
)
from feature_store.layout import entity_key
from feature_store.native import GroupFormat
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1 import serving_pb2_grpc as pb_grpc
from feature_store.serving.config import ServingSettings
from feature_store.serving.l1.spec import GroupSpec
from feature_store.serving.process import ServingProcess
from feature_store.serving.runtime import ServingRuntime
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
REGISTRY = sample.registry()
FRESHNESS = REGISTRY.groups[GROUP].freshness_field
INT_0 = next(f for f in REGISTRY.groups[GROUP].features if f.name == "int_0")


def key(i: int) -> bytes:
    return entity_key(REGISTRY.entities[ENTITY].prefix, REGISTRY.entities[ENTITY].id_type, i)


def _post(url: str, body: object, timeout: float = 5.0) -> httpx.Response:
    return httpx.post(f"{url}/v1/features/get", json=body, timeout=timeout)


def _get(ids: list[int]) -> dict[str, object]:
    return {"entity_type": ENTITY, "ids": ids, "features": ["int_0"]}


# --- 1. a corrupt freshness timestamp ----------------------------------------------------


@pytest.mark.parametrize("stamp", [b"garbage", b"17e8", b"-5", b"9" * 30])
def test_a_corrupt_write_time_fails_its_key_only(redis_url: str, stamp: bytes) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(80))
    redis.Redis.from_url(redis_url).hset(key(60), mapping={INT_0.field: b"1", FRESHNESS: stamp})
    with ServingProcess(redis_url) as server:
        answer = _post(server.rest_url, _get([60, 71, 72]))
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        assert [r["statuses"] for r in doc["results"]] == [["error"], ["present"], ["present"]]
        (error,) = doc["errors"]
        assert (error["id"], error["reason"]) == (60, "corrupt_write_time")
        assert "c:60" in error["message"]
        for healthy in (71, 72):  # they shared the poisoned round trip: not poisoned
            ok = _post(server.rest_url, _get([healthy]))
            assert ok.status_code == 200, ok.text
            assert ok.json()["results"][0]["statuses"] == ["present"]
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)
            response = stub.GetFeatures(
                pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[60, 71], features=["int_0"]),
                timeout=5,
            )
            assert [list(r.statuses) for r in response.rows] == [[pb.ERROR], [pb.PRESENT]]
            assert [(e.id.int_id, e.reason) for e in response.errors] == [
                (60, "corrupt_write_time")
            ]
            assert "c:60" in response.errors[0].message


async def test_no_load_is_left_unresolved_when_any_step_raises(redis_url: str) -> None:
    """An exception injected at each step of a load: every waiter gets an answer."""
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(10))
    runtime = ServingRuntime(
        REGISTRY, RedisTarget.parse(redis_url), ServingSettings(invalidation=False)
    )
    reader = runtime.reader
    assert reader.cache is not None
    flight = reader.flight
    assert flight is not None

    def boom(*args: object, **kwargs: object) -> object:
        raise RuntimeError("injected")

    async def boom_async(*args: object, **kwargs: object) -> object:
        raise RuntimeError("injected")

    # each step's patches (GroupFormat and GroupSpec are slotted: their classes are
    # patched); a reply's values and write time are decoded by load_packed (the native
    # core), or by load and written_at (FEATURE_STORE_NATIVE=off): all three raise
    steps: dict[str, list[tuple[object, str, Callable[..., object]]]] = {
        "round trip": [(reader, "round_trip", boom_async)],
        "decode": [
            (GroupFormat, "load_packed", boom),
            (GroupFormat, "load", boom),
            (GroupSpec, "written_at", boom),
        ],
        "entry": [(GroupSpec, "entry", boom)],
        "cache put": [(reader.cache, "put_many", boom)],  # a round trip's entries together
        "breaker": [(reader.breaker, "success", boom)],
        "timeouts": [(reader.timeout, "observe", boom)],
    }
    try:
        for n, (step, patches) in enumerate(steps.items()):
            keys = [(GROUP, key(i)) for i in range(n, n + 3)]
            with pytest.MonkeyPatch.context() as patch:
                for target, name, fake in patches:
                    patch.setattr(target, name, fake)
                waiters = [asyncio.ensure_future(reader.get(keys)) for _ in range(3)]
                done, pending = await asyncio.wait(waiters, timeout=5)
                assert not pending, f"a load hung when {step} raised"
                for w in done:  # each step is on the path: its waiters all failed
                    assert isinstance(w.exception(), StoreError | EncodingError), step
            assert not flight.inflight, step
            resolved = await asyncio.wait_for(reader.get(keys), 5)  # the keys are not poisoned
            assert all(r.entry.values is not None for r in resolved), step
    finally:
        await runtime.stop()


# --- 5. a key of the wrong type ----------------------------------------------------------


def test_a_wrong_type_key_fails_alone_and_does_not_trip_the_breaker(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(80))
    redis.Redis.from_url(redis_url).set(key(62), b"not a hash")
    env = {"FEATURE_SERVING_BREAKER_FAILURES": "2", "FEATURE_SERVING_CACHE_NEGATIVE_TTL": "0"}
    with ServingProcess(redis_url, env=env) as server:

        def one(i: int) -> tuple[int, int]:
            ids = [62] if i % 4 == 0 else [63 + i % 10]
            r = _post(server.rest_url, _get(ids))
            return ids[0], r.status_code

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, range(320)))
        assert {status for _, status in answers} == {200}
        text = httpx.get(f"{server.rest_url}/metrics").text
        assert metric(text, "feature_serving_circuit_opened_total") == 0
        assert metric(text, "feature_serving_entity_errors_total") == 80  # every 4th of 320
        body = _post(server.rest_url, _get([62, 63])).json()
        assert [r["statuses"] for r in body["results"]] == [["error"], ["present"]]
        assert body["errors"][0]["reason"] == "wrong_type"
        assert "WRONGTYPE" in body["errors"][0]["message"]


# --- 2. a hung Redis opens the circuit ---------------------------------------------------


def test_a_hung_redis_opens_the_circuit(own_redis: EmbeddedRedis) -> None:
    with FeatureStore.connect(own_redis.url, REGISTRY) as store:
        store.write(GROUP, sample.rows(400))
    assert own_redis.process is not None
    pid = own_redis.process.pid
    env = {
        "FEATURE_SERVING_BREAKER_FAILURES": "3",
        "FEATURE_SERVING_BREAKER_OPEN": "1",
        "FEATURE_SERVING_BREAKER_OPEN_MAX": "1",
        "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "0.3",
        # the socket timeout (the connect handshake's) stays at its default of 1 s, as long
        # as the wait for a free pooled connection: a handshake that hangs must count
    }
    with ServingProcess(own_redis.url, env=env) as server:
        assert _post(server.rest_url, _get([1])).status_code == 200
        os.kill(pid, signal.SIGSTOP)
        try:
            answers = []
            for i in range(8):  # misses: each needs Redis
                r = _post(server.rest_url, _get([100 + i]))
                answers.append((r.status_code, r.json()["error"]["message"]))
            text = httpx.get(f"{server.rest_url}/metrics").text
        finally:
            os.kill(pid, signal.SIGCONT)
        assert {status for status, _ in answers} == {503}
        assert metric(text, "feature_serving_circuit_opened_total") >= 1
        assert any("circuit open" in message for _, message in answers)
        deadline = time.monotonic() + 10
        while _post(server.rest_url, _get([1])).status_code != 200:
            assert time.monotonic() < deadline, "serving did not recover after SIGCONT"
            time.sleep(0.1)


# --- 3. memory through the feature-list cache --------------------------------------------


def test_feature_lists_are_bounded_before_they_are_cached(redis_url: str) -> None:
    with ServingProcess(redis_url, env={"FEATURE_SERVING_MAX_FEATURES": "100"}) as server:
        too_many = _post(server.rest_url, {**_get([1]), "features": ["float_00"] * 101})
        assert too_many.status_code == 413
        assert "101 names is more than the limit of 100" in too_many.text
        repeated = _post(server.rest_url, {**_get([1]), "features": ["float_00"] * 100})
        assert repeated.status_code == 200
        assert repeated.json()["features"] == ["float_00"]  # repeats collapse


def test_the_projection_cache_is_bounded_in_bytes(redis_url: str) -> None:
    runtime = ServingRuntime(REGISTRY, RedisTarget.parse(redis_url), ServingSettings())
    service = runtime.service
    names = [f.name for f in REGISTRY.groups[GROUP].features]
    for n in range(3000):  # distinct lists: every name in a different order
        rotated = names[n % 50 :] + names[: n % 50]
        service.projection(ENTITY, [*rotated, *("consumer_features:" + x for x in names)], ())
        service.projection(ENTITY, rotated[: 1 + n % 49], ())
    assert service._projection_bytes <= 4 * 1024 * 1024
    assert len(service._projections) < 6000


# --- 4. writes that fail may still be applied ---------------------------------------------


def test_a_partial_write_names_its_rows_and_invalidates(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(80))
    redis.Redis.from_url(redis_url).set(key(63), b"not a hash")
    env = {"FEATURE_SERVING_CACHE_TTL": "30"}
    with (
        ServingProcess(redis_url, env=env) as writer,
        ServingProcess(redis_url, env=env) as other,
    ):
        for server in (writer, other):  # both cache the old value of 64
            assert _post(server.rest_url, _get([64])).json()["results"][0]["values"] != [-7]
        body = {
            "group": GROUP,
            "rows": [{"id": 64, "values": {"int_0": -7}}, {"id": 63, "values": {"int_0": -7}}],
        }
        r = httpx.post(f"{writer.rest_url}/v1/features/write", json=body)
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "partial_write"
        assert error["rows_written"] == [64]
        assert [row["id"] for row in error["rows_failed"]] == [63]
        assert "WRONGTYPE" in error["rows_failed"][0]["error"]
        for server in (writer, other):
            _until(
                lambda s=server: (
                    _post(s.rest_url, _get([64])).json()["results"][0]["values"] == [-7]
                ),
                "the written row to be served everywhere",
            )


def test_a_write_that_timed_out_is_invalidated_once_redis_is_back(
    own_redis: EmbeddedRedis,
) -> None:
    with FeatureStore.connect(own_redis.url, REGISTRY) as store:
        store.write(GROUP, sample.rows(10))
    assert own_redis.process is not None
    pid = own_redis.process.pid
    env = {"FEATURE_SERVING_CACHE_TTL": "30", "FEATURE_STORE_SOCKET_TIMEOUT": "0.3"}
    with ServingProcess(own_redis.url, env=env) as server, FeatureClient(server.rest_url) as c:
        assert c.get(ENTITY, [5], features=["int_0"]).rows[0].values != [-9]
        os.kill(pid, signal.SIGSTOP)
        try:
            body = {"group": GROUP, "rows": [{"id": 5, "values": {"int_0": -9}}]}
            r = httpx.post(f"{server.rest_url}/v1/features/write", json=body, timeout=10)
            assert r.status_code == 503
            assert "may have been applied" in r.json()["error"]["message"]
        finally:
            os.kill(pid, signal.SIGCONT)
        # Redis applies the write it had received; the cache must not hide it for its TTL
        _until(
            lambda: c.get(ENTITY, [5], features=["int_0"]).rows[0].values == [-9],
            "the applied write to be served",
        )


def _until(check: Callable[[], bool], what: str, seconds: float = 8.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.05)


# --- 6. a second server on the same gRPC port -------------------------------------------


def test_a_second_server_refuses_a_grpc_port_in_use(redis_url: str, tmp_path: Path) -> None:
    with ServingProcess(redis_url) as first:
        second = ServingProcess(redis_url, log_path=tmp_path / "second.log")
        second.grpc_port = first.grpc_port
        with pytest.raises(FeatureStoreError, match="is in use"):
            second.start()
        second.stop()
        assert _post(first.rest_url, _get([1])).status_code == 200


# --- 9. gRPC error codes -----------------------------------------------------------------


def test_grpc_bad_requests_are_invalid_argument_with_short_details(redis_url: str) -> None:
    with (
        ServingProcess(redis_url) as server,
        grpc.insecure_channel(server.grpc_target) as channel,
    ):
        stub = pb_grpc.FeatureServiceStub(channel)
        for count in (2000, 900):  # over the feature limit; within it, all unknown
            names = [f"no_such_feature_{i:04d}" for i in range(count)]
            with pytest.raises(grpc.RpcError) as raised:
                stub.GetFeatures(
                    pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[1], features=names),
                    timeout=5,
                )
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, count
            assert len(raised.value.details() or "") < 4096
        assert "and 890 more" in (raised.value.details() or "")
        raw = channel.unary_unary(
            "/feature_store.v1.FeatureService/GetFeatures",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as raised:
            raw(b"\xff\xff\xff\xff", timeout=5)  # not a protobuf message
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a feature_store.v1.GetFeaturesRequest" in (raised.value.details() or "")


# --- 10. messages that say what is wrong -------------------------------------------------


def test_an_acl_user_without_permissions_gets_a_clear_error(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(5))
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command(
        "ACL", "SETUSER", "reader", "on", ">reader-password", "~*", "&*", "+@read", "+@connection"
    )
    limited = redis_url.replace("redis://", "redis://reader:reader-password@")
    try:
        with FeatureStore.connect(limited, REGISTRY) as store:
            with pytest.raises(StorePermissionError, match="ACL"):
                store.check_server()  # CONFIG GET is not +@read
            assert store.read(ENTITY, [1], features=["int_0"]).rows[0].values != [None]
        with ServingProcess(limited) as server:
            assert _post(server.rest_url, _get([1])).status_code == 200
            body = {"group": GROUP, "rows": [{"id": 1, "values": {"int_0": 5}}]}
            r = httpx.post(f"{server.rest_url}/v1/features/write", json=body)
            assert r.status_code == 500, r.text  # not a 503 that invites retries
            assert r.json()["error"]["code"] == "redis_permission_denied"
    finally:
        admin.execute_command("ACL", "DELUSER", "reader")
        admin.close()


def test_tls_to_a_plain_redis_says_so(redis_url: str) -> None:
    url = redis_url.replace("redis://", "rediss://") + "?ssl_cert_reqs=none"
    target = RedisTarget.parse(url, connect_timeout=1.0, socket_timeout=1.0)
    with FeatureStore.connect(target, REGISTRY) as store, pytest.raises(StoreError) as raised:
        store.ping()
    assert "TLS mismatch" in str(raised.value)


# --- 11. cross-site writes, unauthenticated bodies, slow clients ---------------------------


def _raw_http(port: int, data: bytes, wait: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        try:
            return s.recv(65536)
        except TimeoutError:
            return b"(no answer)"


def test_a_text_plain_write_is_refused_and_writes_nothing(redis_url: str) -> None:
    with ServingProcess(redis_url) as server:
        body = orjson.dumps({"group": GROUP, "rows": [{"id": 5, "values": {"int_0": 1}}]})
        r = httpx.post(
            f"{server.rest_url}/v1/features/write",
            content=body,
            headers={"content-type": "text/plain"},
        )
        assert r.status_code == 415
        assert r.json()["error"]["code"] == "unsupported_media_type"
    assert redis.Redis.from_url(redis_url).exists(key(5)) == 0


def test_the_key_is_checked_before_the_body_is_read(redis_url: str) -> None:
    env = {"FEATURE_SERVING_READ_KEYS": "read-key-123", "FEATURE_SERVING_ADMIN_KEYS": "admin-key-1"}
    with ServingProcess(redis_url, env=env) as server:
        head = (
            b"POST /v1/features/write HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n"
        )
        answer = _raw_http(server.port, head)  # the body never comes
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        reader = head.replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer read-key-123\r\n\r\n")
        assert _raw_http(server.port, reader).startswith(b"HTTP/1.1 403")


def test_slow_clients_are_cut_off(redis_url: str) -> None:
    env = {
        "FEATURE_SERVING_REQUEST_HEADER_TIMEOUT": "0.5",
        "FEATURE_SERVING_REQUEST_BODY_TIMEOUT": "0.5",
    }
    with ServingProcess(redis_url, env=env) as server:
        slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
        try:
            for s in slow:
                s.sendall(b"POST /v1/features/get HTTP/1.1\r\nHost: x\r\n")  # and no more
            for s in slow:
                s.settimeout(5)
                assert s.recv(100) == b""  # closed by the server
        finally:
            for s in slow:
                s.close()
        head = (
            b"POST /v1/features/get HTTP/1.1\r\nHost: x\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"entity'
        )
        answer = _raw_http(server.port, head)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert _post(server.rest_url, _get([1])).status_code == 200  # others still served
