"""The L1's misses loaded by the native fronts themselves (native/src/hits/load.rs) against
a server that loads them through Python (``NATIVE_LOADS=off``) and the pure-Python
reference (``FEATURE_STORE_NATIVE=off``: Python's cache, handlers and codecs alone): the
same answers over random lookups, writes, expiries and entities whose data breaks, REST and
gRPC; the fronts' entries
within the cache's bounds; their single flight; and Python adopting them (a handler's
answer, stale on error).
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import httpx
import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from feature_store import notices, sample
from feature_store.client import FeatureClient, FeatureResult, GrpcFeatureClient
from feature_store.embedded import EmbeddedRedis
from feature_store.layout import IdType, entity_key
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

GROUP, ENTITY = sample.GROUP, sample.ENTITY
N = 60  # entities written; ids up to N + 10 are asked, so some are missing
BREAKABLE = 10  # the last of them: the property test may break their stored data
ENV = {
    # an outage (the property test's) ends each server's lookup at this timeout, and opens
    # no circuit: the servers' breakers would open apart, after the failures each counted
    "FEATURE_SERVING_REDIS_TIMEOUT_MIN": "0.25",
    "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "0.25",
    "FEATURE_SERVING_BREAKER_FAILURES": "1000000",
    "FEATURE_SERVING_SHADOW_FRACTION": "0",
    "FEATURE_SERVING_WARM_START_KEYS": "0",
    "FEATURE_SERVING_CACHE_TTL": "0.5",
    "FEATURE_SERVING_CACHE_NEGATIVE_TTL": "0.5",
    "FEATURE_SERVING_CACHE_JITTER": "0",
    "FEATURE_SERVING_XFETCH_BETA": "0",
    "FEATURE_SERVING_CACHE_REFRESH_AHEAD": "0",
}
AGES = re.compile(rb'"ages":\{[^}]*\}')
ALL = [*sample.FLOATS, *sample.INTS, *sample.INT_LISTS, *sample.EMBEDDINGS]


def _cache(server: ServingProcess) -> dict[str, object]:
    doc: dict[str, object] = httpx.get(f"{server.rest_url}/v1/admin/cache", timeout=5).json()
    return doc


def _counter(server: ServingProcess, name: str) -> int:
    counters = _cache(server)["counters"]
    assert isinstance(counters, dict)
    return int(counters[name])


def _reads(url: str) -> int:
    with redis.Redis.from_url(url) as r:
        stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


def _rest(server: ServingProcess, body: dict[str, object]) -> tuple[int, bytes]:
    r = httpx.post(f"{server.rest_url}/v1/features/get", json=body, timeout=10)
    return r.status_code, AGES.sub(b"", r.content)


def _grpc_answer(server: ServingProcess, ids: list[int]) -> pb.GetFeaturesResponse:
    with grpc.insecure_channel(server.grpc_target) as channel:
        answer = FeatureServiceStub(channel).GetFeatures(
            pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, groups=[GROUP]), timeout=10
        )
    for row in answer.rows:
        row.ages.clear()  # whole seconds: one may turn between two answers
    return answer


def _grpc(server: ServingProcess, ids: list[int]) -> bytes:
    return bytes(_grpc_answer(server, ids).SerializeToString())


@pytest.fixture(scope="module")
def pair(redis_server: object) -> Iterator[tuple[ServingProcess, ServingProcess, str]]:
    """A server whose fronts load misses, and one whose misses load through Python."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    with (
        ServingProcess(url, env=ENV) as native,
        ServingProcess(url, env={**ENV, "FEATURE_SERVING_NATIVE_LOADS": "off"}) as python,
    ):
        yield native, python, url


@pytest.fixture(scope="module")
def bounded(pair: tuple[ServingProcess, ServingProcess, str]) -> Iterator[ServingProcess]:
    """A server whose fronts load misses into a cache bounded to 8 entries: most lookups
    find it full, so a new key is stored only at its second load (the doorkeeper) and the
    others answer from entries that are not kept."""
    env = {**ENV, "FEATURE_SERVING_CACHE_MAX_ENTRIES": "8"}
    with ServingProcess(pair[2], env=env) as server:
        yield server


@pytest.fixture(scope="module")
def reference(pair: tuple[ServingProcess, ServingProcess, str]) -> Iterator[ServingProcess]:
    """The pure-Python reference on the same Redis: no extension at all (its gRPC server is
    grpcio's, its answers orjson's and protobuf's)."""
    with ServingProcess(pair[2], env={**ENV, "FEATURE_STORE_NATIVE": "off"}) as python:
        yield python


