"""The store client's pure logic: read plans, reply decoding, write plans."""

from __future__ import annotations

from datetime import datetime

import pytest
from redis.exceptions import ResponseError

from feature_store.batch import (
    ERROR,
    MAX_FUTURE_SECONDS,
    MISSING,
    PRESENT,
    STALE,
    FaultReason,
    WriteStats,
    decode_read,
    plan_read,
    plan_write,
)
from feature_store.errors import EncodingError, EntityDataError, RequestError
from feature_store.layout import (
    SKIPPED,
    WRITE_SCRIPT_SHA,
    WRITTEN,
    WRITTEN_EQUAL,
    freshness_field,
    unguarded,
)
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


def test_an_undecodable_value_fails_its_entity_and_group_only() -> None:
    plan = plan_read(REG, "user", [7, 8], ["a", "b", "c"])
    # fields: a, b (daily), c (live), then the freshness of daily and of live
    result = decode_read(
        plan, [[b"1", b"x", b"hi", b"90", b"95"], [b"2", b"3", None, b"90", None]], now=100
    )
    bad, good = result.rows
    assert bad.values == [None, None, "hi"]
    assert bad.statuses == [ERROR, ERROR, PRESENT]
    assert bad.ages == {"daily": None, "live": 5}
    assert (good.values, good.statuses) == ([2.0, 3, None], [PRESENT, PRESENT, MISSING])
    assert len(result.errors) == 1
    error = result.errors[0]
    assert (error.entity_id, error.group, error.reason) == (
        7,
        "daily",
        FaultReason.UNDECODABLE_VALUE,
    )
    assert error.message.startswith("u:7 feature 'b': stored int value b'x'")
    assert bad.found  # its other group is present


def test_a_corrupt_write_time_fails_its_group_only() -> None:
    plan = plan_read(REG, "user", [7], ["a", "c"])
    result = decode_read(plan, [[b"1", b"hi", b"garbage", b"95"]], now=100)
    row = result.rows[0]
    assert (row.values, row.statuses) == ([None, "hi"], [ERROR, PRESENT])
    assert [(e.group, e.reason) for e in result.errors] == [
        ("daily", FaultReason.CORRUPT_WRITE_TIME)
    ]
    assert "u:7: the write time of group 'daily' is corrupt" in result.errors[0].message


def test_a_key_of_another_type_fails_every_group_of_its_entity() -> None:
    plan = plan_read(REG, "user", [7, 8], ["a", "c"])
    wrong = EntityDataError("u:7: Redis answered WRONGTYPE ...", "wrong_type")
    result = decode_read(plan, [wrong, [b"1", None, b"90", None]], now=100)
    assert result.rows[0].statuses == [ERROR, ERROR]
    assert result.rows[0].values == [None, None]
    assert not result.rows[0].found
    assert result.rows[1].statuses == [PRESENT, MISSING]
    assert [(e.entity_id, e.group, e.reason) for e in result.errors] == [
        (7, "daily", FaultReason.WRONG_TYPE),
        (7, "live", FaultReason.WRONG_TYPE),
    ]


def test_write_plan_is_one_guarded_call_per_entity() -> None:
    plan = plan_write(REG.group("daily"), [(1, {"a": 0.0, "b": None, "e": [1, 2]})], now=500)
    assert plan.commands == [
        (
            "EVALSHA",
            WRITE_SCRIPT_SHA,
            1,
            b"u:1",
            86400,  # the entity type's TTL
            1,  # one field to remove
            field_name("b"),
            field_name("a"),
            b"0",
            field_name("e"),
            REG.group("daily").feature("e").codec.encode([1, 2]),
            freshness_field("daily"),
            b"500",  # the event time: now, by default
        )
    ]
    assert plan.keys == [b"u:1"]
    assert (plan.stats.entities, plan.stats.values_written, plan.stats.values_removed) == (1, 2, 1)


def test_write_plan_event_times_per_row_and_per_call() -> None:
    rows = [(1, {"c": "x"}), (2, {}, 1_700_000_000.25), (3, {}, "2023-11-14T22:13:20Z")]
    rows += [(4, {}, 1_700_000_000_250), (5, {}, 1_700_000_000_250_000), (6, {}, 1.7e18)]
    plan = plan_write(REG.group("live"), rows, event_time=1000, now=1_800_000_000)
    assert [c[-1] for c in plan.commands] == [
        b"1000",
        b"1700000000.25",
        b"1700000000",
        b"1700000000.25",  # milliseconds
        b"1700000000.25",  # microseconds
        b"1700000000",  # nanoseconds
    ]
    assert [c[5] for c in plan.commands] == [0] * 6  # nothing to remove
    assert plan.stats.values_written == 1


@pytest.mark.parametrize(
    ("event_time", "message"),
    [
        (-1, "not a time after 1970"),
        (float("nan"), "not a time after 1970"),
        ("yesterday", "not an RFC 3339 time"),
        ("2026-11-23T10:00:00", "has no time zone"),
        (datetime(2026, 11, 23), "has no time zone"),
        (True, "must be unix seconds or an RFC 3339 string"),
        (2000 + MAX_FUTURE_SECONDS + 1, "in the future"),
    ],
)
def test_write_plan_refuses_bad_event_times_naming_the_entity(
    event_time: object, message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        plan_write(REG.group("live"), [(1, {"c": "x"})], event_time=event_time, now=2000)
    with pytest.raises(RequestError, match=f"entity 7: .*{message}"):
        plan_write(REG.group("live"), [(7, {"c": "x"}, event_time)], now=2000)


def test_write_outcome_counts_skipped_and_refused_entities() -> None:
    rows = [(1, {"c": "x"}), (2, {"c": None}), (3, {"c": "y"}), (4, {"c": "z"})]
    plan = plan_write(REG.group("live"), rows, now=1)
    stats = plan.outcome([WRITTEN, WRITTEN_EQUAL, SKIPPED, ResponseError("WRONGTYPE")])
    assert stats == WriteStats(entities=2, values_written=1, values_removed=1, skipped=1)


def test_write_plan_errors_name_entity_and_feature() -> None:
    with pytest.raises(EncodingError, match="entity 3 feature 'e': embedding has dimension 3"):
        plan_write(REG.group("daily"), [(3, {"e": [1, 2, 3]})])
    with pytest.raises(RequestError, match="feature group 'daily' has no feature 'c'"):
        plan_write(REG.group("daily"), [(3, {"c": "x"})])
    with pytest.raises(RequestError, match="not an int64"):
        plan_write(REG.group("daily"), [("3", {"a": 1.0})])


def test_unguarded_is_the_same_write_without_the_guard() -> None:
    plan = plan_write(REG.group("daily"), [(1, {"a": 0.0, "b": None})], now=500)
    assert unguarded(plan.commands[0]) == [
        ("HDEL", b"u:1", field_name("b")),
        ("HSET", b"u:1", field_name("a"), b"0", freshness_field("daily"), b"500"),
        ("EXPIRE", b"u:1", 86400),
    ]
