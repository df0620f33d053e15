"""The L1 read path: cache hits, single-flight, coalescing, stale-on-error, early refresh.

``CachedReader.get(keys)`` answers (group, entity key) pairs:

1. A fresh entry is a hit. A hot entry near expiry may also start one background reload
   (XFetch), which the caller does not wait for.
2. A miss on a key that is already being loaded waits for that load (single-flight, the
   "debouncer"): a thousand concurrent misses on one key cost one Redis read.
3. Other misses are queued. The first miss of an event-loop tick schedules a flush with
   ``loop.call_soon``, so every miss queued by the requests running in that tick goes to
   Redis in one pipeline (coalescing). Groups of one entity share one HMGET.
4. Loads run in tasks the reader owns, and callers wait through ``asyncio.shield``: a
   caller that is cancelled (client gone, deadline) does not cancel the read that other
   callers share.
5. If the read fails, or the circuit breaker is open, a key with an expired entry younger
   than ``max_stale`` is answered with it, marked stale; any other key raises the error.

Invalidation drops the entry and disowns a load in flight for the key, so a read that
started before a write cannot put the pre-write value back into the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from feature_store.errors import (
    EncodingError,
    FeatureStoreError,
    StoreError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from feature_store.registry import Registry
from feature_store.serving.breaker import AdaptiveTimeouts, CircuitBreaker
from feature_store.serving.cache import CacheKey, Entry, LRUCache, entry_size, should_refresh_early
from feature_store.serving.roundtrip import (
    ConnectionWaitTimeout,
    KeyDataError,
    Read,
    Reply,
    RoundTrip,
)
from feature_store.serving.spec import GroupSpec

log = logging.getLogger(__name__)


class CircuitOpenError(StoreUnavailableError):
    """Redis failed repeatedly; reads fail fast until a probe succeeds."""


class Resolved(NamedTuple):
    entry: Entry
    stale: bool  # served from an expired entry because Redis failed


class _Load:
    __slots__ = ("future", "key", "store")

    def __init__(self, key: CacheKey, future: asyncio.Future[Entry], store: bool) -> None:
        self.key = key
        self.future = future
        self.store = store  # False once invalidated, and for bypass loads


def _consume(future: asyncio.Future[Entry]) -> None:
    """Mark the exception of a load nobody awaited (early refresh) as retrieved."""
    if not future.cancelled():
        future.exception()


class CachedReader:
    """Reads entity groups through the L1 cache. ``cache=None`` reads Redis every time."""

    def __init__(
        self,
        registry: Registry,
        round_trip: RoundTrip,
        *,
        cache: LRUCache | None,
        breaker: CircuitBreaker | None = None,
        timeout: AdaptiveTimeouts | None = None,
        xfetch_beta: float = 1.0,
        single_flight: bool = True,
        on_round_trip: Callable[[float, int], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.registry = registry
        self.specs = {name: GroupSpec.of(g, registry) for name, g in registry.groups.items()}
        self.round_trip = round_trip
        self.cache = cache
        self.breaker = breaker or CircuitBreaker()
        self.timeout = timeout or AdaptiveTimeouts()
        self.beta = xfetch_beta
        self.single_flight = single_flight
        self.on_round_trip = on_round_trip
        self.rng = rng or random.Random()
        self.clock = cache.clock if cache is not None else time.monotonic
        self._inflight: dict[CacheKey, _Load] = {}
        self._pending: list[_Load] = []
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    # --- reads ---------------------------------------------------------------------------

    async def get(self, keys: Sequence[CacheKey], *, bypass: bool = False) -> list[Resolved]:
        if self.cache is None:
            return await self._direct(keys)
        if not self.single_flight:
            return await self._unshared(keys, bypass)
        cache = self.cache
        stats = cache.stats
        now = self.clock()
        out: list[Resolved | None] = [None] * len(keys)
        waits: list[tuple[int, CacheKey, asyncio.Future[Entry]]] = []
        if bypass:
            stats.bypasses += len(keys)
        inflight = self._inflight
        for i, key in enumerate(keys):
            if not bypass:
                entry = cache.get(key)
                if entry is not None and now < entry.expires_at:
                    out[i] = Resolved(entry, False)
                    if entry.values is None:
                        stats.negative_hits += 1
                    else:
                        stats.hits += 1
                        if key not in inflight and should_refresh_early(
                            entry, now, self.beta, self.rng
                        ):
                            stats.early_refreshes += 1
                            self._schedule(key, store=True)
                    continue
                load = inflight.get(key)
                if load is not None:
                    stats.deduplicated += 1
                    waits.append((i, key, load.future))
                    continue
            stats.misses += 1
            waits.append((i, key, self._schedule(key, store=not bypass).future))
        if waits:
            await self._wait(waits, out, now)
        return out  # type: ignore[return-value]  # every slot is filled above

    async def _wait(
        self,
        waits: list[tuple[int, CacheKey, asyncio.Future[Entry]]],
        out: list[Resolved | None],
        now: float,
    ) -> None:
        futures = [f for _, _, f in waits]
        # shield: cancelling this caller must not cancel loads other callers wait for
        if len(futures) == 1:
            with contextlib.suppress(Exception):  # looked at below, per key
                await asyncio.shield(futures[0])
        else:
            await asyncio.shield(asyncio.gather(*futures, return_exceptions=True))
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

    def _schedule(self, key: CacheKey, *, store: bool) -> _Load:
        future: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        load = _Load(key, future, store)
        if store:
            self._inflight[key] = load
        if not self.breaker.allow():
            self._fail([load], CircuitOpenError("Redis is unavailable (circuit open)"))
            return load
        self._pending.append(load)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return load

    def _flush(self) -> None:
        """Runs one loop tick after the first miss: send every queued miss at once."""
        self._flush_scheduled = False
        loads, self._pending = self._pending, []
        if not loads:
            return
        task = asyncio.get_running_loop().create_task(self._load(loads))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, loads: list[_Load]) -> None:
        """One round trip for ``loads``; every load's future is resolved, whatever happens."""
        try:
            await self._load_all(loads)
        except BaseException as error:
            # a bug or a cancellation past the round trip: nobody may wait forever
            if not isinstance(error, asyncio.CancelledError | FeatureStoreError):
                log.exception("failed to finish a Redis read of %d keys", len(loads))
                error = StoreError(f"the read failed: {type(error).__name__}")
            self._fail([ld for ld in loads if not ld.future.done()], error)
            if isinstance(error, asyncio.CancelledError):
                raise

    async def _load_all(self, loads: list[_Load]) -> None:
        by_entity: dict[bytes, list[_Load]] = {}
        for load in loads:
            by_entity.setdefault(load.key[1], []).append(load)
        specs = self.specs
        reads: list[Read] = [
            (entity_key, [specs[load.key[0]] for load in group_loads])
            for entity_key, group_loads in by_entity.items()
        ]
        try:
            replies, cost = await self._send(reads, len(loads))
        except StoreError as error:
            self._fail(loads, error)
            return
        except asyncio.CancelledError:  # at shutdown
            self._fail(loads, StoreUnavailableError("the serving process is shutting down"))
            raise
        cache = self.cache
        if cache is not None:
            stats = cache.stats
            stats.round_trips += 1
            stats.keys_loaded += len(loads)
            stats.coalesced += len(loads) - 1
        now = self.clock()
        for group_loads, reply in zip(by_entity.values(), replies, strict=True):
            if isinstance(reply, KeyDataError):  # this entity's data is bad, not Redis
                self._fail(group_loads, reply, count=False)
                continue
            offset = 0
            for load in group_loads:
                spec = self.specs[load.key[0]]
                part = reply[offset : offset + len(spec.fields)]
                offset += len(spec.fields)
                self._finish(load, spec, part, cost, now)

    def _finish(
        self, load: _Load, spec: GroupSpec, part: Sequence[bytes | None], cost: float, now: float
    ) -> None:
        if self._inflight.get(load.key) is load:
            del self._inflight[load.key]
        try:
            values = spec.decode(load.key[1], part)
            written_at = spec.written_at(load.key[1], part)
        except EncodingError as e:
            load.future.set_exception(e)
            return
        if load.store and self.cache is not None:
            entry = self.cache.put(load.key, values, written_at, cost, now)
        else:
            entry = Entry(values, written_at, now, cost, entry_size(values))
        load.future.set_result(entry)

    def _fail(self, loads: Iterable[_Load], error: BaseException, *, count: bool = True) -> None:
        if count and self.cache is not None:
            self.cache.stats.failed_loads += 1
        for load in loads:
            if self._inflight.get(load.key) is load:
                del self._inflight[load.key]
            if not load.future.done():
                load.future.set_exception(error)

    async def _send(self, reads: list[Read], nkeys: int) -> tuple[list[Reply], float]:
        """One round trip under the adaptive timeout, reported to the circuit breaker.

        Waiting for a free pooled connection is local overload, not Redis failing: it is
        bounded separately and does not count against the breaker.
        """
        timeout = self.timeout.for_keys(nkeys)
        t0 = time.perf_counter()
        try:
            replies = await self.round_trip(reads, timeout)
        except ConnectionWaitTimeout:
            raise
        except TimeoutError:
            self.breaker.failure()
            raise StoreTimeoutError(
                f"Redis did not answer within {timeout * 1000:.0f} ms"
            ) from None
        except StoreUnavailableError:
            self.breaker.failure()
            raise
        elapsed = time.perf_counter() - t0
        self.breaker.success()
        self.timeout.observe(elapsed, nkeys)
        if self.on_round_trip is not None:
            self.on_round_trip(elapsed, nkeys)
        return replies, elapsed

    async def _unshared(self, keys: Sequence[CacheKey], bypass: bool) -> list[Resolved]:
        """The cache without the debouncer: each request reads its own misses (a baseline)."""
        assert self.cache is not None
        cache, now = self.cache, self.clock()
        out: list[Resolved | None] = [None] * len(keys)
        misses = []
        for i, key in enumerate(keys):
            entry = None if bypass else cache.get(key)
            if entry is not None and now < entry.expires_at:
                cache.stats.hits += 1
                out[i] = Resolved(entry, False)
            else:
                cache.stats.misses += 1
                misses.append(i)
        if misses:
            loaded = await self._direct([keys[i] for i in misses])
            cache.stats.round_trips += 1
            for i, resolved in zip(misses, loaded, strict=True):
                e = resolved.entry
                out[i] = Resolved(cache.put(keys[i], e.values, e.written_at, e.cost), False)
        return out  # type: ignore[return-value]

    async def _direct(self, keys: Sequence[CacheKey]) -> list[Resolved]:
        """Without a cache: one pipeline per request, no sharing (the L1-off baseline)."""
        if not self.breaker.allow():
            raise CircuitOpenError("Redis is unavailable (circuit open)")
        reads: list[Read] = [(entity_key, [self.specs[group]]) for group, entity_key in keys]
        replies, cost = await self._send(reads, len(keys))
        now = self.clock()
        out = []
        for (group, entity_key), reply in zip(keys, replies, strict=True):
            if isinstance(reply, KeyDataError):
                raise reply
            spec = self.specs[group]
            values = spec.decode(entity_key, reply)
            entry = Entry(values, spec.written_at(entity_key, reply), now, cost, 0)
            out.append(Resolved(entry, False))
        return out

    # --- invalidation and shutdown -------------------------------------------------------

    def invalidate(self, keys: Iterable[CacheKey]) -> int:
        """Drop entries, and keep loads in flight for them from filling the cache."""
        if self.cache is None:
            return 0
        dropped = 0
        for key in keys:
            dropped += self.cache.discard(key)
            load = self._inflight.pop(key, None)
            if load is not None:
                load.store = False
        self.cache.stats.invalidations += dropped
        return dropped

    def invalidate_all(self) -> None:
        """After missed invalidations: every entry reloads on next use, stale-on-error kept."""
        if self.cache is not None:
            self.cache.expire_all()
            for load in self._inflight.values():
                load.store = False
            self._inflight.clear()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