lookups = st.lists(st.integers(min_value=0, max_value=N + 10), min_size=1, max_size=12)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("rest"), lookups),
        st.tuples(st.just("grpc"), lookups),
        st.tuples(
            st.just("write"),
            st.integers(min_value=0, max_value=N - BREAKABLE - 1),
            st.floats(-9, 9),
        ),
        st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.3, 0.6])),
        st.tuples(st.just("outage"), st.sampled_from(["rest", "grpc"]), lookups),
        st.tuples(
            st.just("break"),
            st.integers(min_value=N - BREAKABLE, max_value=N - 1),
            st.sampled_from(["write time", "value", "type"]),
        ),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=steps)
def test_the_fronts_loads_answer_as_pythons_do(
    pair: tuple[ServingProcess, ServingProcess, str],
    bounded: ServingProcess,
    reference: ServingProcess,
    steps: list[tuple[object, ...]],
) -> None:
    """Random lookups (ids repeated, missing, cached or expired), push writes (announced:
    every cache drops the entry), waits past the TTL, and entities whose stored data
    breaks (a write time that is not one, a value that does not decode, a string where the
    hash was; announced, so that no cache holds the entity's values from before), each
    answered as an error while the others are served: each lookup's answer is the same
    from the four servers (the fronts loading into a cache bounded to 8 entries among
    them: entries kept, evicted or not admitted), byte for byte but the ages (the
    reference's gRPC answer: the same message; grpcio and the front may order a message's
    bytes apart). (A write
    without a notice is not among the steps: the servers' entries expire apart, so they
    may answer apart meanwhile; `test_a_reload_serves_values_changed_without_notice` takes
    it.)"""
    native, python, url = pair
    broken: set[int] = set()
    servers = (native, python, bounded, reference)
    try:
        for step in steps:
            _step(step, servers, url, broken)
    finally:
        _mend(url, broken, servers)


def _step(
    step: tuple[object, ...], servers: tuple[ServingProcess, ...], url: str, broken: set[int]
) -> None:
    """One step of the property test: each lookup asked of every server and compared."""
    native, python, bounded, reference = servers
    if step[0] == "outage":
        _outage(step, servers, url)
    elif step[0] == "break":
        _, entity, how = step
        _break(url, entity, how, servers)  # type: ignore[arg-type]
        broken.add(entity)  # type: ignore[arg-type]
        for api in ("rest", "grpc"):  # asked at once, with a healthy neighbour
            _step((api, [entity, 0]), servers, url, broken)
    elif step[0] == "write":
        _, entity, value = step
        before = _notices(servers)
        written = httpx.post(
            f"{native.rest_url}/v1/features/write",
            json={"group": GROUP, "rows": [{"id": entity, "values": {"float_00": value}}]},
            timeout=10,
        )
        assert written.status_code == 200, written.text
        _applied(servers, before)  # the write's notice, which the server published
    elif step[0] == "sleep":
        time.sleep(float(step[1]))  # type: ignore[arg-type]
    elif step[0] == "rest":
        ids = list(step[1])  # type: ignore[call-overload]
        body = {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}
        answer = _rest(native, body)
        other = _rest(python, body)
        assert answer == other, (ids, answer, other, _cache(native), _cache(python))
        assert answer == _rest(bounded, body), ids
        assert answer == _rest(reference, body), ids
        if b'"error"' in answer[1]:
            event("a lookup with a broken entity")  # (--hypothesis-show-statistics)
    else:
        ids = list(step[1])  # type: ignore[call-overload]
        assert _grpc(native, ids) == _grpc(python, ids), ids
        assert _grpc(native, ids) == _grpc(bounded, ids), ids
        assert _grpc_answer(native, ids) == _grpc_answer(reference, ids), ids


