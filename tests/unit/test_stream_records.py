"""The stream job's records: each is plan_write's guarded write of the same row, or a bad
record with its reason (never an exception); of an entity's records, the newest is written;
keys, Kafka timestamps, renames and Protobuf messages read as their JSON equivalents."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.errors import RequestError
from feature_store.ingest.records import (
    Encoded,
    Format,
    KeyFormat,
    RecordFormat,
    encode_records,
    key_id,
)
from feature_store.ingest.spec import BadReason
from feature_store.layout import IdType

GROUP = sample.registry().group(sample.GROUP)
NOW = 1_800_000_000.0
JSON = RecordFormat(id_field="consumer_id")


def _encode(*records: bytes | None, fmt: RecordFormat = JSON, **kw: object) -> Encoded:
    return encode_records(GROUP, fmt, list(records), now=NOW, **kw)  # type: ignore[arg-type]


def test_a_record_is_plan_write_s_row() -> None:
    record = {"consumer_id": 7, "event_time": "2027-01-15T08:00:00.5Z", "int_0": 3.0}
    record |= {"float_00": "NaN", "int_list_0": [1.0, 2], "embedding_0": None}
    out = _encode(orjson.dumps(record))
    when = datetime(2027, 1, 15, 8, 0, 0, 500_000, tzinfo=UTC).timestamp()
    row = {"int_0": 3, "float_00": float("nan"), "int_list_0": [1, 2], "embedding_0": None}
    expected = plan_write(GROUP, [(7, row, when)], now=NOW)
    assert out.bad == []
    assert out.commands == expected.commands
    assert out.keys == expected.keys
    assert out.counts == [(3, 1)]  # 3 values written, embedding_0 removed


BAD = [
    (b"{", BadReason.MALFORMED_RECORD),
    (b"[1]", BadReason.MALFORMED_RECORD),
    (None, BadReason.MALFORMED_RECORD),
    (b'{"event_time": 1}', BadReason.NULL_ID),
    (b'{"consumer_id": 1}', BadReason.NULL_EVENT_TIME),
    (b'{"consumer_id": 1, "event_time": "later"}', BadReason.INVALID_EVENT_TIME),
    (b'{"consumer_id": 1, "event_time": 1e10}', BadReason.INVALID_EVENT_TIME),
    (b'{"consumer_id": "x", "event_time": 1}', BadReason.INVALID_ID),
    (b'{"consumer_id": 1, "event_time": 1, "int_0": "three"}', BadReason.INVALID_VALUE),
    (b'{"consumer_id": 1, "event_time": 1, "embedding_0": [1.0]}', BadReason.INVALID_VALUE),
    (b'{"consumer_id": 1, "event_time": 1, "colour": 1}', BadReason.UNKNOWN_FIELD),
]


def test_bad_records_are_named_with_their_reason_and_the_rest_written() -> None:
    good = orjson.dumps({"consumer_id": 1, "event_time": 1, "int_0": 1})
    other = orjson.dumps({"consumer_id": 2, "event_time": 1, "int_0": 1})
    out = _encode(good, *(r for r, _ in BAD), other)
    assert [(i, reason) for i, reason, _ in out.bad] == [
        (i + 1, reason) for i, (_, reason) in enumerate(BAD)
    ]
    assert len(out.commands) == 2


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_are_a_write_or_a_bad_record(raw: bytes) -> None:
    out = _encode(raw)
    assert len(out.commands) + len(out.bad) == 1


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 4), st.integers(0, 1000)),
        min_size=1,
        max_size=40,
    )
)
def test_of_an_entity_s_records_the_newest_is_written_the_later_at_equal_times(
    events: list[tuple[int, int, int]],
) -> None:
    """Whatever the order: one write per entity, of its newest record (the later one at
    equal event times), and every other record counted as superseded."""
    records = [orjson.dumps({"consumer_id": i, "event_time": t, "int_0": v}) for i, t, v in events]
    out = _encode(*records)
    newest: dict[int, tuple[int, int]] = {}
    for i, t, v in events:
        if i not in newest or t >= newest[i][0]:
            newest[i] = (t, v)
    rows = [(i, {"int_0": v}, float(t)) for i, (t, v) in newest.items()]
    assert out.commands == plan_write(GROUP, rows, now=NOW).commands
    assert out.superseded == len(events) - len(newest)


def test_an_entity_s_older_record_is_written_when_its_newest_is_bad() -> None:
    older = orjson.dumps({"consumer_id": 3, "event_time": 1, "int_0": 1})
    newer = orjson.dumps({"consumer_id": 3, "event_time": 2, "int_0": "many"})
    out = _encode(older, newer)
    assert [(i, reason) for i, reason, _ in out.bad] == [(1, BadReason.INVALID_VALUE)]
    assert out.commands == plan_write(GROUP, [(3, {"int_0": 1}, 1.0)], now=NOW).commands


def test_ids_from_keys_times_from_kafka_and_renamed_fields() -> None:
    fmt = RecordFormat(
        id_field="",
        event_time_field="",
        id_from_key=True,
        key_format=KeyFormat.INT64,
        event_time_from_kafka=True,
        renames=(("orders", "int_0"),),
    )
    records = [b'{"orders": 4}', b'{"orders": 5}', b'{"orders": 6}', b'{"int_0": 7}']
    keys = [(9).to_bytes(8, "big"), b"short", None, (-2).to_bytes(8, "big", signed=True)]
    out = _encode(*records, fmt=fmt, keys=keys, timestamps=[10.5, 11.0, 12.0, None])
    assert out.commands == plan_write(GROUP, [(9, {"int_0": 4}, 10.5)], now=NOW).commands
    assert [(i, reason) for i, reason, _ in out.bad] == [
        (1, BadReason.INVALID_ID),
        (2, BadReason.INVALID_ID),
        (3, BadReason.NULL_EVENT_TIME),
    ]


def test_key_ids_as_text_or_int64() -> None:
    assert key_id(b"42", KeyFormat.STRING, IdType.INT) == 42
    assert key_id(b"u-1", KeyFormat.STRING, IdType.STRING) == "u-1"
    assert key_id((2**63 - 1).to_bytes(8, "big"), KeyFormat.INT64, IdType.INT) == 2**63 - 1
    for bad in (b"x", b"\xff"):
        with pytest.raises(RequestError):
            key_id(bad, KeyFormat.STRING, IdType.INT)


def _proto_set() -> bytes:
    """A descriptor set of ``demo.Order`` (as protoc writes it), made with the runtime."""
    from google.protobuf import descriptor_pb2, timestamp_pb2

    f = descriptor_pb2.FieldDescriptorProto
    order = descriptor_pb2.DescriptorProto(name="Order")
    fields = [
        ("consumer_id", f.TYPE_INT64, f.LABEL_OPTIONAL, None, False),
        ("event_time", f.TYPE_MESSAGE, f.LABEL_OPTIONAL, ".google.protobuf.Timestamp", False),
        ("int_0", f.TYPE_INT64, f.LABEL_OPTIONAL, None, False),
        ("float_00", f.TYPE_FLOAT, f.LABEL_OPTIONAL, None, True),  # proto3 optional
        ("int_list_0", f.TYPE_INT64, f.LABEL_REPEATED, None, False),
    ]
    for n, (name, kind, label, type_name, optional) in enumerate(fields, 1):
        field = order.field.add(name=name, number=n, type=kind, label=label)
        if type_name:
            field.type_name = type_name
        if optional:
            field.proto3_optional = True
            field.oneof_index = len(order.oneof_decl)
            order.oneof_decl.add(name=f"_{name}")
    demo = descriptor_pb2.FileDescriptorProto(
        name="demo.proto",
        package="demo",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
        message_type=[order],
    )
    wkt = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(wkt)
    return descriptor_pb2.FileDescriptorSet(file=[wkt, demo]).SerializeToString()


def test_protobuf_messages_read_as_their_fields() -> None:
    from feature_store.ingest.records import proto_message_class

    descriptor = _proto_set()
    order = proto_message_class(descriptor, "demo.Order")
    fmt = RecordFormat(
        format=Format.PROTOBUF,
        id_field="consumer_id",
        proto_descriptor=descriptor,
        proto_message="demo.Order",
    )
    a = order(consumer_id=1, int_0=0, int_list_0=[3, 4])
    a.event_time.FromSeconds(1_700_000_000)
    b = order(consumer_id=2, int_0=5, float_00=0.5)
    b.event_time.FromNanoseconds(1_700_000_000_250_000_000)
    out = _encode(a.SerializeToString(), b"\xff\xff", b.SerializeToString(), fmt=fmt)
    rows = [
        # a proto3 scalar is always there (a 0 is written); an unset optional is not touched
        (1, {"int_0": 0, "int_list_0": [3, 4]}, 1_700_000_000.0),
        (2, {"int_0": 5, "float_00": 0.5, "int_list_0": []}, 1_700_000_000.25),
    ]
    assert out.commands == plan_write(GROUP, rows, now=NOW).commands
    assert [(i, reason) for i, reason, _ in out.bad] == [(1, BadReason.MALFORMED_RECORD)]
    with pytest.raises(RequestError, match=r"demo\.Order"):
        proto_message_class(descriptor, "demo.Nope")


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = b""
    while True:
        byte, z = z & 0x7F, z >> 7
        out += bytes([byte | (0x80 if z else 0)])
        if not z:
            return out


@given(
    st.binary(max_size=50),
    st.integers(0, 2**31 - 1),
    st.lists(st.integers(0, 300), max_size=3),
)
def test_a_confluent_frame_unframes_to_its_record(
    record: bytes, schema_id: int, indexes: list[int]
) -> None:
    from feature_store.ingest.records import confluent_unframe

    header = b"\x00" + schema_id.to_bytes(4, "big")
    assert confluent_unframe(header + record, protobuf=False) == record
    # Protobuf's message indexes: [0] as one 0 byte, others as a count and the indexes
    refs = (
        b"\x00" if indexes in ([], [0]) else _varint(len(indexes)) + b"".join(map(_varint, indexes))
    )
    assert confluent_unframe(header + refs + record, protobuf=True) == record
    assert isinstance(confluent_unframe(b"\x01" + header[1:] + record, protobuf=False), str)
    assert isinstance(confluent_unframe(header[:4], protobuf=True), str)


def test_protobuf_in_confluent_frames() -> None:
    from feature_store.ingest.records import proto_message_class

    descriptor = _proto_set()
    order = proto_message_class(descriptor, "demo.Order")
    fmt = RecordFormat(
        format=Format.PROTOBUF,
        id_field="consumer_id",
        proto_descriptor=descriptor,
        proto_message="demo.Order",
        confluent_framing=True,
    )
    m = order(consumer_id=4, int_0=9)
    m.event_time.FromSeconds(1_700_000_000)
    framed = b"\x00\x00\x00\x00\x07\x00" + m.SerializeToString()
    out = _encode(framed, m.SerializeToString(), fmt=fmt)
    row = (4, {"int_0": 9, "int_list_0": []}, 1_700_000_000.0)
    assert out.commands == plan_write(GROUP, [row], now=NOW).commands
    assert [(i, reason) for i, reason, _ in out.bad] == [(1, BadReason.MALFORMED_RECORD)]
