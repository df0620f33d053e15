"""REST on the native front against uvicorn alone, in steady state and at 1,000 connections.

    python3 benchmarks/rest_front.py [--entities 100000] [--seconds 12] [--ttl 2]
        [--stampede-runs 5] [--out FILE]

`feature-store serve` workers, one after the other on one Redis: REST_FRONT=native (the
extension's HTTP/1.1 front, cache hits answered on its thread) and REST_FRONT=uvicorn (the
baseline, measured in the same run); with the L1 on also the native front with
NATIVE_HITS=off (every hit answered in Python, as before hits.py), and with it off the
native front with NATIVE_READS=off (every lookup answered by its handler, as before
front_reads.py) and with SINGLE_FLIGHT=off (a Redis read per request, by the handler).
Each answers wrk (1,000 zipfian batches of 10 over the standard shape, all 50 features) at
1, 8, 256 and 1,000 connections, with the L1 off and on. With the L1 on its TTL is
``--ttl`` seconds, so every window holds several TTLs: entries expire and are refreshed
inside it (steady state, not a cache that never expires). wrk's timeout is 1 s, so its
timeout count is the number of requests slower than 1 s; the maximum is wrk's. CPU per
entity is read from /proc/<pid>/stat of the worker and of redis-server over each window.

The stampede scenario follows: wrk at 400 connections over 100 distinct batches of 10
(uniform over the entities), L1 TTL 1 s, 15 s per run, ``--stampede-runs`` runs per front,
Redis reads counted by Redis (INFO commandstats: HMGET and HGETALL calls).

Targets (issue: a lookup costs what Redis pays for it): REST at 1,000 connections with no
request past 1 s; in the stampede, no request past 1 s in 5 runs, p99 <= 200 ms, Redis
reads at about one per key per TTL; with the L1 off, server CPU per entity at most 1.5x
Redis's in the same cell; no path slower than before.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import orjson
import redis as redis_py

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, header, save
from cost import _ms, cpu_seconds, wrk_script
from serving import add_data_dir, ensure_data, id_batches

FRONTS = ("uvicorn", "native")
# the native front with every request reading Redis on its own (SINGLE_FLIGHT=off): how the
# L1-off path read before its reads were coalesced, measured beside it
PER_REQUEST = "native, per-request reads"
# the native front with every cache hit answered in Python (NATIVE_HITS=off): how the L1-on
# path answered before hits were answered on the front's thread (serving/fronts/hits.py)
PYTHON_HITS = "native, hits in Python"
# the native front with every lookup without the L1 answered by its handler in Python
# (NATIVE_READS=off): how the L1-off path answered before the front wrote its reads and
# answers (serving/fronts/reads.py)
PYTHON_READS = "native, reads in Python"
CONNECTIONS = (1, 8, 256, 1000)
BATCH = 10
SLOW = 1.0  # seconds: wrk's timeout, so its timeouts are the requests slower than this
STAMPEDE_CONNECTIONS, STAMPEDE_KEYS, STAMPEDE_TTL, STAMPEDE_SECONDS = 400, 100, 1.0, 15.0


@dataclass
class Cell(PerEntity):
    front: str
    l1: str
    connections: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    slow: int  # requests past SLOW seconds (wrk's timeouts)
    errors: int  # non-2xx answers and socket errors other than timeouts
    server_cpu: float
    redis_cpu: float
    batch: ClassVar[int] = BATCH  # entities per request


def run_wrk(url: str, script: Path, seconds: float, connections: int) -> dict[str, float]:
    threads = min(2, connections)
    out = subprocess.run(
        [
            *("wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s"),
            *("--timeout", f"{SLOW:g}s", "--latency", "-s", str(script), url),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    latency = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", out)
    assert latency is not None, out
    try:
        longest = _ms(latency.group(3))
    except ValueError:  # seen once at 1,000 connections: kept, and wrk's output shown
        print(out, flush=True)
        longest = float("nan")
    dist = out[out.index("Latency Distribution") :]
    found = re.search(r"connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    connect, read, write, timeout = (int(x) for x in found.groups()) if found else (0, 0, 0, 0)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),  # type: ignore[union-attr]
        "p50": _ms(re.search(r"\s50%\s+(\S+)", dist).group(1)),  # type: ignore[union-attr]
        "p99": _ms(re.search(r"\s99%\s+(\S+)", dist).group(1)),  # type: ignore[union-attr]
        "max": longest,
        "slow": timeout,
        "errors": connect + read + write + (int(bad.group(1)) if bad else 0),
    }


def run_front(
    redis: EmbeddedRedis,
    front: str,
    l1: bool,
    ttl: float,
    seconds: float,
    entities: int,
    work: Path,
) -> list[Cell]:
    args = ["--cache-ttl", f"{ttl:g}"] if l1 else ["--no-cache"]
    env = {
        "FEATURE_SERVING_SHADOW_FRACTION": "0",
        "FEATURE_SERVING_WARM_START_KEYS": "0",
        "FEATURE_SERVING_REST_FRONT": "uvicorn" if front == "uvicorn" else "native",
        "FEATURE_SERVING_SINGLE_FLIGHT": "off" if front == PER_REQUEST else "on",
        "FEATURE_SERVING_NATIVE_HITS": "off" if front == PYTHON_HITS else "on",
        "FEATURE_SERVING_NATIVE_READS": "off" if front == PYTHON_READS else "on",
    }
    bodies = [
        orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        for ids in id_batches(entities, BATCH, count=1000)
    ]
    script = wrk_script(work / "post.lua", bodies)
    assert redis.process is not None
    cells = []
    with ServingProcess(redis.url, args=args, env=env, grpc=False) as server:
        assert server.process is not None
        url = f"{server.rest_url}/v1/features/get"
        run_wrk(url, script, 2.0, 8)  # warm-up: connections, caches, the L1's first loads
        for connections in CONNECTIONS:
            s0, r0 = cpu_seconds(server.process.pid), cpu_seconds(redis.process.pid)
            t0 = time.monotonic()
            got = run_wrk(url, script, seconds, connections)
            elapsed = time.monotonic() - t0
            cell = Cell(
                front,
                "on" if l1 else "off",
                connections,
                int(got["requests"]),
                elapsed,
                got["p50"],
                got["p99"],
                got["max"],
                int(got["slow"]),
                int(got["errors"]),
                cpu_seconds(server.process.pid) - s0,
                cpu_seconds(redis.process.pid) - r0,
            )
            print(
                f"{front:8} L1 {cell.l1:3} c{connections:<5} {cell.rate:9,.0f} req/s  "
                f"p50 {cell.p50_ms:7.2f} ms  p99 {cell.p99_ms:7.2f} ms  max {cell.max_ms:7.1f} ms  "
                f"past {SLOW:g} s {cell.slow}  server {cell.server_us:5.1f} us/entity  "
                f"Redis {cell.redis_us:4.1f}  errors {cell.errors}",
                flush=True,
            )
            cells.append(cell)
    return cells


@dataclass
class Stampede:
    front: str
    run: int
    requests: int
    p99_ms: float
    max_ms: float
    slow: int
    errors: int
    redis_reads: int  # HMGET + HGETALL calls, as Redis counts them


def redis_reads(url: str) -> int:
    with redis_py.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


def stampede(
    redis: EmbeddedRedis, front: str, runs: int, entities: int, work: Path
) -> list[Stampede]:
    """Many connections on a few batches whose entries expire every second."""
    rng = random.Random(7)
    bodies = [
        orjson.dumps(
            {
                "entity_type": sample.ENTITY,
                "ids": rng.sample(range(entities), BATCH),
                "groups": [sample.GROUP],
            }
        )
        for _ in range(STAMPEDE_KEYS)
    ]
    script = wrk_script(work / "stampede.lua", bodies)
    env = {
        "FEATURE_SERVING_SHADOW_FRACTION": "0",
        "FEATURE_SERVING_WARM_START_KEYS": "0",
        "FEATURE_SERVING_REST_FRONT": "uvicorn" if front == "uvicorn" else "native",
        "FEATURE_SERVING_NATIVE_HITS": "off" if front == PYTHON_HITS else "on",
    }
    args = ["--cache-ttl", f"{STAMPEDE_TTL:g}"]
    out = []
    with ServingProcess(redis.url, args=args, env=env, grpc=False) as server:
        url = f"{server.rest_url}/v1/features/get"
        for run in range(1, runs + 1):
            reads0 = redis_reads(redis.url)
            got = run_wrk(url, script, STAMPEDE_SECONDS, STAMPEDE_CONNECTIONS)
            cell = Stampede(
                front,
                run,
                int(got["requests"]),
                got["p99"],
                got["max"],
                int(got["slow"]),
                int(got["errors"]),
                redis_reads(redis.url) - reads0,
            )
            print(
                f"stampede {front:8} run {run}  {cell.requests:,} requests  "
                f"p99 {cell.p99_ms:7.1f} ms  max {cell.max_ms:7.1f} ms  past {SLOW:g} s "
                f"{cell.slow}  Redis reads {cell.redis_reads:,}  errors {cell.errors}",
                flush=True,
            )
            out.append(cell)
    return out


def find(cells: list[Cell], front: str, l1: str, connections: int) -> Cell:
    return next(
        c for c in cells if c.front == front and c.l1 == l1 and c.connections == connections
    )


def _pair(n: Cell, o: Cell) -> str:
    """The columns the L1 grids compare: rate, p50, max, past SLOW, server and Redis CPU."""
    return (
        f"{n.rate:,.0f} / {o.rate:,.0f} | {n.rate / o.rate:.2f}x | "
        f"{n.p50_ms:.2f} / {o.p50_ms:.2f} | {n.max_ms:,.1f} / {o.max_ms:,.1f} | "
        f"{n.slow} / {o.slow} | {n.server_us:.1f} / {o.server_us:.1f} | "
        f"{n.redis_us:.1f} / {o.redis_us:.1f} |"
    )


def _pair_head(what: str) -> list[str]:
    return [
        f"| conns | req/s ({what}) | ratio | p50 ms | max ms | past {SLOW:g} s "
        "| server µs/entity | Redis µs/entity |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]


def l1_off_tables(cells: list[Cell]) -> list[str]:
    lines = [
        "",
        "## L1 off: reads and answers written on the front against the handler in Python",
        "",
        "The front writes the lookup's Redis commands and its answer, and reads the replies "
        "on Redis connections of its own (NATIVE_READS, serving/fronts/reads.py, "
        "native/src/front/redis.rs); Python: the route's handler (NATIVE_READS=off). Server CPU "
        "per entity against Redis's own in the same cell:",
        "",
        "| conns | server / Redis CPU (front) | server / Redis CPU (Python) |",
        "|---:|---:|---:|",
    ]
    for connections in CONNECTIONS:
        n, o = (find(cells, front, "off", connections) for front in ("native", PYTHON_READS))
        lines.append(
            f"| {connections} | {n.server_us / max(n.redis_us, 1e-9):.2f}x | "
            f"{o.server_us / max(o.redis_us, 1e-9):.2f}x |"
        )
    return [
        *lines,
        *_compare(cells, "off", PYTHON_READS, "", "front / Python"),
        *_compare(
            cells,
            "off",
            PER_REQUEST,
            "L1 off: reads coalesced against a read per request (native front)",
            "coalesced / per request",
        ),
    ]


def l1_on_table(cells: list[Cell]) -> list[str]:
    title = "L1 on: hits answered on the front's thread against hits in Python (native front)"
    return _compare(cells, "on", PYTHON_HITS, title, "front / Python")


def _compare(cells: list[Cell], l1: str, other: str, title: str, what: str) -> list[str]:
    """The native front against ``other`` at every concurrency, under ``title``."""
    lines = ["", f"## {title}", ""] if title else [""]
    lines += _pair_head(what)
    for connections in CONNECTIONS:
        n, o = (find(cells, front, l1, connections) for front in ("native", other))
        lines.append(f"| {connections} | {_pair(n, o)}")
    return lines


def plot(path: Path, cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for l1, style in (("off", "--"), ("on", "-")):
        for front in dict.fromkeys(c.front for c in cells if c.l1 == l1):
            row = [c for c in cells if c.front == front and c.l1 == l1]
            xs = [c.connections for c in row]
            label = f"{front}, L1 {l1}"
            axes[0].plot(xs, [c.rate for c in row], style, marker="o", label=label)
            axes[1].plot(xs, [c.max_ms for c in row], style, marker="o", label=label)
            axes[2].plot(xs, [c.server_us for c in row], style, marker="o", label=label)
    titles = ("requests/s", "maximum latency (ms)", "server CPU µs per entity")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("connections")
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, default=2.0, help="the L1's TTL (seconds)")
    parser.add_argument("--stampede-runs", type=int, default=5, help="0: no stampede")
    parser.add_argument(
        "--l1", choices=("off", "on", "both"), default="both", help="the grids to measure"
    )
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run ./scripts/setup.sh")
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, args.entities)
        grids = {"off": (False,), "on": (True,), "both": (False, True)}[args.l1]
        for l1 in grids:
            for front in (*FRONTS, PYTHON_READS, PER_REQUEST) if not l1 else (*FRONTS, PYTHON_HITS):
                cells += run_front(
                    redis, front, l1, args.ttl, args.seconds, args.entities, Path(tmp)
                )
        stampedes: list[Stampede] = []
        for front in (*FRONTS, PYTHON_HITS):
            stampedes += stampede(redis, front, args.stampede_runs, args.entities, Path(tmp))
    lines = [
        *header(
            f"One worker, REST only; wrk (1,000 zipfian batches of {BATCH}, all 50 features, "
            f"timeout {SLOW:g} s); {args.seconds:g} s per cell; L1 TTL {args.ttl:g} s "
            f"({args.seconds / args.ttl:.0f} TTLs per window). wrk's maximum is of the "
            "requests that finished within its timeout; those past it are counted apart."
        ),
        "",
        "## Native front against uvicorn, same run",
        "",
        "| L1 | conns | req/s (native / uvicorn) | ratio | max ms (native / uvicorn) "
        f"| past {SLOW:g} s (native / uvicorn) | errors (native / uvicorn) "
        "| server µs/entity (native / uvicorn) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    measured = [l1 for l1 in ("off", "on") if any(c.l1 == l1 for c in cells)]
    for l1 in measured:
        for connections in CONNECTIONS:
            n, u = (find(cells, front, l1, connections) for front in ("native", "uvicorn"))
            lines.append(
                f"| {l1} | {connections} | {n.rate:,.0f} / {u.rate:,.0f} | "
                f"{n.rate / u.rate:.2f}x | "
                f"{n.max_ms:,.1f} / {u.max_ms:,.1f} | {n.slow} / {u.slow} | "
                f"{n.errors} / {u.errors} | {n.server_us:.1f} / {u.server_us:.1f} |"
            )
    if "off" in measured:
        lines += l1_off_tables(cells)
    if "on" in measured:
        lines += l1_on_table(cells)
    if stampedes:
        per_ttl = STAMPEDE_KEYS * BATCH * STAMPEDE_SECONDS / STAMPEDE_TTL
        lines += [
            "",
            f"## Stampede: {STAMPEDE_CONNECTIONS} connections, {STAMPEDE_KEYS} batches of "
            f"{BATCH}, L1 TTL {STAMPEDE_TTL:g} s, {STAMPEDE_SECONDS:g} s per run",
            "",
            f"One read per entity per TTL would be {per_ttl:,.0f} Redis reads per run.",
            "",
            f"| front | run | requests | p99 ms | max ms | past {SLOW:g} s | errors "
            "| Redis reads |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for st in stampedes:
            lines.append(
                f"| {st.front} | {st.run} | {st.requests:,} | {st.p99_ms:.1f} | "
                f"{st.max_ms:,.1f} | {st.slow} | {st.errors} | {st.redis_reads:,} |"
            )
    lines += [
        "",
        "## Every cell",
        "",
        "| front | L1 | conns | req/s | p50 ms | p99 ms | max ms | past 1 s | errors "
        "| server µs/entity | Redis µs/entity |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c.front} | {c.l1} | {c.connections} | {c.rate:,.0f} | {c.p50_ms:.2f} | "
            f"{c.p99_ms:.2f} | {c.max_ms:,.1f} | {c.slow} | {c.errors} | {c.server_us:.1f} | "
            f"{c.redis_us:.1f} |"
        )
    save(args.out, "REST: the native front against uvicorn", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
