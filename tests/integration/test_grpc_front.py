"""The native gRPC front (native/src/front/grpc.rs) against real peers: grpcio clients for every
method (GetFeatures answered by the front, the others passed through to grpc.aio), nghttp
for what grpcio never sends, several workers on one port, and a stop with calls in flight.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from feature_store import sample
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.serving.api.grpc_server import FeatureServicer
from feature_store.serving.config import ServingSettings
from feature_store.serving.fronts.grpc import start_grpc_server
from feature_store.serving.process import ServingProcess
from feature_store.serving.runtime import ServingRuntime
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
METHOD = "/feature_store.v1.FeatureService/GetFeatures"
NO_SHADOW = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
N = 200


@pytest.fixture(scope="module")
def server(redis_server: EmbeddedRedis) -> Iterator[ServingProcess]:
    with ServingProcess(redis_server.url, args=["--cache-ttl", "3600"], env=NO_SHADOW) as s:
        yield s


@pytest.fixture
def data(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))


def request(ids: list[int], features: tuple[str, ...] = ("int_0",)) -> pb.GetFeaturesRequest:
    return pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, features=features)


async def many_calls(target: str, calls: int, channels: int) -> list[object]:
    """``calls`` concurrent GetFeatures over ``channels`` connections, each for its own ids;
    the answers (or the errors) in order."""
    opened = [grpc.aio.insecure_channel(target) for _ in range(channels)]
    try:
        stubs = [FeatureServiceStub(c) for c in opened]  # type: ignore[no-untyped-call]
        return await asyncio.gather(
            *(
                stubs[i % channels].GetFeatures(request([i % N, (i * 7) % N]), timeout=10)
                for i in range(calls)
            ),
            return_exceptions=True,
        )
    finally:
        for c in opened:
            await c.close()


def check_answer(i: int, answer: object) -> None:
    assert isinstance(answer, pb.GetFeaturesResponse), answer
    ids = [r.id.int_id for r in answer.rows]
    assert ids == [i % N, (i * 7) % N]
    values = [r.values[0].int_value for r in answer.rows]
    assert values == [sample.features(n)["int_0"] for n in ids]


@pytest.mark.usefixtures("data")
async def test_concurrent_calls_each_get_their_own_answer(server: ServingProcess) -> None:
    # streams multiplexed on a few connections, answered out of order by the loop: each
    # call must get the answer to its own ids
    answers = await many_calls(server.grpc_target, 600, 3)
    for i, answer in enumerate(answers):
        check_answer(i, answer)


def test_streaming_methods_pass_through(server: ServingProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        updates = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        first = next(updates)  # a server-streaming method, through the front
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        updates.cancel()
        with pytest.raises(grpc.RpcError) as e:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND  # grpc.aio's answer, passed back


def nghttp(url: str, tmp: Path, body: bytes, *headers: str) -> tuple[str | None, str | None]:
    """POST ``body`` with nghttp: the answer's HTTP status and grpc-status."""
    data = tmp / "body.bin"
    data.write_bytes(body)
    out = subprocess.run(
        ["nghttp", "-v", "-n", "-d", str(data), *(a for h in headers for a in ("-H", h)), url],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    status = re.search(r"recv \(stream_id=\d+\) :status: (\d+)", out)
    code = re.search(r"recv \(stream_id=\d+\) grpc-status: (\d+)", out)
    return (status and status.group(1)), (code and code.group(1))


@pytest.mark.usefixtures("data")
def test_what_grpcio_never_sends_gets_a_clear_answer(
    server: ServingProcess, tmp_path: Path
) -> None:
    url = f"http://{server.grpc_target}{METHOD}"
    message = request([1]).SerializeToString()
    frame = b"\x00" + len(message).to_bytes(4, "big") + message
    grpc_headers = ("content-type: application/grpc", "te: trailers")
    assert nghttp(url, tmp_path, frame, *grpc_headers) == ("200", "0")
    # not gRPC at all: HTTP's own refusal
    assert nghttp(url, tmp_path, frame, "content-type: application/json")[0] == "415"
    # a compressed message: UNIMPLEMENTED (this server asks for no compression)
    assert nghttp(url, tmp_path, b"\x01" + frame[1:], *grpc_headers) == ("200", "12")
    # a frame cut short, or two messages in a unary call: INTERNAL, as grpc's servers answer
    assert nghttp(url, tmp_path, frame[:-3], *grpc_headers) == ("200", "13")
    assert nghttp(url, tmp_path, frame + frame, *grpc_headers) == ("200", "13")
    # bytes that are no GetFeaturesRequest: INVALID_ARGUMENT, from the same code as grpc.aio's
    garbage = b"\xff\xff\xff"
    assert nghttp(url, tmp_path, b"\x00\x00\x00\x00\x03" + garbage, *grpc_headers) == ("200", "3")


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_an_oversized_request_is_resource_exhausted_on_both_fronts(
    redis_url: str, front: str
) -> None:
    env = {**NO_SHADOW, "FEATURE_SERVING_GRPC_FRONT": front}
    env["FEATURE_SERVING_MAX_BODY_BYTES"] = "4096"
    with (
        ServingProcess(redis_url, env=env) as server,
        grpc.insecure_channel(server.grpc_target) as channel,
    ):
        stub = FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
        big = pb.GetFeaturesRequest(entity_type=ENTITY, string_ids=["x" * 100] * 50)
        with pytest.raises(grpc.RpcError) as e:
            stub.GetFeatures(big, timeout=5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = stub.GetFeatures(request([1]), timeout=5)  # the connection still serves
        assert len(small.rows) == 1


@pytest.mark.usefixtures("data")
def test_workers_share_the_grpc_port(redis_url: str) -> None:
    with ServingProcess(redis_url, args=["--workers", "2"], env=NO_SHADOW) as server:
        for i in range(40):  # a new connection each: SO_REUSEPORT spreads them
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
                check_answer(i, stub.GetFeatures(request([i % N, (i * 7) % N]), timeout=10))
                registry = stub.GetRegistry(pb.GetRegistryRequest(), timeout=10)
                assert [e.name for e in registry.entities] == [ENTITY]


@pytest.mark.usefixtures("data")
@pytest.mark.parametrize("front", ["native", "grpcio"])
async def test_stop_finishes_calls_in_flight(redis_url: str, front: str) -> None:
    settings = ServingSettings(
        shadow_fraction=0.0, warm_start_keys=0, cache=False, grpc_front=front
    )
    runtime = ServingRuntime(sample.registry(), RedisTarget.parse(redis_url), settings)
    server = await start_grpc_server(runtime, "127.0.0.1", 0)
    try:
        assert (server.front is not None) == (front == "native")
        calls = asyncio.ensure_future(many_calls(f"127.0.0.1:{server.port}", 2000, 4))
        await asyncio.sleep(0.05)  # some answered, some in flight, some not sent yet
        stopping = asyncio.ensure_future(server.stop(grace=5.0))
        await asyncio.wait({stopping}, timeout=20)  # a bound, not a timing: a hang fails
        assert stopping.done(), "stop() hangs"
        stopping.result()
        answers = await asyncio.wait_for(calls, 20)
    finally:
        await runtime.stop()
    refusals = {grpc.StatusCode.UNAVAILABLE}
    if front == "grpcio":
        refusals.add(grpc.StatusCode.CANCELLED)
    done = 0
    for i, answer in enumerate(answers):
        if isinstance(answer, grpc.aio.AioRpcError):
            # refused once the server stopped: never a wrong answer, never a hang (grpc.aio
            # also cancels some calls it had accepted; the native front finishes them)
            assert answer.code() in refusals, answer
        else:
            check_answer(i, answer)
            done += 1
    assert done > 0


@pytest.mark.usefixtures("data")
async def test_passed_through_calls_reconnect_to_a_new_grpc_aio_server(redis_url: str) -> None:
    settings = ServingSettings(shadow_fraction=0.0, warm_start_keys=0)
    runtime = ServingRuntime(sample.registry(), RedisTarget.parse(redis_url), settings)
    server = await start_grpc_server(runtime, "127.0.0.1", 0)
    replacement = grpc.aio.server()
    try:
        assert server.front is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
            first = await stub.GetRegistry(pb.GetRegistryRequest(), timeout=5)
            # grpc.aio goes away, and another takes its loopback port: the front's shared
            # connection to the old one is dead, and the next call makes a new one
            await server.server.stop(None)
            replacement.add_generic_rpc_handlers((FeatureServicer(runtime).handler(),))
            assert replacement.add_insecure_port(f"127.0.0.1:{server.front.backend}")
            await replacement.start()
            again = await stub.GetRegistry(pb.GetRegistryRequest(), timeout=5)
            assert again == first
            answer = await stub.GetFeatures(request([3]), timeout=5)  # the front's own
            assert answer.rows[0].values[0].int_value == sample.features(3)["int_0"]
    finally:
        await replacement.stop(None)
        await server.stop(0)
        await runtime.stop()


def test_calls_past_their_deadline_end_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {**NO_SHADOW, "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "0.5"}
    with EmbeddedRedis(tmp_path / "redis") as own:
        assert own.process is not None
        with FeatureStore.connect(own.url, sample.registry()) as store:
            store.write(GROUP, sample.rows(N))
        with (
            ServingProcess(own.url, args=["--no-cache"], env=env, log_path=log) as server,
            grpc.insecure_channel(server.grpc_target) as channel,
        ):
            stub = FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
            check_answer(1, stub.GetFeatures(request([1, 7]), timeout=5))
            os.kill(own.process.pid, signal.SIGSTOP)  # Redis stops answering
            try:
                for i in range(3):
                    with pytest.raises(grpc.RpcError) as e:
                        stub.GetFeatures(request([i, (i * 7) % N]), timeout=0.1)
                    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            finally:
                os.kill(own.process.pid, signal.SIGCONT)
            # the answers made after the deadlines went nowhere; the front serves on (once
            # the circuit breaker, opened by the timed-out reads, lets reads through again)
            refusals = set()
            for _ in range(250):
                try:
                    check_answer(3, stub.GetFeatures(request([3, 21]), timeout=5))
                    break
                except grpc.RpcError as e:
                    refusals.add(e.code())
                    time.sleep(0.02)
            else:
                raise AssertionError("the front did not serve again after Redis came back")
            assert refusals <= {grpc.StatusCode.UNAVAILABLE}
            for i in range(5):
                check_answer(i, stub.GetFeatures(request([i % N, (i * 7) % N]), timeout=5))
    assert "Traceback" not in log.read_text()
