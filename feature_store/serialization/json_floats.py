"""NaN and infinities in JSON, as protobuf's JSON mapping writes them.

JSON has no number for NaN, Infinity or -Infinity; orjson writes them as ``null``, which a
reader takes for "no value". The REST API writes them as the strings "NaN", "Infinity" and
"-Infinity" wherever a float goes (a float or double feature, an element of an embedding
or float list), and reads them back the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from feature_store.serialization.codecs import FeatureType

FLOAT_TYPE_NAMES = frozenset({"float", "double", "embedding", "float_list"})
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def float_text(v: float) -> str | float:
    """A non-finite float as its JSON string; a finite one unchanged."""
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def to_json(value: object) -> object:
    """A value with non-finite floats (also in a list) as strings; others unchanged.

    Most values are finite, and one subtraction per float (``v - v`` is 0.0 only for a
    finite v) or one ``sum`` per float list tells so without building anything.
    """
    if type(value) is float:
        return value if value - value == 0.0 else float_text(value)
    if type(value) is list and value and type(value[0]) is float:
        total = sum(value)
        if total - total == 0.0:
            return value
        return [float_text(x) for x in value]
    return value


def from_json(value: object) -> object:
    """The inverse of ``to_json``, for a value of a float type."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, list) and any(isinstance(x, str) for x in value):
        return [NON_FINITE.get(x, x) if isinstance(x, str) else x for x in value]
    return value


def json_int(value: object) -> object:
    """A JSON number with no fraction (``5.0``) is an integer, as JSON Schema has it; only
    within 2**53, where a float holds every integer exactly (a larger one was rounded)."""
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def _int_list(value: object) -> object:
    return [json_int(v) for v in value] if isinstance(value, list) else value


def json_converter(type_: FeatureType) -> Callable[[object], object] | None:
    """``from_json_value`` for one type, looked up once: None where it changes nothing."""
    if type_.value in FLOAT_TYPE_NAMES:
        return from_json
    if type_ is FeatureType.INT:
        return json_int
    if type_ is FeatureType.INT_LIST:
        return _int_list
    return None


def from_json_value(type_: FeatureType, value: object) -> object:
    """A written JSON value as its type reads it: "NaN", "Infinity", "-Infinity" as floats
    where floats go; whole numbers written with a fraction (``5.0``) as ints where ints go."""
    if type_.value in FLOAT_TYPE_NAMES:
        return from_json(value)
    if type_ is FeatureType.INT:
        return json_int(value)
    if type_ is FeatureType.INT_LIST and isinstance(value, list):
        return [json_int(v) for v in value]
    return value
