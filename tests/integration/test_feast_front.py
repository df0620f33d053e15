"""Feast's ``/get-online-features`` answered on the native REST front (native/src/hits/:
``Asked::feast``, ``Cells``) against the same server answering it in its handler:
with the L1 on, from the L1's entries (``NATIVE_HITS=off`` answers in Python); with it off,
by a planned read (``NATIVE_READS=off``). The same answers, byte for byte: every status
Feast has, int and string ids, picked and repeated features, a feature service, the flags;
lookups over several views of one entity (from the L1's entries, a compact cache's too, or
a planned read of all their features);
what the front cannot answer (an entity whose data is broken, several entity columns, a
float id) handed to the handler; the front's answers counted under api="feast". And
``/v1/features/get`` and gRPC's GetFeatures over several groups of one entity, answered on
the fronts from the L1's entries or a planned read as their handlers answer them
(``Rows``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import grpc
import httpx
import orjson
import pytest
import redis
from scrape import metric

from feature_store.embedded import EmbeddedRedis
from feature_store.layout import entity_key
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.registry import load_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

REGISTRY = """
version: 1
entities:
  consumer: {prefix: c, id_type: int, ttl: 7d, join_key: consumer_id}
  store: {prefix: s, id_type: string, ttl: 7d, join_key: store_id}
feature_groups:
  consumer_daily:
    entity: consumer
    max_age: 1h
    features: {orders: int, score: float, tags: int_list, note: string, vec: embedding(3)}
  store_daily:
    entity: store
    features: {rating: float, city: string, score: double}
  consumer_weekly:
    entity: consumer
    max_age: 1d
    features: {visits: int, spend: double, emb: embedding(2)}
feature_services:
  daily: [consumer_daily]
  two: [consumer_daily:tags, consumer_daily:score]
  both: [consumer_daily:orders, store_daily]
  across: [consumer_weekly:spend, consumer_daily:tags, consumer_weekly:visits]
"""
# a whole second: write times are kept to the millisecond, so a fraction past .9995 would
# be stored, and stamped, as the next second
NOW = float(int(time.time()))
BROKEN = 4  # its key holds a string, not a hash: the handler answers INVALID
UNTIMED = 8  # a value without the write time that this project's writers write with it
LOOKUPS = "feature_serving_front_lookups_total"
DAILY = [f"consumer_daily:{f}" for f in ("orders", "score", "tags", "note", "vec")]


def front(server: ServingProcess, at_least: float = 0.0, api: str = "feast") -> float:
    """Lookups of ``api`` the front answered, once drained (every 20 ms), within 5 s."""
    deadline = time.monotonic() + 5
    while True:
        value = sum(
            metric(server, f'{LOOKUPS}{{api="{api}",how="{how}"}}')
            for how in ("hit", "hit_loaded", "read", "read_direct")
        )
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture(
    scope="module", params=["on", "off", "compact"], ids=["L1 on", "L1 off", "L1 compact"]
)
def servers(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[ServingProcess, ServingProcess, str]]:
    """A server whose front answers Feast's lookups, and one whose handler does."""
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    path.write_text(REGISTRY)
    registry = load_registry(path, check_lock=False)
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        with FeatureStore.connect(server.url, registry) as store:
            store.write(
                "consumer_daily",
                [
                    (1, {"orders": 3, "score": 0.5, "tags": [1, 2], "note": 'a "b"\n',
                         "vec": [0.25, -1.0, 3e-8]}),
                    (2, {"orders": 4, "score": 0.0}),  # the others lacking: NULL_VALUE
                    (6, {"orders": -7, "score": float("nan"), "note": "ünï"}),
                ],
            )  # fmt: skip
            store.write("consumer_daily", [(3, {"orders": 9})], event_time=NOW - 7200)  # stale
            store.write("store_daily", [("s1", {"rating": 4.5, "city": "Oslo", "score": 2.0})])
            # 1 and 3 in both views (3 stale in the daily one alone), 2 and 6 in the daily
            # one alone, 7 in the weekly one alone, 5 in neither
            store.write(
                "consumer_weekly",
                [(1, {"visits": 10, "spend": 1.5, "emb": [0.5, -2.0]}), (3, {"visits": 2}),
                 (7, {"spend": -0.25})],
            )  # fmt: skip
        consumer = registry.entities["consumer"].id_type
        with redis.Redis.from_url(server.url) as r:
            r.set(entity_key("c", consumer, BROKEN), b"not a hash")
            orders = registry.groups["consumer_daily"].features[0].field
            r.hset(entity_key("c", consumer, UNTIMED), orders, b"5")
        env = {
            "FEATURE_SERVING_CACHE": "off" if request.param == "off" else "on",
            "FEATURE_SERVING_CACHE_FORM": "compact" if request.param == "compact" else "answers",
            "FEATURE_SERVING_REST_FRONT": "native",
        }
        off = {"FEATURE_SERVING_NATIVE_HITS": "off", "FEATURE_SERVING_NATIVE_READS": "off"}
        python_env = {**env, **off}
        with (
            ServingProcess(server.url, registry=path, env=env) as native,
            ServingProcess(server.url, registry=path, env=python_env) as python,
        ):
            yield native, python, request.param


