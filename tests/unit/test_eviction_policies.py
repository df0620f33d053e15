"""The eviction and admission policies ``benchmarks/eviction.py`` simulates
(``benchmarks/_policies.py``): what each keeps, against references and small cases."""

from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _policies import Clock, Doorkeeper, Sieve, policy

traces = st.lists(st.integers(0, 30), max_size=300)
capacities = st.integers(1, 12)


@given(traces, capacities, st.sampled_from(["LRU", "CLOCK", "SIEVE"]), st.booleans())
def test_a_hit_is_a_key_held_and_the_cache_keeps_its_bound(
    trace: list[int], capacity: int, name: str, doorkeeper: bool
) -> None:
    cache = policy(name, capacity, doorkeeper)
    for key in trace:
        held = cache.held()
        assert cache.access(key) == (key in held)
        assert len(cache.held()) <= capacity
        if not doorkeeper:
            assert key in cache.held()  # a miss is stored


@given(traces, capacities)
def test_lru_keeps_the_most_recently_used(trace: list[int], capacity: int) -> None:
    cache = policy("LRU", capacity)
    reference: OrderedDict[int, None] = OrderedDict()
    for key in trace:
        cache.access(key)
        reference[key] = None
        reference.move_to_end(key)
        while len(reference) > capacity:
            reference.popitem(last=False)
    assert cache.held() == set(reference)


@given(st.lists(st.integers(0, 1000), unique=True, max_size=100), capacities)
def test_without_hits_clock_and_sieve_are_first_in_first_out(
    trace: list[int], capacity: int
) -> None:
    for name in ("CLOCK", "SIEVE"):
        cache = policy(name, capacity)
        for key in trace:
            cache.access(key)
        assert cache.held() == set(trace[-capacity:])


def test_sieve_leaves_a_key_hit_in_its_place_and_its_hand_where_it_evicted() -> None:
    sieve, clock = Sieve(3), Clock(3)
    for cache in (sieve, clock):
        for key in (1, 2, 3):
            cache.store(key)
        assert cache.access(1)  # the oldest, marked
        cache.store(4)  # the hand passes 1 (unmarked now) and evicts 2
        assert cache.held() == {1, 3, 4}
    assert sieve.order() == [4, 3, 1]  # 1 is still the oldest
    # the next eviction: SIEVE's hand goes on from 3, CLOCK's ring had put 1 behind 3
    sieve.store(5)
    clock.store(5)
    assert sieve.held() == {1, 4, 5}
    assert clock.held() == {1, 4, 5}
    # 4 is hit; then SIEVE's hand, at 4, passes it and evicts 5, the newest, never hit
    # (a new key not hit again leaves first), where CLOCK evicts 1, the oldest
    for cache in (sieve, clock):
        assert cache.access(4)
        cache.store(6)
    assert sieve.held() == {1, 4, 6}
    assert clock.held() == {4, 5, 6}


def test_the_doorkeeper_stores_a_key_missed_twice_while_the_cache_is_full() -> None:
    cache = Doorkeeper(Sieve(2))
    assert not cache.access(1)
    assert not cache.access(2)
    assert cache.held() == {1, 2}  # not full yet: every miss stored
    assert not cache.access(3)
    assert cache.held() == {1, 2}  # full: remembered, not stored
    assert not cache.access(3)
    assert 3 in cache.held()
    assert cache.inserts == 3
    # the filter is cleared once it holds as many keys as the cache: 3 and 7 here
    assert not cache.access(7)
    assert cache.seen == set()
    assert not cache.access(7)  # forgotten: a first miss again
    assert 7 not in cache.held()
    assert not cache.access(7)
    assert 7 in cache.held()


@pytest.mark.parametrize("name", ["LRU", "CLOCK", "SIEVE"])
def test_a_repeated_key_is_hit(name: str) -> None:
    cache = policy(name, 4)
    assert not cache.access(5)
    assert cache.access(5)
