"""Cache hits answered on the native fronts' threads (serving/fronts/hits.py, native/src/hits/),
REST and gRPC, against a server that answers every lookup in Python (``NATIVE_HITS=off``):
the same answers, hits counted, push writes and expiry seen at once, keys checked, and the
cache's policy (refresh ahead, shadow checks) still run for the hits the fronts answer.
The shared servers' tests run twice: entries keeping their answers, and a compact cache
(``CACHE_FORM=compact``: packed values only, each answer written from them).
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

from feature_store import sample
from feature_store.layout import entity_key
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.serving.l1.cache import BYTES_OBJECT
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

GROUP, ENTITY = sample.GROUP, sample.ENTITY
ENV = {
    "FEATURE_SERVING_SHADOW_FRACTION": "0",
    "FEATURE_SERVING_WARM_START_KEYS": "0",
    "FEATURE_SERVING_CACHE_TTL": "60",
    "FEATURE_SERVING_REST_FRONT": "native",
}
AGES = re.compile(rb'"ages":\{[^}]*\}')
N = 50
ALL = [*sample.FLOATS, *sample.INTS, *sample.INT_LISTS, *sample.EMBEDDINGS]


SERVED = [
    'feature_serving_entities_served_total{api="rest"}',
    'feature_serving_request_seconds_count{api="rest",code="200",method="get"}',
]


def front_hits(server: ServingProcess, at_least: float = 0.0) -> float:
    """The front's hits once its last answers are drained (every 20 ms), within 5 s."""
    deadline = time.monotonic() + 5
    while True:
        value = metric(server, "feature_serving_cache_front_hits_total")
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def get(server: ServingProcess, body: dict[str, object]) -> httpx.Response:
    return httpx.post(
        server.rest_url + "/v1/features/get",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
    )


