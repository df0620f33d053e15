"""The native fronts' answers from the worker's L1 (serving/fronts/hits.py,
native/src/hits/), held to Python's: after any sequence of cache changes (puts, pushes
that drop a key, evictions, expiry, clears) a front answers a lookup exactly when every
entity is a fresh entry with its API's answer bytes made (unless the cache is compact: an
entry loaded for a REST answer has its JSON, one loaded for gRPC its records, and the other
API's are made by its first answer), and then with the bytes Python's handlers write for it,
REST and gRPC, in either cache form; a lookup of some of a group's features likewise, and
Feast's lookups (their column-shaped answers) from the same entries; and lookups over
several groups of one entity, REST and gRPC.
"""

from __future__ import annotations

import asyncio
import random
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feature_store.connection import RedisTarget
from feature_store.layout import encode_timestamp
from feature_store.native import FEAST, GRPC, REST, native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.registry import parse_registry
from feature_store.serving.api.feast_api import LOOKUP, FeastFront, feast_routes
from feature_store.serving.api.grpc_server import FeatureServicer
from feature_store.serving.api.rest_api import RestHandlers
from feature_store.serving.auth import Authenticator
from feature_store.serving.config import ServingSettings
from feature_store.serving.fronts.hits import NativeHits
from feature_store.serving.l1.cache import Entry, LRUCache
from feature_store.serving.runtime import ServingRuntime

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

REGISTRY = parse_registry("""
version: 1
entities:
  user:
    prefix: u
    id_type: int
    ttl: 7d
  shop:
    prefix: s
    id_type: string
    ttl: 7d
feature_groups:
  profile:
    entity: user
    max_age: 1h
    features:
      a: float
      b: int
      c: int_list
  shops:
    entity: shop
    features:
      open: bool
      rating: float
      codes: int_list
  visits:
    entity: user
    max_age: 1d
    features:
      n: int
      f: float
""")
FORMS = {
    "profile": {"entity_type": "user", "groups": ["profile"]},
    "shops": {"entity_type": "shop", "features": ["open", "rating", "codes"]},
}
# forms of some of a group's features: their values picked from the entries'
PICKED = {
    "profile": {"entity_type": "user", "features": ["c", "a"]},
    "shops": {"entity_type": "shop", "features": ["codes", "codes", "open"]},  # a repeat
}
# Feast's forms: its column-shaped answer, of all of a group's features or some
FEAST_FORMS = {
    "profile": {"features": ["profile:c", "profile:a", "profile:c"]},
    "shops": {
        "features": ["shops:open", "shops:rating", "shops:codes"],
        "full_feature_names": True,
    },
}
INT_IDS = st.integers(-3, 6)
STR_IDS = st.sampled_from(["a", "b", "é", "x y", "1"])


def _runtime(form: str = "answers") -> ServingRuntime:
    # never started: every lookup below is answered from the cache, nothing reads Redis
    settings = ServingSettings(
        invalidation=False, shadow_fraction=0.0, cache_max_entries=3, cache_form=form
    )
    return ServingRuntime(REGISTRY, RedisTarget.parse("redis://127.0.0.1:1"), settings)


def _key(group: str, entity_id: object) -> tuple[str, bytes]:
    prefix = REGISTRY.groups[group].entity.prefix
    return group, f"{prefix}:{entity_id}".encode()


VALUES = {
    "float": st.floats(allow_nan=False, width=32),
    "int": st.integers(-(2**63), 2**63 - 1),
    "int_list": st.lists(st.integers(-(2**40), 2**40), max_size=5),
    "bool": st.booleans(),
}


def _entry(group: str, entity_id: object, data: st.DataObject) -> Entry:
    """An entry as a read of the stored values makes it (``GroupSpec.entry``), for a REST
    or a gRPC answer, or bare (for an answer from the packed values: no answer bytes)."""
    spec = _specs[group]
    key = _key(group, entity_id)
    form = data.draw(st.sampled_from(["rest", "grpc", "bare"]), "loaded for")
    proto, bare = form == "grpc", form == "bare"
    if data.draw(st.booleans(), "negative"):
        return spec.entry(key, [None] * len(spec.fields), proto=proto, bare=bare)
    stored = []
    for f in spec.group.features:
        value = data.draw(st.none() | VALUES[f.type.value], f.name)
        stored.append(None if value is None else f.codec.encode(value))
    # None: no write time stored (values written before write times were kept)
    ago = data.draw(st.sampled_from([None, 0, 5, 3599, 3601, 10**6]), "written ago")
    written = None if ago is None else encode_timestamp(int(time.time()) - ago)
    return spec.entry(key, [*stored, written], proto=proto, bare=bare)


