"""Lookups without the L1 written on the native REST front (serving/fronts/reads.py; in
native/src/hits/plan.rs ``Hits::plan`` and ``Hits::render``) against the same server answering
them in its handler (``NATIVE_READS=off``): the same answers, byte for byte but the ages;
entities the front cannot answer (a key of another type, a value only the reference reads, a
corrupt write time) handed to the handler, which names them; the front's answers counted;
Redis gone answered with the handler's own 503.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import redis
from scrape import metric

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

GROUP, ENTITY = sample.GROUP, sample.ENTITY
ENV = {
    "FEATURE_SERVING_CACHE": "off",
    "FEATURE_SERVING_WARM_START_KEYS": "0",
    "FEATURE_SERVING_REST_FRONT": "native",
}
AGES = re.compile(rb'"ages":\{[^}]*\}')
N = 50
ALL = [*sample.FLOATS, *sample.INTS, *sample.INT_LISTS, *sample.EMBEDDINGS]
READS = "rest"
GRPC_READS = "grpc"
LOOKUPS = "feature_serving_front_lookups_total"
CONNECTIONS = "feature_serving_front_redis_connections"
WRONG_TYPE, BAD_VALUE, BAD_TIME = 9001, 9002, 9003


def planned(server: ServingProcess, api: str, how: str | None = None) -> float:
    """Lookups the front wrote from Redis's replies: sent by Python ("read"), read on its
    own connections ("read_direct"), or both."""
    hows = [how] if how else ["read", "read_direct"]
    return sum(metric(server, f'{LOOKUPS}{{api="{api}",how="{h}"}}') for h in hows)


def front_reads(server: ServingProcess, at_least: float, api: str = READS) -> float:
    """The front's planned answers once drained (every 20 ms), within 5 s."""
    deadline = time.monotonic() + 5
    while True:
        value = planned(server, api)
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def get(server: ServingProcess, body: dict[str, object]) -> httpx.Response:
    return httpx.post(
        server.rest_url + "/v1/features/get",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
        timeout=10,
    )


def key(entity_id: int) -> bytes:
    return f"{sample.registry().entities[ENTITY].prefix}:{entity_id}".encode()


@pytest.fixture(scope="module", params=["2", "0"], ids=["own connections", "sent by Python"])
def servers(
    redis_server: EmbeddedRedis, request: pytest.FixtureRequest
) -> Iterator[tuple[ServingProcess, ServingProcess, int]]:
    url = redis_server.url
    registry = sample.registry()
    with redis.Redis.from_url(url) as r:
        r.flushall()  # the session's Redis: other modules' keys (broken ones among them) go
    with FeatureStore.connect(url, registry) as store:
        store.write(GROUP, sample.rows(N))
    group = registry.groups[GROUP]
    with redis.Redis.from_url(url) as r:
        r.set(key(WRONG_TYPE), b"a string, not a hash")
        r.hset(key(BAD_VALUE), mapping=r.hgetall(key(1)))
        r.hset(key(BAD_VALUE), group.features[0].field, b"not a float")
        r.hset(key(BAD_TIME), mapping=r.hgetall(key(2)))
        r.hset(key(BAD_TIME), group.freshness_field, b"yesterday")
    native_env = {**ENV, "FEATURE_SERVING_NATIVE_READS_CONNECTIONS": request.param}
    with (
        ServingProcess(url, env=native_env) as native,
        ServingProcess(url, env={**ENV, "FEATURE_SERVING_NATIVE_READS": "off"}) as python,
    ):
        yield native, python, 2 * int(request.param)  # two fronts: REST and gRPC


# the forms a client sends: the front writes the first six's answers once it learned them
BODIES: list[dict[str, object]] = [
    {"entity_type": ENTITY, "ids": [1, 2, 3], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [4, 4, 10_000_000, -5], "groups": [GROUP]},  # missing ones
    {"entity_type": ENTITY, "ids": [5], "features": ALL},
    # picked features: an HMGET of them, in the order asked; most of them: an HGETALL
    {"entity_type": ENTITY, "ids": [1, 10_000_000, 2], "features": [ALL[20], ALL[0], ALL[7]]},
    {"entity_type": ENTITY, "ids": [6, 7], "features": ALL[:45]},
    {"entity_type": ENTITY, "ids": [8], "features": [ALL[3], ALL[3], ALL[30]]},  # a repeat
    {"groups": [GROUP], "ids": list(range(1, N + 1)), "bypass_cache": True, "entity_type": ENTITY},
    # the handler's alone: ids of the wrong type, bad fields
    {"entity_type": ENTITY, "ids": ["1"], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [1.0], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [2**63], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [1], "groups": [GROUP], "feature": ["x"]},
    {"entity_type": ENTITY, "ids": [1], "groups": None},
]
# of each body's two requests, those the front writes: the first of a form teaches it (the
# second body has the first's form); the seventh asks to bypass the cache, which the handler
# allows by the key's role
WRITTEN = [1, 2, 1, 1, 1, 1]


