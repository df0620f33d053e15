"""The serving data plane side by side: REST and gRPC, L1 off and on, batch 10 and 100,
concurrency 1, 8 and 32 (and batch 1,000 at 8); the native path, the Python reference, gRPC
on grpc.aio instead of the native front, and an older revision.

    python3 benchmarks/dataplane.py [--baseline REV] [--entities 100000] [--seconds 12] [--ttl 2]
                                    [--stampede-runs 5] [--no-tail] [--tails APIS]
                                    [--only-tails] [--out FILE]

One `feature-store serve` worker per (path, API, L1); wrk drives REST (1,000 zipfian
batches in turn) and h2load drives gRPC (one batch; its per-request log gives the
percentiles). Both are compiled, and their own CPU is reported too. With the L1 on, its TTL
is ``--ttl`` seconds, a fraction of each cell's window: entries expire and are refreshed
inside it, as in production (a cell shorter than the TTL measures a cache that never
expires, and claimed 7.4 us per cached REST entity that cost 10.6 to 12.9 once entries
expired). CPU per entity is read
from /proc/<pid>/stat of the worker and of redis-server over each window, and the share of
the entities looked up that were read from Redis from its own count of HMGET and HGETALL
calls (with the L1 on: the misses, an id a batch repeats read once; with it off, every id
named, repeats too). The baseline
(FEATURE_STORE_NATIVE=off: the Python reference), the grpcio front
(FEATURE_SERVING_GRPC_FRONT=grpcio: every gRPC method on grpc.aio), the native fronts with
lookups without the L1 answered by their handlers (FEATURE_SERVING_NATIVE_READS=off:
"python-reads", L1 off), the L1 compact (FEATURE_SERVING_CACHE_FORM=compact: entries hold
their packed values only and every hit writes its answer, L1 on) and --baseline run in the
same session at batch 10, concurrency 1 and 8 (--baseline also at batch 1,000), so every
ratio compares figures taken minutes apart on one machine.

The tail at scale follows (--no-tail: none), on the native path: REST at 1,000 connections
(wrk, timeout 1 s: its timeouts are the requests past 1 s) and gRPC at 500 connections x 10
streams (h2load's per-request log), then other REST lookups at 1,000 connections: ten
picked features ("picked") and Feast's API ("feast", which its handler answers); L1 off and on,
with the maximum and the count past 1 s (--tails picks the APIs, --only-tails skips the
cells before);
then the stampede scenario (benchmarks/rest_front.py: wrk at 400 connections on 100
batches of 10, L1 TTL 1 s, 15 s per run, --stampede-runs runs, Redis reads counted by
Redis).

Targets (issue: the serving data plane): server CPU per entity at batch 10 and
concurrency 8 of at most 25 us with the L1 off and 8 us with it on, for REST and gRPC;
gRPC at most 1.1x REST; batches of 100 and 1,000 no dearer per entity than batch 10; p50
and p99 at concurrency 1 no worse than before. And (issue: a lookup costs what Redis pays
for it) at batch 10: with the L1 off, server CPU per entity at most 1.5x Redis's in the
same cell at concurrency 8 and p50 at most 0.25 ms at concurrency 1; with it on, at most
3 us per entity and p50 at most 0.1 ms; REST at 1,000 connections with no request past 1
s; in the stampede, none past 1 s in 5 runs, p99 <= 200 ms and Redis reads at about one
per key per TTL.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, bars, header, save, worktree
from cost import children_cpu, cpu_seconds, h2load, require_tools, wrk, wrk_script
from native_hits import run_h2load
from rest_front import (
    SLOW,
    STAMPEDE_CONNECTIONS,
    STAMPEDE_KEYS,
    STAMPEDE_SECONDS,
    STAMPEDE_TTL,
    Stampede,
    redis_reads,
    run_wrk,
    stampede,
)
from serving import add_data_dir, ensure_data, id_batches

TARGET_OFF_US = 25.0
TARGET_ON_US = 8.0
TARGET_GRPC_OVER_REST = 1.1
# issue: a lookup costs what Redis pays for it
TARGET_OFF_OVER_REDIS = 1.5  # L1 off: server CPU per entity over Redis's, same cell
TARGET_ON_US_NOW = 3.0
TARGET_OFF_P50_MS = 0.25  # at one connection
TARGET_ON_P50_MS = 0.1
TARGET_STAMPEDE_P99_MS = 200.0
STAMPEDE_READS = 1.25  # "about one read per key per TTL": at most this many
# the tail at scale: (API, connections, streams per connection); "picked" and "feast" are
# REST lookups of ten picked features (answered on the front) and of Feast's API (by its
# handler, in Python)
TAILS = {"rest": (1000, 1), "grpc": (500, 10), "picked": (1000, 1), "feast": (1000, 1)}


# the native fronts with every lookup without the L1 answered by its handler
# (NATIVE_READS=off): how they answered before fronts/reads.py
PYTHON_READS = "python-reads"
# the L1 keeping each entry's packed values only (CACHE_FORM=compact): every hit writes its
# JSON or gRPC records, for half the memory per entity (benchmarks/l1_memory.py)
COMPACT = "compact"


@dataclass
class Cell(PerEntity):
    # "native", "reference" (the Python reference), "grpcio", PYTHON_READS, COMPACT, "before"
    path: str
    api: str
    l1: str
    batch: int
    connections: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu: float
    redis_cpu: float
    loadgen_cpu: float
    redis_reads: int = 0  # HMGET + HGETALL calls in the window, as Redis counts them

    @property
    def loadgen_us(self) -> float:
        return self.per_entity(self.loadgen_cpu)

    @property
    def loaded(self) -> float:
        """The share of the entities looked up that were read from Redis (one group each)."""
        return self.redis_reads / max(1, self.requests * self.batch)

    def per_read(self, cpu: float) -> float:
        """CPU per entity read from Redis: with nearly every lookup a miss, what a miss
        costs."""
        return cpu / max(1, self.redis_reads) * 1e6

    @property
    def server_us_per_read(self) -> float:
        return self.per_read(self.server_cpu)

    @property
    def redis_us_per_read(self) -> float:
        return self.per_read(self.redis_cpu)

    @property
    def name(self) -> str:
        return f"{self.api} L1 {self.l1} b{self.batch} c{self.connections}"


# the "picked" cells' features: ten of the group's fifty, each kind among them
PICKED = [*sample.FLOATS[:6], sample.INTS[0], sample.INT_LISTS[0], *sample.EMBEDDINGS]
# the "feast" cells' features: all fifty, as Feast's clients name them
FEAST_REFS = [
    f"{sample.GROUP}:{n}"
    for n in sample.FLOATS + sample.INTS + sample.INT_LISTS + sample.EMBEDDINGS
]


def batch_bodies(entities: int, batch: int, api: str = "rest") -> list[bytes]:
    """1,000 zipfian batches of ``batch`` ids over ``entities``, as request bodies: of the
    whole group (``api`` "rest"), of PICKED features ("picked"), or of Feast's
    ``/get-online-features`` ("feast")."""
    batches = id_batches(entities, batch, count=1000)
    if api == "feast":
        entities_of = sample.registry().entities[sample.ENTITY].join_key
        return [
            orjson.dumps({"features": FEAST_REFS, "entities": {entities_of: ids}})
            for ids in batches
        ]
    asked = {"features": PICKED} if api == "picked" else {"groups": [sample.GROUP]}
    return [orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, **asked}) for ids in batches]


def rest_route(api: str) -> str:
    """The REST route of a cell's API: Feast's, or this server's lookups."""
    return "/get-online-features" if api == "feast" else "/v1/features/get"


