"""The gRPC API against a real server: same answers as REST, errors, health, reflection."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from feature_store import sample
from feature_store.client import (
    AsyncGrpcFeatureClient,
    FeatureClient,
    GrpcFeatureClient,
    ServingRequestError,
)
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY


@pytest.fixture(scope="module")
def server(redis_server: EmbeddedRedis) -> Iterator[ServingProcess]:
    with ServingProcess(redis_server.url, args=["--no-cache", "--max-entities", "50"]) as s:
        yield s


@pytest.fixture
def data(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(30))


@pytest.mark.usefixtures("data")
def test_grpc_answers_like_rest(server: ServingProcess) -> None:
    features = ["float_00", "float_07", "int_2", "int_3", "int_list_1", "embedding_0"]
    ids = [0, 5, 29, 31337]
    with (
        GrpcFeatureClient(server.grpc_target, timeout=5) as g,
        FeatureClient(server.rest_url, timeout=5) as r,
    ):
        for kwargs in ({"features": features}, {"groups": [GROUP]}):
            via_grpc = g.get(ENTITY, ids, **kwargs)  # type: ignore[arg-type]
            via_rest = r.get(ENTITY, ids, **kwargs)  # type: ignore[arg-type]
            assert via_grpc.features == via_rest.features
            for a, b in zip(via_grpc.rows, via_rest.rows, strict=True):
                assert a.id == b.id
                assert a.values == b.values
                assert a.statuses == b.statuses
                assert a.ages.keys() <= b.ages.keys()
    assert via_grpc.rows[3].values == [None] * len(via_grpc.features)
    # int3 holds negative numbers: the varint encoding of int64 must survive them
    assert via_grpc.as_dicts()[1]["int_3"] == sample.features(5)["int_3"]


@pytest.mark.usefixtures("data")
async def test_async_grpc_client_reads_and_writes(server: ServingProcess) -> None:
    async with AsyncGrpcFeatureClient(server.grpc_target, timeout=5) as client:
        stats = await client.write(
            GROUP, [(3, {"float_00": 2.5, "int_list_0": [1, 2, 3], "int_0": None})]
        )
        assert (stats.entities, stats.values_written, stats.values_removed) == (1, 2, 1)
        result = await client.get(ENTITY, [3], features=["float_00", "int_list_0", "int_0"])
        assert result.rows[0].values == [2.5, [1, 2, 3], None]
        assert [s.value for s in result.rows[0].statuses] == ["present", "present", "missing"]


async def test_grpc_writes_carry_event_times_and_name_skipped_rows(
    server: ServingProcess,
) -> None:
    async with AsyncGrpcFeatureClient(server.grpc_target, timeout=5) as client:
        stats = await client.write(
            GROUP,
            [
                (40, {"int_0": 1}, "2026-01-01T00:00:00.250Z"),
                (41, {"int_0": 2}, datetime(2026, 1, 1, tzinfo=UTC)),
            ],
        )
        assert (stats.entities, stats.skipped) == (2, 0)
        stats = await client.write(
            GROUP, [(40, {"int_0": 3}, 1767225600.249), (41, {"int_0": 4}, 1767225600.001)]
        )
        assert (stats.entities, stats.skipped) == (1, 1)
        result = await client.get(ENTITY, [40, 41], features=["int_0"])
        assert [r.values for r in result.rows] == [[1], [4]]
    # the raw answer names the skipped ids
    request = pb.WriteFeaturesRequest(group=GROUP)
    row = request.rows.add()
    row.id.int_id = 41
    row.values["int_0"].int_value = 5
    row.event_time.FromSeconds(1767225600)
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        answer = await FeatureServiceStub(channel).WriteFeatures(request, timeout=5)
    assert answer.skipped == 1
    assert [i.int_id for i in answer.skipped_ids] == [41]


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"entity_type": ENTITY, "ids": [], "features": ["float_00"]}, "empty_batch"),
        (
            {"entity_type": ENTITY, "ids": list(range(51)), "features": ["float_00"]},
            "batch_too_large",
        ),
        ({"entity_type": ENTITY, "ids": ["a"], "features": ["float_00"]}, "invalid_id"),
        ({"entity_type": ENTITY, "ids": [1], "features": ["nope"]}, "unknown_feature"),
        ({"entity_type": "shop", "ids": [1], "features": ["x"]}, "unknown_entity_type"),
    ],
)
def test_grpc_bad_requests_are_invalid_argument(
    server: ServingProcess, kwargs: dict[str, object], code: str
) -> None:
    with (
        GrpcFeatureClient(server.grpc_target, timeout=5) as client,
        pytest.raises(ServingRequestError) as err,
    ):
        client.get(**kwargs)  # type: ignore[arg-type]
    assert err.value.code == code
    # and at the wire level, the status is INVALID_ARGUMENT
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as rpc:
            stub.GetFeatures(
                pb.GetFeaturesRequest(
                    entity_type=ENTITY, int_ids=[1], string_ids=["a"], features=["float_00"]
                ),
                timeout=5,
            )
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_reflection(server: ServingProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(
            health_pb2.HealthCheckRequest(service="feature_store.v1.FeatureService"), timeout=5
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert "feature_store.v1.FeatureService" in names
    assert "grpc.health.v1.Health" in names
    assert {
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_grpcurl_lists_describes_and_calls_through_reflection(
    redis_url: str, front: str, grpcurl: str
) -> None:
    """grpcurl (v1.9: asks for reflection v1, falls back to v1alpha) sees the service."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(3))
    env = {"FEATURE_SERVING_GRPC_FRONT": front}
    with ServingProcess(redis_url, env=env) as server:

        def run(*args: str) -> str:
            done = subprocess.run(
                [grpcurl, "-plaintext", *args], capture_output=True, text=True, timeout=30
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        listed = run(server.grpc_target, "list").split()
        assert "feature_store.v1.FeatureService" in listed
        assert "grpc.reflection.v1.ServerReflection" in listed
        described = run(server.grpc_target, "describe", "feature_store.v1.FeatureService")
        assert "rpc GetFeatures ( .feature_store.v1.GetFeaturesRequest )" in described
        body = '{"entity_type": "consumer", "int_ids": [1], "features": ["int_0"]}'
        answer = json.loads(
            run("-d", body, server.grpc_target, "feature_store.v1.FeatureService/GetFeatures")
        )
        assert answer["rows"][0]["values"][0]["int_value"] == str(sample.features(1)["int_0"])


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_reflection_v1_lists_and_describes_the_service(redis_url: str, front: str) -> None:
    """grpc.reflection.v1, as newer tools ask for it (grpcurl tries v1 first), through
    either front: the method is called by its v1 path with v1's field numbers."""
    env = {"FEATURE_SERVING_GRPC_FRONT": front}
    with (
        ServingProcess(redis_url, env=env) as server,
        grpc.insecure_channel(server.grpc_target) as channel,
    ):
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="feature_store.v1.FeatureService"
            ),
        ]
        listed, described = list(call(iter(requests), timeout=5))
    assert "feature_store.v1.FeatureService" in {
        s.name for s in listed.list_services_response.service
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in described.file_descriptor_response.file_descriptor_proto
    ]
    methods = {m.name for f in files for svc in f.service for m in svc.method}
    assert {"GetFeatures", "WriteFeatures", "GetRegistry"} <= methods


