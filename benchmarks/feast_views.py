"""Lookups over several feature views (groups), on the native front against the handler.

    python3 benchmarks/feast_views.py [--rest | --grpc] [--no-cache] [--baseline REV]
                                      [--rounds 3] [--entities 100000] [--seconds 12]
                                      [--ttl 2] [--out FILE]

Feast's clients often ask for the features of several views of one entity in one call (a
feature service across views), and `/v1` and gRPC clients for those of several groups (a
nightly group and a streamed one, say). The registry here holds the standard shape twice, over the
same data per entity: entity ``consumer`` with its one group of 50 features, and entity
``member`` (prefix ``m``) with the same 50 features split into two views, ``member_scalars``
(40 floats, 5 ints) and ``member_lists`` (3 int lists, 2 embeddings).

Cells (one worker, wrk, 1,000 zipfian batches of 10 ids over ``--entities``, 8
connections, the L1 on with its TTL a sixth of the window, so entries expire and reload
inside it), each a Feast ``/get-online-features`` of all 50 features (``--rest``: a
``/v1/features/get`` of every feature of the entity type, the cells named "group";
``--grpc``: a GetFeatures of every feature, h2load sending one batch, as gRPC's cells in
``cost.py``):

- ``one view``: the consumer's group, on the native front (its hits: native/src/hits/);
- ``two views``: the member's two views, on the native front;
- ``two views, handler``: the same on a server with ``NATIVE_HITS=off``, whose handler
  answers (as it answered lookups over several views before the front took them).

``--no-cache``: the same cells without the L1, every lookup read from Redis: the front's
planned reads (one command per id for both views) against the handler's
(``NATIVE_READS=off``).

``--baseline REV``: a third server in each round, that revision's (a git worktree with
its own extension, as ``alternate.py`` runs it), answering the one-group and two-group
cells ("..., before"): the ratios now / before within each round, the one group's the
witness of the machine's drift.

Each round runs the servers in turn, the first a different one each round; the figures are
server CPU per entity (``/proc/<pid>/stat`` of the worker over the window) beside Redis's
own, and the ratios within each round. Then the tail at 1,000 connections (two wrk
threads, 1 s timeout; gRPC: 500 connections x 10 streams): the two-view lookup on the front
and in the handler, with the maximum and the count past 1 s.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, header, save, worktree
from cost import cpu_seconds, h2load, wrk, wrk_script
from native_hits import run_h2load
from rest_front import SLOW, run_wrk
from serving import id_batches

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.registry import load_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

SCALARS = sample.FLOATS + sample.INTS
LISTS = sample.INT_LISTS + sample.EMBEDDINGS
VIEWS = {"member_scalars": SCALARS, "member_lists": LISTS}
TAIL_CONNECTIONS = 1000
GRPC_TAIL = (500, 10)  # connections, streams each
ENV = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}


def registry_text() -> str:
    """The standard registry, and the member's two views of the same features."""
    doc = yaml.safe_load(sample.registry_text())
    types = doc["feature_groups"][sample.GROUP]["features"]
    doc["entities"]["member"] = {
        "prefix": "m",
        "join_key": "member_id",
        "id_type": "int",
        "ttl": "7d",
    }
    for view, names in VIEWS.items():
        features = {name: types[name] for name in names}
        doc["feature_groups"][view] = {"entity": "member", "max_age": "36h", "features": features}
    return str(yaml.safe_dump(doc, sort_keys=False))


def bodies(entities: int, two_views: bool, api: str) -> list[bytes]:
    """1,000 zipfian batches of 10 ids: Feast lookups of all 50 features (``rest``: /v1
    lookups of every feature of the entity type; ``grpc``: GetFeatures requests)."""
    entity = "member" if two_views else sample.ENTITY
    batches = id_batches(entities, 10, count=1000)
    if api == "grpc":
        return [
            pb.GetFeaturesRequest(entity_type=entity, int_ids=ids).SerializeToString()
            for ids in batches
        ]
    if api == "rest":
        return [orjson.dumps({"entity_type": entity, "ids": ids}) for ids in batches]
    if two_views:
        refs = [f"{view}:{name}" for view, names in VIEWS.items() for name in names]
        key = "member_id"
    else:
        refs = [f"{sample.GROUP}:{name}" for name in SCALARS + LISTS]
        key = "consumer_id"
    return [orjson.dumps({"features": refs, "entities": {key: ids}}) for ids in batches]


def split_rows(entities: int, view: str) -> Iterator[tuple[int, dict[str, object]]]:
    names = VIEWS[view]
    for entity_id, values in sample.rows(entities):
        yield entity_id, {name: values[name] for name in names if name in values}