def grpc_request(body: bytes) -> bytes:
    """The gRPC GetFeaturesRequest of a whole-group REST body (``batch_bodies``)."""
    return pb.GetFeaturesRequest(
        entity_type=sample.ENTITY, int_ids=orjson.loads(body)["ids"], groups=[sample.GROUP]
    ).SerializeToString()


def run_server(
    redis: EmbeddedRedis,
    path: str,
    api: str,
    l1: bool,
    cells: list[tuple[int, int]],
    seconds: float,
    work: Path,
    ttl: float,
    tree: Path | None = None,
) -> list[Cell]:
    """Cells on one worker: of this checkout (``path`` "native", "reference" for the
    Python reference, "grpcio" for gRPC on grpc.aio), or of the checkout at ``tree`` (with
    its L1 compact for ``path`` "compact")."""
    args = ["--cache-ttl", f"{ttl:g}"] if l1 else ["--no-cache"]
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    if tree is None:
        env["FEATURE_STORE_NATIVE"] = "off" if path == "reference" else "on"
        env["FEATURE_SERVING_GRPC_FRONT"] = "grpcio" if path == "grpcio" else "native"
        env["FEATURE_SERVING_NATIVE_READS"] = "off" if path == PYTHON_READS else "on"
        env["FEATURE_SERVING_CACHE_FORM"] = "compact" if path == COMPACT else "answers"
    elif path == COMPACT:  # a baseline's checkout, whose cache has the form too
        env["FEATURE_SERVING_CACHE_FORM"] = "compact"
    bodies = {batch: batch_bodies(100_000, batch, api) for batch in {b for b, _ in cells}}
    assert redis.process is not None
    out = []
    with ServingProcess(redis.url, args=args, env=env, grpc=api == "grpc", cwd=tree) as server:
        assert server.process is not None

        def load(batch: int, connections: int, window: float) -> tuple[int, float, float, int]:
            if api != "grpc":  # REST: the whole group, picked features, or Feast's API
                url = f"{server.rest_url}{rest_route(api)}"
                return wrk(url, bodies[batch], window, work, connections)
            request = grpc_request(bodies[batch][0])
            return h2load(server.grpc_target, request, window, work, connections)

        for batch, connections in cells:
            if l1:
                load(batch, 8, 2.0)  # fill the cache: the window measures hits
            reads0 = redis_reads(redis.url)  # before Redis's CPU is: not counted in it
            s0, r0 = cpu_seconds(server.process.pid), cpu_seconds(redis.process.pid)
            g0 = children_cpu()
            t0 = time.monotonic()
            requests, p50, p99, errors = load(batch, connections, seconds)
            elapsed = time.monotonic() - t0
            s1, r1 = cpu_seconds(server.process.pid), cpu_seconds(redis.process.pid)
            reads = redis_reads(redis.url) - reads0
            cell = Cell(
                path,
                api,
                "on" if l1 else "off",
                batch,
                connections,
                requests,
                elapsed,
                p50,
                p99,
                errors,
                s1 - s0,
                r1 - r0,
                children_cpu() - g0,
                reads,
            )
            print(
                f"{path:9} {cell.name:22} {cell.rate:9,.0f} req/s  p50 {p50:6.2f} ms  "
                f"p99 {p99:6.2f} ms  server {cell.server_us:6.1f} us/entity  "
                f"Redis {cell.redis_us:4.1f}  loadgen {cell.loadgen_us:4.1f}  "
                f"read {cell.loaded:4.0%}  errors {errors}",
                flush=True,
            )
            out.append(cell)
    return out


