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

import contextlib
import functools
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from feature_store.errors import EncodingError
from feature_store.native import windows_answerer
from feature_store.registry import Aggregate, Aggregation, FeatureGroup, Function
from feature_store.serialization import Codec, FeatureType, codec_for
from feature_store.serialization.answers import TYPE_CODES

MS = 1000

# a part: [values, sum, min, max, newest values [[time ms, value], ...]]
Part = list[Any]


@dataclass(frozen=True, slots=True)
class Event:
    time_ms: int
    values: Mapping[str, float | int]  # the record's fields the aggregates read (present ones)
    partition: int | None = None  # where the event came from: Kafka's partition and offset
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
    offsets: dict[int, int] = field(default_factory=dict)
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
    """What one aggregated group's state holds per field, and for how long: each part's
    longest window (0: no aggregate reads it), and the last_n depth."""

    __slots__ = (
        "aggregation",
        "codecs",
        "count_ms",
        "fields",
        "index",
        "ints",
        "keep",
        "last_ms",
        "lateness_ms",
        "lohi_ms",
        "longest_ms",
        "native",
        "native_spec",
        "stats_ms",
        "tile_ms",
    )

    def __init__(
        self, aggregation: Aggregation, ints: Iterable[str] = (), codecs: Sequence[Codec] = ()
    ) -> None:
        self.aggregation = aggregation
        # each aggregate's answer type, as the group's features have it
        self.codecs = tuple(codecs) or tuple(_answer_codec(a, ints) for a in aggregation.aggregates)
        self.fields = aggregation.fields
        self.index = {name: i for i, name in enumerate(self.fields)}
        self.ints = [name in set(ints) for name in self.fields]  # last values are int64

        def longest(name: str | None, functions: tuple[Function, ...]) -> int:
            windows = [
                a.window_seconds * MS
                for a in aggregation.aggregates
                if a.of == name and a.function in functions
            ]
            return max(windows, default=0)

        stats = (Function.COUNT, Function.SUM, Function.MEAN)
        self.count_ms = longest(None, (Function.COUNT,))
        self.stats_ms = [longest(name, stats) for name in self.fields]
        self.lohi_ms = [longest(name, (Function.MIN, Function.MAX)) for name in self.fields]
        self.last_ms = [longest(name, (Function.LAST_N,)) for name in self.fields]
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
        functions = list(Function)
        # the native answer's description of this layout (``_native.Windows``)
        self.native_spec = (
            self.tile_ms,
            self.longest_ms,
            self.ints,
            [
                (
                    functions.index(a.function),
                    -1 if a.of is None else self.index[a.of],
                    a.window_seconds * MS,
                    a.n,
                    TYPE_CODES[c.type],
                )
                for a, c in zip(aggregation.aggregates, self.codecs, strict=True)
            ],
        )
        self.native = windows_answerer(*self.native_spec)

    @classmethod
    def of(cls, group: FeatureGroup) -> Layout:
        """The group's layout, made once per group (reads ask for it on every call)."""
        return _layout_of(group)


@functools.lru_cache(maxsize=256)
def _layout_of(group: FeatureGroup) -> Layout:
    if group.aggregation is None:
        raise ValueError(f"feature group {group.name!r} is not aggregated")
    types = field_types(group.aggregation, group)
    ints = [n for n, t in types.items() if t is FeatureType.INT]
    return Layout(group.aggregation, ints, [f.codec for f in group.features])


def _answer_codec(a: Aggregate, ints: Iterable[str]) -> Codec:
    if a.function is Function.COUNT:
        return codec_for(FeatureType.INT, None)
    if a.function is Function.LAST_N:
        listed = FeatureType.INT_LIST if a.of in set(ints) else FeatureType.FLOAT_LIST
        return codec_for(listed, None)
    return codec_for(FeatureType.DOUBLE, None)


def stored_answer(data: bytes, layout: Layout, now: float) -> tuple[list[bytes | None], int | None]:
    """Each aggregate's answer at unix time ``now`` as a plain group stores a value of its
    type (the group's codecs read it from there), and the newest event in the longest
    window (ms): natively where the extension is on (it reads the state itself), else by
    ``decode_state`` and ``answer``. EncodingError if the state cannot be read."""
    if layout.native is not None:
        with contextlib.suppress(ValueError):  # a state only the reference reads: it decides
            values, newest = layout.native.answer(data, math.floor(now * MS))
            return values, newest
    answered = answer(decode_state(data, layout), layout, now)
    stored = [
        None if v is None else c.encode(v)
        for c, v in zip(layout.codecs, answered.values, strict=True)
    ]
    return stored, answered.newest_ms


# --- the state in Redis ------------------------------------------------------------------


