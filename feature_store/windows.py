"""Window aggregations: an entity's events as tiles of partial aggregates, and the answer
at the time of a read.

An aggregated group (``registry.Aggregation``) keeps, per entity, one field in the
entity's hash (``layout.windows_field``) holding its state:

- **tiles**: for each tile of ``tile_seconds`` that holds events (tile ``k`` covers event
  times ``[k * tile, (k + 1) * tile)``), the number of events, the newest event time, and
  per record field read (``Aggregation.fields``) the partials every function needs: the
  number of values, their sum, min, max, and the newest values (as many as the largest
  ``n`` of a last_n over the field), newest first;
- **newest**: the newest event time applied, which lateness is measured from;
- **offsets**: per Kafka partition, the highest offset applied. An event at or below it
  was applied before (a micro-batch written again after a restart, a topic replayed from
  the start) and changes nothing: the state is exact under replay.

A read at time T answers each feature from the tiles ``k`` with
``floor((T - window) / tile) < k <= floor(T / tile)``: the tile that holds ``T - window``
is left out whole, so a window counts the events of between ``window - tile`` and
``window`` before the current tile's end, never an event older than ``window``. The
answer changes only at tile boundaries (``Answer.changes_at``) or when events arrive.

An event older than the entity's newest by more than ``lateness_seconds`` is not counted
(``Applied.late``); tiles that left every window of every read at or after ``newest -
lateness`` (``k <= floor((newest - lateness - longest) / tile)``) are dropped at each
write. A read is exact at any time from ``newest - lateness`` on: a reader whose clock is
behind the newest event by less than the lateness still finds every tile it needs.

The state is JSON (orjson: floats round-trip exactly) after a version counter
(``b"12|[...]"``); writers replace it only if the version is the one they read
(``layout.WINDOWS_SCRIPT``), so two writers of one entity never lose each other's events.

``reference_answer`` is the semantics written plainly over a list of events, for tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from feature_store.errors import EncodingError
from feature_store.registry import Aggregate, Aggregation, FeatureGroup, Function
from feature_store.serialization import FeatureType

MS = 1000

# a part: [values, sum, min, max, newest values [[time ms, value], ...]]
Part = list[Any]


@dataclass(frozen=True, slots=True)
class Event:
    time_ms: int
    values: Mapping[str, float | int]  # the record's fields the aggregates read (present ones)
    partition: str | None = None  # where the event came from: Kafka's partition and offset
    offset: int = -1


@dataclass(slots=True)
class Tile:
    index: int
    count: int
    newest_ms: int
    parts: list[Part]  # per field of Aggregation.fields


@dataclass(slots=True)
class State:
    version: int = 0  # 0: nothing stored
    newest_ms: int | None = None
    offsets: dict[str, int] = field(default_factory=dict)
    tiles: dict[int, Tile] = field(default_factory=dict)


@dataclass(slots=True)
class Applied:
    counted: int = 0
    replayed: list[int] = field(default_factory=list)  # indices of events applied before
    late: list[int] = field(default_factory=list)  # indices of events past the lateness


@dataclass(frozen=True, slots=True)
class Answer:
    values: list[float | int | list[float] | list[int] | None]  # per aggregate
    newest_ms: int | None  # the newest event in the longest window (the features' age)
    changes_at: float  # unix seconds: the next tile boundary


class Layout:
    """What one aggregated group's state holds per field: the last_n depth of each."""

    __slots__ = ("aggregation", "fields", "index", "keep", "lateness_ms", "longest_ms", "tile_ms")

    def __init__(self, aggregation: Aggregation) -> None:
        self.aggregation = aggregation
        self.fields = aggregation.fields
        self.index = {name: i for i, name in enumerate(self.fields)}
        self.keep = [
            max(
                (
                    a.n
                    for a in aggregation.aggregates
                    if a.of == name and a.function is Function.LAST_N
                ),
                default=0,
            )
            for name in self.fields
        ]
        self.tile_ms = aggregation.tile_seconds * MS
        self.lateness_ms = aggregation.lateness_seconds * MS
        self.longest_ms = aggregation.longest_seconds * MS

    @classmethod
    def of(cls, group: FeatureGroup) -> Layout:
        if group.aggregation is None:
            raise ValueError(f"feature group {group.name!r} is not aggregated")
        return cls(group.aggregation)


# --- the state in Redis ------------------------------------------------------------------


