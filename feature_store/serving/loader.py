"""The L1 read path: cache hits, single-flight, coalescing, stale-on-error.

``CachedReader.get(keys)`` answers (group, entity key) pairs:

1. A fresh entry is a hit. A hit may also start a background reload, which the caller does
   not wait for: when is the refresh policy's to say (refresh.py: batch writes, refresh
   ahead, XFetch); a sample of hits is checked against Redis (shadow.py).
2. A miss on a key that is already being loaded waits for that load (single-flight, the
   "debouncer"): a thousand concurrent misses on one key cost one Redis read.
3. Other misses are queued. The first miss of an event-loop tick schedules a flush with
   ``loop.call_soon``, so every miss queued by the requests running in that tick goes to
   Redis in one pipeline (coalescing). Groups of one entity share one HMGET. Without a
   cache, each request's keys are queued for the flush the same way (``_uncached``): a
   thousand concurrent requests cost a few round trips, not a thousand (and not a
   thousand pooled connections).
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
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from feature_store.errors import (
    EncodingError,
    EntityDataError,
    FeatureStoreError,
    StoreError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from feature_store.registry import Registry
from feature_store.serving.breaker import AdaptiveTimeouts, CircuitBreaker
from feature_store.serving.cache import CacheKey, Entry, LRUCache
from feature_store.serving.refresh import Refresher
from feature_store.serving.roundtrip import (
    ConnectionWaitTimeout,
    KeyDataError,
    Read,
    Reply,
    RoundTrip,
)
from feature_store.serving.shadow import ShadowChecker
from feature_store.serving.spec import GroupSpec

log = logging.getLogger(__name__)


class CircuitOpenError(StoreUnavailableError):
    """Redis failed repeatedly; reads fail fast until a probe succeeds."""


FLUSH_KEYS = 1000  # keys per round trip of the reads of requests without a cache
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


class _Batch:
    """The keys of one request without a cache, read in the next flush."""

    __slots__ = ("future", "keys", "proto")

    def __init__(
        self, keys: Sequence[CacheKey], proto: bool, future: asyncio.Future[list[Resolved]]
    ) -> None:
        self.keys = keys
        self.proto = proto
        self.future = future


def _consume(future: asyncio.Future[Any]) -> None:
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
        self.single_flight = single_flight
        self.on_round_trip = on_round_trip
        self.rng = rng or random.Random()
        self.clock = cache.clock if cache is not None else time.monotonic
        self._inflight: dict[CacheKey, _Load] = {}
        self._pending: list[_Load] = []
        self._batches: list[_Batch] = []  # requests without a cache, for the next flush
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.log_fault = FaultLog(self.clock)
        # the policies: when an entry is reloaded early (refresh.py), how hits are checked
        # against Redis (shadow.py); the reader does the reading for both
        self.refresher: Refresher | None = None
        self.shadow: ShadowChecker | None = None
        self._generations: dict[str, float] = {}  # announced batch writes, without a cache
        self.shadow_fraction = shadow_fraction if cache is not None else 0.0
        if cache is not None:
            self.refresher = Refresher(
                cache,
                frozenset(self.specs),
                self._reload,
                self._inflight.__contains__,
                self._own,
                clock=self.clock,
                rng=self.rng,
                xfetch_beta=xfetch_beta,
                refresh_ahead=refresh_ahead,
                refresh_rate=refresh_rate,
            )
            self.shadow = ShadowChecker(
                cache.stats,
                self.specs,
                round_trip,
                self.breaker,
                self.timeout,
                self._own,
                self.clock,
            )

    @property
    def generations(self) -> dict[str, float]:
        """Batch writes announced per group (unix seconds)."""
        return self.refresher.generations if self.refresher is not None else self._generations

    @property
    def on_shadow_mismatch(self) -> Callable[[float], None] | None:
        return self.shadow.on_mismatch if self.shadow is not None else None

    @on_shadow_mismatch.setter
    def on_shadow_mismatch(self, observe: Callable[[float], None] | None) -> None:
        if self.shadow is not None:
            self.shadow.on_mismatch = observe

    # --- reads ---------------------------------------------------------------------------

    async def get(
        self, keys: Sequence[CacheKey], *, bypass: bool = False, proto: bool = False
    ) -> list[Resolved]:
        if self.cache is None:
            if not self.single_flight:
                return await self._direct(keys, proto)
            return await self._uncached(keys, proto)
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
        on_hit = self.refresher.on_hit if self.refresher is not None else None
        shadow = self.shadow if self.shadow_fraction else None
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
                        if on_hit is not None and key not in inflight:
                            on_hit(key, entry, now)
                        if shadow is not None and self.rng.random() < self.shadow_fraction:
                            shadow.sample(key, entry)
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

    def noted_hit(self, key: CacheKey, now: float) -> None:
        """A hit answered elsewhere (the native REST front, hits.py) on an entry inside its
        refresh window: the policy a hit here would run."""
        if self.cache is None or self.refresher is None:
            return
        entry = self.cache.get(key)  # also marks it used
        if entry is None or entry.raw is None or now >= entry.expires_at or key in self._inflight:
            return
        self.refresher.on_hit(key, entry, now)

    def shadow_sample(self, key: CacheKey) -> None:
        """A hit answered elsewhere, sampled there for a shadow check."""
        entry = self.cache.peek(key) if self.cache is not None else None
        if self.shadow is not None and entry is not None and entry.raw is not None:
            self.shadow.sample(key, entry)

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

    async def _uncached(self, keys: Sequence[CacheKey], proto: bool) -> list[Resolved]:
        """Without a cache: this request's keys join the next flush, with the keys of every
        request of this loop tick, in round trips of up to FLUSH_KEYS keys. Each read is
        sent after its request arrived, so no request is answered with a read that started
        before it (no sharing of reads in flight, unlike single-flight over the cache)."""
        # the circuit is asked at the flush (``_direct``): asking here too would spend a
        # half-open circuit's one probe on a question and never send it
        future: asyncio.Future[list[Resolved]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        self._batches.append(_Batch(keys, proto, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        # shield: cancelling this caller must not cancel a round trip others wait for
        return await asyncio.shield(future)

    async def _read_batches(self, batches: list[_Batch]) -> None:
        """The flush of requests without a cache: round trips of up to FLUSH_KEYS keys (one
        form each: REST entries or gRPC ones), sent together; every future is resolved."""
        chunks: list[list[_Batch]] = []
        for proto in (False, True):
            size = FLUSH_KEYS  # start a new chunk
            for batch in batches:
                if batch.proto is not proto:
                    continue
                if size + len(batch.keys) > FLUSH_KEYS:
                    chunks.append([])
                    size = 0
                chunks[-1].append(batch)
                size += len(batch.keys)
        await asyncio.gather(*(self._read_chunk(chunk) for chunk in chunks))

    async def _read_chunk(self, chunk: list[_Batch]) -> None:
        keys = [key for batch in chunk for key in batch.keys]
        try:
            resolved = await self._direct(keys, chunk[0].proto)
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError | FeatureStoreError):
                log.exception("failed to finish a Redis read of %d keys", len(keys))
                error = StoreError(f"the read failed: {type(error).__name__}")
            for batch in chunk:
                if not batch.future.done():
                    batch.future.set_exception(error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        start = 0
        for batch in chunk:
            if not batch.future.done():
                batch.future.set_result(resolved[start : start + len(batch.keys)])
            start += len(batch.keys)

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
        batches, self._batches = self._batches, []
        loop = asyncio.get_running_loop()
        if loads:
            self._own(loop.create_task(self._load(loads)))
        if batches:
            self._own(loop.create_task(self._read_batches(batches)))

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
        # one read per key of the flush: loads of one key share it (a bypass request that
        # names an entity twice, a bypass beside a cached read), every one of them queued
        # before it is sent; groups of one entity share one HMGET
        shared: dict[CacheKey, list[_Load]] = {}
        for load in loads:
            shared.setdefault(load.key, []).append(load)
        by_entity: dict[bytes, list[CacheKey]] = {}
        for key in shared:
            by_entity.setdefault(key[1], []).append(key)
        specs = self.specs
        reads: list[Read] = [
            (entity_key, [specs[key[0]] for key in group_keys])
            for entity_key, group_keys in by_entity.items()
        ]
        try:
            replies, cost = await self._send(reads, len(shared))
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
            stats.keys_loaded += len(shared)
            stats.coalesced += len(shared) - 1
        now = self.clock()
        for group_keys, reply in zip(by_entity.values(), replies, strict=True):
            offset = 0
            for key in group_keys:
                spec = specs[key[0]]
                for load in shared[key]:
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
        """One pipeline per request, no sharing: without the debouncer (single_flight off:
        the baseline it is measured against), and the misses of ``_unshared``.
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

    # --- what the policies ask of the reader ---------------------------------------------

    def _reload(self, key: CacheKey) -> None:
        """A background load of ``key`` that stores its entry (the caller does not wait)."""
        self._schedule(key, store=True)

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def new_generation(self, group: str, generation: float) -> None:
        """A batch write of ``group`` that ended at ``generation`` (unix seconds) was
        announced: entries read before it are refreshed in the background (refresh.py)."""
        if self.refresher is not None:
            assert self.cache is not None
            mirror = self.cache.mirror
            if self.refresher.new_generation(group, generation) and mirror is not None:
                mirror.notice_group(group)  # its hits elsewhere come here (hits.py)
        elif group in self.specs and generation > self._generations.get(group, 0):
            self._generations[group] = generation  # the metrics report it

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
        if self.refresher is not None:
            self.refresher.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
