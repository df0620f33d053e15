"""ServingProcess's in-memory tail of a server's output, over a real pipe."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from feature_store.serving.process import OutputTail


def _tail_of(chunks: list[bytes], limit: int) -> str:
    read_end, write_end = os.pipe()
    tail = OutputTail(os.fdopen(read_end, "rb"), limit=limit)
    with os.fdopen(write_end, "wb") as writer:
        for chunk in chunks:
            writer.write(chunk)
            writer.flush()
    tail.wait(timeout=10)
    return tail.text()


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=3000), max_size=40),
    st.integers(min_value=1, max_value=5000),
)
def test_the_tail_is_the_last_bytes_written_and_no_more(chunks: list[bytes], limit: int) -> None:
    written = b"".join(chunks)
    assert _tail_of(chunks, limit) == written[-limit:].decode(errors="replace")


def test_a_long_output_keeps_its_end_in_bounded_memory() -> None:
    lines = [b"line %d\n" % i for i in range(200_000)]  # about 2 MB
    read_end, write_end = os.pipe()
    tail = OutputTail(os.fdopen(read_end, "rb"), limit=1000)
    with os.fdopen(write_end, "wb") as writer:
        writer.writelines(lines)
    tail.wait(timeout=10)
    assert tail.text().endswith("line 199999\n")
    assert len(tail.text()) == 1000
    assert tail._size < 1000 + 65536  # whole reads: at most one more than the limit
