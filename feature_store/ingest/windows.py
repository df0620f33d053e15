"""Events of an aggregated group into its entities' window state in Redis.

For each chunk of entities: one pipeline reads their states (HGET of the group's windows
field), each entity's events are applied to its state (``feature_store.windows.apply``:
replayed offsets and events past the lateness are not counted), and one pipeline writes
the new states, each with the compare-and-set script (``layout.WINDOWS_SCRIPT``). An
entity whose state another writer changed in between is read and applied again, so two
writers of one entity (its events in two Kafka partitions) never lose an event; and a
chunk sent twice after a lost connection finds its offsets already applied.

``defer_late``: the stream's first write of a micro-batch. An entity whose events include a
late one is not written: its late records must be quarantined first, because once its
state holds the batch's offsets a replay finds those events applied and cannot tell them
late. The stream quarantines them, then writes the batch again (``_micro_batch``).

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
    deferred: int = 0  # entities not written for their late records (``defer_late``)
    bad: list[tuple[int, BadReason, str]] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)  # written minus event time, counted events


def write_events(
    writer: ChunkWriter,
    group: FeatureGroup,
    events: EntityEvents,
    *,
    replace: bool = False,
    defer_late: bool = False,
) -> WindowsWritten:
    layout = Layout.of(group)
    out = WindowsWritten()
    keys = list(events)
    size = writer.chunk_size
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        _write_chunk(writer, group, layout, events, chunk, replace, defer_late, out)
    return out


def _write_chunk(
    writer: ChunkWriter,
    group: FeatureGroup,
    layout: Layout,
    events: EntityEvents,
    pending: Sequence[bytes],
    replace: bool,
    defer_late: bool,
    out: WindowsWritten,
) -> None:
    field_, ttl = group.windows_field, group.entity.ttl_seconds
    for _ in range(MAX_ROUNDS):
        held = writer.send([("HGET", key, field_) for key in pending])
        commands, applied = [], []
        for key, data in zip(pending, held, strict=True):
            indexed = events[key]
            try:
                stored = decode_state(data, layout)  # type: ignore[arg-type]
            except EncodingError as e:
                out.bad.extend((i, BadReason.UNREADABLE_STATE, str(e)) for i, _ in indexed)
                continue
            state = State(version=stored.version) if replace else stored
            result = apply(state, layout, [e for _, e in indexed])
            if defer_late and result.late:
                out.deferred += 1
                out.bad.extend(_late_records(result, indexed, group))
                continue
            if len(result.replayed) == len(indexed) > 0:  # (a replaced state has no offsets)
                out.replayed += len(indexed)  # every event applied before: nothing to write
                continue
            commands.append(
                windows_write(key, field_, stored.version, encode_state(state, layout), ttl)
            )
            applied.append((key, result))
        replies = writer.send(commands) if commands else []
        done = time.time()
        again = []
        for (key, result), reply in zip(applied, replies, strict=True):
            if reply != 1:
                again.append(key)
                continue
            indexed = events[key]
            out.entities += 1
            out.counted += result.counted
            out.replayed += len(result.replayed)
            out.bad.extend(_late_records(result, indexed, group))
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


def _late_records(
    result: Applied, indexed: list[tuple[int, Event]], group: FeatureGroup
) -> list[tuple[int, BadReason, str]]:
    return [(indexed[j][0], BadReason.TOO_LATE, _late(indexed[j][1], group)) for j in result.late]


def _late(event: Event, group: FeatureGroup) -> str:
    lateness = group.aggregation.lateness_seconds if group.aggregation else 0
    return (
        f"event time {event.time_ms / 1000:.3f} is more than {lateness} s older than the "
        "entity's newest event"
    )


__all__ = ["WindowsWritten", "write_events"]