@dataclass
class Cell(PerEntity):
    name: str
    requests: int
    seconds: float
    p50: float
    p99: float
    errors: int
    server_cpu: float
    redis_cpu: float
    batch: ClassVar[int] = 10  # entities per request


def measure(
    name: str, server: ServingProcess, redis: EmbeddedRedis, load: list[bytes], args: Namespace
) -> Cell:
    assert server.process is not None
    assert redis.process is not None
    seconds, work = args.seconds, args.work

    def run(seconds: float) -> tuple[int, float, float, int]:
        if args.api == "grpc":  # one batch: h2load sends one body
            return h2load(server.grpc_target, load[0], seconds, work, 8)
        return wrk(server.rest_url + args.path, load, seconds, work, 8)

    run(2.0)  # the L1 filled, the form taught
    s0, r0, t0 = cpu_seconds(server.process.pid), cpu_seconds(redis.process.pid), time.monotonic()
    requests, p50, p99, errors = run(seconds)
    elapsed = time.monotonic() - t0
    cell = Cell(
        name,
        requests,
        elapsed,
        p50,
        p99,
        errors,
        cpu_seconds(server.process.pid) - s0,
        cpu_seconds(redis.process.pid) - r0,
    )
    print(
        f"{name:20} {requests / elapsed:9,.0f} req/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
        f"server {cell.server_us:6.1f} us/entity  Redis {cell.redis_us:4.1f}  errors {errors}",
        flush=True,
    )
    return cell


