"""The ``stream`` command (a Kafka topic into Redis, Spark Structured Streaming) and
``fetch-jars`` (the jars it needs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from feature_store.commands import add_durability_arg, add_redis_args, redis_url, settings_from
from feature_store.errors import RequestError
from feature_store.ingest.cli_spark import (
    add_registry_group,
    add_spark_args,
    kafka_conf,
    pairs,
    read_text,
    registry_file,
    session,
    stderr,
)
from feature_store.ingest.spec import MAX_RECORDS_PER_BATCH


def add_stream(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_master: str | None
) -> None:
    p = sub.add_parser(
        "stream",
        help="write a Kafka topic's records into Redis as they come (Spark Structured Streaming)",
        description="Read records (entity id, event time, features; JSON, Avro or "
        "Protobuf) from a Kafka topic and write them through the event-time guard, in "
        "micro-batches, checkpointed. Runs until stopped (see docs/streaming.md).",
    )
    add_registry_group(p)
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
    add_spark_args(p, default_master)
    add_redis_args(p)
    add_durability_arg(p, "each micro-batch's write")
    p.set_defaults(func=run_stream_command)


def add_fetch_jars(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    registry = registry_file(args, settings.registry)
    conf = kafka_conf(args, settings.kafka_jars)  # UTC: Avro's timestamps as JSON text
    fmt = Format(args.format)
    avro_schema = read_text(args.avro_schema, "--avro-schema") if args.avro_schema else None
    descriptor = proto_descriptor(args.proto_descriptor) if args.proto_descriptor else b""
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
            renames=tuple(pairs(args.map, "--map").items()),
            ignore_extra_fields=args.ignore_extra_fields,
            quarantine=args.quarantine,
            starting_offsets=args.starting_offsets,
            trigger_seconds=args.trigger_seconds,
            max_records_per_batch=args.max_records_per_batch or None,
            available_now=args.available_now,
            kafka_options=pairs(args.kafka_option, "--kafka-option"),
            chunk_size=args.chunk_size,
            progress_interval=args.progress_interval,
            metrics=metrics,
        )
        with session(args, conf, "feature-store-stream") as spark:
            run_stream(spark, job, progress=stderr)
    return 0


def proto_descriptor(path: Path) -> bytes:
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
