"""Circuit breaker transitions and the adaptive timeout, on a controlled clock."""

from __future__ import annotations

import pytest

from feature_store.serving.l1.breaker import (
    AdaptiveTimeout,
    AdaptiveTimeouts,
    CircuitBreaker,
    CircuitState,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_at_the_threshold_within_the_window() -> None:
    clock = Clock()
    b = CircuitBreaker(failures=3, window=10, open_for=1, open_max=8, clock=clock)
    b.failure()
    clock.now = 11  # the first failure left the window
    b.failure()
    b.failure()
    assert b.state is CircuitState.CLOSED
    b.failure()
    assert b.state is CircuitState.OPEN
    assert not b.allow()
    assert b.retry_after == pytest.approx(1.0)


def test_half_open_lets_one_probe_through_and_success_closes() -> None:
    clock = Clock()
    b = CircuitBreaker(failures=1, window=10, open_for=1, open_max=8, clock=clock)
    b.failure()
    clock.now = 1.0
    assert b.allow()  # the probe
    assert b.state is CircuitState.HALF_OPEN
    assert not b.allow()  # only one at a time
    b.success()
    assert b.state is CircuitState.CLOSED
    assert b.allow()
    assert b.opened == 1


def test_a_failed_probe_reopens_for_longer_up_to_the_max() -> None:
    clock = Clock()
    b = CircuitBreaker(failures=1, window=10, open_for=1, open_max=3, clock=clock)
    b.failure()
    periods = []
    for _ in range(4):
        clock.now += 100
        assert b.allow()
        start = clock.now
        b.failure()
        periods.append(b.retry_after)
        assert clock.now == start
    assert periods == [2, 3, 3, 3]
    clock.now += 100
    assert b.allow()
    b.success()
    b.failure()  # back to the base period after a recovery
    assert b.retry_after == 1


def test_success_clears_counted_failures() -> None:
    b = CircuitBreaker(failures=2, window=10, open_for=1, open_max=8, clock=Clock())
    b.failure()
    b.success()
    b.failure()
    assert b.state is CircuitState.CLOSED


def test_adaptive_timeout_follows_the_percentile_within_floor_and_cap() -> None:
    t = AdaptiveTimeout(
        floor=0.01, cap=0.5, percentile=99, factor=2, samples=500, recompute_every=10
    )
    assert t.current == 0.5  # nothing measured yet
    for _ in range(99):
        t.observe(0.010)
    t.observe(0.020)
    assert t.current == pytest.approx(0.040)  # the slowest 1% x 2
    for _ in range(1000):
        t.observe(0.0001)
    assert t.current == 0.01  # floor
    for _ in range(3000):
        t.observe(1.0)
    assert t.current == 0.5  # cap


def test_timeouts_are_learnt_per_size_of_round_trip() -> None:
    t = AdaptiveTimeouts(floor=0.001, cap=1.0, percentile=99, factor=2)
    for _ in range(200):
        t.observe(0.002, 10)
        t.observe(0.050, 1000)
    assert t.for_keys(1) == pytest.approx(0.004)
    assert t.for_keys(500) == pytest.approx(0.1)
    assert t.for_keys(50) == 1.0  # nothing learnt for this size yet: the cap
    assert dict(t.labelled())["le10"] == pytest.approx(0.004)
