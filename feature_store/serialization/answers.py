"""Stored values to answer bytes: the reference implementation of the native data plane.

The serving path keeps each cached entity group as its stored bytes, packed into one
``bytes`` (``pack``), and writes answers from them: a JSON array of the values (REST) and
the ``FeatureRow.values`` records of serving.proto (gRPC). This module is the definition
of those bytes, in Python. ``feature_store._native`` (Rust, native/src/) does the
same without a Python object per value; tests/unit/test_native.py asserts byte-identical
output, and ``FEATURE_STORE_NATIVE=off`` serves with this module alone.

JSON of a value, the same on every path:

    float, double          the float64 Python reads from the stored text, as orjson writes
                           it (shortest round trip: 0.1, 1e-7, 1e+16, 100.0)
    embedding, float_list  each float32 as its shortest float32 decimal (0.1, not the
                           0.10000000149011612 of the widened double), same layout
    NaN, +-Infinity        the strings "NaN", "Infinity", "-Infinity" (json_floats)
    int, bool, string      as orjson writes them; int_list: a list of ints
    no value               null
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import cast

import orjson

from feature_store.proto.v1.values_pb2 import FloatList, IntList
from feature_store.serialization.codecs import Codec, FeatureType, encode_float32, varint
from feature_store.serialization.json_floats import float_text

# Type codes shared with native/src/codecs.rs
TYPE_CODES: dict[FeatureType, int] = {
    FeatureType.FLOAT: 0,
    FeatureType.DOUBLE: 1,
    FeatureType.INT: 2,
    FeatureType.BOOL: 3,
    FeatureType.STRING: 4,
    FeatureType.EMBEDDING: 5,
    FeatureType.FLOAT_LIST: 6,
    FeatureType.INT_LIST: 7,
}

NULL_VALUE = b'"NULL_VALUE"'  # Feast's status of a value an entity does not have
MISSING_VALUE = b"\x12\x00"  # FeatureRow.values: an empty Value (no kind set)
_DOUBLE_RECORD = struct.Struct("<BBBd")  # values record (tag 2, length 9), float_value, double
_HEADS = [bytes((n,)) for n in range(128)]  # the one-byte varints


def pack(values: Sequence[bytes | None]) -> bytes:
    """Stored values as one bytes: per value a varint of its length plus one (0 for none),
    then the value. One object instead of one per value: the cache's unit."""
    parts = []
    for v in values:
        if v is None:
            parts.append(_HEADS[0])
        else:
            n = len(v) + 1
            parts.append(_HEADS[n] if n < 128 else varint(n))
            parts.append(v)
    return b"".join(parts)


def unpack(raw: bytes) -> list[bytes | None]:
    out: list[bytes | None] = []
    pos, end = 0, len(raw)
    while pos < end:
        n = raw[pos]
        pos += 1
        if n >= 0x80:  # a longer varint
            n &= 0x7F
            shift = 7
            while True:
                byte = raw[pos]
                pos += 1
                n |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
        if n == 0:
            out.append(None)
        else:
            out.append(raw[pos : pos + n - 1])
            pos += n - 1
    return out


def _float_json(x: float) -> bytes:
    text = float_text(x)
    return orjson.dumps(text)


def _float32_json(x: float) -> bytes:
    """A float32 (widened to a Python float) as its shortest float32 decimal."""
    return _float_json(float(encode_float32(x)))


def json_value(codec: Codec, data: bytes) -> bytes:
    """One stored value as JSON. Raises EncodingError for a value its codec refuses."""
    value = codec.decode(data)
    t = codec.type
    if t in (FeatureType.FLOAT, FeatureType.DOUBLE):
        return _float_json(cast(float, value))
    if t in (FeatureType.EMBEDDING, FeatureType.FLOAT_LIST):
        return b"[" + b",".join(_float32_json(x) for x in cast(list[float], value)) + b"]"
    return orjson.dumps(value)


