"""The OpenAPI document states the event time's bounds: a number it allows, the server takes
(``batch.event_time_seconds``), and a number the server refuses, it does not allow; they
differ only in the minute of margin the document keeps below the bound."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from feature_store.batch import event_time_seconds
from feature_store.errors import RequestError
from feature_store.serving.schemas import event_time_schema

NOW = 1_795_000_000.0  # 2026-11-18


def allowed(schema: dict[str, object], value: float) -> bool:
    numbers = [s for s in schema["anyOf"] if s.get("type") == "number"]  # type: ignore[attr-defined, union-attr]
    return any(s["minimum"] <= value <= s["maximum"] for s in numbers)


def taken(value: float) -> bool:
    try:
        event_time_seconds(value, NOW)
    except RequestError:
        return False
    return True


@given(
    st.one_of(
        st.floats(min_value=-1e3, max_value=1e21, allow_nan=False),
        st.integers(min_value=0, max_value=10**20),
        # about the bound, in each unit
        st.sampled_from([1.0, 1e3, 1e6, 1e9]).flatmap(
            lambda s: st.floats(min_value=(NOW + 3500) * s, max_value=(NOW + 3700) * s)
        ),
    )
)
@example(NOW)
@example(NOW * 1000)
@example(NOW + 7200)
@example(1e11 - 1)
def test_the_document_allows_the_numbers_the_server_takes(value: float) -> None:
    schema = event_time_schema(NOW)
    if allowed(schema, value):
        assert taken(value), value
    elif taken(value):
        # only in the margin under a bound: at most a minute's worth of the number's unit
        scale = next(s for s in (1.0, 1e3, 1e6, 1e9) if value <= (NOW + 3600) * s)
        assert value > (NOW + 3600 - 60) * scale, value


def test_the_bound_moves_with_the_documents_time() -> None:
    schema = event_time_schema(NOW)
    assert not allowed(schema, NOW + 3600)
    assert allowed(schema, NOW + 3000)
    assert allowed(event_time_schema(NOW + 600), NOW + 3600)
    with pytest.raises(RequestError):
        event_time_seconds(-1, NOW)
    assert not allowed(schema, -1)
