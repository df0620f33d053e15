"""The store client's logic with no I/O: what to send to Redis, and how to read the replies.

The sync and asyncio clients in ``feature_store.store`` differ only in how they send a list
of commands through a pipeline; everything else is here, written once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TypeAlias

from feature_store.errors import EncodingError, EntityDataError, RequestError
from feature_store.layout import (
    MAX_TIMESTAMP,
    SKIPPED,
    decode_timestamp,
    encode_timestamp,
    entity_key,
    guarded_write,
)
from feature_store.native import format_of
from feature_store.registry import EntityType, Feature, FeatureGroup, Registry
from feature_store.serialization import Value
from feature_store.windows import Layout, stored_answer

EntityId: TypeAlias = int | str
Command: TypeAlias = tuple[bytes | str | int, ...]
# one entity's raw values in a plan's field order, or why its key could not be read
RawReply: TypeAlias = "Sequence[bytes | None] | EntityDataError"
# a write's row: id and values (None removes a value), with or without its own event time
WriteRow: TypeAlias = (
    "tuple[EntityId, Mapping[str, object]] | tuple[EntityId, Mapping[str, object], object]"
)


class Status(StrEnum):
    PRESENT = "present"
    MISSING = "missing"
    STALE = "stale"  # present, but its group was written longer ago than the group's max_age
    ERROR = "error"  # the entity's stored data for this group cannot be read (BatchResult.errors)


PRESENT, MISSING, STALE, ERROR = Status.PRESENT, Status.MISSING, Status.STALE, Status.ERROR


class FaultReason(StrEnum):
    """Why an entity's group was answered with status ``error`` (``EntityDataError``)."""

    UNDECODABLE_VALUE = "undecodable_value"  # a stored value does not decode as its type
    CORRUPT_WRITE_TIME = "corrupt_write_time"  # the group's freshness field is not a time
    WRONG_TYPE = "wrong_type"  # the key holds another Redis type than a hash


@dataclass(frozen=True, slots=True)
class Fault:
    """Why one entity's group could not be read: a ``FaultReason`` and a message that
    names the key (and the feature, for an undecodable value)."""

    reason: FaultReason
    message: str

    @classmethod
    def of(cls, error: EntityDataError) -> Fault:
        return cls(FaultReason(error.reason), str(error))


@dataclass(frozen=True, slots=True)
class EntityError:
    """One entity whose stored data for ``group`` could not be read. Its values of that
    group are None with status ``error``; the rest of the batch is answered as usual."""

    entity_id: EntityId
    group: str
    reason: FaultReason
    message: str


@dataclass(frozen=True, slots=True)
class FeatureVector:
    """One entity's values, aligned with ``BatchResult.features``."""

    entity_id: EntityId
    values: list[Value | None]
    statuses: list[Status]
    ages: dict[str, int | None]  # group -> seconds since its last write (None: unknown)
    # group -> unix seconds of its last write (None: unknown), the time ``ages`` counts from
    written: dict[str, int | None] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return any(s is not MISSING and s is not ERROR for s in self.statuses)


@dataclass(frozen=True, slots=True)
class BatchResult:
    entity_type: str
    features: tuple[Feature, ...]
    rows: list[FeatureVector]
    errors: list[EntityError] = field(default_factory=list)  # entities answered "error"

    def as_dicts(self) -> list[dict[str, Value | None]]:
        """Each entity as ``{feature: value}``; missing values are None."""
        names = [f.name for f in self.features]
        return [dict(zip(names, row.values, strict=True)) for row in self.rows]


# A request for more than this share of an entity hash's fields reads the whole hash.
# In a listpack each HMGET field is a scan of the hash, and on the standard shape
# (51 fields) HMGET of ~27 fields costs the server what one HGETALL does; see
# benchmarks/results/memory.md.
WHOLE_HASH_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """One command per entity for the requested fields and each touched group's freshness.

    ``commands()`` is an HMGET of ``fields``, or an HGETALL when the request wants most of
    the hash (``whole_hash``); ``align()`` turns either reply into values in ``fields`` order.
    """

    entity: EntityType
    ids: tuple[EntityId, ...]
    keys: tuple[bytes, ...]
    features: tuple[Feature, ...]
    groups: tuple[FeatureGroup, ...]
    fields: tuple[bytes, ...]
    whole_hash: bool = False

    def commands(self) -> list[Command]:
        if self.whole_hash:
            return [("HGETALL", key) for key in self.keys]
        return [("HMGET", key, *self.fields) for key in self.keys]

    def align(self, replies: Sequence[object]) -> list[RawReply]:
        """Replies of ``commands()`` as lists of raw values in ``fields`` order; an
        ``EntityDataError`` (the store client's for a WRONGTYPE reply) is kept as it is."""
        if not self.whole_hash:
            return replies  # type: ignore[return-value]
        return [
            r if isinstance(r, EntityDataError) else align_hash(r, self.fields) for r in replies
        ]


