"""A history of reads and writes under faults, and the checker that reads it afterwards.

Every key has one writer, which writes it in turn with a growing write number (``seq``:
1, 2, ...; 0 is the value the key held before the run). A read of a key records the write
number it was served (None: no value, or a failed request) and the value's status. Times
are wall-clock seconds, from every host alike (the hosts share the machine's clock).

The guarantees checked (``check``), as docs/reliability.md states them:

- **A read returns a value that was written**: the key's own (never another entity's), and
  one whose write had started before the read ended. Anything else is a *wrong value*.
- **Never older than the newest write acknowledged before the read started**, except
  (a) within the deployment's bound (its L1 TTL: ``bounds``), (b) a value served marked
  ``stale`` (stale-on-error: counted, not a violation), (c) when every write it missed
  was lost (acknowledged, then gone from Redis: counted as *lost writes*). Anything else is
  a *stale read beyond its bound*.
- **A request ends by its deadline** (plus 100 ms of slack): one that took longer is
  counted, whatever it answered.

Per fault (the ops that started in its window: from its beginning to the next fault's)
and per deployment it reports those counts, the failed requests, the longest
request, and the time from the heal to the first good answer (a read with every value
``present``, a write acknowledged) and to the last failed read and write.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SLACK = 0.1  # seconds past a deadline that a request may take before it counts


@dataclass(frozen=True, slots=True)
class Write:
    who: str  # the deployment it went through
    key: int
    seq: int
    start: float
    end: float
    acked: bool


@dataclass(frozen=True, slots=True)
class Read:
    who: str
    start: float
    end: float
    ok: bool  # answered (200), whatever each value's status
    # per key read: (key, the write number served or None, the value's status); a value
    # of another key is recorded with its own key in ``wrong_key``
    values: tuple[tuple[int, int | None, str], ...]
    wrong_key: int = 0
    detail: str = ""  # what a failed request answered (its first 200 characters)


@dataclass(slots=True)
class History:
    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wrote(self, write: Write) -> None:
        with self.lock:
            self.writes.append(write)

    def read(self, read: Read) -> None:
        with self.lock:
            self.reads.append(read)


@dataclass(frozen=True, slots=True)
class Window:
    """A fault: its name, when it began, when it was healed and when its window ends (the
    next fault's beginning, or the end of the load), in wall seconds."""

    name: str
    start: float
    heal: float
    end: float


@dataclass(slots=True)
class Tally:
    """What one deployment did in one window."""

    reads: int = 0
    writes: int = 0
    failed_reads: int = 0
    failed_writes: int = 0
    values: int = 0
    wrong_values: int = 0
    stale_beyond_bound: int = 0
    stale_marked: int = 0  # served marked stale (stale-on-error): allowed
    behind_lost_writes: int = 0  # older than a write that was lost: counted with the losses
    lost_writes: int = 0  # acknowledged, and not in Redis at the end
    past_deadline: int = 0
    max_seconds: float = 0.0
    heal_to_good_read: float | None = None
    heal_to_good_write: float | None = None
    heal_to_last_failed_read: float | None = None
    heal_to_last_failed_write: float | None = None
    examples: list[str] = field(default_factory=list)  # the first few violations, said

    def note(self, what: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(what)


class KeyWrites:
    """One key's writes in order: what was attempted before a time, and acknowledged."""

    def __init__(self, writes: list[Write], final: int) -> None:
        self.writes = sorted(writes, key=lambda w: w.seq)
        self.starts = [w.start for w in self.writes]  # growing: one writer, in turn
        self.final = final  # the write number Redis holds at the end
        acked = sorted((w for w in self.writes if w.acked), key=lambda w: w.end)
        self.acked_ends = [w.end for w in acked]
        self.acked = acked

    def started_before(self, t: float) -> int:
        """The highest write number whose write started before ``t`` (0: none)."""
        i = bisect.bisect_left(self.starts, t)
        return self.writes[i - 1].seq if i else 0

    def missed(self, seq: int, t: float) -> list[Write]:
        """The acknowledged writes newer than ``seq`` acknowledged before ``t``."""
        i = bisect.bisect_left(self.acked_ends, t)
        return [w for w in self.acked[:i] if w.seq > seq]


def check(
    history: History,
    windows: Iterable[Window],
    final: Mapping[int, int],
    bounds: Mapping[str, float],
    deadline: float,
) -> dict[str, dict[str, Tally]]:
    """Per window (its name; "steady" for what started outside every window) and deployment,
    what the history shows against the guarantees (see the module's text)."""
    by_key: dict[int, list[Write]] = defaultdict(list)
    for w in history.writes:
        by_key[w.key].append(w)
    keys = {k: KeyWrites(ws, final.get(k, 0)) for k, ws in by_key.items()}
    windows = sorted(windows, key=lambda w: w.start)
    out: dict[str, dict[str, Tally]] = defaultdict(lambda: defaultdict(Tally))

    def window_of(t: float) -> Window | None:
        for w in windows:
            if w.start <= t < w.end:
                return w
        return None

    for write in history.writes:
        win = window_of(write.start)
        tally = out["steady" if win is None else win.name][write.who]
        tally.writes += 1
        _timed(tally, "write", write.start, write.end, write.acked, write.acked, "", win, deadline)
        if not write.acked:
            tally.failed_writes += 1
        elif write.seq > keys[write.key].final:
            tally.lost_writes += 1
            tally.note(f"write {write.key}#{write.seq} acknowledged at {write.end:.3f}, lost")
    for read in history.reads:
        win = window_of(read.start)
        tally = out["steady" if win is None else win.name][read.who]
        tally.reads += 1
        good = read.ok and all(status == "present" for _, _, status in read.values)
        _timed(tally, "read", read.start, read.end, read.ok, good, read.detail, win, deadline)
        if not read.ok:
            tally.failed_reads += 1
        tally.wrong_values += read.wrong_key
        if read.wrong_key:
            tally.note(f"read at {read.start:.3f} served another entity's value")
        for key, seq, status in read.values:
            if seq is None:
                continue
            tally.values += 1
            writes = keys.get(key)
            newest_started = writes.started_before(read.end) if writes is not None else 0
            if seq > newest_started:
                tally.wrong_values += 1
                tally.note(f"read at {read.start:.3f} served {key}#{seq}, never written")
                continue
            missed = writes.missed(seq, read.start) if writes is not None else []
            if not missed:
                continue
            if status == "stale":
                tally.stale_marked += 1
                continue
            kept = [w for w in missed if w.seq <= writes.final] if writes is not None else []
            if not kept:
                tally.behind_lost_writes += 1
                continue
            behind = read.start - min(w.end for w in kept)
            if behind > bounds[read.who]:
                tally.stale_beyond_bound += 1
                tally.note(
                    f"read at {read.start:.3f} served {key}#{seq}, {behind:.3f} s behind "
                    f"#{max(w.seq for w in kept)}"
                )
    return {name: dict(tallies) for name, tallies in out.items()}


def _timed(
    tally: Tally,
    kind: str,
    start: float,
    end: float,
    ok: bool,
    good: bool,
    detail: str,
    win: Window | None,
    deadline: float,
) -> None:
    """What every request (``kind``: read or write) counts: how long it took against the
    deadline, and in its window after the heal, the first good answer and the last
    failure (``heal_to_good_<kind>``, ``heal_to_last_failed_<kind>``)."""
    took = end - start
    tally.max_seconds = max(tally.max_seconds, took)
    if took > deadline + SLACK:
        tally.past_deadline += 1
        tally.note(f"{kind} at {start:.3f} took {took:.3f} s: {detail or ('ok' if ok else '-')}")
    if win is None or start < win.heal:
        return
    since = end - win.heal
    if good and getattr(tally, f"heal_to_good_{kind}") is None:
        setattr(tally, f"heal_to_good_{kind}", since)
    if not ok:
        last = getattr(tally, f"heal_to_last_failed_{kind}")
        setattr(tally, f"heal_to_last_failed_{kind}", max(last or 0.0, since))
