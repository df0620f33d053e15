"""Coalescing the read path's reads: what is queued in one event-loop tick goes to Redis in
one flush.

- ``SingleFlight``: the L1's loads, one per key. A miss on a key already being loaded waits
  for that load (the "debouncer": a thousand concurrent misses on one key cost one Redis
  read). The first load queued in a tick schedules a flush with ``loop.call_soon``, so
  every load queued by the requests running in that tick goes out in one pipeline; groups
  of one entity share one HMGET. A load's entry goes into the cache unless the load was
  disowned (invalidation: a read that started before a write must not put the pre-write
  value back). Where the native fronts load into the same cache, a flush claims the keys
  it stores there, so that a front's lookup that misses one waits for it, and waits in
  turn for the keys a front is loading already (``L1Store.claim``, ``wait_elsewhere``).
- ``Batches``: without a cache, each request's keys are queued the same way and read in
  round trips of up to FLUSH_KEYS keys: a thousand concurrent requests cost a few round
  trips, not a thousand (and not a thousand pooled connections). Each read is sent after
  its request arrived, so no request is answered with a read that started before it.

Loads and flushes run in tasks the owner (the reader) keeps, and every future is resolved
whatever happens: an error, a bug past the round trip, a cancellation at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from feature_store.errors import FeatureStoreError, StoreError, StoreUnavailableError
from feature_store.serving.l1.cache import CacheKey, Claimed, Entry, L1Store
from feature_store.serving.l1.reads import (
    CircuitOpenError,
    EntityReads,
    Resolved,
    StoreReads,
    by_entity,
    commands,
    replied,
)
from feature_store.serving.l1.roundtrip import consume

log = logging.getLogger(__name__)

FLUSH_KEYS = 1000  # keys per round trip of the reads of requests without a cache

Own = Callable[[asyncio.Task[None]], None]  # keeps a task until it is done


def _failure(error: BaseException, what: str) -> BaseException:
    """The error the waiters of a read get: a bug past the round trip becomes a
    StoreError (logged here) so that nobody waits forever or sees an internal type."""
    if isinstance(error, asyncio.CancelledError | FeatureStoreError):
        return error
    log.exception("failed to finish a Redis read of %s", what)
    return StoreError(f"the read failed: {type(error).__name__}")


class Load:
    __slots__ = ("bare", "future", "key", "proto", "store", "waited")

    def __init__(
        self,
        key: CacheKey,
        future: asyncio.Future[Entry],
        store: bool,
        proto: bool,
        bare: bool = False,
    ) -> None:
        self.key = key
        self.future = future
        self.store = store  # False once disowned, and for bypass loads
        self.proto = proto  # the entry keeps gRPC records, not JSON (``GroupSpec.entry``)
        self.bare = bare  # the entry keeps neither (its packed values alone)
        self.waited = False  # it waited for a front's load of its key once, which stored none


class SingleFlight:
    """The L1's loads: one per key in flight, queued loads flushed once per loop tick."""

    def __init__(self, reads: StoreReads, cache: L1Store, own: Own) -> None:
        self.reads = reads
        self.cache = cache
        self.own = own
        self.inflight: dict[CacheKey, Load] = {}
        self._pending: list[Load] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None  # of the pending flush

    def schedule(
        self, key: CacheKey, *, store: bool, proto: bool = False, bare: bool = False
    ) -> Load:
        """A load of ``key`` in the next flush; ``store``: it is the key's shared load,
        whose entry goes into the cache (a bypass read is neither). ``proto``: for a gRPC
        answer, the entry gets the values' gRPC records instead of their JSON (a REST
        answer makes that on first use, ``cache.entry_json``). ``bare``: for a caller that
        answers from the packed values (Feast's API, picked features, the warm start), the
        entry keeps no answer bytes; each API makes its own on first use."""
        # while a flush is pending, its loop is the running one: CPython's get_running_loop
        # makes a getpid system call each time, a tenth of the cost of a large batch's misses
        loop = self._loop
        if loop is None or not self._scheduled:
            loop = asyncio.get_running_loop()
        # no done callback: each would be a call of its own in the loop, a thousand per
        # flush of a large batch's misses; ``fail`` marks its exceptions retrieved instead
        future: asyncio.Future[Entry] = loop.create_future()
        load = Load(key, future, store, proto, bare)
        if store:
            self.inflight[key] = load
        if not self.reads.breaker.allow():
            self.fail([load], CircuitOpenError("Redis is unavailable (circuit open)"))
            return load
        self._pending.append(load)
        if not self._scheduled:
            self._scheduled = True
            self._loop = loop
            loop.call_soon(self._flush)
        return load

    def disown(self, key: CacheKey) -> None:
        """The load in flight for ``key`` (if any) will not fill the cache."""
        load = self.inflight.pop(key, None)
        if load is not None:
            load.store = False

    def disown_all(self) -> None:
        for load in self.inflight.values():
            load.store = False
        self.inflight.clear()

    def _flush(self) -> None:
        """Runs one loop tick after the first load: send every queued load at once."""
        self._scheduled = False
        loads, self._pending = self._pending, []
        self.own(asyncio.get_running_loop().create_task(self._load(loads)))

    async def _load(self, loads: list[Load]) -> None:
        """One round trip for ``loads``; every load's future is resolved, whatever happens."""
        try:
            await self._load_all(loads)
        except BaseException as error:
            failure = _failure(error, f"{len(loads)} keys")
            self.fail([ld for ld in loads if not ld.future.done()], failure)
            if isinstance(error, asyncio.CancelledError):
                raise

    async def _load_all(self, loads: list[Load]) -> None:
        # one read per key of the flush: loads of one key share it (a bypass request that
        # names an entity twice, a bypass beside a cached read), every one of them queued
        # before it is sent; groups of one entity share one command (``by_entity``)
        shared: dict[CacheKey, list[Load]] = {}
        for load in loads:
            same = shared.get(load.key)
            if same is None:
                shared[load.key] = [load]
            else:
                same.append(load)
        # the keys this flush stores, claimed where the native fronts load too: a front's
        # lookup that misses one meanwhile waits for this read instead of making its own,
        # and a key a front is loading already is waited for here in turn (``_wait_fronts``)
        claim = self.cache.claim([k for k, same in shared.items() if any(ld.store for ld in same)])
        try:
            waits: dict[CacheKey, list[Load]] = {}
            for key in self.cache.elsewhere(claim):
                waiting = [ld for ld in shared.get(key, ()) if ld.store and not ld.waited]
                if waiting:
                    waits[key] = waiting
                    rest = [ld for ld in shared[key] if ld not in waiting]
                    if rest:
                        shared[key] = rest
                    else:
                        del shared[key]
            reading = [ld for same in shared.values() for ld in same]
            entities = by_entity(shared, self.reads.specs)
            if not waits:
                await self._read(reading, shared, entities)
            elif not shared:
                await self._wait_fronts(claim, waits)
            else:
                await asyncio.gather(
                    self._read(reading, shared, entities), self._wait_fronts(claim, waits)
                )
        finally:
            if claim is not None:
                claim.end()

    async def _wait_fronts(self, claim: Claimed | None, waits: dict[CacheKey, list[Load]]) -> None:
        """The loads of keys a native front was loading already: resolved with the entry that
        load stored, once it ends (at most the longest round trip's timeout); those it did
        not store (its read failed, an invalidation, an entry not admitted) are read in the
        next flush, without waiting again."""
        await self.cache.wait_elsewhere(claim, self.reads.timeout.cap)
        now = self.reads.clock()
        again: list[Load] = []
        for key, waiting in waits.items():
            entry = self.cache.peek(key)
            if entry is None or now >= entry.expires_at or entry.fault is not None:
                for load in waiting:
                    load.waited = True
                again += [load for load in waiting if not load.future.done()]
                continue
            for load in waiting:
                if self.inflight.get(key) is load:
                    del self.inflight[key]
                if not load.future.done():
                    load.future.set_result(entry)
        if again:
            self._pending += again
            if not self._scheduled:
                self._scheduled = True
                self._loop = asyncio.get_running_loop()
                self._loop.call_soon(self._flush)

    async def _read(
        self, loads: list[Load], shared: dict[CacheKey, list[Load]], entities: EntityReads
    ) -> None:
        try:
            replies, cost = await self.reads.send(commands(entities), len(shared))
        except StoreError as error:
            self.fail(loads, error)
            return
        except asyncio.CancelledError:  # at shutdown
            self.fail(loads, StoreUnavailableError("the serving process is shutting down"))
            raise
        stats = self.cache.stats
        stats.round_trips += 1
        stats.keys_loaded += len(shared)
        stats.coalesced += len(shared) - 1
        now = self.reads.clock()
        # every load's entry first, then the kept ones stored together (the bounds enforced
        # once), then the callers woken
        entry_of, inflight = self.reads.entry, self.inflight
        stored: list[Entry] = []
        settled: list[tuple[Load, Entry]] = []
        for key, spec, reply, offset in replied(entities, replies):
            for load in shared[key]:
                if inflight.get(key) is load:
                    del inflight[key]
                entry = entry_of(spec, key, reply, offset, load.proto, load.bare)
                entry.cost = cost
                if load.store:
                    stored.append(entry)
                else:
                    entry.expires_at = entry.loaded_at = now
                settled.append((load, entry))
        self.cache.put_many(stored, now)
        for load, entry in settled:
            if not load.future.done():
                load.future.set_result(entry)

    def fail(self, loads: Iterable[Load], error: BaseException) -> None:
        self.cache.stats.failed_loads += 1
        for load in loads:
            if self.inflight.get(load.key) is load:
                del self.inflight[load.key]
            if not load.future.done():
                load.future.set_exception(error)
                load.future.exception()  # retrieved: a load nobody awaits (early refresh)


