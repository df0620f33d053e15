"""Shadow mode: how consistent is the cache? A sample of hits is re-read from Redis, off the
request path, and the stored bytes compared with the cached ones (docs/serving.md)."""

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
    ) -> None:
        self.stats = stats
        self.specs = specs
        self.round_trip = round_trip
        self.breaker = breaker
        self.timeout = timeout
        self.spawn = spawn  # the reader owns the task (and cancels it at close)
        self.clock = clock
        self.on_mismatch: Callable[[float], None] | None = None  # the entry's age then
        self._queue: deque[tuple[CacheKey, Entry]] = deque(maxlen=SHADOW_QUEUE)
        self._wakeup: asyncio.Event | None = None

    def sample(self, key: CacheKey, entry: Entry) -> None:
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
