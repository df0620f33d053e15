"""The read path's I/O: one round trip to Redis under the adaptive timeout and the circuit
breaker, and its replies decoded into cache entries.

Everything that decides *when* to read (the L1's hits, single-flight, coalescing,
stale-on-error) is elsewhere: loader.py and flight.py. This module only reads.

- ``StoreReads.send``: one pipelined round trip (roundtrip.py) bounded by the adaptive
  timeout of its size class; a timeout or Redis being unreachable counts against the
  breaker, waiting for a free pooled connection does not (that is local overload).
- ``StoreReads.entry``: one entity's reply as an ``Entry``. An entity whose stored data
  cannot be read (an error reply, bytes that do not decode) gets a fault entry, logged at
  most once per reason every FAULT_LOG_EVERY seconds; the other entities of the round trip
  are answered as usual.
- ``StoreReads.direct``: one round trip for one request's keys, no sharing: the reads of
  a reader without the debouncer (the baseline it is measured against) and the flushes of
  requests without a cache.

Either way, the groups of one entity are read with one command (``by_entity``), an HMGET
of all their fields or an HGETALL: a lookup of two groups of an entity costs Redis one
command per entity, not two (the native fronts' planned reads read them so too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar

from feature_store.errors import (
    EncodingError,
    EntityDataError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from feature_store.serving.l1.breaker import AdaptiveTimeouts, CircuitBreaker
from feature_store.serving.l1.cache import CacheKey, Entry
from feature_store.serving.l1.roundtrip import (
    ConnectionWaitTimeout,
    KeyDataError,
    NativeRoundTrip,
    Read,
    Reply,
    RoundTrip,
)
from feature_store.serving.l1.spec import GroupSpec

log = logging.getLogger(__name__)

T = TypeVar("T")
FAULT_LOG_EVERY = 10.0  # seconds: at most one log line per fault reason this often


# per entity key: its cache keys read, and their groups' specs, in the order of the reply
EntityReads = dict[bytes, tuple[list[CacheKey], list[GroupSpec]]]


def by_entity(keys: Iterable[CacheKey], specs: Mapping[str, GroupSpec]) -> EntityReads:
    """``keys`` (each once) by entity, in the order first seen: one command reads all of
    an entity's groups (``roundtrip.pack``), their fields one group after another."""
    entities: EntityReads = {}
    for key in keys:
        group, entity_key = key
        read = entities.get(entity_key)
        if read is None:
            entities[entity_key] = ([key], [specs[group]])
        else:
            read[0].append(key)
            read[1].append(specs[group])
    return entities


def commands(entities: EntityReads) -> list[Read]:
    """The reads ``StoreReads.send`` sends for ``entities``: one per entity."""
    return [(entity_key, read[1]) for entity_key, read in entities.items()]


def replied(
    entities: EntityReads, replies: Sequence[Reply]
) -> Iterator[tuple[CacheKey, GroupSpec, Reply, int]]:
    """Each key of ``entities`` with its group's spec, its entity's reply and where the
    group's values start in it."""
    for (keys, specs), reply in zip(entities.values(), replies, strict=True):
        offset = 0
        for key, spec in zip(keys, specs, strict=True):
            yield key, spec, reply, offset
            offset += len(spec.fields)


class CircuitOpenError(StoreUnavailableError):
    """Redis failed repeatedly; reads fail fast until a probe succeeds."""


class Resolved(NamedTuple):
    entry: Entry
    stale: bool  # served from an expired entry because Redis failed


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


