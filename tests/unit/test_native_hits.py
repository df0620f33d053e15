"""The native REST front's mirror of the L1 (serving/hits.py, native/src/hits.rs), held to
Python's answers: after any sequence of cache changes (puts, pushes that drop a key,
evictions, expiry, clears) the mirror answers a lookup exactly when every entity is a fresh
entry of the cache, and then with the bytes Python's handler writes for it.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feature_store.connection import RedisTarget
from feature_store.native import native_enabled
from feature_store.registry import parse_registry
from feature_store.serving.auth import Authenticator
from feature_store.serving.cache import Entry
from feature_store.serving.config import ServingSettings
from feature_store.serving.hits import NativeHits
from feature_store.serving.rest_api import RestHandlers
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
""")
FORMS = {
    "profile": {"entity_type": "user", "groups": ["profile"]},
    "shops": {"entity_type": "shop", "features": ["open", "rating"]},
}
INT_IDS = st.integers(-3, 6)
STR_IDS = st.sampled_from(["a", "b", "é", "x y", "1"])


def _runtime() -> ServingRuntime:
    # never started: every lookup below is answered from the cache, nothing reads Redis
    settings = ServingSettings(invalidation=False, shadow_fraction=0.0, cache_max_entries=3)
    return ServingRuntime(REGISTRY, RedisTarget.parse("redis://127.0.0.1:1"), settings)


def _key(group: str, entity_id: object) -> tuple[str, bytes]:
    prefix = REGISTRY.groups[group].entity.prefix
    return group, f"{prefix}:{entity_id}".encode()


def _entry(group: str, entity_id: object, data: st.DataObject) -> Entry:
    spec_fmt = _runtime_formats[group]
    n = len(REGISTRY.groups[group].features)
    key = _key(group, entity_id)
    if data.draw(st.booleans(), "negative"):
        return Entry(key, spec_fmt, None, spec_fmt.absent_present, spec_fmt.absent_json, None)
    present = bytes(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n), "present"))
    values = [data.draw(st.integers(-(10**6), 10**6)) if p else None for p in present]
    ago = data.draw(st.sampled_from([None, 0, 5, 3599, 3601, 10**6]), "written ago")
    written = None if ago is None else int(time.time()) - ago
    return Entry(key, spec_fmt, b"raw", present, orjson.dumps(values), written)


_runtime_formats = {name: g.fmt for name, g in _runtime().reader.specs.items()}

OPS = st.sampled_from(["put", "put", "put", "discard", "expire", "clear"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_mirror_answers_exactly_the_fresh_lookups_as_python_does(data: st.DataObject) -> None:
    asyncio.run(_check(data))


async def _check(data: st.DataObject) -> None:
    runtime = _runtime()
    cache = runtime.reader.cache
    assert cache is not None
    hits = NativeHits(runtime)
    handlers = RestHandlers(runtime, Authenticator((), ()))
    handlers.learn = hits.learn
    ids = {"profile": INT_IDS, "shops": STR_IDS}
    for group, first in (("profile", 0), ("shops", "a")):  # Python teaches both forms
        cache.put(_entry(group, first, data))
        body = orjson.dumps({**FORMS[group], "ids": [first]})
        assert (await handlers.get(None, body)).status == 200
        assert hits.native.answer(body) is not None
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
        if not fresh:
            assert native is None, (body, native)
            continue
        # Python's answers (the first also teaches the form), around the mirror's: ages are
        # counted in whole seconds, and a second may turn between two of them
        before = await handlers.get(None, body)
        assert before.status == 200, before.body
        native = hits.native.answer(body)
        after = await handlers.get(None, body)
        assert native in (before.body, after.body)
        assert len(hits.native) <= len(cache)  # never an entry the cache has dropped
