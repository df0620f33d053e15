"""The L1 read path's policy: what a lookup is answered with.

``CachedReader.get(keys)`` answers (group, entity key) pairs:

1. A fresh entry is a hit. A hit may also start a background reload, which the caller does
   not wait for: when is the refresh policy's to say (refresh.py: batch writes, refresh
   ahead, XFetch); a sample of hits is checked against Redis (shadow.py).
2. A miss on a key that is already being loaded waits for that load (single-flight, the
   "debouncer"): a thousand concurrent misses on one key cost one Redis read.
3. Other misses are queued and go to Redis with every miss of the same event-loop tick in
   one pipeline (coalescing, flight.py). Without a cache, each request's keys are queued
   for the flush the same way: a thousand concurrent requests cost a few round trips, not
   a thousand (and not a thousand pooled connections).
4. Callers wait through ``asyncio.shield``: a caller that is cancelled (client gone,
   deadline) does not cancel the read that other callers share.
5. If the read fails, or the circuit breaker is open, a key with an expired entry younger
   than ``max_stale`` is answered with it, marked stale; any other key raises the error.
6. One entity whose stored data cannot be read (a value that does not decode, a corrupt
   write time, a key of another type) is that entity's problem, not the batch's: it gets a
   fault entry (``Entry.fault``; answered with status "error", cached like a missing
   entity), and every other key of the round trip is answered as usual (reads.py).

Invalidation drops the entry and disowns a load in flight for the key, so a read that
started before a write cannot put the pre-write value back into the cache.

A native front's lookup whose missing keys loaded but cannot be answered from the L1 (read
failed, served stale, an entry not kept) goes to its handler inside ``settled(...)``: the
handler's ``get`` takes what that load resolved for those keys, or raises its error,
instead of reading them again (a second timeout of a hung Redis, a second read of keys a
negative TTL of 0 does not keep).

The parts: reads.py does the I/O (a round trip under the adaptive timeout and the breaker,
replies decoded into entries), flight.py the coalescing (single-flight loads, the batches
of requests without a cache), this module the rules above.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar

from feature_store.errors import StoreError
from feature_store.registry import Registry
from feature_store.serving.l1.breaker import AdaptiveTimeouts, CircuitBreaker
from feature_store.serving.l1.cache import CacheKey, Entry, L1Store
from feature_store.serving.l1.flight import Batches, SingleFlight
from feature_store.serving.l1.reads import CircuitOpenError, Resolved, StoreReads
from feature_store.serving.l1.refresh import Refresher
from feature_store.serving.l1.roundtrip import RoundTrip
from feature_store.serving.l1.shadow import ShadowChecker
from feature_store.serving.l1.spec import GroupSpec

__all__ = ["CachedReader", "CircuitOpenError", "Resolved", "settled"]

Settled = Mapping[CacheKey, Resolved | Exception]
_settled: ContextVar[Settled | None] = ContextVar("settled", default=None)


@contextlib.contextmanager
def settled(resolved: Settled) -> Iterator[None]:
    """Within this block (this task, and tasks it starts), ``CachedReader.get`` answers a
    key of ``resolved`` that is not a fresh hit with what was resolved for it: its entry,
    or the error its read failed with, raised again."""
    token = _settled.set(resolved)
    try:
        yield
    finally:
        _settled.reset(token)


def _taken(result: Resolved | Exception) -> Resolved:
    """What a load settled for a key: its entry, or the error it failed with, raised."""
    if isinstance(result, Exception):
        raise result
    return result


class CachedReader:
    """Reads entity groups through the L1 cache. ``cache=None`` reads Redis every time."""

    def __init__(
        self,
        registry: Registry,
        round_trip: RoundTrip,
        *,
        cache: L1Store | None,
        breaker: CircuitBreaker | None = None,
        timeout: AdaptiveTimeouts | None = None,
        xfetch_beta: float = 1.0,
        single_flight: bool = True,
        on_round_trip: Callable[[float, int], None] | None = None,
        rng: random.Random | None = None,
        refresh_rate: float = 5000.0,
        shadow_fraction: float = 0.0,
        refresh_ahead: float = 0.0,
        shadow_max_per_second: float = 0.0,
    ) -> None:
        self.registry = registry
        self.specs = {name: GroupSpec.of(g, registry) for name, g in registry.groups.items()}
        self.cache = cache
        self.breaker = breaker or CircuitBreaker()
        self.timeout = timeout or AdaptiveTimeouts()
        self.single_flight = single_flight
        self._rng = rng or random.Random()
        self._clock = cache.clock if cache is not None else time.monotonic
        self.reads = StoreReads(self.specs, round_trip, self.breaker, self.timeout, self._clock)
        self.reads.on_round_trip = on_round_trip
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = Batches(self.reads, self._own)  # requests without a cache
        self.flight: SingleFlight | None = None
        # the policies: when an entry is reloaded early (refresh.py), how hits are checked
        # against Redis (shadow.py); the reader does the reading for both
        self.refresher: Refresher | None = None
        self.shadow: ShadowChecker | None = None
        self._generations: dict[str, float] = {}  # announced batch writes, without a cache
        self._writes: dict[str, float] = {}  # announced writes of keys (new_write)
        self.shadow_fraction = shadow_fraction if cache is not None else 0.0
        if cache is not None:
            flight = self.flight = SingleFlight(self.reads, cache, self._own)
            self.refresher = Refresher(
                cache,
                frozenset(self.specs),
                self._reload,
                flight.inflight.__contains__,
                self._own,
                clock=self._clock,
                rng=self._rng,
                xfetch_beta=xfetch_beta,
                refresh_ahead=refresh_ahead,
                refresh_rate=refresh_rate,
            )
            # where the fronts answer a hit, it is noted for the policy from this window
            cache.notice_window = self.refresher.drawn_window
            self.shadow = ShadowChecker(
                cache.stats,
                self.specs,
                round_trip,
                self.breaker,
                self.timeout,
                self._own,
                self._clock,
                shadow_max_per_second,
                cache.mark_shadowed,
            )

    # the parts' shared settings, which tests (and the metrics) set after construction

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._clock = self.reads.clock = clock

    @property
    def rng(self) -> random.Random:
        """The draws of the policies: which hits are shadow-checked, when XFetch refreshes."""
        return self._rng

    @rng.setter
    def rng(self, rng: random.Random) -> None:
        self._rng = rng
        if self.refresher is not None:
            self.refresher.rng = rng

    @property
    def round_trip(self) -> RoundTrip:
        return self.reads.round_trip

    @round_trip.setter
    def round_trip(self, round_trip: RoundTrip) -> None:
        self.reads.round_trip = round_trip

    @property
    def on_round_trip(self) -> Callable[[float, int], None] | None:
        return self.reads.on_round_trip

    @on_round_trip.setter
    def on_round_trip(self, observe: Callable[[float, int], None] | None) -> None:
        self.reads.on_round_trip = observe

    @property
    def generations(self) -> dict[str, float]:
        """Batch writes announced per group (unix seconds)."""
        return self.refresher.generations if self.refresher is not None else self._generations

    @property
    def last_writes(self) -> dict[str, float]:
        """The last write announced per group (unix seconds): a batch write's generation,
        or the time of a write that named its keys (the stream writer's, push writes)."""
        out = dict(self._writes)
        for group, at in self.generations.items():
            out[group] = max(at, out.get(group, 0.0))
        return out

    def new_write(self, group: str, at: float) -> None:
        """A write of some of ``group``'s keys at ``at`` was announced (the metrics)."""
        if group in self.specs and at > self._writes.get(group, 0.0):
            self._writes[group] = at

    @property
    def on_shadow_mismatch(self) -> Callable[[float], None] | None:
        return self.shadow.on_mismatch if self.shadow is not None else None

    @on_shadow_mismatch.setter
    def on_shadow_mismatch(self, observe: Callable[[float], None] | None) -> None:
        if self.shadow is not None:
            self.shadow.on_mismatch = observe

    # --- reads ---------------------------------------------------------------------------

    async def get(
        self,
        keys: Sequence[CacheKey],
        *,
        bypass: bool = False,
        proto: bool = False,
        bare: bool = False,
    ) -> list[Resolved]:
        """The entries of ``keys``: cached, or loaded (``SingleFlight.schedule``): for a
        gRPC answer (``proto``), for a REST answer, or (``bare``) for a caller that answers
        from the packed values alone, which keep no answer bytes."""
        if self.cache is None or self.flight is None:
            if not self.single_flight:
                return await self.reads.direct(keys, proto, bare)
            return await self.batches.read(keys, proto, bare)
        if not self.single_flight:
            return await self._unshared(keys, bypass, proto, bare)
        cache = self.cache
        stats = cache.stats
        now = self._clock()
        out: list[Resolved | None] = [None] * len(keys)
        waits: list[tuple[int, CacheKey, asyncio.Future[Entry]]] = []
        if bypass:
            stats.bypasses += len(keys)
        flight = self.flight
        inflight = flight.inflight
        on_hit = self.refresher.on_hit if self.refresher is not None else None
        shadow = self.shadow if self.shadow_fraction else None
        cache_get = cache.get
        done = _settled.get()
        for i, key in enumerate(keys):
            if not bypass:
                entry = cache_get(key)
                if entry is not None and now < entry.expires_at:
                    out[i] = Resolved(entry, False)
                    if entry.raw is None:
                        if entry.fault is None:
                            stats.negative_hits += 1
                        else:
                            stats.error_hits += 1
                    else:
                        stats.hits += 1
                        if on_hit is not None and key not in inflight:
                            on_hit(key, entry, now)
                        if shadow is not None and self._rng.random() < self.shadow_fraction:
                            shadow.sample(key, entry)
                    continue
                if done is not None and key in done:  # counted by the load that settled it
                    out[i] = _taken(done[key])
                    continue
                load = inflight.get(key)
                if load is not None:
                    stats.deduplicated += 1
                    waits.append((i, key, load.future))
                    continue
            stats.misses += 1
            load = flight.schedule(key, store=not bypass, proto=proto, bare=bare)
            waits.append((i, key, load.future))
        if waits:
            await self._wait(waits, out, now)
        return out  # type: ignore[return-value]  # every slot is filled above

    def noted_hit(self, key: CacheKey, now: float) -> None:
        """A hit answered elsewhere (the native fronts, hits.py), noted inside the refresh
        window chosen for the entry when it was stored (``notice_window``), or after a batch
        write of its group."""
        if self.cache is None or self.refresher is None or self.flight is None:
            return
        entry = self.cache.get(key)  # also marks it used
        if entry is None or entry.raw is None or now >= entry.expires_at:
            return
        if key in self.flight.inflight or self.refresher.on_notice(key, entry, now):
            return
        # noted for a batch write it is newer than: noted again at its refresh window
        self.cache.notice_again(key, entry)

    def shadow_sample(self, key: CacheKey) -> None:
        """A hit answered elsewhere (the native fronts), sampled there for a shadow check:
        each entry at most once per load (the fronts draw it so: the draw marks the entry
        shadowed, in the one cache a hit in Python reads too), then within the worker's
        budget. The entry is looked at where it is (``view``: not marked used)."""
        shadow, cache = self.shadow, self.cache
        if shadow is None or cache is None or not shadow.admits():
            return
        entry = cache.view(key)
        if entry is not None and entry.raw is not None:
            shadow.check(key, entry)

    async def _wait(
        self,
        waits: list[tuple[int, CacheKey, asyncio.Future[Entry]]],
        out: list[Resolved | None],
        now: float,
    ) -> None:
        # The loads of one flush end together, so waiting for each in turn suspends about
        # once per flush, where a gather would add a callback to every load. asyncio.wait:
        # cancelling this caller must not cancel loads other callers wait for.
        for _, _, future in waits:
            if not future.done():
                await asyncio.wait((future,))
        for i, key, future in waits:
            error = future.exception()
            if error is None:
                out[i] = Resolved(future.result(), False)
                continue
            if isinstance(error, StoreError) and self.cache is not None:
                fallback = self.cache.stale_fallback(key, now)
                if fallback is not None:
                    self.cache.stats.stale_serves += 1
                    out[i] = Resolved(fallback, True)
                    continue
            raise error

    async def _unshared(
        self, keys: Sequence[CacheKey], bypass: bool, proto: bool, bare: bool
    ) -> list[Resolved]:
        """The cache without the debouncer: each request reads its own misses (a baseline)."""
        assert self.cache is not None
        cache, now = self.cache, self._clock()
        out: list[Resolved | None] = [None] * len(keys)
        misses = []
        done = _settled.get()
        for i, key in enumerate(keys):
            entry = None if bypass else cache.get(key)
            if entry is not None and now < entry.expires_at:
                cache.stats.hits += 1
                out[i] = Resolved(entry, False)
            elif done is not None and key in done:  # counted by the load that settled it
                out[i] = _taken(done[key])
            else:
                cache.stats.misses += 1
                misses.append(i)
        if misses:
            loaded = await self.reads.direct([keys[i] for i in misses], proto, bare)
            cache.stats.round_trips += 1
            for i, resolved in zip(misses, loaded, strict=True):
                out[i] = Resolved(cache.put(resolved.entry), False)
        return out  # type: ignore[return-value]

    # --- what the policies ask of the reader ---------------------------------------------

    def _reload(self, key: CacheKey) -> None:
        """A background load of ``key`` that stores its entry (the caller does not wait),
        in the form of the entry it replaces: gRPC records alone where that had no JSON,
        no answer bytes where it had neither."""
        if self.flight is not None and self.cache is not None:
            entry = self.cache.peek(key)
            proto = entry is not None and entry.json is None and entry.wire is not None
            bare = entry is not None and entry.json is None and entry.wire is None
            self.flight.schedule(key, store=True, proto=proto, bare=bare)

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def new_generation(self, group: str, generation: float) -> None:
        """A batch write of ``group`` that ended at ``generation`` (unix seconds) was
        announced: entries read before it are refreshed in the background (refresh.py)."""
        if self.refresher is not None:
            assert self.cache is not None
            if self.refresher.new_generation(group, generation):
                self.cache.notice_group(group)  # its hits on the fronts come here (hits.py)
        elif group in self.specs and generation > self._generations.get(group, 0):
            self._generations[group] = generation  # the metrics report it

    # --- invalidation and shutdown -------------------------------------------------------

    def invalidate(self, keys: Iterable[CacheKey]) -> int:
        """Drop entries, and keep loads in flight for them from filling the cache."""
        if self.cache is None or self.flight is None:
            return 0
        dropped = 0
        for key in keys:
            dropped += self.cache.discard(key)
            self.flight.disown(key)
        self.cache.stats.invalidations += dropped
        return dropped

    def invalidate_all(self) -> None:
        """After missed invalidations: every entry reloads on next use, stale-on-error kept."""
        if self.cache is not None and self.flight is not None:
            self.cache.expire_all()
            self.flight.disown_all()

    async def close(self) -> None:
        if self.refresher is not None:
            self.refresher.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
