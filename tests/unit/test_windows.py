"""Window aggregations' tiles against the reference: events applied in chunks (as micro-
batches write them, the state stored and read back between them), replayed, late, out of
order, answered at several times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.errors import EncodingError, RegistryError
from feature_store.registry import Function, parse_registry
from feature_store.windows import (
    Event,
    Layout,
    answer,
    apply,
    decode_state,
    encode_state,
    reference_answer,
)

REGISTRY = """
entities:
  consumer: {prefix: c, id_type: int, ttl: 30d}
feature_groups:
  consumer_activity:
    entity: consumer
    aggregations:
      tile: 1m
      allowed_lateness: 10m
      features:
        orders_1h:      {function: count, window: 1h}
        spend_1h:       {function: sum,  of: order_total, window: 1h}
        basket_mean_1d: {function: mean, of: basket_size, window: 1d}
        max_spend_1d:   {function: max,  of: order_total, window: 1d}
        min_spend_1d:   {function: min,  of: order_total, window: 1d}
        last_stores_7d: {function: last_n, n: 5, of: store_id, window: 7d}
        totals_10m:     {function: count, of: order_total, window: 10m}
"""
GROUP = parse_registry(REGISTRY).group("consumer_activity")
AGG = GROUP.aggregation
assert AGG is not None
LAYOUT = Layout.of(GROUP)
T0 = 1_800_000_000_000  # ms


def test_the_registry_declares_aggregates() -> None:
    assert AGG.tile_seconds == 60
    assert AGG.lateness_seconds == 600
    assert [f.name for f in GROUP.features][:2] == ["orders_1h", "spend_1h"]
    assert [f.type.value for f in GROUP.features] == [
        "int",
        "double",
        "double",
        "double",
        "double",
        "int_list",
        "int",
    ]
    assert AGG.aggregates[5].function is Function.LAST_N
    assert AGG.aggregates[5].n == 5
    assert AGG.fields == ("basket_size", "order_total", "store_id")
    assert GROUP.windows_field
    assert GROUP.windows_field != GROUP.freshness_field


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("tile: 7m\n      features: {a: {function: count, window: 1h}}", "not a multiple"),
        ("features: {a: {function: sum, window: 1h}}", "sum needs 'of'"),
        ("features: {a: {function: last_n, of: x, window: 1h}}", "features.a.n: must be"),
        ("features: {a: {function: last_n, n: 0, of: x, window: 1h}}", "1..1000"),
        ("features: {a: {function: count, n: 3, window: 1h}}", "only last_n takes 'n'"),
        ("features: {a: {function: avg, of: x, window: 1h}}", "'avg' is not one of"),
        ("features: {a: {function: count}}", "missing 'window'"),
        ("features: {a: {function: sum, of: x, window: 1h, type: int}}", "only last_n"),
        ("features: {a: {function: last_n, n: 2, of: x, window: 1h, type: string}}", "int_list"),
        ("tile: 1s\n      features: {a: {function: count, window: 7d}}", "at most 50000"),
        ("features: {}", "declare at least one feature"),
    ],
)
def test_a_bad_aggregation_names_its_entry(body: str, message: str) -> None:
    text = f"""
entities:
  consumer: {{prefix: c, id_type: int, ttl: 30d}}
feature_groups:
  g:
    entity: consumer
    aggregations:
      {body}
