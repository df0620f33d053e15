"""The OpenAPI document states the event time's bounds as the server applies them
(``batch.event_time_seconds``): no number below 0, and the upper bound, which moves with
the clock, in words with the server's own constant."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feature_store.batch import MAX_FUTURE_SECONDS, event_time_seconds
from feature_store.errors import RequestError
from feature_store.serving.api.schemas import event_time_schema


def test_the_document_states_the_bounds_the_server_applies() -> None:
    schema = event_time_schema()
    numbers = [s for s in schema["anyOf"] if s.get("type") == "number"]  # type: ignore[union-attr]
    assert numbers == [{"type": "number", "minimum": 0}]
    text = str(schema["description"])
    assert "before 1970" in text
    assert f"more than {MAX_FUTURE_SECONDS} s after the server's clock" in text


@given(st.floats(max_value=-1e-9, allow_nan=False) | st.integers(max_value=-1))
def test_a_number_below_the_minimum_is_refused(value: float) -> None:
    with pytest.raises(RequestError):
        event_time_seconds(value, time.time())


def test_past_the_stated_bound_is_refused_and_before_it_taken() -> None:
    now = time.time()
    assert event_time_seconds(now + MAX_FUTURE_SECONDS - 1, now) == now + MAX_FUTURE_SECONDS - 1
    with pytest.raises(RequestError, match="in the future"):
        event_time_seconds(now + MAX_FUTURE_SECONDS + 1, now)
    with pytest.raises(RequestError, match="in the future"):
        event_time_seconds((now + MAX_FUTURE_SECONDS + 1) * 1000, now)  # as milliseconds