@dataclass
class Tail:
    api: str
    l1: str
    connections: int
    streams: int
    requests: int
    seconds: float
    p99_ms: float
    max_ms: float
    slow: int  # requests past SLOW seconds
    errors: int
    server_cpu: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def shape(self) -> str:
        return (
            f"{self.connections}" if self.streams == 1 else f"{self.connections} x {self.streams}"
        )


def run_tail(
    redis: EmbeddedRedis, api: str, connections: int, streams: int, l1: bool, args: Any, work: Path
) -> Tail:
    """One window of the native path at ``connections`` (x ``streams`` for gRPC)."""
    server_args = ["--cache-ttl", f"{args.ttl:g}"] if l1 else ["--no-cache"]
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    bodies = batch_bodies(args.entities, 10, "rest" if api == "grpc" else api)
    script = wrk_script(work / "tail.lua", bodies)
    message = grpc_request(bodies[0]) if api == "grpc" else b""
    with ServingProcess(redis.url, args=server_args, env=env, grpc=api == "grpc") as server:
        assert server.process is not None

        def load(seconds: float, conns: int, per_conn: int) -> dict[str, float]:
            if api != "grpc":
                return run_wrk(f"{server.rest_url}{rest_route(api)}", script, seconds, conns)
            return run_h2load(server.grpc_target, message, seconds, work, conns, per_conn)

        load(2.0, 8, 1)  # warm-up: connections, the L1's first loads
        s0, t0 = cpu_seconds(server.process.pid), time.monotonic()
        got = load(args.seconds, connections, streams)
        tail = Tail(
            api,
            "on" if l1 else "off",
            connections,
            streams,
            int(got["requests"]),
            time.monotonic() - t0,
            got["p99"],
            got["max"],
            int(got["slow"]),
            int(got["errors"]),
            cpu_seconds(server.process.pid) - s0,
        )
    print(
        f"tail      {api} L1 {tail.l1:3} c{tail.shape:9} {tail.rate:9,.0f} req/s  "
        f"p99 {tail.p99_ms:7.1f} ms  max {tail.max_ms:7.1f} ms  past {SLOW:g} s {tail.slow}  "
        f"errors {tail.errors}",
        flush=True,
    )
    return tail