def _outage(step: tuple[object, ...], servers: tuple[ServingProcess, ...], url: str) -> None:
    """A lookup asked of every server while Redis does not answer (stopped): an entity
    cached fresh is a hit, one expired is served stale, and a lookup with any other is a
    503 (or UNAVAILABLE), alike on the three unbounded servers. Whether an entry expired
    just before the lookup may differ by the milliseconds between the servers' loads, so
    stale is compared as present. The bounded server holds fewer entries: its answer is
    theirs or a failure."""
    _, api, ids = step
    pid = _redis_pid(url)
    os.kill(pid, signal.SIGSTOP)
    try:
        if api == "rest":
            body = {"entity_type": ENTITY, "ids": list(ids), "groups": [GROUP]}  # type: ignore[call-overload]
            answers = [_rest(server, body) for server in servers]
        else:
            answers = [_grpc_outage(server, list(ids)) for server in servers]  # type: ignore[call-overload]
    finally:
        os.kill(pid, signal.SIGCONT)
    alike = [_as_present(str(api), answer) for answer in answers]
    native, python, bounded, reference = alike
    assert native == python == reference, (ids, answers)
    assert bounded == native or bounded[0] != 200, (ids, answers)
    stale = alike[0] != answers[0]  # some entity served stale
    if native[0] != 200:
        event("an outage: a failure")
    else:
        event("an outage: answered from the cache" + (", some stale" if stale else ""))


def _grpc_outage(server: ServingProcess, ids: list[int]) -> tuple[int, bytes]:
    try:
        answer = _grpc_answer(server, ids)
    except grpc.RpcError as e:
        return e.code().value[0], b""  # type: ignore[attr-defined]
    return 200, bytes(answer.SerializeToString(deterministic=True))


def _as_present(api: str, answer: tuple[int, bytes]) -> tuple[int, bytes]:
    """An answer with each status "stale" read as "present"; a failure's code alone."""
    status, content = answer
    if status != 200:
        return status, b""
    if api == "rest":
        return status, content.replace(b'"stale"', b'"present"')
    message = pb.GetFeaturesResponse.FromString(content)
    for row in message.rows:
        row.statuses[:] = [pb.PRESENT if s == pb.STALE else s for s in row.statuses]
    return status, bytes(message.SerializeToString(deterministic=True))


def _redis_pid(url: str) -> int:
    with redis.Redis.from_url(url) as r:
        return int(r.info("server")["process_id"])


def _entity(entity: int) -> bytes:
    return entity_key(sample.registry().entities[ENTITY].prefix, IdType.INT, entity)


def _notices(servers: Sequence[ServingProcess]) -> list[object]:
    """The invalidation notices each server has applied so far (its cache summary's)."""
    return [_cache(server)["notices"] for server in servers]


def _applied(servers: Sequence[ServingProcess], before: list[object]) -> None:
    """Wait until every server has applied a notice since ``before``: a fixed wait was
    outrun by a busy machine, and a server still holding an entity written meanwhile
    answered it apart from the others."""
    deadline = time.monotonic() + 10
    for server, seen in zip(servers, before, strict=True):
        while _cache(server)["notices"] == seen:
            assert time.monotonic() < deadline, "a server never applied the notice"
            time.sleep(0.01)


def _announce(r: redis.Redis, entities: list[int], servers: Sequence[ServingProcess]) -> None:
    """Tell every server's cache that these entities were written (as a write would), and
    wait until each has applied the notice."""
    before = _notices(servers)
    keys = [_entity(e) for e in entities]
    r.publish(notices.CHANNEL, notices.keys_message(notices.new_origin(), GROUP, keys))
    _applied(servers, before)


def _break(url: str, entity: int, how: str, servers: Sequence[ServingProcess]) -> None:
    """Break ``entity``'s stored data one way (as test_serving_isolation plants them)."""
    group = sample.registry().groups[GROUP]
    with redis.Redis.from_url(url) as r:
        key = _entity(entity)
        if how != "type" and r.type(key) != b"hash":  # broken before: a string, not a hash
            r.delete(key)
            with FeatureStore.connect(url, sample.registry(), notify=False) as store:
                store.write(GROUP, [row for row in sample.rows(N) if row[0] == entity])
        if how == "write time":
            r.hset(key, group.freshness_field, b"garbage")
        elif how == "value":
            r.hset(key, group.feature("int_0").field, b"x1")
        else:
            r.delete(key)
            r.set(key, b"not a hash")
        _announce(r, [entity], servers)


def _mend(url: str, entities: set[int], servers: Sequence[ServingProcess]) -> None:
    """Write the broken entities' data again (announced), for the next example."""
    if not entities:
        return
    with redis.Redis.from_url(url) as r:
        r.delete(*(_entity(e) for e in entities))
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, [row for row in sample.rows(N) if row[0] in entities])
    with redis.Redis.from_url(url) as r:
        _announce(r, sorted(entities), servers)


