"""The L1 cache's storage: entity-group entries bounded by bytes and entries.

The unit cached is one entity's whole feature group (every feature of the group plus the
group's write timestamp), keyed by (group, entity key). Any request for any subset of a
group's features is then served from one entry, and the statuses are computed per request
from the timestamp, so that a value turns stale in the cache exactly when it would in Redis.

Expired entries are not dropped at once: they stay (evictable as usual) for
``max_stale`` seconds so that a Redis failure can still be answered with them, marked stale.

``L1Store`` is what the read path's policy (loader.py, flight.py, refresh.py, shadow.py,
warm.py) asks of a store. It has two: the worker's one cache in the extension
(native_cache.py: the same entries the native fronts answer from and load into), and
``LRUCache`` here, the pure-Python reference of the same semantics, used with
``FEATURE_STORE_NATIVE=off`` (or without the extension) and by the tests of the policy.

``LRUCache`` is a small OrderedDict LRU rather than a library (cachetools et al.) because it
needs three things those do not combine: a byte bound with per-entry sizes, entries kept
past their TTL for stale-on-error, and XFetch's per-entry recompute time.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from feature_store.batch import Fault
from feature_store.native import GroupFormat
from feature_store.serialization import Value

CacheKey = tuple[str, bytes]  # (group name, entity key)

# What an entry costs besides its bytes objects' contents, measured with tracemalloc on
# CPython 3.11 (tests/unit/test_cache.py checks it): the Entry object, the key tuple and
# bytes, the OrderedDict's slot and link, and each bytes object's header.
ENTRY_OVERHEAD = 400
BYTES_OBJECT = 33
FAULT_OVERHEAD = 160  # a Fault object and its message's str header


@dataclass(slots=True, eq=False)
class Entry:
    """One entity's values of one group, as stored: one packed ``bytes`` (``raw``) and the
    answer of the API whose lookup loaded it, made once when loaded: the values' JSON for
    REST, their gRPC records (``wire``) for gRPC. The other API's is made from ``raw`` on
    its first use and kept (``L1Store.charge``), so an entity only gRPC asks for holds no
    JSON. ``raw`` None: the entity has none (negative). In a compact cache
    (``keep_answers`` False) an entry holds neither: each answer writes them.

    Nothing in an entry is a Python object per value: the garbage collector has nothing to
    walk, and ``size`` is what the entry really takes, so the byte bound holds for RSS."""

    key: CacheKey
    fmt: GroupFormat
    raw: bytes | None
    present: bytes  # one byte per feature: 1 where a value is stored
    json: bytes | None  # the values as a JSON array (None: made when first needed)
    written_at: int | None  # unix seconds of the group's last write, from Redis
    cost: float = 0.0  # seconds the load took: XFetch's delta
    expires_at: float = 0.0  # monotonic seconds
    loaded_at: float = 0.0  # monotonic seconds: when it was read from Redis
    size: int = 0
    wire: bytes | None = None  # the values as gRPC records, made on first use
    # the entity's stored data of this group cannot be read (raw is None): answered with
    # status "error", cached like a missing entity (the negative TTL), never as values
    fault: Fault | None = None
    # monotonic seconds after which the answer is no longer right however fresh the data:
    # an aggregated group's windows slide at the next tile boundary (feature_store.windows)
    until: float = math.inf
    shadowed: bool = False  # a shadow check was drawn for it (one per load: shadow.py)

    @property
    def negative(self) -> bool:
        return self.raw is None

    @property
    def values(self) -> tuple[Value | None, ...] | None:
        """The values as Python objects (decoded on each call: for library-facing code)."""
        return None if self.raw is None else self.fmt.values(self.raw)


def entry_size(entry: Entry) -> int:
    """The bytes an entry holds in this process (the shared ``present`` is not counted)."""
    size = ENTRY_OVERHEAD + len(entry.key[1])
    if entry.json is not None:
        size += len(entry.json) + BYTES_OBJECT
    if entry.raw is not None:
        size += len(entry.raw) + BYTES_OBJECT
    if entry.wire is not None:
        size += len(entry.wire) + BYTES_OBJECT
    if entry.fault is not None:
        size += FAULT_OVERHEAD + len(entry.fault.message)
    return size


def keeper(cache: L1Store | None) -> Callable[[Entry], None] | None:
    """What keeps an answer form made on first use on its entry and counts it against the
    byte bound (``L1Store.charge``): None without the L1, or in a compact cache, whose
    answers write their bytes each time."""
    return cache.charge if cache is not None and cache.keep_answers else None


def entry_json(entry: Entry, charge: Callable[[Entry], None] | None) -> bytes:
    """An entry's values as a JSON array: made on first use where the entry was loaded for
    a gRPC answer (which keeps its gRPC records instead), and kept on the entry when
    ``charge`` counts the growth against the cache's byte bound (None: not kept)."""
    found = entry.json
    if found is None:
        found = entry.fmt.absent_json if entry.raw is None else entry.fmt.json(entry.raw)
        if charge is not None:
            entry.json = found
            charge(entry)
    return found


