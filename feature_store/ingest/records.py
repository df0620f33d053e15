"""A stream's Kafka records as guarded writes: decode, check, keep the newest per entity.

Pure logic, no Spark and no I/O, so that it is tested on its own (``stream.py`` runs it in
each Spark task). A record is decoded by its format into a document (field -> value):

- ``json``: the value is one JSON object;
- ``avro``: Spark's ``from_avro`` decoded the value with the writer's schema and handed its
  fields on as JSON (``to_json``, nulls kept: a null removes the value, as in JSON), so
  this module sees JSON text, or a record of nulls where the bytes were not a record of
  the schema;
- ``protobuf``: the value is one message of a type named in a descriptor set, decoded here
  with the protobuf runtime.

Then the entity id comes from the document's id field or from the record's key (UTF-8 text
or a big-endian int64), the event time from the document's field or Kafka's timestamp;
fields are renamed by ``--map``; every other field must be a feature of the group (or is
ignored with ``ignore_extra_fields``).

**Newest per entity.** Of the records of one entity in one call, only the newest by event
time is written (at equal event times, the later record, i.e. the later offset in a Kafka
partition); the others are counted as superseded. The ordering guard would skip them if
they arrived after it, so the outcome no longer depends on the order within a micro-batch,
and an entity that changes often costs one write per micro-batch instead of one per record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

import orjson

from feature_store.batch import Command, EntityId, WritePlan, event_time_seconds, plan_write
from feature_store.errors import EncodingError, RequestError
from feature_store.ingest.spec import BadReason
from feature_store.layout import IdType, entity_key
from feature_store.registry import FeatureGroup
from feature_store.serialization.json_floats import json_converter, json_int
from feature_store.windows import Event, field_types, number

DEFAULT_EVENT_TIME_FIELD = "event_time"


class Format(StrEnum):
    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"


class KeyFormat(StrEnum):
    STRING = "string"  # UTF-8 text
    INT64 = "int64"  # 8 bytes, big-endian, signed (Kafka's LongSerializer)


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """How to read one topic's records (picklable: sent to every task)."""

    format: Format = Format.JSON
    id_field: str = ""  # "" with id_from_key
    event_time_field: str = DEFAULT_EVENT_TIME_FIELD  # "" with event_time_from_kafka
    id_from_key: bool = False
    key_format: KeyFormat = KeyFormat.STRING
    event_time_from_kafka: bool = False
    renames: tuple[tuple[str, str], ...] = ()  # (record field, feature)
    ignore_extra_fields: bool = False
    proto_descriptor: bytes = b""  # a serialized FileDescriptorSet
    proto_message: str = ""  # the full name of the message type
    # values framed by Confluent's Schema Registry serializers: a 5-byte header (magic 0,
    # schema id) and, for Protobuf, the message indexes, before the encoded record
    confluent_framing: bool = False


@dataclass(slots=True)
class Encoded:
    """One call's good records as guarded writes, and its bad ones."""

    commands: list[Command] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    counts: list[tuple[int, int]] = field(default_factory=list)  # values written, removed
    bad: list[tuple[int, BadReason, str]] = field(default_factory=list)  # index, why
    superseded: int = 0  # records of an entity older than its newest in the call


@dataclass(slots=True)
class _Row:
    index: int
    key: bytes
    entity_id: EntityId
    values: dict[str, object]
    seconds: float


class Decoder:
    """Records of one format into documents; built once per task."""

    def __init__(self, fmt: RecordFormat) -> None:
        self.fmt = fmt
        self._message: Any = None
        if fmt.format is Format.PROTOBUF:
            self._message = proto_message_class(fmt.proto_descriptor, fmt.proto_message)

    def document(self, raw: bytes | str | None) -> dict[str, object] | str:
        """The record's fields, or why it cannot be read."""
        if raw is None:
            return (
                "not an Avro record of the schema" if self.fmt.format is Format.AVRO else "no value"
            )
        if self._message is not None:
            if self.fmt.confluent_framing:
                unframed = confluent_unframe(raw, protobuf=True)
                if isinstance(unframed, str):
                    return unframed
                raw = unframed
            return proto_document(self._message, raw)
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            return f"not JSON: {e}"
        if not isinstance(doc, dict):
            return "not a JSON object"
        if self.fmt.format is Format.AVRO and all(v is None for v in doc.values()):
            # from_avro (PERMISSIVE) gives a record of nulls for bytes it cannot decode; a
            # record with every field null carries nothing to write either
            return "not an Avro record of the schema"
        return doc


