"""feature-store plan: the arithmetic, and the figures against the results they come from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from feature_store.capacity import FIGURES, GIB, plan

ROOT = Path(__file__).resolve().parents[2]


def test_a_plan_adds_up() -> None:
    p = plan(100_000_000, 50, 1_000_000, hit_rate=0.8, node_memory_gib=25.0)
    data = 100_000_000 * 50 * FIGURES["bytes_per_value"].value
    assert p.data_bytes == data
    assert p.shards_for_memory == -(-data // (25 * GIB * 0.75))
    misses = 1_000_000 * 0.2
    assert p.redis_cores == pytest.approx(misses * FIGURES["redis_us_per_entity"].value / 1e6)
    assert p.shards == max(p.shards_for_memory, p.shards_for_cpu)
    cost = 0.8 * FIGURES["rest_hit_us"].value + 0.2 * FIGURES["rest_miss_us"].value
    assert p.serving_cores == pytest.approx(1_000_000 * cost / 1e6 / 0.6)


def test_more_lookups_need_more_redis_shards_not_more_memory() -> None:
    small = plan(1_000_000, 50, 10_000, hit_rate=0.0)
    busy = plan(1_000_000, 50, 10_000_000, hit_rate=0.0)
    assert small.shards_for_memory == busy.shards_for_memory == 1
    assert busy.shards_for_cpu > small.shards_for_cpu
    assert busy.shards == busy.shards_for_cpu


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_figure_is_in_the_results_it_names(name: str) -> None:
    figure = FIGURES[name]
    path, _, where = figure.source.partition(": ")
    text = (ROOT / path).read_text()
    if path.endswith("cost.md"):
        api, l1, batch = re.match(r"(\w+), L1 (\w+), batch (\d+)", where).groups()  # type: ignore[union-attr]
        row = next(
            line for line in text.splitlines() if line.startswith(f"| {api} | {l1} | {batch} |")
        )
        cells = [c.strip() for c in row.strip("|").split("|")]
        column = 8 if name == "redis_us_per_entity" else 7  # Redis's, or the server's
        assert float(cells[column]) == figure.value, row
    else:
        assert f"| {figure.value} |" in text