def post(
    server: ServingProcess, body: object, path: str = "/get-online-features"
) -> tuple[int, bytes]:
    r = httpx.post(
        server.rest_url + path,
        content=body if isinstance(body, bytes) else orjson.dumps(body),
        headers={"content-type": "application/json"},
        timeout=10,
    )
    return r.status_code, r.content


IDS = {"consumer_id": [1, 2, 3, 5, 6, 1]}  # stale (3), NOT_FOUND (5), a repeat
# the forms the front answers once taught
ANSWERED: list[dict[str, object]] = [
    {"features": DAILY, "entities": IDS},  # the whole group, in its order
    {"features": [DAILY[2], DAILY[0]], "entities": IDS, "full_feature_names": True},
    {"features": [DAILY[1], DAILY[1], DAILY[4]], "entities": IDS},  # a repeated reference
    {"feature_service": "daily", "entities": IDS, "include_feature_view_version_metadata": True},
    {"feature_service": "two", "features": ["ignored:x"], "entities": IDS},
    {"features": DAILY[3:], "entities": IDS, "project": "ignored", "nested": {"a": [1, "]"]}},
    {"features": ["store_daily:city", "store_daily:rating"], "entities": {"store_id": ["s1", "x"]}},
    {"features": DAILY[1:3], "entities": {"consumer_id": [5, 7]}},  # nothing found
]
# the handler's alone, answered alike
HANDLERS: list[object] = [
    {"features": DAILY, "entities": {"consumer_id": [1, BROKEN]}},  # INVALID
    {"feature_service": "both", "entities": {"consumer_id": [1], "store_id": ["s1"]}},
    {"features": DAILY, "entities": {"consumer_id": [1.0]}},
    {"features": DAILY, "entities": {"consumer_id": ["1"]}},
    {"features": DAILY, "entities": {"consumer_id": []}},
    {"features": DAILY, "entities": IDS, "full_feature_names": None},
    # a field twice: the last one counts in Python
    b'{"features":["consumer_daily:orders"],"entities":{"consumer_id":[1]},'
    b'"full_feature_names":true,"full_feature_names":false}',
    {"features": ["consumer_daily:nope"], "entities": IDS},
]


def answered_alike(native: ServingProcess, python: ServingProcess, body: object) -> None:
    """``body`` three times to each server: the same 200 answer from both every time. The
    first teaches the native server's front the form, which answers the two after it."""
    first = [post(server, body) for server in (native, python)]
    assert first[0] == first[1], body
    assert first[0][0] == 200, first[0]
    for _ in range(2):  # the L1's entries get their JSON on the first, then hits
        again = [post(server, body) for server in (native, python)]
        assert again[0] == again[1] == first[0], body


def test_the_front_answers_feast_lookups_as_the_handler_does(
    servers: tuple[ServingProcess, ServingProcess, str],
) -> None:
    native, python, _ = servers
    answered = front(native)
    for body in ANSWERED:
        answered_alike(native, python, body)
        answered += 2
        assert front(native, answered) == answered, body
    assert front(python) == 0
    for body in HANDLERS:
        first = [post(server, body) for server in (native, python)]
        again = [post(server, body) for server in (native, python)]
        assert again[0] == again[1] == first[0] == first[1], body
    assert front(native, answered + 1) == answered  # the handler answered those


WEEKLY = [f"consumer_weekly:{f}" for f in ("visits", "spend", "emb")]
ACROSS = {"consumer_id": [1, 2, 3, 5, 6, 7, 1]}
# lookups over several views of one entity: the front answers them from the L1's entries
# (each view's rows with their own statuses and event times); without the L1, by a planned
# read of every view's features, one command per id
SEVERAL_VIEWS: list[dict[str, object]] = [
    {"features": [DAILY[0], WEEKLY[0], DAILY[1], WEEKLY[1]], "entities": ACROSS},  # interleaved
    {"features": [*WEEKLY, *DAILY], "entities": ACROSS, "full_feature_names": True},
    {
        "feature_service": "across",
        "entities": ACROSS,
        "include_feature_view_version_metadata": True,
    },
    {"features": [WEEKLY[2], DAILY[4], WEEKLY[2]], "entities": {"consumer_id": [5, 7]}},
]


