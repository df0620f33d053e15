"""The L1 cache's storage and early-refresh rule, on a controlled clock."""

from __future__ import annotations

import random
import tracemalloc
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store import sample
from feature_store.native import GroupFormat
from feature_store.serialization import FeatureType, codec_for
from feature_store.serving.l1.cache import CacheKey, Entry, LRUCache, should_refresh_early
from feature_store.serving.l1.shadow import ShadowBudget

FLOAT = GroupFormat([codec_for(FeatureType.FLOAT)])
EMBEDDINGS = GroupFormat([codec_for(FeatureType.EMBEDDING, 32)] * 4)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock, **overrides: float) -> LRUCache:
    args: dict[str, float] = {
        "max_bytes": 1_000_000,
        "max_entries": 1000,
        "ttl": 10.0,
        "negative_ttl": 1.0,
        "jitter": 0.0,
        "max_stale": 60.0,
    }
    args.update(overrides)
    return LRUCache(clock=clock, rng=random.Random(1), **args)  # type: ignore[arg-type]


def key(i: int) -> tuple[str, bytes]:
    return ("g", f"c:{i}".encode())


def stored(k: CacheKey, *values: object, fmt: GroupFormat = FLOAT) -> Entry:
    """An entry as the loader makes it; no values: a negative entry."""
    if not values:
        return Entry(k, fmt, None, fmt.absent_present, fmt.absent_json, None)
    raw, present, json = fmt.load([c.encode(v) for c, v in zip(fmt.codecs, values, strict=True)])
    return Entry(k, fmt, raw, present, json, 1)


def test_entries_expire_after_the_ttl_and_missing_ones_after_the_negative_ttl() -> None:
    clock = Clock()
    cache = make(clock)
    pos = cache.put(stored(key(1), 1.0))
    neg = cache.put(stored(key(2)))
    assert pos.expires_at == 110.0
    assert neg.expires_at == 101.0
    assert neg.negative
    assert not pos.negative


def test_jitter_spreads_expiry_within_its_band() -> None:
    clock = Clock()
    cache = make(clock, jitter=0.2)
    expiries = {cache.put(stored(key(i), 1.0)).expires_at for i in range(200)}
    assert len(expiries) > 100
    assert min(expiries) >= 100 + 10 * 0.9
    assert max(expiries) <= 100 + 10 * 1.1


def test_bound_in_entries_evicts_the_least_recently_used() -> None:
    clock = Clock()
    cache = make(clock, max_entries=3)
    for i in range(3):
        cache.put(stored(key(i), float(i)))
    cache.get(key(0))  # used: key(1) is now the oldest
    cache.put(stored(key(3), 3.0))
    assert cache.peek(key(1)) is None
    assert cache.peek(key(0)) is not None
    assert len(cache) == 3
    assert cache.stats.evictions == 1


def test_bound_in_bytes_holds_and_accounting_balances() -> None:
    clock = Clock()
    values = [[0.5] * 32 for _ in range(4)]  # four embeddings
    size = cache_size_of(stored(key(0), *values, fmt=EMBEDDINGS))
    cache = make(clock, max_bytes=size * 5 + 10)
    for i in range(20):
        cache.put(stored(key(i), *values, fmt=EMBEDDINGS))
        assert cache.bytes <= cache.max_bytes
    assert len(cache) == 5
    cache.put(stored(key(19), 1.0))  # replacing an entry frees its old size
    for i in range(15, 20):
        cache.discard(key(i))
    assert cache.bytes == 0
    assert len(cache) == 0


def cache_size_of(e: Entry) -> int:
    return make(Clock()).put(e).size


@pytest.mark.parametrize("keep_answers", [True, False])
def test_the_accounted_bytes_are_what_python_allocates(keep_answers: bool) -> None:
    """The byte bound is only as good as the sizes: within 25% of tracemalloc's count, with
    the entries' answers kept or (compact) not."""
    cache = make(Clock(), max_bytes=10**9, max_entries=10**6)
    cache.keep_answers = keep_answers
    group = sample.registry().groups[sample.GROUP]
    fmt = GroupFormat([f.codec for f in group.features])
    replies = [
        [f.codec.encode(sample.features(i)[f.name]) for f in group.features] for i in range(1000)
    ]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, reply in enumerate(replies):
        raw, present, json = fmt.load(reply)
        cache.put(Entry(("g", b"e:%d" % i), fmt, raw, present, json, 1))
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.8 < grown / cache.bytes < 1.25, (grown / len(cache), cache.bytes / len(cache))


