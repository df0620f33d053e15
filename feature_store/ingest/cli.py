"""The Spark commands: ``ingest`` (the nightly job; a backfill of window aggregations),
``generate`` (sample data), ``stream`` (Kafka into Redis), ``training-set`` and
``log-sink`` (the serving log), ``fetch-jars`` (their jars); and the spark-submit entry point.

Only argparse-level code is imported here; Spark starts inside the run functions.
``python -m feature_store.ingest`` / ``spark-submit .../feature_store/ingest/__main__.py``
take the same arguments, but keep the master that spark-submit was given.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store import sample
from feature_store.batch import event_time_seconds
from feature_store.commands import add_redis_args, redis_url, settings_from
from feature_store.errors import FeatureStoreError, RequestError
from feature_store.ingest.spec import MAX_RECORDS_PER_BATCH

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_MASTER = "local[*]"
SPARK_LOG_LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_ingest(sub, default_master=LOCAL_MASTER)
    _add_stream(sub, default_master=LOCAL_MASTER)
    _add_fetch_jars(sub)
    _add_generate(sub, default_master=LOCAL_MASTER)
    _add_training_set(sub, default_master=LOCAL_MASTER)
    _add_log_sink(sub, default_master=LOCAL_MASTER)


def _add_training_set(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "training-set",
        help="join label rows to the feature vectors the serving log holds (Spark)",
        description="Join each label row to the vector of its entity that was served: the "
        "request it names (a request_id column), or the newest served at or before its "
        "time (point in time). Writes parquet and reports rows with no vector and "
        "features served stale or missing (see docs/logging.md).",
    )
    _add_registry(p)
    p.add_argument("--labels", required=True, help="label rows: parquet, or CSV with a header")
    p.add_argument("--labels-format", choices=("parquet", "csv"), help="default: by its name")
    p.add_argument("--log", required=True, help="the serving log's directory (--feature-log)")
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
    _add_spark_args(p, default_master)
    p.set_defaults(func=run_training_set_command)


def _add_log_sink(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "log-sink",
        help="write the serving log's Kafka topic as parquet (Spark Structured Streaming)",
        description="Read the records `serve --feature-log kafka://...` produces and "
        "append them, checkpointed, in the layout of the file log (see docs/logging.md).",
    )
    _add_registry(p)
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
    _add_spark_args(p, default_master)
    p.set_defaults(func=run_log_sink_command)


def run_training_set_command(args: argparse.Namespace) -> int:
    import json

    from feature_store.training import TrainingSetJob, build_training_set

    settings = settings_from(args)
    registry = _registry_file(args, settings.registry)
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
    )
    conf = {"spark.sql.session.timeZone": "UTC", **_pairs(args.conf, "--conf")}
    with _session(args, conf, "feature-store-training-set") as spark:
        report = build_training_set(spark, job, progress=print)
    if args.report is not None:
        args.report.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return 0


def run_log_sink_command(args: argparse.Namespace) -> int:
    from feature_store.training import LogSinkJob, run_log_sink

    settings = settings_from(args)
    registry = _registry_file(args, settings.registry)
    conf = _kafka_conf(args, settings.kafka_jars)  # UTC: the partitions' dates and hours
    job = LogSinkJob(
        registry=registry,
        topic=args.topic,
        bootstrap_servers=args.bootstrap_servers,
        output=args.output,
        checkpoint=args.checkpoint,
        starting_offsets=args.starting_offsets,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        kafka_options=_pairs(args.kafka_option, "--kafka-option"),
    )
    with _session(args, conf, "feature-store-log-sink") as spark:
        run_log_sink(spark, job, progress=_stderr)
    return 0


def _add_registry(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        type=Path,
        help="registry file, or 'sample' for the built-in one "
        "(default: FEATURE_STORE_REGISTRY or features.yaml)",
    )


def _add_registry_group(p: argparse.ArgumentParser) -> None:
    _add_registry(p)
    p.add_argument("--group", required=True, help="feature group to write")


def _add_stream(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "stream",
        help="write a Kafka topic's records into Redis as they come (Spark Structured Streaming)",
        description="Read records (entity id, event time, features; JSON, Avro or "
        "Protobuf) from a Kafka topic and write them through the event-time guard, in "
        "micro-batches, checkpointed. Runs until stopped (see docs/streaming.md).",
    )
    _add_registry_group(p)
    p.add_argument("--topic", required=True, help="Kafka topic")
    p.add_argument("--bootstrap-servers", required=True, help="Kafka's host:port[,host:port]")
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint directory: where a restart resumes"
    )
    p.add_argument(
        "--format",
        default="json",
        choices=("json", "avro", "protobuf"),
        help="the records' values (json)",
    )
    p.add_argument("--avro-schema", type=Path, help="the writer's Avro schema (.avsc), for avro")
    p.add_argument(
        "--proto-descriptor",
        type=Path,
        help="a descriptor set (protoc --descriptor_set_out --include_imports) or a .proto "
        "file, for protobuf",
    )
    p.add_argument("--proto-message", help="the message type's full name, for protobuf")
    p.add_argument(
        "--confluent-framing",
        action="store_true",
        help="avro/protobuf values as Confluent's Schema Registry serializers frame them "
        "(magic byte, schema id, message indexes): checked and skipped; the schema is the "
        "one given, not fetched",
    )
    p.add_argument("--id-field", help="the record's entity id field (default: the join key)")
    p.add_argument(
        "--id-from-key",
        action="store_true",
        help="take the entity id from the Kafka record's key instead",
    )
    p.add_argument(
        "--key-format",
        default="string",
        choices=("string", "int64"),
        help="the key with --id-from-key: UTF-8 text or a big-endian int64 (string)",
    )
    p.add_argument(
        "--event-time-field",
        default="event_time",
        help="the record's event time field: unix seconds or RFC 3339 (event_time)",
    )
    p.add_argument(
        "--event-time-from",
        default="record",
        choices=("record", "kafka"),
        help="the event time from the record's field, or Kafka's record timestamp (record)",
    )
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FIELD=FEATURE",
        help="feed FEATURE from the record's FIELD (fields otherwise match features by name), "
        "repeatable",
    )
    p.add_argument(
        "--ignore-extra-fields",
        action="store_true",
        help="write records with fields that are no feature (default: quarantine them)",
    )
    p.add_argument("--quarantine", help="parquet directory for bad records")
    p.add_argument(
        "--starting-offsets",
        default="earliest",
        choices=("earliest", "latest"),
        help="where a new checkpoint starts reading (earliest)",
    )
    p.add_argument("--trigger-seconds", type=float, default=0.5, help="micro-batch interval (0.5)")
    p.add_argument(
        "--max-records-per-batch",
        type=int,
        default=MAX_RECORDS_PER_BATCH,
        help=f"Kafka records per micro-batch at most ({MAX_RECORDS_PER_BATCH}; 0: no bound)",
    )
    p.add_argument(
        "--available-now",
        action="store_true",
        help="write what the topic holds now, then stop",
    )
    p.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark Kafka source option, repeatable (e.g. kafka.security.protocol=SSL)",
    )
    p.add_argument("--chunk-size", type=int, default=500, help="entities per Redis pipeline")
    p.add_argument(
        "--progress-interval", type=float, default=10.0, help="seconds between lag lines (10)"
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of the metrics port (127.0.0.1)"
    )
    _add_spark_args(p, default_master)
    add_redis_args(p)
    p.set_defaults(func=run_stream_command)


def _add_fetch_jars(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fetch-jars",
        help="fetch the jars `stream` needs (Spark's Kafka source and Avro) with Maven",
        description="Copy Spark's Kafka source, Spark's Avro functions and the jars they "
        "need that pyspark does not ship from Maven Central (or Maven's configured mirror) "
        "into the environment (or FEATURE_STORE_KAFKA_JARS). Run once after installing.",
    )
    p.add_argument(
        "--dest", type=Path, help="directory (default: FEATURE_STORE_KAFKA_JARS or <env>/kafka)"
    )
    p.add_argument("--broker", action="store_true", help="also Kafka's broker (for EmbeddedKafka)")
    p.set_defaults(func=run_fetch_jars)


def run_fetch_jars(args: argparse.Namespace) -> int:
    from feature_store.kafka import fetch_jars, jars_dir

    dest = args.dest or jars_dir(settings_from(args).kafka_jars)
    fetched = fetch_jars(dest, broker=args.broker)
    print(f"{'fetched' if fetched else 'already there'}: {dest}")
    return 0


def run_stream_command(args: argparse.Namespace) -> int:
    from feature_store.ingest.records import Format, KeyFormat
    from feature_store.ingest.stream import StreamJob, run_stream
    from feature_store.ingest.stream_metrics import StreamMetrics

    settings = settings_from(args)
    registry = _registry_file(args, settings.registry)
    conf = _kafka_conf(args, settings.kafka_jars)  # UTC: Avro's timestamps as JSON text
    fmt = Format(args.format)
    avro_schema = _read(args.avro_schema, "--avro-schema") if args.avro_schema else None
    descriptor = _proto_descriptor(args.proto_descriptor) if args.proto_descriptor else b""
    if args.max_records_per_batch < 0:
        raise RequestError("--max-records-per-batch must be 0 (no bound) or more")
    metrics = None
    if args.metrics_port is not None:
        metrics = StreamMetrics(args.group, args.topic)
        metrics.serve(args.metrics_port, args.metrics_host)
    with redis_url(settings) as url:
        job = StreamJob(
            registry=registry,
            group=args.group,
            topic=args.topic,
            bootstrap_servers=args.bootstrap_servers,
            redis_url=url,
            checkpoint=args.checkpoint,
            redis=settings.redis_options(),
            format=fmt,
            avro_schema=avro_schema,
            proto_descriptor=descriptor,
            proto_message=args.proto_message or "",
            confluent_framing=args.confluent_framing,
            id_field=args.id_field,
            id_from_key=args.id_from_key,
            key_format=KeyFormat(args.key_format),
            event_time_field=args.event_time_field,
            event_time_from_kafka=args.event_time_from == "kafka",
            renames=tuple(_pairs(args.map, "--map").items()),
            ignore_extra_fields=args.ignore_extra_fields,
            quarantine=args.quarantine,
            starting_offsets=args.starting_offsets,
            trigger_seconds=args.trigger_seconds,
            max_records_per_batch=args.max_records_per_batch or None,
            available_now=args.available_now,
            kafka_options=_pairs(args.kafka_option, "--kafka-option"),
            chunk_size=args.chunk_size,
            progress_interval=args.progress_interval,
            metrics=metrics,
        )
        with _session(args, conf, "feature-store-stream") as spark:
            run_stream(spark, job, progress=_stderr)
    return 0


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
    _add_registry_group(p)
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
    _add_spark_args(p, default_master)
    add_redis_args(p)
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
    _add_spark_args(p, default_master)
    p.set_defaults(func=run_generate_command)


def _add_spark_args(p: argparse.ArgumentParser, default_master: str | None) -> None:
    p.add_argument(
        "--master",
        default=default_master,
        help=f"Spark master ({default_master or 'as given to spark-submit'})",
    )
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting, repeatable"
    )
    p.add_argument(
        "--spark-log-level",
        type=str.upper,
        choices=SPARK_LOG_LEVELS,
        help="Spark's log level (default: ERROR in local mode, WARN on a cluster)",
    )


def _registry_file(args: argparse.Namespace, default: Path) -> Path:
    registry = sample.resolve(args.registry or default)
    if not registry.exists():
        raise RequestError(f"registry file {str(registry)!r} does not exist")
    return registry


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise RequestError(f"{flag} {path}: {e.strerror}") from None


def _proto_descriptor(path: Path) -> bytes:
    """A descriptor set's bytes: the file itself, or a .proto compiled by protoc (the
    ``grpcio-tools`` package's) with its imports."""
    if path.suffix != ".proto":
        try:
            return path.read_bytes()
        except OSError as e:
            raise RequestError(f"--proto-descriptor {path}: {e.strerror}") from None
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError:
        raise RequestError(
            "--proto-descriptor with a .proto file needs protoc: pip install grpcio-tools, or "
            "give a descriptor set (protoc --include_imports --descriptor_set_out=FILE)"
        ) from None
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        include = Path(protoc.__file__).parent / "_proto"
        code = protoc.main(
            [
                "protoc",
                f"-I{path.parent}",
                f"-I{include}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                str(path),
            ]
        )
        if code != 0:
            raise RequestError(f"--proto-descriptor {path}: protoc could not compile it")
        return out.read_bytes()


