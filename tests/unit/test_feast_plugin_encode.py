"""The plugin's writes (``feast.answers.encode_rows``: Feast's rows as columns, the nightly
job's encoder) send exactly the commands of the store client's reference path
(``batch.plan_write``) for the same rows, whatever the values; a row that does not encode
is named, the others kept."""

from __future__ import annotations

from datetime import UTC, datetime

from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import FloatList, Int64List, Value
from feast.value_type import ValueType
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.batch import plan_write
from feature_store.feast.answers import _python, encode_rows
from feature_store.registry import parse_registry

REGISTRY = parse_registry(
    """
version: 1
entities:
  consumer: {prefix: c, id_type: int, ttl: 7d, join_key: consumer_id}
feature_groups:
  profile:
    entity: consumer
    features:
      rating: float
      spend: double
      orders: int
      age: int
      vip: bool
      city: string
      embedding: embedding(4)
      stores: int_list
""",
    "test",
)
GROUP = REGISTRY.groups["profile"]
TYPES = {
    "rating": ValueType.FLOAT,
    "spend": ValueType.DOUBLE,
    "orders": ValueType.INT64,
    "age": ValueType.INT32,
    "vip": ValueType.BOOL,
    "city": ValueType.STRING,
    "embedding": ValueType.FLOAT_LIST,
    "stores": ValueType.INT64_LIST,
}
float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
VALUES = {
    "rating": float32s.map(lambda v: Value(float_val=v)),
    "spend": st.floats(allow_nan=False).map(lambda v: Value(double_val=v)),
    "orders": st.integers(-(2**63), 2**63 - 1).map(lambda v: Value(int64_val=v)),
    "age": st.integers(-(2**31), 2**31 - 1).map(lambda v: Value(int32_val=v)),
    "vip": st.booleans().map(lambda v: Value(bool_val=v)),
    "city": st.text(max_size=20).map(lambda v: Value(string_val=v)),
    "embedding": st.lists(float32s, min_size=4, max_size=4).map(
        lambda v: Value(float_list_val=FloatList(val=v))
    ),
    "stores": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6).map(
        lambda v: Value(int64_list_val=Int64List(val=v))
    ),
}
row_values = st.fixed_dictionaries(
    {name: st.one_of(st.just(Value()), strategy) for name, strategy in VALUES.items()}
)


def key(i: int) -> EntityKey:
    return EntityKey(join_keys=["consumer_id"], entity_values=[Value(int64_val=i)])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), row_values, st.integers(0, 1_700_000_000)),
        min_size=1,
        max_size=12,
    )
)
def test_the_commands_are_the_reference_paths(
    rows: list[tuple[int, dict[str, Value], int]],
) -> None:
    """(The removed fields' order aside: the reference removes in the row's order, the
    plugin in the group's; the rows here list the group's order.)"""
    data = [(key(i), values, datetime.fromtimestamp(t, UTC), None) for i, values, t in rows]
    encoded = encode_rows(GROUP, TYPES, data)
    assert encoded.bad == []
    reference = plan_write(
        GROUP,
        [
            (i, {name: _python(values[name]) for name in TYPES}, datetime.fromtimestamp(t, UTC))
            for i, values, t in rows
        ],
    )
    assert encoded.commands(GROUP.entity.ttl_seconds) == reference.commands


def test_a_row_that_does_not_encode_is_named_and_the_others_kept() -> None:
    good = {"embedding": Value(float_list_val=FloatList(val=[1, 2, 3, 4]))}
    bad = {"embedding": Value(float_list_val=FloatList(val=[1, 2]))}
    at = datetime(2026, 1, 1, tzinfo=UTC)
    encoded = encode_rows(GROUP, TYPES, [(key(1), good, at, None), (key(2), bad, at, None)])
    assert len(encoded) == 1
    assert [b.index for b in encoded.bad] == [1]
    assert "embedding" in encoded.bad[0].detail