def test_lookups_over_several_views(
    servers: tuple[ServingProcess, ServingProcess, str],
) -> None:
    native, python, _ = servers
    answered = front(native)
    for body in SEVERAL_VIEWS:
        answered_alike(native, python, body)
        answered += 2  # taught by the first, the front's since
        assert front(native, answered + 1) == answered, body
    # each view's own statuses: 2 is NOT_FOUND in the weekly view alone, 3 stale in the
    # daily one alone, 7 found in the weekly one alone
    doc = orjson.loads(post(native, SEVERAL_VIEWS[0])[1])
    names = doc["metadata"]["feature_names"]
    assert names == ["consumer_id", "orders", "visits", "score", "spend"]
    _, orders, visits, _, spend = doc["results"]
    assert orders["statuses"][:6] == [
        "PRESENT", "PRESENT", "OUTSIDE_MAX_AGE", "NOT_FOUND", "PRESENT", "NOT_FOUND"
    ]  # fmt: skip
    assert visits["statuses"][:6] == [
        "PRESENT", "NOT_FOUND", "PRESENT", "NOT_FOUND", "NOT_FOUND", "NULL_VALUE"
    ]  # fmt: skip
    assert visits["values"] == [10, None, 2, None, None, None, 10]
    assert spend["values"][5] == -0.25
    assert orders["event_timestamps"][2] != visits["event_timestamps"][2]


def test_every_status_is_written_by_the_front(
    servers: tuple[ServingProcess, ServingProcess, str],
) -> None:
    """The answer the front writes holds each of Feast's statuses where it belongs."""
    native, _, _ = servers
    body = {"features": [DAILY[0], DAILY[2]], "entities": IDS}
    post(native, body)  # taught
    before = front(native)
    for _ in range(2):
        _, content = post(native, body)
    assert front(native, before + 2) == before + 2
    doc = orjson.loads(content)
    assert doc["metadata"]["feature_names"] == ["consumer_id", "orders", "tags"]
    ids, orders, tags = doc["results"]
    assert ids["values"] == IDS["consumer_id"]
    assert orders["values"] == [3, 4, 9, None, -7, 3]
    assert orders["statuses"] == [
        "PRESENT", "PRESENT", "OUTSIDE_MAX_AGE", "NOT_FOUND", "PRESENT", "PRESENT"
    ]  # fmt: skip
    assert tags["values"] == [[1, 2], None, None, None, None, [1, 2]]
    assert tags["statuses"][1] == "NULL_VALUE"
    assert orders["event_timestamps"][3] == "1970-01-01T00:00:00Z"
    written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 7200))
    assert orders["event_timestamps"][2] == written


def test_an_entity_without_a_write_time(
    servers: tuple[ServingProcess, ServingProcess, str],
) -> None:
    """A hash holding a value of the group but not its write time (not written by this
    project's writers). The handler reads the whole group: the entity has the group, so a
    feature it lacks is NULL_VALUE. The front, without the L1, reads the features asked for
    and the write time alone: where it finds none of them, it cannot tell, and answers
    NOT_FOUND. With the L1, the entries are the handler's reads, and the answers agree."""
    native, python, cache = servers
    body = {"features": [DAILY[1]], "entities": {"consumer_id": [UNTIMED]}}
    for _ in range(3):  # taught, then answered by the front
        answers = [orjson.loads(post(server, body)[1]) for server in (native, python)]
    statuses = [doc["results"][1]["statuses"] for doc in answers]
    assert statuses[1] == ["NULL_VALUE"]
    assert statuses[0] == (["NOT_FOUND"] if cache == "off" else ["NULL_VALUE"])
    whole = {"features": DAILY, "entities": {"consumer_id": [UNTIMED]}}  # reads every field
    for _ in range(3):
        answers = [orjson.loads(post(server, whole)[1]) for server in (native, python)]
    assert answers[0] == answers[1]
    assert answers[0]["results"][1]["values"] == [5]


GROUPS = {"entity_type": "consumer", "ids": [1, 2, 3, 5, 6, 7, UNTIMED, 1]}
# /v1 lookups over several groups of one entity: the front answers them from the L1's
# entries (each group's values with their own statuses and age); without the L1, by a
# planned read
SEVERAL_GROUPS: list[dict[str, object]] = [
    {**GROUPS, "features": ["consumer_daily:orders", "visits", "score", "consumer_weekly:spend"]},
    {**GROUPS, "groups": ["consumer_weekly", "consumer_daily"]},
    {**GROUPS},  # every feature of the entity type
    {**GROUPS, "features": ["emb", "vec", "consumer_weekly:emb"], "groups": ["consumer_daily"]},
    {"entity_type": "consumer", "ids": [5, 7], "features": ["tags", "visits"]},
]


