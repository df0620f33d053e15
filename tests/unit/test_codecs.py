"""Round trips of every value codec, with the awkward values called out by name."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feature_store.errors import EncodingError
from feature_store.serialization import FeatureType, codec_for
from feature_store.serialization.codecs import INT64_MAX, INT64_MIN, to_float32

FLOAT = codec_for(FeatureType.FLOAT)
DOUBLE = codec_for(FeatureType.DOUBLE)
INT = codec_for(FeatureType.INT)
BOOL = codec_for(FeatureType.BOOL)
STRING = codec_for(FeatureType.STRING)
INT_LIST = codec_for(FeatureType.INT_LIST)
FLOAT_LIST = codec_for(FeatureType.FLOAT_LIST)
EMB = codec_for(FeatureType.EMBEDDING, 8)

float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)


def same_float(a: float, b: float) -> bool:
    """Equal, with NaN equal to NaN and -0.0 distinct from 0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


@given(float32s)
def test_float_round_trips_through_float32(x: float) -> None:
    decoded = FLOAT.decode(FLOAT.encode(x))
    assert isinstance(decoded, float)
    assert same_float(to_float32(decoded), x)


def significant_digits(text: str) -> int:
    mantissa = text.split("e")[0].lstrip("-").replace(".", "")
    return len(mantissa.strip("0")) or 1


@given(float32s.filter(lambda x: math.isfinite(x) and x != 0))
def test_float_has_the_fewest_significant_digits(x: float) -> None:
    encoded = FLOAT.encode(x).decode()
    for p in range(1, significant_digits(encoded)):
        try:
            packed = struct.pack("<f", float(f"{x:.{p}g}"))
        except OverflowError:
            continue  # rounded past the largest float32: cannot round-trip
        assert struct.unpack("<f", packed)[0] != x, (encoded, p)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_double_round_trips_exactly(x: float) -> None:
    assert same_float(DOUBLE.decode(DOUBLE.encode(x)), x)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0.0, b"0"),
        (-0.0, b"-0"),
        (math.nan, b"nan"),
        (math.inf, b"inf"),
        (-math.inf, b"-inf"),
        (0.1, b"0.1"),
        (1e-5, b"1e-5"),
        (123456789.0, b"123456790"),
        (3, b"3"),
    ],
)
def test_float_encodings(value: float, encoded: bytes) -> None:
    assert FLOAT.encode(value) == encoded


def test_zero_is_one_byte_for_both_float_types() -> None:
    assert FLOAT.encode(0.0) == DOUBLE.encode(0.0) == b"0"


def test_float_out_of_float32_range_is_an_error() -> None:
    with pytest.raises(EncodingError, match="float32 range"):
        FLOAT.encode(1e39)


@pytest.mark.parametrize("bad", ["1.5", None, True, [1.0], b"1"])
def test_float_rejects_non_numbers(bad: object) -> None:
    with pytest.raises(EncodingError, match="expected a number"):
        FLOAT.encode(bad)


@given(int64s)
def test_int_round_trips(i: int) -> None:
    assert INT.decode(INT.encode(i)) == i


@pytest.mark.parametrize("i", [INT64_MIN, INT64_MAX, 0, -1])
def test_int64_limits(i: int) -> None:
    assert INT.decode(INT.encode(i)) == i


@pytest.mark.parametrize("i", [INT64_MAX + 1, INT64_MIN - 1])
def test_int_outside_int64_is_an_error(i: int) -> None:
    with pytest.raises(EncodingError, match="int64 range"):
        INT.encode(i)


@pytest.mark.parametrize("bad", [1.5, "1", True, None])
def test_int_rejects_non_integers(bad: object) -> None:
    with pytest.raises(EncodingError, match="expected an integer"):
        INT.encode(bad)


@given(st.booleans())
def test_bool_round_trips(b: bool) -> None:
    assert BOOL.decode(BOOL.encode(b)) is b


@given(st.text())
def test_string_round_trips(s: str) -> None:
    assert STRING.decode(STRING.encode(s)) == s


def test_non_ascii_string() -> None:
    s = "Zürich café 東京 🍣"
    assert STRING.decode(STRING.encode(s)) == s
    assert STRING.encode(s) == s.encode("utf-8")


