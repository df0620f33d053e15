"""The commands without Spark: ``demo``, ``get``, ``plan`` and ``registry`` (validate,
lock, sample)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from feature_store import sample
from feature_store.batch import BatchResult, EntityId, Status
from feature_store.embedded import EmbeddedRedis
from feature_store.errors import RequestError
from feature_store.layout import IdType
from feature_store.registry import default_lock_path, load_registry, write_lock
from feature_store.settings import Settings
from feature_store.store import FeatureStore, listpack_value_needed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="generate sample data, write it, read a batch back and print it",
        description="End to end on the standard shape: generate, write, read back, print.",
    )
    demo.add_argument("--entities", type=int, default=10_000, help="entities to write")
    demo.add_argument("--batch", type=int, default=5, help="entities to read back")
    demo.add_argument("--seed", type=int, default=0)
    add_redis_args(demo)
    demo.set_defaults(func=run_demo)

    get = sub.add_parser(
        "get",
        help="read features of some entities and print them as a table (or JSON lines)",
        description="Read a batch in one round trip and print values, statuses and ages.",
    )
    get.add_argument("entity", help="entity type, e.g. consumer")
    get.add_argument("ids", nargs="+", help="entity ids")
    get.add_argument("-f", "--features", nargs="*", default=[], help="feature names")
    get.add_argument("-g", "--groups", nargs="*", default=[], help="feature groups")
    get.add_argument(
        "--registry",
        type=Path,
        help="registry file, or 'sample' for the built-in one "
        "(default: FEATURE_STORE_REGISTRY or features.yaml)",
    )
    get.add_argument(
        "--json", action="store_true", help="one JSON object per entity instead of a table"
    )
    add_redis_args(get)
    get.set_defaults(func=run_get)

    plan_cmd = sub.add_parser(
        "plan",
        help="capacity plan: Redis memory and shards, serving cores (from measured figures)",
        description="Memory per shard, Redis shards and serving cores for a deployment, "
        "from the figures this project measured (each printed with its source).",
    )
    plan_cmd.add_argument("--entities", type=int, required=True)
    plan_cmd.add_argument("--features", type=int, required=True, help="features per entity")
    plan_cmd.add_argument(
        "--lookups-per-second", type=float, required=True, help="entity lookups per second"
    )
    plan_cmd.add_argument("--hit-rate", type=float, default=0.8, help="L1 hit rate (0.8)")
    plan_cmd.add_argument("--api", choices=("rest", "grpc"), default="rest")
    plan_cmd.add_argument(
        "--l1",
        choices=("on", "off"),
        default="on",
        help="with the L1 at --hit-rate (on), or every lookup read from Redis (off)",
    )
    plan_cmd.add_argument("--node-memory-gib", type=float, default=25.0, help="per Redis node")
    plan_cmd.add_argument("--replicas", type=int, default=1, help="replicas per master (1)")
    plan_cmd.set_defaults(func=run_plan)

    reg = sub.add_parser("registry", help="validate or lock a registry file")
    reg_sub = reg.add_subparsers(dest="registry_command", required=True, metavar="ACTION")
    validate = reg_sub.add_parser("validate", help="load a registry and print a summary")
    validate.add_argument("path", type=Path)
    validate.set_defaults(func=run_validate)
    lock = reg_sub.add_parser("lock", help="record the registry as deployed (writes the lock)")
    lock.add_argument("path", type=Path)
    lock.add_argument(
        "--accept-changes",
        action="store_true",
        help="record type or prefix changes of deployed features (only once no old values remain)",
    )
    lock.set_defaults(func=run_lock)
    sample_cmd = reg_sub.add_parser(
        "sample", help="print the registry of the standard benchmark shape (sample data)"
    )
    sample_cmd.set_defaults(func=run_sample)


def add_redis_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url",
        help="redis://, rediss://, unix://; add ?cluster=true for Redis Cluster "
        "(default: FEATURE_STORE_REDIS_URL, else an embedded redis-server)",
    )
    parser.add_argument(
        "--data-dir", type=Path, help="where the embedded Redis keeps its data (with AOF)"
    )


def add_durability_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--write-durability",
        metavar="replicas=N[,timeout=MS]",
        help=f"{what} is acknowledged only once N replicas hold it (Redis's WAIT, default "
        "timeout 500 ms); default: FEATURE_STORE_WRITE_DURABILITY, else none (asynchronous "
        "replication: a failover may lose an acknowledged write). See docs/reliability.md",
    )


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        redis_url=getattr(args, "redis_url", None),
        data_dir=getattr(args, "data_dir", None),
        registry=getattr(args, "registry", None),
        write_durability=getattr(args, "write_durability", None),
    )


@contextlib.contextmanager
def redis_url(settings: Settings, *, quiet: bool = False) -> Iterator[str]:
    """The configured Redis URL, or an embedded redis-server's for as long as it is needed."""
    if settings.redis_url is not None:
        yield settings.redis_url
        return
    with EmbeddedRedis(settings.data_dir / "redis") as server:
        if not quiet:
            print(f"embedded Redis at {server.url}, data in {server.data_dir}")
        yield server.url


