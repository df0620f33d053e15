"""Bytes per stored feature value in Redis, for several layouts of the same data.

    python3 benchmarks/memory.py [--entities 100000] [--out benchmarks/results/memory.md]

Loads the standard benchmark shape (feature_store/sample_features.yaml) once per layout
into a fresh embedded redis-server and reports the ``used_memory`` delta per value. The
layouts:

1. flat: one string key per (entity, feature), readable names, naive values (str/JSON)
2. hash: one hash per entity, readable field names, naive values
3. hash + xxh32: the same with 4-byte xxHash32 field names
4. full: this project's layout (xxh32 fields, codecs, freshness field, TTL), with the
   listpack limit of the Redis we ship (layout.LISTPACK_SETTINGS)

and the variants behind the layout decisions: decimal-text instead of raw 4-byte fields;
the full layout at Redis's default listpack limit (64 bytes: embeddings push the hash
into a hashtable); and a companion key per entity holding the embeddings, so that the main
hash stays listpack at the default limit. For each, the server's own HMGET cost
(``usec_per_call`` in INFO commandstats) on a batch of full-entity reads shows what the
encoding costs at read time.

The flat layout is loaded without TTLs, which favours it: a real flat layout needs an
expiry per key, at about 50 more bytes each.

And Feast's own Redis online store, in the same run, on the same data: a Feast repository
of the standard shape (``sample.feast_repo``), ``feast apply``, then ``materialize`` of
every row through Feast's SDK into a fresh embedded Redis, once with the listpack limit we
ship and once with Redis's defaults (what a Feast deployment runs unless told otherwise).
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import redis

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.embedded import EmbeddedRedis
from feature_store.layout import LISTPACK_SETTINGS, unguarded
from feature_store.registry import FeatureGroup
from feature_store.serialization import field_name

Command = tuple[object, ...]
Rows = list[tuple[int, dict[str, object]]]
REDIS_DEFAULTS = {"hash-max-listpack-value": "64", "hash-max-listpack-entries": "128"}
CHUNK = 500
READ_SAMPLE = 2000  # entities read back to measure the server's HMGET cost
SUBSETS = (5, 10, 15, 20, 25, 30, 40, 50)  # fields of an HMGET, for the HGETALL crossover


def naive(value: object) -> bytes:
    if isinstance(value, list):
        return orjson.dumps(value)
    return str(value).encode()


def flat(rows: Rows, group: FeatureGroup) -> Iterator[Command]:
    for entity_id, values in rows:
        for name, value in values.items():
            yield ("SET", f"consumer:{entity_id}:{name}", naive(value))


def hash_readable(rows: Rows, group: FeatureGroup) -> Iterator[Command]:
    for entity_id, values in rows:
        args: list[object] = []
        for name, value in values.items():
            args += (name, naive(value))
        yield ("HSET", f"consumer:{entity_id}", *args)


def hash_xxh32(rows: Rows, group: FeatureGroup) -> Iterator[Command]:
    for entity_id, values in rows:
        args: list[object] = []
        for name, value in values.items():
            args += (field_name(name), naive(value))
        yield ("HSET", f"consumer:{entity_id}", *args)


def full(rows: Rows, group: FeatureGroup) -> Iterator[Command]:
    for i in range(0, len(rows), CHUNK):
        for cmd in plan_write(group, rows[i : i + CHUNK]).commands:
            yield from unguarded(cmd)  # the stored bytes are the same; no script to load


def full_decimal_fields(rows: Rows, group: FeatureGroup) -> Iterator[Command]:
    """The full layout with each 4-byte field written as the decimal text of the same hash."""
    for cmd in full(rows, group):
        if cmd[0] == "HSET":
            args = list(cmd[2:])
            args[0::2] = [str(int.from_bytes(f, "big")).encode() for f in args[0::2]]  # type: ignore[arg-type]
            yield ("HSET", cmd[1], *args)
        else:
            yield cmd


def full_companion(rows: Rows, group: FeatureGroup) -> Iterator[Command]:
    """Embeddings in a second hash per entity, so the main hash fits the default limit."""
    embeddings = {f.field for f in group.features if f.name.startswith("embedding")}
    for cmd in full(rows, group):
        if cmd[0] != "HSET":
            yield cmd
            if cmd[0] == "EXPIRE":
                yield ("EXPIRE", cmd[1] + b":e", cmd[2])  # type: ignore[operator]
            continue
        pairs = list(zip(cmd[2::2], cmd[3::2], strict=True))
        yield ("HSET", cmd[1], *[x for f, v in pairs if f not in embeddings for x in (f, v)])
        yield ("HSET", cmd[1] + b":e", *[x for f, v in pairs if f in embeddings for x in (f, v)])  # type: ignore[operator]


@dataclass(frozen=True)
class Layout:
    name: str
    build: Callable[[Rows, FeatureGroup], Iterable[Command]]
    config: dict[str, str]
    companion: bool = False  # read back the embeddings from a second key
    read_back: bool = False  # measure the server's cost of reading entities
    subsets: bool = False  # and of reading the first k fields, for k in SUBSETS


@dataclass(frozen=True)
class Result:
    layout: str
    used_bytes: int
    values: int
    entities: int
    keys: int
    encodings: str
    load_s: float
    hmget_usec: float | None  # server time to read one entity's 50 values with HMGET
    hgetall_usec: float | None  # ... with HGETALL
    # server time of an HMGET of the first k fields, by k: where HGETALL becomes cheaper
    subsets: dict[int, float] | None = None

    @property
    def per_value(self) -> float:
        return self.used_bytes / self.values


def read_commands(layout: Layout, group: FeatureGroup, i: int, whole: bool) -> list[Command]:
    key = f"c:{i}".encode()
    fields = [f.field for f in group.features] + [group.freshness_field]
    if not layout.companion:
        return [("HGETALL", key)] if whole else [("HMGET", key, *fields)]
    emb = [f.field for f in group.features if f.name.startswith("embedding")]
    rest = [f for f in fields if f not in emb]
    if whole:
        return [("HGETALL", key), ("HGETALL", key + b":e")]
    return [("HMGET", key, *rest), ("HMGET", key + b":e", *emb)]


def load(client: redis.Redis, commands: Iterable[Command]) -> None:
    pipe = client.pipeline(transaction=False)
    for n, cmd in enumerate(commands, 1):
        pipe.execute_command(*cmd)
        if n % 5000 == 0:
            pipe.execute()
    pipe.execute()


def server_usec(client: redis.Redis, commands: list[Command], name: str, entities: int) -> float:
    """The server's own time (INFO commandstats) per entity read, free of client noise."""
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for cmd in commands:
        pipe.execute_command(*cmd)
    pipe.execute()
    return float(client.info("commandstats")[f"cmdstat_{name}"]["usec"]) / entities