def confluent_unframe(raw: bytes | str, *, protobuf: bool) -> bytes | str:
    """The encoded record inside a Confluent Schema Registry frame, or why there is none:
    magic byte 0, a 4-byte schema id, and for Protobuf the message indexes (a zigzag
    varint count, then that many varints; a single 0 byte for the first message)."""
    data = raw if isinstance(raw, bytes) else raw.encode()
    if len(data) < 5 or data[0] != 0:
        return "not a Confluent Schema Registry frame (magic byte 0 and a schema id)"
    pos = 5
    if protobuf:
        count, pos = _zigzag(data, pos)
        for _ in range(max(0, count)):
            _, pos = _zigzag(data, pos)
        if pos > len(data):
            return "a Confluent Protobuf frame whose message indexes are cut short"
    return data[pos:]


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: its value and the position after it (past the end if
    the data stops inside it)."""
    shift = value = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    return 0, len(data) + 1


def proto_message_class(descriptor_set: bytes, name: str) -> Any:
    """The message class ``name`` from a serialized FileDescriptorSet. A name that is not
    in it is an error that lists the names that are."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    try:
        descriptor = pool.FindMessageTypeByName(name)
    except KeyError:
        known = sorted(
            f"{f.package}.{m.name}" if f.package else m.name
            for f in files.file
            for m in f.message_type
        )
        raise RequestError(
            f"no message {name!r} in the descriptor set; it has: {', '.join(known)}"
        ) from None
    return message_factory.GetMessageClass(descriptor)


def proto_document(message_class: Any, raw: bytes | str) -> dict[str, object] | str:
    """A message's fields as a document. A field with presence (``optional``, a message)
    appears only when set; one without (a proto3 scalar) always, with its value, so a 0
    is written as 0. ``google.protobuf.Timestamp`` becomes unix seconds."""
    from google.protobuf.message import DecodeError

    try:
        message = message_class.FromString(raw if isinstance(raw, bytes) else raw.encode())
    except DecodeError as e:
        return f"not a {message_class.DESCRIPTOR.full_name} message: {e}"
    doc: dict[str, object] = {}
    for f in message_class.DESCRIPTOR.fields:
        repeated = f.is_repeated
        if not repeated and f.has_presence and not message.HasField(f.name):
            continue
        value = getattr(message, f.name)
        if repeated:
            doc[f.name] = [_proto_value(v) for v in value]
        else:
            doc[f.name] = _proto_value(value)
    return doc


def _proto_value(value: object) -> object:
    descriptor = getattr(value, "DESCRIPTOR", None)
    if descriptor is not None and descriptor.full_name == "google.protobuf.Timestamp":
        return value.seconds + value.nanos / 1e9  # type: ignore[attr-defined]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def key_id(key: bytes | None, key_format: KeyFormat, id_type: IdType) -> object:
    """The entity id in a Kafka record's key. RequestError if it holds none."""
    if key is None:
        raise RequestError("the record has no key")
    if key_format is KeyFormat.INT64:
        if len(key) != 8:
            raise RequestError(f"the key is {len(key)} bytes, not an 8-byte big-endian int64")
        return int.from_bytes(key, "big", signed=True)
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the key is not UTF-8 text") from None
    if id_type is IdType.INT:
        try:
            return int(text)
        except ValueError:
            raise RequestError(f"the key {text[:40]!r} is not an integer id") from None
    return text


