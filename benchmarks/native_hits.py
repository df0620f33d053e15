"""Cache hits answered on the native fronts' threads (NATIVE_HITS) against hits answered in
Python, REST and gRPC, in steady state, in one run.

    python3 benchmarks/native_hits.py [--entities 100000] [--seconds 12] [--ttl 2] [--out FILE]

One `feature-store serve` worker per (API, NATIVE_HITS on/off), L1 on with a TTL of ``--ttl``
seconds, so that every measured window holds several TTLs: entries expire, are refreshed
ahead (through the policy the front hands its hits to) or missed and read again. REST: wrk
over 1,000 zipfian batches of 10 (all 50 features of the standard shape) at 1, 8 and 1,000
connections; gRPC: h2load on one batch of 10 at 1 and 8 connections, and 500 connections x
10 streams. wrk's timeout is 1 s (its timeouts are the requests past 1 s); h2load's
per-request log gives the maximum and the count past 1 s. Server CPU per entity is read
from /proc/<pid>/stat of the worker (and its children) and of redis-server over each
window. Last, REST at 8 connections with --workers 2 against one worker (NATIVE_HITS on),
on the cores wrk runs on too (benchmarks/workers.py gives each server a CPU quota instead).

Targets (issue: a lookup costs what Redis pays for it): with the L1 on <= 3 us of server CPU
per entity at batch 10, p50 <= 0.1 ms at one connection, REST and gRPC; none past 1 s at
1,000 REST connections; 2 workers on 2 cores >= 1.7x one (see benchmarks/workers.py).
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import orjson

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, header, save
from cost import cpu_seconds, h2load_log, percentile, require_tools, wrk_script
from rest_front import SLOW, run_wrk
from serving import add_data_dir, ensure_data, id_batches

BATCH = 10
REST_CONNECTIONS = ((1, 1), (8, 1), (1000, 1))  # (connections, streams per connection)
GRPC_CONNECTIONS = ((1, 1), (8, 1), (500, 10))
WORKERS_CONNECTIONS = 8


@dataclass
class Cell(PerEntity):
    api: str
    hits: str  # "front" (NATIVE_HITS on) or "loop" (off: hits answered in Python)
    workers: int
    connections: int
    streams: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    slow: int  # requests past SLOW seconds
    errors: int
    server_cpu: float
    redis_cpu: float
    batch: ClassVar[int] = BATCH  # entities per request


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (the workers of `serve --workers N`)."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        total += sum(tree_cpu(int(child)) for child in children)
    return total


def run_h2load(
    target: str, body: bytes, seconds: float, work: Path, connections: int, streams: int
) -> dict[str, float]:
    succeeded, failed, durations = h2load_log(
        target, body, seconds, work, connections, streams, threads=2
    )
    return {
        "requests": succeeded,
        "p50": percentile(durations, 50),
        "p99": percentile(durations, 99),
        "max": durations[-1] / 1000 if durations else 0.0,
        "slow": sum(1 for d in durations if d > SLOW * 1e6),
        "errors": failed,
    }


def lookups(entities: int, work: Path) -> tuple[Path, bytes]:
    """The load's requests: wrk's script over 1,000 zipfian batches of ``BATCH`` ids (REST,
    all of the standard group), and one such batch as a GetFeatures message (gRPC)."""
    batches = id_batches(entities, BATCH, count=1000)
    script = wrk_script(
        work / "post.lua",
        [
            orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
            for ids in batches
        ],
    )
    message = pb.GetFeaturesRequest(
        entity_type=sample.ENTITY, int_ids=batches[0], groups=[sample.GROUP]
    ).SerializeToString()
    return script, message


def loader(
    server: ServingProcess, api: str, work: Path, entities: int
) -> Callable[[float, int, int], dict[str, float]]:
    """A load of ``server``'s ``api`` for (seconds, connections, streams per connection):
    wrk over the REST batches, or h2load on the gRPC one."""
    script, message = lookups(entities, work)

    def load(seconds: float, conns: int, streams: int) -> dict[str, float]:
        if api == "rest":
            return run_wrk(f"{server.rest_url}/v1/features/get", script, seconds, conns)
        return run_h2load(server.grpc_target, message, seconds, work, conns, streams)

    return load


def run_server(
    redis: EmbeddedRedis,
    api: str,
    hits: str,
    workers: int,
    connections: list[tuple[int, int]],
    args: argparse.Namespace,
    work: Path,
) -> list[Cell]:
    env = {
        "FEATURE_SERVING_SHADOW_FRACTION": "0",
        "FEATURE_SERVING_WARM_START_KEYS": "0",
        "FEATURE_SERVING_NATIVE_HITS": "on" if hits == "front" else "off",
    }
    serve_args = ["--cache-ttl", f"{args.ttl:g}", "--workers", str(workers)]
    assert redis.process is not None
    cells = []
    with ServingProcess(redis.url, args=serve_args, env=env, grpc=api == "grpc") as server:
        assert server.process is not None
        load = loader(server, api, work, args.entities)
        load(2.0, 8, 1)  # warm-up: connections, the L1's first loads, the forms learned
        for conns, streams in connections:
            s0, r0 = tree_cpu(server.process.pid), cpu_seconds(redis.process.pid)
            t0 = time.monotonic()
            got = load(args.seconds, conns, streams)
            elapsed = time.monotonic() - t0
            cell = Cell(
                api,
                hits,
                workers,
                conns,
                streams,
                int(got["requests"]),
                elapsed,
                got["p50"],
                got["p99"],
                got["max"],
                int(got["slow"]),
                int(got["errors"]),
                tree_cpu(server.process.pid) - s0,
                cpu_seconds(redis.process.pid) - r0,
            )
            print(
                f"{api:4} hits in {hits:6} workers {workers} c{conns}x{streams:<3} "
                f"{cell.rate:9,.0f} req/s  p50 {cell.p50_ms:7.2f} ms  p99 {cell.p99_ms:7.2f} ms  "
                f"max {cell.max_ms:7.1f} ms  past {SLOW:g} s {cell.slow}  "
                f"server {cell.server_us:5.1f} us/entity  Redis {cell.redis_us:4.1f}  "
                f"errors {cell.errors}",
                flush=True,
            )
            cells.append(cell)
    return cells


def plot(path: Path, cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, api, shapes in (
        (axes[0], "rest", REST_CONNECTIONS),
        (axes[1], "grpc", GRPC_CONNECTIONS),
    ):
        labels = [f"{c}" if s == 1 else f"{c}x{s}" for c, s in shapes]
        xs = range(len(shapes))
        for offset, hits in ((-0.2, "loop"), (0.2, "front")):
            values = [
                next(
                    c.server_us
                    for c in cells
                    if c.api == api
                    and c.hits == hits
                    and c.workers == 1
                    and (c.connections, c.streams) == shape
                )
                for shape in shapes
            ]
            label = "hits on the front" if hits == "front" else "hits in Python"
            ax.bar([x + offset for x in xs], values, width=0.4, label=label)
        ax.set_xticks(list(xs), labels)
        ax.set_xlabel("connections" if api == "rest" else "connections x streams")
        ax.set_title(f"{api.upper()}: server CPU µs per entity (L1 on)")
        ax.axhline(3.0, color="gray", linestyle=":", label="target 3 µs")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, default=2.0, help="the L1's TTL (seconds)")
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    require_tools("wrk", "h2load")
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, args.entities)
        work = Path(tmp)
        for api, shapes in (("rest", REST_CONNECTIONS), ("grpc", GRPC_CONNECTIONS)):
            for hits in ("loop", "front"):
                cells += run_server(redis, api, hits, 1, list(shapes), args, work)
        scaling: list[Cell] = []  # one worker, then two, back to back
        for workers in (1, 2):
            scaling += run_server(
                redis, "rest", "front", workers, [(WORKERS_CONNECTIONS, 1)], args, work
            )
        cells += scaling
    lines = [
        *header(
            f"L1 on, TTL {args.ttl:g} s in {args.seconds:g} s windows "
            f"({args.seconds / args.ttl:.0f} TTLs per window); batches of {BATCH}, all 50 "
            f"features; {args.entities:,} entities. REST: wrk, 1,000 zipfian batches; gRPC: "
            f"h2load, one batch. Past {SLOW:g} s: wrk's timeouts (REST), h2load's log (gRPC)."
        ),
        "",
        "## Hits on the front's thread against hits in Python, same run",
        "",
        "| API | conns | req/s (front / Python) | ratio | p50 ms | p99 ms | max ms "
        f"| past {SLOW:g} s | server µs/entity | Redis µs/entity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for api, shapes in (("rest", REST_CONNECTIONS), ("grpc", GRPC_CONNECTIONS)):
        for conns, streams in shapes:
            f, p = (
                next(
                    c
                    for c in cells
                    if c.api == api
                    and c.hits == hits
                    and c.workers == 1
                    and (c.connections, c.streams) == (conns, streams)
                )
                for hits in ("front", "loop")
            )
            shape = f"{conns}" if streams == 1 else f"{conns} x {streams}"
            lines.append(
                f"| {api} | {shape} | {f.rate:,.0f} / {p.rate:,.0f} | {f.rate / p.rate:.2f}x | "
                f"{f.p50_ms:.2f} / {p.p50_ms:.2f} | {f.p99_ms:.2f} / {p.p99_ms:.2f} | "
                f"{f.max_ms:,.1f} / {p.max_ms:,.1f} | {f.slow} / {p.slow} | "
                f"{f.server_us:.1f} / {p.server_us:.1f} | {f.redis_us:.2f} / {p.redis_us:.2f} |"
            )
    one, two = scaling
    lines += [
        "",
        f"## --workers 2 against one worker (REST, {WORKERS_CONNECTIONS} connections, hits on "
        "the front)",
        "",
        "The load generator (wrk, 2 threads) runs on the same 2 cores as the workers.",
        "",
        "| workers | req/s | p50 ms | p99 ms | server µs/entity |",
        "|---:|---:|---:|---:|---:|",
        f"| 1 | {one.rate:,.0f} | {one.p50_ms:.2f} | {one.p99_ms:.2f} | {one.server_us:.1f} |",
        f"| 2 | {two.rate:,.0f} | {two.p50_ms:.2f} | {two.p99_ms:.2f} | {two.server_us:.1f} |",
        "",
        f"2 workers / 1: {two.rate / one.rate:.2f}x the requests/s.",
    ]
    save(args.out, "Cache hits on the native fronts' threads", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
