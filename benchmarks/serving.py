"""Closed-loop load against the serving API, REST and gRPC, with the L1 cache on and off.

    python3 benchmarks/serving.py [--entities 100000] [--seconds 3] [--out FILE]

Standard shape (100,000 consumers x 50 features, zipfian ids). Batches of 10 and 100
entities x all 50 features, at concurrency 1, 8 and 32. Each server is a
`feature-store serve` process with one worker; this process is the load generator:
closed loop, each of C workers sends a request and waits for the answer before the next.
REST uses raw keep-alive HTTP/1.1 connections and gRPC one HTTP/2 channel, both sending
pre-built requests and not decoding answers, so that the client costs little CPU.

The floor, measured in the same run at the same concurrency: AsyncFeatureStore.read in
this process (no HTTP, no server), i.e. the async store client's own batch read.

The machine has 2 cores shared by Redis, the server, this load generator and other work:
absolute figures are noisy, ratios measured in the same run are the honest comparison.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import asyncio
import gc
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import orjson
import redis

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.process import ServingProcess
from feature_store.store import AsyncFeatureStore, FeatureStore

FEAST = {"rps_c1": 176.0, "p50_c1": 5.1, "p99_c1": 9.8, "rps_c32": 178.0, "p99_c32": 327.0}
GET_FEATURES = "/feature_store.v1.FeatureService/GetFeatures"
FAILURES: Counter[str] = Counter()  # non-200 answers by status and message, reported at the end


@dataclass
class Cell:
    api: str
    l1: str
    batch: int
    concurrency: int
    rps: float
    p50: float
    p95: float
    p99: float
    errors: int


def quantile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    """--data-dir, shared by the serving benchmarks: one embedded Redis with the data."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "feature-store-bench" / "serving-redis",
        help="the embedded Redis's files; kept between runs so the data loads once",
    )


def ensure_data(url: str, entities: int) -> None:
    with redis.Redis.from_url(url) as client:
        if client.dbsize() >= entities:
            return
    print(f"loading {entities:,} entities of the standard shape ...", flush=True)
    t0 = time.perf_counter()
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(entities))
    print(f"loaded in {time.perf_counter() - t0:.0f}s", flush=True)


def id_batches(entities: int, batch: int, count: int = 4000) -> list[list[int]]:
    zipf = sample.Zipf(entities, seed=batch)
    return [zipf.sample(batch) for _ in range(count)]


async def closed_loop(
    call: Callable[[int], Awaitable[bool]], concurrency: int, seconds: float, warmup: float
) -> tuple[float, list[float], int]:
    """C workers calling back to back; latencies of calls that started after the warmup."""
    latencies: list[float] = []
    errors = 0
    counter = 0
    start = time.perf_counter()
    measure_from = start + warmup
    stop = measure_from + seconds

    async def worker() -> None:
        nonlocal counter, errors
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            counter += 1
            ok = await call(counter)
            t1 = time.perf_counter()
            if t0 >= measure_from:
                latencies.append((t1 - t0) * 1000)
                errors += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - measure_from
    return len(latencies) / elapsed, sorted(latencies), errors


