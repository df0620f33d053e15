"""The ingest encoder against the shared codecs and plan_write: same commands, same bytes.

Pure: Arrow batches in memory, no Spark session, no Redis.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.errors import EncodingError
from feature_store.ingest.encode import BatchEncoder, FloatMemos
from feature_store.ingest.spec import BadReason, ColumnSpec, Source
from feature_store.registry import FeatureGroup, parse_registry

WRITTEN_AT = 1_700_000_000
ARROW = {
    "float": pa.float32(),
    "int": pa.int64(),
    "int_list": pa.list_(pa.int64()),
    "embedding": pa.list_(pa.float32()),
}


def _group() -> FeatureGroup:
    return sample.registry().group(sample.GROUP)


def _batch(group: FeatureGroup, rows: list[tuple[object, dict[str, object]]]) -> pa.RecordBatch:
    columns = {"id": pa.array([r[0] for r in rows], pa.int64())}
    for f in group.features:
        columns[f.name] = pa.array([r[1].get(f.name) for r in rows], ARROW[f.type.value])
    return pa.RecordBatch.from_pydict(columns)


def _encoder(group: FeatureGroup, **kw: object) -> BatchEncoder:
    specs = [ColumnSpec(f.name, f.name) for f in group.features]
    return BatchEncoder(group, "id", specs, WRITTEN_AT, **kw)  # type: ignore[arg-type]


def _as_read(batch: pa.RecordBatch, group: FeatureGroup) -> list[tuple[object, dict[str, object]]]:
    """The rows as plan_write gets them from Python: Arrow's float32 values, widened."""
    data = batch.to_pydict()
    return [
        (data["id"][i], {f.name: data[f.name][i] for f in group.features})
        for i in range(batch.num_rows)
    ]


def test_commands_equal_plan_write_for_the_standard_shape() -> None:
    group = _group()
    batch = _batch(group, list(sample.rows(500, seed=3)))
    encoded = _encoder(group).encode(batch)
    expected = plan_write(group, _as_read(batch, group), now=WRITTEN_AT)
    assert encoded.commands(group.entity.ttl_seconds) == expected.commands
    assert encoded.values_written == expected.stats.values_written
    assert not encoded.bad


def test_null_cells_become_hdel_like_plan_write() -> None:
    group = _group()
    rows = list(sample.rows(60, seed=1))
    for i, (_, values) in enumerate(rows):
        if i % 2:
            values["float_03"] = None
        if i % 3 == 0:
            values["embedding_1"] = None
            values["int_list_2"] = None
    batch = _batch(group, rows)
    encoded = _encoder(group).encode(batch)
    expected = plan_write(group, _as_read(batch, group), now=WRITTEN_AT)
    assert encoded.commands(group.entity.ttl_seconds) == expected.commands
    assert encoded.values_removed == expected.stats.values_removed == 30 + 2 * 20


def test_chunks_of_commands_cover_every_entity_once() -> None:
    group = _group()
    encoded = _encoder(group).encode(_batch(group, list(sample.rows(10))))
    ttl = group.entity.ttl_seconds
    parts = [encoded.commands(ttl, a, min(a + 3, 10)) for a in range(0, 10, 3)]
    assert [c for p in parts for c in p] == encoded.commands(ttl)


SMALL = """\
version: 1
entities:
  user: {prefix: u, id_type: int, ttl: 1d}
feature_groups:
  g:
    entity: user
    features:
      f: float
      d: double
      i: int
      l: int_list
      e: embedding(3)
      fl: float_list
      b: bool
      s: string
"""


def _small() -> FeatureGroup:
    return parse_registry(SMALL).group("g")


