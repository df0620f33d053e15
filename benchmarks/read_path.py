"""Batch-read latency of the async store client against a raw redis-py pipeline.

    python3 benchmarks/read_path.py [--entities 100000] [--iterations 2000] [--out FILE]

Standard shape, zipfian ids, batches of 10 and 100 entities x all 50 features. Three
readers take turns on every iteration, so machine noise hits them alike:

- raw HMGET: a redis-py asyncio pipeline of one HMGET per entity, values left as bytes;
- raw same commands: the same pipeline of what our client sends (HGETALL, since a whole
  group is most of the hash), replies left as redis-py returns them;
- ours: AsyncFeatureStore.read: validation, keys, the pipeline, decoding to typed values,
  statuses and ages.

Target: our p50 at most 1.5x the raw HMGET pipeline's.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio

from feature_store import sample
from feature_store.batch import plan_read
from feature_store.embedded import EmbeddedRedis
from feature_store.store import AsyncFeatureStore, FeatureStore


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=1000, method="inclusive")[int(q * 1000) - 1]


async def run(url: str, entities: int, iterations: int, batch: int) -> list[str]:
    registry = sample.registry()
    group = registry.group(sample.GROUP)
    fields = [f.field for f in group.features] + [group.freshness_field]
    zipf = sample.Zipf(entities, seed=batch)
    raw = redis.asyncio.Redis.from_url(url)
    store = AsyncFeatureStore.connect(url, registry)

    async def raw_hmget(ids: list[int]) -> object:
        pipe = raw.pipeline(transaction=False)
        for i in ids:
            pipe.execute_command("HMGET", f"c:{i}".encode(), *fields)
        return await pipe.execute()

    async def raw_same(ids: list[int]) -> object:
        plan = plan_read(registry, sample.ENTITY, ids, groups=[sample.GROUP])
        pipe = raw.pipeline(transaction=False)
        for cmd in plan.commands():
            pipe.execute_command(*cmd)
        return await pipe.execute()

    async def ours(ids: list[int]) -> object:
        return await store.read(sample.ENTITY, ids, groups=[sample.GROUP])

    readers: dict[str, Callable[[list[int]], Awaitable[object]]] = {
        "raw HMGET pipeline": raw_hmget,
        "raw pipeline, same commands": raw_same,
        "AsyncFeatureStore.read": ours,
    }
    timings: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(200):  # warm-up: connections, caches
        ids = zipf.sample(batch)
        for fn in readers.values():
            await fn(ids)
    gc.collect()
    gc.freeze()  # as a serving worker does after warm-up
    for _ in range(iterations):
        ids = zipf.sample(batch)
        for name, fn in readers.items():
            t0 = time.perf_counter()
            await fn(ids)
            timings[name].append((time.perf_counter() - t0) * 1000)
    gc.unfreeze()
    await raw.aclose()
    await store.close()

    base = statistics.median(timings["raw HMGET pipeline"])
    lines = []
    for name, samples in timings.items():
        p50 = statistics.median(samples)
        lines.append(
            f"| {batch} x 50 | {name} | {p50:.3f} | {percentile(samples, 0.99):.3f} "
            f"| {p50 / base:.2f}x |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp, persistence=False) as server:
        t0 = time.perf_counter()
        with FeatureStore.connect(server.url, sample.registry()) as sync:
            sync.write(sample.GROUP, sample.rows(args.entities))
        print(f"loaded {args.entities:,} entities in {time.perf_counter() - t0:.1f}s")
        lines = [
            f"Standard shape, {args.entities:,} entities, zipfian ids, {args.iterations:,} "
            "batches per reader, readers interleaved. Latency in ms.",
            "",
            "| batch | reader | p50 | p99 | p50 vs raw HMGET |",
            "|---|---|---:|---:|---:|",
        ]
        for batch in (10, 100):
            iterations = args.iterations if batch == 10 else max(args.iterations // 4, 100)
            lines += asyncio.run(run(server.url, args.entities, iterations, batch))
    lines += ["", "Target: AsyncFeatureStore.read p50 at most 1.5x the raw HMGET pipeline."]
    table = "\n".join(lines)
    print(table)
    if args.out:
        command = " ".join(["python3 benchmarks/read_path.py", *sys.argv[1:]])
        args.out.write_text(f"# Read path\n\nCommand: `{command}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