def test_lone_surrogate_is_an_error() -> None:
    with pytest.raises(EncodingError, match="not valid Unicode"):
        STRING.encode("\ud800")


@given(st.lists(int64s, max_size=200))
def test_int_list_round_trips(values: list[int]) -> None:
    assert INT_LIST.decode(INT_LIST.encode(values)) == values


@given(int64s)
def test_varint_matches_protobuf(n: int) -> None:
    from feature_store.proto.v1.values_pb2 import IntList
    from feature_store.serialization import varint

    assert varint(n) == IntList(values=[n]).SerializeToString()[2:]  # after tag and length


def test_empty_lists_round_trip() -> None:
    assert INT_LIST.decode(INT_LIST.encode([])) == []
    assert FLOAT_LIST.decode(FLOAT_LIST.encode([])) == []


def test_int_list_is_snappy_compressed_protobuf() -> None:
    import snappy

    from feature_store.proto.v1.values_pb2 import IntList

    values = [1001, 1002, 1001, 1001] * 10
    encoded = INT_LIST.encode(values)
    assert list(IntList.FromString(snappy.decompress(encoded)).values) == values
    assert len(encoded) < len(IntList(values=values).SerializeToString())  # repeats compress


def test_int_list_rejects_bad_items() -> None:
    with pytest.raises(EncodingError):
        INT_LIST.encode([1, "2"])
    with pytest.raises(EncodingError, match="int64 range"):
        INT_LIST.encode([2**63])
    with pytest.raises(EncodingError, match="expected a list"):
        INT_LIST.encode("123")


@given(st.lists(float32s, min_size=8, max_size=8))
def test_embedding_round_trips(values: list[float]) -> None:
    decoded = EMB.decode(EMB.encode(values))
    assert len(decoded) == 8
    assert all(same_float(a, b) for a, b in zip(decoded, values, strict=True))


@given(st.lists(float32s, max_size=64))
def test_float_list_round_trips(values: list[float]) -> None:
    decoded = FLOAT_LIST.decode(FLOAT_LIST.encode(values))
    assert all(same_float(a, b) for a, b in zip(decoded, values, strict=True))


def test_embedding_is_packed_protobuf_floats() -> None:
    from feature_store.proto.v1.values_pb2 import FloatList

    encoded = EMB.encode([0.5] * 8)
    assert list(FloatList.FromString(encoded).values) == [0.5] * 8
    assert len(encoded) == 2 + 4 * 8  # tag, length, then 4 bytes a float


@pytest.mark.parametrize("dim", [0, 7, 9])
def test_embedding_of_wrong_dimension_is_a_clear_error(dim: int) -> None:
    with pytest.raises(EncodingError, match=f"dimension {dim}, expected 8"):
        EMB.encode([0.0] * dim)


def test_stored_embedding_of_wrong_dimension_is_a_clear_error() -> None:
    other = codec_for(FeatureType.EMBEDDING, 4).encode([1.0] * 4)
    with pytest.raises(EncodingError, match="dimension 4, expected 8"):
        EMB.decode(other)


@pytest.mark.parametrize(
    ("codec", "garbage"),
    [
        (FLOAT, b"abc"),
        (INT, b"1.5"),
        (BOOL, b"2"),
        (STRING, b"\xff\xfe"),
        (INT_LIST, b"\x00\x01\x02not snappy"),
        (EMB, b"\xff\xff"),
    ],
)
def test_undecodable_bytes_are_an_encoding_error(codec: object, garbage: bytes) -> None:
    with pytest.raises(EncodingError):
        codec.decode(garbage)  # type: ignore[attr-defined]


def test_embedding_needs_a_dimension() -> None:
    with pytest.raises(EncodingError, match="dimension"):
        codec_for(FeatureType.EMBEDDING)
    with pytest.raises(EncodingError, match="takes no dimension"):
        codec_for(FeatureType.FLOAT, 3)


def test_numpy_like_values_are_accepted() -> None:
    class Index:
        def __index__(self) -> int:
            return 7

    class Floaty:
        def __float__(self) -> float:
            return 2.5

    assert INT.encode(Index()) == b"7"
    assert FLOAT.encode(Floaty()) == b"2.5"