def _copy(url: str, entity: int, source: int) -> None:
    """Make ``entity``'s hash ``source``'s in Redis, with no notice to the caches."""
    prefix = sample.registry().entities[ENTITY].prefix
    with redis.Redis.from_url(url) as r:
        r.hset(
            entity_key(prefix, IdType.INT, entity),
            mapping=r.hgetall(entity_key(prefix, IdType.INT, source)),
        )


@pytest.mark.parametrize("api", ["rest", "grpc"])
def test_a_reload_serves_values_changed_without_notice(
    pair: tuple[ServingProcess, ServingProcess, str], api: str
) -> None:
    """An entry the front loaded, expired, is read again: most reloads find the values it
    holds (the entry is kept as it is), but one whose values changed in Redis with no
    notice (another writer, a notice lost) must answer the new values, as Python's does."""
    native, python, url = pair
    entity, source = N - 1, N - 2
    _copy(url, entity, N - 3)
    time.sleep(0.6)  # past the TTL: what the caches held of it expires

    def answer(server: ServingProcess) -> bytes:
        if api == "grpc":
            return _grpc(server, [entity])
        return _rest(server, {"entity_type": ENTITY, "ids": [entity], "groups": [GROUP]})[1]

    before = answer(native)
    assert answer(native) == before  # cached
    time.sleep(0.6)
    assert answer(native) == before  # reloaded, the same values: kept
    _copy(url, entity, source)
    time.sleep(0.6)
    after = answer(native)
    assert after != before
    assert after == answer(python)


def test_misses_are_loaded_by_the_fronts(pair: tuple[ServingProcess, ServingProcess, str]) -> None:
    """Once the form is known, a lookup of ten cold entities is one Redis read each, and
    answered by the front (counted as loads there, not by Python)."""
    native, _, url = pair
    body = {"entity_type": ENTITY, "ids": [1, 2], "groups": [GROUP]}
    _rest(native, body)  # the form learned
    time.sleep(0.6)  # every entry expired
    loaded, reads = _counter(native, "keys_loaded"), _reads(url)
    ids = list(range(30, 40))
    status, _ = _rest(native, {**body, "ids": ids})
    assert status == 200
    assert _reads(url) == reads + len(ids)
    deadline = time.monotonic() + 5  # the fronts' counters are drained every 20 ms
    while _counter(native, "keys_loaded") < loaded + len(ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _counter(native, "keys_loaded") == loaded + len(ids)


def test_concurrent_misses_of_one_key_are_one_read(redis_server: object) -> None:
    """Forty threads ask for the same ten cold entities at once, over and over, on a TTL of
    0.5 s: Redis reads each about once per TTL, not once per request."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    body = {"entity_type": ENTITY, "ids": list(range(10)), "groups": [GROUP]}
    with ServingProcess(url, env=ENV, grpc=False) as server:
        _rest(server, body)  # the form learned
        reads = _reads(url)
        requests = 0
        lock = threading.Lock()
        end = time.monotonic() + 2.0

        def ask() -> None:
            nonlocal requests
            with httpx.Client(timeout=10) as client:
                while time.monotonic() < end:
                    r = client.post(f"{server.rest_url}/v1/features/get", json=body)
                    assert r.status_code == 200
                    with lock:
                        requests += 1

        threads = [threading.Thread(target=ask) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        read = _reads(url) - reads
    windows = 2.0 / 0.5 + 1  # TTL windows in the run, and the one it started in
    assert requests > 10 * windows  # many more requests than reads
    assert read <= 10 * windows * 1.2, (read, requests)


@pytest.mark.parametrize("api", ["rest", "grpc"])
def test_a_hot_entry_is_refreshed_ahead_by_the_front(redis_server: object, api: str) -> None:
    """Entities the front loaded, asked every 50 ms for three TTLs with refresh ahead on:
    each is read again by the front inside its refresh window, so no lookup misses after
    the first load, and the entries stay the front's own (none handed to Python, which
    refreshed them before and held them from then on): one read per key per refresh."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    ttl, ahead = 1.0, 0.2  # refreshed 0.8 s after each load
    env = {
        **ENV,
        "FEATURE_SERVING_CACHE_TTL": str(ttl),
        "FEATURE_SERVING_CACHE_REFRESH_AHEAD": str(ahead),
    }
    ids = list(range(5))
    body = {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}
    with ServingProcess(url, env=env, grpc=api == "grpc") as server:

        def ask() -> None:
            if api == "grpc":
                _grpc(server, ids)
            else:
                assert _rest(server, body)[0] == 200

        ask()  # the form learned (Python's answer, its entries)
        time.sleep(ttl + 0.2)  # expired: the next lookup's load is the front's
        ask()
        time.sleep(0.1)  # the fronts' counters are drained every 20 ms
        before, reads = _cache(server), _reads(url)
        end = time.monotonic() + 3 * ttl
        while time.monotonic() < end:
            ask()
            time.sleep(0.05)
        time.sleep(0.1)
        after, read = _cache(server), _reads(url) - reads
    counters, counted = after["counters"], before["counters"]
    assert isinstance(counters, dict)
    assert isinstance(counted, dict)
    assert counters["misses"] == counted["misses"]  # every lookup a hit
    refreshed = counters["early_refreshes"] - counted["early_refreshes"]
    assert refreshed >= 2 * len(ids), counters
    assert after["front_entries"] == len(ids), after  # not one handed to Python
    # one read per key per refresh (0.8 s), and the one begun
    assert read <= len(ids) * (3 * ttl / (ttl * (1 - ahead)) + 1), read