def decode_state(data: bytes | None, layout: Layout) -> State:
    """The stored state (None: nothing stored). EncodingError if it cannot be read."""
    if data is None:
        return State()
    head, bar, body = data.partition(b"|")
    try:
        if not bar or not head.isdigit():
            raise ValueError("no version")
        newest, offsets, tiles = orjson.loads(body)
        state = State(int(head), newest, {str(p): int(o) for p, o in offsets.items()})
        width = len(layout.fields)
        for index, count, newest_ms, parts in tiles:
            if len(parts) != width:
                raise ValueError(f"{len(parts)} parts where the group reads {width} fields")
            state.tiles[int(index)] = Tile(int(index), int(count), int(newest_ms), parts)
    except (ValueError, TypeError, AttributeError, orjson.JSONDecodeError) as e:
        raise EncodingError(
            f"the stored window tiles cannot be read ({e}): {data[:60]!r}"
        ) from None
    return state


def encode_state(state: State) -> bytes:
    """The state as stored, with its version counted up (the writer's compare-and-set)."""
    tiles = [[t.index, t.count, t.newest_ms, t.parts] for _, t in sorted(state.tiles.items())]
    body = orjson.dumps([state.newest_ms, state.offsets, tiles])
    return b"%d|%b" % (state.version + 1, body)


# --- writing: events into tiles ----------------------------------------------------------


def apply(state: State, layout: Layout, events: Iterable[Event]) -> Applied:
    """``events``, in the order they arrived, into ``state``; then prune it."""
    out = Applied()
    offsets, tiles, tile_ms, lateness = (
        state.offsets,
        state.tiles,
        layout.tile_ms,
        layout.lateness_ms,
    )
    index_of, keep = layout.index, layout.keep
    width = len(layout.fields)
    for i, event in enumerate(events):
        if event.partition is not None:
            if event.offset <= offsets.get(event.partition, -1):
                out.replayed.append(i)
                continue
            offsets[event.partition] = event.offset
        t = event.time_ms
        newest = state.newest_ms
        if newest is not None and t < newest - lateness:
            out.late.append(i)
            continue
        k = t // tile_ms
        tile = tiles.get(k)
        if tile is None:
            tile = tiles[k] = Tile(k, 0, t, [[0, 0.0, None, None, []] for _ in range(width)])
        tile.count += 1
        if t > tile.newest_ms:
            tile.newest_ms = t
        for name, value in event.values.items():
            j = index_of.get(name)
            if j is None:
                continue
            part = tile.parts[j]
            part[0] += 1
            part[1] += value
            if part[2] is None or value < part[2]:
                part[2] = value
            if part[3] is None or value > part[3]:
                part[3] = value
            if keep[j]:
                _keep_newest(part[4], t, value, keep[j])
        if newest is None or t > newest:
            state.newest_ms = t
        out.counted += 1
    prune(state, layout)
    return out


def _keep_newest(last: list[list[float]], t: int, value: float, n: int) -> None:
    """``(t, value)`` into ``last`` (newest first; at equal times the later arrival
    first), at most ``n`` long."""
    at = 0
    while at < len(last) and last[at][0] > t:
        at += 1
    if at < n:
        last.insert(at, [t, value])
        del last[n:]


def prune(state: State, layout: Layout) -> None:
    """Drop the tiles no read at or after ``newest - lateness`` can reach: a read is
    exact as long as its clock is not behind the newest event by more than the lateness
    (an event time a little ahead of the reader's clock)."""
    if state.newest_ms is None:
        return
    oldest_read = state.newest_ms - layout.lateness_ms
    first = (oldest_read - layout.longest_ms) // layout.tile_ms  # this and older: out
    for k in [k for k in state.tiles if k <= first]:
        del state.tiles[k]


# --- reading: tiles into answers ---------------------------------------------------------


def answer(state: State, layout: Layout, now: float) -> Answer:
    """Each aggregate of the group at unix time ``now``."""
    tile_ms = layout.tile_ms
    now_ms = math.floor(now * MS)
    current = now_ms // tile_ms
    tiles = [t for k, t in sorted(state.tiles.items()) if k <= current]
    values: list[float | int | list[float] | list[int] | None] = []
    for a in layout.aggregation.aggregates:
        first = (now_ms - a.window_seconds * MS) // tile_ms  # excluded
        inside = [t for t in tiles if t.index > first]
        values.append(_combine(a, inside, layout))
    longest = (now_ms - layout.longest_ms) // tile_ms
    newest = max((t.newest_ms for t in tiles if t.index > longest), default=None)
    return Answer(values, newest, (current + 1) * tile_ms / MS)


