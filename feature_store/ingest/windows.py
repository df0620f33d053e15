"""Events of an aggregated group into its entities' window state in Redis.

For each chunk of entities: one pipeline reads their states (HGET of the group's windows
field), each entity's events are applied to its state (``feature_store.windows.apply``:
replayed offsets and events past the lateness are not counted), and one pipeline writes
the new states, each with the compare-and-set script (``layout.WINDOWS_SCRIPT``). An
entity whose state another writer changed in between is read and applied again, so two
writers of one entity (its events in two Kafka partitions) never lose an event; and a
chunk sent twice after a lost connection finds its offsets already applied.

``replace``: the backfill's write. The state is built from the events alone and replaces
what is stored (still by compare-and-set): running a backfill twice gives the same state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from feature_store.errors import EncodingError, StoreError
from feature_store.ingest.records import EntityEvents
from feature_store.ingest.spec import BadReason
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import windows_write
from feature_store.registry import FeatureGroup
from feature_store.windows import (
    Applied,
    Event,
    Layout,
    State,
    apply,
    decode_state,
    encode_state,
)

MAX_ROUNDS = 50  # reads of one entity's state while other writers keep changing it


@dataclass(slots=True)
class WindowsWritten:
    """What a call wrote: entities, events counted, replayed (applied before), and the
    records not counted (late, or their entity's state unreadable), by index."""

    entities: int = 0
    counted: int = 0
    replayed: int = 0
    conflicts: int = 0  # states another writer changed between the read and the write
    bad: list[tuple[int, BadReason, str]] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)  # written minus event time, counted events


def write_events(
    writer: ChunkWriter, group: FeatureGroup, events: EntityEvents, *, replace: bool = False
) -> WindowsWritten:
    layout = Layout.of(group)
    out = WindowsWritten()
    keys = list(events)
    size = writer.chunk_size
    for start in range(0, len(keys), size):
        _write_chunk(writer, group, layout, events, keys[start : start + size], replace, out)
    return out


def check_events(
    writer: ChunkWriter, group: FeatureGroup, events: EntityEvents
) -> list[tuple[int, BadReason, str]]:
    """The records ``write_events`` would not count against the states stored now (late,
    or their entity's state unreadable), by index, with nothing written: the stream
    quarantines them before it writes, since once written they are replayed, not late."""
    layout = Layout.of(group)
    bad: list[tuple[int, BadReason, str]] = []
    keys = list(events)
    size = writer.chunk_size
    for start in range(0, len(keys), size):
        for key, _, result in _applied(
            writer, group, layout, events, keys[start : start + size], False, bad
        ):
            indexed = events[key]
            bad.extend(
                (indexed[j][0], BadReason.TOO_LATE, _late(indexed[j][1], group))
                for j in result.late
            )
    return sorted(bad)


def _applied(
    writer: ChunkWriter,
    group: FeatureGroup,
    layout: Layout,
    events: EntityEvents,
    pending: Sequence[bytes],
    replace: bool,
    bad: list[tuple[int, BadReason, str]],
) -> list[tuple[bytes, tuple[bytes | str | int, ...], Applied]]:
    """``pending``'s states read in one pipeline and their events applied: per entity, its
    key, the compare-and-set write of its new state, what applying counted; an entity whose
    state does not decode has its records in ``bad`` instead."""
    field_, ttl = group.windows_field, group.entity.ttl_seconds
    held = writer.send([("HGET", key, field_) for key in pending])
    out = []
    for key, data in zip(pending, held, strict=True):
        indexed = events[key]
        try:
            stored = decode_state(data, layout)  # type: ignore[arg-type]
        except EncodingError as e:
            bad.extend((i, BadReason.UNREADABLE_STATE, str(e)) for i, _ in indexed)
            continue
        state = State(version=stored.version) if replace else stored
        result = apply(state, layout, [e for _, e in indexed])
        write = windows_write(key, field_, stored.version, encode_state(state, layout), ttl)
        out.append((key, write, result))
    return out


def _write_chunk(
    writer: ChunkWriter,
    group: FeatureGroup,
    layout: Layout,
    events: EntityEvents,
    pending: Sequence[bytes],
    replace: bool,
    out: WindowsWritten,
) -> None:
    for _ in range(MAX_ROUNDS):
        applied = _applied(writer, group, layout, events, pending, replace, out.bad)
        replies = writer.send([write for _, write, _ in applied]) if applied else []
        done = time.time()
        again = []
        for (key, _, result), reply in zip(applied, replies, strict=True):
            if reply != 1:
                again.append(key)
                continue
            indexed = events[key]
            out.entities += 1
            out.counted += result.counted
            out.replayed += len(result.replayed)
            for j in result.late:
                i, event = indexed[j]
                out.bad.append((i, BadReason.TOO_LATE, _late(event, group)))
            skipped = {*result.replayed, *result.late}
            out.lags.extend(
                done - e.time_ms / 1000 for j, (_, e) in enumerate(indexed) if j not in skipped
            )
        out.conflicts += len(again)
        if not again:
            return
        pending = again
    raise StoreError(
        f"the window state of {len(pending)} entities of {group.name!r} kept changing under "
        f"{MAX_ROUNDS} reads: is another writer looping on them?"
    )


def _late(event: Event, group: FeatureGroup) -> str:
    lateness = group.aggregation.lateness_seconds if group.aggregation else 0
    return (
        f"event time {event.time_ms / 1000:.3f} is more than {lateness} s older than the "
        "entity's newest event"
    )


__all__ = ["WindowsWritten", "check_events", "write_events"]
