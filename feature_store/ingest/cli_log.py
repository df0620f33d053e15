"""The serving log's Spark commands: ``training-set`` (label rows joined to the vectors
served) and ``log-sink`` (the log's Kafka topic written as parquet)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.commands import settings_from
from feature_store.ingest.cli_spark import (
    add_registry,
    add_spark_args,
    kafka_conf,
    pairs,
    registry_file,
    session,
    stderr,
)

if TYPE_CHECKING:
    from feature_store.training_sources import SourceSpec


def add_source_columns(p: argparse.ArgumentParser) -> None:
    """How the groups' sources name their columns (training-set's --backfill, skew's
    --source)."""
    p.add_argument(
        "--source-id-column", help="the sources' entity id column (default: the join key)"
    )
    p.add_argument(
        "--event-time-column",
        help="the sources' event time column (default event_timestamp; a group of window "
        "aggregations' events: event_time)",
    )


def source_specs(args: argparse.Namespace, values: list[str], flag: str) -> tuple[SourceSpec, ...]:
    """The ``GROUP=PATH`` sources of ``flag``, with the columns ``add_source_columns`` names."""
    from feature_store.training_sources import SourceSpec, parse_backfills

    return tuple(
        SourceSpec(group, path, args.source_id_column, args.event_time_column)
        for group, path in parse_backfills(values, flag).items()
    )


def add_training_set(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "training-set",
        help="join label rows to the feature vectors the serving log holds, and to the "
        "groups' sources where it holds none (Spark)",
        description="Join each label row to the vector of its entity that was served: the "
        "request it names (a request_id column), or the newest served at or before its "
        "time (point in time). Where the log has none of a group's values, a --backfill "
        "source of the group answers: its entity's newest row at or before the label's "
        "time, within the group's max_age, as serving would have answered it. Writes "
        "parquet and reports rows with no vector and features served stale or missing "
        "(see docs/training.md).",
    )
    add_registry(p)
    p.add_argument("--labels", required=True, help="label rows: parquet, or CSV with a header")
    p.add_argument("--labels-format", choices=("parquet", "csv"), help="default: by its name")
    p.add_argument(
        "--log", help="the serving log's directory (--feature-log); without it, sources only"
    )
    p.add_argument(
        "--backfill",
        action="append",
        default=[],
        metavar="GROUP=PATH",
        help="a group's source rows (parquet, or CSV with a header), in the nightly job's "
        "input form: the id column, the feature columns by name, an event time column; "
        "repeatable, one per group",
    )
    add_source_columns(p)
    p.add_argument("--output", required=True, help="where the training set goes (parquet)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--entity-type", help="the labels' entity type (default: by its join key)")
    p.add_argument("--id-column", help="the labels' entity id column (default: the join key)")
    p.add_argument(
        "--time-column",
        default="event_timestamp",
        help="the labels' time column (default event_timestamp, as Feast's entity frames)",
    )
    p.add_argument(
        "--request-id-column",
        default="request_id",
        help="where the labels have this column, a row that names a request is joined to "
        "that request's vector (default request_id)",
    )
    p.add_argument("--report", type=Path, help="write the report as JSON here")
    add_spark_args(p, default_master)
    p.set_defaults(func=run_training_set_command)


def add_log_sink(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "log-sink",
        help="write the serving log's Kafka topic as parquet (Spark Structured Streaming)",
        description="Read the records `serve --feature-log kafka://...` produces and "
        "append them, checkpointed, in the layout of the file log (see docs/logging.md).",
    )
    add_registry(p)
    p.add_argument("--topic", required=True, help="the serving log's Kafka topic")
    p.add_argument("--bootstrap-servers", required=True, help="Kafka's host:port[,host:port]")
    p.add_argument("--output", required=True, help="the log's directory (parquet)")
    p.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    p.add_argument(
        "--starting-offsets", default="earliest", help="earliest (default) or latest, first run"
    )
    p.add_argument("--trigger-seconds", type=float, default=10.0, help="micro-batch interval (10)")
    p.add_argument(
        "--available-now", action="store_true", help="write what the topic holds, then stop"
    )
    p.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of Spark's Kafka source (kafka.security.protocol=SSL, ...)",
    )
    add_spark_args(p, default_master)
    p.set_defaults(func=run_log_sink_command)


def run_training_set_command(args: argparse.Namespace) -> int:
    import json

    from feature_store.training import TrainingSetJob, build_training_set

    settings = settings_from(args)
    registry = registry_file(args, settings.registry)
    job = TrainingSetJob(
        registry=registry,
        labels=args.labels,
        log=args.log,
        output=args.output,
        id_column=args.id_column,
        time_column=args.time_column,
        entity_type=args.entity_type,
        request_id_column=args.request_id_column,
        labels_format=args.labels_format,
        overwrite=args.overwrite,
        backfill=source_specs(args, args.backfill, "--backfill"),
    )
    conf = {"spark.sql.session.timeZone": "UTC", **pairs(args.conf, "--conf")}
    with session(args, conf, "feature-store-training-set") as spark:
        report = build_training_set(spark, job, progress=print)
    if args.report is not None:
        args.report.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return 0


def add_skew(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "skew",
        help="compare what was served (the serving log) with the groups' sources (Spark)",
        description="Compare every logged value of each --source group with the value its "
        "source says should have been served at that time (its entity's newest row at or "
        "before, within the group's max_age), and say why values differ: a write newer or "
        "older than the source's, nothing stored, the same write with another value or "
        "another encoding, or a value served past max_age. "
        "Prints a Markdown summary and writes the JSON report (see docs/training.md).",
    )
    add_registry(p)
    p.add_argument("--log", required=True, help="the serving log's directory (--feature-log)")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        required=True,
        metavar="GROUP=PATH",
        help="a group's source rows (parquet, or CSV with a header), as --backfill takes "
        "them; repeatable, one per group",
    )
    add_source_columns(p)
    p.add_argument("--from", dest="start", help="only rows served at or after this time")
    p.add_argument("--to", dest="end", help="only rows served before this time")
    p.add_argument("--report", type=Path, required=True, help="write the report (JSON) here")
    p.add_argument(
        "--metrics-file",
        type=Path,
        help="also write the figures as Prometheus gauges to this file (a *.prom file in "
        "node_exporter's textfile directory), for the alerts of deploy/prometheus/rules.yml",
    )
    p.add_argument(
        "--fail-above",
        type=float,
        metavar="RATE",
        help="exit 1 when more than this share of the values compared differ",
    )
    add_spark_args(p, default_master)
    p.set_defaults(func=run_skew_command)


def run_skew_command(args: argparse.Namespace) -> int:
    import json

    from feature_store.skew import SkewJob, measure_skew, parse_time, write_metrics

    settings = settings_from(args)
    registry = registry_file(args, settings.registry)
    job = SkewJob(
        registry=registry,
        log=args.log,
        sources=source_specs(args, args.source, "--source"),
        start=parse_time(args.start, "--from"),
        end=parse_time(args.end, "--to"),
    )
    conf = {"spark.sql.session.timeZone": "UTC", **pairs(args.conf, "--conf")}
    with session(args, conf, "feature-store-skew") as spark:
        report = measure_skew(spark, job)
    args.report.write_text(json.dumps(report.as_json(), indent=2, default=str) + "\n")
    if args.metrics_file is not None:
        write_metrics(report, args.metrics_file)
    print(report.markdown(), end="")
    if args.fail_above is not None and report.rate > args.fail_above:
        stderr(f"skew: {report.rate:.4%} of the values compared differ, above {args.fail_above:%}")
        return 1
    return 0


def run_log_sink_command(args: argparse.Namespace) -> int:
    from feature_store.training import LogSinkJob, run_log_sink

    settings = settings_from(args)
    registry = registry_file(args, settings.registry)
    conf = kafka_conf(args, settings.kafka_jars)  # UTC: the partitions' dates and hours
    job = LogSinkJob(
        registry=registry,
        topic=args.topic,
        bootstrap_servers=args.bootstrap_servers,
        output=args.output,
        checkpoint=args.checkpoint,
        starting_offsets=args.starting_offsets,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        kafka_options=pairs(args.kafka_option, "--kafka-option"),
    )
    with session(args, conf, "feature-store-log-sink") as spark:
        run_log_sink(spark, job, progress=stderr)
    return 0
