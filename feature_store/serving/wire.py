"""GetFeaturesResponse (serving.proto) written as protobuf wire bytes, straight from the cache.

Building a message object per value and serializing it cost more than the Redis round trip
(DESIGN.md, "Proto-to-dict conversion"). Protobuf's wire format is a concatenation of
(tag, length, bytes) records, so the response is assembled from pieces: each cached entry
keeps the encoded ``Value`` of each of its features, computed once on first use, and a
response is a join of those. tests/integration/test_serving_grpc.py parses the result with
the generated classes, which checks this encoder against the .proto.

Field numbers below mirror proto/feature_store/proto/v1/serving.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import cast

from feature_store.batch import EntityId
from feature_store.proto.v1.values_pb2 import FloatList, IntList
from feature_store.registry import Feature
from feature_store.serialization import FeatureType, Value, varint
from feature_store.serving.cache import Entry

_DOUBLE = struct.Struct("<d")
MISSING_VALUE = b"\x12\x00"  # FeatureRow.values: an empty Value (no kind set)
STATUS_CODES = {"present": 1, "missing": 2, "stale": 3}


def record(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte (field << 3 | 2), length, payload."""
    return bytes((tag,)) + varint(len(payload)) + payload


def _float(v: Value) -> bytes:
    return b"\x09" + _DOUBLE.pack(v)  # Value.float_value = 1, fixed64


def _int(v: Value) -> bytes:
    return b"\x10" + varint(v)  # type: ignore[arg-type]  # Value.int_value = 2


def _bool(v: Value) -> bytes:
    return b"\x18\x01" if v else b"\x18\x00"  # Value.bool_value = 3


def _string(v: Value) -> bytes:
    return record(0x22, v.encode())  # type: ignore[union-attr]  # Value.string_value = 4


def _float_list(v: Value) -> bytes:
    return record(0x2A, FloatList(values=cast(list[float], v)).SerializeToString())  # field 5


def _int_list(v: Value) -> bytes:
    return record(0x32, IntList(values=cast(list[int], v)).SerializeToString())  # field 6


_ENCODERS: dict[FeatureType, Callable[[Value], bytes]] = {
    FeatureType.FLOAT: _float,
    FeatureType.DOUBLE: _float,
    FeatureType.INT: _int,
    FeatureType.BOOL: _bool,
    FeatureType.STRING: _string,
    FeatureType.EMBEDDING: _float_list,
    FeatureType.FLOAT_LIST: _float_list,
    FeatureType.INT_LIST: _int_list,
}


_FLOAT_RECORD = struct.Struct("<BBBd")  # values record (tag 2, length 9), float_value tag, double


def _float_record(v: Value) -> bytes:
    return _FLOAT_RECORD.pack(0x12, 9, 0x09, v)


def _int_record(v: Value) -> bytes:
    if type(v) is int and 0 <= v < 0x80:
        return bytes((0x12, 2, 0x10, v))
    return record(0x12, _int(v))


def value_encoders(features: Sequence[Feature]) -> list[Callable[[Value], bytes]]:
    """Per feature: a value -> its whole ``FeatureRow.values`` record (tag 2)."""
    out: list[Callable[[Value], bytes]] = []
    for f in features:
        if f.type in (FeatureType.FLOAT, FeatureType.DOUBLE):
            out.append(_float_record)
        elif f.type is FeatureType.INT:
            out.append(_int_record)
        else:
            enc = _ENCODERS[f.type]
            out.append(lambda v, enc=enc: record(0x12, enc(v)))  # type: ignore[misc]
    return out


def entry_values(entry: Entry, encoders: Sequence[Callable[[Value], bytes]]) -> tuple[bytes, ...]:
    """Each feature's ``FeatureRow.values`` record (tag 2), cached on the entry."""
    wire = entry.wire
    if wire is None:
        if entry.values is None:
            wire = (MISSING_VALUE,) * len(encoders)
        else:
            wire = tuple(
                [
                    MISSING_VALUE if v is None else enc(v)
                    for enc, v in zip(encoders, entry.values, strict=True)
                ]
            )
        entry.wire = wire
    return wire


def entity_id(value: EntityId) -> bytes:
    """FeatureRow.id = 1, an EntityId: int_id = 1 (varint) or string_id = 2."""
    if isinstance(value, int):
        return record(0x0A, b"\x08" + varint(value))
    return record(0x0A, record(0x12, value.encode()))


def statuses(codes: Sequence[str]) -> bytes:
    """FeatureRow.statuses = 3, packed enum (every code fits one byte)."""
    return record(0x1A, bytes(STATUS_CODES[s] for s in codes))


def ages(values: dict[str, int | None]) -> bytes:
    """FeatureRow.ages = 4, map<string, int64>: one entry record per known age."""
    out = b""
    for group, age in values.items():
        if age is not None:
            out += record(0x22, record(0x0A, group.encode()) + b"\x10" + varint(age))
    return out


def header(entity_type: str, names: Sequence[str]) -> bytes:
    """GetFeaturesResponse.entity_type = 1 and features = 2."""
    return record(0x0A, entity_type.encode()) + b"".join(record(0x12, n.encode()) for n in names)


def row(payload: bytes) -> bytes:
    """GetFeaturesResponse.rows = 3."""
    return record(0x1A, payload)
