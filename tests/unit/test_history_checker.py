"""The checker of ``benchmarks/partitions.py``'s histories (``benchmarks/_history.py``):
histories of a store that keeps its promises pass, and each broken promise is found.

A history is simulated: one register per key, writes in turn with growing numbers, each
applied at a moment inside its request (acknowledged or not, as a failed write may have
been applied), reads answering what the register held at a moment inside theirs, or
what it held ``lag`` seconds earlier (an L1 within its TTL)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _history import SLACK, History, Read, Tally, Window, Write, check

BOUND = 1.0


@st.composite
def histories(draw: st.DrawFn) -> tuple[History, dict[int, int]]:
    """A history of a store that keeps every promise, and what it holds at the end."""
    history = History()
    keys = draw(st.integers(1, 4))
    applied: dict[int, list[tuple[float, int]]] = {k: [(0.0, 0)] for k in range(keys)}
    t = 1.0
    seqs = dict.fromkeys(range(keys), 0)
    free = dict.fromkeys(range(keys), 0.0)  # when the key's writer may write again
    for _ in range(draw(st.integers(0, 30))):
        t += draw(st.floats(0.01, 0.5))
        key = draw(st.integers(0, keys - 1))
        took = draw(st.floats(0.001, 0.3))
        if draw(st.booleans()) and t >= free[key]:  # one writer per key, in turn
            free[key] = t + took
            seqs[key] += 1
            acked = draw(st.booleans())
            if acked or draw(st.booleans()):  # a failed write may have been applied
                applied[key].append((t + draw(st.floats(0.0, took)), seqs[key]))
            history.wrote(Write("A", key, seqs[key], t, t + took, acked))
        else:
            lag = draw(st.sampled_from([0.0, 0.0, BOUND * 0.9]))
            at = t + draw(st.floats(0.0, took)) - lag
            held = max((a for a in applied[key] if a[0] <= at), default=(0.0, 0))[1]
            history.read(Read("A", t, t + took, True, ((key, held, "present"),)))
    final = {k: max(applied[k])[1] for k in applied}
    return history, final


def tally(history: History, final: dict[int, int], deadline: float = 10.0) -> Tally:
    out = check(history, [], final, {"A": BOUND}, deadline)
    return out.get("steady", {}).get("A", Tally())


@given(histories())
def test_a_store_that_keeps_its_promises_passes(case: tuple[History, dict[int, int]]) -> None:
    history, final = case
    t = tally(history, final)
    assert (t.wrong_values, t.stale_beyond_bound, t.lost_writes, t.past_deadline) == (0, 0, 0, 0)
    assert t.reads == len(history.reads)
    assert t.writes == len(history.writes)
    assert t.failed_writes == sum(not w.acked for w in history.writes)


def test_a_value_never_written_is_wrong() -> None:
    h = History()
    h.wrote(Write("A", 1, 1, 1.0, 1.1, True))
    h.read(Read("A", 0.5, 0.6, True, ((1, 1, "present"),)))  # before the write started
    h.read(Read("A", 2.0, 2.1, True, ((1, 2, "present"),)))  # never written at all
    h.read(Read("A", 2.0, 2.1, True, ((1, 1, "present"),), wrong_key=1))  # another's
    assert tally(h, {1: 1}).wrong_values == 3


def test_an_old_value_past_the_bound_is_stale_unless_marked_or_lost() -> None:
    h = History()
    h.wrote(Write("A", 1, 1, 1.0, 1.1, True))
    h.read(Read("A", 1.1 + BOUND / 2, 3.0, True, ((1, 0, "present"),)))  # within the bound
    h.read(Read("A", 1.2 + BOUND, 3.0, True, ((1, 0, "present"),)))  # past it
    h.read(Read("A", 1.2 + BOUND, 3.0, True, ((1, 0, "stale"),)))  # marked stale
    t = tally(h, {1: 1})
    assert (t.stale_beyond_bound, t.stale_marked, t.lost_writes) == (1, 1, 0)
    # the same reads, had the write been lost: the loss is counted, the reads explained
    t = tally(h, {1: 0})
    assert (t.stale_beyond_bound, t.behind_lost_writes, t.lost_writes) == (0, 2, 1)


def test_a_write_not_acknowledged_may_be_seen_or_not() -> None:
    h = History()
    h.wrote(Write("A", 1, 1, 1.0, 2.0, False))
    h.read(Read("A", 5.0, 5.1, True, ((1, 1, "present"),)))
    h.read(Read("A", 5.0, 5.1, True, ((1, 0, "present"),)))
    t = tally(h, {1: 1})
    assert (t.wrong_values, t.stale_beyond_bound, t.failed_writes) == (0, 0, 1)


def test_windows_take_what_starts_in_them_with_the_heal_times() -> None:
    h = History()
    h.read(Read("A", 0.5, 0.6, True, ((1, 0, "present"),)))
    h.read(Read("A", 1.5, 1.5 + 1.0 + 2 * SLACK, False, (), detail="503"))  # in, past deadline
    h.read(Read("A", 3.2, 3.3, False, ()))  # after the heal (3.0), still failing
    h.read(Read("A", 3.5, 3.6, True, ((1, 0, "stale"),)))  # answered, not good
    h.read(Read("A", 3.7, 3.8, True, ((1, 0, "present"),)))  # the first good answer
    h.read(Read("A", 9.0, 9.1, True, ((1, 0, "present"),)))  # past the window: steady
    out = check(h, [Window("cut", 1.0, 3.0, 5.0)], {}, {"A": BOUND}, 1.0)
    cut, steady = out["cut"]["A"], out["steady"]["A"]
    assert (cut.reads, cut.failed_reads, cut.past_deadline) == (4, 2, 1)
    assert cut.heal_to_good_read is not None
    assert abs(cut.heal_to_good_read - 0.8) < 1e-9
    assert cut.heal_to_last_failed_read is not None
    assert abs(cut.heal_to_last_failed_read - 0.3) < 1e-9
    assert "503" in cut.examples[0]
    assert steady.reads == 2
    assert steady.heal_to_good_read is None