def answer(server: ServingProcess, body: dict[str, object]) -> tuple[int, bytes]:
    r = get(server, body)
    return r.status_code, AGES.sub(b"", r.content)


def test_the_front_writes_answers_as_the_handler_does(
    servers: tuple[ServingProcess, ServingProcess, int],
) -> None:
    native, python, own = servers
    written = planned(native, READS)
    for i, body in enumerate(BODIES):
        first = [answer(server, body) for server in (native, python)]  # teaches the form
        assert first[0] == first[1], body
        again = [answer(server, body) for server in (native, python)]
        assert again[0] == again[1] == first[0], body
        if i < len(WRITTEN):
            assert again[0][0] == 200
            written += WRITTEN[i]
            assert front_reads(native, written) == written, body
    assert front_reads(native, written + 1) == written  # nothing else came from the front
    assert planned(python, READS) == 0
    # with connections of its own, the front reads on them once they are open; else Python
    # sends every planned read
    assert metric(native, CONNECTIONS) == own
    assert (planned(native, READS, "read_direct") > 0) == (own > 0)
    assert (planned(native, READS, "read") == 0) == (own > 0)
    assert metric(python, CONNECTIONS) == 0


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (WRONG_TYPE, "wrong_type"),
        (BAD_VALUE, "undecodable_value"),
        (BAD_TIME, "corrupt_write_time"),
    ],
)
def test_an_entity_the_front_cannot_answer_goes_to_the_handler(
    servers: tuple[ServingProcess, ServingProcess, int], bad: int, reason: str
) -> None:
    native, python, _ = servers
    form = {"entity_type": ENTITY, "groups": [GROUP]}
    answer(native, {**form, "ids": [1]})  # the form is learned
    written = front_reads(native, 0)
    body = {**form, "ids": [1, bad, 2]}
    r = get(native, body)
    assert (r.status_code, AGES.sub(b"", r.content)) == answer(python, body)
    assert r.status_code == 200
    doc = r.json()
    assert [e["id"] for e in doc["errors"]] == [bad]
    assert doc["errors"][0]["reason"] == reason
    assert doc["results"][1]["statuses"][0] == "error"
    assert doc["results"][0]["statuses"][0] == "present"
    assert front_reads(native, written + 1) == written  # the handler answered it


def grpc_answer(server: ServingProcess, request: pb.GetFeaturesRequest) -> pb.GetFeaturesResponse:
    with grpc.insecure_channel(server.grpc_target) as channel:
        answer: pb.GetFeaturesResponse = FeatureServiceStub(channel).GetFeatures(
            request, timeout=10
        )
    for row in answer.rows:
        row.ages.clear()  # whole seconds: one may turn between two answers
    return answer


GRPC_REQUESTS = [
    (pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[1, 2, 3], groups=[GROUP]), 1),
    (pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[4, 4, 10_000_000, -5], groups=[GROUP]), 2),
    (pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[5], features=ALL), 1),
    (pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[5, -1], features=[ALL[40], ALL[2]]), 1),
    # the method's alone: a bypass (the key's role)
    (pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[5], groups=[GROUP], bypass_cache=True), 0),
    # an entity the front cannot answer: the method names it
    (pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[1, BAD_VALUE], groups=[GROUP]), 0),
]


def test_the_grpc_front_writes_answers_as_the_method_does(
    servers: tuple[ServingProcess, ServingProcess, int],
) -> None:
    native, python, _ = servers
    written = planned(native, GRPC_READS)
    for request, count in GRPC_REQUESTS:
        first = [grpc_answer(server, request) for server in (native, python)]  # teaches the form
        assert first[0] == first[1], request
        again = [grpc_answer(server, request) for server in (native, python)]
        assert again[0] == again[1] == first[0], request
        assert len(again[0].rows) == len(request.int_ids)
        written += count
        assert front_reads(native, written, GRPC_READS) == written, request
    assert [e.id.int_id for e in again[0].errors] == [BAD_VALUE]
    assert planned(python, GRPC_READS) == 0


@contextlib.contextmanager
def alone(tmp_path: Path, timeout_max: float) -> Iterator[tuple[EmbeddedRedis, ServingProcess]]:
    """A Redis of its own with a few entities, and a server on it (L1 off) whose round
    trips may take up to ``timeout_max`` seconds."""
    with EmbeddedRedis(tmp_path / "redis", persistence=False) as server:
        with FeatureStore.connect(server.url, sample.registry()) as store:
            store.write(GROUP, sample.rows(5))
        env = {**ENV, "FEATURE_SERVING_REDIS_TIMEOUT_MAX": f"{timeout_max:g}"}
        with ServingProcess(server.url, env=env) as native:
            yield server, native