class RestConnection:
    """One keep-alive HTTP/1.1 connection sending prepared requests (a tiny wrk)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> RestConnection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, request: bytes) -> bool:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        i = head.lower().index(b"content-length:")
        length = int(head[i + 15 : head.index(b"\r\n", i)])
        body = await self.reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200"):
            FAILURES[head[9:12].decode() + " " + body[:120].decode(errors="replace")] += 1
            return False
        return True

    def close(self) -> None:
        self.writer.close()


def rest_requests(batches: list[list[int]]) -> list[bytes]:
    out = []
    for ids in batches:
        body = orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        head = (
            "POST /v1/features/get HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


async def bench_rest(
    port: int, batches: list[list[int]], concurrency: int, seconds: float, warmup: float
) -> tuple[float, list[float], int]:
    requests = rest_requests(batches)
    conns = [await RestConnection.open(port) for _ in range(concurrency)]
    free = list(conns)

    async def call(n: int) -> bool:
        conn = free.pop()
        try:
            return await conn.call(requests[n % len(requests)])
        finally:
            free.append(conn)

    try:
        return await closed_loop(call, concurrency, seconds, warmup)
    finally:
        for c in conns:
            c.close()


async def bench_grpc(
    target: str, batches: list[list[int]], concurrency: int, seconds: float, warmup: float
) -> tuple[float, list[float], int]:
    requests = [
        pb.GetFeaturesRequest(
            entity_type=sample.ENTITY, int_ids=ids, groups=[sample.GROUP]
        ).SerializeToString()
        for ids in batches
    ]
    async with grpc.aio.insecure_channel(target) as channel:
        method = channel.unary_unary(GET_FEATURES)  # bytes in, bytes out: no decoding

        async def call(n: int) -> bool:
            try:
                await method(requests[n % len(requests)], timeout=10)
            except grpc.aio.AioRpcError as e:
                FAILURES[f"gRPC {e.code().name} {e.details()}"] += 1
                return False
            return True

        return await closed_loop(call, concurrency, seconds, warmup)


async def bench_floor(
    url: str, batches: list[list[int]], concurrency: int, seconds: float, warmup: float
) -> tuple[float, list[float], int]:
    store = AsyncFeatureStore.connect(url, sample.registry())

    async def call(n: int) -> bool:
        await store.read(sample.ENTITY, batches[n % len(batches)], groups=[sample.GROUP])
        return True

    try:
        return await closed_loop(call, concurrency, seconds, warmup)
    finally:
        await store.close()


def cell(api: str, l1: str, batch: int, c: int, result: tuple[float, list[float], int]) -> Cell:
    rps, lat, errors = result
    return Cell(
        api, l1, batch, c, rps, quantile(lat, 0.5), quantile(lat, 0.95), quantile(lat, 0.99), errors
    )


async def run(args: argparse.Namespace, url: str, servers: dict[str, ServingProcess]) -> list[Cell]:
    cells: list[Cell] = []
    for batch in args.batches:
        batches = id_batches(args.entities, batch)
        for c in args.concurrency:
            cells.append(
                cell(
                    "store client",
                    "-",
                    batch,
                    c,
                    await bench_floor(url, batches, c, args.seconds, args.warmup),
                )
            )
            print(format_row(cells[-1], cells[-1]), flush=True)
            floor = cells[-1]
            for l1, server in servers.items():
                r = await bench_rest(server.port, batches, c, args.seconds, args.warmup)
                cells.append(cell("REST", l1, batch, c, r))
                print(format_row(cells[-1], floor), flush=True)
                g = await bench_grpc(server.grpc_target, batches, c, args.seconds, args.warmup)
                cells.append(cell("gRPC", l1, batch, c, g))
                print(format_row(cells[-1], floor), flush=True)
    return cells


HEADER = (
    "| API | L1 | batch | conc. | req/s | p50 ms | p95 ms | p99 ms | req/s vs floor | errors |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def format_row(c: Cell, floor: Cell) -> str:
    return (
        f"| {c.api} | {c.l1} | {c.batch} | {c.concurrency} | {c.rps:,.0f} | {c.p50:.2f} | "
        f"{c.p95:.2f} | {c.p99:.2f} | {c.rps / floor.rps:.2f}x | {c.errors} |"
    )


def targets(cells: list[Cell]) -> list[str]:
    def find(api: str, l1: str, batch: int, c: int) -> Cell | None:
        for x in cells:
            if (x.api, x.l1, x.batch, x.concurrency) == (api, l1, batch, c):
                return x
        return None

    lines = []
    off1, off32, on32 = (
        find("REST", "off", 10, 1),
        find("REST", "off", 10, 32),
        find("REST", "on", 10, 32),
    )
    on1 = find("REST", "on", 10, 1)

    def check(ok: bool) -> str:
        return "met" if ok else "MISSED"

    if off32:
        lines.append(
            f"- REST, L1 off, batch 10, concurrency 32: {off32.rps:,.0f} req/s (target >= 1,000: "
            f"{check(off32.rps >= 1000)}); {off32.rps / FEAST['rps_c32']:.1f}x Feast's 178 req/s"
        )
    if off1:
        lines.append(
            f"- REST, L1 off, batch 10, concurrency 1: p50 {off1.p50:.2f} ms (target <= 1.5: "
            f"{check(off1.p50 <= 1.5)}), p99 {off1.p99:.2f} ms (target <= 3: "
            f"{check(off1.p99 <= 3)}); Feast: p50 5.1 ms, p99 9.8 ms"
        )
    if on32:
        lines.append(
            f"- REST, L1 on, batch 10, concurrency 32: {on32.rps:,.0f} req/s (target >= 2,000: "
            f"{check(on32.rps >= 2000)}); {on32.rps / FEAST['rps_c32']:.1f}x Feast"
        )
    if on1:
        lines.append(
            f"- REST, L1 on, batch 10, concurrency 1: {on1.rps:,.0f} req/s, p50 {on1.p50:.2f} ms, "
            f"p99 {on1.p99:.2f} ms; {on1.rps / FEAST['rps_c1']:.1f}x Feast's 176 req/s"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured, per cell")
    parser.add_argument("--batches", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    add_data_dir(parser)
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    with EmbeddedRedis(args.data_dir) as server:
        ensure_data(server.url, args.entities)
        with (
            ServingProcess(server.url) as on,
            ServingProcess(server.url, args=["--no-cache"]) as off,
        ):
            print(f"Python {platform.python_version()}, {sys.platform}; servers: 1 worker each")
            print(HEADER)
            gc.disable()  # the load generator's own pauses would show up as server latency
            try:
                import uvloop

                cells = uvloop.run(run(args, server.url, {"on": on, "off": off}))
            finally:
                gc.enable()
    summary = targets(cells)
    for failure, count in FAILURES.most_common():
        summary.append(f"- failed requests: {count} x {failure}")
    print("\n".join(summary))
    if args.out:
        floor_of = {}
        rows = []
        for c in cells:
            if c.api == "store client":
                floor_of[(c.batch, c.concurrency)] = c
            rows.append(format_row(c, floor_of[(c.batch, c.concurrency)]))
        args.out.write_text("\n".join([HEADER, *rows, "", *summary, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
