"""The stream job's record parsing: each JSON record is plan_write's guarded write of the
same row, or a bad record with its reason (never an exception)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from hypothesis import given
from hypothesis import strategies as st

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.ingest.spec import BadReason
from feature_store.ingest.stream import encode_records

GROUP = sample.registry().group(sample.GROUP)
NOW = 1_800_000_000.0


def _encode(*records: bytes | None) -> object:
    return encode_records(GROUP, list(records), id_field="consumer_id", now=NOW)


def test_a_record_is_plan_write_s_row() -> None:
    record = {"consumer_id": 7, "event_time": "2027-01-15T08:00:00.5Z", "int_0": 3.0}
    record |= {"float_00": "NaN", "int_list_0": [1.0, 2], "embedding_0": None}
    out = encode_records(GROUP, [orjson.dumps(record)], id_field="consumer_id", now=NOW)
    when = datetime(2027, 1, 15, 8, 0, 0, 500_000, tzinfo=UTC).timestamp()
    row = {"int_0": 3, "float_00": float("nan"), "int_list_0": [1, 2], "embedding_0": None}
    expected = plan_write(GROUP, [(7, row, when)], now=NOW)
    assert out.bad == []
    assert out.commands == expected.commands
    assert out.keys == expected.keys
    assert out.counts == [(3, 1)]  # 3 values written, embedding_0 removed


BAD = [
    (b"{", BadReason.MALFORMED_RECORD),
    (b"[1]", BadReason.MALFORMED_RECORD),
    (None, BadReason.MALFORMED_RECORD),
    (b'{"event_time": 1}', BadReason.NULL_ID),
    (b'{"consumer_id": 1}', BadReason.NULL_EVENT_TIME),
    (b'{"consumer_id": 1, "event_time": "later"}', BadReason.INVALID_EVENT_TIME),
    (b'{"consumer_id": 1, "event_time": 1e10}', BadReason.INVALID_EVENT_TIME),
    (b'{"consumer_id": "x", "event_time": 1}', BadReason.INVALID_ID),
    (b'{"consumer_id": 1, "event_time": 1, "int_0": "three"}', BadReason.INVALID_VALUE),
    (b'{"consumer_id": 1, "event_time": 1, "embedding_0": [1.0]}', BadReason.INVALID_VALUE),
    (b'{"consumer_id": 1, "event_time": 1, "colour": 1}', BadReason.UNKNOWN_FIELD),
]


def test_bad_records_are_named_with_their_reason_and_the_rest_written() -> None:
    good = orjson.dumps({"consumer_id": 1, "event_time": 1, "int_0": 1})
    out = _encode(good, *(r for r, _ in BAD), good)
    assert [(i, reason) for i, reason, _ in out.bad] == [  # type: ignore[attr-defined]
        (i + 1, reason) for i, (_, reason) in enumerate(BAD)
    ]
    assert len(out.commands) == 2  # type: ignore[attr-defined]


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_are_a_write_or_a_bad_record(raw: bytes) -> None:
    out = _encode(raw)
    assert len(out.commands) + len(out.bad) == 1  # type: ignore[attr-defined]