@pytest.fixture(scope="module", params=["answers", "compact"])
def servers(
    redis_server: object, request: pytest.FixtureRequest
) -> Iterator[tuple[ServingProcess, ServingProcess]]:
    """A server with native hits in either cache form, and the reference: Python alone,
    entries keeping their answers. Missing entities stay cached as long as the others."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    env = {**ENV, "FEATURE_SERVING_CACHE_NEGATIVE_TTL": "60"}
    with (
        ServingProcess(url, env={**env, "FEATURE_SERVING_CACHE_FORM": request.param}) as native,
        ServingProcess(url, env={**env, "FEATURE_SERVING_NATIVE_HITS": "off"}) as python,
    ):
        yield native, python


# the forms a client sends: the front answers the first five from the cache once learned
BODIES: list[dict[str, object]] = [
    {"entity_type": ENTITY, "ids": [1, 2, 3], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [4, 4, 10_000_000, -5], "groups": [GROUP]},  # missing ones
    {"entity_type": ENTITY, "ids": [5], "features": ALL},
    {"groups": [GROUP], "ids": [6, 7], "bypass_cache": False, "entity_type": ENTITY},
    # picked features, in the order asked, of entries cached above (one of them missing)
    {"entity_type": ENTITY, "ids": [1, 10_000_000, 2], "features": [ALL[9], ALL[0], ALL[31]]},
    # Python's alone: a bypass, ids of the wrong type, bad fields
    {"entity_type": ENTITY, "ids": [1], "groups": [GROUP], "bypass_cache": True},
    {"entity_type": ENTITY, "ids": ["1"], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [1.0], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [2**63], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [], "groups": [GROUP]},
    {"entity_type": ENTITY, "ids": [1], "groups": [GROUP], "feature": ["x"]},
    {"entity_type": ENTITY, "ids": [1], "groups": None},
]
ANSWERED_BY_THE_FRONT = 5


def test_the_front_answers_hits_as_python_does(
    servers: tuple[ServingProcess, ServingProcess],
) -> None:
    native, python = servers
    expected_hits = 0.0
    for i, body in enumerate(BODIES):
        answers = []
        for server in servers:
            get(server, body)  # loads the entries, and teaches the form
            r = get(server, body)
            answers.append((r.status_code, AGES.sub(b"", r.content)))
        assert answers[0] == answers[1], body
        if i < ANSWERED_BY_THE_FRONT:
            assert answers[0][0] == 200
            expected_hits += len(body["ids"])  # type: ignore[arg-type]
            assert front_hits(native, expected_hits) == expected_hits, body
    assert front_hits(native) == expected_hits  # nothing else came from the front
    assert metric(python, "feature_serving_cache_front_hits_total") == 0
    # the requests the front answered are in the request metrics as Python's are
    for name in SERVED:
        assert metric(native, name) == metric(python, name) > 0, name
    # an API's request series appear once it is served: no Feast rows in the recording
    # rules of a server that serves none
    text = httpx.get(native.rest_url + "/metrics", timeout=5).text
    assert 'feature_serving_request_seconds_count{api="feast"' not in text


def test_a_push_write_is_answered_at_once(servers: tuple[ServingProcess, ServingProcess]) -> None:
    native, _ = servers
    body = {"entity_type": ENTITY, "ids": [20, 21], "groups": [GROUP]}
    get(native, body)
    before = front_hits(native)
    first = get(native, body).json()
    front_hits(native, before + 2)
    written = httpx.post(
        native.rest_url + "/v1/features/write",
        json={"group": GROUP, "rows": [{"id": 20, "values": {"float_00": 12345.5}}]},
    )
    assert written.status_code == 200, written.text
    after = get(native, body).json()
    assert after["results"][0]["values"][0] == 12345.5 != first["results"][0]["values"][0]
    assert after["results"][1]["values"] == first["results"][1]["values"]


def test_an_expired_entry_is_read_again(redis_server: object) -> None:
    """TTL 1 s, no refresh ahead, no invalidation: a value changed in Redis behind the
    server's back is answered once the entry expires, not later."""
    url = redis_server.url  # type: ignore[attr-defined]
    env = {
        **ENV,
        "FEATURE_SERVING_CACHE_TTL": "1",
        "FEATURE_SERVING_CACHE_JITTER": "0",
        "FEATURE_SERVING_CACHE_REFRESH_AHEAD": "0",
        "FEATURE_SERVING_XFETCH_BETA": "0",
        "FEATURE_SERVING_INVALIDATION": "off",
    }
    body = {"entity_type": ENTITY, "ids": [30], "groups": [GROUP]}
    with ServingProcess(url, env=env) as server:
        get(server, body)
        old = get(server, body).json()["results"][0]["values"][0]
        assert front_hits(server, 1) == 1
        with FeatureStore.connect(url, sample.registry()) as store:
            store.write(GROUP, [(30, {**sample.features(30), "float_00": old + 1.0})])
        time.sleep(1.2)
        assert get(server, body).json()["results"][0]["values"][0] == old + 1.0


def test_hot_entries_answered_by_the_front_are_refreshed_ahead(redis_server: object) -> None:
    """Hits on the front inside the refresh window reach the refresh policy: entries hit
    every 0.2 s for 10 s with a TTL of 4 s are reloaded before they expire, never missed;
    every hit is sampled for a shadow check, and the checks run."""
    url = redis_server.url  # type: ignore[attr-defined]
    env = {
        **ENV,
        "FEATURE_SERVING_CACHE_TTL": "4",
        "FEATURE_SERVING_CACHE_REFRESH_AHEAD": "0.5",
        "FEATURE_SERVING_SHADOW_FRACTION": "1",
        "FEATURE_SERVING_INVALIDATION": "off",
    }
    ids = list(range(40, 45))
    body = {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}
    with ServingProcess(url, env=env) as server:
        get(server, body)
        longest = 0.0
        last = time.monotonic()
        end = last + 10
        while time.monotonic() < end:
            assert get(server, body).status_code == 200
            now = time.monotonic()
            longest, last = max(longest, now - last), now
            time.sleep(0.2)
        hits = front_hits(server)
        misses = metric(server, "feature_serving_cache_misses_total")
        refreshed = metric(server, "feature_serving_cache_early_refreshes_total")
        checks = metric(server, "feature_serving_cache_shadow_checks_total")
        mismatches = metric(server, "feature_serving_cache_shadow_mismatches_total")
    assert hits > 0
    assert misses == len(ids), f"longest gap between reads {longest:.2f} s"
    assert refreshed >= len(ids)
    assert checks > 0
    assert mismatches == 0


