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
6. One entity whose stored data cannot be read (a value that does not decode, a corrupt
   write time, a key of another type) is that entity's problem, not the batch's: it gets a
   fault entry (``Entry.fault``; answered with status "error", cached like a missing
   entity), and every other key of the round trip is answered as usual.

Invalidation drops the entry and disowns a load in flight for the key, so a read that
started before a write cannot put the pre-write value back into the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from feature_store.errors import (
    EncodingError,
    EntityDataError,
    FeatureStoreError,
    StoreError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from feature_store.registry import Registry
from feature_store.serving.breaker import AdaptiveTimeouts, CircuitBreaker, CircuitState
from feature_store.serving.cache import CacheKey, Entry, LRUCache, should_refresh_early
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


REFRESH_BATCH = 500  # keys per round trip of a background refresh after a batch write
REFRESH_TICK = 0.05  # seconds: refreshes of entries near expiry are sent together this often
# XFetch refreshes when the time to expiry is at most cost x beta x -ln(u), u uniform in
# (0, 1]: random() is a multiple of 2**-53, so -ln(u) <= 36.8 and an entry further from
# expiry than cost x beta x 37 is never refreshed early; the hit path skips the draw
XFETCH_HORIZON = 37.0
SHADOW_QUEUE = 10_000  # sampled hits waiting for their shadow read; the oldest go first
FAULT_LOG_EVERY = 10.0  # seconds: at most one log line per fault reason this often


class FaultLog:
    """Logs entities whose stored data cannot be read, at most one line per reason every
    FAULT_LOG_EVERY seconds, with how many more were seen: a broken hot key read on every
    refresh must not flood the log."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def __call__(self, error: EntityDataError) -> None:
        now, reason = self.clock(), error.reason
        last = self._last.get(reason)
        if last is not None and now - last < FAULT_LOG_EVERY:
            self._quiet[reason] = self._quiet.get(reason, 0) + 1
            return
        self._last[reason] = now
        more = self._quiet.pop(reason, 0)
        log.warning(
            "unreadable stored data (%s), served as status error: %s%s",
            reason,
            error,
            f" (and {more} more in the last {now - last:.0f} s)" if more and last else "",
        )


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
        refresh_rate: float = 5000.0,
        shadow_fraction: float = 0.0,
        refresh_ahead: float = 0.0,
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
        # batch writes announced per group (unix seconds): entries read before are refreshed
        self.generations: dict[str, float] = {}
        self._marks: dict[str, float] = {}  # the same on this loader's clock
        self.refresh_rate = refresh_rate
        self._sweeps: dict[str, asyncio.Task[None]] = {}
        # entries hit in the last ``refresh_ahead`` of their lifetime: refreshed together
        self.refresh_ahead = refresh_ahead
        self._due: dict[CacheKey, None] = {}
        self._due_timer: asyncio.TimerHandle | None = None
        # shadow mode: a sample of hits is re-read from Redis and compared
        self.shadow_fraction = shadow_fraction
        self._shadow: deque[tuple[CacheKey, Entry]] = deque(maxlen=SHADOW_QUEUE)
        self._shadow_wakeup: asyncio.Event | None = None
        self.on_shadow_mismatch: Callable[[float], None] | None = None
        self.log_fault = FaultLog(self.clock)

    # --- reads ---------------------------------------------------------------------------

    async def get(
        self, keys: Sequence[CacheKey], *, bypass: bool = False, proto: bool = False
    ) -> list[Resolved]:
        if self.cache is None:
            return await self._direct(keys, proto)
        if not self.single_flight:
            return await self._unshared(keys, bypass)
        cache = self.cache
        stats = cache.stats
        now = self.clock()
        out: list[Resolved | None] = [None] * len(keys)
        waits: list[tuple[int, CacheKey, asyncio.Future[Entry]]] = []
        if bypass:
            stats.bypasses += len(keys)
        inflight, generations, ahead = self._inflight, self.generations, self.refresh_ahead
        horizon = self.beta * XFETCH_HORIZON
        cache_get = cache.get
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
                        remaining = entry.expires_at - now
                        if key in inflight:
                            pass
                        elif generations and self._outdated(key[0], entry):
                            stats.generation_refreshes += 1  # served now, refreshed for next
                            self._schedule(key, store=True)
                        elif remaining < ahead * (entry.expires_at - entry.loaded_at) or (
                            remaining <= entry.cost * horizon
                            and should_refresh_early(entry, now, self.beta, self.rng)
                        ):
                            self._refresh_soon(key)
                        if self.shadow_fraction and self.rng.random() < self.shadow_fraction:
                            self._sample(key, entry)
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
            offset = 0
            for load in group_loads:
                spec = self.specs[load.key[0]]
                self._finish(load, spec, reply, offset, cost, now)
                offset += len(spec.fields)

    def _entry(
        self, spec: GroupSpec, key: CacheKey, reply: Reply, offset: int = 0, proto: bool = False
    ) -> Entry:
        """The entry of ``key`` in a read's reply; a fault entry when the entity's stored
        data cannot be read (its error reply, or bytes that do not decode), logged."""
        try:
            if isinstance(reply, KeyDataError):  # this entity's key is bad, not Redis
                raise reply
            return spec.entry(key, reply, offset, proto)
        except EncodingError as e:
            error = e if isinstance(e, EntityDataError) else EntityDataError(str(e))
            self.log_fault(error)
            return spec.fault_entry(key, error)

    def _finish(
        self, load: _Load, spec: GroupSpec, reply: Reply, offset: int, cost: float, now: float
    ) -> None:
        if self._inflight.get(load.key) is load:
            del self._inflight[load.key]
        entry = self._entry(spec, load.key, reply, offset)
        entry.cost = cost
        if load.store and self.cache is not None:
            self.cache.put(entry, now)
        else:
            entry.expires_at = entry.loaded_at = now
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
                out[i] = Resolved(cache.put(resolved.entry), False)
        return out  # type: ignore[return-value]

    async def _direct(self, keys: Sequence[CacheKey], proto: bool = False) -> list[Resolved]:
        """Without a cache: one pipeline per request, no sharing (the L1-off baseline).
        ``proto``: the entries are for a gRPC answer (``GroupSpec.entry``)."""
        if not self.breaker.allow():
            raise CircuitOpenError("Redis is unavailable (circuit open)")
        reads: list[Read] = [(entity_key, [self.specs[group]]) for group, entity_key in keys]
        replies, cost = await self._send(reads, len(keys))
        now = self.clock()
        out = []
        for key, reply in zip(keys, replies, strict=True):
            entry = self._entry(self.specs[key[0]], key, reply, proto=proto)
            entry.cost, entry.expires_at, entry.loaded_at = cost, now, now
            out.append(Resolved(entry, False))
        return out

    # --- refresh ahead: hot entries are reloaded before they expire, in batches -----------

    def _refresh_soon(self, key: CacheKey) -> None:
        """Queue a background reload of an entry near its expiry. The queue goes to Redis
        every REFRESH_TICK in one pipeline: entries expire at scattered times (jitter), and
        reloading each on its own tick would cost a round trip apiece. A hot entry is
        reloaded before it expires and never misses; a cold one expires and is evicted."""
        if key in self._due:
            return
        self._due[key] = None
        assert self.cache is not None
        self.cache.stats.early_refreshes += 1
        if self._due_timer is None:
            self._due_timer = asyncio.get_running_loop().call_later(REFRESH_TICK, self._refresh_due)

    def _refresh_due(self) -> None:
        self._due_timer = None
        due, self._due = self._due, {}
        assert self.cache is not None
        for key in due:
            if key not in self._inflight and self.cache.peek(key) is not None:
                self._schedule(key, store=True)

    # --- batch writes: refresh older entries in the background -----------------------------

    def _outdated(self, group: str, entry: Entry) -> bool:
        mark = self._marks.get(group) if self._marks else None
        return mark is not None and entry.loaded_at < mark

    def new_generation(self, group: str, generation: float) -> None:
        """A batch write of ``group`` that ended at ``generation`` (unix seconds) was
        announced.

        Entries read from Redis before it are refreshed: on their next hit (which is still
        answered from the entry), and by a background sweep at ``refresh_rate`` keys per
        second in coalesced round trips, so that a nightly refresh of every entity neither
        drops the cache at once nor sends every key to Redis at once. Read time, not the
        values' event time: a bulk write of old events changes entries all the same.
        """
        if group not in self.specs or generation <= self.generations.get(group, 0):
            return
        self.generations[group] = generation  # also without a cache: the metrics report it
        self._marks[group] = self.clock() - (time.time() - generation)
        if self.cache is None:
            return
        previous = self._sweeps.pop(group, None)
        if previous is not None:
            previous.cancel()
        task = asyncio.get_running_loop().create_task(self._sweep(group))
        self._sweeps[group] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep(self, group: str) -> None:
        assert self.cache is not None
        cache = self.cache
        batch = max(1, min(REFRESH_BATCH, int(self.refresh_rate)))
        keys = cache.keys(group, most_recent_first=True)  # the hottest first
        for start in range(0, len(keys), batch):
            for key in keys[start : start + batch]:
                entry = cache.peek(key)
                if entry is None or key in self._inflight:
                    continue
                if entry.raw is None:
                    cache.discard(key)  # "missing" may no longer be true
                elif self._outdated(group, entry):
                    cache.stats.generation_refreshes += 1
                    self._schedule(key, store=True)
            await asyncio.sleep(batch / self.refresh_rate)

    # --- shadow mode: how consistent is the cache? -----------------------------------------

    def _sample(self, key: CacheKey, entry: Entry) -> None:
        self._shadow.append((key, entry))  # a full queue drops its oldest sample
        if self._shadow_wakeup is None:
            self._shadow_wakeup = asyncio.Event()
            task = asyncio.get_running_loop().create_task(self._shadow_loop())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._shadow_wakeup.set()

    async def _shadow_loop(self) -> None:
        """Re-read sampled hits from Redis, off the request path, and compare."""
        assert self._shadow_wakeup is not None
        assert self.cache is not None
        stats = self.cache.stats
        while True:
            await self._shadow_wakeup.wait()
            self._shadow_wakeup.clear()
            while self._shadow:
                samples = [self._shadow.popleft() for _ in range(min(500, len(self._shadow)))]
                if self.breaker.state is not CircuitState.CLOSED:
                    continue  # Redis is in trouble: no extra reads, and not a mismatch
                reads: list[Read] = [(key[1], [self.specs[key[0]]]) for key, _ in samples]
                try:
                    replies = await self.round_trip(reads, self.timeout.cap)
                except (StoreError, TimeoutError):
                    continue
                except Exception:
                    log.exception("a shadow read failed")
                    continue
                now = self.clock()
                for (key, entry), reply in zip(samples, replies, strict=True):
                    try:
                        if isinstance(reply, KeyDataError):
                            raise reply
                        now_stored = self.specs[key[0]].entry(key, reply)
                        raw, written_at = now_stored.raw, now_stored.written_at
                    except EncodingError:
                        raw, written_at = None, None
                    stats.shadow_checks += 1
                    # the stored bytes themselves: equal bytes are equal values
                    if written_at != entry.written_at or raw != entry.raw:
                        stats.shadow_mismatches += 1
                        if self.on_shadow_mismatch is not None:
                            self.on_shadow_mismatch(now - entry.loaded_at)

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
        if self._due_timer is not None:
            self._due_timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