class StoreReads:
    """Round trips to Redis for the read path, and their replies as entries."""

    def __init__(
        self,
        specs: Mapping[str, GroupSpec],
        round_trip: RoundTrip,
        breaker: CircuitBreaker,
        timeout: AdaptiveTimeouts,
        clock: Callable[[], float],
    ) -> None:
        self.specs = specs
        self.round_trip = round_trip
        self.breaker = breaker
        self.timeout = timeout
        self.clock = clock
        self.on_round_trip: Callable[[float, int], None] | None = None  # (seconds, keys)
        self.log_fault = FaultLog(clock)

    async def send(self, reads: list[Read], nkeys: int) -> tuple[list[Reply], float]:
        """One round trip under the adaptive timeout, reported to the circuit breaker.

        Waiting for a free pooled connection is local overload, not Redis failing: it is
        bounded separately and does not count against the breaker.
        """
        return await self._bounded(lambda timeout: self.round_trip(reads, timeout), nkeys)

    async def send_packed(self, data: bytes, counts: Sequence[int]) -> tuple[bytes, list[int]]:
        """``data`` (the commands of several lookups, ``counts`` of them each, as
        ``roundtrip.pack`` writes them) in one round trip, as ``send`` sends reads, after
        asking the circuit: their replies' bytes, unread, and where each lookup's replies
        end (``NativeRoundTrip.packed``: the planned reads of the native fronts)."""
        round_trip = self.round_trip
        if not isinstance(round_trip, NativeRoundTrip):
            raise TypeError("planned reads need the native round trip (one Redis node)")
        if not self.breaker.allow():
            raise CircuitOpenError("Redis is unavailable (circuit open)")
        got, _ = await self._bounded(lambda t: round_trip.packed(data, counts, t), sum(counts))
        return got

    async def _bounded(
        self, exchange: Callable[[float], Awaitable[T]], nkeys: int
    ) -> tuple[T, float]:
        """``exchange(timeout)`` under the adaptive timeout of ``nkeys`` keys, reported to
        the breaker and the round-trip metrics; its result and how long it took."""
        timeout = self.timeout.for_keys(nkeys)
        t0 = time.perf_counter()
        try:
            replies = await exchange(timeout)
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

    def entry(
        self,
        spec: GroupSpec,
        key: CacheKey,
        reply: Reply,
        offset: int = 0,
        proto: bool = False,
        bare: bool = False,
    ) -> Entry:
        """The entry of ``key`` in a read's reply; a fault entry when the entity's stored
        data cannot be read (its error reply, or bytes that do not decode), logged."""
        try:
            if isinstance(reply, KeyDataError):  # this entity's key is bad, not Redis
                raise reply
            return spec.entry(key, reply, offset, proto, bare)
        except EncodingError as e:
            error = e if isinstance(e, EntityDataError) else EntityDataError(str(e))
            self.log_fault(error)
            return spec.fault_entry(key, error)

    async def direct(
        self, keys: Sequence[CacheKey], proto: bool = False, bare: bool = False
    ) -> list[Resolved]:
        """One round trip for ``keys`` (an entity's groups read with one command), no sharing
        with other calls; the entries are not cached (they expire as they are read).
        ``proto``: the entries are for a gRPC answer; ``bare``: for one written from the
        packed values (``GroupSpec.entry``)."""
        if not self.breaker.allow():
            raise CircuitOpenError("Redis is unavailable (circuit open)")
        read: Iterable[tuple[CacheKey, GroupSpec, Reply, int]]
        if len({group for group, _ in keys}) == 1:
            # one group (most lookups): a command per key, as they come
            spec = self.specs[keys[0][0]]
            replies, cost = await self.send([(key[1], [spec]) for key in keys], len(keys))
            read = ((key, spec, reply, 0) for key, reply in zip(keys, replies, strict=True))
        else:
            # several: one command per entity reads its groups (a key named twice, once)
            unique = dict.fromkeys(keys)
            entities = by_entity(unique, self.specs)
            replies, cost = await self.send(commands(entities), len(unique))
            read = replied(entities, replies)
        now = self.clock()
        entries: dict[CacheKey, Entry] = {}
        for key, spec, reply, offset in read:
            entry = self.entry(spec, key, reply, offset, proto=proto, bare=bare)
            entry.cost, entry.expires_at, entry.loaded_at = cost, now, now
            entries[key] = entry
        return [Resolved(entries[key], False) for key in keys]