def reads_whole_hash(wanted_fields: int, hash_fields: int) -> bool:
    """Whether reading ``wanted_fields`` of a hash of ``hash_fields`` is cheaper by HGETALL."""
    return wanted_fields > WHOLE_HASH_SHARE * hash_fields


def hash_fields(registry: Registry, entity: str) -> int:
    """The fields an entity's hash can hold: every feature, and each group's freshness."""
    groups = sum(1 for g in registry.groups.values() if g.entity.name == entity)
    return len(registry.features_of(entity)) + groups


def align_hash(reply: object, fields: Sequence[bytes]) -> list[bytes | None]:
    """An HGETALL reply (a dict, or the raw field/value list) as values in ``fields`` order."""
    if not isinstance(reply, dict):  # a connection without response callbacks: pairs
        it = iter(reply)  # type: ignore[call-overload]
        reply = dict(zip(it, it, strict=True))
    get = reply.get
    return [get(f) for f in fields]


def plan_read(
    registry: Registry,
    entity: str,
    ids: Sequence[EntityId],
    features: Iterable[str] = (),
    groups: Iterable[str] = (),
    *,
    max_entities: int | None = None,
) -> ReadPlan:
    etype = registry.entity(entity)
    if not ids:
        raise RequestError("the request names no entity ids")
    if max_entities is not None and len(ids) > max_entities:
        raise RequestError(f"{len(ids)} entity ids is more than the limit of {max_entities}")
    resolved = registry.resolve(entity, features, groups)
    keys = []
    for i in ids:
        try:
            keys.append(entity_key(etype.prefix, etype.id_type, i))
        except RequestError as e:
            raise RequestError(
                f"entity type {entity!r} has {etype.id_type.value} ids: {e}"
            ) from None
    touched = tuple({f.group: registry.groups[f.group] for f in resolved}.values())
    # an aggregated group's features and write time all read its one field, its window
    # state, which ``decode_read`` answers at the time of the read
    fields = tuple(registry.groups[f.group].windows_field or f.field for f in resolved) + tuple(
        g.windows_field or g.freshness_field for g in touched
    )
    return ReadPlan(
        entity=etype,
        ids=tuple(ids),
        keys=tuple(keys),
        features=resolved,
        groups=touched,
        fields=fields,
        whole_hash=reads_whole_hash(len(fields), hash_fields(registry, entity)),
    )


def decode_read(
    plan: ReadPlan, replies: Sequence[RawReply], now: float | None = None
) -> BatchResult:
    """Typed values and statuses from aligned replies (``plan.align``), in the plan's order.

    An entity whose stored data of a group cannot be read (``EntityDataError``: a value that
    does not decode, a corrupt write time, a key of another type) gets None with status
    ``error`` for that group's features and an entry in ``BatchResult.errors``; the other
    entities and groups are decoded as usual."""
    now_s = int(time.time() if now is None else now)
    nfeat = len(plan.features)
    fmt = format_of(tuple(f.codec for f in plan.features))  # native, or the codecs
    group_of = {g.name: i for i, g in enumerate(plan.groups)}
    feature_group = [group_of[f.group] for f in plan.features]
    single_group = len(plan.groups) == 1
    windows = _windows(plan)
    rows, errors = [], []
    for entity_id, key, reply in zip(plan.ids, plan.keys, replies, strict=True):
        faults: dict[int, Fault] = {}
        if isinstance(reply, EntityDataError):
            fault = Fault.of(reply)
            faults = dict.fromkeys(range(len(plan.groups)), fault)
            reply = [None] * len(plan.fields)
        elif windows:
            reply = _answer_windows(windows, key, reply, faults, now)
        raw = reply[:nfeat]
        try:
            values = fmt.decode(raw)
        except ValueError:  # EncodingError is one; fast decoders raise plain ValueError
            values = _decode_each(plan, key, raw, feature_group, faults)
        ages: dict[str, int | None] = {}
        written: dict[str, int | None] = {}
        stale_groups = []
        for gi, (group, ts) in enumerate(zip(plan.groups, reply[nfeat:], strict=True)):
            try:
                at = None if ts is None else decode_timestamp(ts)
            except ValueError as e:
                at = None
                faults.setdefault(
                    gi,
                    Fault(
                        FaultReason.CORRUPT_WRITE_TIME,
                        f"{key.decode(errors='replace')}: the write time of group "
                        f"{group.name!r} is corrupt ({e})",
                    ),
                )
            age = None if at is None else max(0, now_s - at)
            faulted = gi in faults
            ages[group.name] = None if faulted else age
            written[group.name] = None if faulted else at
            if (
                age is not None
                and group.max_age_seconds is not None
                and age > group.max_age_seconds
            ):
                stale_groups.append(gi)
        statuses = [MISSING if r is None else PRESENT for r in raw]
        if stale_groups:
            for i, r in enumerate(raw):
                if r is not None and (single_group or feature_group[i] in stale_groups):
                    statuses[i] = STALE
        if faults:
            for i, gi in enumerate(feature_group):
                if gi in faults:
                    values[i], statuses[i] = None, ERROR
            for gi, fault in faults.items():
                errors.append(
                    EntityError(entity_id, plan.groups[gi].name, fault.reason, fault.message)
                )
        rows.append(FeatureVector(entity_id, values, statuses, ages, written))
    return BatchResult(plan.entity.name, plan.features, rows, errors)