@dataclass(slots=True)
class CacheStats:
    """Counters since start. Kept as plain ints: Prometheus reads them at scrape time."""

    hits: int = 0
    negative_hits: int = 0
    error_hits: int = 0  # hits on entries of entities whose stored data cannot be read
    front_hits: int = 0  # of hits and negative hits: answered on a native front
    misses: int = 0
    deduplicated: int = 0  # misses that joined a read already in flight
    coalesced: int = 0  # keys that shared a round trip with other keys (saved round trips)
    round_trips: int = 0  # pipelines sent to Redis
    keys_loaded: int = 0
    early_refreshes: int = 0
    stale_serves: int = 0  # entries served stale because Redis failed or the circuit was open
    failed_loads: int = 0
    evictions: int = 0
    not_admitted: int = 0  # keys loaded at the bounds and not stored (the fronts' admission)
    invalidations: int = 0
    bypasses: int = 0
    generation_refreshes: int = 0  # entries reloaded after a batch write of their group
    shadow_checks: int = 0  # cache hits re-read from Redis to compare (shadow mode)
    shadow_mismatches: int = 0  # of those, entries whose values or write time differed
    shadow_skipped: int = 0  # hits drawn for a check but not read: the entry's or rate bound
    warm_loaded: int = 0  # entries loaded by the warm start


class Claimed(Protocol):
    """Keys a load of Python's claimed (``L1Store.claim``), until it has stored them."""

    def end(self) -> None: ...


@dataclass
class L1Store:
    """What the read path's policy asks of the L1's storage (see the module's text): the
    settings and counters both stores share, and how an entry's lifetime is drawn."""

    max_bytes: int
    max_entries: int
    ttl: float
    negative_ttl: float
    jitter: float
    max_stale: float
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    stats: CacheStats = field(default_factory=CacheStats)
    # False (CACHE_FORM=compact): an entry keeps its packed values only, no answer bytes
    keep_answers: bool = True
    # seconds before an entry's expiry from which a hit on a front is noted for Python's
    # refresh policy (``Refresher.drawn_window``; set by the reader)
    notice_window: Callable[[Entry], float] | None = None

    def lifetime(self, negative: bool) -> float:
        base = self.negative_ttl if negative else self.ttl
        if self.jitter:
            base *= 1.0 + self.jitter * (self.rng.random() - 0.5)
        return base

    def stale_fallback(self, key: CacheKey, now: float) -> Entry | None:
        """An entry that may still be served, marked stale, while Redis is failing."""
        entry = self.peek(key)
        if entry is None or now - entry.expires_at > self.max_stale:
            return None
        return entry

    def put(self, entry: Entry, now: float | None = None) -> Entry:
        """Store an entry loaded ``now``; its expiry (and size) are set here."""
        self.put_many((entry,), self.clock() if now is None else now)
        return entry

    # --- the store's own ------------------------------------------------------------------

    def __len__(self) -> int:
        return self.size()[0]

    def size(self) -> tuple[int, int]:
        """Entries and bytes held."""
        raise NotImplementedError

    def front_entries(self) -> int:
        """Of the entries, those the native fronts loaded themselves."""
        return 0

    def get(self, key: CacheKey) -> Entry | None:
        """The entry, fresh or expired (callers compare ``expires_at``), marked used."""
        raise NotImplementedError

    def peek(self, key: CacheKey) -> Entry | None:
        """The entry, fresh or expired, not marked used."""
        raise NotImplementedError

    def view(self, key: CacheKey) -> Entry | None:
        """The entry where it is, for a reader that only looks (a shadow check)."""
        return self.peek(key)

    def holds(self, key: CacheKey, entry: Entry) -> bool:
        """Whether ``entry``, just stored for ``key``, was kept (a negative TTL of 0 keeps
        nothing; an invalidation in flight drops it)."""
        raise NotImplementedError

    def keys(self, group: str | None = None, *, most_recent_first: bool = False) -> list[CacheKey]:
        """A snapshot of the keys (of one group), least recently used first by default."""
        raise NotImplementedError

    def put_many(self, entries: Iterable[Entry], now: float) -> None:
        """Store entries loaded together ``now`` (a round trip's), each with its lifetime
        (``lifetime``, capped by ``Entry.until``), the bounds enforced once, after the last."""
        raise NotImplementedError

    def charge(self, entry: Entry) -> None:
        """Count what an entry grew by (the answer form it was not loaded with, made on
        first use: its gRPC records, or its JSON)."""
        raise NotImplementedError

    def discard(self, key: CacheKey) -> bool:
        """Drop the entry of ``key``; whether there was one."""
        raise NotImplementedError

    def expire_all(self, now: float | None = None) -> None:
        """Make every entry due for reload while keeping it for stale-on-error.

        Used when invalidation messages may have been missed (the subscription dropped):
        clearing would send every key to Redis at once, expiring lets them reload as asked.
        """
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def claim(self, keys: Sequence[CacheKey]) -> Claimed | None:
        """Claim ``keys``, which a load of Python's is about to read, where others load into
        this store too (the native fronts): those that miss one meanwhile wait for this
        load. None where no one else loads."""
        return None

    def elsewhere(self, claim: Claimed | None) -> list[CacheKey]:
        """Of the keys ``claim`` asked for, those another loader (a native front) was
        loading already: waited for (``wait_elsewhere``), not read again."""
        return []

    async def wait_elsewhere(self, claim: Claimed | None, within: float) -> None:
        """Until the loads of ``elsewhere(claim)`` end, or ``within`` seconds pass."""

    def mark_shadowed(self, key: CacheKey) -> None:
        """A shadow check was drawn for the entry of ``key`` (``Entry.shadowed``)."""

    def notice_group(self, group: str) -> None:
        """A batch write of ``group`` was announced (the fronts' hits of its entries are
        noted for Python's policy, or read again by the fronts)."""

    def notice_again(self, key: CacheKey, entry: Entry) -> None:
        """Note ``entry`` for the refresh policy again at its refresh window (a note for a
        batch write it is newer than)."""

    def refresh_outdated(self, keys: list[CacheKey]) -> list[CacheKey]:
        """Have the native fronts read again those of ``keys`` (a batch write's sweep) whose
        entries they loaded; the keys left for Python's policy to reload."""
        return keys


