"""Training data from the feature sources: how fast `feature-store training-set --backfill`
joins label rows to a group's snapshots point in time, and how fast `feature-store skew`
compares a serving log with them, on Spark local[2], with the memory each takes.

    python3 benchmarks/training_backfill.py [--entities 100000] [--snapshots 10]
        [--labels 200000] [--logged 200000] [--out benchmarks/results/training_backfill.md]

The source is the standard shape's group (50 features: 40 floats, 5 ints, 3 int lists of
10-30, 2 embeddings of 32), one row per entity per snapshot (a day apart), written as the
nightly job's input: one parquet file per snapshot. The phases, each in a Spark session of
its own (its JVM's peak RSS read from /proc):

1. **Backfill**: label rows at random entities (a tenth of them never in the source) and
   random times over the snapshots' span, joined to the source alone (no log): label rows/s
   over the job's own seconds, as its report gives them.
2. **Log and backfill**: the same labels with a serving log of `--logged` rows (half the
   labels' entities served), the backfill answering the rest.
3. **Skew**: every value of that log (each row a snapshot's values of its entity, served
   within the day after it; 1 in 1,000 rows with a float changed) compared with the
   source: logged rows/s.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from feature_store import sample
from feature_store.serving.feature_log import arrow_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import header, save

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

R = TypeVar("R")

DAY = 86_400
T0 = 1_790_000_000  # the first snapshot's time (2026-09-21)


def _lists(
    rng: np.random.Generator, n: int, sizes: tuple[int, int], values: np.ndarray
) -> pa.Array:
    lengths = rng.integers(sizes[0], sizes[1] + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[: offsets[-1]]))


def snapshot(rng: np.random.Generator, entities: int) -> dict[str, pa.Array]:
    """One snapshot of every entity's 50 values, as the nightly job reads them."""
    n = entities
    columns: dict[str, pa.Array] = {"consumer_id": pa.array(np.arange(n, dtype=np.int64))}
    for i, name in enumerate(sample.FLOATS):
        x = rng.random(n) * 500
        columns[name] = pa.array(np.round(x) if i % 4 == 0 else np.round(x, 2))
    for name in sample.INTS:
        columns[name] = pa.array(rng.integers(0, 1_000_000, n))
    for name in sample.INT_LISTS:
        columns[name] = _lists(rng, n, (10, 30), rng.integers(0, 5000, n * 30))
    for name in sample.EMBEDDINGS:
        flat = rng.standard_normal(n * sample.EMBEDDING_DIM).astype(np.float32)
        offsets = np.arange(0, n * sample.EMBEDDING_DIM + 1, sample.EMBEDDING_DIM, dtype=np.int32)
        columns[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    return columns


def write_data(work: Path, args: argparse.Namespace) -> tuple[Path, Path, Path]:
    rng = np.random.default_rng(7)
    source = work / "source"
    source.mkdir()
    entities, snapshots = args.entities, args.snapshots
    log_rows: list[pa.Table] = []
    per = max(1, args.logged // snapshots)
    schema = arrow_schema(sample.registry(), sample.registry().entities[sample.ENTITY])
    for k in range(snapshots):
        columns = snapshot(rng, entities)
        at = T0 + k * DAY
        columns["event_timestamp"] = pa.array(
            np.full(entities, at * 1_000_000), pa.timestamp("us", "UTC")
        )
        table = pa.table(columns)
        pq.write_table(table, source / f"day-{k:02}.parquet")
        # the log: rows served within the day after this snapshot, of entities served
        # (the labels' first half), with this snapshot's values
        served = rng.integers(0, entities // 2, per)
        picked = table.take(pa.array(served))
        logged: dict[str, pa.Array] = {
            "request_id": pa.array([f"r{k}-{i}" for i in range(per)]),
            "served_at": pa.array(
                (at + rng.integers(1, DAY, per)) * 1000, pa.timestamp("ms", "UTC")
            ),
            "api": pa.array(["rest"] * per),
            "entity_id": pa.array(served.astype(np.int64)),
            "source": pa.array(["l1"] * per),
        }
        for name in [f.name for f in sample.registry().groups[sample.GROUP].features]:
            column = picked[name]
            if name == sample.FLOATS[0]:  # 1 in 1,000 served another value
                changed = rng.random(per) < 0.001
                column = pa.array(np.where(changed, -1.0, column.to_numpy()))
            logged[f"{sample.GROUP}__{name}"] = column
            logged[f"{sample.GROUP}__{name}__status"] = pa.array(["present"] * per)
        logged[f"{sample.GROUP}__event_time"] = pa.array(np.full(per, at), pa.timestamp("s", "UTC"))
        log_rows.append(pa.table(logged).cast(schema))
    folder = work / "log" / f"entity_type={sample.ENTITY}" / "date=2026-09-21" / "hour=00"
    folder.mkdir(parents=True)
    pq.write_table(pa.concat_tables(log_rows), folder / "part-0.parquet")
    labels = work / "labels.parquet"
    span = snapshots * DAY
    pq.write_table(
        pa.table(
            {
                # a tenth of the labels' entities were never in the source
                "consumer_id": pa.array(rng.integers(0, entities + entities // 9, args.labels)),
                "event_timestamp": pa.array(
                    (T0 + rng.integers(0, span, args.labels)) * 1_000_000, pa.timestamp("us", "UTC")
                ),
                "label": pa.array(rng.random(args.labels) < 0.1),
            }
        ),
        labels,
    )
    return source, work / "log", labels


def peak_rss(spark: SparkSession) -> int:
    """The Spark JVM's peak resident set (bytes), from /proc."""
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run(phase: str, call: Callable[[SparkSession], R]) -> tuple[R, int]:
    from feature_store.ingest.job import spark_session

    spark = spark_session(
        "local[2]",
        {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        app_name=f"training-backfill-{phase}",
    )
    try:
        result = call(spark)
        return result, peak_rss(spark)
    finally:
        spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--labels", type=int, default=200_000)
    parser.add_argument("--logged", type=int, default=200_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from feature_store.skew import SkewJob, measure_skew
    from feature_store.training import TrainingSetJob, build_training_set
    from feature_store.training_sources import SourceSpec

    work = Path(tempfile.mkdtemp(prefix="training-backfill-"))
    try:
        started = time.monotonic()
        source, log, labels = write_data(work, args)
        print(f"data written in {time.monotonic() - started:.0f} s", flush=True)
        registry = work / "features.yaml"
        registry.write_text(sample.registry_text())
        spec = (SourceSpec(sample.GROUP, str(source)),)
        results = {}
        for phase, with_log in (("backfill", False), ("log and backfill", True)):
            job = TrainingSetJob(
                registry,
                str(labels),
                str(log) if with_log else None,
                str(work / phase.replace(" ", "-")),
                backfill=spec,
            )
            report, rss = run(phase, lambda s, job=job: build_training_set(s, job))
            results[phase] = (report, rss)
            print(f"{phase}: {report.label_rows / report.seconds:,.0f} label rows/s", flush=True)
        skew_job = SkewJob(registry, str(log), spec)
        skew, skew_rss = run("skew", lambda s: measure_skew(s, skew_job))
        rows = skew.groups[sample.GROUP].rows
        print(f"skew: {rows / skew.seconds:,.0f} logged rows/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    source_rows = args.entities * args.snapshots
    lines = [
        *header(
            f"Spark local[2] in one JVM per phase. The source: {source_rows:,} rows of the "
            f"standard shape ({args.entities:,} entities x {args.snapshots} daily snapshots, "
            f"parquet); {args.labels:,} label rows; a serving log of {rows:,} rows."
        ),
        "",
        "| phase | rows | seconds | rows/s | JVM peak RSS |",
        "|---|---:|---:|---:|---:|",
    ]
    for phase, (r, rss) in results.items():
        lines.append(
            f"| training-set, {phase} | {r.label_rows:,} label rows | {r.seconds:.1f} | "
            f"{r.label_rows / r.seconds:,.0f} | {rss / 2**30:.2f} GiB |"
        )
    lines.append(
        f"| skew | {rows:,} logged rows | {skew.seconds:.1f} | {rows / skew.seconds:,.0f} | "
        f"{skew_rss / 2**30:.2f} GiB |"
    )
    backfill, _ = results["backfill"]
    both, _ = results["log and backfill"]
    lines += [
        "",
        f"- Backfill alone: {backfill.backfilled[sample.GROUP]:,} of {backfill.label_rows:,} "
        f"label rows took the source's values, {backfill.uncovered:,} had none (an entity "
        "never in the source, or a time before its first snapshot).",
        f"- With the log: {both.label_rows - both.no_vector:,} rows from the log, "
        f"{both.backfilled[sample.GROUP]:,} from the source, {both.uncovered:,} with none.",
        f"- Skew: {skew.differing:,} of {skew.compared:,} logged values differ "
        f"({skew.rate:.4%}); by cause: "
        + ", ".join(f"{c} {n:,}" for c, n in skew.groups[sample.GROUP].causes.items() if n),
    ]
    save(args.out, "Training data from the sources: backfill and skew", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