def test_native_hits_off_leaves_every_lookup_to_python(
    servers: tuple[ServingProcess, ServingProcess],
) -> None:
    _, python = servers
    body = {"entity_type": ENTITY, "ids": [8], "groups": [GROUP]}
    for _ in range(3):
        assert get(python, body).status_code == 200
    assert metric(python, "feature_serving_cache_front_hits_total") == 0
    assert metric(python, "feature_serving_cache_hits_total") > 0


def test_redis_keys_untouched_by_reads(redis_server: object) -> None:
    """A hit on the front reads nothing from Redis: it sends no command."""
    url = redis_server.url  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    body = {"entity_type": ENTITY, "ids": [11, 12], "groups": [GROUP]}
    with ServingProcess(url, env=ENV) as server:
        get(server, body)
        get(server, body)  # learned: from here the front answers
        front_hits(server, 2)
        before = client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
        before += client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)
        for _ in range(20):
            get(server, body)
        front_hits(server, 42)
        after = client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
        after += client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)
    assert after == before


def _grpc_answer(
    server: ServingProcess, request: pb.GetFeaturesRequest, key: str | None = None
) -> pb.GetFeaturesResponse:
    metadata = [("authorization", f"Bearer {key}")] if key else None
    with grpc.insecure_channel(server.grpc_target) as channel:
        answer: pb.GetFeaturesResponse = FeatureServiceStub(channel).GetFeatures(
            request, timeout=10, metadata=metadata
        )
    for row in answer.rows:
        row.ages.clear()  # whole seconds: one may turn between two answers
    return answer


GRPC_REQUESTS = [
    pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[1, 2, 3], groups=[GROUP]),
    pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[4, 4, 10_000_000, -5], groups=[GROUP]),
    pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[5], features=ALL),
]


def test_the_grpc_front_answers_hits_as_python_does(
    servers: tuple[ServingProcess, ServingProcess],
) -> None:
    native, python = servers
    doc = httpx.get(native.rest_url + "/v1/admin/cache", timeout=5).json()
    forms = set()
    for request in GRPC_REQUESTS:
        before = front_hits(native)
        answers = []
        for server in servers:
            _grpc_answer(server, request)  # loads, makes the gRPC records, teaches the form
            if server is native:
                time.sleep(0.1)  # the front's hits so far drained (every 20 ms)
                between = front_hits(native)
            answers.append(_grpc_answer(server, request))
        assert answers[0] == answers[1]
        assert len(answers[0].rows) == len(request.int_ids)
        # the entries are cached (by the REST test): the second answer is the front's, and
        # in a compact cache, once the form is known, the first too: it needs no gRPC
        # records made by Python first
        form = (tuple(request.features), tuple(request.groups))
        if doc["form"] == "compact" and form in forms:
            assert between == before + len(request.int_ids)
        forms.add(form)
        expected = between + len(request.int_ids)
        assert front_hits(native, expected) == expected
    assert metric(python, "feature_serving_cache_front_hits_total") == 0
    name = 'feature_serving_request_seconds_count{api="grpc",code="200",method="get"}'
    assert metric(native, name) == metric(python, name) > 0