@dataclass
class LRUCache(L1Store):
    """Entries by key, least recently used first; bounded by bytes and by count: the
    pure-Python reference store (see the module's text)."""

    bytes: int = 0
    _entries: OrderedDict[CacheKey, Entry] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def size(self) -> tuple[int, int]:
        return len(self._entries), self.bytes

    def get(self, key: CacheKey) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def peek(self, key: CacheKey) -> Entry | None:
        return self._entries.get(key)

    def holds(self, key: CacheKey, entry: Entry) -> bool:
        return self._entries.get(key) is entry

    def keys(self, group: str | None = None, *, most_recent_first: bool = False) -> list[CacheKey]:
        keys = reversed(self._entries) if most_recent_first else iter(self._entries)
        return [k for k in keys if group is None or k[0] == group]

    def put_many(self, entries: Iterable[Entry], now: float) -> None:
        """Store entries loaded together ``now`` (a round trip's) as ``put`` of each in
        turn would, except that the bounds are enforced once, after the last: an entry the
        batch replaces or shrinks does not push older ones out first, so what stays is what
        ``put`` of each would keep and perhaps more of the least recently used."""
        for entry in entries:
            key = entry.key
            ttl = self.lifetime(entry.raw is None)
            entry.expires_at = min(now + ttl, entry.until)
            entry.loaded_at = now
            if not self.keep_answers and entry.raw is not None:
                entry.json = entry.wire = None  # answers are written from ``raw`` on each hit
            entry.size = entry_size(entry)
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.size
            if ttl > 0:  # a negative TTL of 0 means: do not cache missing entities
                self._entries[key] = entry
                self.bytes += entry.size
        self._evict()

    def _evict(self) -> None:
        entries = self._entries
        while self.bytes > self.max_bytes or len(entries) > self.max_entries:
            _, old = entries.popitem(last=False)
            self.bytes -= old.size
            self.stats.evictions += 1

    def charge(self, entry: Entry) -> None:
        if not self.keep_answers:
            entry.json = entry.wire = None
            return
        size = entry_size(entry)
        if self._entries.get(entry.key) is entry and size != entry.size:
            self.bytes += size - entry.size
            entry.size = size
            self._evict()

    def discard(self, key: CacheKey) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True

    def expire_all(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        for entry in self._entries.values():
            entry.expires_at = min(entry.expires_at, now)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


def should_refresh_early(entry: Entry, now: float, beta: float, rng: random.Random) -> bool:
    """XFetch (Vattani et al., "Optimal Probabilistic Cache Stampede Prevention").

    Refresh before expiry with a probability that rises as expiry nears, scaled by how long
    a load takes (``cost``): one caller of a hot key reloads it slightly early, and the key
    never expires under load.
    """
    if beta <= 0:
        return False
    u = rng.random()
    if u <= 0.0:
        return True
    return now - entry.cost * beta * math.log(u) >= entry.expires_at
