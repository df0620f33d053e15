"""When a cached entry is reloaded before it is needed: the L1's refresh policy.

A hit is always answered from the entry; what this decides is whether the hit also starts a
background reload (``CachedReader`` does the reading):

- **Batch writes** (``new_generation``): an entry read from Redis before a bulk write of its
  group was announced is refreshed on its next hit, and by a background sweep at
  ``refresh_rate`` keys per second, hottest first, in coalesced round trips: a nightly
  refresh of every entity neither drops the cache at once nor sends every key at once.
- **Refresh ahead**: a hit in the last ``refresh_ahead`` share of an entry's lifetime queues
  it; the queue goes to Redis every REFRESH_TICK in one pipeline (entries expire at
  scattered times, and a round trip apiece would cost more). A hot entry is reloaded before
  it expires and never misses; a cold one expires and is evicted.
- **XFetch** (probabilistic early refresh, ``cache.should_refresh_early``): an entry whose
  reload is dear may start one earlier, at random, so that concurrent hits do not all see
  it expire at once.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable

from feature_store.serving.l1.cache import CacheKey, Entry, L1Store, should_refresh_early

REFRESH_BATCH = 500  # keys per round trip of a background refresh after a batch write
REFRESH_TICK = 0.05  # seconds: refreshes of entries near expiry are sent together this often
# XFetch refreshes when the time to expiry is at most cost x beta x -ln(u), u uniform in
# (0, 1]: random() is a multiple of 2**-53, so -ln(u) <= 36.8 and an entry further from
# expiry than cost x beta x 37 is never refreshed early; the hit path skips the draw
XFETCH_HORIZON = 37.0


class Refresher:
    """The refresh policy of one reader's cache. ``reload(key)`` starts a background load
    that stores its entry; ``loading(key)`` says whether one is in flight already."""

    def __init__(
        self,
        cache: L1Store,
        groups: frozenset[str],
        reload: Callable[[CacheKey], object],
        loading: Callable[[CacheKey], bool],
        spawn: Callable[[asyncio.Task[None]], None],
        *,
        clock: Callable[[], float],
        rng: random.Random,
        xfetch_beta: float,
        refresh_ahead: float,
        refresh_rate: float,
    ) -> None:
        self.cache = cache
        self.groups = groups
        self.reload = reload
        self.loading = loading
        self.spawn = spawn  # the reader owns the tasks (and cancels them at close)
        self.clock = clock
        self.rng = rng
        self.beta = xfetch_beta
        self.horizon = xfetch_beta * XFETCH_HORIZON
        self.ahead = refresh_ahead
        self.refresh_rate = refresh_rate
        # batch writes announced per group (unix seconds): entries read before are refreshed
        self.generations: dict[str, float] = {}
        self._marks: dict[str, float] = {}  # the same on this clock
        self._sweeps: dict[str, asyncio.Task[None]] = {}
        self._due: dict[CacheKey, None] = {}
        self._due_timer: asyncio.TimerHandle | None = None

    def on_hit(self, key: CacheKey, entry: Entry, now: float) -> None:
        """A hit on an entry with values, not being loaded: start what refresh is due."""
        if self._marks and self.outdated(key[0], entry):
            self.cache.stats.generation_refreshes += 1  # served now, refreshed for next
            self.reload(key)
            return
        remaining = entry.expires_at - now
        if remaining < self.ahead * (entry.expires_at - entry.loaded_at) or (
            remaining <= entry.cost * self.horizon
            and should_refresh_early(entry, now, self.beta, self.rng)
        ):
            self.soon(key)

    def drawn_window(self, entry: Entry) -> float:
        """Seconds before expiry from which a hit answered elsewhere (the native fronts,
        hits.py) is noted for ``on_notice``: refresh ahead's window, or XFetch's when it is
        longer, drawn once now (cost x beta x -ln u; 1 - random() is in (0, 1], so -ln of
        it is in [0, 36.8], inside ``on_notice``'s horizon)."""
        xfetch = entry.cost * self.beta * -math.log(1.0 - self.rng.random())
        return max(self.ahead * (entry.expires_at - entry.loaded_at), xfetch)

    def on_notice(self, key: CacheKey, entry: Entry, now: float) -> bool:
        """A hit answered elsewhere (the native fronts, hits.py), noted at the point chosen
        when the entry was stored (refresh ahead's window, or XFetch's drawn
        once), or after a batch write of its group was announced: refresh what is due.
        False when nothing is (an entry read after the batch write, not near expiry)."""
        if self._marks and self.outdated(key[0], entry):
            self.cache.stats.generation_refreshes += 1
            self.reload(key)
            return True
        lifetime = entry.expires_at - entry.loaded_at
        if entry.expires_at - now < max(self.ahead * lifetime, entry.cost * self.horizon):
            self.soon(key)
            return True
        return False

    # --- refresh ahead -------------------------------------------------------------------

    def soon(self, key: CacheKey) -> None:
        """Queue a background reload of an entry near its expiry (sent every REFRESH_TICK)."""
        if key in self._due:
            return
        self._due[key] = None
        self.cache.stats.early_refreshes += 1
        if self._due_timer is None:
            self._due_timer = asyncio.get_running_loop().call_later(REFRESH_TICK, self._send_due)

    def _send_due(self) -> None:
        self._due_timer = None
        due, self._due = self._due, {}
        for key in due:
            if not self.loading(key) and self.cache.peek(key) is not None:
                self.reload(key)

    # --- batch writes --------------------------------------------------------------------

    def outdated(self, group: str, entry: Entry) -> bool:
        mark = self._marks.get(group) if self._marks else None
        return mark is not None and entry.loaded_at < mark

    def new_generation(self, group: str, generation: float) -> bool:
        """A batch write of ``group`` that ended at ``generation`` (unix seconds) was
        announced: sweep the entries read before it. Read time, not the values' event
        time: a bulk write of old events changes entries all the same. False when the
        announcement is not news (an unknown group, or not newer than the last)."""
        if group not in self.groups or generation <= self.generations.get(group, 0):
            return False
        self.generations[group] = generation
        self._marks[group] = self.clock() - (time.time() - generation)
        previous = self._sweeps.pop(group, None)
        if previous is not None:
            previous.cancel()
        task = asyncio.get_running_loop().create_task(self._sweep(group))
        self._sweeps[group] = task
        self.spawn(task)
        return True

    async def _sweep(self, group: str) -> None:
        cache = self.cache
        batch = max(1, min(REFRESH_BATCH, int(self.refresh_rate)))
        keys = cache.keys(group, most_recent_first=True)  # the hottest first
        for start in range(0, len(keys), batch):
            # the entries the native fronts loaded themselves are read again by the fronts
            # (the announcement outdated them: ``notice_group``); the others here
            left = cache.refresh_outdated(keys[start : start + batch])
            self._refresh_outdated(group, left)
            await asyncio.sleep(batch / self.refresh_rate)

    def _refresh_outdated(self, group: str, keys: list[CacheKey]) -> None:
        cache = self.cache
        for key in keys:
            entry = cache.peek(key)
            if entry is None or self.loading(key):
                continue
            if entry.raw is None:
                cache.discard(key)  # "missing" may no longer be true
            elif self.outdated(group, entry):
                cache.stats.generation_refreshes += 1
                self.reload(key)

    def close(self) -> None:
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
