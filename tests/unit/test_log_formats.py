"""The framing ``benchmarks/log_formats.py`` measures: frames read back whole, blocks that
never split a frame, and a file by reference holding each served entity's entry once."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from log_formats import blocks, by_reference, frame, varint


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


@given(st.integers(0, 2**63))
def test_a_varint_reads_back(n: int) -> None:
    assert read_varint(varint(n), 0) == (n, len(varint(n)))


@given(st.integers(0, 2), st.binary(min_size=1, max_size=128), st.integers(0, 2**62), st.binary())
def test_a_frame_reads_back(api: int, request_id: bytes, served_ms: int, answer: bytes) -> None:
    framed = frame(api, request_id, served_ms, answer)
    length = int.from_bytes(framed[:4], "little")
    assert (framed[4], framed[5]) == (api, 0)
    assert int.from_bytes(framed[6:14], "little") == served_ms
    assert framed[15 : 15 + framed[14]] == request_id
    assert framed[15 + framed[14] :] == answer
    assert length == len(answer)


@given(st.lists(st.binary(min_size=1, max_size=50), max_size=60), st.integers(1, 200))
def test_blocks_hold_every_frame_whole_and_in_order(frames: list[bytes], size: int) -> None:
    out = blocks(frames, size)
    assert b"".join(out) == b"".join(frames)
    assert all(len(b) >= size for b in out[:-1])
    # each block ends where a frame ends
    ends, at = set(), 0
    for f in frames:
        at += len(f)
        ends.add(at)
    at = 0
    for b in out:
        at += len(b)
        assert at in ends


def test_a_file_by_reference_holds_each_entry_once() -> None:
    values = [bytes([i]) * 200 for i in range(50)]
    ids = [[i % 7, (i * 3) % 11, 49] for i in range(100)]
    us, per_entity, held = by_reference(ids, values)
    assert held == len({e for batch in ids for e in batch})
    # a few references per served entity, the entries' values once each (compressed)
    assert 0 < per_entity < sum(len(values[e]) for e in {e for b in ids for e in b}) / 300
    assert us >= 0
