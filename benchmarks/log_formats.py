"""What logging every served answer costs per entity, by how the log is written: today's rows
against the answers' own bytes framed and compressed in blocks (LZ4, zstd), and against
frames that name each entity's cached values, written once per file. Measured on answers a
real server gave, beside that server's own cost of serving them.

    python3 benchmarks/log_formats.py [--entities 100000] [--answers 4000] [--seconds 8]
        [--window 1000000] [--out benchmarks/results/log_formats.md]

1. **Serving, no log**: one `feature-store serve` worker, L1 on (TTL 2 s), batches of 10
   zipfian entities x all 50 features of the standard shape, REST (wrk) and gRPC (h2load),
   8 connections: server CPU per entity (/proc/<pid>/stat over the window), as
   `benchmarks/feature_log.py` measures its "no log" cells.
2. **The answers**: ``--answers`` batches of the same draw asked of that server once each,
   over REST (JSON bodies) and gRPC (`GetFeaturesResponse` messages), kept as the bytes the
   client received; and every entity's stored values as Redis holds them (what an L1 entry
   keeps packed: ``HGETALL``'s values, each behind its length).
3. **Each way of writing them, its CPU and bytes per served entity** (this process's CPU
   over the work, the median of three passes; compressors are the C libraries behind the
   ``lz4`` and ``zstandard`` packages, as a Rust log thread would call them):

   - ``rows``: today's log thread (`FeatureLog`: each answer read back into rows, Arrow,
     parquet with zstd), the same REST answers, after a warm-up of 100;
   - ``answers, lz4`` / ``zstd 1`` / ``zstd 3``: each answer framed (its length, API,
     source, served time and request id, then its bytes) and appended to 1 MiB blocks,
     each block compressed; ``zstd 1, 16 MiB``: the same in blocks of 16 MiB (a longer
     history to find repeated entities in);
   - ``entries by reference``: each answer framed as its request id, served time and, per
     entity, its id and the number of its entry in the file, the entries' stored values
     written once per file (the first time an entry is served in it), both compressed
     with zstd 1; over ``--window`` served entities of the same draw (a file of a minute at
     the rates `feature_log.py` measures holds more: this is a short file). The framing of
     the references is not measured (a few bytes copied per entity on the front): only
     their compression and the entries'.

The projected ratio adds a format's CPU per entity to the server's own and divides by it:
what logging every answer would cost the serving host if the log's work ran in the worker,
against the target of 1.15x. It is a projection for the formats not built, measured
figures on both sides.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import lz4.block
import orjson
import redis
import zstandard

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import bars, header, save
from cost import require_tools
from feature_log import bodies, cost_cell, sink_rate
from serving import add_data_dir, ensure_data, id_batches

BATCH = 10
BLOCK = 1 << 20
TARGET = 1.15  # the serving log's target: logging every answer <= 1.15x no log
GET_FEATURES = "/feature_store.v1.FeatureService/GetFeatures"


@dataclass
class Format:
    name: str
    api: str
    us_per_entity: float  # CPU of writing the log, per served entity
    bytes_per_entity: float  # what it writes, per served entity
    serving_us: float  # the server's own CPU per entity, no log (same run)

    @property
    def projected(self) -> float:
        return (self.serving_us + self.us_per_entity) / self.serving_us


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def frame(api: int, request_id: bytes, served_ms: int, answer: bytes) -> bytes:
    """One answer framed: its length, API, source, served time (unix ms) and request id,
    then its bytes."""
    head = bytes([api, 0]) + served_ms.to_bytes(8, "little") + bytes([len(request_id)])
    return (len(answer)).to_bytes(4, "little") + head + request_id + answer


def blocks(frames: Sequence[bytes], size: int) -> list[bytes]:
    """The frames appended into blocks of at least ``size`` bytes (the last one shorter)."""
    out: list[bytes] = []
    current: list[bytes] = []
    length = 0
    for f in frames:
        current.append(f)
        length += len(f)
        if length >= size:
            out.append(b"".join(current))
            current, length = [], 0
    if current:
        out.append(b"".join(current))
    return out


def timed(work: Callable[[], int], passes: int = 3) -> tuple[float, int]:
    """The median CPU seconds of ``passes`` runs of ``work`` (this process's), and the bytes
    it returned."""
    cpu: list[float] = []
    written = 0
    for _ in range(passes):
        t0 = time.process_time()
        written = work()
        cpu.append(time.process_time() - t0)
    return statistics.median(cpu), written


def compressors() -> dict[str, tuple[Callable[[bytes], bytes], int]]:
    """Each answer format's compressor and block size."""
    z1 = zstandard.ZstdCompressor(level=1)
    z3 = zstandard.ZstdCompressor(level=3)
    return {
        "answers, lz4": (lambda b: lz4.block.compress(b, store_size=True), BLOCK),
        "answers, zstd 1": (z1.compress, BLOCK),
        "answers, zstd 3": (z3.compress, BLOCK),
        "answers, zstd 1, 16 MiB": (z1.compress, 16 * BLOCK),
    }


def answer_formats(answers: list[bytes], api: int) -> dict[str, tuple[float, float]]:
    """Per answer format: CPU µs and bytes per served entity."""
    frames = [
        frame(api, f"{i:024x}".encode(), 1_700_000_000_000 + i, a) for i, a in enumerate(answers)
    ]
    served = len(answers) * BATCH
    out: dict[str, tuple[float, float]] = {}
    for name, (compress, size) in compressors().items():
        chunks = blocks(frames, size)
        cpu, written = timed(lambda c=compress, ch=chunks: sum(len(c(b)) for b in ch))  # type: ignore[misc]
        out[name] = (cpu / served * 1e6, written / served)
    return out


def stored_values(url: str, entities: int) -> list[bytes]:
    """Every entity's stored values as an L1 entry packs them: each value's length (a
    varint), then its bytes."""
    prefix = sample.registry().entities[sample.ENTITY].prefix
    out: list[bytes] = []
    with redis.Redis.from_url(url) as client:
        for start in range(0, entities, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(entities, start + 1000)):
                pipe.hgetall(f"{prefix}:{i}")
            for stored in pipe.execute():
                out.append(b"".join(varint(len(v)) + v for v in stored.values()))
    return out


def by_reference(ids: list[list[int]], values: list[bytes]) -> tuple[float, float, int]:
    """Frames naming each entity's entry in the file, the entries written once each: CPU µs
    and bytes per served entity, and how many entries the file held."""
    numbers: dict[int, int] = {}
    entries: list[bytes] = []
    frames: list[bytes] = []
    for i, batch in enumerate(ids):
        parts = [f"{i:024x}".encode(), (1_700_000_000_000 + i).to_bytes(8, "little")]
        for entity in batch:
            number = numbers.get(entity)
            if number is None:
                number = numbers[entity] = len(entries)
                written = (1_700_000_000).to_bytes(8, "little")  # the group's write time
                entries.append(varint(entity) + written + varint(len(values[entity])))
                entries.append(values[entity])
            parts.append(varint(entity) + varint(number))
        frames.append(b"".join(parts))
    z1 = zstandard.ZstdCompressor(level=1)
    chunks = blocks(frames, BLOCK) + blocks(entries, BLOCK)
    cpu, written = timed(lambda: sum(len(z1.compress(b)) for b in chunks))
    served = sum(len(b) for b in ids)
    return cpu / served * 1e6, written / served, len(numbers)


def grpc_answers(target: str, requests: list[bytes]) -> list[bytes]:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            GET_FEATURES, request_serializer=None, response_deserializer=None
        )
        return [call(r, timeout=10) for r in requests]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--answers", type=int, default=4000, help="answers asked (4000)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per serving window (8)")
    parser.add_argument(
        "--window", type=int, default=1_000_000, help="served entities in one file, by reference"
    )
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    require_tools("wrk", "h2load")
    with tempfile.TemporaryDirectory(prefix="fs-log-formats-") as tmp:
        work = Path(tmp)
        with EmbeddedRedis(args.data_dir) as r:
            ensure_data(r.url, args.entities)
            load = bodies(args.entities, None)
            serving = {
                api: cost_cell(r, api, True, "50", None, 8, load, args.seconds, work).server_us
                for api in ("rest", "grpc")
            }
            batches = id_batches(args.entities, BATCH, count=args.answers)
            rest_bodies = [
                orjson.dumps({"entity_type": sample.ENTITY, "ids": b, "groups": [sample.GROUP]})
                for b in batches
            ]
            grpc_bodies = [
                pb.GetFeaturesRequest(
                    entity_type=sample.ENTITY, int_ids=b, groups=[sample.GROUP]
                ).SerializeToString()
                for b in batches
            ]
            with ServingProcess(r.url, args=["--cache-ttl", "2"], grpc=True) as server:
                with httpx.Client(base_url=server.rest_url, timeout=10) as client:
                    rest = [
                        client.post(
                            "/v1/features/get",
                            content=body,
                            headers={"content-type": "application/json"},
                        ).content
                        for body in rest_bodies
                    ]
                wire = grpc_answers(server.grpc_target, grpc_bodies)
            values = stored_values(r.url, args.entities)
        sink_rate(rest, work / "warm", 100)  # pyarrow imported, its pools made
        rows, _, rows_cpu = sink_rate(rest, work / "rows", len(rest))
        rows_bytes = sum(f.stat().st_size for f in (work / "rows").rglob("*.parquet"))
    results: list[Format] = []
    for api, answers, code in (("rest", rest, 0), ("grpc", wire, 1)):
        if api == "rest":
            results.append(
                Format("rows (today)", api, rows_cpu / rows * 1e6, rows_bytes / rows, serving[api])
            )
        for name, (us, size) in answer_formats(answers, code).items():
            results.append(Format(name, api, us, size, serving[api]))
    window = id_batches(args.entities, BATCH, count=args.window // BATCH)
    ref_us, ref_bytes, held = by_reference(window, values)
    for api in ("rest", "grpc"):
        results.append(Format("entries by reference", api, ref_us, ref_bytes, serving[api]))
    lines = report(args, serving, results, rest, wire, held, len(window) * BATCH)
    save(args.out, "Ways of writing the serving log: CPU and bytes per served entity", lines)
    if args.out is not None:
        plot(args.out.with_suffix(".png"), results)
    return 0


def report(
    args: argparse.Namespace,
    serving: dict[str, float],
    results: list[Format],
    rest: list[bytes],
    wire: list[bytes],
    held: int,
    served: int,
) -> list[str]:
    lines = header(
        f"Embedded Redis ({args.entities:,} entities of the standard shape); one `feature-store "
        f"serve` worker, L1 on (TTL 2 s), batches of {BATCH} zipfian entities x 50 features, 8 "
        f"connections, {args.seconds:g} s per serving window; {args.answers:,} answers kept "
        f"per API (REST {statistics.fmean(map(len, rest)) / BATCH:,.0f} B, gRPC "
        f"{statistics.fmean(map(len, wire)) / BATCH:,.0f} B per entity); today's rows: the same "
        f"REST answers through one log thread; by reference: a file of "
        f"{served:,} served entities, {held:,} entries in it. CPU: the median of 3 passes "
        f"(today's rows: one pass, the log thread's process CPU)."
    )
    lines += [
        "",
        "| API | format | log CPU µs/entity | log bytes/entity | serving µs/entity (no log) | "
        "projected x no log |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for f in results:
        lines.append(
            f"| {f.api} | {f.name} | {f.us_per_entity:.2f} | {f.bytes_per_entity:,.0f} | "
            f"{f.serving_us:.2f} | {f.projected:.2f}x |"
        )
    lines.append("")
    for f in results:
        verdict = "within" if f.projected <= TARGET else "past"
        lines.append(
            f"- {f.api}, {f.name}: {f.projected:.2f}x serving alone ({verdict} {TARGET}x), "
            f"{f.bytes_per_entity:,.0f} bytes per served entity"
        )
    return lines


def plot(path: Path, results: list[Format]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    names = list(dict.fromkeys(f.name for f in results))
    for ax, field, label, log in (
        (left, "projected", "serving CPU with the log, x no log", False),
        (right, "bytes_per_entity", "log bytes per served entity", True),
    ):
        series = {
            api: [
                next((getattr(f, field) for f in results if f.api == api and f.name == n), 0.0)
                for n in names
            ]
            for api in ("rest", "grpc")
        }
        bars(ax, [n.replace(", ", "\n") for n in names], series, title=label, ylabel=label, log=log)
        if field == "projected":
            ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