def encode_records(
    group: FeatureGroup,
    fmt: RecordFormat,
    values: Sequence[bytes | str | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[float | None] | None = None,
    decoder: Decoder | None = None,
    now: float | None = None,
) -> Encoded:
    """The newest record of each entity as one guarded write (``batch.plan_write``), and
    the bad records with their reasons. ``keys`` and ``timestamps`` are Kafka's, by index."""
    now = time.time() if now is None else now
    decoder = decoder or Decoder(fmt)
    features = {f.name: json_converter(f.type) for f in group.features}
    renames = dict(fmt.renames)
    reserved = {fmt.id_field, fmt.event_time_field} - {""}
    out = Encoded()
    rows: list[_Row] = []
    for i, raw in enumerate(values):
        doc = decoder.document(raw)
        if isinstance(doc, str):
            out.bad.append((i, BadReason.MALFORMED_RECORD, doc))
            continue
        row = _row(i, doc, fmt, features, renames, reserved, group, keys, timestamps, now)
        if isinstance(row, tuple):
            out.bad.append((i, *row))
        else:
            rows.append(row)
    newest = _newest(rows)
    out.superseded = len(rows) - len(newest)
    try:  # one plan for the lot: a bad value is rare
        plan = _plan(group, newest, now)
    except (EncodingError, RequestError):
        # find the bad ones among every row, then keep the newest of the good: an entity's
        # older record is written when its newest cannot be
        good: list[_Row] = []
        for row in rows:
            try:
                _plan(group, [row], now)
                good.append(row)
            except EncodingError as e:
                out.bad.append((row.index, BadReason.INVALID_VALUE, str(e)))
            except RequestError as e:
                out.bad.append((row.index, BadReason.INVALID_ID, str(e)))
        newest = _newest(good)
        out.superseded = len(good) - len(newest)
        plan = _plan(group, newest, now)
        out.bad.sort(key=lambda b: b[0])
    out.commands, out.keys, out.counts = plan.commands, plan.keys, plan.counts
    out.event_times = [row.seconds for row in newest]
    return out


# one entity's events of a call, in the order they came, each with its record's index
EntityEvents = dict[bytes, list[tuple[int, Event]]]


def decode_events(
    group: FeatureGroup,
    fmt: RecordFormat,
    values: Sequence[bytes | str | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[float | None] | None = None,
    partitions: Sequence[int] | None = None,
    offsets: Sequence[int] | None = None,
    decoder: Decoder | None = None,
    now: float | None = None,
) -> tuple[EntityEvents, list[tuple[int, BadReason, str]]]:
    """The records of an aggregated group as events, by entity, and the bad records with
    their reasons. A record's fields that no aggregate reads are ignored; one an aggregate
    reads must be a number (an int where a last_n answers int_list), or null/absent."""
    aggregation = group.aggregation
    if aggregation is None:
        raise ValueError(f"feature group {group.name!r} is not aggregated")
    now = time.time() if now is None else now
    decoder = decoder or Decoder(fmt)
    types = field_types(aggregation, group)
    read = {name: json_converter(t) for name, t in types.items()}
    renames = dict(fmt.renames)
    reserved = {fmt.id_field, fmt.event_time_field} - {""}
    lenient = dataclasses.replace(fmt, ignore_extra_fields=True)
    out: EntityEvents = {}
    bad: list[tuple[int, BadReason, str]] = []
    for i, raw in enumerate(values):
        doc = decoder.document(raw)
        if isinstance(doc, str):
            bad.append((i, BadReason.MALFORMED_RECORD, doc))
            continue
        row = _row(i, doc, lenient, read, renames, reserved, group, keys, timestamps, now)
        if isinstance(row, tuple):
            bad.append((i, *row))
            continue
        numbers: dict[str, float | int] = {}
        try:
            for name, value in row.values.items():
                if value is not None:
                    numbers[name] = number(value, types[name])
        except EncodingError as e:
            bad.append((i, BadReason.INVALID_VALUE, f"{name!r}: {e}"))
            continue
        event = Event(
            round(row.seconds * 1000),
            numbers,
            None if partitions is None else partitions[i],
            -1 if offsets is None else offsets[i],
        )
        out.setdefault(row.key, []).append((i, event))
    return out, bad


def _row(
    i: int,
    doc: dict[str, object],
    fmt: RecordFormat,
    features: Mapping[str, Callable[[object], object] | None],
    renames: Mapping[str, str],
    reserved: set[str],
    group: FeatureGroup,
    keys: Sequence[bytes | None] | None,
    timestamps: Sequence[float | None] | None,
    now: float,
) -> _Row | tuple[BadReason, str]:
    entity = group.entity
    if fmt.id_from_key:
        try:
            entity_id: object = key_id(keys[i] if keys else None, fmt.key_format, entity.id_type)
        except RequestError as e:
            return BadReason.INVALID_ID, str(e)
    else:
        entity_id = doc.get(fmt.id_field)
        if entity_id is None:
            return BadReason.NULL_ID, f"no {fmt.id_field!r}"
        entity_id = json_int(entity_id)
    if fmt.event_time_from_kafka:
        event_time: object = timestamps[i] if timestamps else None
        if event_time is None:
            return BadReason.NULL_EVENT_TIME, "no Kafka timestamp"
    else:
        event_time = doc.get(fmt.event_time_field)
        if event_time is None:
            return BadReason.NULL_EVENT_TIME, f"no {fmt.event_time_field!r}"
    values: dict[str, object] = {}
    unknown = []
    for name, value in doc.items():
        if renames:
            name = renames.get(name, name)
        if name in features:
            convert = features[name]
            values[name] = value if convert is None else convert(value)
        elif name not in reserved:
            unknown.append(name)
    if unknown and not fmt.ignore_extra_fields:
        names = ", ".join(repr(k) for k in unknown)
        return BadReason.UNKNOWN_FIELD, f"group {group.name!r} has no {names}"
    try:
        seconds = event_time_seconds(event_time, now)
    except RequestError as e:
        return BadReason.INVALID_EVENT_TIME, str(e)
    try:
        key = entity_key(entity.prefix, entity.id_type, entity_id)
    except RequestError as e:
        return BadReason.INVALID_ID, str(e)
    return _Row(i, key, cast(EntityId, entity_id), values, seconds)


def _newest(rows: Sequence[_Row]) -> list[_Row]:
    """The newest row of each entity by event time, the later one at equal times; in the
    order the entities first appear."""
    best: dict[bytes, _Row] = {}
    for row in rows:
        held = best.get(row.key)
        if held is None or row.seconds >= held.seconds:
            best[row.key] = row
    return list(best.values())


def _plan(group: FeatureGroup, rows: Sequence[_Row], now: float) -> WritePlan:
    return plan_write(group, [(r.entity_id, r.values, r.seconds) for r in rows], now=now)


__all__ = [
    "DEFAULT_EVENT_TIME_FIELD",
    "Decoder",
    "Encoded",
    "Format",
    "KeyFormat",
    "RecordFormat",
    "confluent_unframe",
    "decode_events",
    "encode_records",
    "key_id",
    "proto_message_class",
]