class _Batch:
    """The keys of one request without a cache, read in the next flush, and the form its
    entries take (``GroupSpec.entry``): (proto, bare)."""

    __slots__ = ("form", "future", "keys")

    def __init__(
        self,
        keys: Sequence[CacheKey],
        form: tuple[bool, bool],
        future: asyncio.Future[list[Resolved]],
    ) -> None:
        self.keys = keys
        self.form = form
        self.future = future


class Batches:
    """Requests without a cache: their keys are read in the next flush, with the keys of
    every request of that loop tick, in round trips of up to FLUSH_KEYS keys."""

    def __init__(self, reads: StoreReads, own: Own) -> None:
        self.reads = reads
        self.own = own
        self._batches: list[_Batch] = []
        self._scheduled = False

    async def read(
        self, keys: Sequence[CacheKey], proto: bool, bare: bool = False
    ) -> list[Resolved]:
        """The entries of ``keys``, for a gRPC answer (``proto``), a REST one, or (``bare``)
        one written from the packed values alone (``StoreReads.direct``)."""
        # the circuit is asked at the flush (``StoreReads.direct``): asking here too would
        # spend a half-open circuit's one probe on a question and never send it
        future: asyncio.Future[list[Resolved]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(consume)
        self._batches.append(_Batch(keys, (proto and not bare, bare), future))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        # shield: cancelling this caller must not cancel a round trip others wait for
        return await asyncio.shield(future)

    def _flush(self) -> None:
        self._scheduled = False
        batches, self._batches = self._batches, []
        self.own(asyncio.get_running_loop().create_task(self._read_batches(batches)))

    async def _read_batches(self, batches: list[_Batch]) -> None:
        """Round trips of up to FLUSH_KEYS keys (one form each: REST entries, gRPC ones or
        bare ones), sent together; every future is resolved."""
        chunks: list[list[_Batch]] = []
        for form in ((False, False), (True, False), (False, True)):
            size = FLUSH_KEYS  # start a new chunk
            for batch in batches:
                if batch.form != form:
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
            resolved = await self.reads.direct(keys, *chunk[0].form)
        except BaseException as error:
            failure = _failure(error, f"{len(keys)} keys")
            for batch in chunk:
                if not batch.future.done():
                    batch.future.set_exception(failure)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        start = 0
        for batch in chunk:
            if not batch.future.done():
                batch.future.set_result(resolved[start : start + len(batch.keys)])
            start += len(batch.keys)