def _record(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + varint(len(payload)) + payload


def proto_value(codec: Codec, data: bytes | None) -> bytes:
    """One stored value as its ``FeatureRow.values`` record (field 2, a ``Value``)."""
    if data is None:
        return MISSING_VALUE
    value = codec.decode(data)
    t = codec.type
    if t in (FeatureType.FLOAT, FeatureType.DOUBLE):
        return _DOUBLE_RECORD.pack(0x12, 9, 0x09, value)  # float_value = 1, fixed64
    if t is FeatureType.INT:
        return _record(0x12, b"\x10" + varint(value))  # type: ignore[arg-type]
    if t is FeatureType.BOOL:
        return b"\x12\x02\x18\x01" if value else b"\x12\x02\x18\x00"  # bool_value = 3
    if t is FeatureType.STRING:
        return _record(0x12, _record(0x22, value.encode()))  # type: ignore[union-attr]
    if t is FeatureType.INT_LIST:  # int_list_value = 6
        ints = IntList(values=cast(list[int], value))
        return _record(0x12, _record(0x32, ints.SerializeToString()))
    # embedding, float_list: float_list_value = 5
    floats = FloatList(values=cast(list[float], value))
    return _record(0x12, _record(0x2A, floats.SerializeToString()))


class PureGroupCodec:
    """The reference of ``feature_store._native.GroupCodec``: the same methods, in Python."""

    def __init__(self, codecs: Sequence[Codec]) -> None:
        self.codecs = tuple(codecs)

    def load(
        self, reply: Sequence[bytes | None], proto: bool = False
    ) -> tuple[bytes, bytes, bytes]:
        """``(packed, present, answer)`` of the reply's first len(codecs) values: ``answer``
        is the values' JSON array, or with ``proto`` what ``proto`` makes of ``packed``."""
        values = reply[: len(self.codecs)]
        present = bytes(0 if v is None else 1 for v in values)
        raw = pack(values)
        if proto:
            return raw, present, self.proto(raw)
        return raw, present, b"[" + b",".join(self._json(values)) + b"]"

    def _json(self, values: Sequence[bytes | None]) -> list[bytes]:
        return [
            b"null" if v is None else json_value(c, v)
            for c, v in zip(self.codecs, values, strict=True)
        ]

    def json_parts(self, raw: bytes) -> list[bytes]:
        return self._json(self._unpack(raw))

    def feast_columns(
        self,
        raws: Sequence[bytes | None],
        statuses: Sequence[bytes],
        stamps: Sequence[bytes],
        picks: Sequence[int],
    ) -> list[bytes]:
        """Feast's answer columns of one group, one per feature index in ``picks``: the
        rows' values (``null`` where a raw is None or lacks the value), statuses (a row's
        own, ``"NULL_VALUE"`` where it lacks the value) and event times (``stamps``)."""
        if len(statuses) != len(raws) or len(stamps) != len(raws):
            raise ValueError("one status and one time per row")
        rows = [None if raw is None else self._unpack(raw) for raw in raws]
        parts = [None if values is None else self._json(values) for values in rows]
        times = b",".join(stamps)
        columns = []
        for fi in picks:
            values = b",".join(b"null" if p is None else p[fi] for p in parts)
            column_statuses = b",".join(
                NULL_VALUE if v is not None and v[fi] is None else s
                for v, s in zip(rows, statuses, strict=True)
            )
            columns.append(
                b'{"values":[%b],"statuses":[%b],"event_timestamps":[%b]}'
                % (values, column_statuses, times)
            )
        return columns

    def proto(self, raw: bytes) -> bytes:
        return b"".join(self.proto_parts(raw))

    def proto_parts(self, raw: bytes) -> list[bytes]:
        return [proto_value(c, v) for c, v in zip(self.codecs, self._unpack(raw), strict=True)]

    def _unpack(self, raw: bytes) -> list[bytes | None]:
        values = unpack(raw)
        if len(values) != len(self.codecs):
            raise ValueError("not a packed value list of this group")
        return values
