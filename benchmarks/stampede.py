"""Cache stampede: identical requests arriving together, with the debouncer on and off.

    python3 benchmarks/stampede.py [--cardinality 100] [--group 1000] [--rounds 20] [--ttl 0.05]

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
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import asyncio
import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import FAILURES, RestConnection, add_data_dir, ensure_data, quantile, rest_requests


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--cardinality", type=int, default=100, help="distinct keys")
    parser.add_argument("--group", type=int, default=1000, help="identical requests at once")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=10, help="entities per request")
    parser.add_argument("--ttl", type=float, default=0.05, help="L1 TTL in seconds")
    add_data_dir(parser)
    args = parser.parse_args()
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