"""
    with pytest.raises(RegistryError, match=r"feature_groups\.g\.aggregations") as raised:
        parse_registry(text)
    assert message in str(raised.value)


def test_a_group_is_aggregated_or_plain() -> None:
    text = REGISTRY + "    features: {x: float}\n"
    with pytest.raises(RegistryError, match="either 'features'"):
        parse_registry(text)


def test_the_default_tile_divides_every_window() -> None:
    text = REGISTRY.replace("      tile: 1m\n", "").replace("window: 10m", "window: 90s")
    agg = parse_registry(text).group("consumer_activity").aggregation
    assert agg is not None
    assert agg.tile_seconds == 30
    assert agg.lateness_seconds == 600


# each event's time: anywhere in 9 days (beyond the longest window), or after the one before
# (by up to 3 h, less up to 20 min: late past the bound of 10 min at times), so that many
# count and windows hold more values than last_n keeps
event_times = st.one_of(
    st.tuples(st.just("at"), st.integers(0, 9 * 86_400_000)),
    st.tuples(st.just("after"), st.integers(-20 * 60_000, 3 * 3_600_000)),
)
events = st.lists(
    st.tuples(
        event_times,
        st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),  # order_total
        st.one_of(st.none(), st.integers(0, 40)),  # basket_size
        st.one_of(st.none(), st.integers(-(2**40), 2**40), st.integers(0, 9)),  # store_id
        st.sampled_from([0, 1]),  # partition
    ),
    max_size=80,
)


Raw = list[tuple[tuple[str, int] | int, float | None, int | None, int | None, int]]


def _events(raw: Raw) -> list[Event]:
    out, offsets = [], {0: 0, 1: 0}
    t = 0
    for when, total, basket, store, partition in raw:
        t = when if isinstance(when, int) else (when[1] if when[0] == "at" else t + when[1])
        t = max(0, t)
        values: dict[str, float | int] = {}
        if total is not None:
            values["order_total"] = total
        if basket is not None:
            values["basket_size"] = float(basket)
        if store is not None:
            values["store_id"] = store
        offsets[partition] += 1
        out.append(Event(T0 + t, values, partition, offsets[partition]))
    return out


def _equal(got: list[object], want: list[object]) -> None:
    for g, w, a in zip(got, want, AGG.aggregates, strict=True):
        if a.function in (Function.SUM, Function.MEAN) and g is not None and w is not None:
            assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-6), (a, g, w)  # type: ignore[arg-type]
        else:
            assert g == w, (a, g, w)


@settings(max_examples=500, deadline=None)
@given(
    events,
    st.lists(st.integers(1, 20), max_size=6),
    st.lists(st.one_of(st.integers(0, 10 * 86_400_000), st.integers(0, 30 * 60_000)), max_size=5),
)
def test_tiles_answer_as_the_reference(
    raw: Raw,
    cuts: list[int],
    reads: list[int],
) -> None:
    """Applied in chunks with the state stored between them, and each chunk applied a
    second time (a micro-batch written again): the answers equal the reference's."""
    evs = _events(raw)
    stored: bytes | None = None
    at = 0
    for size in [*cuts, len(evs)]:
        chunk = evs[at : at + size]
        at += len(chunk)
        for _ in range(2):
            state = decode_state(stored, LAYOUT)
            apply(state, LAYOUT, chunk)
            stored = encode_state(state, LAYOUT)
    state = decode_state(stored, LAYOUT)
    newest = max((e.time_ms for e in evs), default=T0)
    for offset in [0, *reads]:
        # from the newest event less the lateness on: a reader's clock a little behind
        now = (newest - AGG.lateness_seconds * 1000 + offset) / 1000
        got = answer(state, LAYOUT, now)
        _equal(got.values, reference_answer(AGG, evs, now))


def test_a_replayed_topic_changes_nothing() -> None:
    evs = _events([(i * 1000, 1.0, 2, i, 0) for i in range(10)])
    state = decode_state(None, LAYOUT)
    assert apply(state, LAYOUT, evs).counted == 10
    again = apply(state, LAYOUT, evs)
    assert again.counted == 0
    assert again.replayed == list(range(10))
    assert answer(state, LAYOUT, (T0 + 60_000) / 1000).values[0] == 10


def test_late_events_are_not_counted_and_are_named() -> None:
    late = [(20 * 60_000, 5.0, 1, 1, 0), (0, 7.0, 1, 2, 0), (10 * 60_000, 3.0, 1, 3, 0)]
    state = decode_state(None, LAYOUT)
    applied = apply(state, LAYOUT, _events(late))
    assert applied.late == [1]
    assert applied.counted == 2
    values = answer(state, LAYOUT, (T0 + 21 * 60_000) / 1000).values
    assert values[0] == 2
    assert values[1] == 8.0
    assert values[5] == [1, 3]


