"""feature-store plan: the arithmetic (tests/unit/test_figures.py reads its figures back)."""

from __future__ import annotations

import pytest

from feature_store.capacity import FIGURES, GIB, plan


def test_a_plan_adds_up() -> None:
    p = plan(100_000_000, 50, 1_000_000, hit_rate=0.8, node_memory_gib=25.0)
    data = 100_000_000 * 50 * FIGURES["bytes_per_value"].value
    assert p.data_bytes == data
    assert p.shards_for_memory == -(-data // (25 * GIB * 0.75))
    misses = 1_000_000 * 0.2
    # six shards: a Redis Cluster, priced with the cluster's figures
    redis = FIGURES["cluster_redis_us_per_entity"].value
    assert p.redis_cores == pytest.approx(misses * redis / 1e6)
    assert p.shards == max(p.shards_for_memory, p.shards_for_cpu) == 6
    cost = 0.8 * FIGURES["cluster_rest_hit_us"].value + 0.2 * FIGURES["cluster_miss_us"].value
    assert p.serving_cores == pytest.approx(1_000_000 * cost / 1e6 / 0.6)
    assert p.figures == (
        "bytes_per_value",
        "cluster_redis_us_per_entity",
        "cluster_rest_hit_us",
        "cluster_miss_us",
    )


def test_one_node_is_priced_with_one_nodes_figures() -> None:
    p = plan(1_000_000, 50, 100_000, hit_rate=0.8)
    assert p.shards == 1
    assert p.redis_cores == pytest.approx(20_000 * FIGURES["redis_us_per_entity"].value / 1e6)
    cost = 0.8 * FIGURES["rest_hit_us"].value + 0.2 * FIGURES["miss_us"].value
    assert p.serving_cores == pytest.approx(100_000 * cost / 1e6 / 0.6)
    assert p.figures == ("bytes_per_value", "redis_us_per_entity", "rest_hit_us", "miss_us")


def test_without_the_l1_every_lookup_is_a_planned_read() -> None:
    p = plan(100_000_000, 50, 1_000_000, api="grpc", l1=False)
    assert p.redis_cores == pytest.approx(FIGURES["cluster_redis_us_per_entity"].value)
    assert p.serving_cores == pytest.approx(FIGURES["cluster_grpc_planned_us"].value / 0.6)
    assert p.figures[-1] == "cluster_grpc_planned_us"
    with_l1 = plan(100_000_000, 50, 1_000_000, api="grpc", hit_rate=0.8)
    assert with_l1.redis_cores == pytest.approx(p.redis_cores * 0.2)


def test_more_lookups_need_more_redis_shards_not_more_memory() -> None:
    small = plan(1_000_000, 50, 10_000, hit_rate=0.0)
    busy = plan(1_000_000, 50, 10_000_000, hit_rate=0.0)
    assert small.shards_for_memory == busy.shards_for_memory == 1
    assert busy.shards_for_cpu > small.shards_for_cpu
    assert busy.shards == busy.shards_for_cpu