def run_demo(args: argparse.Namespace) -> int:
    registry = sample.registry()
    settings = settings_from(args)
    with redis_url(settings) as url, FeatureStore.connect(url, registry) as store:
        store.check_server()
        t0 = time.perf_counter()
        stats = store.write(sample.GROUP, sample.rows(args.entities, seed=args.seed))
        elapsed = time.perf_counter() - t0
        print(
            f"wrote {stats.entities:,} entities, {stats.values_written:,} feature values "
            f"in {elapsed:.2f}s ({stats.values_written / elapsed:,.0f} values/s)"
        )
        ids = [*range(args.batch), -1]  # sample ids start at 0: -1 was never written
        t0 = time.perf_counter()
        result = store.read(sample.ENTITY, ids, groups=[sample.GROUP])
        ms = (time.perf_counter() - t0) * 1000
        print(f"read {len(ids)} entities x {len(result.features)} features in {ms:.2f} ms")
        shown = ["float_00", "float_01", "float_02", "int_0", "int_list_0", "embedding_0"]
        print(format_table(result, shown))
    return 0


def run_get(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    registry = load_registry(sample.resolve(settings.registry))
    entity = registry.entity(args.entity)
    ids: list[EntityId] = (
        [_int_id(i) for i in args.ids] if entity.id_type is IdType.INT else list(args.ids)
    )
    with redis_url(settings, quiet=True) as url, FeatureStore.connect(url, registry) as store:
        result = store.read(args.entity, ids, args.features, args.groups)
    for e in result.errors:  # the rest of the batch is printed as usual
        print(f"error: entity {e.entity_id!r} group {e.group}: {e.message}", file=sys.stderr)
    if not args.json:
        print(format_table(result))
        return 0
    names = [f.name for f in result.features]
    for row in result.rows:
        line = {
            "id": row.entity_id,
            "values": dict(zip(names, row.values, strict=True)),
            "statuses": dict(zip(names, (s.value for s in row.statuses), strict=True)),
            "ages": row.ages,
        }
        print(orjson.dumps(line).decode())
    return 0


def _int_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RequestError(f"entity id {text!r} is not an integer") from None


def run_plan(args: argparse.Namespace) -> int:
    from feature_store.capacity import describe, plan

    try:
        p = plan(
            args.entities,
            args.features,
            args.lookups_per_second,
            hit_rate=args.hit_rate,
            api=args.api,
            l1=args.l1 == "on",
            node_memory_gib=args.node_memory_gib,
        )
    except ValueError as e:
        raise RequestError(str(e)) from None
    print("\n".join(describe(p, args.replicas, args.node_memory_gib)))
    return 0


def run_sample(args: argparse.Namespace) -> int:
    print(sample.registry_text(), end="")
    return 0


def format_table(result: BatchResult, names: Sequence[str] | None = None) -> str:
    """A read as a table for people: id, age, the features' values (lists shortened), and
    the statuses that are not "present". A missing value shows as "-", a stale one with "*".
    """
    index = [i for i, f in enumerate(result.features) if names is None or f.name in names]
    header = ["id", "age", *(result.features[i].name for i in index), "statuses"]
    rows = [header]
    for row in result.rows:
        ages = {a for a in row.ages.values() if a is not None}
        age = f"{max(ages)}s" if ages else "-"
        cells = [_cell(row.values[i], row.statuses[i]) for i in index]
        counts = Counter(s.value for s in row.statuses)
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        rows.append([str(row.entity_id), age, *cells, summary])
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: object, status: Status) -> str:
    if status is Status.MISSING:
        return "-"
    if status is Status.ERROR:
        return "!error"
    text = _scalar(value)
    if isinstance(value, list):
        shown = ", ".join(_scalar(v) for v in value[:3])
        text = f"[{shown}, ... {len(value)} items]" if len(value) > 3 else f"[{shown}]"
    return f"{text}*" if status is Status.STALE else text


def _scalar(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return repr(value) if len(value) <= 24 else repr(value[:21] + "...")
    return str(value)


def run_validate(args: argparse.Namespace) -> int:
    registry = load_registry(args.path)
    for e in registry.entities.values():
        print(f"entity {e.name}: prefix {e.prefix!r}, {e.id_type.value} ids, ttl {e.ttl_seconds}s")
    for g in registry.groups.values():
        types = ", ".join(f"{f.name}:{f.codec.signature}" for f in g.features)
        age = f"max_age {g.max_age_seconds}s" if g.max_age_seconds else "no max_age"
        print(f"group {g.name} ({g.entity.name}, {age}): {types}")
    print(f"hash-max-listpack-value needed: {listpack_value_needed(registry)}")
    print(f"fingerprint {registry.fingerprint()}")
    return 0


def run_lock(args: argparse.Namespace) -> int:
    registry = load_registry(args.path, check_lock=False)
    lock = default_lock_path(args.path)
    fp = write_lock(registry, lock, accept_changes=args.accept_changes)
    print(f"wrote {lock} (fingerprint {fp})")
    return 0
