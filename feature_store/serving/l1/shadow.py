"""Shadow mode: how consistent is the cache? A sample of hits is re-read from Redis, off the
request path, and the stored bytes compared with the cached ones (docs/serving.md).

The sample is drawn uniformly over hits (``shadow_fraction``), then bounded twice so that
its reads stay a small share of what the debouncer reads however hot the keys are:

- once per entry: an entry is checked at most once per load, so at most once per key per
  TTL window (a hot key is hit the most, and was re-read on every hundredth hit);
- a rate per worker (``ShadowBudget``: ``shadow_max_per_second``, a token bucket), so that
  the checks' reads do not grow with the hit rate.

Samples past either bound are counted (``shadow_skipped``), not read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping

from feature_store.errors import EncodingError, StoreError
from feature_store.serving.l1.breaker import AdaptiveTimeouts, CircuitBreaker, CircuitState
from feature_store.serving.l1.cache import CacheKey, CacheStats, Entry
from feature_store.serving.l1.roundtrip import KeyDataError, Read, RoundTrip
from feature_store.serving.l1.spec import GroupSpec

log = logging.getLogger(__name__)

SHADOW_QUEUE = 10_000  # sampled hits waiting for their shadow read; the oldest go first
SHADOW_BATCH = 500  # sampled hits re-read per round trip


class ShadowBudget:
    """A token bucket: ``rate`` checks a second on average, at most ``burst`` (the rate,
    and at least one) at once; a rate of 0 (or less) is no bound."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.clock = clock
        self._tokens = self.burst
        self._at = clock()

    def take(self) -> bool:
        """Whether one more check may be read now (and if so, it is counted)."""
        if self.rate <= 0:
            return True
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class ShadowChecker:
    def __init__(
        self,
        stats: CacheStats,
        specs: Mapping[str, GroupSpec],
        round_trip: RoundTrip,
        breaker: CircuitBreaker,
        timeout: AdaptiveTimeouts,
        spawn: Callable[[asyncio.Task[None]], None],
        clock: Callable[[], float],
        max_per_second: float = 0.0,
        mark: Callable[[CacheKey], None] | None = None,
    ) -> None:
        self.stats = stats
        self.specs = specs
        self.round_trip = round_trip
        self.breaker = breaker
        self.timeout = timeout
        self.spawn = spawn  # the reader owns the task (and cancels it at close)
        self.clock = clock
        self.mark = mark  # tells the cache a check was drawn for an entry (``Entry.shadowed``)
        self.budget = ShadowBudget(max_per_second, clock)
        self.on_mismatch: Callable[[float], None] | None = None  # the entry's age then
        self._queue: deque[tuple[CacheKey, Entry]] = deque(maxlen=SHADOW_QUEUE)
        self._wakeup: asyncio.Event | None = None

    def sample(self, key: CacheKey, entry: Entry) -> None:
        """A hit drawn for a check: read unless its entry was checked since it was loaded
        or the worker's budget of checks is spent (then counted as skipped)."""
        if entry.shadowed:
            self.stats.shadow_skipped += 1
            return
        if self.admits():
            self.check(key, entry)

    def admits(self) -> bool:
        """Whether the worker's budget allows one more check now (if not: counted as
        skipped). The native fronts draw each entry of theirs once per load themselves, so
        their samples ask this alone, before their entry is looked up."""
        if self.budget.take():
            return True
        self.stats.shadow_skipped += 1
        return False

    def check(self, key: CacheKey, entry: Entry) -> None:
        """Read ``entry``'s key again and compare, off the caller's way."""
        entry.shadowed = True
        if self.mark is not None:
            self.mark(key)
        self._queue.append((key, entry))  # a full queue drops its oldest sample
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
            self.spawn(asyncio.get_running_loop().create_task(self._loop()))
        self._wakeup.set()

    async def _loop(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                samples = [
                    self._queue.popleft() for _ in range(min(SHADOW_BATCH, len(self._queue)))
                ]
                if self.breaker.state is not CircuitState.CLOSED:
                    continue  # Redis is in trouble: no extra reads, and not a mismatch
                await self._check(samples)

    async def _check(self, samples: list[tuple[CacheKey, Entry]]) -> None:
        reads: list[Read] = [(key[1], [self.specs[key[0]]]) for key, _ in samples]
        try:
            replies = await self.round_trip(reads, self.timeout.cap)
        except (StoreError, TimeoutError):
            return
        except Exception:
            log.exception("a shadow read failed")
            return
        now = self.clock()
        for (key, entry), reply in zip(samples, replies, strict=True):
            try:
                if isinstance(reply, KeyDataError):
                    raise reply
                now_stored = self.specs[key[0]].entry(key, reply)
                raw, written_at = now_stored.raw, now_stored.written_at
            except EncodingError:
                raw, written_at = None, None
            self.stats.shadow_checks += 1
            # the stored bytes themselves: equal bytes are equal values
            if written_at != entry.written_at or raw != entry.raw:
                self.stats.shadow_mismatches += 1
                if self.on_mismatch is not None:
                    self.on_mismatch(now - entry.loaded_at)
