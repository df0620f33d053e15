"""Cache stampede: identical requests arriving together, with the debouncer on and off.

    python3 benchmarks/stampede.py [--cardinality 100] [--group 1000] [--rounds 20] [--ttl 0.05]
    python3 benchmarks/stampede.py --hot [--hot-seconds 6] [--hot-connections 200] [--out FILE]

Modelled on a load tool's stampede options: ``cardinality`` distinct keys, and ``group``
identical requests sent at once for one key. A key is one batch of ``batch`` entities
(10 by default: the standard shape's request) x all 50 features. Each round takes the
next key, round-robin over the cardinality, and sends ``group`` identical requests for it
over REST, one keep-alive connection per request (opened before the first round), so
that all of them reach the server together; the round ends when every answer is back.
The L1 TTL is short, so a key has expired by its next round, and expires again during a
round.

Two `feature-store serve` processes with the same L1 settings; only the debouncer differs:
- on:  single-flight and coalescing: concurrent misses on a key share one Redis read;
- off: every request that misses reads Redis itself (FEATURE_SERVING_SINGLE_FLIGHT=off).
XFetch early refresh is off in both, so the figures isolate the debouncer.

Redis reads are counted by the Redis server (INFO commandstats, HMGET + HGETALL calls), not
by the code under test. Targets: >= 100x fewer Redis reads per request, p99 >= 80% lower.

``--hot``: a sustained stampede on hot keys, with the serving defaults (shadow checks on,
XFetch on, jitter): ``wrk`` (compiled, so the load does not eat the server's core) keeps
``hot-connections`` connections asking for the same batch of 10 keys for ``hot-seconds``,
with an L1 TTL of 1 s. Redis's reads are counted per key per TTL window: the debouncer
alone reads about one. Three servers in turn: the defaults; shadow checks bounded per entry
only (``SHADOW_MAX_PER_SECOND=0``); shadow checks off (the debouncer's own reads).
Target: with the defaults, <= 1.2 reads per key per TTL window.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import asyncio
import gc
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import header, save
from cost import _ms, cpu_seconds, wrk_script
from serving import FAILURES, RestConnection, add_data_dir, ensure_data, quantile, rest_requests

HOT_TARGET = 1.2  # Redis reads per key per TTL window, with the defaults


@dataclass
class Result:
    mode: str
    requests: int
    reads: int
    seconds: float
    p50: float
    p99: float
    errors: int

    @property
    def reads_per_request(self) -> float:
        return self.reads / self.requests


def entity_reads(url: str) -> int:
    """Entity reads (HMGET or HGETALL) the Redis server has executed since its stats reset."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


async def stampede(
    port: int, url: str, keys: list[list[int]], group: int, rounds: int, mode: str
) -> Result:
    requests = rest_requests(keys)
    conns = []
    for _ in range(group):  # opened up front, so that a round is only the requests
        conns.append(await RestConnection.open(port))
    latencies: list[float] = []
    errors = 0

    async def one(conn: RestConnection, request: bytes) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        if not await conn.call(request):
            errors += 1
        latencies.append((time.perf_counter() - t0) * 1000)

    try:
        await one(conns[0], requests[-1])  # the last key is not used by the rounds below
        latencies.clear()
        before = entity_reads(url)
        t0 = time.perf_counter()
        for r in range(rounds):
            request = requests[r % (len(requests) - 1)]
            await asyncio.gather(*(one(c, request) for c in conns))
        elapsed = time.perf_counter() - t0
        reads = entity_reads(url) - before
    finally:
        for c in conns:
            c.close()
    latencies.sort()
    return Result(
        mode,
        len(latencies),
        reads,
        elapsed,
        quantile(latencies, 0.5),
        quantile(latencies, 0.99),
        errors,
    )


@dataclass
class Hot:
    mode: str
    requests: int
    seconds: float
    reads: int
    keys: int
    ttl: float
    p99_ms: float
    max_ms: float
    errors: int
    server_cpu: float

    @property
    def per_key_window(self) -> float:
        return self.reads / (self.keys * self.seconds / self.ttl)