def _one_column(
    group: FeatureGroup, name: str, array: pa.Array, source: Source = Source.NATIVE
) -> list[object]:
    """Each cell's encoding (None: null or bad) and the bad rows, for a single column."""
    batch = pa.RecordBatch.from_pydict({"id": pa.array(range(len(array)), pa.int64()), name: array})
    enc = BatchEncoder(
        group, "id", [ColumnSpec(name, name, source)], WRITTEN_AT, memos=FloatMemos()
    )
    out = enc.encode(batch)
    field = group.feature(name).field
    by_key = {
        k: dict(zip(h[0::2], h[1::2], strict=True)).get(field)
        for k, h in zip(out.keys, out.hset, strict=True)
    }
    bad = {b.index: b.reason for b in out.bad}
    return [bad.get(i) or by_key.get(f"u:{i}".encode()) for i in range(len(array))]


FLOAT32_SPECIALS = [
    0.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    1e-45,
    -1e-45,
    1.17549435e-38,
    3.4028234663852886e38,
    -3.4028234663852886e38,
    0.1,
    1 / 3,
    16777217.0,
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200))
def test_float32_columns_encode_like_the_codec(patterns: list[int]) -> None:
    group = _small()
    values = np.array(patterns, dtype=np.uint32).view(np.float32)
    cells = [*values.tolist(), *FLOAT32_SPECIALS]
    got = _one_column(group, "f", pa.array(np.array(cells, dtype=np.float32)))
    codec = group.feature("f").codec
    assert got == [codec.encode(float(np.float32(c))) for c in cells]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=100))
def test_float64_columns_encode_like_the_codec_or_are_bad(values: list[float]) -> None:
    group = _small()
    cells = [*values, 3.5e38, -1e39, 3.4028235e38]
    for name in ("f", "d"):
        codec = group.feature(name).codec
        expected: list[object] = []
        for v in cells:
            try:
                expected.append(codec.encode(v))
            except EncodingError:
                expected.append(BadReason.INVALID_VALUE)
        assert _one_column(group, name, pa.array(cells, pa.float64())) == expected


def test_negative_zero_and_nan_do_not_share_a_memo_entry_with_zero() -> None:
    group = _small()
    got = _one_column(group, "f", pa.array([0.0, -0.0, math.nan, 0.0], pa.float32()))
    assert got == [b"0", b"-0", b"nan", b"0"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40), min_size=1, max_size=40))
def test_int_lists_encode_like_the_codec(lists: list[list[int]]) -> None:
    group = _small()
    codec = group.feature("l").codec
    got = _one_column(group, "l", pa.array(lists, pa.list_(pa.int64())))
    assert got == [codec.encode(v) for v in lists]


def test_int_lists_of_narrow_ints_and_null_items() -> None:
    group = _small()
    codec = group.feature("l").codec
    assert _one_column(group, "l", pa.array([[1, -2, 300]], pa.list_(pa.int32()))) == [
        codec.encode([1, -2, 300])
    ]
    got = _one_column(group, "l", pa.array([[1, None], [2]], pa.list_(pa.int64())))
    assert got == [BadReason.INVALID_VALUE, codec.encode([2])]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(allow_nan=False, width=32), min_size=3, max_size=3),
        min_size=1,
        max_size=30,
    )
)
def test_embeddings_encode_like_the_codec(vectors: list[list[float]]) -> None:
    group = _small()
    codec = group.feature("e").codec
    vectors = [*vectors, [-0.0, 1e-45, 3.4028234663852886e38]]
    for value_type in (pa.float32(), pa.float64()):
        got = _one_column(group, "e", pa.array(vectors, pa.list_(value_type)))
        assert got == [codec.encode(v) for v in vectors]


def test_embeddings_of_the_wrong_dimension_nan_and_out_of_range() -> None:
    group = _small()
    codec = group.feature("e").codec
    cells = [[1.0, 2.0, 3.0], [1.0, 2.0], None, [1.0, 2.0, 3.0, 4.0]]
    got = _one_column(group, "e", pa.array(cells, pa.list_(pa.float32())))
    assert got == [
        codec.encode([1.0, 2.0, 3.0]),
        BadReason.WRONG_EMBEDDING_DIM,
        None,
        BadReason.WRONG_EMBEDDING_DIM,
    ]
    nan = [[math.nan, 0.0, 1.0]]  # the codec path keeps NaN as the codec writes it
    assert _one_column(group, "e", pa.array(nan, pa.list_(pa.float32()))) == [codec.encode(nan[0])]
    big = [[1e39, 0.0, 0.0], [1.0, 0.0, 0.0]]
    got = _one_column(group, "e", pa.array(big, pa.list_(pa.float64())))
    assert got == [BadReason.INVALID_VALUE, codec.encode(big[1])]


