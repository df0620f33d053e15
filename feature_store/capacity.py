"""Capacity planning from measured figures: memory per shard, Redis shards, serving cores.

``feature-store plan --entities N --features F --lookups-per-second L`` answers with the
arithmetic below and names the recorded benchmark result behind every figure it uses
(``FIGURES``: a results file, the row of its table and the column; tests/unit/
test_capacity.py reads each from there):

- memory: N x F x bytes per value; a Redis node is filled to ``fill`` of its memory, and
  each replica holds a full copy of its master's data;
- Redis CPU: the lookups that reach Redis (with the L1: L x (1 - hit rate); without: L)
  x Redis CPU per entity; Redis runs commands on one core, kept below
  ``redis_core_load`` of it;
- shards: enough for the memory and for the CPU, whichever needs more;
- serving CPU: with the L1, L x (hit rate x cost of a hit + (1 - hit rate) x cost of a
  miss, which the front loads on its own connections and stores); without it, L x the
  cost of a planned read on the native front; at ``serving_core_load`` of each core.

A plan of more than one shard is a Redis Cluster: Redis's CPU per entity (the masters'
summed), a planned read's and a hit's are then the cluster's, measured on three masters
(``cluster_*``); a miss's is one node's (not measured on a cluster).

The figures are from the standard benchmark shape (50 features, 40 of them floats) on the
native fronts; a registry of other shapes costs other amounts, which is why each figure
names its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Figure:
    value: float
    unit: str
    results: str  # the results file, from the repository's root
    row: tuple[str, ...]  # the first cells of its row in the file's table
    column: str  # the heading of its column there

    @property
    def source(self) -> str:
        return f"{self.results}: the row {' | '.join(self.row)}, column {self.column!r}"


DATAPLANE = "benchmarks/results/dataplane.md"
MISSES = "benchmarks/results/l1_misses.md"
CLUSTER_MISSES = "benchmarks/results/l1_misses_cluster.md"
CLUSTER = "benchmarks/results/cluster_dataplane.md"

FIGURES = {
    "bytes_per_value": Figure(
        22.6,
        "bytes",
        "benchmarks/results/memory.md",
        ("4 full layout, shipped config",),
        "bytes/value",
    ),
    "redis_us_per_entity": Figure(
        6.6, "µs CPU", DATAPLANE, ("native", "rest", "off", "10", "8"), "Redis µs/entity"
    ),
    "rest_planned_us": Figure(
        8.8, "µs CPU", DATAPLANE, ("native", "rest", "off", "10", "8"), "server µs/entity"
    ),
    "rest_hit_us": Figure(
        1.7, "µs CPU", DATAPLANE, ("native", "rest", "on", "10", "8"), "server µs/entity"
    ),
    "grpc_planned_us": Figure(
        5.7, "µs CPU", DATAPLANE, ("native", "grpc", "off", "10", "8"), "server µs/entity"
    ),
    "grpc_hit_us": Figure(
        2.2, "µs CPU", DATAPLANE, ("native", "grpc", "on", "10", "8"), "server µs/entity"
    ),
    # on a 3-master Redis Cluster (the masters' CPU summed)
    "cluster_redis_us_per_entity": Figure(
        11.5, "µs CPU", CLUSTER, ("cluster", "native", "rest", "off", "10"), "Redis µs/entity"
    ),
    "cluster_rest_planned_us": Figure(
        14.1, "µs CPU", CLUSTER, ("cluster", "native", "rest", "off", "10"), "server µs/entity"
    ),
    "cluster_rest_hit_us": Figure(
        2.6, "µs CPU", CLUSTER, ("cluster", "native", "rest", "on", "10"), "server µs/entity"
    ),
    "cluster_grpc_planned_us": Figure(
        9.8, "µs CPU", CLUSTER, ("cluster", "native", "grpc", "off", "10"), "server µs/entity"
    ),
    "cluster_grpc_hit_us": Figure(
        2.3, "µs CPU", CLUSTER, ("cluster", "native", "grpc", "on", "10"), "server µs/entity"
    ),
    # a miss with the L1 on is loaded by the front itself (native/src/hits/load.rs), stored,
    # and answered from the cache; priced as one that makes a new entry (measured over
    # REST, entries evicted before their next lookup): a reload that finds the values its
    # expired entry holds keeps that entry and costs less (the row rest | miss | 8). The
    # column measured beside the L1 off: the cell's ratio to it x the L1 off's median
    "miss_us": Figure(
        10.08, "µs CPU per entity read", MISSES, ("rest", "miss, cold", "8"), "paired µs/entity"
    ),
    # the same on a 3-master Redis Cluster (the loads route by slot)
    "cluster_miss_us": Figure(
        13.00,
        "µs CPU per entity read",
        CLUSTER_MISSES,
        ("rest", "miss, cold", "8"),
        "paired µs/entity",
    ),
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
    figures: tuple[str, ...]  # the names of the FIGURES it used


def plan(
    entities: int,
    features: int,
    lookups_per_second: float,
    *,
    hit_rate: float = 0.8,
    api: str = "rest",
    l1: bool = True,
    node_memory_gib: float = 25.0,
    fill: float = 0.75,
    redis_core_load: float = 0.6,
    serving_core_load: float = 0.6,
) -> Plan:
    """The plan for ``entities`` x ``features`` values and ``lookups_per_second`` entity
    lookups (one entity of one request is one lookup), with the L1 at ``hit_rate`` or
    (``l1`` false) without it."""
    if entities < 1 or features < 1 or lookups_per_second < 0:
        raise ValueError("entities and features must be positive, lookups not negative")
    if not 0 <= hit_rate <= 1:
        raise ValueError("hit_rate must be in [0, 1]")
    if api not in ("rest", "grpc"):
        raise ValueError("api must be rest or grpc")
    data = entities * features * FIGURES["bytes_per_value"].value
    for_memory = max(1, math.ceil(data / (node_memory_gib * GIB * fill)))
    reads = lookups_per_second * (1 - hit_rate) if l1 else lookups_per_second

    def cpu_shards(redis_figure: str) -> tuple[float, int]:
        cores = reads * FIGURES[redis_figure].value / 1e6
        return cores, max(1, math.ceil(cores / redis_core_load))

    redis_figure, on = "redis_us_per_entity", ""
    redis_cores, for_cpu = cpu_shards(redis_figure)
    if max(for_memory, for_cpu) > 1:  # a cluster: its own figures
        redis_figure, on = "cluster_redis_us_per_entity", "cluster_"
        redis_cores, for_cpu = cpu_shards(redis_figure)
    shards = max(for_memory, for_cpu)
    serving_figures: tuple[str, ...]
    if l1:
        serving_figures = (f"{on}{api}_hit_us", f"{on}miss_us")
        hit, miss = (FIGURES[name].value for name in serving_figures)
        per_lookup = hit_rate * hit + (1 - hit_rate) * miss
    else:
        serving_figures = (f"{on}{api}_planned_us",)
        per_lookup = FIGURES[serving_figures[0]].value
    serving = lookups_per_second * per_lookup / 1e6
    return Plan(
        data_bytes=data,
        shards_for_memory=for_memory,
        redis_cores=redis_cores,
        shards_for_cpu=for_cpu,
        shards=shards,
        bytes_per_shard=data / shards,
        serving_cores=serving / serving_core_load,
        figures=("bytes_per_value", redis_figure, *serving_figures),
    )


def describe(p: Plan, replicas: int, node_memory_gib: float) -> list[str]:
    """The plan as lines for people, each figure with its source."""
    lines = [
        f"data: {p.data_bytes / GIB:,.1f} GiB ({FIGURES['bytes_per_value'].value} bytes per value)",
        f"Redis shards: {p.shards}{', a Redis Cluster' if p.shards > 1 else ''} (memory "
        f"needs {p.shards_for_memory} at "
        f"{node_memory_gib:g} GiB per node; CPU needs {p.shards_for_cpu}, "
        f"{p.redis_cores:,.2f} cores of reads)",
        f"memory per shard: {p.bytes_per_shard / GIB:,.1f} GiB; "
        f"with {replicas} replica(s) per master: {p.shards * (1 + replicas)} Redis nodes, "
        f"{p.data_bytes * (1 + replicas) / GIB:,.1f} GiB in all",
        f"serving: {p.serving_cores:,.1f} cores (worker processes, one per core)",
        "",
        "figures used (the standard benchmark shape; re-measure for yours):",
    ]
    lines += [
        f"  {name} = {FIGURES[name].value} {FIGURES[name].unit}: {FIGURES[name].source}"
        for name in p.figures
    ]
    return lines