# an aggregated group of a read: its index, its layout, its features' places in the reply
# (with each one's aggregate and codec), and the place of its write time
_Windows = tuple[int, Layout, list[tuple[int, int]], int]


def _windows(plan: ReadPlan) -> list[_Windows]:
    out = []
    nfeat = len(plan.features)
    for gi, group in enumerate(plan.groups):
        if group.aggregation is not None:
            index = {f.name: n for n, f in enumerate(group.features)}
            places = [
                (i, index[f.name]) for i, f in enumerate(plan.features) if f.group == group.name
            ]
            out.append((gi, Layout.of(group), places, nfeat + gi))
    return out


def _answer_windows(
    windows: Sequence[_Windows],
    key: bytes,
    reply: Sequence[bytes | None],
    faults: dict[int, Fault],
    now: float | None,
) -> list[bytes | None]:
    """``reply`` with each aggregated group's window state replaced by the values of its
    features now, encoded as a plain group's are stored, and the time of its newest event
    in its windows as its write time (``feature_store.windows``)."""
    out = list(reply)
    at = time.time() if now is None else now
    for gi, layout, places, ts in windows:
        data = reply[ts]
        out[ts] = None
        for i, _ in places:
            out[i] = None
        if data is None:
            continue
        try:
            stored, newest = stored_answer(data, layout, at)
        except EncodingError as e:
            where = key.decode(errors="replace")
            faults[gi] = Fault(FaultReason.UNDECODABLE_VALUE, f"{where}: {e}")
            continue
        for i, a in places:
            out[i] = stored[a]
        if newest is not None:
            out[ts] = encode_timestamp(newest / 1000)
    return out


def _decode_each(
    plan: ReadPlan,
    key: bytes,
    raw: Sequence[bytes | None],
    feature_group: Sequence[int],
    faults: dict[int, Fault],
) -> list[Value | None]:
    """The values decoded one by one by the codecs (after the fast decode refused some);
    the group of each value that does not decode is recorded in ``faults``."""
    values: list[Value | None] = []
    for f, gi, r in zip(plan.features, feature_group, raw, strict=True):
        if r is None:
            values.append(None)
            continue
        try:
            values.append(f.codec.decode(r))
        except EncodingError as e:
            values.append(None)
            faults.setdefault(
                gi,
                Fault(
                    FaultReason.UNDECODABLE_VALUE,
                    f"{key.decode(errors='replace')} feature {f.name!r}: {e}",
                ),
            )
    return values


EPOCH_UNITS_BOUND = 1e11  # a larger number of "seconds" is milli-, micro- or nanoseconds
MAX_FUTURE_SECONDS = 3600  # a later event time would hide every write of its entity until then


@dataclass(frozen=True, slots=True)
class WriteStats:
    entities: int = 0  # entities whose values were written
    values_written: int = 0
    values_removed: int = 0
    # entities left as they were: Redis holds a newer event time for their group
    skipped: int = 0

    def __add__(self, other: WriteStats) -> WriteStats:
        return WriteStats(
            self.entities + other.entities,
            self.values_written + other.values_written,
            self.values_removed + other.values_removed,
            self.skipped + other.skipped,
        )


@dataclass(frozen=True, slots=True)
class WritePlan:
    """One guarded write command per entity, and what each writes if it is applied."""

    commands: list[Command]
    keys: list[bytes]
    counts: list[tuple[int, int]]  # per command: values written, values removed

    @property
    def stats(self) -> WriteStats:
        """The totals if every command is applied."""
        return WriteStats(
            len(self.counts), sum(w for w, _ in self.counts), sum(r for _, r in self.counts)
        )

    def outcome(self, replies: Sequence[object]) -> WriteStats:
        """The totals from WRITE_SCRIPT's replies (``write_outcome``)."""
        return write_outcome(self.counts, replies)