def recovers(native: ServingProcess, body: dict[str, object], what: str) -> None:
    """The lookup is answered again within 20 s."""
    deadline = time.monotonic() + 20
    while get(native, body).status_code != 200:
        assert time.monotonic() < deadline, f"never recovered after {what}"
        time.sleep(0.2)


BODY = {"entity_type": ENTITY, "ids": [1, 2], "groups": [GROUP]}


FEAST_BODY = {
    "features": [f"{GROUP}:{ALL[3]}", f"{GROUP}:{ALL[0]}"],
    "entities": {sample.registry().entities[ENTITY].join_key: [1, 2]},
}


def feast_get(server: ServingProcess) -> httpx.Response:
    return httpx.post(
        server.rest_url + "/get-online-features",
        content=orjson.dumps(FEAST_BODY),
        headers={"content-type": "application/json"},
        timeout=10,
    )


def test_redis_gone_is_the_handlers_503(tmp_path: Path) -> None:
    """Each route's own: this API's error, and Feast's (a JSON string its SDK raises)."""
    with alone(tmp_path, 0.5) as (server, native):
        for _ in range(2):  # taught, then written by the front
            assert get(native, BODY).status_code == 200
            assert feast_get(native).status_code == 200
        assert front_reads(native, 1) == 1
        assert front_reads(native, 1, "feast") == 1
        server.kill()
        failures = [get(native, BODY) for _ in range(8)]
        for r in failures:
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] in {"redis_unavailable", "redis_error"}, r.text
        # the circuit opens; its answers carry when to try again, as the handler's do
        assert "retry-after" in failures[-1].headers
        feast = feast_get(native)
        assert feast.status_code == 503, feast.text
        detail = orjson.loads(feast.json())
        assert (detail["module"], detail["class"]) == ("feast.errors", "FeastError"), detail
        assert "retry-after" in feast.headers
        server.restart()
        recovers(native, BODY, "Redis came back")
        assert feast_get(native).status_code == 200


def test_redis_hanging_opens_the_circuit_and_recovers(tmp_path: Path) -> None:
    """Round trips on the front's own connections that time out count for the breaker, as
    Python's do: the circuit opens, lookups fail fast, and all is well once Redis answers."""
    with alone(tmp_path, 0.3) as (server, native):
        deadline = time.monotonic() + 10
        while planned(native, READS, "read_direct") == 0:  # the front's connections
            assert get(native, BODY).status_code == 200
            assert time.monotonic() < deadline, "the front never read on its own"
            time.sleep(0.05)
        assert server.process is not None
        pid = server.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            statuses = [get(native, BODY).status_code for _ in range(12)]
            opened = metric(native, "feature_serving_circuit_opened_total")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert set(statuses) == {503}, statuses
        assert opened >= 1
        recovers(native, BODY, "Redis answered")


def test_picked_features_are_all_redis_is_asked_for(
    servers: tuple[ServingProcess, ServingProcess, int], redis_server: EmbeddedRedis
) -> None:
    """Without the L1, a lookup of two of fifty features reads those two (and the write
    time) on the front, where its handler reads the whole hash."""
    native, _, _ = servers
    body = {"entity_type": ENTITY, "ids": [11, 12], "features": [ALL[9], ALL[4]]}
    assert get(native, body).status_code == 200  # the form is learned
    with redis.Redis.from_url(redis_server.url) as r:
        r.config_resetstat()
        doc = get(native, body).json()
        stats = r.info("commandstats")
    assert doc["features"] == [ALL[9], ALL[4]]
    assert [row["statuses"] for row in doc["results"]] == [["present", "present"]] * 2
    assert stats["cmdstat_hmget"]["calls"] == 2  # one per entity
    assert "cmdstat_hgetall" not in stats


def test_a_bad_value_not_asked_for_is_not_the_lookups_error(
    servers: tuple[ServingProcess, ServingProcess, int],
) -> None:
    """The front reads the features a lookup asks for, and no others: a value that cannot
    be decoded is an entity's error only when it is among them. The handler, which reads
    the whole group, names it either way."""
    native, python, _ = servers
    good, bad = [ALL[5], ALL[6]], [ALL[0], ALL[6]]  # ALL[0] holds BAD_VALUE's bad value
    for features in (good, bad):
        answer(native, {"entity_type": ENTITY, "ids": [3], "features": features})  # learned
    written = front_reads(native, 0)
    body = {"entity_type": ENTITY, "ids": [BAD_VALUE, 3], "features": good}
    doc = get(native, body).json()
    assert "errors" not in doc
    assert doc["results"][0]["statuses"] == ["present", "present"]
    assert get(python, body).json()["errors"][0]["reason"] == "undecodable_value"
    assert front_reads(native, written + 1) == written + 1
    doc = get(native, {**body, "features": bad}).json()  # the handler names it
    assert [(e["id"], e["reason"]) for e in doc["errors"]] == [(BAD_VALUE, "undecodable_value")]
    assert doc["results"][1]["statuses"] == ["present", "present"]
    assert front_reads(native, written + 2) == written + 1
