"""``feature-store ingest`` of an aggregated group: a history of events into window tiles.

    input (entity id, event time, the fields the aggregates read)
    -> repartition by entity, each partition sorted by (entity, event time)
    -> per partition (mapInArrow): each entity's events in time order into a new window
       state (``feature_store.windows``), which replaces the stored one (``ingest.windows``)

The tiles are those the stream writes for the same events (events in time order are never
late), so a new aggregation starts full instead of empty. The state replaces what Redis
holds, so running a backfill twice gives the same state. Run it before the group's stream
starts (or start the stream at ``--starting-offsets latest``): a stream's events that the
history also holds would otherwise be counted twice, once by each.

A task's output is the nightly job's (``ingest.task``): the bad rows with their reasons,
then one statistics row, which the driver sums into the report.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa  # type: ignore[import-untyped]

from feature_store.errors import EncodingError, RequestError
from feature_store.ingest.encode import event_times
from feature_store.ingest.records import EntityEvents
from feature_store.ingest.spec import BadReason, ColumnSpec, Source, TaskSpec
from feature_store.ingest.task import quarantine, stats_row, task_group, task_writer
from feature_store.ingest.windows import WindowsWritten, write_events
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import IdType, entity_key
from feature_store.registry import Feature, FeatureGroup
from feature_store.serialization import FeatureType, codec_for
from feature_store.windows import Event, field_types, number

DEFAULT_EVENT_TIME_COLUMN = "event_time"


def field_group(group: FeatureGroup) -> FeatureGroup:
    """The aggregated group as a plain one whose features are the record fields its
    aggregates read, typed as they must be: what the nightly job's column checks take."""
    aggregation = group.aggregation
    if aggregation is None:
        raise ValueError(f"feature group {group.name!r} is not aggregated")
    features = tuple(
        Feature(name, group.name, group.entity.name, codec_for(type_, None), b"")
        for name, type_ in field_types(aggregation, group).items()
    )
    return replace(group, features=features, aggregation=None)


def backfill_partition(
    spec: TaskSpec, schema: pa.Schema, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: one partition's events, sorted by (entity, time)."""
    group = task_group(spec)
    writer = task_writer(spec, group)
    types = field_types(group.aggregation, group) if group.aggregation else {}
    total = WindowsWritten()
    rows = bad_rows = 0
    carried: EntityEvents = {}  # the last entity of a batch: its events may go on in the next
    try:
        for batch in batches:
            rows += batch.num_rows
            events, bad = _events(spec, group, types, batch, time.time())
            if bad:
                bad_rows += len(bad)
                yield quarantine(schema, batch, bad)
            last = next(reversed(events), None) if events else None
            for key, indexed in events.items():
                carried.setdefault(key, []).extend(indexed)
            done = {k: v for k, v in carried.items() if k != last}
            carried = {last: carried[last]} if last is not None else {}
            _add(total, write_events(writer, group, done, replace=True))
        if carried:
            _add(total, write_events(writer, group, carried, replace=True))
    finally:
        writer.close()
    yield _stats(schema, rows, bad_rows, total, writer)


def _events(
    spec: TaskSpec,
    group: FeatureGroup,
    types: dict[str, FeatureType],
    batch: pa.RecordBatch,
    now: float,
) -> tuple[EntityEvents, list[tuple[int, BadReason, str]]]:
    entity = group.entity
    ids = batch.column(spec.id_column).to_pylist()
    assert spec.event_time_column is not None
    times = event_times(batch.column(spec.event_time_column), now)
    columns: list[tuple[ColumnSpec, list[object]]] = [
        (c, batch.column(c.column).to_pylist()) for c in spec.columns
    ]
    bad: list[tuple[int, BadReason, str]] = []
    out: EntityEvents = {}
    for i, raw in enumerate(ids):
        error = times.errors.get(i)
        if error is not None:
            bad.append((i, *error))
            continue
        try:
            if raw is None:
                raise RequestError(f"column {spec.id_column!r} is null")
            value: object = raw
            if spec.id_source is Source.TEXT and entity.id_type is IdType.INT:
                value = int(raw)
            key = entity_key(entity.prefix, entity.id_type, value)
        except (RequestError, ValueError) as e:
            reason = BadReason.NULL_ID if raw is None else BadReason.INVALID_ID
            bad.append((i, reason, str(e)))
            continue
        values: dict[str, float | int] = {}
        try:
            for column, cells in columns:
                cell = cells[i]
                if cell is None:
                    continue
                if isinstance(cell, str):  # CSV
                    cell = _text(cell)
                values[column.feature] = number(cell, types[column.feature])
        except (EncodingError, ValueError) as e:
            bad.append((i, BadReason.INVALID_VALUE, f"{column.column!r}: {e}"))
            continue
        stamp = times.values[i]
        assert stamp is not None
        out.setdefault(key, []).append((i, Event(round(float(stamp) * 1000), values)))
    return out, bad


def _text(cell: str) -> float | int:
    """A number written as text (CSV): an integer where it has no fraction."""
    try:
        return int(cell)
    except ValueError:
        try:
            return float(cell)
        except ValueError:
            raise ValueError(f"{cell[:40]!r} is not a number") from None


def _add(total: WindowsWritten, part: WindowsWritten) -> None:
    total.entities += part.entities
    total.counted += part.counted
    total.replayed += part.replayed
    total.conflicts += part.conflicts


def _stats(
    schema: pa.Schema, rows: int, bad: int, written: WindowsWritten, writer: ChunkWriter
) -> pa.RecordBatch:
    counters = writer.counters
    counters.entities, counters.values_written = written.entities, written.counted
    return stats_row(schema, rows, bad, counters, 0.0, 0.0)


__all__ = ["DEFAULT_EVENT_TIME_COLUMN", "backfill_partition", "field_group"]
