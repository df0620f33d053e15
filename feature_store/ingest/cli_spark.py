"""What the Spark commands share: the registry, Spark and Kafka flags, the session a
command runs in, key=value pairs, progress lines on stderr."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store import sample
from feature_store.errors import RequestError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_MASTER = "local[*]"
SPARK_LOG_LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")


def add_registry(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        type=Path,
        help="registry file, or 'sample' for the built-in one "
        "(default: FEATURE_STORE_REGISTRY or features.yaml)",
    )


def add_registry_group(p: argparse.ArgumentParser) -> None:
    add_registry(p)
    p.add_argument("--group", required=True, help="feature group to write")


def add_spark_args(p: argparse.ArgumentParser, default_master: str | None) -> None:
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


def registry_file(args: argparse.Namespace, default: Path) -> Path:
    registry = sample.resolve(args.registry or default)
    if not registry.exists():
        raise RequestError(f"registry file {str(registry)!r} does not exist")
    return registry


def read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise RequestError(f"{flag} {path}: {e.strerror}") from None


def pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RequestError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def kafka_conf(args: argparse.Namespace, jars: Path | None) -> dict[str, str]:
    """Spark's settings for a job that reads Kafka: the connector's jars, then the user's
    ``--conf`` pairs, in the UTC session time zone unless they say otherwise."""
    from feature_store.kafka import connector_conf

    user_conf = pairs(args.conf, "--conf")
    conf = {**connector_conf(user_conf, jars), **user_conf}
    conf.setdefault("spark.sql.session.timeZone", "UTC")
    return conf


@contextlib.contextmanager
def session(
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


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
