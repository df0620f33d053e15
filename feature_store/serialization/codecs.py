"""Value codecs, one per feature type.

Formats (the storage contract; see README "On-Redis format"):

    float       float32; shortest decimal that round-trips through float32; b"0" for 0.0
    double      float64; shortest round-trip decimal (Python's repr); b"0" for 0.0
    int         int64 as decimal text (listpack then stores it as a compact integer)
    bool        b"1" / b"0"
    string      UTF-8
    embedding   protobuf FloatList, packed float32, exactly ``dim`` values
    float_list  protobuf FloatList, any length
    int_list    protobuf IntList (packed varints), Snappy-compressed

Most float features are zero, which is why zero is one byte rather than a 4-byte binary
float: in a listpack "0" is stored as a 1-byte integer entry.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum
from typing import SupportsFloat, SupportsIndex, TypeAlias

import snappy
from google.protobuf.message import DecodeError

from feature_store.errors import EncodingError
from feature_store.proto.v1.values_pb2 import FloatList, IntList

Value: TypeAlias = float | int | bool | str | list[float] | list[int]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_F32 = struct.Struct("<f")
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
_NORMAL_PRECISIONS = ("%.6g", "%.7g", "%.8g", "%.9g")  # 9 digits always round-trip
_ALL_PRECISIONS = tuple(f"%.{p}g" for p in range(1, 10))


class FeatureType(StrEnum):
    FLOAT = "float"
    DOUBLE = "double"
    INT = "int"
    BOOL = "bool"
    STRING = "string"
    EMBEDDING = "embedding"
    FLOAT_LIST = "float_list"
    INT_LIST = "int_list"


@dataclass(frozen=True, slots=True)
class Codec:
    """How one feature type turns into bytes and back. ``dim`` is set for embeddings."""

    type: FeatureType
    dim: int | None
    encode: Callable[[object], bytes] = field(repr=False, compare=False)
    decode: Callable[[bytes], Value] = field(repr=False, compare=False)
    # The same decoding for hot loops: may raise ValueError instead of EncodingError, and
    # for float and int is the builtin itself, which saves a Python call per value.
    # Callers that catch ValueError redo the value with ``decode`` for the message.
    fast_decode: Callable[[bytes], Value] = field(repr=False, compare=False)

    @property
    def signature(self) -> str:
        """The type as written in the registry, e.g. ``embedding(32)``."""
        return f"{self.type.value}({self.dim})" if self.dim is not None else self.type.value


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an int64 (negatives in ten bytes, two's complement).

    For code that assembles protobuf wire bytes itself, where building messages per value
    would cost more than the work around it: the Spark job's column encoder and the gRPC
    responses served from the cache. Tests compare both with the generated classes."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _special_float(x: float) -> bytes | None:
    """The encodings shared by float and double: zero, signed zero, NaN and infinities."""
    if x == 0.0:
        return b"-0" if math.copysign(1.0, x) < 0 else b"0"
    if x != x:
        return b"nan"
    if x == math.inf:
        return b"inf"
    if x == -math.inf:
        return b"-inf"
    return None


def _as_float(value: object) -> float:
    if type(value) is float:  # the common case, before the slow Protocol checks below
        return value
    if type(value) is int:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, SupportsFloat | SupportsIndex):
        raise EncodingError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def to_float32(x: float) -> float:
    """Round a float to the nearest float32 (returned widened to a Python float)."""
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:  # rounds past the largest float32
        raise EncodingError(f"{x!r} is outside the float32 range") from None


def encode_float32(value: object) -> bytes:
    x = _as_float(value)
    special = _special_float(x)
    if special is not None:
        return special
    f = to_float32(x)
    if f == 0.0:  # underflowed to zero in float32
        return b"-0" if math.copysign(1.0, f) < 0 else b"0"
    # The first precision whose rounding survives a float32 round trip is the shortest:
    # a normal float32's round-trip interval is narrower than the 6-digit grid, so any
    # string of 6 digits or fewer that round-trips is exactly what %.6g prints. Subnormals
    # have fewer bits and need the search from one digit.
    for fmt in _NORMAL_PRECISIONS if abs(f) >= _FLOAT32_MIN_NORMAL else _ALL_PRECISIONS:
        s = fmt % f
        if _F32.unpack(_F32.pack(float(s)))[0] == f:
            break
    return _compact_exponent(s).encode("ascii")


def _compact_exponent(s: str) -> str:
    """Drop what %g adds around an exponent: "1e-05" -> "1e-5", "1.2345679e+08" -> "123456790"."""
    if "e" not in s:
        return s
    mantissa, exponent = s.split("e")
    exp = int(exponent)
    digits = mantissa.replace(".", "").replace("-", "")
    if 0 < exp < 16 and exp >= len(digits) - 1:  # an integer: plain digits are shorter
        return f"{float(s):.0f}"
    return f"{mantissa}e{exp}"


def encode_double(value: object) -> bytes:
    x = _as_float(value)
    special = _special_float(x)
    return special if special is not None else repr(x).encode("ascii")


def decode_float(data: bytes) -> float:
    try:
        return float(data)
    except ValueError:
        raise EncodingError(f"stored float value {data[:40]!r} is not a number") from None


def _as_int64(value: object) -> int:
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:  # fast path
        return value
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise EncodingError(f"expected an integer, got {type(value).__name__} {value!r}")
    i = value.__index__()
    if not INT64_MIN <= i <= INT64_MAX:
        raise EncodingError(f"{i} is outside the int64 range")
    return i


def encode_int(value: object) -> bytes:
    return str(_as_int64(value)).encode("ascii")


def decode_int(data: bytes) -> int:
    try:
        value = int(data)
    except ValueError:
        raise EncodingError(f"stored int value {data[:40]!r} is not an integer") from None
    if not INT64_MIN <= value <= INT64_MAX:
        raise EncodingError(f"stored int value {data[:40]!r} is outside the int64 range")
    return value


def encode_bool(value: object) -> bytes:
    if not isinstance(value, bool):
        raise EncodingError(f"expected a bool, got {type(value).__name__} {value!r}")
    return b"1" if value else b"0"


def decode_bool(data: bytes) -> bool:
    if data == b"1":
        return True
    if data == b"0":
        return False
    raise EncodingError(f"stored bool value {data[:40]!r} is not 0 or 1")


def encode_string(value: object) -> bytes:
    if not isinstance(value, str):
        raise EncodingError(f"expected a string, got {type(value).__name__} {value!r}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise EncodingError(f"string is not valid Unicode: {e.reason}") from None


def decode_string(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EncodingError(f"stored string {data[:40]!r} is not UTF-8") from None


def _as_sequence(value: object, what: str) -> Sequence[object]:
    # a dict or set has a length too, but no order: not a list
    if isinstance(value, str | bytes | Mapping | AbstractSet) or not hasattr(value, "__len__"):
        raise EncodingError(f"expected a list of {what}, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def _float_values(value: object) -> list[float]:
    items = _as_sequence(value, "numbers")
    out = [_as_float(v) for v in items]
    for x in out:
        if abs(x) > _FLOAT32_MAX and not math.isinf(x):
            to_float32(x)  # raises unless it rounds to the largest float32
    return out


def encode_float_list(value: object) -> bytes:
    data: bytes = FloatList(values=_float_values(value)).SerializeToString()
    return data


def decode_float_list(data: bytes) -> list[float]:
    try:
        return list(FloatList.FromString(data).values)
    except DecodeError:
        raise EncodingError(f"stored float list {data[:40]!r} is not a FloatList") from None


def _embedding_codec(dim: int) -> Codec:
    def encode(value: object) -> bytes:
        values = _float_values(value)
        if len(values) != dim:
            raise EncodingError(f"embedding has dimension {len(values)}, expected {dim}")
        data: bytes = FloatList(values=values).SerializeToString()
        return data

    def decode(data: bytes) -> list[float]:
        values = decode_float_list(data)
        if len(values) != dim:
            raise EncodingError(f"stored embedding has dimension {len(values)}, expected {dim}")
        return values

    return Codec(FeatureType.EMBEDDING, dim, encode, decode, decode)


def encode_int_list(value: object) -> bytes:
    items = _as_sequence(value, "integers")
    ints = [_as_int64(v) for v in items]
    return bytes(snappy.compress(IntList(values=ints).SerializeToString()))


def decode_int_list(data: bytes) -> list[int]:
    try:
        return list(IntList.FromString(snappy.decompress(data)).values)
    except (DecodeError, snappy.UncompressError, ValueError):
        raise EncodingError(f"stored int list {data[:40]!r} is not a Snappy IntList") from None


_SIMPLE: dict[FeatureType, Codec] = {
    FeatureType.FLOAT: Codec(FeatureType.FLOAT, None, encode_float32, decode_float, float),
    FeatureType.DOUBLE: Codec(FeatureType.DOUBLE, None, encode_double, decode_float, float),
    FeatureType.INT: Codec(FeatureType.INT, None, encode_int, decode_int, int),
    FeatureType.BOOL: Codec(FeatureType.BOOL, None, encode_bool, decode_bool, decode_bool),
    FeatureType.STRING: Codec(
        FeatureType.STRING, None, encode_string, decode_string, decode_string
    ),
    FeatureType.FLOAT_LIST: Codec(
        FeatureType.FLOAT_LIST, None, encode_float_list, decode_float_list, decode_float_list
    ),
    FeatureType.INT_LIST: Codec(
        FeatureType.INT_LIST, None, encode_int_list, decode_int_list, decode_int_list
    ),
}


def codec_for(type_: FeatureType, dim: int | None = None) -> Codec:
    """The codec of a feature type. Embeddings need their dimension, the others take none."""
    if type_ is FeatureType.EMBEDDING:
        if dim is None or dim < 1:
            raise EncodingError(f"an embedding needs a dimension of at least 1, got {dim}")
        return _embedding_codec(dim)
    if dim is not None:
        raise EncodingError(f"type {type_.value} takes no dimension")
    return _SIMPLE[type_]
