"""The serving log: what logging served vectors costs the server, what it writes, and how
fast the sink and the training-set job go.

    python3 benchmarks/feature_log.py [--entities 100000] [--seconds 8] [--rounds 3]
        [--out benchmarks/results/feature_log.md]

1. **Server CPU per entity looked up** (/proc/<pid>/stat over each window, next to Redis's
   own) with `--feature-log file://...` at a sample of 1.0 and 0.01 against no log, in the
   same run: batches of 10 zipfian entities x all 50 features of the standard shape, and of
   10 x 6 features, REST (wrk, 1,000 batches) and gRPC (h2load, one batch), the L1 on (TTL
   2 s: four TTLs in each 8 s window; hits on the native fronts) and off (native planned
   reads), 8 connections; and REST with 500 connections, L1 on. --rounds times each, the
   cells in turn in each round, each cell's median round reported (a 2-core machine
   shared with other work: one round's ratios move by several percent). Per cell, the rows
   the log wrote and dropped (a full queue drops; serving never waits).
2. **Log bytes per served entity**: the parquet files' bytes over their rows, per shape.
3. **Rows/s one worker's log thread sustains**: answers of 10 entities queued in process and
   written by the thread (read back into rows, Arrow, parquet with zstd), CPU-bound.
4. **The training-set job**: label rows (random entities and times) joined point in time to
   the log of phase 3 (Spark local[2]), rows/s over the job's own seconds.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import random
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import httpx
import orjson

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.native import REST
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.feature_log import FeatureLog, Served
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, header, save
from cost import cpu_seconds, h2load, require_tools, wrk
from serving import add_data_dir, ensure_data, id_batches

SHAPES = {"50": None, "6": ["float_00", "float_01", "float_02", "int_0", "int_1", "embedding_0"]}
SAMPLES = (None, 0.01, 1.0)  # no log, then the two fractions


@dataclass
class Cell(PerEntity):
    api: str
    l1: str
    shape: str
    connections: int
    sample: float | None
    requests: int
    seconds: float
    p99_ms: float
    errors: int
    server_cpu: float
    redis_cpu: float
    rows: float = 0.0
    dropped: float = 0.0
    bytes: float = 0.0
    batch: ClassVar[int] = 10  # entities per request

    @property
    def label(self) -> str:
        return "none" if self.sample is None else f"{self.sample:g}"


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    )


def bodies(entities: int, features: list[str] | None) -> tuple[list[bytes], bytes]:
    batches = id_batches(entities, 10, count=1000)
    asked: dict[str, object] = {"features": features} if features else {"groups": [sample.GROUP]}
    rest = [orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, **asked}) for ids in batches]
    request = pb.GetFeaturesRequest(entity_type=sample.ENTITY, int_ids=batches[0], **asked)  # type: ignore[arg-type]
    return rest, request.SerializeToString()


def cost_cell(
    r: EmbeddedRedis,
    api: str,
    l1: bool,
    shape: str,
    fraction: float | None,
    connections: int,
    load: tuple[list[bytes], bytes],
    seconds: float,
    work: Path,
) -> Cell:
    args = ["--cache-ttl", "2"] if l1 else ["--no-cache"]
    log = work / f"log-{api}-{l1}-{shape}-{connections}-{fraction}"
    if fraction is not None:
        args += ["--feature-log", f"file://{log}", "--feature-log-sample", str(fraction)]
        args += ["--feature-log-roll-seconds", "2"]
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    assert r.process is not None
    rest, grpc_body = load
    with ServingProcess(r.url, args=args, env=env, grpc=api == "grpc") as server:
        assert server.process is not None

        def run(window: float) -> tuple[int, float, int]:
            if api == "rest":
                url = f"{server.rest_url}/v1/features/get"
                n, _, p99, bad = wrk(url, rest, window, work, connections)
            else:
                n, _, p99, bad = h2load(server.grpc_target, grpc_body, window, work, connections)
            return n, p99, bad

        run(2.0)  # teach the fronts, fill the L1
        text = httpx.get(server.rest_url + "/metrics", timeout=10).text
        rows0, dropped0 = (
            metric(text, "feature_serving_log_rows_total"),
            metric(text, "feature_serving_log_dropped_total"),
        )
        s0, r0, t0 = cpu_seconds(server.process.pid), cpu_seconds(r.process.pid), time.monotonic()
        requests, p99, errors = run(seconds)
        elapsed = time.monotonic() - t0
        s1, r1 = cpu_seconds(server.process.pid), cpu_seconds(r.process.pid)
        cell = Cell(
            api, "on" if l1 else "off", shape, connections, fraction, requests, elapsed,
            p99, errors, s1 - s0, r1 - r0,
        )  # fmt: skip
        if fraction is not None:
            time.sleep(3.0)  # the last rows rolled into files
            text = httpx.get(server.rest_url + "/metrics", timeout=10).text
            cell.rows = metric(text, "feature_serving_log_rows_total") - rows0
            cell.dropped = metric(text, "feature_serving_log_dropped_total") - dropped0
            cell.bytes = metric(text, "feature_serving_log_bytes_total")
            total_rows = metric(text, "feature_serving_log_rows_total")
            cell.bytes = cell.bytes / max(1.0, total_rows)  # bytes per row, whole run
    return cell


def medians(cells: list[Cell]) -> list[Cell]:
    """Per cell (API, L1, shape, connections, sample), the round of the median server CPU
    per entity, in the order of the first round."""
    out: list[Cell] = []
    seen: dict[tuple[object, ...], list[Cell]] = {}
    for c in cells:
        seen.setdefault((c.api, c.l1, c.shape, c.connections, c.sample), []).append(c)
    for rounds in seen.values():
        ordered = sorted(rounds, key=lambda c: c.server_us)
        out.append(ordered[len(ordered) // 2])
    return out


def sink_rate(answers: list[bytes], root: Path, count: int) -> tuple[int, float, float]:
    """Rows, wall seconds and CPU seconds of one log thread writing ``count`` answers."""
    log = FeatureLog(sample.registry(), f"file://{root}", roll_seconds=3600)
    now = int(time.time())
    for i in range(count):
        answer = answers[i % len(answers)]
        log._queue.append(Served(REST, f"b{i}", now * 1000 + i, now, 0, answer))
    log._queued = sum(len(s.answer) for s in log._queue)  # queued here past its bound
    cpu0 = _thread_cpu()
    t0 = time.monotonic()
    log.start()
    log.stop(timeout=3600)
    return count * 10, time.monotonic() - t0, _thread_cpu() - cpu0


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def training_rate(log: Path, work: Path, labels: int, entities: int) -> tuple[int, float]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from feature_store.ingest.job import spark_session
    from feature_store.training import TrainingSetJob, build_training_set

    rng = random.Random(5)
    now = time.time()
    path = work / "labels.parquet"
    pq.write_table(
        pa.table(
            {
                "consumer_id": [rng.randrange(entities) for _ in range(labels)],
                "event_timestamp": pa.array(
                    [int((now + rng.uniform(-60, 600)) * 1e6) for _ in range(labels)],
                    pa.timestamp("us", "UTC"),
                ),
                "label": [rng.random() < 0.1 for _ in range(labels)],
            }
        ),
        path,
    )
    registry = work / "features.yaml"
    registry.write_text(sample.registry_text())
    spark = spark_session(
        "local[2]",
        {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        app_name="feature-log-bench",
    )
    try:
        job = TrainingSetJob(registry, str(path), str(log), str(work / "training"))
        report = build_training_set(spark, job)
    finally:
        spark.stop()
    return report.label_rows, report.seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=8.0, help="per cost cell (8)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="every cell this many times, in turn; medians (3)"
    )
    parser.add_argument("--sink-answers", type=int, default=20_000, help="phase 3 (20000)")
    parser.add_argument("--labels", type=int, default=200_000, help="phase 4 (200000)")
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    require_tools("wrk", "h2load")
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="fs-feature-log-") as tmp:
        work = Path(tmp)
        with EmbeddedRedis(args.data_dir) as r:
            ensure_data(r.url, args.entities)
            plan = [
                (api, l1, shape, 8)
                for shape in SHAPES
                for api in ("rest", "grpc")
                for l1 in ((True, False) if shape == "50" else (True,))
            ] + [("rest", True, "50", 500)]
            answers: list[bytes] = []
            for round_ in range(args.rounds):  # every cell once per round: noise spread evenly
                for api, l1, shape, connections in plan:
                    load = bodies(args.entities, SHAPES[shape])
                    for fraction in SAMPLES:
                        cell = cost_cell(
                            r, api, l1, shape, fraction, connections, load, args.seconds, work
                        )
                        cells.append(cell)
                        print(
                            f"round {round_ + 1}: {api} L1 {cell.l1} {shape} features, "
                            f"{connections} conns, log {cell.label}: "
                            f"{cell.requests / cell.seconds:,.0f} req/s, server "
                            f"{cell.server_us:.2f} us/entity, rows {cell.rows:,.0f}, dropped "
                            f"{cell.dropped:,.0f}",
                            flush=True,
                        )
            with httpx.Client() as http, ServingProcess(r.url, grpc=False) as server:
                for ids in id_batches(args.entities, 10, count=200):
                    body = orjson.dumps(
                        {"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]}
                    )
                    answers.append(
                        http.post(
                            server.rest_url + "/v1/features/get",
                            content=body,
                            headers={"content-type": "application/json"},
                        ).content
                    )
        log = work / "sink"
        rows, wall, cpu = sink_rate(answers, log, args.sink_answers)
        print(f"sink: {rows:,} rows in {wall:.1f} s ({rows / wall:,.0f} rows/s)", flush=True)
        label_rows, job_seconds = training_rate(log, work, args.labels, args.entities)
        print(f"training set: {label_rows:,} label rows in {job_seconds:.1f} s", flush=True)
    lines = [
        *header(
            f"Embedded Redis ({args.entities:,} entities of the standard shape), one "
            f"`feature-store serve` worker per cell, {args.seconds:g} s per cell after a 2 s "
            "warm-up; batches of 10 zipfian entities; wrk (REST) and h2load (gRPC); L1 TTL 2 s; "
            f"the log rolled every 2 s. Every cell ran {args.rounds} times, the cells in turn "
            "in each round; each figure is its cell's median round."
        ),
        "",
        "## Server CPU per entity looked up, with the log and without",
        "",
        "| API | L1 | features | conns | no log µs/entity | log 0.01 µs/entity | ratio | log 1.0 µs/entity | ratio | rows logged at 1.0 (dropped) | Redis µs/entity | req/s (none, 0.01, 1.0) |",  # noqa: E501
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    cells = medians(cells)
    for api, l1, shape, connections in plan:
        group = [
            c
            for c in cells
            if (c.api, c.l1 == "on", c.shape, c.connections) == (api, l1, shape, connections)
        ]
        none, low, full = group
        lines.append(
            f"| {api} | {'on' if l1 else 'off'} | {shape} | {connections} | {none.server_us:.2f} | "
            f"{low.server_us:.2f} | **{low.server_us / none.server_us:.2f}x** | "
            f"{full.server_us:.2f} | **{full.server_us / none.server_us:.2f}x** | "
            f"{full.rows:,.0f} ({full.dropped:,.0f}) | {none.redis_us:.2f} | "
            f"{none.requests / none.seconds:,.0f}, {low.requests / low.seconds:,.0f}, "
            f"{full.requests / full.seconds:,.0f} |"
        )
    by_shape = {
        shape: next(c for c in cells if c.shape == shape and c.sample == 1.0 and c.bytes)
        for shape in SHAPES
    }
    lines += [
        "",
        "## Log bytes per served entity (parquet, zstd)",
        "",
        "| features asked | bytes per logged row |",
        "|---:|---:|",
        *(f"| {shape} | {c.bytes:,.0f} |" for shape, c in by_shape.items()),
        "",
        "## One worker's log thread",
        "",
        f"{rows:,} rows (answers of 10 entities x 50 features) read back, converted and "
        f"written in {wall:.1f} s: **{rows / wall:,.0f} rows/s**, {cpu / rows * 1e6:.1f} µs "
        "of CPU per row.",
        "",
        "## The training-set job",
        "",
        f"{label_rows:,} label rows joined point in time to that log ({rows:,} rows) on "
        f"local[2] in {job_seconds:.1f} s: **{label_rows / job_seconds:,.0f} label rows/s** "
        "(the Spark session's start left out).",
    ]
    if args.out is not None:
        plot(cells, plan, args.out.with_suffix(".png"))
    save(args.out, "The serving log", lines)
    return 0


def plot(cells: list[Cell], plan: list[tuple[str, bool, str, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    names = []
    for i, (api, l1, shape, connections) in enumerate(plan):
        names.append(f"{api}\nL1 {'on' if l1 else 'off'}\n{shape} f, {connections} c")
        group = [
            c
            for c in cells
            if (c.api, c.l1 == "on", c.shape, c.connections) == (api, l1, shape, connections)
        ]
        for j, c in enumerate(group):
            ax.bar(
                i + (j - 1) * width,
                c.server_us,
                width,
                color=f"C{j}",
                label=c.label if i == 0 else None,
            )
    ax.set_xticks(range(len(plan)), names, fontsize=7)
    ax.set_ylabel("server CPU µs per entity")
    ax.set_title("Serving CPU per entity: no log, log sampled 0.01, log 1.0")
    ax.legend(title="log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