def _reads(client: redis.Redis) -> int:
    """Entity reads Redis has served (HMGET and HGETALL calls)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


@pytest.mark.parametrize("form", ["answers", "compact"])
def test_a_lookup_with_misses_loads_only_them_and_the_front_answers_it(
    redis_server: object, form: str
) -> None:
    """Five cached ids and five not: the front loads the five itself (one Redis read each,
    counted as misses) and answers the lookup from the L1, REST and gRPC, as it answers the
    same lookup once every id is cached."""
    url = redis_server.url  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    env = {**ENV, "FEATURE_SERVING_CACHE_FORM": form, "FEATURE_SERVING_INVALIDATION": "off"}
    loaded = 'feature_serving_front_lookups_total{api="%s",how="hit_loaded"}'
    with ServingProcess(url, env=env) as server:
        for api, first in (("rest", 1), ("grpc", 21)):
            cached, fresh = list(range(first, first + 5)), list(range(first + 5, first + 10))

            def ask(ids: list[int], api: str = api) -> object:
                if api == "rest":
                    r = get(server, {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]})
                    assert r.status_code == 200, r.text
                    return AGES.sub(b"", r.content)
                request = pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, groups=[GROUP])
                return _grpc_answer(server, request)

            ask(cached)
            ask(cached)  # the form is learned, and (gRPC) the records made
            hits = front_hits(server, 5)
            misses = metric(server, "feature_serving_cache_misses_total")
            reads = _reads(client)
            answer = ask(cached + fresh)
            assert front_hits(server, hits + 5) == hits + 5  # the cached five, on the front
            assert metric(server, "feature_serving_cache_misses_total") == misses + 5
            assert _reads(client) == reads + 5  # the missing five, once each
            assert metric(server, loaded % api) == 1  # answered by the front after the load
            assert answer == ask(cached + fresh)  # as once every id is cached
            assert front_hits(server, hits + 15) == hits + 15
            assert metric(server, loaded % api) == 1
        # a key that holds no hash among cached ones: the handler answers, naming it, after
        # two reads that found it broken (the front's load, which stores nothing for it, and
        # Python's, which names it); then none while the fault is cached (the negative TTL)
        entity = sample.registry().entities[ENTITY]
        broken = entity_key(entity.prefix, entity.id_type, 9_999)
        client.set(broken, b"not a hash")
        reads = _reads(client)
        body = {"entity_type": ENTITY, "ids": [1, 2, 9_999], "groups": [GROUP]}
        try:
            answers = [get(server, body) for _ in range(2)]
            after = _reads(client)
        finally:
            client.delete(broken)
        for r in answers:
            assert r.status_code == 200, r.text
            assert [row["statuses"][0] for row in r.json()["results"]] == [
                "present",
                "present",
                "error",
            ]
            assert [(e["id"], e["reason"]) for e in r.json()["errors"]] == [(9_999, "wrong_type")]
        assert after == reads + 2
        assert metric(server, loaded % "rest") == 1


@pytest.mark.parametrize("single_flight", ["on", "off"])
def test_keys_a_load_does_not_keep_are_read_once(redis_server: object, single_flight: str) -> None:
    """A negative TTL of 0 keeps no entry for an id with no data: five cached ids and five
    unknown ones, the unknown five are read once (by the load the front asked for) and the
    handler answers with what that read found, without reading them again, REST and gRPC;
    with the debouncer and without it (each request reads its own misses)."""
    url = redis_server.url  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    env = {
        **ENV,
        "FEATURE_SERVING_CACHE_NEGATIVE_TTL": "0",
        "FEATURE_SERVING_INVALIDATION": "off",
        "FEATURE_SERVING_SINGLE_FLIGHT": single_flight,
    }
    with ServingProcess(url, env=env) as server:
        for api, first in (("rest", 1), ("grpc", 21)):
            cached, unknown = list(range(first, first + 5)), list(range(10_000, 10_005))

            def ask(ids: list[int], api: str = api) -> list[str]:
                if api == "rest":
                    r = get(server, {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]})
                    assert r.status_code == 200, r.text
                    return [row["statuses"][0] for row in r.json()["results"]]
                request = pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, groups=[GROUP])
                answer = _grpc_answer(server, request)
                return [pb.Status.Name(row.statuses[0]).lower() for row in answer.rows]

            ask(cached)
            ask(cached)  # the form is learned, and (gRPC) the records made
            misses = metric(server, "feature_serving_cache_misses_total")
            reads = _reads(client)
            assert ask(cached + unknown) == ["present"] * 5 + ["missing"] * 5
            assert _reads(client) == reads + 5  # the unknown five, once each
            assert metric(server, "feature_serving_cache_misses_total") == misses + 5


def test_the_grpc_front_answers_hits_only_to_a_key_that_may_read(redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    env = {
        **ENV,
        "FEATURE_SERVING_READ_KEYS": "reader-key-1",
        "FEATURE_SERVING_ADMIN_KEYS": "admin-key-1",
    }
    request = GRPC_REQUESTS[0]
    with ServingProcess(url, env=env) as server:
        _grpc_answer(server, request, "reader-key-1")
        hits = front_hits(server)
        _grpc_answer(server, request, "reader-key-1")  # the front's own
        assert front_hits(server, hits + 3) == hits + 3
        for key in (None, "wrong"):
            with pytest.raises(grpc.RpcError) as refused:
                _grpc_answer(server, request, key)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert front_hits(server) == hits + 3


def test_picked_features_over_grpc_are_answered_by_the_front_as_python_does(
    servers: tuple[ServingProcess, ServingProcess],
) -> None:
    """The front picks their records from the entries' (kept on them, or, compact, written
    for each answer)."""
    native, _ = servers
    request = pb.GetFeaturesRequest(
        entity_type=ENTITY, int_ids=[1, 2, 10_000_000], features=[ALL[-1], *ALL[:3]]
    )
    for server in servers:
        _grpc_answer(server, request)  # teaches the form; then the entries' records exist
        _grpc_answer(server, request)
    time.sleep(0.1)  # the front's hits so far drained (every 20 ms)
    hits = front_hits(native)
    answers = [_grpc_answer(server, request) for server in servers]
    assert answers[0] == answers[1]
    assert len(answers[0].rows[0].values) == 4
    assert front_hits(native, hits + 3) == hits + 3  # the native server's third answer


def test_a_compact_entry_holds_its_packed_values_only(redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    ids = list(range(N))
    per_entry = {}
    for form in ("answers", "compact"):  # the flag of `serve` (the fixture above: the variable)
        with ServingProcess(url, args=["--cache-form", form], env=ENV) as server:
            assert get(server, {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}).is_success
            _grpc_answer(
                server, pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, groups=[GROUP])
            )
            doc = httpx.get(server.rest_url + "/v1/admin/cache", timeout=5).json()
            assert doc["form"] == form
            assert doc["entries"] == N
            per_entry[form] = doc["bytes"] / N
    # an answers entry also keeps the values' JSON and gRPC records, together about twice
    # the packed values
    assert per_entry["compact"] < 0.5 * per_entry["answers"], per_entry


def test_entities_looked_up_over_grpc_keep_their_json_only_once_rest_asks(
    redis_server: object,
) -> None:
    """A gRPC lookup's misses load entries that keep the values' gRPC records alone. A REST
    lookup of them makes their JSON, which the cache counts from then on, and the next is a
    hit on the front; once the front knows the REST form, it asks Python for the JSON of
    such entries alone and answers the lookup itself. Entries the front loaded itself are
    not Python's to complete: a lookup of the other API reads them again, once, and keeps
    both."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    ids = list(range(10, 20))
    with ServingProcess(url, env={**ENV, "FEATURE_SERVING_INVALIDATION": "off"}) as server:
        request = pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, groups=[GROUP])
        _grpc_answer(server, request)  # loads
        _grpc_answer(server, request)  # teaches the form
        assert front_hits(server, len(ids)) == len(ids)
        doc = httpx.get(server.rest_url + "/v1/admin/cache", timeout=5).json()
        body = {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}
        first = get(server, body)  # Python's answer (a form not learned yet): makes the JSON
        assert first.status_code == 200, first.text
        grown = httpx.get(server.rest_url + "/v1/admin/cache", timeout=5).json()
        values = re.findall(rb'"values":(.*?),"statuses":', first.content)
        assert len(values) == len(ids)
        assert grown["entries"] == doc["entries"] == len(ids)
        assert grown["bytes"] - doc["bytes"] == sum(len(v) + BYTES_OBJECT for v in values)
        second = get(server, body)  # the front's, from the JSON now kept
        assert front_hits(server, 2 * len(ids)) == 2 * len(ids)
        assert AGES.sub(b"", second.content) == AGES.sub(b"", first.content)
        assert metric(server, "feature_serving_cache_misses_total") == len(ids)
        # both forms known: entries the front loaded for gRPC are not Python's to complete,
        # so a REST lookup of them reads them again (a miss each) and the front keeps both
        # answers from then on: the next lookups of either API are hits on the front
        more = list(range(30, 35))
        request = pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=more, groups=[GROUP])
        _grpc_answer(server, request)
        third = get(server, {**body, "ids": more})
        assert third.status_code == 200, third.text
        loaded = 'feature_serving_front_lookups_total{api="rest",how="hit_loaded"}'
        assert metric(server, loaded) == 1
        misses = len(ids) + 2 * len(more)
        assert metric(server, "feature_serving_cache_misses_total") == misses
        assert len(re.findall(rb'"statuses":\["present"', third.content)) == len(more)
        hits = front_hits(server, 2 * len(ids))
        _grpc_answer(server, request)
        assert get(server, {**body, "ids": more}).content.count(b'"present"') > 0
        assert front_hits(server, hits + 2 * len(more)) == hits + 2 * len(more)
        assert metric(server, "feature_serving_cache_misses_total") == misses


