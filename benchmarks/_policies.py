"""Eviction and admission policies, simulated over traces of keys (``benchmarks/eviction.py``):
hit rates and insertions depend on the order of the accesses only, not on the machine.

- ``Lru``: least recently used (Python's reference cache, ``l1/cache.py``);
- ``Clock``: the fronts' own (``native/src/hits/load.rs``, ``evict``): a ring of keys in
  the order they were stored; a hit marks its entry; the hand takes the oldest key, and a
  marked one is unmarked and put at the back (a second chance) instead of evicted;
- ``Sieve``: SIEVE (Zhang et al., NSDI 2024): the same marks, but a key the hand passes
  over keeps its place, and the hand goes on from there at the next eviction, so new keys
  that are not hit again leave first;
- ``Doorkeeper``: an admission filter in front of any of them (TinyLFU's doorkeeper, as
  in Caffeine): while the cache is full, a key missed for the first time since the filter
  was last cleared is not stored, only remembered; its next miss stores it. The filter is
  cleared each time it holds as many keys as the cache. A key seen once (a one-hit wonder)
  then costs no entry and evicts nothing.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Protocol


class Policy(Protocol):
    name: str
    capacity: int
    inserts: int  # entries stored

    def access(self, key: int) -> bool:
        """A lookup of ``key``: True on a hit; on a miss, the key is stored (if admitted)."""
        ...

    def held(self) -> set[int]: ...


class Lru:
    def __init__(self, capacity: int) -> None:
        self.name, self.capacity, self.inserts = "LRU", capacity, 0
        self._entries: OrderedDict[int, None] = OrderedDict()

    def access(self, key: int) -> bool:
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        return False

    def store(self, key: int) -> None:
        self.inserts += 1
        self._entries[key] = None
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def full(self) -> bool:
        return len(self._entries) >= self.capacity

    def held(self) -> set[int]:
        return set(self._entries)


class Marking:
    """What CLOCK and SIEVE share: the keys held, each with its mark (hit since the hand
    last passed it)."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name, self.capacity, self.inserts = name, capacity, 0
        self._marked: dict[int, bool] = {}

    def access(self, key: int) -> bool:
        if key in self._marked:
            self._marked[key] = True
            return True
        return False

    def full(self) -> bool:
        return len(self._marked) >= self.capacity

    def held(self) -> set[int]:
        return set(self._marked)


class Clock(Marking):
    def __init__(self, capacity: int) -> None:
        super().__init__("CLOCK", capacity)
        self._ring: deque[int] = deque()

    def store(self, key: int) -> None:
        self.inserts += 1
        self._marked[key] = False
        self._ring.append(key)
        while len(self._marked) > self.capacity:
            oldest = self._ring.popleft()
            if self._marked[oldest] and oldest != key:
                self._marked[oldest] = False
                self._ring.append(oldest)  # a second chance
            elif oldest != key:
                del self._marked[oldest]
            else:
                self._ring.append(oldest)  # the key just stored is not its own victim


class Sieve(Marking):
    """A doubly linked list from the newest key (head) to the oldest (tail); the hand walks
    from the tail toward the head and stays where it evicted."""

    def __init__(self, capacity: int) -> None:
        super().__init__("SIEVE", capacity)
        self._newer: dict[int, int | None] = {}  # toward the head
        self._older: dict[int, int | None] = {}  # toward the tail
        self._head: int | None = None
        self._tail: int | None = None
        self._hand: int | None = None

    def store(self, key: int) -> None:
        self.inserts += 1
        if len(self._marked) >= self.capacity:
            self._evict()
        self._marked[key] = False
        self._newer[key], self._older[key] = None, self._head
        if self._head is not None:
            self._newer[self._head] = key
        self._head = key
        if self._tail is None:
            self._tail = key

    def _evict(self) -> None:
        at = self._hand if self._hand is not None else self._tail
        while at is not None and self._marked[at]:
            self._marked[at] = False
            at = self._newer[at]
            if at is None:
                at = self._tail
        assert at is not None
        self._hand = self._newer[at]
        self._unlink(at)

    def _unlink(self, key: int) -> None:
        newer, older = self._newer.pop(key), self._older.pop(key)
        del self._marked[key]
        if newer is None:
            self._head = older
        else:
            self._older[newer] = older
        if older is None:
            self._tail = newer
        else:
            self._newer[older] = newer

    def order(self) -> list[int]:
        """The keys from the newest to the oldest (for tests)."""
        out, at = [], self._head
        while at is not None:
            out.append(at)
            at = self._older[at]
        return out


class Evicting(Protocol):
    name: str
    capacity: int
    inserts: int

    def access(self, key: int) -> bool: ...
    def store(self, key: int) -> None: ...
    def full(self) -> bool: ...
    def held(self) -> set[int]: ...


class Admitting:
    """A policy that stores every key it misses."""

    def __init__(self, cache: Evicting) -> None:
        self.cache = cache
        self.name, self.capacity = cache.name, cache.capacity

    @property
    def inserts(self) -> int:
        return self.cache.inserts

    def access(self, key: int) -> bool:
        if self.cache.access(key):
            return True
        self.cache.store(key)
        return False

    def held(self) -> set[int]:
        return self.cache.held()


class Doorkeeper(Admitting):
    """``cache`` behind a doorkeeper (the module's text)."""

    def __init__(self, cache: Evicting) -> None:
        super().__init__(cache)
        self.name = f"{cache.name} + doorkeeper"
        self.seen: set[int] = set()

    def access(self, key: int) -> bool:
        if self.cache.access(key):
            return True
        if self.cache.full() and key not in self.seen:
            self.seen.add(key)
            if len(self.seen) >= self.capacity:
                self.seen.clear()
            return False
        self.cache.store(key)
        return False


POLICIES = {"LRU": Lru, "CLOCK": Clock, "SIEVE": Sieve}


def policy(name: str, capacity: int, doorkeeper: bool = False) -> Policy:
    cache = POLICIES[name](capacity)
    return Doorkeeper(cache) if doorkeeper else Admitting(cache)