AGES = re.compile(rb'"ages":\{[^}]*\}')


def rows_alike(native: ServingProcess, python: ServingProcess, body: object) -> None:
    """``answered_alike`` of a ``/v1`` lookup: the same answers but for the ages, whole
    seconds of which one may turn between two answers."""
    for _ in range(3):
        answers = [post(server, body, "/v1/features/get") for server in (native, python)]
        assert answers[0][0] == answers[1][0] == 200, answers[0]
        assert AGES.sub(b"", answers[0][1]) == AGES.sub(b"", answers[1][1]), body
        rows = [orjson.loads(content)["results"] for _, content in answers]
        for ours, theirs in zip(*rows, strict=True):
            assert ours["ages"].keys() == theirs["ages"].keys()
            for group, age in ours["ages"].items():
                assert (age is None) == (theirs["ages"][group] is None)
                assert age is None or abs(age - theirs["ages"][group]) <= 1


def test_rest_lookups_over_several_groups(
    servers: tuple[ServingProcess, ServingProcess, str],
) -> None:
    native, python, _ = servers
    answered = front(native, api="rest")
    for body in SEVERAL_GROUPS:
        rows_alike(native, python, body)
        answered += 2  # taught by the first, the front's since
        assert front(native, answered + 1, "rest") == answered, body
    # each group's own statuses and age: 2 has nothing in the weekly group, 3 is stale in
    # the daily one alone, 7 is found in the weekly one alone, UNTIMED has no write time
    doc = orjson.loads(post(native, SEVERAL_GROUPS[0], "/v1/features/get")[1])
    assert doc["features"] == ["orders", "visits", "score", "spend"]
    rows = {row["id"]: row for row in doc["results"]}
    assert rows[1]["values"] == [3, 10, 0.5, 1.5]
    assert rows[2]["statuses"] == ["present", "missing", "present", "missing"]
    assert rows[3]["statuses"] == ["stale", "present", "missing", "missing"]
    assert rows[7]["values"] == [None, None, None, -0.25]
    assert rows[7]["ages"]["consumer_daily"] is None
    assert abs(rows[3]["ages"]["consumer_daily"] - (time.time() - NOW + 7200)) <= 2
    assert rows[UNTIMED]["ages"] == {"consumer_daily": None, "consumer_weekly": None}
    assert rows[UNTIMED]["values"][0] == 5


def get_features(server: ServingProcess, body: dict[str, object]) -> pb.GetFeaturesResponse:
    features, groups = body.get("features", []), body.get("groups", [])
    request = pb.GetFeaturesRequest(
        entity_type=body["entity_type"], int_ids=body["ids"], features=features, groups=groups
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary(
            "/feature_store.v1.FeatureService/GetFeatures",
            request_serializer=pb.GetFeaturesRequest.SerializeToString,
        )
        answer = pb.GetFeaturesResponse()
        answer.ParseFromString(call(request, timeout=10))
    return answer


def test_grpc_lookups_over_several_groups(
    servers: tuple[ServingProcess, ServingProcess, str],
) -> None:
    """``test_rest_lookups_over_several_groups`` over gRPC: the same answers but for the ages
    (whole seconds, which may turn between two answers), each row's within one second."""
    native, python, _ = servers
    answered = front(native, api="grpc")
    for body in SEVERAL_GROUPS:
        for _ in range(3):  # taught, then the front's
            ours, theirs = (get_features(server, body) for server in (native, python))
            for mine, other in zip(ours.rows, theirs.rows, strict=True):
                assert mine.ages.keys() == other.ages.keys()
                assert all(abs(mine.ages[g] - other.ages[g]) <= 1 for g in mine.ages)
                mine.ages.clear()
                other.ages.clear()
            assert ours == theirs, body
        answered += 2  # taught by the first, the front's since
        assert front(native, answered + 1, "grpc") == answered, body
    rows = {r.id.int_id: r for r in get_features(native, SEVERAL_GROUPS[0]).rows}
    missing, stale, present = pb.MISSING, pb.STALE, pb.PRESENT
    assert list(rows[3].statuses) == [stale, present, missing, missing]
    assert rows[7].values[3].float_value == -0.25
    assert set(rows[7].ages) == {"consumer_weekly"}
    assert set(rows[UNTIMED].ages) == set()