def _combine(a: Aggregate, tiles: Sequence[Tile], layout: Layout) -> Any:
    f = a.function
    if a.of is None:
        return sum(t.count for t in tiles)
    j = layout.index[a.of]
    parts = [t.parts[j] for t in tiles if t.parts[j][0]]
    if f is Function.COUNT:
        return sum(p[0] for p in parts)
    if f is Function.SUM:
        return float(math.fsum(p[1] for p in parts))
    if not parts:
        return None
    if f is Function.MEAN:
        return math.fsum(p[1] for p in parts) / sum(p[0] for p in parts)
    if f is Function.MIN:
        return min(p[2] for p in parts)
    if f is Function.MAX:
        return max(p[3] for p in parts)
    newest: list[float | int] = []
    for p in reversed(parts):  # newest tile first; each tile's values newest first
        newest.extend(v for _, v in p[4])
        if len(newest) >= a.n:
            break
    return newest[: a.n]


# --- the reference -----------------------------------------------------------------------


def reference_answer(
    aggregation: Aggregation, events: Sequence[Event], now: float
) -> list[float | int | list[float] | list[int] | None]:
    """The semantics over the events themselves, in their arrival order: what ``answer``
    must equal (sums up to rounding). Replayed events (an offset seen before in their
    partition) and events past the lateness are dropped as ``apply`` drops them; then each
    aggregate reads the events of the tiles after the one holding ``now - window``
    through the one holding ``now``."""
    seen: dict[str, int] = {}
    counted: list[Event] = []
    newest: int | None = None
    tile_ms, lateness = aggregation.tile_seconds * MS, aggregation.lateness_seconds * MS
    for e in events:
        if e.partition is not None:
            if e.offset <= seen.get(e.partition, -1):
                continue
            seen[e.partition] = e.offset
        if newest is not None and e.time_ms < newest - lateness:
            continue
        counted.append(e)
        newest = e.time_ms if newest is None else max(newest, e.time_ms)
    now_ms = math.floor(now * MS)
    out: list[float | int | list[float] | list[int] | None] = []
    for a in aggregation.aggregates:
        low = ((now_ms - a.window_seconds * MS) // tile_ms + 1) * tile_ms
        high = (now_ms // tile_ms + 1) * tile_ms
        inside = [e for e in counted if low <= e.time_ms < high]
        if a.of is None:
            out.append(len(inside))
            continue
        with_value = [(i, e) for i, e in enumerate(inside) if a.of in e.values]
        values = [e.values[a.of] for _, e in with_value]
        if a.function is Function.COUNT:
            out.append(len(values))
        elif a.function is Function.SUM:
            out.append(float(math.fsum(values)))
        elif not values:
            out.append(None)
        elif a.function is Function.MEAN:
            out.append(math.fsum(values) / len(values))
        elif a.function is Function.MIN:
            out.append(min(values))
        elif a.function is Function.MAX:
            out.append(max(values))
        else:  # newest first; at equal times, the later arrival first
            ordered = sorted(with_value, key=lambda ie: (ie[1].time_ms, ie[0]), reverse=True)
            out.append([e.values[a.of] for _, e in ordered[: a.n]])
    return out


# --- record fields -----------------------------------------------------------------------


def field_types(aggregation: Aggregation, group: FeatureGroup) -> dict[str, FeatureType]:
    """What each record field must hold: int where a last_n answers int_list, else a
    number (double)."""
    types = dict.fromkeys(aggregation.fields, FeatureType.DOUBLE)
    for a, f in zip(aggregation.aggregates, group.features, strict=True):
        if a.function is Function.LAST_N and a.of is not None and f.type is FeatureType.INT_LIST:
            types[a.of] = FeatureType.INT
    return types


def number(value: object, type_: FeatureType) -> float | int:
    """A record field's value as the aggregates read it; EncodingError if it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EncodingError(f"{value!r} is not a number")
    if type_ is FeatureType.INT:
        if isinstance(value, float):
            if not value.is_integer() or abs(value) > 2**53:
                raise EncodingError(f"{value!r} is not an integer")
            value = int(value)
        if not -(2**63) <= value < 2**63:
            raise EncodingError(f"{value!r} is outside int64")
        return value
    value = float(value)
    if not math.isfinite(value):
        raise EncodingError(f"{value!r} is not a finite number")
    return value


__all__ = [
    "Answer",
    "Applied",
    "Event",
    "Layout",
    "State",
    "answer",
    "apply",
    "decode_state",
    "encode_state",
    "field_types",
    "number",
    "prune",
    "reference_answer",
]