def test_a_compact_cache_keeps_the_packed_values_only() -> None:
    cache = make(Clock())
    kept = cache.put(stored(key(1), *[[0.5] * 32] * 4, fmt=EMBEDDINGS))
    cache.keep_answers = False
    entry = stored(key(2), *[[0.5] * 32] * 4, fmt=EMBEDDINGS)
    raw = entry.raw
    compact = cache.put(entry)
    assert compact.raw is raw
    assert compact.json is None
    assert compact.wire is None
    assert kept.size - compact.size == len(cast(bytes, kept.json)) + 33
    compact.wire = EMBEDDINGS.proto(cast(bytes, raw))  # a gRPC answer's records
    cache.charge(compact)  # are not kept
    assert compact.wire is None
    assert compact.size == kept.size - len(cast(bytes, kept.json)) - 33
    missing = cache.put(stored(key(3), fmt=EMBEDDINGS))  # a missing entity: its shared answer
    assert missing.json == EMBEDDINGS.absent_json


def test_expired_entries_serve_as_stale_fallback_within_max_stale() -> None:
    clock = Clock()
    cache = make(clock, max_stale=30.0)
    cache.put(stored(key(1), 1.0))
    clock.now += 20  # expired 10 s ago
    assert cache.stale_fallback(key(1), clock.now) is not None
    clock.now += 25  # expired 35 s ago
    assert cache.stale_fallback(key(1), clock.now) is None
    assert cache.stale_fallback(key(2), clock.now) is None


def test_expire_all_keeps_entries_for_stale_fallback() -> None:
    clock = Clock()
    cache = make(clock)
    cache.put(stored(key(1), 1.0))
    cache.expire_all()
    entry = cache.peek(key(1))
    assert entry is not None
    assert entry.expires_at == clock.now
    assert cache.stale_fallback(key(1), clock.now) is entry


def test_zero_negative_ttl_does_not_cache_missing_entities() -> None:
    cache = make(Clock(), negative_ttl=0.0)
    cache.put(stored(key(1)))
    assert cache.peek(key(1)) is None
    assert cache.bytes == 0


def entry(expires_at: float, cost: float) -> Entry:
    e = stored(key(1), 1.0)
    e.expires_at, e.cost = expires_at, cost
    return e


def test_xfetch_never_refreshes_far_from_expiry_and_always_after_it() -> None:
    rng = random.Random(3)
    far = entry(expires_at=1000.0, cost=0.001)
    assert not any(should_refresh_early(far, 900.0, 1.0, rng) for _ in range(10_000))
    assert all(should_refresh_early(far, 1000.0, 1.0, rng) for _ in range(1000))


def test_xfetch_probability_rises_near_expiry_and_with_cost() -> None:
    rng = random.Random(4)

    def rate(now: float, cost: float, beta: float = 1.0) -> float:
        e = entry(expires_at=10.0, cost=cost)
        return sum(should_refresh_early(e, now, beta, rng) for _ in range(20_000)) / 20_000

    # P(refresh) = exp(-(expiry - now) / (cost * beta))
    assert rate(9.9, 0.1) == pytest.approx(0.368, abs=0.02)
    assert rate(9.8, 0.1) == pytest.approx(0.135, abs=0.02)
    assert rate(9.8, 0.2) == pytest.approx(0.368, abs=0.02)
    assert rate(9.8, 0.1, beta=2.0) == pytest.approx(0.368, abs=0.02)
    assert rate(9.0, 0.1, beta=0.0) == 0.0


# an entry to store: its key's number, and its values (none: negative; 4: embeddings, large)
Stored = tuple[int, int]
STORES = st.tuples(st.integers(0, 7), st.sampled_from([0, 1, 4]))