def test_registry_over_grpc(server: ServingProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
        reg = stub.GetRegistry(pb.GetRegistryRequest(), timeout=5)
    assert reg.entities[0].name == ENTITY
    dims = {f.name: f.dim for f in reg.groups[0].features}
    assert dims["embedding_1"] == 32


def test_a_full_batch_of_1000_entities_over_both_apis(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(1000))
    ids = list(range(1000))
    with (
        ServingProcess(redis_url) as server,
        GrpcFeatureClient(server.grpc_target, timeout=30) as g,
        FeatureClient(server.rest_url, timeout=30) as r,
    ):
        via_grpc = g.get(ENTITY, ids, groups=[GROUP])
        via_rest = r.get(ENTITY, ids, groups=[GROUP])
    assert [row.id for row in via_grpc.rows] == ids
    assert [row.values for row in via_grpc.rows] == [row.values for row in via_rest.rows]
    assert via_rest.as_dicts()[999]["int_1"] == sample.features(999)["int_1"]


@pytest.mark.parametrize("cache", [True, False], ids=["l1-on", "l1-off"])
def test_nan_and_infinities_round_trip_over_rest_and_grpc(redis_url: str, cache: bool) -> None:
    """A push write of NaN/±inf, read back: REST and gRPC agree value for value, present."""
    nan, inf = math.nan, math.inf
    values = {
        "float_00": nan,
        "float_01": inf,
        "float_02": -inf,
        "float_03": 0.5,
        "embedding_0": [nan, inf, -inf, *([0.25] * 29)],
    }
    names = list(values)
    args = [] if cache else ["--no-cache"]
    with (
        ServingProcess(redis_url, args=args) as server,
        FeatureClient(server.rest_url) as rest,
        GrpcFeatureClient(server.grpc_target) as rpc,
    ):
        rest.write(sample.GROUP, [(7, values)])
        raw = httpx.post(
            f"{server.rest_url}/v1/features/get",
            json={"entity_type": sample.ENTITY, "ids": [7], "features": names},
        ).json()
        assert raw["results"][0]["values"][:3] == ["NaN", "Infinity", "-Infinity"]
        assert raw["results"][0]["values"][4][:3] == ["NaN", "Infinity", "-Infinity"]
        for _ in range(2):  # a miss, then a hit when the cache is on
            by_rest = rest.get(sample.ENTITY, [7], features=names).rows[0]
            by_grpc = rpc.get(sample.ENTITY, [7], features=names).rows[0]
            for row in (by_rest, by_grpc):
                assert [s.value for s in row.statuses] == ["present"] * 5
                assert math.isnan(row.values[0])
                assert row.values[1:4] == [inf, -inf, 0.5]
                embedding = row.values[4]
                assert isinstance(embedding, list)
                assert math.isnan(embedding[0])
                assert embedding[1:] == [inf, -inf, *([0.25] * 29)]