def test_text_cells_are_parsed_then_encoded_by_the_codec() -> None:
    group = _small()
    f, i, b, lst, e = (group.feature(n).codec for n in ("f", "i", "b", "l", "e"))
    text = Source.TEXT
    assert _one_column(group, "f", pa.array(["0.25", "abc", None, "1e50"]), text) == [
        f.encode(0.25),
        BadReason.UNPARSEABLE_VALUE,
        None,
        BadReason.INVALID_VALUE,
    ]
    assert _one_column(group, "i", pa.array(["7", "7.5", "-3"]), text) == [
        i.encode(7),
        BadReason.UNPARSEABLE_VALUE,
        i.encode(-3),
    ]
    assert _one_column(group, "b", pa.array(["true", "0", "maybe"]), text) == [
        b.encode(True),
        b.encode(False),
        BadReason.UNPARSEABLE_VALUE,
    ]
    assert _one_column(group, "l", pa.array(["[1, 2]", "{}", "[1.5]"]), text) == [
        lst.encode([1, 2]),
        BadReason.UNPARSEABLE_VALUE,
        BadReason.INVALID_VALUE,
    ]
    assert _one_column(group, "e", pa.array(["[1, 2, 3]", "[1, 2]"]), text) == [
        e.encode([1, 2, 3]),
        BadReason.WRONG_EMBEDDING_DIM,
    ]


def test_other_types_go_through_the_codec() -> None:
    group = _small()
    assert _one_column(group, "s", pa.array(["héllo", None])) == [b"h\xc3\xa9llo", None]
    assert _one_column(group, "b", pa.array([True, False])) == [b"1", b"0"]
    fl = group.feature("fl").codec
    assert _one_column(group, "fl", pa.array([[0.5], []], pa.list_(pa.float32()))) == [
        fl.encode([0.5]),
        fl.encode([]),
    ]
    assert _one_column(group, "i", pa.array([2**63 - 1, -(2**63)], pa.int64())) == [
        str(2**63 - 1).encode(),
        str(-(2**63)).encode(),
    ]


def test_bad_ids_are_reported_and_not_written() -> None:
    group = _small()
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array(["1", None, "x", "4"]), "f": pa.array([1.0, 2.0, 3.0, 4.0], pa.float32())}
    )
    enc = BatchEncoder(group, "id", [ColumnSpec("f", "f")], WRITTEN_AT, id_source=Source.TEXT)
    out = enc.encode(batch)
    assert out.keys == [b"u:1", b"u:4"]
    assert [(b.index, b.reason) for b in out.bad] == [
        (1, BadReason.NULL_ID),
        (2, BadReason.INVALID_ID),
    ]


def test_a_row_with_any_bad_cell_is_not_written_at_all() -> None:
    group = _small()
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([1, 2], pa.int64()),
            "f": pa.array([1.0, 2.0], pa.float32()),
            "e": pa.array([[1.0, 2.0, 3.0], [1.0]], pa.list_(pa.float32())),
        }
    )
    enc = BatchEncoder(group, "id", [ColumnSpec("f", "f"), ColumnSpec("e", "e")], WRITTEN_AT)
    out = enc.encode(batch)
    assert out.keys == [b"u:1"]
    assert out.values_written == 2
    assert "column 'e'" in out.bad[0].detail