def hot(
    url: str, keys: list[int], args: argparse.Namespace, mode: str, extra: dict[str, str]
) -> Hot:
    """One server with ``extra`` settings under wrk's sustained stampede on ``keys``."""
    env = {"FEATURE_SERVING_CACHE_TTL": "1", **extra}
    body = rest_requests([keys])[0].split(b"\r\n\r\n", 1)[1]
    with (
        ServingProcess(url, env=env, grpc=False) as serving,
        tempfile.TemporaryDirectory() as tmp,
    ):
        script = wrk_script(Path(tmp) / "hot.lua", [body])
        target = f"http://127.0.0.1:{serving.port}/v1/features/get"
        subprocess.run(
            ["wrk", "-t1", "-c8", "-d1s", "-s", str(script), target],
            check=True,
            capture_output=True,
        )  # warm: the form learned, the keys loaded
        before, cpu = entity_reads(url), cpu_seconds(serving.process.pid)
        out = subprocess.run(
            [
                *("wrk", "-t1", f"-c{args.hot_connections}", f"-d{args.hot_seconds:g}s"),
                *("--latency", "-s", str(script), target),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        reads, cpu = entity_reads(url) - before, cpu_seconds(serving.process.pid) - cpu
    requests = int(re.search(r"(\d+) requests in ([\d.]+)s", out).group(1))  # type: ignore[union-attr]
    seconds = float(re.search(r"requests in ([\d.]+)s", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"\s99%\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    top = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return Hot(
        mode,
        requests,
        seconds,
        reads,
        len(keys),
        1.0,
        _ms(p99),
        _ms(top),
        int(bad.group(1)) if bad else 0,
        cpu,
    )


def run_hot(args: argparse.Namespace) -> int:
    keys = sample.Zipf(args.entities, seed=7).order[:10]
    modes = (
        ("defaults", {}),
        ("shadow bounded per entry only", {"FEATURE_SERVING_SHADOW_MAX_PER_SECOND": "0"}),
        ("shadow off (the debouncer alone)", {"FEATURE_SERVING_SHADOW_FRACTION": "0"}),
    )
    with EmbeddedRedis(args.data_dir) as server:
        ensure_data(server.url, args.entities)
        cells = [hot(server.url, keys, args, mode, extra) for mode, extra in modes]
    lines = header(
        f"One `feature-store serve` worker at a time, REST, L1 TTL 1 s, other settings at "
        f"their defaults (shadow fraction 0.01, XFetch on, jitter 0.1); wrk with "
        f"{args.hot_connections} connections asking for the same batch of {len(keys)} keys "
        f"for {args.hot_seconds:g} s. Redis reads are HMGET + HGETALL calls from INFO "
        f"commandstats."
    )
    lines += [
        "",
        "| settings | req/s | Redis reads | reads per key per TTL | p99 ms | max ms | non-2xx "
        "| server CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c.mode} | {c.requests / c.seconds:,.0f} | {c.reads:,} | "
            f"{c.per_key_window:.2f} | {c.p99_ms:.1f} | {c.max_ms:.1f} | {c.errors} | "
            f"{c.server_cpu:.2f} |"
        )
    default, alone = cells[0], cells[-1]
    met = default.per_key_window <= HOT_TARGET
    lines += [
        "",
        f"- with the defaults: {default.per_key_window:.2f} Redis reads per key per TTL window "
        f"(target <= {HOT_TARGET}: {'met' if met else 'MISSED'}), "
        f"{default.reads / max(alone.reads, 1):.2f}x the debouncer's own reads",
    ]
    save(args.out, "Stampede on hot keys, with the serving defaults", lines)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--cardinality", type=int, default=100, help="distinct keys")
    parser.add_argument("--group", type=int, default=1000, help="identical requests at once")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=10, help="entities per request")
    parser.add_argument("--ttl", type=float, default=0.05, help="L1 TTL in seconds")
    parser.add_argument("--hot", action="store_true", help="the sustained stampede on hot keys")
    parser.add_argument("--hot-seconds", type=float, default=6.0)
    parser.add_argument("--hot-connections", type=int, default=200)
    parser.add_argument("--out", type=Path, help="write the --hot results here (markdown)")
    add_data_dir(parser)
    args = parser.parse_args()
    if args.hot:
        return run_hot(args)
    order = sample.Zipf(args.entities, seed=7).order
    keys = [order[i * args.batch : (i + 1) * args.batch] for i in range(args.cardinality + 1)]
    env = {
        "FEATURE_SERVING_CACHE_TTL": str(args.ttl),
        "FEATURE_SERVING_CACHE_JITTER": "0",
        "FEATURE_SERVING_XFETCH_BETA": "0",
        "FEATURE_SERVING_SHADOW_FRACTION": "0",  # count the debouncer's reads only
    }
    results = []
    with EmbeddedRedis(args.data_dir) as server:
        ensure_data(server.url, args.entities)
        for mode, extra in (("on", {}), ("off", {"FEATURE_SERVING_SINGLE_FLIGHT": "off"})):
            with ServingProcess(server.url, env={**env, **extra}, grpc=False) as serving:
                gc.disable()
                try:
                    results.append(
                        asyncio.run(
                            stampede(
                                serving.port,
                                server.url,
                                keys,
                                args.group,
                                args.rounds,
                                mode,
                            )
                        )
                    )
                finally:
                    gc.enable()
    print(
        f"cardinality {args.cardinality}, group {args.group}, batch {args.batch}, "
        f"{args.rounds} rounds, "
        f"L1 TTL {args.ttl * 1000:.0f} ms, REST, one worker per server"
    )
    print(
        "| debouncer | requests | Redis reads | reads/request | req/s | p50 ms | p99 ms | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.mode} | {r.requests:,} | {r.reads:,} | {r.reads_per_request:.4f} | "
            f"{r.requests / r.seconds:,.0f} | {r.p50:.1f} | {r.p99:.1f} | {r.errors} |"
        )
    on, off = results
    for failure, count in FAILURES.most_common():
        print(f"- failed requests: {count} x {failure}")
    fewer = off.reads / max(on.reads, 1)
    lower = 1 - on.p99 / off.p99
    print(
        f"- Redis reads: {fewer:,.0f}x fewer with the debouncer (target >= 100x: "
        f"{'met' if fewer >= 100 else 'MISSED'})"
    )
    print(
        f"- p99: {lower:.0%} lower with the debouncer (target >= 80%: "
        f"{'met' if lower >= 0.8 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