def test_a_window_slides_without_events() -> None:
    state = decode_state(None, LAYOUT)
    apply(state, LAYOUT, _events([(30_000, 12.5, 3, 9, 0)]))
    hour_later = answer(state, LAYOUT, (T0 + 3_600_000 + 60_000) / 1000)
    assert hour_later.values[:2] == [0, 0.0]
    assert hour_later.values[2] == 3.0
    assert hour_later.values[5] == [9]
    assert hour_later.newest_ms == T0 + 30_000
    week_later = answer(state, LAYOUT, (T0 + 8 * 86_400_000) / 1000)
    assert week_later.values == [0, 0.0, None, None, None, None, 0]
    assert week_later.newest_ms is None
    # the answer holds until the next tile boundary
    assert week_later.changes_at == (T0 + 8 * 86_400_000 + 60_000) / 1000


def test_pruned_tiles_leave_the_state() -> None:
    state = decode_state(None, LAYOUT)
    apply(state, LAYOUT, _events([(i * 86_400_000, 1.0, 1, 1, 0) for i in range(10)]))
    # the newest is day 9. The last 5 stores (7 d) of a read 10 minutes (the lateness)
    # before it are days 4-8; nothing else reads a tile older than a day
    assert sorted(state.tiles) == [(T0 + i * 86_400_000) // 60_000 for i in range(4, 10)]
    day = state.tiles[(T0 + 8 * 86_400_000) // 60_000]
    j = LAYOUT.index
    # day 8 (in the 1 d windows of reads from 10 minutes before day 9): no sum (1 h)
    assert day.parts[j["store_id"]][4] == [[T0 + 8 * 86_400_000, 1]]
    assert day.parts[j["order_total"]][:4] == [None, 0.0, 1.0, 1.0]
    assert day.parts[j["basket_size"]][:2] == [1, 1.0]  # the 1 d mean's
    assert state.tiles[(T0 + 7 * 86_400_000) // 60_000].parts[j["order_total"]][:4] == [
        None,
        0.0,
        None,
        None,
    ]
    today = state.tiles[(T0 + 9 * 86_400_000) // 60_000]
    assert today.parts[j["order_total"]][:4] == [1, 1.0, 1.0, 1.0]
    assert decode_state(encode_state(state, LAYOUT), LAYOUT).tiles == state.tiles


def test_unreadable_state_is_an_encoding_error() -> None:
    for data in (b"not a state", b"3|{", b"3|[1, {}, [[1, 2, 3, []]]]"):
        with pytest.raises(EncodingError, match="window tiles cannot be read"):
            decode_state(data, LAYOUT)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-15 * 60_000, 6 * 3_600_000), st.integers(0, 9)), min_size=5),
    st.lists(st.integers(0, 8 * 86_400_000), max_size=4),
)
def test_pruned_state_keeps_what_every_later_read_needs(
    steps: list[tuple[int, int]], reads: list[int]
) -> None:
    """Orders mostly in time order (a few late), every one with a store and a total: the
    tiles pruned after each event still answer every read from the newest event less the
    lateness on as the reference does (last_n's depth, the 1 h and 1 d parts)."""
    evs, t = [], T0
    for offset, (step, store) in enumerate(steps):
        t = max(T0, t + step)
        evs.append(Event(t, {"order_total": float(store), "store_id": store}, 0, offset))
    state = decode_state(None, LAYOUT)
    for e in evs:  # one at a time: pruned after each
        state = decode_state(encode_state(state, LAYOUT), LAYOUT)
        apply(state, LAYOUT, [e])
    newest = max(e.time_ms for e in evs)
    for offset in [0, 60_000, *reads]:
        now = (newest - AGG.lateness_seconds * 1000 + offset) / 1000
        _equal(answer(state, LAYOUT, now).values, reference_answer(AGG, evs, now))