def entry_of(spec: Stored) -> Entry:
    i, size = spec
    if size == 0:
        return stored(key(i))
    if size == 1:
        return stored(key(i), float(i))
    return stored(key(i), *([[float(i)] * 32] * 4), fmt=EMBEDDINGS)


@given(
    before=st.lists(STORES, max_size=8),
    batch=st.lists(STORES, max_size=8, unique_by=lambda s: s[0]),
    max_entries=st.integers(1, 6),
    max_bytes=st.integers(300, 3000),
    negative_ttl=st.sampled_from([0.0, 1.0]),
)
@settings(max_examples=300, deadline=None)
def test_put_many_keeps_what_put_of_each_in_turn_keeps(
    before: list[Stored],
    batch: list[Stored],
    max_entries: int,
    max_bytes: int,
    negative_ttl: float,
) -> None:
    """A round trip's entries stored together: within the bounds, in the order storing
    them one by one leaves, keeping all that leaves (and perhaps more of the oldest, since
    an entry the batch replaces no longer pushes others out before it is replaced), the
    bytes counted those of the entries held."""
    caches = []
    for together in (False, True):
        cache = make(
            Clock(), max_entries=max_entries, max_bytes=max_bytes, negative_ttl=negative_ttl
        )
        for spec in before:
            cache.put(entry_of(spec))
        entries = [entry_of(spec) for spec in batch]
        if together:
            cache.put_many(entries, 100.0)
        else:
            for e in entries:
                cache.put(e, 100.0)
        held = [cache.peek(k) for k in cache.keys(None)]
        assert cache.bytes == sum(e.size for e in held if e is not None) <= max_bytes
        assert len(cache) <= max_entries
        caches.append(cache)
    one_by_one, together_ = caches
    kept, kept_together = one_by_one.keys(), together_.keys()
    # what one by one keeps is the most recently used end of what together keeps
    assert kept_together[len(kept_together) - len(kept) :] == kept
    assert together_.stats.evictions <= one_by_one.stats.evictions
    if len(kept_together) > len(kept):  # more kept only where the bounds allow it
        assert together_.stats.evictions < one_by_one.stats.evictions
    for k in kept:
        a, b = together_.peek(k), one_by_one.peek(k)
        assert a is not None
        assert b is not None
        assert (a.raw, a.expires_at, a.size) == (b.raw, b.expires_at, b.size)


@given(batch=st.lists(STORES, max_size=10), negative_ttl=st.sampled_from([0.0, 1.0]))
@settings(max_examples=200, deadline=None)
def test_put_many_of_one_key_twice_keeps_the_last(batch: list[Stored], negative_ttl: float) -> None:
    cache = make(Clock(), negative_ttl=negative_ttl)
    cache.put(entry_of((0, 1)))
    entries = [entry_of(spec) for spec in batch]
    cache.put_many(entries, 100.0)
    last = {e.key: e for e in entries}
    for k, e in last.items():
        kept = e.raw is not None or negative_ttl > 0
        assert (cache.peek(k) is e) == kept


# --- shadow checks' bounds ----------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(
    rate=st.floats(min_value=0.1, max_value=50.0),
    steps=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=200),
)
def test_the_shadow_budget_never_passes_its_rate(rate: float, steps: list[float]) -> None:
    clock = _Clock()
    budget = ShadowBudget(rate, clock)
    taken = 0
    for step in steps:
        clock.now += step
        taken += budget.take()
    # a full bucket at start (its burst), then `rate` a second
    assert taken <= max(1.0, rate) + rate * clock.now + 1e-9


def test_the_shadow_budget_refills_and_its_bounds_are_exact() -> None:
    clock = _Clock()
    one = ShadowBudget(1.0, clock)
    assert one.take()  # a burst of one
    assert not one.take()
    clock.now = 0.999
    assert not one.take()
    clock.now = 1.0
    assert one.take()
    unbounded = ShadowBudget(0.0, clock)  # 0: no bound
    assert all(unbounded.take() for _ in range(10_000))