def _kafka_conf(args: argparse.Namespace, jars: Path | None) -> dict[str, str]:
    """Spark's settings for a job that reads Kafka: the connector's jars, then the user's
    ``--conf`` pairs, in the UTC session time zone unless they say otherwise."""
    from feature_store.kafka import connector_conf

    user_conf = _pairs(args.conf, "--conf")
    conf = {**connector_conf(user_conf, jars), **user_conf}
    conf.setdefault("spark.sql.session.timeZone", "UTC")
    return conf


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RequestError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def run_ingest_command(args: argparse.Namespace) -> int:
    from feature_store.ingest.job import IngestJob, run_ingest
    from feature_store.ingest.report import Thresholds
    from feature_store.ingest.spec import RetrySpec

    settings = settings_from(args)
    registry = _registry_file(args, settings.registry)
    mapping = _pairs(args.map, "--map")
    read_options = _pairs(args.option, "--option")
    conf = _pairs(args.conf, "--conf")
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
            progress_interval=args.progress_interval,
            profile_dir=args.profile_dir,
            written_at=args.event_time,
            event_time_column=args.event_time_column,
            ordered=not args.no_ordering,
        )
        with _session(args, conf, "feature-store-ingest") as spark:
            report = run_ingest(spark, job, progress=_stderr)
    print(report.summary())
    return report.exit_code


def run_generate_command(args: argparse.Namespace) -> int:
    from feature_store.ingest.generate import ID_COLUMN, write_sample

    with _session(args, _pairs(args.conf, "--conf"), "feature-store-generate") as spark:
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


@contextlib.contextmanager
def _session(
    args: argparse.Namespace, conf: dict[str, str], app_name: str
) -> Iterator[SparkSession]:
    """A Spark session for one command; one that was already running is left running."""
    from pyspark.sql import SparkSession

    from feature_store.ingest.job import spark_session

    existing = SparkSession.getActiveSession()
    spark = spark_session(args.master, conf, app_name=app_name, log_level=args.spark_log_level)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def submit_parser() -> argparse.ArgumentParser:
    """The spark-submit parser: same subcommands, the master comes from spark-submit."""
    parser = argparse.ArgumentParser(
        prog="feature_store.ingest", description="Feature store ingest job (spark-submit)."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_ingest(sub, default_master=None)
    _add_stream(sub, default_master=None)
    _add_generate(sub, default_master=None)
    _add_training_set(sub, default_master=None)
    _add_log_sink(sub, default_master=None)
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