def tail_lines(tails: list[Tail], stampedes: list[Stampede]) -> list[str]:
    """The tail at scale and the stampede: their tables and verdicts."""
    lines = []
    if tails:
        lines += [
            "",
            f"## The tail at scale (native path, batch 10, past {SLOW:g} s counted)",
            "",
            f"| API | L1 | conns | req/s | p99 ms | max ms | past {SLOW:g} s | errors "
            "| server µs/entity |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for t in tails:
            per_entity = t.server_cpu / max(1, t.requests * 10) * 1e6
            lines.append(
                f"| {t.api} | {t.l1} | {t.shape} | {t.rate:,.0f} | {t.p99_ms:.1f} | "
                f"{t.max_ms:,.1f} | {t.slow} | {t.errors} | {per_entity:.1f} |"
            )
    if stampedes:
        per_ttl = STAMPEDE_KEYS * 10 * STAMPEDE_SECONDS / STAMPEDE_TTL
        lines += [
            "",
            f"## Stampede: {STAMPEDE_CONNECTIONS} connections, {STAMPEDE_KEYS} batches of 10, "
            f"L1 TTL {STAMPEDE_TTL:g} s, {STAMPEDE_SECONDS:g} s per run (REST, native path)",
            "",
            f"One read per entity per TTL would be {per_ttl:,.0f} Redis reads per run.",
            "",
            f"| run | requests | p99 ms | max ms | past {SLOW:g} s | errors | Redis reads |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for st in stampedes:
            lines.append(
                f"| {st.run} | {st.requests:,} | {st.p99_ms:.1f} | {st.max_ms:,.1f} | "
                f"{st.slow} | {st.errors} | {st.redis_reads:,} |"
            )
    verdict = ["", "| target | figure | met |", "|---|---|---|"]

    def row(target: str, figure: str, ok: bool) -> None:
        verdict.append(f"| {target} | {figure} | {'yes' if ok else '**no**'} |")

    for t in tails:
        row(
            f"{t.api} L1 {t.l1} at {t.shape} connections: none past {SLOW:g} s",
            f"{t.slow} past, max {t.max_ms:,.0f} ms, {t.errors} errors",
            t.slow == 0 and t.errors == 0,
        )
    if stampedes:
        per_ttl = STAMPEDE_KEYS * 10 * STAMPEDE_SECONDS / STAMPEDE_TTL
        slow = sum(st.slow for st in stampedes)
        worst = max(st.p99_ms for st in stampedes)
        reads = max(st.redis_reads for st in stampedes)
        row(
            f"stampede: none past {SLOW:g} s in {len(stampedes)} runs",
            f"{slow} past, max {max(st.max_ms for st in stampedes):,.0f} ms",
            slow == 0,
        )
        row(
            f"stampede: p99 <= {TARGET_STAMPEDE_P99_MS:g} ms",
            f"worst run {worst:.1f} ms",
            worst <= TARGET_STAMPEDE_P99_MS,
        )
        row(
            f"stampede: Redis reads <= {STAMPEDE_READS}x one per key per TTL",
            f"at most {reads:,} per run against {per_ttl:,.0f}",
            reads <= STAMPEDE_READS * per_ttl,
        )
    return lines + (verdict if len(verdict) > 3 else [])


def find(cells: list[Cell], **want: object) -> Cell:
    for c in cells:
        if all(getattr(c, k) == v for k, v in want.items()):
            return c
    raise KeyError(want)


def drift(now: Cell, before: Cell) -> str:
    """Redis's own CPU per entity in the two cells, where it differs by more than a tenth:
    the before cells run minutes earlier, and the machine's speed drifts (alternate.py
    compares two revisions in alternation)."""
    ratio = now.redis_us / max(before.redis_us, 1e-9)
    return f"; Redis's own {ratio:.2f}x" if abs(ratio - 1) > 0.1 else ""


def verdicts(cells: list[Cell]) -> list[str]:
    """Each target, the figure, and whether it is met."""
    lines = ["| target | figure | met |", "|---|---|---|"]

    def row(target: str, figure: str, ok: bool) -> None:
        lines.append(f"| {target} | {figure} | {'yes' if ok else '**no**'} |")

    for api in ("rest", "grpc"):
        for l1, limit in (("off", TARGET_OFF_US), ("on", TARGET_ON_US)):
            c = find(cells, path="native", api=api, l1=l1, batch=10, connections=8)
            others = [
                f"{b.path} {b.server_us:.1f} us"
                for b in cells
                if (b.path, b.api, b.l1, b.batch, b.connections) == (b.path, api, l1, 10, 8)
                and b.path != "native"
            ]
            row(
                f"{api} L1 {l1}: server CPU <= {limit:g} us/entity (batch 10, c=8)",
                f"{c.server_us:.1f} us ({', '.join(others)})",
                c.server_us <= limit,
            )
    for l1 in ("off", "on"):
        rest = find(cells, path="native", api="rest", l1=l1, batch=10, connections=8)
        grpc = find(cells, path="native", api="grpc", l1=l1, batch=10, connections=8)
        ratio = grpc.server_us / rest.server_us
        row(
            f"gRPC <= {TARGET_GRPC_OVER_REST}x REST per request, L1 {l1}",
            f"{ratio:.2f}x",
            ratio <= TARGET_GRPC_OVER_REST,
        )
    for api in ("rest", "grpc"):
        for l1 in ("off", "on"):
            b10 = find(cells, path="native", api=api, l1=l1, batch=10, connections=8)
            for batch in (100, 1000):
                big = find(cells, path="native", api=api, l1=l1, batch=batch, connections=8)
                row(
                    f"{api} L1 {l1}: batch {batch:,} per entity <= batch 10",
                    f"{big.server_us:.1f} vs {b10.server_us:.1f} us",
                    big.server_us <= b10.server_us * 1.05,  # within the noise of one window
                )
    for api in ("rest", "grpc"):
        off = find(cells, path="native", api=api, l1="off", batch=10, connections=8)
        ratio = off.server_us / max(off.redis_us, 1e-9)
        python = [
            c
            for c in cells
            if (c.path, c.api, c.l1, c.batch, c.connections) == (PYTHON_READS, api, "off", 10, 8)
        ]
        was = (
            f"; reads in Python {python[0].server_us / max(python[0].redis_us, 1e-9):.2f}x"
            if python
            else ""
        )
        row(
            f"{api} L1 off: server CPU <= {TARGET_OFF_OVER_REDIS}x Redis's (batch 10, c=8)",
            f"{off.server_us:.1f} vs {off.redis_us:.1f} us: {ratio:.2f}x{was}",
            ratio <= TARGET_OFF_OVER_REDIS,
        )
        on = find(cells, path="native", api=api, l1="on", batch=10, connections=8)
        row(
            f"{api} L1 on: server CPU <= {TARGET_ON_US_NOW:g} us/entity (batch 10, c=8)",
            f"{on.server_us:.1f} us",
            on.server_us <= TARGET_ON_US_NOW,
        )
        compact = [
            c
            for c in cells
            if (c.path, c.api, c.l1, c.batch, c.connections) == (COMPACT, api, "on", 10, 8)
        ]
        for c in compact:
            row(
                f"{api} L1 on, compact: server CPU <= {TARGET_ON_US_NOW:g} us/entity "
                "(batch 10, c=8)",
                f"{c.server_us:.1f} us ({c.server_us / on.server_us:.2f}x answers kept)",
                c.server_us <= TARGET_ON_US_NOW,
            )
        for l1, limit in (("off", TARGET_OFF_P50_MS), ("on", TARGET_ON_P50_MS)):
            c = find(cells, path="native", api=api, l1=l1, batch=10, connections=1)
            row(
                f"{api} L1 {l1}: p50 <= {limit:g} ms at c=1 (batch 10)",
                f"{c.p50_ms:.2f} ms",
                c.p50_ms <= limit,
            )
    before = [c for c in cells if c.path == "before"]
    for api in ("rest", "grpc") if before else ():
        for l1 in ("off", "on"):
            c = find(cells, path="native", api=api, l1=l1, batch=10, connections=1)
            base = find(before, api=api, l1=l1, batch=10, connections=1)
            row(
                f"{api} L1 {l1}: p50/p99 at c=1 no worse than before",
                f"{c.p50_ms:.2f}/{c.p99_ms:.2f} ms vs {base.p50_ms:.2f}/{base.p99_ms:.2f} ms"
                f"{drift(c, base)}",
                c.p50_ms <= base.p50_ms * 1.05 and c.p99_ms <= base.p99_ms * 1.1,
            )
            for base in [b for b in before if (b.api, b.l1, b.batch) == (api, l1, 1000)]:
                c = find(cells, path="native", api=api, l1=l1, batch=1000, connections=8)
                row(
                    f"{api} L1 {l1}: batch 1,000 server CPU per entity no more than before",
                    f"{c.server_us:.1f} vs {base.server_us:.1f} us "
                    f"({c.server_us / base.server_us:.2f}x{drift(c, base)})",
                    c.server_us <= base.server_us * 1.05,
                )
    return lines


def plot(path: Path, cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    native = [c for c in cells if c.path == "native"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 13))
    labels = [c.name for c in native]
    xs = list(range(len(native)))
    ax = axes[0]
    ax.bar(xs, [c.rate for c in native], color="tab:blue")
    ax.set_xticks(xs, labels, fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("requests/s")
    ax.set_title("Throughput per path (native data plane, one worker)")
    ax = axes[1]
    ax.bar([x - 0.2 for x in xs], [c.p50_ms for c in native], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [c.p99_ms for c in native], 0.4, label="p99")
    ax.set_xticks(xs, labels, fontsize=7, rotation=60, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title("Latency percentiles")
    ax.legend()
    ax = axes[2]
    eight = [c for c in cells if c.connections == 8 and c.batch == 10]
    ax.axhline(TARGET_OFF_US, color="grey", ls="--", lw=0.8)
    ax.axhline(TARGET_ON_US, color="grey", ls=":", lw=0.8)
    bars(
        ax,
        [f"{c.path}\n{c.api} L1 {c.l1}" for c in eight],
        {
            "serving worker": [c.server_us for c in eight],
            "redis-server": [c.redis_us for c in eight],
            "load generator": [c.loadgen_us for c in eight],
        },
        title="CPU per entity against Redis's (batch 10, c=8; lines: targets 25 and 8 µs)",
        ylabel="CPU µs per entity (log)",
        log=True,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to measure in the same run")
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, default=2.0, help="the L1's TTL (seconds)")
    parser.add_argument("--stampede-runs", type=int, default=5, help="0: no stampede")
    parser.add_argument("--no-tail", action="store_true", help="no cells at 1,000 connections")
    parser.add_argument(
        "--tails",
        default=",".join(TAILS),
        help=f"the APIs of the tail at scale, of {', '.join(TAILS)} (default: all)",
    )
    parser.add_argument(
        "--only-tails", action="store_true", help="the tail at scale and the stampede only"
    )
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    tail_apis = [a for a in args.tails.split(",") if a]
    if unknown := set(tail_apis) - set(TAILS):
        parser.error(f"--tails: unknown {', '.join(sorted(unknown))}; known: {', '.join(TAILS)}")
    require_tools("wrk", "h2load")
    full = [(b, c) for b in (10, 100) for c in (1, 8, 32)] + [(1000, 8)]
    baseline = [(10, 1), (10, 8)]
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, args.entities)
        runs: list[tuple[str, list[tuple[int, int]], Path | None]] = [
            ("reference", baseline, None),
            ("grpcio", baseline, None),
            (PYTHON_READS, baseline, None),
            (COMPACT, baseline, None),
            ("native", full, None),
        ]
        with contextlib.ExitStack() as stack:
            if args.baseline:
                tree = stack.enter_context(worktree(args.baseline, Path(tmp) / "before"))
                runs.insert(0, ("before", [*baseline, (1000, 8)], tree))
            for path, plan, cwd in [] if args.only_tails else runs:
                for api in ("grpc",) if path == "grpcio" else ("rest", "grpc"):
                    l1s = {PYTHON_READS: (False,), COMPACT: (True,)}.get(path, (False, True))
                    for l1 in l1s:
                        cells += run_server(
                            redis, path, api, l1, plan, args.seconds, Path(tmp), args.ttl, cwd
                        )
        tails = [
            run_tail(redis, api, *TAILS[api], l1, args, Path(tmp))
            for api in ([] if args.no_tail else tail_apis)
            for l1 in (False, True)
        ]
        stampedes = stampede(redis, "native", args.stampede_runs, args.entities, Path(tmp))
    lines = header(
        "One worker; wrk (REST, 1,000 zipfian batches), h2load (gRPC, one batch); "
        f"{args.seconds:g} s per cell, L1 TTL {args.ttl:g} s ({args.seconds / args.ttl:.0f} "
        "TTLs per cell); batches of the standard shape (all 50 features; ten picked in the "
        "picked rows, and all 50 by Feast's names in the feast rows)"
        + (f"; before = {args.baseline}." if args.baseline else ".")
    )
    if cells:
        lines += ["", "## Targets", "", *verdicts(cells)]
    lines += tail_lines(tails, stampedes)
    if cells:
        lines += [
            "",
            "## Every cell",
            "",
            "| path | API | L1 | batch | conns | req/s | p50 ms | p99 ms | errors "
            "| server µs/entity | Redis µs/entity | load generator µs/entity | read from Redis |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for c in cells:
        lines.append(
            f"| {c.path} | {c.api} | {c.l1} | {c.batch} | {c.connections} | {c.rate:,.0f} | "
            f"{c.p50_ms:.2f} | {c.p99_ms:.2f} | {c.errors} | {c.server_us:.1f} | "
            f"{c.redis_us:.1f} | {c.loadgen_us:.1f} | {c.loaded:.0%} |"
        )
    save(args.out, "The serving data plane", lines)
    if args.out and cells:
        plot(args.out.with_suffix(".png"), cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