FORMAT = 1
NONE = -(2**63)  # no newest event
_HEAD = struct.Struct("<BqH")  # format, newest event (ms), offsets
_OFFSET = struct.Struct("<iq")  # Kafka partition, highest offset applied
_TILES = struct.Struct("<I")
_TILE = struct.Struct("<qIqB")  # index, events, newest event (ms), parts present (bits)
_STATS = struct.Struct("<Id")  # values, sum
_LOHI = struct.Struct("<dd")  # min, max
_LAST = struct.Struct("<H")  # newest values kept
_TIME_FLOAT = struct.Struct("<qd")
_TIME_INT = struct.Struct("<qq")
STATS, LOHI, LAST = 1, 2, 4  # a field's parts present in a tile: bits of a byte per field


def decode_state(data: bytes | None, layout: Layout) -> State:
    """The stored state (None: nothing stored). EncodingError if it cannot be read."""
    if data is None:
        return State()
    head, bar, body = data.partition(b"|")
    try:
        if not bar or not head.isdigit():
            raise ValueError("no version")
        fmt, newest, n = _HEAD.unpack_from(body, 0)
        if fmt != FORMAT:
            raise ValueError(f"format {fmt}, not {FORMAT}")
        at = _HEAD.size
        state = State(int(head), None if newest == NONE else newest)
        for _ in range(n):
            partition, offset = _OFFSET.unpack_from(body, at)
            state.offsets[partition] = offset
            at += _OFFSET.size
        (ntiles,) = _TILES.unpack_from(body, at)
        at += _TILES.size
        width = len(layout.fields)
        for _ in range(ntiles):
            index, count, newest_ms, fields = _TILE.unpack_from(body, at)
            at += _TILE.size
            if fields != width:
                raise ValueError(f"{fields} fields where the group reads {width}")
            parts: list[Part] = []
            masks = body[at : at + width]
            at += width
            for j, mask in enumerate(masks):
                part: Part = [None, 0.0, None, None, None]
                if mask & STATS:
                    part[0], part[1] = _STATS.unpack_from(body, at)
                    at += _STATS.size
                if mask & LOHI:
                    part[2], part[3] = _LOHI.unpack_from(body, at)
                    at += _LOHI.size
                if mask & LAST:
                    (k,) = _LAST.unpack_from(body, at)
                    at += _LAST.size
                    pair = _TIME_INT if layout.ints[j] else _TIME_FLOAT
                    part[4] = [list(pair.unpack_from(body, at + i * 16)) for i in range(k)]
                    at += 16 * k
                parts.append(part)
            state.tiles[index] = Tile(index, count, newest_ms, parts)
        if at != len(body):
            raise ValueError(f"{len(body) - at} bytes after the last tile")
    except (ValueError, struct.error) as e:
        raise EncodingError(
            f"the stored window tiles cannot be read ({e}): {data[:60]!r}"
        ) from None
    return state


def encode_state(state: State, layout: Layout) -> bytes:
    """The state as stored, with its version counted up (the writer's compare-and-set)."""
    newest = NONE if state.newest_ms is None else state.newest_ms
    out = [b"%d|" % (state.version + 1), _HEAD.pack(FORMAT, newest, len(state.offsets))]
    out += [_OFFSET.pack(p, o) for p, o in sorted(state.offsets.items())]
    out.append(_TILES.pack(len(state.tiles)))
    width = len(layout.fields)
    for _, tile in sorted(state.tiles.items()):
        out.append(_TILE.pack(tile.index, tile.count, tile.newest_ms, width))
        masks = bytearray(width)
        body = []
        for j, (n, total, lo, hi, last) in enumerate(tile.parts):
            if n is not None:
                masks[j] |= STATS
                body.append(_STATS.pack(n, total))
            if lo is not None:
                masks[j] |= LOHI
                body.append(_LOHI.pack(lo, hi))
            if last:
                masks[j] |= LAST
                pair = _TIME_INT if layout.ints[j] else _TIME_FLOAT
                body.append(_LAST.pack(len(last)))
                body += [pair.pack(t, v) for t, v in last]
        out.append(bytes(masks))
        out += body
    return b"".join(out)


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
            if part[0] is not None:
                part[0] += 1
                part[1] += value
            if part[2] is None or value < part[2]:
                part[2] = value
            if part[3] is None or value > part[3]:
                part[3] = value
            if keep[j]:
                if part[4] is None:
                    part[4] = []
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
    """Drop what no read at or after ``newest - lateness`` can reach: a read is exact as
    long as its clock is not behind the newest event by more than the lateness (an event
    time a little ahead of the reader's clock). Per tile, each part is kept while a window
    that reads it can reach the tile; a field's newest values also only while fewer than
    its last_n depth of them are in newer tiles every such read counts too; a tile with
    nothing left goes. No event that is not too late can fall in what was dropped: every
    window is at least a tile long."""
    if state.newest_ms is None:
        return
    tile_ms = layout.tile_ms
    oldest_read = state.newest_ms - layout.lateness_ms
    current = oldest_read // tile_ms  # the current tile of the oldest read

    def first(window_ms: int) -> int:  # this tile and older: out of every such window
        return (oldest_read - window_ms) // tile_ms if window_ms else 2**63

    first_count = first(layout.count_ms)
    firsts = [
        (first(s), first(m), first(last))
        for s, m, last in zip(layout.stats_ms, layout.lohi_ms, layout.last_ms, strict=True)
    ]
    newer = [0] * len(layout.fields)  # values of each field in tiles after this one, to current
    for k in sorted(state.tiles, reverse=True):
        tile = state.tiles[k]
        kept = k > first_count
        for j, (part, (f_stats, f_lohi, f_last)) in enumerate(zip(tile.parts, firsts, strict=True)):
            if k <= f_stats:
                part[0], part[1] = None, 0.0
            if k <= f_lohi:
                part[2] = part[3] = None
            last = part[4]
            if last is not None:
                if k <= f_last or (k <= current and newer[j] >= layout.keep[j]):
                    part[4] = None
                elif k <= current:
                    newer[j] += len(last)
            kept = kept or part[0] is not None or part[2] is not None or bool(part[4])
        if not kept:
            del state.tiles[k]


