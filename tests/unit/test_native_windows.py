"""The native window answer (``_native.Windows``) against the reference (``windows.answer``
and the group's codecs): equal values for random states at random times, and a state it
does not read is left to the reference."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.native import native_enabled
from feature_store.registry import parse_registry
from feature_store.windows import Event, Layout, answer, apply, decode_state, encode_state

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the native extension is off")

REGISTRY = """
entities:
  consumer: {prefix: c, id_type: int, ttl: 30d}
feature_groups:
  g:
    entity: consumer
    aggregations:
      tile: 1m
      allowed_lateness: 10m
      features:
        n_1h:     {function: count, window: 1h}
        sum_1h:   {function: sum,  of: x, window: 1h}
        mean_1d:  {function: mean, of: y, window: 1d}
        max_1d:   {function: max,  of: x, window: 1d}
        min_1d:   {function: min,  of: y, window: 1d}
        last_3:   {function: last_n, n: 3, of: k, window: 7d}
        lastf_2:  {function: last_n, n: 2, of: y, window: 2h, type: float_list}
        n_x_10m:  {function: count, of: x, window: 10m}
"""
GROUP = parse_registry(REGISTRY).group("g")
LAYOUT = Layout.of(GROUP)
T0 = 1_700_000_000_000

numbers = st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False)
events = st.lists(
    st.tuples(
        st.integers(-20 * 60_000, 4 * 3_600_000),
        st.one_of(st.none(), numbers),
        st.one_of(st.none(), numbers),
        st.one_of(st.none(), st.integers(-(2**62), 2**62)),
    ),
    max_size=60,
)


def _decoded(stored: list[bytes | None]) -> list[object]:
    return [
        None if b is None else f.codec.decode(b)
        for f, b in zip(GROUP.features, stored, strict=True)
    ]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@settings(max_examples=400, deadline=None)
@given(events, st.lists(st.integers(-15 * 60_000, 9 * 86_400_000), min_size=1, max_size=4))
def test_native_answers_equal_the_reference(
    raw: list[tuple[int, float | None, float | None, int | None]], reads: list[int]
) -> None:
    state = decode_state(None, LAYOUT)
    t = T0
    for offset, (step, x, y, k) in enumerate(raw):
        t += step
        values = {n: v for n, v in (("x", x), ("y", y), ("k", k)) if v is not None}
        apply(state, LAYOUT, [Event(t, values, 0, offset)])
    data = encode_state(state, LAYOUT)
    state = decode_state(data, LAYOUT)
    for offset in reads:
        now_ms = t + offset
        reference = answer(state, LAYOUT, now_ms / 1000)
        expected = [
            None if v is None else c.encode(v)
            for c, v in zip(LAYOUT.codecs, reference.values, strict=True)
        ]
        values, newest = LAYOUT.native.answer(data, now_ms)
        got, want = _decoded(values), _decoded(expected)
        assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (got, want)
        assert newest == reference.newest_ms


def test_a_state_it_does_not_read_is_the_reference_s() -> None:
    for data in (
        b"garbage",
        b"1|\x02",
        b"|" + encode_state(decode_state(None, LAYOUT), LAYOUT)[2:],
    ):
        with pytest.raises(ValueError, match="not a window state"):
            LAYOUT.native.answer(data, T0)