def write_outcome(counts: Sequence[tuple[int, int]], replies: Sequence[object]) -> WriteStats:
    """The totals of guarded writes from WRITE_SCRIPT's replies, given what each writes if
    applied (values written, values removed); an error reply counts as neither."""
    entities = written = removed = skipped = 0
    for (w, r), reply in zip(counts, replies, strict=True):
        if reply == SKIPPED:
            skipped += 1
        elif not isinstance(reply, Exception):
            entities, written, removed = entities + 1, written + w, removed + r
    return WriteStats(entities, written, removed, skipped)


def event_time_seconds(value: object, now: float) -> float:
    """A row's event time as unix seconds, from a number (seconds, or milli-, micro- or
    nanoseconds: told apart by size), an RFC 3339 string or an aware datetime.
    RequestError for anything else, a time before 1970, or a time more than
    MAX_FUTURE_SECONDS ahead of ``now``."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise RequestError(f"event time {value!r} has no time zone")
        seconds = value.timestamp()
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise RequestError(
                f"event time {value[:40]!r} is not an RFC 3339 time (e.g. 2026-11-23T10:00:00Z)"
            ) from None
        if parsed.tzinfo is None:
            raise RequestError(f"event time {value[:40]!r} has no time zone (add Z or +00:00)")
        seconds = parsed.timestamp()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
        # milliseconds, microseconds or nanoseconds since 1970 (Kafka's, Java's, pandas'):
        # as seconds, such a number would be past the year 5138, which is refused anyway
        for _ in range(3):
            if seconds < EPOCH_UNITS_BOUND:
                break
            seconds /= 1000
    else:
        raise RequestError(f"event time {value!r} must be unix seconds or an RFC 3339 string")
    if not 0 <= seconds <= MAX_TIMESTAMP:  # also NaN
        raise RequestError(f"event time {value!r} is not a time after 1970")
    if seconds > now + MAX_FUTURE_SECONDS:
        raise RequestError(
            f"event time {value!r} is more than {MAX_FUTURE_SECONDS} s in the future: it would "
            "hide every later write of its entity until then"
        )
    return seconds


def refuse_aggregated(group: FeatureGroup) -> None:
    """An aggregated group's values are computed from its events, never written as such."""
    if group.aggregation is not None:
        raise RequestError(
            f"feature group {group.name!r} is window aggregations, computed from events: "
            "send its events to its stream's topic (feature-store stream), or backfill a "
            "history of them with feature-store ingest"
        )


def plan_write(
    group: FeatureGroup,
    rows: Iterable[WriteRow],
    *,
    event_time: object = None,
    now: float | None = None,
) -> WritePlan:
    """One guarded write command (``layout.WRITE_SCRIPT``) per row of one feature group.

    A row is ``(id, values)`` or ``(id, values, event_time)``; a row without its own event
    time has ``event_time`` (default: ``now``). A feature the row maps to None is removed,
    so a snapshot never leaves yesterday's value beside today's time; a feature the row
    leaves out is not touched. Redis applies a command only if the group's stored event
    time is not newer, atomically, so any writer may race any other. Every command is
    idempotent: a retried chunk gives the same state. Everything is validated and encoded
    here, before any I/O.
    """
    refuse_aggregated(group)
    now = time.time() if now is None else now
    default = now if event_time is None else event_time_seconds(event_time, now)
    default_ts = encode_timestamp(default)
    entity = group.entity
    by_name = {f.name: (f.field, f.codec.encode) for f in group.features}
    commands: list[Command] = []
    keys: list[bytes] = []
    counts: list[tuple[int, int]] = []
    for row in rows:
        entity_id, values = row[0], row[1]
        key = entity_key(entity.prefix, entity.id_type, entity_id)
        ts = default_ts
        if len(row) > 2:
            try:
                ts = encode_timestamp(event_time_seconds(row[2], now))
            except RequestError as e:
                raise RequestError(f"entity {entity_id!r}: {e}") from None
        hset: list[bytes] = []
        remove: list[bytes] = []
        for name, value in values.items():
            field_encode = by_name.get(name)
            if field_encode is None:
                raise RequestError(f"feature group {group.name!r} has no feature {name!r}")
            if value is None:
                remove.append(field_encode[0])
                continue
            try:
                hset += (field_encode[0], field_encode[1](value))
            except EncodingError as e:
                raise EncodingError(f"entity {entity_id!r} feature {name!r}: {e}") from None
        counts.append((len(hset) // 2, len(remove)))
        hset += (group.freshness_field, ts)
        commands.append(guarded_write(key, entity.ttl_seconds, remove, hset))
        keys.append(key)
    return WritePlan(commands, keys, counts)