# --- reading: tiles into answers ---------------------------------------------------------


def answer(state: State, layout: Layout, now: float) -> Answer:
    """Each aggregate of the group at unix time ``now``: one pass over the tiles."""
    tile_ms = layout.tile_ms
    now_ms = math.floor(now * MS)
    current = now_ms // tile_ms
    aggregates = layout.aggregation.aggregates
    firsts = [(now_ms - a.window_seconds * MS) // tile_ms for a in aggregates]
    js = [None if a.of is None else layout.index[a.of] for a in aggregates]
    n = len(aggregates)
    counts = [0] * n
    sums = [0.0] * n
    los: list[float | None] = [None] * n
    his: list[float | None] = [None] * n
    lasts: list[list[list[Any]]] = [[] for _ in range(n)]
    longest = (now_ms - layout.longest_ms) // tile_ms
    newest: int | None = None
    for k, tile in sorted(state.tiles.items()):
        if k > current:
            break
        if k > longest and (newest is None or tile.newest_ms > newest):
            newest = tile.newest_ms
        for i, a in enumerate(aggregates):
            if k <= firsts[i]:
                continue
            j = js[i]
            if j is None:
                counts[i] += tile.count
                continue
            part = tile.parts[j]
            f = a.function
            if f is Function.MIN or f is Function.MAX:
                lo = part[2]
                if lo is not None:
                    if f is Function.MIN:
                        los[i] = lo if los[i] is None or lo < los[i] else los[i]
                    else:
                        hi = part[3]
                        his[i] = hi if his[i] is None or hi > his[i] else his[i]
            elif f is Function.LAST_N:
                if part[4]:
                    lasts[i].append(part[4])
            elif part[0]:
                counts[i] += part[0]
                sums[i] += part[1]
    values: list[Any] = []
    for i, a in enumerate(aggregates):
        f = a.function
        if f is Function.COUNT:
            values.append(counts[i])
        elif f is Function.SUM:  # in tile order, as the native answer adds them
            values.append(sums[i])
        elif f is Function.MEAN:
            values.append(sums[i] / counts[i] if counts[i] else None)
        elif f is Function.MIN:
            values.append(los[i])
        elif f is Function.MAX:
            values.append(his[i])
        else:  # the newest tile's values first; each tile's newest first
            picked: list[Any] = []
            for last in reversed(lasts[i]):
                picked.extend(v for _, v in last)
                if len(picked) >= a.n:
                    break
            values.append(picked[: a.n] if picked else None)
    return Answer(values, newest, (current + 1) * tile_ms / MS)


# --- the reference -----------------------------------------------------------------------


def reference_answer(
    aggregation: Aggregation, events: Sequence[Event], now: float
) -> list[float | int | list[float] | list[int] | None]:
    """The semantics over the events themselves, in their arrival order: what ``answer``
    must equal (sums up to rounding). Replayed events (an offset seen before in their
    partition) and events past the lateness are dropped as ``apply`` drops them; then each
    aggregate reads the events of the tiles after the one holding ``now - window``
    through the one holding ``now``."""
    seen: dict[int, int] = {}
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
