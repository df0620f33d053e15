"""The L1 in the extension (``NativeCache``) held to its pure-Python reference (``LRUCache``):
after any sequence of stores (values, missing entities, broken ones; a negative TTL of 0),
answer bytes made on first use, invalidations, missed notices (expire all) and clears, both
hold the same keys, each with the same values, answer bytes, write time, fault and
lifetime, and serve the same entries stale; and under small bounds the native one stays
within them, holding only the last entry stored for each key it keeps."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.batch import Fault, FaultReason
from feature_store.native import GroupFormat, native_enabled
from feature_store.serialization import FeatureType, codec_for
from feature_store.serving.l1.cache import CacheKey, Entry, L1Store, LRUCache

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

FMT = GroupFormat(
    [codec_for(FeatureType.FLOAT), codec_for(FeatureType.INT), codec_for(FeatureType.EMBEDDING, 4)]
)
GROUPS = ("a", "b")
SETTINGS: dict[str, float] = {"ttl": 30.0, "jitter": 0.0, "max_stale": 60.0}


def _stores(
    negative_ttl: float, keep_answers: bool, max_entries: int = 10_000, max_bytes: int = 1 << 30
) -> tuple[L1Store, L1Store]:
    from feature_store.serving.l1.native_cache import NativeCache

    bounds = {"max_bytes": max_bytes, "max_entries": max_entries, "negative_ttl": negative_ttl}
    native = NativeCache(
        dict.fromkeys(GROUPS, FMT), keep_answers=keep_answers, **bounds, **SETTINGS
    )  # type: ignore[arg-type]
    reference = LRUCache(keep_answers=keep_answers, rng=random.Random(1), **bounds, **SETTINGS)  # type: ignore[arg-type]
    return native, reference


KEYS = st.tuples(st.sampled_from(GROUPS), st.sampled_from([b"c:1", b"c:2", b"c:3", b"c:44"]))
VALUES = st.tuples(
    st.none() | st.floats(allow_nan=False, width=32),
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.lists(st.floats(allow_nan=False, width=32), min_size=4, max_size=4),
)
FORMS = st.sampled_from(["rest", "grpc", "bare"])


def _entry(key: CacheKey, kind: str, values: tuple[object, ...], form: str) -> Entry:
    """An entry as a read makes it (``GroupSpec.entry``'s forms)."""
    if kind == "negative":
        return Entry(key, FMT, None, FMT.absent_present, FMT.absent_json, None)
    if kind == "fault":
        fault = Fault(FaultReason.UNDECODABLE_VALUE, f"{key[1].decode()}: not a float")
        return Entry(key, FMT, None, FMT.absent_present, FMT.absent_json, None, fault=fault)
    stored = [None if v is None else c.encode(v) for c, v in zip(FMT.codecs, values, strict=True)]
    raw, present, json = FMT.load(stored)
    written = int(time.time()) - 5
    if form == "grpc":
        return Entry(key, FMT, raw, present, None, written, wire=FMT.proto(raw))
    return Entry(key, FMT, raw, present, json if form == "rest" else None, written)


OPS = st.one_of(
    st.tuples(
        st.just("put"),
        st.lists(
            st.tuples(
                KEYS, st.sampled_from(["values", "values", "negative", "fault"]), VALUES, FORMS
            ),
            min_size=1,
            max_size=4,
        ),
    ),
    st.tuples(st.just("answers"), KEYS, st.booleans()),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("discard"), KEYS),
    st.tuples(st.just("expire"), st.none()),
    st.tuples(st.just("clear"), st.none()),
)


def _apply(store: L1Store, op: tuple[object, ...], now: float) -> object:
    kind = op[0]
    if kind == "put":
        store.put_many([_entry(*item) for item in op[1]], now)  # type: ignore[attr-defined]
    elif kind == "answers":
        _, key, grpc = op
        entry = store.peek(key)  # type: ignore[arg-type]
        if entry is not None and entry.raw is not None:
            if grpc and entry.wire is None:
                entry.wire = entry.fmt.proto(entry.raw)
                store.charge(entry)
            elif not grpc and entry.json is None:
                entry.json = entry.fmt.json(entry.raw)
                store.charge(entry)
    elif kind == "get":
        entry = store.get(op[1])  # type: ignore[arg-type]
        return None if entry is None else entry.raw
    elif kind == "discard":
        return store.discard(op[1])  # type: ignore[arg-type]
    elif kind == "expire":
        store.expire_all(now)
    else:
        store.clear()
    return None


def _held(store: L1Store, key: CacheKey) -> tuple[object, ...] | None:
    entry = store.peek(key)
    if entry is None:
        return None
    return (
        entry.raw,
        entry.json,
        entry.wire,
        entry.present,
        entry.written_at,
        entry.fault,
        entry.negative,
    )


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(OPS, max_size=25),
    negative_ttl=st.sampled_from([0.0, 5.0]),
    keep_answers=st.booleans(),
)
def test_the_native_cache_holds_what_the_reference_holds(
    ops: list[tuple[object, ...]], negative_ttl: float, keep_answers: bool
) -> None:
    native, reference = _stores(negative_ttl, keep_answers)
    for op in ops:
        now = time.monotonic()
        assert _apply(native, op, now) == _apply(reference, op, now), op
        assert sorted(native.keys(None)) == sorted(reference.keys(None)), op
        now = time.monotonic()
        for key in reference.keys(None):
            assert _held(native, key) == _held(reference, key), (op, key)
            n, r = native.peek(key), reference.peek(key)
            assert n is not None
            assert r is not None
            assert abs(n.expires_at - r.expires_at) < 0.01, (op, key)
            assert abs(n.loaded_at - r.loaded_at) < 0.01, (op, key)
            assert (native.stale_fallback(key, now) is None) == (
                reference.stale_fallback(key, now) is None
            )
        assert len(native) == len(reference)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(OPS, max_size=30), max_entries=st.integers(1, 4), keep_answers=st.booleans())
def test_under_its_bounds_the_native_cache_keeps_only_last_stores(
    ops: list[tuple[object, ...]], max_entries: int, keep_answers: bool
) -> None:
    """Evicted by CLOCK rather than LRU, the native cache keeps other keys than the
    reference may, but never more than its bounds, and each as last stored."""
    native, _ = _stores(5.0, keep_answers, max_entries=max_entries, max_bytes=6000)
    last: dict[CacheKey, tuple[object, ...]] = {}
    for op in ops:
        now = time.monotonic()
        _apply(native, op, now)
        if op[0] == "put":
            for item in op[1]:  # type: ignore[attr-defined]
                entry = _entry(*item)
                last[entry.key] = (entry.raw, entry.written_at, entry.fault)
        elif op[0] in ("discard",):
            last.pop(op[1], None)  # type: ignore[arg-type]
        elif op[0] == "clear":
            last.clear()
        entries, held = native.size()
        assert entries <= max_entries
        assert held <= 6000 or entries <= 1  # one entry larger than the bound is evicted next
        for key in native.keys(None):
            entry = native.peek(key)
            assert entry is not None
            assert (entry.raw, entry.written_at, entry.fault) == last[key]
