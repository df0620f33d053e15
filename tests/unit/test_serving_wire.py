"""The hand-assembled GetFeaturesResponse bytes parse as the .proto says."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from feature_store import sample
from feature_store.native import GroupFormat
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serialization import FeatureType, codec_for
from feature_store.serialization.answers import proto_value
from feature_store.serving.api import wire
from feature_store.serving.l1.cache import Entry


def test_a_response_built_from_pieces_parses_with_the_generated_classes() -> None:
    group = sample.registry().groups[sample.GROUP]
    fmt = GroupFormat([f.codec for f in group.features])
    values = sample.features(12)
    raw, present, json = fmt.load([f.codec.encode(values[f.name]) for f in group.features])
    entry = Entry(("g", b"k:12"), fmt, raw, present, json, 1)
    absent = Entry(("g", b"k:a"), fmt, None, fmt.absent_present, fmt.absent_json, None)
    names = [f.name for f in group.features]
    row = wire.row(
        wire.entity_id(12)
        + wire.entry_values(entry, None)
        + wire.statuses(entry.present, True)
        + wire.ages({sample.GROUP: 42, "other": None})
    )
    missing = wire.row(
        wire.entity_id("a-string-id")
        + wire.entry_values(absent, None)
        + wire.statuses(absent.present, False)
        + wire.ages({sample.GROUP: None})
    )
    response = pb.GetFeaturesResponse.FromString(wire.header(sample.ENTITY, names) + row + missing)
    assert response.entity_type == sample.ENTITY
    assert list(response.features) == names
    first, second = response.rows
    assert first.id.int_id == 12
    assert dict(first.ages) == {sample.GROUP: 42}
    assert list(first.statuses) == [pb.STALE] * 50
    for f, v in zip(group.features, first.values, strict=True):
        want = values[f.name]
        kind = v.WhichOneof("kind")
        if f.type.value == "float":
            assert kind == "float_value"
            assert v.float_value == float(f.codec.encode(want))
        elif f.type.value == "int":
            assert v.int_value == want
        elif f.type.value == "int_list":
            assert list(v.int_list.values) == want
        else:
            got = list(v.float_list.values)
            assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(got, want, strict=True))  # type: ignore[arg-type]
    assert second.id.string_id == "a-string-id"
    assert all(v.WhichOneof("kind") is None for v in second.values)
    assert list(second.statuses) == [pb.MISSING] * 50
    assert dict(second.ages) == {}


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int64_entity_ids_match_protobuf(n: int) -> None:
    assert pb.EntityId.FromString(wire.entity_id(n)[2:]).int_id == n


@given(st.text(max_size=40), st.booleans(), st.floats(allow_nan=False))
def test_scalar_values_match_protobuf(s: str, b: bool, x: float) -> None:
    for feature_type, value, message in (
        ("string", s, pb.Value(string_value=s)),
        ("bool", b, pb.Value(bool_value=b)),
        ("double", x, pb.Value(float_value=x)),
    ):
        codec = codec_for(FeatureType(feature_type))
        record = proto_value(codec, codec.encode(value))
        assert pb.FeatureRow.FromString(record).values[0] == message