def test_sliced_batches_encode_their_own_rows() -> None:
    group = _group()
    batch = _batch(group, list(sample.rows(40, seed=5)))
    part = batch.slice(13, 9)
    encoded = _encoder(group).encode(part)
    expected = plan_write(group, _as_read(part, group), now=WRITTEN_AT)
    assert encoded.commands(group.entity.ttl_seconds) == expected.commands


def test_float_memo_is_bounded_and_keeps_what_it_has() -> None:
    group = _small()
    memos = FloatMemos(limit=3)
    spec = [ColumnSpec("f", "f")]
    enc = BatchEncoder(group, "id", spec, WRITTEN_AT, memos=memos)
    cells = [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array(range(6), pa.int64()), "f": pa.array(cells, pa.float32())}
    )
    out = enc.encode(batch)
    assert [h[1] for h in out.hset] == [b"0", b"1", b"2", b"3", b"4", b"0"]
    memo = memos.get(group.feature("f").type, 4)
    assert len(memo) == 3
    assert 0 in memo  # the first (most common) values stay


def test_struct_sanity_float32_max_is_the_codecs() -> None:
    # the column-wise range check uses numpy's float32 max: the same number as struct's
    assert struct.unpack("<f", struct.pack("<f", 3.4028234663852886e38))[0] == float(
        np.finfo(np.float32).max
    )
    with pytest.raises(OverflowError):
        struct.pack("<f", 3.5e38)


def test_event_times_from_a_column_match_plan_write_per_row() -> None:
    """Timestamps (with or without a zone), unix seconds and RFC 3339 text give each row
    the event time plan_write gives the same row; a null or unusable time quarantines it."""
    group = _small()
    now = 1_800_000_000
    times = {
        "ts": pa.array(
            [1_700_000_000_250_000, 1_700_000_001_000_000, None, 0, 1_900_000_000_000_000],
            pa.timestamp("us", tz="UTC"),
        ),
        "ntz": pa.array(
            [1_700_000_000_250, 1_700_000_001_000, None, 0, 1_900_000_000_000],
            pa.timestamp("ms"),
        ),
        "secs": pa.array([1_700_000_000.25, 1_700_000_001, None, 0, 1.9e9], pa.float64()),
        "text": pa.array(
            [
                "2023-11-14T22:13:20.250Z",
                "2023-11-14T23:13:21+01:00",
                None,
                "1970-01-01T00:00:00Z",
                "2030-03-17T17:46:40Z",
            ]
        ),
    }
    for column, array in times.items():
        batch = pa.RecordBatch.from_pydict(
            {"id": pa.array([1, 2, 3, 4, 5]), "f": pa.array([1.0] * 5, pa.float32()), column: array}
        )
        enc = BatchEncoder(
            group, "id", [ColumnSpec("f", "f")], WRITTEN_AT, event_time_column=column, now=now
        )
        out = enc.encode(batch)
        assert out.keys == [b"u:1", b"u:2", b"u:4"], column
        assert [h[-1] for h in out.hset] == [b"1700000000.25", b"1700000001", b"0"], column
        assert [(b.index, b.reason) for b in out.bad] == [
            (2, BadReason.NULL_EVENT_TIME),
            (4, BadReason.INVALID_EVENT_TIME),
        ], column
        assert "in the future" in out.bad[1].detail
        rows = [
            (1, {"f": 1.0}, 1_700_000_000.25),
            (2, {"f": 1.0}, 1_700_000_001),
            (4, {"f": 1.0}, 0),
        ]
        expected = plan_write(group, rows, now=now)
        assert out.commands(86400) == expected.commands, column


def test_unordered_commands_are_the_same_write_without_the_guard() -> None:
    group = _small()
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1]), "f": pa.array([None], pa.float32())})
    out = BatchEncoder(group, "id", [ColumnSpec("f", "f")], WRITTEN_AT).encode(batch)
    f = group.feature("f").field
    assert out.commands(60, ordered=False) == [
        ("HDEL", b"u:1", f),
        ("HSET", b"u:1", group.freshness_field, str(WRITTEN_AT).encode()),
        ("EXPIRE", b"u:1", 60),
    ]
