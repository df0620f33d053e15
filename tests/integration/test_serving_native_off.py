"""A server on the native data plane and one on its Python reference answer alike.

Two real `feature-store serve` processes on one Redis, one with FEATURE_STORE_NATIVE=off:
the same REST requests get the same bytes (ages aside: they count seconds), and the same
gRPC requests the same messages, for values of every type, stored forms other writers
leave (which the native code declines and the reference answers), and NaN.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import grpc
import httpx
import pytest
import redis

from feature_store import sample
from feature_store.layout import entity_key, feature_field
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

ENV = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
AGES = re.compile(rb'"ages":\{[^}]*\}')


@pytest.fixture
def servers(redis_url: str) -> Iterator[tuple[ServingProcess, ServingProcess]]:
    registry = sample.registry()
    rows = list(sample.rows(30))
    rows[3][1]["float_00"] = math.nan
    rows[4][1]["embedding_0"] = [math.inf] + [0.1] * (sample.EMBEDDING_DIM - 1)
    with FeatureStore.connect(redis_url, registry) as store:
        store.write(sample.GROUP, rows)
    etype = registry.entities[sample.ENTITY]
    with redis.Redis.from_url(redis_url) as client:  # forms only the reference reads
        key = entity_key(etype.prefix, etype.id_type, 5)
        client.hset(key, feature_field("float_01"), b" 1.50")
        client.hset(key, feature_field("int_0"), b"007")
        client.hdel(key, feature_field("float_02"))
    with (
        ServingProcess(redis_url, env={**ENV, "FEATURE_STORE_NATIVE": "on"}) as native,
        ServingProcess(redis_url, env={**ENV, "FEATURE_STORE_NATIVE": "off"}) as pure,
    ):
        yield native, pure


@pytest.mark.parametrize("cache", [False, True])
def test_native_and_reference_servers_answer_the_same(
    servers: tuple[ServingProcess, ServingProcess], cache: bool
) -> None:
    ids = [*range(12), 99_999]  # 99,999: never written
    # (groups, features): a whole group, and some features of it
    asks: list[tuple[list[str], list[str]]] = [
        ([sample.GROUP], []),
        ([], ["embedding_0", "int_0", "float_01"]),
    ]
    answers = []
    for server in servers:
        got = []
        with httpx.Client(base_url=server.rest_url, timeout=10) as http:
            for groups, features in asks:
                body = {
                    "entity_type": sample.ENTITY,
                    "ids": ids,
                    "groups": groups,
                    "features": features,
                    "bypass_cache": not cache,
                }
                for _ in range(2 if cache else 1):  # the second read is a cache hit
                    r = http.post("/v1/features/get", json=body)
                    assert r.status_code == 200, r.text
                    got.append(AGES.sub(b"", r.content))
        assert server.grpc_target is not None
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = FeatureServiceStub(channel)
            for groups, features in asks:
                request = pb.GetFeaturesRequest(
                    entity_type=sample.ENTITY,
                    int_ids=ids,
                    groups=groups,
                    features=features,
                    bypass_cache=not cache,
                )
                reply = stub.GetFeatures(request, timeout=10)
                for row in reply.rows:
                    row.ClearField("ages")
                got.append(reply.SerializeToString(deterministic=True))
        answers.append(got)
    native, pure = answers
    assert native == pure
    assert b'"NaN"' in native[0]  # the NaN is there, as a string
    assert b"1.5" in native[0]  # " 1.50", read by the reference
