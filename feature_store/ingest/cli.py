"""The Spark commands: ``ingest`` (the nightly job; a backfill of window aggregations),
``generate`` (sample data), ``stream`` (Kafka into Redis), ``training-set`` and
``log-sink`` (the serving log), ``fetch-jars`` (their jars); and the spark-submit entry point.

Only argparse-level code is imported here; Spark starts inside the run functions.
``python -m feature_store.ingest`` / ``spark-submit .../feature_store/ingest/__main__.py``
take the same arguments, but keep the master that spark-submit was given.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from feature_store import sample
from feature_store.batch import event_time_seconds
from feature_store.commands import add_durability_arg, add_redis_args, redis_url, settings_from
from feature_store.errors import FeatureStoreError, RequestError
from feature_store.ingest.cli_log import add_log_sink, add_skew, add_training_set
from feature_store.ingest.cli_spark import (
    LOCAL_MASTER,
    add_registry_group,
    add_spark_args,
    pairs,
    registry_file,
    session,
    stderr,
)
from feature_store.ingest.cli_stream import add_fetch_jars, add_stream


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_ingest(sub, default_master=LOCAL_MASTER)
    add_stream(sub, default_master=LOCAL_MASTER)
    add_fetch_jars(sub)
    _add_generate(sub, default_master=LOCAL_MASTER)
    add_training_set(sub, default_master=LOCAL_MASTER)
    add_skew(sub, default_master=LOCAL_MASTER)
    add_log_sink(sub, default_master=LOCAL_MASTER)


def _add_ingest(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "ingest",
        help="write a DataFrame of feature values into Redis (the nightly Spark job)",
        description="Write one feature group's values from a parquet/CSV/JSON input into "
        "Redis with Spark. Exit code 0: written; 1: written, but bad rows over the "
        "threshold; 2: failed (see docs/ingest.md).",
    )
    add_registry_group(p)
    p.add_argument("--input", required=True, help="input path (anything Spark can read)")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv", "json", "orc"))
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark reader option, repeatable (CSV gets header=true unless given)",
    )
    p.add_argument("--id-column", required=True, help="column holding the entity id")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="COLUMN=FEATURE",
        help="feed FEATURE from COLUMN (columns otherwise match features by name), repeatable",
    )
    p.add_argument(
        "--allow-missing-features", action="store_true", help="write only the features present"
    )
    p.add_argument(
        "--ignore-extra-columns", action="store_true", help="skip columns that are not features"
    )
    p.add_argument("--chunk-size", type=int, default=500, help="entities per Redis pipeline (500)")
    p.add_argument(
        "--retries", type=int, default=8, help="retries of a chunk while Redis is unavailable (8)"
    )
    p.add_argument(
        "--retry-base-delay", type=float, default=0.1, help="first backoff in seconds (0.1)"
    )
    p.add_argument(
        "--retry-max-delay", type=float, default=10.0, help="longest backoff in seconds (10)"
    )
    p.add_argument(
        "--socket-timeout", type=float, default=5.0, help="Redis socket timeout, seconds (5)"
    )
    p.add_argument(
        "--max-bad-rows", type=int, default=0, help="exit 1 if more rows than this are bad (0)"
    )
    p.add_argument(
        "--max-bad-fraction", type=float, help="exit 1 if a larger fraction of the rows is bad"
    )
    p.add_argument(
        "--quarantine", help="parquet directory for bad rows (default quarantine/<group>-<time>)"
    )
    p.add_argument("--report", type=Path, help="write the final report as JSON here")
    p.add_argument("--partitions", type=int, help="repartition the input into N tasks first")
    p.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        help="seconds between progress lines (10; 0: none)",
    )
    p.add_argument(
        "--event-time-column",
        help="column with each row's event time (timestamp, unix seconds, or RFC 3339 text); "
        "a row older than what Redis holds for its entity is skipped and counted",
    )
    p.add_argument(
        "--event-time",
        type=parse_event_time,
        help="the snapshot's event time for every row, as unix seconds or RFC 3339 "
        "(default: the input files' newest modification time)",
    )
    p.add_argument(
        "--no-ordering",
        action="store_true",
        help="write without the event-time guard, last writer wins: for a first load into "
        "an empty store",
    )
    p.add_argument("--profile-dir", help="write a cProfile dump of every task here")
    add_spark_args(p, default_master)
    add_redis_args(p)
    add_durability_arg(p, "each chunk")
    p.set_defaults(func=run_ingest_command)


def parse_event_time(text: str) -> float:
    """``--event-time``: unix seconds or RFC 3339 text."""
    try:
        value: object = float(text)
    except ValueError:
        value = text
    try:
        return event_time_seconds(value, time.time())
    except RequestError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_generate(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "generate",
        help="write deterministic sample input in the standard benchmark shape",
        description="Seeded sample feature data (consumer_id + 50 features of "
        "feature_store/sample_features.yaml) written by Spark.",
    )
    p.add_argument("--output", required=True, help="output path")
    p.add_argument("--entities", type=int, default=100_000, help="rows to write (100000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="first entity id (0)")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv", "json"))
    p.add_argument("--partitions", type=int, default=4, help="output files (4)")
    p.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    p.add_argument(
        "--registry-out", type=Path, help="also write the sample registry (features.yaml) here"
    )
    add_spark_args(p, default_master)
    p.set_defaults(func=run_generate_command)


def run_ingest_command(args: argparse.Namespace) -> int:
    from feature_store.ingest.job import IngestJob, run_ingest
    from feature_store.ingest.report import Thresholds
    from feature_store.ingest.spec import RetrySpec

    settings = settings_from(args)
    registry = registry_file(args, settings.registry)
    mapping = pairs(args.map, "--map")
    read_options = pairs(args.option, "--option")
    conf = pairs(args.conf, "--conf")
    if args.retries < 0:
        raise RequestError("--retries must be 0 or more")
    with redis_url(settings) as url:
        job = IngestJob(
            registry=registry,
            group=args.group,
            input=args.input,
            id_column=args.id_column,
            redis_url=url,
            format=args.format,
            read_options=read_options,
            mapping=mapping,
            chunk_size=args.chunk_size,
            retry=RetrySpec(args.retries, args.retry_base_delay, args.retry_max_delay),
            thresholds=Thresholds(args.max_bad_rows, args.max_bad_fraction),
            quarantine=args.quarantine,
            report_path=args.report,
            allow_missing_features=args.allow_missing_features,
            ignore_extra_columns=args.ignore_extra_columns,
            partitions=args.partitions,
            socket_timeout=args.socket_timeout,
            connect_timeout=settings.connect_timeout,
            max_connections=settings.max_connections,
            redis_retries=settings.redis_retries,
            durability=settings.durability(),
            progress_interval=args.progress_interval,
            profile_dir=args.profile_dir,
            written_at=args.event_time,
            event_time_column=args.event_time_column,
            ordered=not args.no_ordering,
        )
        with session(args, conf, "feature-store-ingest") as spark:
            report = run_ingest(spark, job, progress=stderr)
    print(report.summary())
    return report.exit_code


def run_generate_command(args: argparse.Namespace) -> int:
    from feature_store.ingest.generate import ID_COLUMN, write_sample

    with session(args, pairs(args.conf, "--conf"), "feature-store-generate") as spark:
        write_sample(
            spark,
            args.output,
            args.entities,
            seed=args.seed,
            start=args.start,
            partitions=args.partitions,
            format=args.format,
            overwrite=args.overwrite,
        )
    if args.registry_out is not None:
        args.registry_out.write_text(sample.registry_text(), encoding="utf-8")
    last = args.start + args.entities - 1
    print(
        f"wrote {args.entities:,} {sample.ENTITY} rows (ids {args.start}..{last}, "
        f"seed {args.seed}) as {args.format} to {args.output}; id column {ID_COLUMN!r}, "
        f"group {sample.GROUP!r}"
    )
    return 0


def submit_parser() -> argparse.ArgumentParser:
    """The spark-submit parser: same subcommands, the master comes from spark-submit."""
    parser = argparse.ArgumentParser(
        prog="feature_store.ingest", description="Feature store ingest job (spark-submit)."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_ingest(sub, default_master=None)
    add_stream(sub, default_master=None)
    _add_generate(sub, default_master=None)
    add_training_set(sub, default_master=None)
    add_skew(sub, default_master=None)
    add_log_sink(sub, default_master=None)
    return parser


def submit_main(argv: Sequence[str] | None = None) -> int:
    """The spark-submit entry point."""
    args = submit_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except FeatureStoreError as e:
        print(f"feature_store.ingest {args.command}: error: {e}", file=sys.stderr)
        return 2
