"""The serving log's native row reader (native/src/logrows.rs) against its reference
(feature_log/rows.py's ``Part``): the same table from the same answers, REST's JSON and gRPC's
protobuf, over every feature type, nulls, non-finite floats, escapes and both id types;
and an answer it does not read leaves its columns as they were."""

from __future__ import annotations

import math
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.native import GRPC, REST, native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1 import values_pb2
from feature_store.registry import parse_registry
from feature_store.serving.feature_log import AnswerRows, Served

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

REGISTRY = parse_registry("""
version: 1
entities:
  user: {prefix: u, id_type: int, ttl: 7d}
  shop: {prefix: s, id_type: string, ttl: 7d}
feature_groups:
  user_a:
    entity: user
    features: {f: float, d: double, i: int, b: bool, s: string, fl: float_list, il: int_list}
  user_b:
    entity: user
    features: {e: {type: embedding, dim: 3}}
  shop_a:
    entity: shop
    features: {rating: float, name: string}
""")
STATUS = ["present", "missing", "stale", "error"]
GRPC_STATUS = {"present": pb.PRESENT, "missing": pb.MISSING, "stale": pb.STALE, "error": pb.ERROR}
f32 = st.floats(width=32, allow_nan=False, allow_infinity=True)
KINDS = {
    "f": st.floats(allow_nan=True, allow_infinity=True),
    "d": st.floats(allow_nan=True, allow_infinity=True),
    "i": st.integers(-(2**63), 2**63 - 1),
    "b": st.booleans(),
    "s": st.text(max_size=8),
    "fl": st.lists(f32, max_size=4),
    "il": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    "e": st.lists(f32, min_size=3, max_size=3),
    "rating": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "name": st.text(max_size=8),
}


def json_value(v: object) -> object:
    """A value as the REST answer writes it: non-finite floats as text."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, list):
        return [json_value(x) for x in v]
    return v


def proto_value(name: str, v: object) -> pb.Value:
    if v is None:
        return pb.Value()
    if name in ("fl", "e"):
        return pb.Value(float_list=values_pb2.FloatList(values=v))  # type: ignore[arg-type]
    if name == "il":
        return pb.Value(int_list=values_pb2.IntList(values=v))  # type: ignore[arg-type]
    if isinstance(v, bool):
        return pb.Value(bool_value=v)
    if isinstance(v, int):
        return pb.Value(int_value=v)
    if isinstance(v, float):
        return pb.Value(float_value=v)
    return pb.Value(string_value=str(v))


@st.composite
def answers(
    draw: st.DrawFn,
) -> tuple[str, list[str], list[tuple[object, list[object], list[str], dict[str, int | None]]]]:
    entity = draw(st.sampled_from(["user", "shop"]))
    features = REGISTRY.features_of(entity)
    names = draw(st.lists(st.sampled_from(sorted(features)), min_size=1, max_size=6, unique=True))
    ids = st.integers(-(2**40), 2**40) if entity == "user" else st.text(min_size=1, max_size=6)
    groups = sorted({features[n].group for n in names})
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        values = [draw(st.none() | KINDS[n]) for n in names]
        statuses = [draw(st.sampled_from(STATUS)) for _ in names]
        ages = {g: draw(st.none() | st.integers(0, 10**6)) for g in groups}
        rows.append((draw(ids), values, statuses, ages))
    return entity, names, rows


def rest_answer(entity: str, names: list[str], rows: list) -> bytes:  # type: ignore[type-arg]
    return orjson.dumps(
        {
            "entity_type": entity,
            "features": names,
            "types": ["x"] * len(names),
            "results": [
                {"id": i, "values": [json_value(v) for v in vs], "statuses": ss, "ages": ages}
                for i, vs, ss, ages in rows
            ],
        }
    )


def grpc_answer(entity: str, names: list[str], rows: list) -> bytes:  # type: ignore[type-arg]
    message = pb.GetFeaturesResponse(entity_type=entity, features=names)
    for i, vs, ss, ages in rows:
        row = message.rows.add()
        if isinstance(i, int):
            row.id.int_id = i
        else:
            row.id.string_id = i
        row.values.extend(proto_value(n, v) for n, v in zip(names, vs, strict=True))
        row.statuses.extend(GRPC_STATUS[s] for s in ss)
        for g, a in ages.items():
            if a is not None:
                row.ages[g] = a
    return message.SerializeToString()


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def tables(api: int, answer: bytes, entity: str) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    out = []
    for native in (True, False):
        rows = AnswerRows(REGISTRY, native=native)
        parts: dict = {}  # type: ignore[type-arg]
        served = Served(api, "req-1", 1_700_000_000_123, 1_700_000_000, 1, answer)
        rows.add(served, parts)
        kinds = {type(p).__name__ for p in parts.values()}
        assert kinds == ({"NativePart"} if native else {"Part"}), kinds
        from feature_store.serving.feature_log import arrow_schema

        schema = arrow_schema(REGISTRY, REGISTRY.entities[entity])
        out.append([r for p in parts.values() for r in p.table(schema).to_pylist()])
    return out[0], out[1]


@settings(max_examples=300, deadline=None)
@given(answers(), st.sampled_from([REST, GRPC]))
def test_the_native_reader_makes_the_references_table(case: tuple, api: int) -> None:  # type: ignore[type-arg]
    entity, names, rows = case
    answer = (rest_answer if api == REST else grpc_answer)(entity, names, rows)
    native, reference = tables(api, answer, entity)
    assert len(native) == len(reference) == len(rows)
    for a, b in zip(native, reference, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert same(a[k], b[k]), (k, a[k], b[k])


def test_an_answer_it_does_not_read_changes_nothing() -> None:
    from feature_store import _native

    cols = _native.LogColumns([0, 1], ["user_a"], True)
    good = rest_answer("user", ["f", "i"], [(1, [1.5, 2], ["present", "present"], {"user_a": 3})])
    assert cols.add_rest(good, "a", 1, 10, REST, b"\x00") == 1
    bad = rest_answer(
        "user",
        ["f", "i"],
        [
            (2, [1.5, 2], ["present", "present"], {"user_a": 3}),
            (3, [1.5, "x"], ["present", "present"], {"user_a": 3}),
        ],
    )
    with pytest.raises(ValueError, match="does not read"):
        cols.add_rest(bad, "b", 1, 10, REST, b"\x00")
    assert cols.rows == 1
    assert cols.add_rest(good, "c", 1, 10, REST, b"\x00") == 1
    request_ids, _, _, _, ids, features, stamps = cols.finish()
    assert request_ids[3] == b"ac"  # the refused answer's rows are gone from every column
    assert struct.unpack("<2q", ids[3]) == (1, 1)
    assert len(features[0][1]) == 2
    assert struct.unpack("<2q", stamps[0][3]) == (7, 7)