def tail(
    server: ServingProcess,
    script: Path | None,
    body: bytes,
    seconds: float,
    load: tuple[int, int],
    args: Namespace,
) -> dict[str, float]:
    """A run at ``load`` (connections, and streams each for gRPC): wrk with ``script``'s
    bodies, or h2load sending ``body`` where there is no script (gRPC)."""
    if script is None:
        return run_h2load(server.grpc_target, body, seconds, args.work, *load)
    return run_wrk(server.rest_url + args.path, script, seconds, load[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, default=2.0, help="the L1's TTL (seconds)")
    apis = parser.add_mutually_exclusive_group()
    apis.add_argument("--rest", action="store_true", help="/v1 lookups, not Feast's")
    apis.add_argument("--grpc", action="store_true", help="gRPC lookups, not Feast's")
    parser.add_argument("--no-cache", action="store_true", help="the L1 off: planned reads")
    parser.add_argument("--baseline", help="a git revision whose server runs the cells too")
    parser.add_argument("--out", type=Path, help="markdown results")
    args = parser.parse_args()
    args.api = "rest" if args.rest else "grpc" if args.grpc else "feast"
    args.path = "/get-online-features" if args.api == "feast" else "/v1/features/get"
    noun = "view" if args.api == "feast" else "group"
    one_name, two_name = f"one {noun}", f"two {noun}s"
    handler_name = f"{two_name}, handler"
    rounds: list[dict[str, Cell]] = []
    tails: dict[str, dict[str, float]] = {}
    before = {one_name: f"{one_name}, before", two_name: f"{two_name}, before"}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        redis = stack.enter_context(EmbeddedRedis(Path(tmp) / "redis"))
        tree = None
        if args.baseline:
            tree = stack.enter_context(worktree(args.baseline, Path(tmp) / "baseline"))
        args.work = Path(tmp)
        path = Path(tmp) / "features.yaml"
        path.write_text(registry_text())
        registry = load_registry(path, check_lock=False)
        print(f"loading {args.entities:,} entities, one view and two ...", flush=True)
        with FeatureStore.connect(redis.url, registry) as store:
            store.write(sample.GROUP, sample.rows(args.entities))
            for view in VIEWS:
                store.write(view, split_rows(args.entities, view))
        one, two = bodies(args.entities, False, args.api), bodies(args.entities, True, args.api)
        server_args = ["--no-cache"] if args.no_cache else ["--cache-ttl", f"{args.ttl:g}"]
        native = "FEATURE_SERVING_NATIVE_READS" if args.no_cache else "FEATURE_SERVING_NATIVE_HITS"
        handler_env = {**ENV, native: "off"}
        every = ["front", "handler", *(["baseline"] if tree else [])]
        for r in range(args.rounds):
            cells: dict[str, Cell] = {}
            sides = every[r % len(every) :] + every[: r % len(every)]
            for side in sides:
                env = handler_env if side == "handler" else ENV
                cwd = tree if side == "baseline" else None
                with ServingProcess(
                    redis.url,
                    registry=path,
                    args=server_args,
                    env=env,
                    grpc=args.api == "grpc",
                    cwd=cwd,
                ) as server:
                    if side == "handler":
                        cells[handler_name] = measure(handler_name, server, redis, two, args)
                        continue
                    for name, load in ((one_name, one), (two_name, two)):
                        name = name if side == "front" else before[name]
                        cells[name] = measure(name, server, redis, load, args)
            rounds.append(cells)
        script = wrk_script(Path(tmp) / "tail.lua", two) if args.api != "grpc" else None
        for side in ("front", "handler"):
            env = ENV if side == "front" else handler_env
            with ServingProcess(
                redis.url, registry=path, args=server_args, env=env, grpc=args.api == "grpc"
            ) as server:
                assert server.process is not None
                tail(server, script, two[0], 2.0, (8, 1), args)  # warm-up
                s0 = cpu_seconds(server.process.pid)
                at_scale = GRPC_TAIL if script is None else (TAIL_CONNECTIONS, 1)
                got = tail(server, script, two[0], args.seconds, at_scale, args)
                got["cpu"] = cpu_seconds(server.process.pid) - s0
                tails[side] = got
                print(
                    f"tail {side:8} {got['requests'] / args.seconds:9,.0f} req/s  p99 "
                    f"{got['p99']:7.1f} ms  max {got['max']:7.1f} ms  past {SLOW:g} s "
                    f"{got['slow']:.0f}  errors {got['errors']:.0f}",
                    flush=True,
                )
    lines = [
        *header(
            f"One worker; {args.rounds} rounds, the servers in turn, the first a different one "
            "each round" + (f" (the baseline: {args.baseline})" if args.baseline else "") + "; "
            f"{args.seconds:g} s per cell, "
            + ("the L1 off" if args.no_cache else f"L1 TTL {args.ttl:g} s")
            + f"; {args.entities:,} entities "
            "per entity type; "
            + {
                "feast": "Feast lookups of all 50 features",
                "rest": "/v1 lookups of every feature",
                "grpc": "gRPC lookups of every feature (h2load, one batch)",
            }[args.api]
            + ", batches of 10, 8 connections."
        ),
        "",
        "| round | cell | req/s | p50 ms | p99 ms | server µs/entity | Redis µs/entity | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r, cells in enumerate(rounds):
        for cell in cells.values():
            lines.append(
                f"| {r + 1} | {cell.name} | {cell.requests / cell.seconds:,.0f} | "
                f"{cell.p50:.2f} | {cell.p99:.2f} | {cell.server_us:.2f} | "
                f"{cell.redis_us:.2f} | {cell.errors} |"
            )

    def ratios(a: str, b: str) -> list[float]:
        return [c[a].server_us / c[b].server_us for c in rounds]

    lines += [
        "",
        "| ratio of server CPU per entity, per round | median | range |",
        "|---|---:|---|",
    ]
    for label, a, b in (
        (f"{two_name} on the front / in the handler", two_name, handler_name),
        (f"{two_name} / {one_name}, both on the front", two_name, one_name),
        *(
            (f"{name}, now / before {args.baseline}", name, before[name])
            for name in (two_name, one_name)
            if args.baseline
        ),
    ):
        ys = ratios(a, b)
        lines.append(f"| {label} | {statistics.median(ys):.2f}x | {min(ys):.2f} to {max(ys):.2f} |")
    lines += [
        "",
        (
            f"The tail at {GRPC_TAIL[0]} connections x {GRPC_TAIL[1]} streams ({two_name}, "
            f"h2load -t2, {args.seconds:g} s):"
            if args.api == "grpc"
            else f"The tail at {TAIL_CONNECTIONS:,} connections ({two_name}, wrk -t2, "
            f"{args.seconds:g} s, timeout {SLOW:g} s):"
        ),
        "",
        f"| answered by | req/s | p99 ms | max ms | past {SLOW:g} s | errors | server µs/entity |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side, got in tails.items():
        per_entity = got["cpu"] / max(1.0, got["requests"] * 10) * 1e6
        lines.append(
            f"| {side} | {got['requests'] / args.seconds:,.0f} | {got['p99']:.1f} | "
            f"{got['max']:.1f} | {got['slow']:.0f} | {got['errors']:.0f} | {per_entity:.2f} |"
        )
    title = {
        "feast": "Feast's lookups over two views",
        "rest": "/v1 lookups over two groups",
        "grpc": "gRPC lookups over two groups",
    }[args.api]
    title += ", the L1 off" if args.no_cache else ""
    save(args.out, f"{title}: the native front against the handler", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