def test_the_fronts_entries_stay_within_the_bounds(redis_server: object) -> None:
    """A cache bounded to 100 entries: lookups of 600 entities leave at most 100; the rest
    were evicted, or, loaded for the first time while the cache was full, never stored
    (the admission), each counted."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(600))
    env = {**ENV, "FEATURE_SERVING_CACHE_TTL": "60", "FEATURE_SERVING_CACHE_MAX_ENTRIES": "100"}
    with ServingProcess(url, env=env, grpc=False) as server:
        rng = random.Random(5)
        for _ in range(60):
            ids = rng.sample(range(600), 10)
            assert _rest(server, {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]})[0] == 200
        time.sleep(0.1)  # drained
        doc = _cache(server)
        assert isinstance(doc["entries"], int)
        assert doc["entries"] <= 100
        kept_out = _counter(server, "evictions") + _counter(server, "not_admitted")
        assert kept_out >= _counter(server, "keys_loaded") - 100 > 0
        assert _counter(server, "not_admitted") > 0


def test_a_bound_smaller_than_the_loads_in_flight_still_reads_each_miss_once(
    redis_server: object,
) -> None:
    """A cache bounded to 20 entries, eight threads looking up 10 random entities of 600 at
    once (80 keys in flight): each lookup's load is answered from before the next evicts it,
    so each missed entity is read from Redis once, not again by Python's path behind it."""
    url = redis_server.url  # type: ignore[attr-defined]
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(GROUP, sample.rows(600))
    env = {**ENV, "FEATURE_SERVING_CACHE_TTL": "60", "FEATURE_SERVING_CACHE_MAX_ENTRIES": "20"}
    with ServingProcess(url, env=env, grpc=False) as server:
        _rest(server, {"entity_type": ENTITY, "ids": [0], "groups": [GROUP]})  # the form
        reads = _reads(url)

        def ask(seed: int) -> None:
            rng = random.Random(seed)
            with httpx.Client(timeout=10) as client:
                for _ in range(60):
                    ids = rng.sample(range(600), 10)
                    body = {"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}
                    r = client.post(f"{server.rest_url}/v1/features/get", json=body)
                    assert r.status_code == 200

        threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        read = _reads(url) - reads
    looked_up = 8 * 60 * 10
    assert read <= looked_up * 1.05, (read, looked_up)  # Python's path behind: about 2x


def test_python_adopts_the_fronts_entries_when_redis_is_down(tmp_path: Path) -> None:
    """Entries the front loaded are served stale by Python's handler (a form the front has
    not learned: gRPC here) once Redis is gone, as Python's own entries are."""
    with EmbeddedRedis(tmp_path / "redis", persistence=True) as own:
        with FeatureStore.connect(own.url, sample.registry()) as store:
            store.write(GROUP, sample.rows(20))
        env = {**ENV, "FEATURE_SERVING_CACHE_TTL": "1", "FEATURE_SERVING_INVALIDATION": "off"}
        with ServingProcess(own.url, env=env) as server:
            body = {"entity_type": ENTITY, "ids": [1], "groups": [GROUP]}
            _rest(server, body)  # the form learned
            ids = list(range(5, 15))
            assert _rest(server, {**body, "ids": ids})[0] == 200  # loaded by the front
            time.sleep(1.2)  # expired, kept for stale on error
            own.kill()
            with GrpcFeatureClient(server.grpc_target, timeout=5) as client:
                _all_stale(client.get(ENTITY, ids, groups=[GROUP]), ids)


def _all_stale(answer: FeatureResult, ids: list[int]) -> None:
    """Every entity of ``answer`` served stale, with the values it was written with."""
    statuses = [{s.value for s in row.statuses} for row in answer.rows]
    assert statuses == [{"stale"}] * len(ids)
    for i, row in zip(ids, answer.rows, strict=True):
        assert row.values[0] == sample.features(i)["float_00"]


def test_missed_invalidations_keep_the_fronts_entries_for_stale_on_error(
    tmp_path: Path,
) -> None:
    """When the invalidation subscription drops, every entry is expired, not dropped: it
    reloads on its next use, and if Redis is gone by then it is still served stale, the
    entries the front loaded as Python's are."""
    with EmbeddedRedis(tmp_path / "redis", persistence=True) as own:
        with FeatureStore.connect(own.url, sample.registry()) as store:
            store.write(GROUP, sample.rows(20))
        env = {
            **ENV,
            "FEATURE_SERVING_CACHE_TTL": "600",
            "FEATURE_SERVING_REDIS_TIMEOUT_MIN": "1",  # the front's loads are its own
            "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "1",
        }
        with ServingProcess(own.url, env=env, grpc=False) as server:
            body = {"entity_type": ENTITY, "ids": [1], "groups": [GROUP]}
            _rest(server, body)  # the form learned
            ids = list(range(5, 15))
            assert _rest(server, {**body, "ids": ids})[0] == 200
            assert _cache(server)["front_entries"] == len(ids)
            with redis.Redis.from_url(own.url) as r:
                assert r.client_kill_filter(_type="pubsub") == 1
            gaps = 'feature_serving_invalidation_gaps_total{kind="error"} 1.0'
            deadline = time.monotonic() + 10
            while gaps not in httpx.get(f"{server.rest_url}/metrics").text:
                assert time.monotonic() < deadline, "the subscription's loss was not seen"
                time.sleep(0.05)
            time.sleep(1.0)  # subscribed again (0.2 s later): every entry expired
            assert _cache(server)["front_entries"] == len(ids)  # kept, for stale on error
            own.kill()
            with FeatureClient(server.rest_url, timeout=5) as client:
                _all_stale(client.get(ENTITY, ids, groups=[GROUP]), ids)


def test_a_connection_closed_under_the_front_is_not_an_outage(redis_url: str) -> None:
    """The front's connections closed by Redis (a restart, a client kill), Redis up: a
    lookup of expired entries is read again, as Python's path would (which opens a new
    connection), not answered stale as if Redis were down."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(20))
    with ServingProcess(redis_url, env=ENV, grpc=False) as server:
        body = {"entity_type": ENTITY, "ids": [1], "groups": [GROUP]}
        _rest(server, body)  # the form learned
        ids = list(range(5, 15))
        assert _rest(server, {**body, "ids": ids})[0] == 200
        assert _cache(server)["front_entries"] == len(ids)
        time.sleep(0.6)  # expired (TTL 0.5 s), kept for stale on error
        with redis.Redis.from_url(redis_url) as r:
            assert r.client_kill_filter(_type="normal", skipme=True) > 0
        with FeatureClient(server.rest_url, timeout=5) as client:
            answer = client.get(ENTITY, ids, groups=[GROUP])
        assert [{s.value for s in row.statuses} for row in answer.rows] == [{"present"}] * 10


def test_a_restart_warms_the_entries_the_fronts_loaded(redis_url: str) -> None:
    """The hot-key snapshot taken at stop holds the entries the front loaded itself: a new
    instance loads them before it serves, and answers them without a Redis read."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(N))
    env = {
        **ENV,
        "FEATURE_SERVING_CACHE_TTL": "600",
        "FEATURE_SERVING_WARM_START_KEYS": "1000",
        "FEATURE_SERVING_WARM_SNAPSHOT_INTERVAL": "0",
    }
    body = {"entity_type": ENTITY, "ids": [0], "groups": [GROUP]}
    ids = list(range(10, 50))
    with ServingProcess(redis_url, env=env, grpc=False) as first:
        _rest(first, body)  # Python's answer: the form learned
        assert _rest(first, {**body, "ids": ids})[0] == 200  # loaded by the front
    with ServingProcess(redis_url, env=env, grpc=False) as second:
        assert _counter(second, "warm_loaded") == len(ids) + 1
        reads = _reads(redis_url)
        _rest(second, body)
        assert _rest(second, {**body, "ids": ids})[0] == 200
        assert _reads(redis_url) == reads  # every one a hit
