"""The rows of the YCSB table: which binding, which store, which servers each row starts, and
the registry the serving rows serve YCSB's records with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENTITY, GROUP, PREFIX = "ycsb_user", "ycsb", "u"
SERVING = ("ServingClient", "GrpcServingClient")  # the bindings of the serving API


@dataclass(frozen=True)
class RowSpec:
    name: str
    label: str
    db: str  # binding class
    store: str  # "redis", "cluster" or "postgres": whose CPU is measured
    props: dict[str, str] = field(default_factory=dict)
    loads: bool = True  # False: reads the records the row ``reads`` loaded
    reads: str = "hash"
    serve_flags: tuple[str, ...] = ()  # extra options of feature-store serve


ROWS = [
    RowSpec("hash", "Redis, hash per entity (project layout)", "HashClient", "redis"),
    RowSpec(
        "serving",
        "serving API (REST), L1 cache on (default)",
        "ServingClient",
        "redis",
        loads=False,
    ),
    RowSpec(
        "serving-nocache",
        "serving API (REST), --no-cache",
        "ServingClient",
        "redis",
        loads=False,
        serve_flags=("--no-cache",),
    ),
    RowSpec(
        "serving-grpc",
        "serving API (gRPC), L1 cache on (default)",
        "GrpcServingClient",
        "redis",
        loads=False,
    ),
    RowSpec(
        "serving-grpc-nocache",
        "serving API (gRPC), --no-cache",
        "GrpcServingClient",
        "redis",
        loads=False,
        serve_flags=("--no-cache",),
    ),
    RowSpec("flat", "Redis, flat strings, MGET", "FlatClient", "redis", {"flat.batch": "mget"}),
    RowSpec(
        "flat-pipeline",
        "Redis, flat strings, pipelined GETs",
        "FlatClient",
        "redis",
        {"flat.batch": "pipeline"},
    ),
    RowSpec("hash-cluster", "Redis Cluster (3 masters), hash", "HashClient", "cluster"),
    *(
        RowSpec(
            f"serving{'-grpc' if grpc else ''}-cluster{'-nocache' if off else ''}",
            f"serving API ({'gRPC' if grpc else 'REST'}) on the Redis Cluster, "
            + ("--no-cache" if off else "L1 cache on (default)"),
            "GrpcServingClient" if grpc else "ServingClient",
            "cluster",
            loads=False,
            reads="hash-cluster",
            serve_flags=("--no-cache",) if off else (),
        )
        for grpc in (False, True)
        for off in (False, True)
    ),
    RowSpec(
        "flat-cluster", "Redis Cluster (3 masters), flat, pipelined GETs", "FlatClient", "cluster"
    ),
    RowSpec("postgres", "PostgreSQL, key-value table, IN (...)", "PostgresClient", "postgres"),
]
ROW_NAMES = [r.name for r in ROWS]

# PostgreSQL may lose the last commits on a crash, as Redis's AOF with everysec may lose the
# last second: both durable to the OS, fsync in the background.
POSTGRES_SETTINGS = {"synchronous_commit": "off", "max_connections": "300"}  # 256 threads


def registry_text(fields: int) -> str:
    features = "".join(f"      field{i}: string\n" for i in range(fields))
    return (
        "# Written by benchmarks/ycsb/run: YCSB's records as a feature group.\n"
        "version: 1\n"
        "entities:\n"
        f"  {ENTITY}:\n"
        f"    prefix: {PREFIX}\n"
        "    id_type: string\n"
        "    ttl: 7d\n"
        "feature_groups:\n"
        f"  {GROUP}:\n"
        f"    entity: {ENTITY}\n"
        "    features:\n" + features
    )
