"""Capacity planning from measured figures: memory per shard, Redis shards, serving cores.

``feature-store plan --entities N --features F --lookups-per-second L`` answers with the
arithmetic below and names the recorded benchmark result behind every figure it uses
(``FIGURES``; tests/unit/test_capacity.py checks each against its results file):

- memory: N x F x bytes per value; a Redis node is filled to ``fill`` of its memory, and
  each replica holds a full copy of its master's data;
- Redis CPU: L x (1 - hit rate) x Redis CPU per entity; Redis runs commands on one core,
  kept below ``redis_core_load`` of it;
- shards: enough for the memory and for the CPU, whichever needs more;
- serving CPU: L x (hit rate x cost of a hit + (1 - hit rate) x cost of a miss), at
  ``serving_core_load`` of each core.

The figures are from the standard benchmark shape (50 features, 40 of them floats); a
registry of other shapes costs other amounts, which is why each figure names its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Figure:
    value: float
    unit: str
    source: str  # the results file and the row or line it comes from


FIGURES = {
    "bytes_per_value": Figure(
        22.4, "bytes", "benchmarks/results/memory.md: full layout, shipped config"
    ),
    "redis_us_per_entity": Figure(
        5.9, "µs CPU", "benchmarks/results/cost.md: rest, L1 off, batch 10 (Redis's own CPU)"
    ),
    "rest_miss_us": Figure(21.9, "µs CPU", "benchmarks/results/cost.md: rest, L1 off, batch 10"),
    "rest_hit_us": Figure(7.2, "µs CPU", "benchmarks/results/cost.md: rest, L1 on, batch 10"),
    "grpc_miss_us": Figure(19.6, "µs CPU", "benchmarks/results/cost.md: grpc, L1 off, batch 10"),
    "grpc_hit_us": Figure(4.2, "µs CPU", "benchmarks/results/cost.md: grpc, L1 on, batch 10"),
}

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Plan:
    data_bytes: float
    shards_for_memory: int
    redis_cores: float
    shards_for_cpu: int
    shards: int
    bytes_per_shard: float
    serving_cores: float


def plan(
    entities: int,
    features: int,
    lookups_per_second: float,
    *,
    hit_rate: float = 0.8,
    api: str = "rest",
    node_memory_gib: float = 25.0,
    fill: float = 0.75,
    redis_core_load: float = 0.6,
    serving_core_load: float = 0.6,
) -> Plan:
    """The plan for ``entities`` x ``features`` values and ``lookups_per_second`` entity
    lookups (one entity of one request is one lookup)."""
    if entities < 1 or features < 1 or lookups_per_second < 0:
        raise ValueError("entities and features must be positive, lookups not negative")
    if not 0 <= hit_rate <= 1:
        raise ValueError("hit_rate must be in [0, 1]")
    if api not in ("rest", "grpc"):
        raise ValueError("api must be rest or grpc")
    data = entities * features * FIGURES["bytes_per_value"].value
    for_memory = max(1, math.ceil(data / (node_memory_gib * GIB * fill)))
    misses = lookups_per_second * (1 - hit_rate)
    redis_cores = misses * FIGURES["redis_us_per_entity"].value / 1e6
    for_cpu = max(1, math.ceil(redis_cores / redis_core_load))
    shards = max(for_memory, for_cpu)
    hit, miss = FIGURES[f"{api}_hit_us"].value, FIGURES[f"{api}_miss_us"].value
    serving = lookups_per_second * (hit_rate * hit + (1 - hit_rate) * miss) / 1e6
    return Plan(
        data_bytes=data,
        shards_for_memory=for_memory,
        redis_cores=redis_cores,
        shards_for_cpu=for_cpu,
        shards=shards,
        bytes_per_shard=data / shards,
        serving_cores=serving / serving_core_load,
    )


def describe(p: Plan, replicas: int, node_memory_gib: float) -> list[str]:
    """The plan as lines for people, each figure with its source."""
    lines = [
        f"data: {p.data_bytes / GIB:,.1f} GiB ({FIGURES['bytes_per_value'].value} bytes per value)",
        f"Redis shards: {p.shards} (memory needs {p.shards_for_memory} at "
        f"{node_memory_gib:g} GiB per node; CPU needs {p.shards_for_cpu}, "
        f"{p.redis_cores:,.2f} cores of reads)",
        f"memory per shard: {p.bytes_per_shard / GIB:,.1f} GiB; "
        f"with {replicas} replica(s) per master: {p.shards * (1 + replicas)} Redis nodes, "
        f"{p.data_bytes * (1 + replicas) / GIB:,.1f} GiB in all",
        f"serving: {p.serving_cores:,.1f} cores (worker processes, one per core)",
        "",
        "figures used (the standard benchmark shape; re-measure for yours):",
    ]
    lines += [f"  {name} = {f.value} {f.unit}: {f.source}" for name, f in FIGURES.items()]
    return lines