_specs = _runtime().reader.specs


def _grpc_request(group: str, ids: list[object], forms: dict[str, dict] = FORMS) -> bytes:  # type: ignore[type-arg]
    form = forms[group]
    request = pb.GetFeaturesRequest(
        entity_type=str(form["entity_type"]),
        features=form.get("features", []),
        groups=form.get("groups", []),
    )
    if group == "profile":
        request.int_ids.extend(ids)  # type: ignore[arg-type]
    else:
        request.string_ids.extend(ids)  # type: ignore[arg-type]
    return request.SerializeToString()


def _feast_request(group: str, ids: list[object]) -> bytes:
    join_key = REGISTRY.groups[group].entity.join_key
    return orjson.dumps({**FEAST_FORMS[group], "entities": {join_key: ids}})


OPS = st.sampled_from(["put", "put", "put", "discard", "expire", "clear"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fronts_answer_exactly_the_fresh_lookups_as_python_does(data: st.DataObject) -> None:
    asyncio.run(_check(data))


def _serving(
    data: st.DataObject,
) -> tuple[bool, ServingRuntime, LRUCache, NativeHits, RestHandlers, FeatureServicer]:
    """A worker whose cache is compact or not (drawn: entries hold their packed values
    only), its fronts' lookups, and its REST and gRPC handlers, which teach them forms."""
    compact = data.draw(st.booleans(), "compact")
    runtime = _runtime("compact" if compact else "answers")
    cache = runtime.reader.cache
    assert cache is not None
    hits = NativeHits(runtime)
    handlers = RestHandlers(runtime, Authenticator((), ()))
    handlers.learn = hits.learner(REST)
    servicer = FeatureServicer(runtime)
    servicer.learn = hits.learner(GRPC)
    return compact, runtime, cache, hits, handlers, servicer


async def _check(data: st.DataObject) -> None:
    compact, runtime, cache, hits, handlers, servicer = _serving(data)
    auth = Authenticator((), ())
    feast = feast_routes(runtime, auth, FeastFront(learn=hits.learner(FEAST)))[LOOKUP].handler
    ids = {"profile": INT_IDS, "shops": STR_IDS}
    for group, first in (("profile", 0), ("shops", "a")):  # Python teaches the forms
        cache.put(_entry(group, first, data))
        body = orjson.dumps({**FORMS[group], "ids": [first]})
        assert (await handlers.get(None, body)).status == 200
        assert hits.native.answer(body) is not None
        message = _grpc_request(group, [first])
        await servicer.answer(pb.GetFeaturesRequest.FromString(message), None, 0.0)
        assert hits.native.answer(message, grpc=True) is not None
        picked = orjson.dumps({**PICKED[group], "ids": [first]})
        assert (await handlers.get(None, picked)).status == 200
        assert hits.native.answer(picked) is not None
        message = _grpc_request(group, [first], PICKED)
        await servicer.answer(pb.GetFeaturesRequest.FromString(message), None, 0.0)
        assert hits.native.answer(message, grpc=True) is not None
        feast_body = _feast_request(group, [first])
        assert (await feast(None, feast_body)).status == 200
        assert hits.native.answer(feast_body, feast=True) is not None
    cache.clear()
    for _ in range(data.draw(st.integers(1, 25), "steps")):
        group = data.draw(st.sampled_from(sorted(FORMS)), "group")
        op = data.draw(OPS, "op")
        if op == "put":
            entity_id = data.draw(ids[group], "id")
            cache.put(_entry(group, entity_id, data))
        elif op == "discard":
            cache.discard(_key(group, data.draw(ids[group], "id")))
        elif op == "expire":
            cache.expire_all()
        else:
            cache.clear()
        # a lookup of this group's form
        wanted = data.draw(st.lists(ids[group], min_size=1, max_size=4), "lookup")
        body = orjson.dumps({**FORMS[group], "ids": wanted})
        now = time.monotonic()
        fresh = all(
            (e := cache.peek(_key(group, i))) is not None and now < e.expires_at for i in wanted
        )
        native = hits.native.answer(body)
        message = _grpc_request(group, wanted)
        rest_missing = _unfresh(hits, group, wanted, now, grpc=False)
        grpc_missing = _unfresh(hits, group, wanted, now, grpc=True)
        assert hits.native.missing(body) == (rest_missing or None)
        assert hits.native.missing(message, grpc=True) == (grpc_missing or None)
        picked = orjson.dumps({**PICKED[group], "ids": wanted})
        grpc_picked = _grpc_request(group, wanted, PICKED)
        feast_body = _feast_request(group, wanted)
        assert hits.native.missing(feast_body, feast=True) == (rest_missing or None)
        if not fresh:
            assert native is None, (body, native)
            assert hits.native.answer(feast_body, feast=True) is None
            assert hits.native.answer(picked) is None
            assert hits.native.answer(grpc_picked, grpc=True) is None
            assert hits.native.answer(message, grpc=True) is None
            assert hits.native.replay(body, rest_missing) is None  # still not there
            continue
        # gRPC: the records are made by the first gRPC answer from an entry, not before;
        # a compact entry keeps none, and the front writes them for each answer
        made = compact or all(cache.peek(_key(group, i)).wire is not None for i in wanted)  # type: ignore[union-attr]
        grpc_native = hits.native.answer(message, grpc=True)
        assert (grpc_native is not None) == made
        request = pb.GetFeaturesRequest.FromString(message)
        grpc_before = await servicer.answer(request, None, 0.0)
        grpc_native = hits.native.answer(message, grpc=True)
        grpc_after = await servicer.answer(request, None, 0.0)
        assert grpc_native in (grpc_before, grpc_after)
        # some of the group's features, picked from the same entries' records
        made = compact or all(cache.peek(_key(group, i)).wire is not None for i in wanted)  # type: ignore[union-attr]
        request = pb.GetFeaturesRequest.FromString(grpc_picked)
        grpc_before = await servicer.answer(request, None, 0.0)
        grpc_native = hits.native.answer(grpc_picked, grpc=True)
        grpc_after = await servicer.answer(request, None, 0.0)
        assert (grpc_native is not None) == made
        if grpc_native is not None:
            assert grpc_native in (grpc_before, grpc_after)
        # REST likewise: an entry loaded for gRPC gets its JSON from the first REST answer
        made = compact or all(cache.peek(_key(group, i)).json is not None for i in wanted)  # type: ignore[union-attr]
        assert (native is not None) == made
        # Python's answers (the first also teaches the form), around the front's: ages are
        # counted in whole seconds, and a second may turn between two of them
        before = await handlers.get(None, body)
        assert before.status == 200, before.body
        native = hits.native.answer(body)
        # the answer once Python has loaded some of the keys: the same bytes
        replayed = hits.native.replay(body, [hits.tags[group] + _key(group, wanted[-1])[1]])
        after = await handlers.get(None, body)
        assert native in (before.body, after.body)
        assert replayed in (before.body, after.body)
        # some of the group's features, picked from the same entries
        made = compact or all(cache.peek(_key(group, i)).json is not None for i in wanted)  # type: ignore[union-attr]
        before = await handlers.get(None, picked)
        native = hits.native.answer(picked)
        after = await handlers.get(None, picked)
        assert (native is not None) == made
        if native is not None:
            assert native in (before.body, after.body)
        # Feast's columns, from the same entries' JSON
        made = compact or all(cache.peek(_key(group, i)).json is not None for i in wanted)  # type: ignore[union-attr]
        before = await feast(None, feast_body)
        native = hits.native.answer(feast_body, feast=True)
        after = await feast(None, feast_body)
        assert before.status == 200, before.body
        assert (native is not None) == made
        if native is not None:
            assert native in (before.body, after.body)


def _unfresh(
    hits: NativeHits, group: str, wanted: list[object], now: float, *, grpc: bool
) -> list[bytes]:
    """The keys the front asks Python to load for a lookup: missing, expired, or (an entry
    that keeps its answers) without its API's answer bytes yet."""
    keys = set()
    for i in wanted:
        key = _key(group, i)
        e = hits.cache.peek(key)
        unmade = (
            hits.cache.keep_answers
            and e is not None
            and (e.wire is None if grpc else e.json is None)
        )
        if e is None or now >= e.expires_at or unmade:
            keys.add(hits.tags[group] + key[1])
    return sorted(keys)


class _Draw(random.Random):
    """Every draw is 0.99: XFetch's -ln(1 - u) is 4.6 where the cache draws, and a draw
    on a hit (``should_refresh_early``: -ln u = 0.01) says no."""

    def random(self) -> float:
        return 0.99


@pytest.mark.parametrize(("cost", "refreshed"), [(3.0, 1), (1.0, 0)])
def test_a_noted_entry_is_refreshed_at_the_window_drawn_when_it_was_stored(
    cost: float, refreshed: int
) -> None:
    """Refresh ahead off, XFetch on: the cache draws the entry's window once, when it is
    stored (cost x 4.6 here: 13.8 s of a 10 s TTL, noted at its first hit; 4.6 s, not
    yet), and a note is a refresh. Drawn again on the note, XFetch would say no (0.01 x
    cost of a 10 s lifetime) and the entry would expire unrefreshed, never noted again."""

    async def run() -> int:
        settings = ServingSettings(
            invalidation=False, cache_ttl=10.0, cache_jitter=0.0, cache_refresh_ahead=0.0
        )
        runtime = ServingRuntime(REGISTRY, RedisTarget.parse("redis://127.0.0.1:1"), settings)
        assert runtime.reader.refresher is not None
        runtime.reader.refresher.rng = _Draw()  # the policy's draws, the cache's included
        cache = runtime.reader.cache
        assert cache is not None
        hits = NativeHits(runtime)
        handlers = RestHandlers(runtime, Authenticator((), ()))
        handlers.learn = hits.learner(REST)
        spec = _specs["profile"]
        entry = spec.entry(
            _key("profile", 1), [b"1.5", b"2", None, encode_timestamp(int(time.time()))]
        )
        entry.cost = cost
        cache.put(entry)
        body = orjson.dumps({**FORMS["profile"], "ids": [1]})
        assert (await handlers.get(None, body)).status == 200  # Python teaches the form
        for _ in range(3):
            assert hits.native.answer(body) is not None  # the front's hits
        hits.drain()
        return cache.stats.early_refreshes

    assert asyncio.run(run()) == refreshed


def test_an_entry_newer_than_a_batch_write_is_still_refreshed_ahead() -> None:
    """A batch write's announcement makes the fronts note its group's next hits; an entry
    read after the write is not reloaded then, and its note for refresh ahead, spent on the
    announcement, is armed again: hit inside its window, it is refreshed."""

    async def run() -> tuple[int, int]:
        settings = ServingSettings(
            invalidation=False, cache_ttl=2.0, cache_jitter=0.0, cache_refresh_ahead=0.5
        )
        runtime = ServingRuntime(REGISTRY, RedisTarget.parse("redis://127.0.0.1:1"), settings)
        reader = runtime.reader
        cache = reader.cache
        assert cache is not None
        hits = NativeHits(runtime)
        handlers = RestHandlers(runtime, Authenticator((), ()))
        handlers.learn = hits.learner(REST)
        entry = _specs["profile"].entry(
            _key("profile", 1), [b"1.5", b"2", None, encode_timestamp(int(time.time()))]
        )
        cache.put(entry)
        body = orjson.dumps({**FORMS["profile"], "ids": [1]})
        assert (await handlers.get(None, body)).status == 200  # Python teaches the form
        reader.new_generation("profile", time.time() - 60)  # a write before the entry's read
        assert hits.native.answer(body) is not None  # noted: the announcement
        hits.drain()
        announced = cache.stats.generation_refreshes + cache.stats.early_refreshes
        await asyncio.sleep(1.2)  # inside the last half of its 2 s lifetime
        assert hits.native.answer(body) is not None  # noted again: refresh ahead
        hits.drain()
        await reader.close()
        return announced, cache.stats.early_refreshes

    assert asyncio.run(run()) == (0, 1)


@pytest.mark.parametrize("ttl", [1e20, float("inf")])
def test_a_lifetime_past_the_clocks_range_is_a_long_one(ttl: float) -> None:
    """Settings refuse such TTLs; the cache, handed one anyway, holds the entry fresh
    (a year) instead of panicking on the Duration's overflow (1e20) or treating it as
    already expired (inf)."""

    async def run() -> bool:
        settings = ServingSettings(invalidation=False, cache_ttl=ttl, cache_jitter=0.0)
        runtime = ServingRuntime(REGISTRY, RedisTarget.parse("redis://127.0.0.1:1"), settings)
        cache = runtime.reader.cache
        assert cache is not None
        hits = NativeHits(runtime)
        handlers = RestHandlers(runtime, Authenticator((), ()))
        handlers.learn = hits.learner(REST)
        entry = _specs["profile"].entry(
            _key("profile", 1), [b"1.5", b"2", None, encode_timestamp(int(time.time()))]
        )
        cache.put(entry)
        body = orjson.dumps({**FORMS["profile"], "ids": [1]})
        assert (await handlers.get(None, body)).status == 200  # Python teaches the form
        answered = hits.native.answer(body) is not None
        await runtime.reader.close()
        return answered

    assert asyncio.run(run())


# forms over both of the user's groups: their features interleaved (written from each
# group's cells), and the groups' in turn (each row written as its entries come): all the
# entity's features, both groups named, some of each group's
SEVERAL = {
    "interleaved": {"entity_type": "user", "features": ["n", "c", "profile:a", "visits:f", "b"]},
    "all": {"entity_type": "user"},
    "groups": {"entity_type": "user", "groups": ["visits", "profile"]},
    "picked": {"entity_type": "user", "features": ["c", "a", "visits:f"]},
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lookups_over_several_groups_are_answered_as_python_does(data: st.DataObject) -> None:
    asyncio.run(_check_several(data))


async def _check_several(data: st.DataObject) -> None:
    """A lookup over two groups is answered when every entity has a fresh entry of each
    (with its API's answer bytes, unless compact), with the bytes Python's handlers write:
    each group's statuses and age, a group the entity lacks, values in the request's order."""
    compact, _, cache, hits, handlers, servicer = _serving(data)
    form = SEVERAL[data.draw(st.sampled_from(sorted(SEVERAL)), "form")]
    groups = ("profile", "visits")
    for group in groups:  # Python teaches the form
        cache.put(_entry(group, 0, data))
    body = orjson.dumps({**form, "ids": [0]})
    assert (await handlers.get(None, body)).status == 200
    message = _grpc_request("profile", [0], {"profile": form})
    await servicer.answer(pb.GetFeaturesRequest.FromString(message), None, 0.0)
    for _ in range(data.draw(st.integers(1, 12), "steps")):
        for group in groups:
            if data.draw(st.booleans(), f"put {group}"):
                cache.put(_entry(group, data.draw(st.integers(0, 2), "id"), data))
        wanted = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=3), "lookup")
        body = orjson.dumps({**form, "ids": wanted})
        message = _grpc_request("profile", wanted, {"profile": form})
        now = time.monotonic()
        entries = [cache.peek(_key(g, i)) for g in groups for i in wanted]
        if not all(e is not None and now < e.expires_at for e in entries):
            # Python would read Redis (none here): the front leaves the lookup to it
            assert hits.native.answer(body) is None
            assert hits.native.answer(message, grpc=True) is None
            continue
        for api, made in (("rest", "json"), ("grpc", "wire")):
            ready = compact or all(getattr(e, made) is not None for e in entries)
            if api == "rest":
                before = (await handlers.get(None, body)).body
                native = hits.native.answer(body)
                after = (await handlers.get(None, body)).body
            else:
                request = pb.GetFeaturesRequest.FromString(message)
                before = await servicer.answer(request, None, 0.0)
                native = hits.native.answer(message, grpc=True)
                after = await servicer.answer(request, None, 0.0)
            assert (native is not None) == ready, api
            if native is not None:
                assert native in (before, after), api
