"""Ingest benchmark: the Spark job against the raw redis-py pipeline ceiling, same run.

    python3 benchmarks/ingest.py --entities 1000000

1. Generates the standard shape with ``feature-store generate``'s code (cached by size and
   seed under --data-dir) as parquet.
2. Ceiling: the same entities' HSET commands, pre-encoded by ``plan_write`` outside the
   timing (chunk by chunk), sent by one redis-py client in pipelines of --chunk-size; no
   Spark. Only the pipelines are timed. Same entity count as the job unless
   --ceiling-entities says otherwise, so Redis grows to the same size in both.
3. The job on Spark local[2] writing all --entities, timed end to end (``elapsed`` in
   the report: from reading the input to the last pipeline, Spark startup excluded).
4. A second, profiled job run (cProfile in every task) on --profile-entities rows, to
   show where a task's time goes; cProfile slows Python code, so its rate is not used.

Each phase gets a fresh EmbeddedRedis with persistence off. Prints values/s of both and
their ratio; --markdown appends the figures to a results file.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import glob
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import redis

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.generate import ID_COLUMN, write_sample
from feature_store.ingest.job import IngestJob, run_ingest, spark_session
from feature_store.ingest.report import IngestReport
from feature_store.layout import unguarded

TARGET_RATIO = 0.40
TARGET_RATE = 600_000


@contextlib.contextmanager
def fresh_redis(base: Path, name: str) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(base / name, persistence=False) as server:
        yield server


def ceiling(url: str, data: str, entities: int, chunk: int) -> tuple[float, int]:
    """values/s of raw pipelined HSET of pre-encoded fields, and the values sent.

    Each chunk is encoded by plan_write outside the clock, then sent inside it: only the
    pipelines are timed, and no more than one chunk of commands is held at a time.
    """
    group = sample.registry().group(sample.GROUP)
    names = [f.name for f in group.features]
    client = redis.Redis.from_url(url)
    values = 0
    sending = 0.0
    left = entities
    for path in sorted(glob.glob(os.path.join(data, "*.parquet"))):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk):
            if left <= 0:
                break
            cols = batch.to_pydict()
            rows = [
                (cols[ID_COLUMN][i], {n: cols[n][i] for n in names})
                for i in range(min(batch.num_rows, left))
            ]
            left -= len(rows)
            plan = plan_write(group, rows)
            commands = [h for c in plan.commands for h in unguarded(c) if h[0] == "HSET"]
            values += sum((len(c) - 4) // 2 for c in commands)  # minus key, freshness
            t0 = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for cmd in commands:
                pipe.execute_command(*cmd)
            pipe.execute()
            sending += time.perf_counter() - t0
    client.close()
    return values / sending, values


# (label, file suffix, function): cumulative time of these calls inside the tasks
ENTRY_POINTS = (
    ("task total (mapInArrow function)", "ingest/task.py", "_write_partition"),
    ("  encode: BatchEncoder.encode", "ingest/encode.py", "encode"),
    ("    float columns (memo + numpy)", "ingest/encode.py", "_encode_floats"),
    ("      of which shared codec encode_float32", "serialization/codecs.py", "encode_float32"),
    ("    int columns (shared codec per value)", "ingest/encode.py", "_encode_values"),
    ("    int_list columns (numpy varints + snappy)", "ingest/encode.py", "_encode_int_lists"),
    ("    embedding columns (float32 buffer)", "ingest/encode.py", "_encode_embeddings"),
    ("    entity keys", "ingest/encode.py", "_keys"),
    ("  redis: ChunkWriter.write", "ingest/writer.py", "write"),
    ("    command tuples (EncodedBatch.commands)", "ingest/encode.py", "commands"),
    ("    one pipeline round trip (send_packed)", "sending.py", "send_packed"),
    ("      of which hiredis.pack_command", "~", "<built-in method hiredis.hiredis.pack_command>"),
    ("      of which sendall", "~", "<method 'sendall' of '_socket.socket' objects>"),
    (
        "      of which waiting for replies (recv)",
        "~",
        "<method 'recv_into' of '_socket.socket' objects>",
    ),
    ("  quarantine + stats batches", "ingest/task.py", "_stats"),
)


def profile_summary(profile_dir: str, top: int) -> str:
    files = glob.glob(os.path.join(profile_dir, "*.prof"))
    stats = pstats.Stats(*files, stream=sys.stdout)
    table = stats.stats  # type: ignore[attr-defined]
    cum: dict[str, float] = defaultdict(float)
    for label, suffix, func in ENTRY_POINTS:
        for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in table.items():
            if name == func and filename.endswith(suffix if suffix != "~" else "~"):
                cum[label] += ct
    total = cum[ENTRY_POINTS[0][0]] or 1.0
    out = [
        f"cProfile of {len(files)} tasks (cumulative seconds; cProfile inflates Python-heavy "
        "parts):"
    ]
    for label, _suffix, _func in ENTRY_POINTS:
        out.append(f"  {label:<50}{cum[label]:8.1f}s  {cum[label] / total:6.1%}")
    top_level = [
        label for label, _s, _f in ENTRY_POINTS if label.startswith("  ") and label[2] != " "
    ]
    rest = total - sum(cum[label] for label in top_level)
    out.append(
        f"  {'  rest: Arrow batches from Spark, counters':<50}{rest:8.1f}s  {rest / total:6.1%}"
    )
    rows = sorted(
        ((v[2], f"{_short(k[0])}:{k[1]}({k[2]})") for k, v in table.items()), reverse=True
    )
    out.append(f"top {top} functions by own time:")
    for t, name in rows[:top]:
        out.append(f"  {t:8.2f}s  {t / total:6.1%}  {name}")
    return "\n".join(out)


def _short(filename: str) -> str:
    for marker in ("site-packages/", "feature_store/", "lib/python3"):
        if marker in filename:
            return filename[filename.index(marker) :]
    return filename


def run_job(spark: object, data: str, url: str, chunk: int, **kw: object) -> IngestReport:
    registry = Path(tempfile.mkdtemp()) / "features.yaml"
    registry.write_text(sample.registry_text())
    job = IngestJob(
        registry=registry,
        group=sample.GROUP,
        input=data,
        id_column=ID_COLUMN,
        redis_url=url,
        chunk_size=chunk,
        progress_interval=15,
        **kw,  # type: ignore[arg-type]
    )
    return run_ingest(spark, job, progress=lambda line: print(line, flush=True))  # type: ignore[arg-type]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--entities", type=int, default=1_000_000)
    p.add_argument("--ceiling-entities", type=int, help="entities for the ceiling (all)")
    p.add_argument("--profile-entities", type=int, default=100_000)
    p.add_argument("--chunk-size", type=int, default=500)
    p.add_argument("--partitions", type=int, default=8, help="input files = Spark tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "fs-ingest-bench")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--markdown", type=Path, help="append the results here")
    args = p.parse_args()

    spark = spark_session(
        args.master,
        {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        app_name="feature-store-ingest-bench",
    )
    data = str(args.data_dir / f"sample-{args.entities}-{args.seed}.parquet")
    if not os.path.exists(os.path.join(data, "_SUCCESS")):
        t0 = time.perf_counter()
        write_sample(
            spark, data, args.entities, seed=args.seed, partitions=args.partitions, overwrite=True
        )
        print(f"generated {args.entities:,} entities in {time.perf_counter() - t0:.0f}s: {data}")
    small = str(args.data_dir / f"sample-{args.profile_entities}-{args.seed}.parquet")
    if not os.path.exists(os.path.join(small, "_SUCCESS")):
        write_sample(
            spark, small, args.profile_entities, seed=args.seed, partitions=2, overwrite=True
        )

    base = Path(tempfile.mkdtemp(prefix="fs-ingest-bench-"))
    with fresh_redis(base, "ceiling") as server:
        ceil_rate, ceil_values = ceiling(
            server.url, data, args.ceiling_entities or args.entities, args.chunk_size
        )
    print(
        f"ceiling: raw redis-py pipelined HSET, {ceil_values:,} values: {ceil_rate:,.0f} values/s"
    )

    with fresh_redis(base, "job") as server:
        report = run_job(spark, data, server.url, args.chunk_size)
    print(report.summary())

    profile_dir = str(base / "task-profiles")
    with fresh_redis(base, "profile") as server:
        profiled = run_job(spark, small, server.url, args.chunk_size, profile_dir=profile_dir)
    spark.stop()
    profile = profile_summary(profile_dir, top=25)
    print(profile)

    ratio = report.values_per_second / ceil_rate
    verdict = (
        f"job {report.values_per_second:,.0f} values/s = {ratio:.1%} of the ceiling "
        f"({ceil_rate:,.0f} values/s); targets: >= {TARGET_RATIO:.0%} of the ceiling "
        f"[{'met' if ratio >= TARGET_RATIO else 'MISSED'}], >= {TARGET_RATE:,} values/s "
        f"[{'met' if report.values_per_second >= TARGET_RATE else 'MISSED'}]"
    )
    print(verdict)
    t = report.task_seconds
    busy = t.read + t.encode + t.redis
    split = (
        f"task time without profiler, summed over {report.tasks} tasks: read (Spark->Arrow) "
        f"{t.read:.1f}s {t.read / busy:.0%}, encode {t.encode:.1f}s {t.encode / busy:.0%}, "
        f"redis pipelines {t.redis:.1f}s {t.redis / busy:.0%}; job elapsed "
        f"{report.elapsed_seconds:.1f}s"
    )
    print(split)
    if args.markdown is not None:
        with args.markdown.open("a") as fh:
            fh.write(
                f"\n### Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                f"```\n$ python3 benchmarks/ingest.py {' '.join(sys.argv[1:])}\n"
                f"ceiling: raw redis-py pipelined HSET, {ceil_values:,} values: "
                f"{ceil_rate:,.0f} values/s\n{report.summary()}\n{verdict}\n{split}\n\n"
                f"profiled run ({profiled.rows_read:,} entities, "
                f"{profiled.values_per_second:,.0f} values/s under cProfile):\n{profile}\n```\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