def measure(layout: Layout, rows: Rows, group: FeatureGroup, workdir: Path) -> Result:
    data_dir = workdir / layout.name.replace(" ", "_").replace(",", "")
    with EmbeddedRedis(data_dir, persistence=False, extra_config=layout.config) as server:
        client = redis.Redis.from_url(server.url)
        before = int(client.info("memory")["used_memory"])
        t0 = time.perf_counter()
        load(client, layout.build(rows, group))
        load_s = time.perf_counter() - t0
        used = int(client.info("memory")["used_memory"]) - before
        keys = int(client.dbsize())
        encodings = {
            client.object("encoding", k) for k in client.scan_iter(count=1000, _type="hash")
        }
        hmget = hgetall = None
        if layout.read_back:
            n = min(READ_SAMPLE, len(rows))
            cmds = [c for i in range(n) for c in read_commands(layout, group, i, whole=False)]
            hmget = server_usec(client, cmds, "hmget", n)
            cmds = [c for i in range(n) for c in read_commands(layout, group, i, whole=True)]
            hgetall = server_usec(client, cmds, "hgetall", n)
        subsets = None
        if layout.subsets:
            fields = [f.field for f in group.features]
            subsets = {}
            for k in SUBSETS:
                n = min(READ_SAMPLE, len(rows))
                cmds = [("HMGET", f"c:{i}".encode(), *fields[:k]) for i in range(n)]
                subsets[k] = server_usec(client, cmds, "hmget", n)
        client.close()
    return Result(
        layout=layout.name,
        used_bytes=used,
        values=len(rows) * len(group.features),
        entities=len(rows),
        keys=keys,
        encodings=",".join(sorted(e.decode() for e in encodings if e)) or "-",
        load_s=load_s,
        hmget_usec=hmget,
        hgetall_usec=hgetall,
        subsets=subsets,
    )


def measure_feast(
    name: str, config: dict[str, str], entities: int, seed: int, workdir: Path
) -> Result:
    """Feast's Redis online store, loaded by Feast's SDK (``materialize``)."""
    from datetime import UTC, datetime

    import feast

    data_dir = workdir / name.replace(" ", "_").replace(",", "").replace("'", "")
    with EmbeddedRedis(data_dir, persistence=False, extra_config=config) as server:
        client = redis.Redis.from_url(server.url)
        before = int(client.info("memory")["used_memory"])
        address = server.url.split("//")[1]
        repo = sample.feast_repo(
            data_dir / "repo",
            f'  type: redis\n  connection_string: "{address}"',
            entities,
            seed=seed,
            event_time=time.time() - 3600,
        )
        feast_cli = Path(sys.executable).parent / "feast"
        subprocess.run([str(feast_cli), "apply"], cwd=repo, check=True, capture_output=True)
        t0 = time.perf_counter()
        feast.FeatureStore(repo_path=str(repo)).materialize(
            datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
        )
        load_s = time.perf_counter() - t0
        used = int(client.info("memory")["used_memory"]) - before
        keys = int(client.dbsize())
        encodings = {
            client.object("encoding", k) for k in client.scan_iter(count=1000, _type="hash")
        }
        client.close()
    return Result(
        layout=name,
        used_bytes=used,
        values=entities * 50,
        entities=entities,
        keys=keys,
        encodings=",".join(sorted(e.decode() for e in encodings if e)) or "-",
        load_s=load_s,
        hmget_usec=None,
        hgetall_usec=None,
    )


