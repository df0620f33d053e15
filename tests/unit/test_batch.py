"""The store client's pure logic: read plans, reply decoding, write plans."""

from __future__ import annotations

import pytest

from feature_store.batch import MISSING, PRESENT, STALE, decode_read, plan_read, plan_write
from feature_store.errors import EncodingError, RequestError
from feature_store.layout import freshness_field
from feature_store.registry import Registry, parse_registry
from feature_store.serialization import field_name

REG = parse_registry(
    """
entities:
  user: {prefix: u, id_type: int, ttl: 1d}
  item: {prefix: i, id_type: string, ttl: 1h}
feature_groups:
  daily:
    entity: user
    max_age: 1h
    features: {a: float, b: int, e: embedding(2)}
  live:
    entity: user
    features: {c: string}
  items:
    entity: item
    features: {p: double}
"""
)


def test_plan_reads_requested_fields_then_one_freshness_field_per_group() -> None:
    plan = plan_read(REG, "user", [1, 2], ["b", "c"])
    assert plan.keys == (b"u:1", b"u:2")
    assert plan.fields == (
        field_name("b"),
        field_name("c"),
        freshness_field("daily"),
        freshness_field("live"),
    )


def test_a_small_part_of_the_hash_is_an_hmget() -> None:
    # user's hash: 4 features + 2 freshness fields; 1 feature + 1 freshness is a third
    plan = plan_read(REG, "user", [1, 2], ["b"])
    assert not plan.whole_hash
    assert plan.commands() == [
        ("HMGET", b"u:1", field_name("b"), freshness_field("daily")),
        ("HMGET", b"u:2", field_name("b"), freshness_field("daily")),
    ]
    assert plan.align([[b"1", b"5"]]) == [[b"1", b"5"]]


def test_most_of_the_hash_is_an_hgetall_aligned_to_the_fields() -> None:
    plan = plan_read(REG, "user", [1, 2], ["b", "c"])  # 4 of 6 fields
    assert plan.whole_hash
    assert plan.commands() == [("HGETALL", b"u:1"), ("HGETALL", b"u:2")]
    whole = {field_name("c"): b"x", freshness_field("live"): b"9", field_name("a"): b"0"}
    pairs = [field_name("b"), b"3", freshness_field("daily"), b"7"]
    assert plan.align([whole, pairs]) == [[None, b"x", None, b"9"], [b"3", None, b"7", None]]
    assert plan.align([{}]) == [[None, None, None, None]]


@pytest.mark.parametrize(
    ("entity", "ids", "message"),
    [
        ("user", [], "names no entity ids"),
        ("user", ["1"], "entity type 'user' has int ids: entity id '1' is not an int64"),
        ("user", [True], "is not an int64"),
        ("user", [2**63], "is not an int64"),
        ("item", [1], "entity type 'item' has string ids"),
        ("item", [""], "not a non-empty string"),
        ("item", ["x" * 513], "longer than 512 bytes"),
        ("nobody", [1], "unknown entity type 'nobody'"),
    ],
)
def test_bad_ids_are_request_errors(entity: str, ids: list[object], message: str) -> None:
    group = "items" if entity == "item" else "daily"
    with pytest.raises(RequestError, match=message):
        plan_read(REG, entity, ids, groups=[group])  # type: ignore[arg-type]


def test_batch_limit() -> None:
    with pytest.raises(RequestError, match="3 entity ids is more than the limit of 2"):
        plan_read(REG, "user", [1, 2, 3], ["a"], max_entities=2)


def encoded(reg: Registry, group: str, values: dict[str, object]) -> dict[bytes, bytes]:
    g = reg.group(group)
    return {g.feature(k).field: g.feature(k).codec.encode(v) for k, v in values.items()}


def test_decode_statuses_present_missing_stale() -> None:
    plan = plan_read(REG, "user", [1, 2, 3], ["a", "e", "c"])
    now = 1_000_000
    fresh = str(now - 10).encode()
    old = str(now - 7200).encode()  # older than daily's max_age of 1h
    enc = encoded(REG, "daily", {"a": 0.5, "e": [1.0, 2.0]})
    replies = [
        [enc[field_name("a")], enc[field_name("e")], b"hi", fresh, fresh],
        [enc[field_name("a")], None, b"yo", old, fresh],  # daily stale, live fresh
        [None, None, None, None, None],  # no such entity
    ]
    result = decode_read(plan, replies, now=now)
    r1, r2, r3 = result.rows
    assert r1.values == [0.5, [1.0, 2.0], "hi"]
    assert r1.statuses == [PRESENT, PRESENT, PRESENT]
    assert r1.ages == {"daily": 10, "live": 10}
    assert r2.values == [0.5, None, "yo"]
    assert r2.statuses == [STALE, MISSING, PRESENT]  # stale only where present and old
    assert r2.ages == {"daily": 7200, "live": 10}
    assert r3.statuses == [MISSING, MISSING, MISSING]
    assert r3.ages == {"daily": None, "live": None}
    assert not r3.found
    assert r1.found
    assert result.as_dicts()[1] == {"a": 0.5, "e": None, "c": "yo"}


def test_values_without_a_freshness_field_are_present_with_unknown_age() -> None:
    plan = plan_read(REG, "user", [1], ["a"])
    result = decode_read(plan, [[b"2.5", None]], now=100)
    assert result.rows[0].statuses == [PRESENT]
    assert result.rows[0].ages == {"daily": None}


def test_undecodable_value_names_key_and_feature() -> None:
    plan = plan_read(REG, "user", [7], ["a", "b"])
    with pytest.raises(EncodingError, match=r"u:7 feature 'b': stored int value b'x'"):
        decode_read(plan, [[b"1", b"x", None]])


def test_write_plan_orders_hdel_hset_expire() -> None:
    plan = plan_write(REG.group("daily"), [(1, {"a": 0.0, "b": None, "e": [1, 2]})], now=500)
    hdel, hset, expire = plan.commands
    assert hdel == ("HDEL", b"u:1", field_name("b"))
    assert hset == (
        "HSET",
        b"u:1",
        field_name("a"),
        b"0",
        field_name("e"),
        REG.group("daily").feature("e").codec.encode([1, 2]),
        freshness_field("daily"),
        b"500",
    )
    assert expire == ("EXPIRE", b"u:1", 86400)
    assert (plan.stats.entities, plan.stats.values_written, plan.stats.values_removed) == (1, 2, 1)


def test_write_plan_without_nulls_has_no_hdel() -> None:
    plan = plan_write(REG.group("live"), [(1, {"c": "x"}), (2, {})], now=1)
    assert [c[0] for c in plan.commands] == ["HSET", "EXPIRE", "HSET", "EXPIRE"]
    assert plan.stats.values_written == 1


def test_write_plan_errors_name_entity_and_feature() -> None:
    with pytest.raises(EncodingError, match="entity 3 feature 'e': embedding has dimension 3"):
        plan_write(REG.group("daily"), [(3, {"e": [1, 2, 3]})])
    with pytest.raises(RequestError, match="feature group 'daily' has no feature 'c'"):
        plan_write(REG.group("daily"), [(3, {"c": "x"})])
    with pytest.raises(RequestError, match="not an int64"):
        plan_write(REG.group("daily"), [("3", {"a": 1.0})])
