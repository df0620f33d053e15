"""NaN and infinities over JSON: strings where floats go, and back (serialization.json_floats)."""

from __future__ import annotations

import math

import orjson
from hypothesis import given
from hypothesis import strategies as st

from feature_store.serialization.json_floats import from_json, to_json

floats = st.floats(allow_nan=True, allow_infinity=True)


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@given(st.one_of(floats, st.lists(floats, min_size=1, max_size=40)))
def test_round_trip_through_json_text(value: float | list[float]) -> None:
    text = orjson.dumps(to_json(value))
    assert b"null" not in text  # orjson's null for NaN would read as "no value"
    assert same(from_json(orjson.loads(text)), value)


def test_the_strings_are_protobufs() -> None:
    assert to_json(math.nan) == "NaN"
    assert to_json([1.5, math.inf, -math.inf]) == [1.5, "Infinity", "-Infinity"]


def test_finite_values_are_returned_as_they_are() -> None:
    values = [0.25, -3.0]
    assert to_json(values) is values
    assert to_json(7) == 7
    assert to_json("NaN") == "NaN"  # a string feature is not a float
