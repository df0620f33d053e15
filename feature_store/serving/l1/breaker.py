"""Redis trouble: a circuit breaker and a timeout derived from observed latency.

Both are small and specific to the serving loop (one event loop, no threads), so they are
written here rather than taken from a library: the maintained Python breakers are built for
threads or for wrapping one call, and neither knows about a shared, coalesced read.

- ``CircuitBreaker``: failures are counted over a sliding time window. At
  ``failures`` within ``window`` seconds the circuit opens and every read fails at once
  (microseconds) instead of waiting for a timeout. After ``open_for`` one probe read is let
  through (half-open); its success closes the circuit, its failure reopens it for twice as
  long, up to ``open_max``. So Redis coming back is noticed without a restart.
- ``AdaptiveTimeout``: the timeout of a Redis round trip is a high percentile of recent
  round-trip latencies times a factor, clamped to [floor, cap]: a slow Redis does not
  stall callers for a fixed, generous timeout, and normal jitter does not trip it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from enum import StrEnum


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# the states as module constants: an enum member read off its class costs about 200 ns in
# Python 3.11, and ``allow`` is asked once per key a load schedules
_CLOSED, _OPEN = CircuitState.CLOSED, CircuitState.OPEN


class CircuitBreaker:
    def __init__(
        self,
        failures: int = 5,
        window: float = 10.0,
        open_for: float = 0.5,
        open_max: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = failures
        self.window = window
        self.base_open = open_for
        self.open_max = open_max
        self.clock = clock
        self.state = CircuitState.CLOSED
        self.opened = 0  # times the circuit opened, for metrics
        self._failures: deque[float] = deque()
        self._open_for = open_for
        self._open_until = 0.0
        self._probing = False

    def allow(self) -> bool:
        """Whether a read may go to Redis now. In half-open state, only one probe at a time."""
        state = self.state
        if state is _CLOSED:
            return True
        if state is _OPEN:
            if self.clock() < self._open_until:
                return False
            self.state = CircuitState.HALF_OPEN
            self._probing = False
        if self._probing:
            return False
        self._probing = True
        return True

    def success(self) -> None:
        if self.state is not _CLOSED:
            self.state = CircuitState.CLOSED
            self._open_for = self.base_open
            self._probing = False
        self._failures.clear()

    def failure(self) -> None:
        now = self.clock()
        if self.state is CircuitState.HALF_OPEN:
            self._open_for = min(self._open_for * 2, self.open_max)
            self._trip(now)
            return
        if self.state is CircuitState.OPEN:
            return  # a read that started before the circuit opened
        failures = self._failures
        failures.append(now)
        while failures and failures[0] < now - self.window:
            failures.popleft()
        if len(failures) >= self.threshold:
            self._trip(now)

    def _trip(self, now: float) -> None:
        self.state = CircuitState.OPEN
        self._open_until = now + self._open_for
        self._probing = False
        self._failures.clear()
        self.opened += 1

    @property
    def retry_after(self) -> float:
        """Seconds until the next probe may go out (0 when closed)."""
        if self.state is CircuitState.CLOSED:
            return 0.0
        return max(0.0, self._open_until - self.clock())


class AdaptiveTimeout:
    """The timeout of the next Redis round trip, from the last ``samples`` latencies.

    One per size class of round trip (``AdaptiveTimeouts``): a pipeline of 1,000 HMGETs
    takes longer than one of 10, and a timeout learnt on small reads must not cut large ones.
    """

    def __init__(
        self,
        floor: float = 0.1,
        cap: float = 1.0,
        percentile: float = 99.9,
        factor: float = 3.0,
        samples: int = 2048,
        recompute_every: int = 128,
    ) -> None:
        self.floor = floor
        self.cap = cap
        self.percentile = percentile
        self.factor = factor
        self.recompute_every = recompute_every
        self._latencies: deque[float] = deque(maxlen=samples)
        self._since = 0
        self.current = cap  # until there are measurements, the cap

    def observe(self, seconds: float) -> None:
        self._latencies.append(seconds)
        self._since += 1
        # Sorting 2k floats costs ~100 us: do it now and then, not per round trip.
        if self._since >= self.recompute_every or len(self._latencies) == self.recompute_every:
            self._since = 0
            self.current = self._compute()

    def _compute(self) -> float:
        ordered = sorted(self._latencies)
        rank = min(len(ordered) - 1, int(len(ordered) * self.percentile / 100.0))
        return min(self.cap, max(self.floor, ordered[rank] * self.factor))


class AdaptiveTimeouts:
    """Adaptive timeouts by the number of keys in a round trip: up to 10, 100, 1000, more."""

    LIMITS = (10, 100, 1000)

    def __init__(
        self,
        floor: float = 0.1,
        cap: float = 1.0,
        percentile: float = 99.9,
        factor: float = 3.0,
    ) -> None:
        self.cap = cap
        self.settings = (floor, cap, percentile, factor)  # for a copy with its own history
        self.classes = [
            AdaptiveTimeout(floor, cap, percentile, factor) for _ in range(len(self.LIMITS) + 1)
        ]

    def _index(self, keys: int) -> int:
        for i, limit in enumerate(self.LIMITS):
            if keys <= limit:
                return i
        return len(self.LIMITS)

    def for_keys(self, keys: int) -> float:
        return self.classes[self._index(keys)].current

    def observe(self, seconds: float, keys: int) -> None:
        self.classes[self._index(keys)].observe(seconds)

    def bounded(self) -> list[tuple[int | None, float]]:
        """(most keys of the size class, None for the last; its current timeout), as the
        native fronts' Redis connections take them."""
        limits: list[int | None] = [*self.LIMITS, None]
        return [(limit, t.current) for limit, t in zip(limits, self.classes, strict=True)]

    def labelled(self) -> list[tuple[str, float]]:
        """(size class label, current timeout), for metrics."""
        labels = [f"le{limit}" for limit in self.LIMITS] + [f"gt{self.LIMITS[-1]}"]
        return [(label, t.current) for label, t in zip(labels, self.classes, strict=True)]