def fmt(usec: float | None) -> str:
    return "" if usec is None else f"{usec:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args()

    group = sample.registry().group(sample.GROUP)
    t0 = time.perf_counter()
    rows: Rows = list(sample.rows(args.entities, seed=args.seed))
    print(f"generated {args.entities:,} entities x 50 features in {time.perf_counter() - t0:.1f}s")
    ours = dict(LISTPACK_SETTINGS)
    layouts = [
        Layout("1 flat keys, readable names, naive values", flat, REDIS_DEFAULTS),
        Layout("2 hash, readable names, naive values", hash_readable, ours),
        Layout("3 hash, xxh32 names, naive values", hash_xxh32, ours),
        Layout("4 full layout, shipped config", full, ours, read_back=True, subsets=True),
        Layout("4a full, decimal-text fields", full_decimal_fields, ours),
        Layout(
            "4b full, Redis default listpack limit",
            full,
            REDIS_DEFAULTS,
            read_back=True,
            subsets=True,
        ),
        Layout(
            "4c full, embeddings in a companion key, default limit",
            full_companion,
            REDIS_DEFAULTS,
            companion=True,
            read_back=True,
        ),
    ]
    feast_layouts = [
        ("5 Feast 0.67's Redis store, shipped config", ours),
        ("5b Feast 0.67's Redis store, Redis default listpack limit", REDIS_DEFAULTS),
    ]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in layouts:
            r = measure(layout, rows, group, Path(tmp))
            results.append(r)
            print(f"  {r.layout}: {r.per_value:.1f} B/value ({r.encodings}), {r.load_s:.1f}s")
        for name, config in feast_layouts:
            r = measure_feast(name, config, args.entities, args.seed, Path(tmp))
            results.append(r)
            print(f"  {r.layout}: {r.per_value:.1f} B/value ({r.encodings}), {r.load_s:.1f}s")
    flat_r, full_r, default_r = results[0], results[3], results[5]
    feast_r, feast_default_r = results[-2], results[-1]
    lines = [
        f"Standard shape, {args.entities:,} entities x 50 features ({flat_r.values:,} values), "
        f"Redis {redis_version()}, `used_memory` delta after loading.",
        "",
        "| layout | bytes/value | bytes/entity | vs flat | keys | hash encoding "
        "| server µs/entity, HMGET 51 fields | server µs/entity, HGETALL |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.layout} | {r.per_value:.1f} | {r.used_bytes / r.entities:.0f} "
            f"| {r.per_value / flat_r.per_value:.2f}x | {r.keys:,} | {r.encodings} "
            f"| {fmt(r.hmget_usec)} | {fmt(r.hgetall_usec)} |"
        )
    lines += [
        "",
        "Server µs per entity of an HMGET of its first k fields, against HGETALL of the whole "
        "hash (the store reads the whole hash when a request wants more than half of it):",
        "",
        "| layout | " + " | ".join(f"HMGET {k}" for k in SUBSETS) + " | HGETALL |",
        "|---|" + "---:|" * (len(SUBSETS) + 1),
    ]
    for r in results:
        if r.subsets:
            lines.append(
                f"| {r.layout} | "
                + " | ".join(f"{r.subsets[k]:.2f}" for k in SUBSETS)
                + f" | {fmt(r.hgetall_usec)} |"
            )
    ratio = full_r.per_value / flat_r.per_value
    lines += [
        "",
        f"- Full layout vs flat: {ratio:.2f}x the bytes, {1 / ratio:.1f}x the capacity "
        "(target: at most 0.33x).",
        f"- Full layout: {full_r.per_value:.1f} bytes/value (target: at most 24).",
        f"- Against Feast 0.67's Redis store on the same Redis settings (the shipped config): "
        f"{full_r.per_value:.1f} against {feast_r.per_value:.1f} bytes/value, "
        f"{full_r.per_value / feast_r.per_value:.2f}x.",
        f"- Each at Redis's default listpack limit (Feast's deployments run it unless told "
        f"otherwise): {default_r.per_value:.1f} against {feast_default_r.per_value:.1f} "
        f"bytes/value, {default_r.per_value / feast_default_r.per_value:.2f}x; this layout "
        f"with the shipped config against Feast's at the defaults: "
        f"{full_r.per_value / feast_default_r.per_value:.2f}x.",
    ]
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        command = " ".join(["python3 benchmarks/memory.py", *sys.argv[1:]])
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        args.out.write_text(
            f"# Memory per feature value\n\nCommand: `{command}`\n\n{table}\n\n"
            f"Load average at the end: {load}; {os.cpu_count()} cores. Feast {feast_version()}.\n"
        )
    return 0


def feast_version() -> str:
    from importlib.metadata import version

    return version("feast")


def redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return out.split("v=")[1].split()[0] if "v=" in out else "?"


if __name__ == "__main__":
    sys.exit(main())