def test_feast_lookups_load_entries_without_answer_bytes(redis_server: object) -> None:
    """Feast's handler answers from the packed values: the entries its lookups load keep no
    JSON (nor gRPC records). The front answers the form's next lookups from the entries'
    JSON, made once (a load of those keys), which a REST lookup then shares."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    ids = list(range(5))
    features = [f"{GROUP}:{name}" for name in ALL]
    with ServingProcess(url, env={**ENV, "FEATURE_SERVING_INVALIDATION": "off"}) as server:

        def cache() -> dict[str, int]:
            doc: dict[str, int] = httpx.get(server.rest_url + "/v1/admin/cache").json()
            return doc

        def feast() -> bytes:
            r = httpx.post(
                server.rest_url + "/get-online-features",
                content=orjson.dumps({"entities": {"consumer_id": ids}, "features": features}),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 200, r.text
            return r.content

        first = feast()  # the handler's: it teaches the form
        bare = cache()
        assert feast() == first  # the front's, once the entries have their JSON
        grown = cache()
        rest = get(server, {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]})
        assert rest.status_code == 200, rest.text
        values = re.findall(rb'"values":(.*?),"statuses":', rest.content)
        after = cache()
        assert (after["entries"], after["bytes"]) == (grown["entries"], grown["bytes"])  # shared
        assert grown["entries"] == bare["entries"] == len(ids)
        assert grown["bytes"] - bare["bytes"] == sum(len(v) + BYTES_OBJECT for v in values)
        assert metric(server, "feature_serving_cache_misses_total") == len(ids)
        loaded = 'feature_serving_front_lookups_total{api="feast",how="hit_loaded"}'
        deadline = time.monotonic() + 5  # drained every 20 ms
        while metric(server, loaded) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(server, loaded) == 1
