"""The worker's one L1 cache, in the extension (``native/src/hits/``): the store the
native fronts answer hits from and load their misses into, and that Python's lookups use
too (a form's first lookups, the warm start, Feast's API, a miss a front could not load).

Every entry is held once, in the extension: an entry Python loads is stored there with its
own bytes objects (no copy), an entry a front loads with bytes of its own, and both count
against the one bound in bytes and entries and are evicted by the same CLOCK
(``bounds.rs``). Python sees an entry as an ``Entry`` made when it asks (``get``,
``peek``): Python's own bytes objects again, or copies of a front's. What Python changes
of an entry goes back through this class: the answer bytes it makes on first use
(``charge``), a shadow check drawn (``mark_shadowed``), a note for the refresh policy
(``notice_again``).

The policy stays Python's (loader.py, refresh.py, shadow.py): what is stored when, its
lifetime (``lifetime``: TTL, jitter, a window aggregation's tile boundary), when it is
refreshed, what is served stale. ``LRUCache`` (cache.py) is the pure-Python reference of the
same semantics, used with ``FEATURE_STORE_NATIVE=off``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias, cast

from feature_store.batch import Fault, FaultReason
from feature_store.layout import MAX_STRING_ID_BYTES
from feature_store.native import GroupFormat
from feature_store.serving.l1.cache import CacheKey, Claimed, Entry, L1Store

if TYPE_CHECKING:
    from feature_store._native import FrontRedis, HitCache, PythonLoad


# what the extension stores of an entry (``HitCache.put_many``): its key, packed values, JSON,
# gRPC records, present pattern, write time, seconds fresh, seconds to its notice, seconds
# since its read, and the read's seconds
PutItem: TypeAlias = tuple[
    bytes, bytes | None, bytes | None, bytes | None, bytes, int | None, float, float, float, float
]


def group_tags(groups: Iterable[str]) -> dict[str, bytes]:
    """How the extension names each group in a key: its index among the sorted names, in
    2 bytes (a key is that, then the entity's Redis key)."""
    return {name: i.to_bytes(2, "big") for i, name in enumerate(sorted(groups))}


def fault_bytes(fault: Fault) -> bytes:
    """A fault as the extension keeps it (``NativeCache.put_many``): its reason, then its
    message."""
    return f"{fault.reason.value}\n{fault.message}".encode()


def fault_of(stored: bytes) -> Fault:
    """The fault ``fault_bytes`` wrote."""
    reason, _, message = stored.decode().partition("\n")
    return Fault(FaultReason(reason), message)


class NativeCache(L1Store):
    """The L1 in the extension (see the module's text). ``formats``: each group's value
    format, by name; the extension names a group by its index among the sorted names."""

    def __init__(
        self,
        formats: dict[str, GroupFormat],
        *,
        max_bytes: int,
        max_entries: int,
        ttl: float,
        negative_ttl: float,
        jitter: float,
        max_stale: float,
        keep_answers: bool = True,
        max_ids: int = 1000,
        shadow_fraction: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        from feature_store import _native

        super().__init__(
            max_bytes,
            max_entries,
            ttl,
            negative_ttl,
            jitter,
            max_stale,
            rng=rng or random.Random(),
            keep_answers=keep_answers,
        )
        self.native: HitCache = _native.HitCache(
            max_ids,
            MAX_STRING_ID_BYTES,
            shadow_fraction,
            random.getrandbits(64),
            False,
            not keep_answers,
        )
        self.native.bound(max_bytes, max_entries)
        self.formats = formats
        self.tags = group_tags(formats)
        self.names = {tag: name for name, tag in self.tags.items()}
        # the front whose connections read again the fronts' own entries a batch write
        # outdated (``refresh_outdated``): set by the fronts, when they load misses
        self.refreshing_front: Callable[[], FrontRedis | None] | None = None

    def tagged(self, key: CacheKey) -> bytes:
        return self.tags[key[0]] + key[1]

    def untagged(self, tagged: bytes) -> CacheKey:
        return self.names[tagged[:2]], tagged[2:]

    # --- what the policy reads ---------------------------------------------------------

    @property
    def bytes(self) -> int:
        return self.native.size()[1]

    def size(self) -> tuple[int, int]:
        entries, held, _ = self.native.size()
        return entries, held

    def front_entries(self) -> int:
        return self.native.size()[2]

    def _entry(self, key: CacheKey, touch: bool) -> Entry | None:
        tag = self.tags.get(key[0])
        found = self.native.entry(tag + key[1], touch) if tag is not None else None
        if found is None:
            return None
        raw, json, wire, present, written_at, left, age, cost, fault, shadowed, _ = found
        fmt = self.formats[key[0]]
        now = self.clock()
        entry = Entry(key, fmt, raw, present, json, written_at, cost, now + left, now - age)
        entry.wire, entry.shadowed = wire, shadowed
        if fault is not None:
            entry.fault = fault_of(fault)
            entry.present, entry.json = fmt.absent_present, fmt.absent_json
        elif raw is None and json is None and wire is None:
            entry.json = fmt.absent_json  # a compact cache's negative entry
        return entry

    def get(self, key: CacheKey) -> Entry | None:
        return self._entry(key, True)

    def peek(self, key: CacheKey) -> Entry | None:
        return self._entry(key, False)

    def holds(self, key: CacheKey, entry: Entry) -> bool:
        # an entry is made anew on each look: kept is whether the key has one now
        tag = self.tags.get(key[0])
        return tag is not None and self.native.entry(tag + key[1], False) is not None

    def keys(self, group: str | None = None, *, most_recent_first: bool = False) -> list[CacheKey]:
        """The keys (of one group), those stored last first (the eviction ring's order:
        CLOCK keeps no order of use), or the reverse."""
        groups = self.tags if group is None else [group] if group in self.tags else []
        keys = [
            self.untagged(tagged)
            for name in groups
            for tagged in self.native.keys(int.from_bytes(self.tags[name], "big"))
        ]
        return keys if most_recent_first else keys[::-1]

    # --- what the policy changes -------------------------------------------------------

    def put_many(self, entries: Iterable[Entry], now: float) -> None:
        """Store entries loaded together ``now`` (a round trip's) in the extension, each
        fresh for its lifetime (``lifetime``, capped by ``Entry.until``) and noted for the
        refresh policy from its refresh window (``notice_window``); a negative TTL of 0
        keeps nothing (the key's entry there is dropped). The bounds are enforced once,
        after the last."""
        clock_now = self.clock()
        ago = max(0.0, clock_now - now)
        window = self.notice_window
        native, tags = self.native, self.tags
        # per key, what its last entry of the batch asks: kept, kept as a fault, or dropped
        items: dict[bytes, PutItem] = {}
        faults: dict[bytes, tuple[float, bytes]] = {}
        dropped: set[bytes] = set()
        for entry in entries:
            tag = tags.get(entry.key[0])
            if tag is None:
                continue
            key = tag + entry.key[1]
            ttl = self.lifetime(entry.raw is None)
            entry.expires_at = min(now + ttl, entry.until)
            entry.loaded_at = now
            if not self.keep_answers and entry.raw is not None:
                entry.json = entry.wire = None  # answers are written from ``raw`` on each hit
            left = entry.expires_at - clock_now
            items.pop(key, None)
            faults.pop(key, None)
            dropped.discard(key)
            if ttl <= 0:
                dropped.add(key)
            elif entry.fault is not None:
                faults[key] = (left, fault_bytes(entry.fault))
            else:
                notice_in = left
                if entry.raw is not None and window is not None:
                    notice_in -= window(entry)
                json = entry.json if self.keep_answers else None
                wire = entry.wire if self.keep_answers else None
                items[key] = (
                    key, entry.raw, json, wire, entry.present, entry.written_at, left, notice_in,
                    ago, entry.cost,
                )  # fmt: skip
        for key in dropped:
            native.discard(key)
        for key, (left, fault) in faults.items():
            native.put_fault(key, left, fault)
        if items:
            self.stats.evictions += native.put_many(list(items.values()))

    def charge(self, entry: Entry) -> None:
        if not self.keep_answers:
            entry.json = entry.wire = None
            return
        tag = self.tags.get(entry.key[0])
        if tag is None:
            return
        _, evicted = self.native.add_answers(tag + entry.key[1], entry.json, entry.wire)
        self.stats.evictions += evicted

    def discard(self, key: CacheKey) -> bool:
        tag = self.tags.get(key[0])
        return tag is not None and self.native.discard(tag + key[1])

    def expire_all(self, now: float | None = None) -> None:
        self.native.expire_all()

    def clear(self) -> None:
        self.native.clear()

    def claim(self, keys: Sequence[CacheKey]) -> PythonLoad | None:
        tags = self.tags
        tagged = [tags[group] + key for group, key in keys if group in tags]
        return self.native.claim(tagged) if tagged else None

    def elsewhere(self, claim: Claimed | None) -> list[CacheKey]:
        if claim is None:
            return []
        return [self.untagged(k) for k in cast("PythonLoad", claim).elsewhere()]

    async def wait_elsewhere(self, claim: Claimed | None, within: float) -> None:
        """Waited for on a front's runtime (``FrontRedis.notify``), which writes an eventfd
        this loop reads once those loads end: no thread, no polling."""
        front = self.refreshing_front() if self.refreshing_front is not None else None
        if claim is None or front is None:
            return  # no front loads on connections of its own: nothing to wait for
        loop = asyncio.get_running_loop()
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        done: asyncio.Future[None] = loop.create_future()

        def woken() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, woken)
        try:
            front.notify(cast("PythonLoad", claim), fd, within)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within + 1.0):  # the front writes by ``within``
                    await done
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def mark_shadowed(self, key: CacheKey) -> None:
        tag = self.tags.get(key[0])
        if tag is not None:
            self.native.mark_shadowed(tag + key[1])

    def notice_group(self, group: str) -> None:
        tag = self.tags.get(group)
        if tag is not None:
            self.native.notice_group(int.from_bytes(tag, "big"))

    def notice_again(self, key: CacheKey, entry: Entry) -> None:
        tag = self.tags.get(key[0])
        window = self.notice_window
        if tag is None or window is None or math.isinf(entry.expires_at):
            return
        notice_in = entry.expires_at - self.clock() - window(entry)
        self.native.notice_again(tag + key[1], notice_in)

    def refresh_outdated(self, keys: list[CacheKey]) -> list[CacheKey]:
        front = self.refreshing_front() if self.refreshing_front is not None else None
        if front is None:
            return keys  # no front reads on connections of its own: Python reloads them
        tagged = [self.tags[group] + key for group, key in keys if group in self.tags]
        return [self.untagged(k) for k in front.refresh_outdated(self.native, tagged)]
