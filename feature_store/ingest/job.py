"""The nightly ingest job: a DataFrame of one feature group's values into Redis.

    read input -> check its schema against the registry (nothing written on a mismatch)
    -> check Redis answers -> per partition (mapInArrow): encode, write in chunks, retried
    -> sum the tasks' statistics -> quarantine bad rows to parquet -> report

Spark and Redis errors are translated here into the project's error tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import cast

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from feature_store.connection import RedisOptions, RedisTarget, translated_errors
from feature_store.durability import ASYNCHRONOUS, Durability
from feature_store.errors import FeatureStoreError, RequestError, StoreError, StoreUnavailableError
from feature_store.ingest.backfill import DEFAULT_EVENT_TIME_COLUMN, backfill_partition, field_group
from feature_store.ingest.report import IngestReport, Outcome, Thresholds, Timings
from feature_store.ingest.schema import ColumnPlan, plan_columns
from feature_store.ingest.spec import RetrySpec, TaskSpec
from feature_store.ingest.task import (
    DETAIL,
    EXTRA,
    KIND,
    REASON,
    STATS,
    Counters,
    write_partition,
)
from feature_store.registry import Registry, load_registry
from feature_store.store import FeatureStore

log = logging.getLogger(__name__)
_CAUSE = re.compile(r"^[\w.]+(Error|Exception): ")

FORMATS = ("parquet", "csv", "json", "orc")
LOCAL_LOG4J = Path(__file__).with_name("log4j2-local.properties")
DEFAULT_SPARK_CONF: dict[str, str] = {
    "spark.ui.showConsoleProgress": "false",  # the job prints its own progress line
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    # pandas (and so Feast's sources) write timestamps in nanoseconds, a Parquet type Spark
    # refuses to read; read it as a long instead, so such a file loads (the job writes no
    # timestamp column as a feature)
    "spark.sql.legacy.parquet.nanosAsLong": "true",
}
_SPARK_TYPES: dict[pa.DataType, T.DataType] = {
    pa.string(): T.StringType(),
    pa.int64(): T.LongType(),
    pa.float64(): T.DoubleType(),
}


@dataclass(frozen=True, slots=True)
class IngestJob:
    """One run's inputs. ``mapping`` renames input columns to features (column -> feature)."""

    registry: Path
    group: str
    input: str
    id_column: str
    redis_url: str
    format: str = "parquet"
    read_options: Mapping[str, str] = field(default_factory=dict)
    mapping: Mapping[str, str] = field(default_factory=dict)
    chunk_size: int = 500
    retry: RetrySpec = field(default_factory=RetrySpec)
    thresholds: Thresholds = field(default_factory=Thresholds)
    quarantine: str | None = None  # default: quarantine/<group>-<UTC time>
    report_path: Path | None = None
    allow_missing_features: bool = False
    ignore_extra_columns: bool = False
    # the snapshot's event time; default: its input files' newest modification time
    written_at: float | None = None
    event_time_column: str | None = None  # each row's event time instead (ingest.encode)
    ordered: bool = True  # False: no ordering guard, last writer wins (a first load)
    partitions: int | None = None  # repartition the input first; None keeps Spark's split
    socket_timeout: float = 5.0  # its own flag: a chunk's write takes longer than a read
    connect_timeout: float = 1.0  # these three: FEATURE_STORE_CONNECT_TIMEOUT, ...
    max_connections: int = 4
    redis_retries: int = 1
    durability: Durability = ASYNCHRONOUS  # FEATURE_STORE_WRITE_DURABILITY, --write-durability
    progress_interval: float = 10.0
    profile_dir: str | None = None  # cProfile dumps, one per task


def job_target(job: IngestJob, url: str) -> RedisTarget:
    options = RedisOptions(
        job.socket_timeout,
        job.connect_timeout,
        job.max_connections,
        job.redis_retries,
        job.durability,
    )
    return options.target(url)


def spark_session(
    master: str | None = "local[*]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "feature-store-ingest",
    log_level: str | None = None,
) -> SparkSession:
    """A session with the job's defaults; ``master=None`` keeps spark-submit's.

    In local mode Spark logs errors only (``LOCAL_LOG4J``; ``log_level`` shows more), binds
    to loopback, and its workers run this interpreter, which has feature_store installed.
    A cluster keeps its own logging configuration, at WARN unless ``log_level`` says.
    """
    local = master is not None and master.startswith("local")
    settings = dict(DEFAULT_SPARK_CONF)
    if local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # without it Spark warns that the hostname resolves to a loopback address
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={LOCAL_LOG4J.as_uri()}"
        )
    settings.update(conf or {})
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level or ("ERROR" if local else "WARN"))
    return spark


def run_ingest(
    spark: SparkSession, job: IngestJob, progress: Callable[[str], None] | None = None
) -> IngestReport:
    """Run the job. Writes the JSON report if asked, also when the job fails.

    Raises RequestError (input/schema), StoreError (Redis) or FeatureStoreError (Spark)
    when the job fails; the report says ``failed`` and the exception carries the cause.
    """
    started = time.monotonic()
    written_at = int(time.time()) if job.written_at is None else job.written_at
    base: dict[str, object] = {
        "group": job.group,
        "input": job.input,
        "target": "(not parsed)",
        "written_at": written_at,
        "written_at_from": "job start" if job.written_at is None else "given",
        "event_time_column": job.event_time_column,
        "ordered": job.ordered,
        "chunk_size": job.chunk_size,
    }
    try:
        report = _run(spark, job, base, started, progress)
    except FeatureStoreError as e:
        # every failure gets its report, also one before any row is read (a wrong password,
        # TLS to a plain Redis, a refused port, a bad input path)
        if job.report_path is not None:
            _failed_report(base, started, str(e)).write(job.report_path)
        raise
    if job.report_path is not None:
        report.write(job.report_path)
    return report


def _run(
    spark: SparkSession,
    job: IngestJob,
    base: dict[str, object],
    started: float,
    progress: Callable[[str], None] | None,
) -> IngestReport:
    """The job; fills ``base`` (the report's fixed fields) as it learns them."""
    if job.chunk_size < 1:
        raise RequestError("--chunk-size must be at least 1")
    registry = load_registry(job.registry)
    group = registry.group(job.group)
    target = job_target(job, job.redis_url)
    base["target"] = str(target)
    df = read_input(spark, job)
    event_time_column = job.event_time_column
    if job.written_at is None and event_time_column is None and group.aggregation is None:
        newest = newest_input_time(spark, df)
        if newest is not None:
            base["written_at"], base["written_at_from"] = newest, "input files"
    if group.aggregation is not None:
        # a backfill: the history of events, each with its time (ingest.backfill)
        event_time_column = event_time_column or DEFAULT_EVENT_TIME_COLUMN
        base["event_time_column"] = event_time_column
        if not job.ordered:
            raise RequestError(
                f"--no-ordering: {group.name!r} is window aggregations, whose backfill "
                "replaces each entity's tiles; it has no ordering guard to leave out"
            )
    plan = plan_columns(
        df.schema,
        group if group.aggregation is None else field_group(group),
        job.id_column,
        job.mapping,
        allow_missing=job.allow_missing_features,
        ignore_extra=job.ignore_extra_columns,
        event_time_column=event_time_column,
    )
    run_ids = check_redis(target, registry)  # fails here, before any write, if Redis is down
    redis_url = job.redis_url
    if target.cluster:  # every node the driver sees, for tasks and for the end of the job
        redis_url = _with_cluster_nodes(target)
        target = job_target(job, redis_url)
    written_at = cast(float, base["written_at"])
    spec = TaskSpec(
        registry_text=job.registry.read_text(encoding="utf-8"),
        registry_source=str(job.registry),
        group=group.name,
        id_column=plan.id_column,
        id_source=plan.id_source,
        columns=plan.columns,
        redis_url=redis_url,
        written_at=written_at,
        event_time_column=event_time_column,
        ordered=job.ordered,
        chunk_size=job.chunk_size,
        retry=job.retry,
        socket_timeout=job.socket_timeout,
        connect_timeout=job.connect_timeout,
        max_connections=job.max_connections,
        redis_retries=job.redis_retries,
        durability=job.durability,
        profile_dir=job.profile_dir,
        aggregated=group.aggregation is not None,
    )
    quarantine = job.quarantine or os.path.join(
        "quarantine", f"{group.name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    )
    try:
        report = _execute(spark, df, plan, spec, job, quarantine, base, started, progress)
    finally:
        # also after a failure: rows that were written are new, serving must not hide them
        announced = _announce(target, registry, group.name)
    if not announced:
        report = _with_warning(
            report,
            "could not tell serving instances about this write (Redis pub/sub): their caches "
            "show the new values within their TTL",
        )
    if base["written_at_from"] == "job start" and event_time_column is None:
        report = _with_warning(
            report,
            "the snapshot's event time is the job's start (its input names no files): a push "
            "or stream write older than that was overwritten; pass --event-time (the data's "
            "cutoff) or --event-time-column",
        )
    if run_ids and _run_ids(target) != run_ids:
        report = _with_warning(
            report,
            "Redis restarted during the job: with appendfsync other than 'always' writes "
            "acknowledged just before a crash can be lost; re-run the job (it is idempotent) "
            "to restore them",
        )
    return report


def read_input(spark: SparkSession, job: IngestJob) -> DataFrame:
    if job.format not in FORMATS:
        raise RequestError(f"unknown input format {job.format!r}; use one of {', '.join(FORMATS)}")
    options = dict(job.read_options)
    if job.format == "csv":
        options.setdefault("header", "true")
    try:
        return spark.read.format(job.format).options(**options).load(job.input)
    except Exception as e:  # AnalysisException and friends: path missing, bad format
        raise RequestError(
            f"cannot read {job.format} input {job.input!r}: {_first_line(e)}"
        ) from None


def newest_input_time(spark: SparkSession, df: DataFrame) -> float | None:
    """The newest modification time of the files ``df`` reads (unix seconds, to the
    millisecond), on any file system Hadoop reaches; None when it reads no files.

    The default event time of a snapshot: no value in a file is newer than the file, so a
    push or stream write made after the input was written is never overwritten by it.
    """
    files = df.inputFiles()
    if not files:
        return None
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    newest = 0
    for name in files:
        path = jvm.org.apache.hadoop.fs.Path(name)  # type: ignore[union-attr]
        newest = max(newest, path.getFileSystem(conf).getFileStatus(path).getModificationTime())
    return newest / 1000


def _execute(
    spark: SparkSession,
    df: DataFrame,
    plan: ColumnPlan,
    spec: TaskSpec,
    job: IngestJob,
    quarantine: str,
    base: Mapping[str, object],
    started: float,
    progress: Callable[[str], None] | None,
) -> IngestReport:
    selected = df.select(*[F.col(f"`{c}`") for c in plan.input_columns])
    write: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
    if spec.aggregated and spec.event_time_column is not None:
        # every event of an entity in one task, in time order
        by = F.col(f"`{plan.id_column}`")
        selected = (
            selected.repartition(job.partitions, by)
            if job.partitions is not None
            else selected.repartition(by)
        ).sortWithinPartitions(by, F.col(f"`{spec.event_time_column}`"))
    elif job.partitions is not None:
        selected = selected.repartition(job.partitions)
    out_schema = T.StructType(
        [T.StructField(f.name, f.dataType, True) for f in selected.schema.fields]
        + [T.StructField(name, _spark_type(t), True) for name, t in EXTRA]
    )
    # Spark hands timestamps (an event time column) to Arrow in the session's zone
    zone = spark.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_schema, timezone=zone)
    sc = spark.sparkContext
    counters = Counters(sc.accumulator(0), sc.accumulator(0), sc.accumulator(0))
    if spec.aggregated:
        write = partial(backfill_partition, spec, arrow_schema)
    else:
        write = partial(write_partition, spec, arrow_schema, counters)
    result = selected.mapInArrow(write, out_schema)
    result = result.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with (
            _spark_errors(counters),
            _progress(spark, counters, progress, job.progress_interval, started),
        ):
            # one pass: a row per kind and reason (stats rows have no reason)
            groups = (
                result.groupBy(KIND, REASON)
                .agg(
                    F.count(F.lit(1)).alias("n"),
                    *[F.sum(name).alias(name) for name, _ in STATS],
                )
                .collect()
            )
        by_reason = {r[REASON]: int(r["n"]) for r in groups if r[KIND] == "bad"}
        stats = [r for r in groups if r[KIND] == "stats"]
        sums = stats[0].asDict() if stats else {name: 0 for name, _ in STATS}
        sums["tasks"] = int(stats[0]["n"]) if stats else 0
        if by_reason:
            with _spark_errors(counters):
                result.where(F.col(KIND) == "bad").select(
                    *plan.input_columns, REASON, DETAIL
                ).write.mode("overwrite").parquet(quarantine)
    finally:
        result.unpersist()

    elapsed = time.monotonic() - started
    rows = int(sums["_ingest_rows"] or 0)
    bad = sum(by_reason.values())
    written = int(sums["_ingest_written"] or 0)
    over = job.thresholds.exceeded(bad, rows)
    return IngestReport(
        outcome=Outcome.BAD_ROWS_OVER_THRESHOLD if over else Outcome.SUCCEEDED,
        rows_read=rows,
        entities_written=int(sums["_ingest_entities"] or 0),
        entities_skipped=int(sums["_ingest_skipped"] or 0),
        values_written=written,
        values_removed=int(sums["_ingest_removed"] or 0),
        bad_rows=bad,
        bad_rows_by_reason=dict(sorted(by_reason.items())),
        elapsed_seconds=round(elapsed, 3),
        values_per_second=round(written / elapsed, 1) if elapsed > 0 else 0.0,
        chunks=int(sums["_ingest_chunks"] or 0),
        retries=int(sums["_ingest_retries"] or 0),
        tasks=int(sums["tasks"]),
        quarantine=quarantine if bad else None,
        task_seconds=Timings(
            read=round(float(sums["_ingest_read_s"] or 0.0), 3),
            encode=round(float(sums["_ingest_encode_s"] or 0.0), 3),
            redis=round(float(sums["_ingest_redis_s"] or 0.0), 3),
        ),
        message=over,
        **base,  # type: ignore[arg-type]
    )


def _spark_type(t: pa.DataType) -> T.DataType:
    return _SPARK_TYPES[t]


def check_redis(target: RedisTarget, registry: Registry) -> set[str]:
    """Fail now if Redis does not answer; warn about its listpack limit; its run ids."""
    with FeatureStore.connect(target, registry) as store:
        store.ping()
        try:
            store.check_server()
        except StoreError as e:  # managed Redis often refuses CONFIG: not a reason to stop
            log.warning("could not check the server's listpack settings: %s", e)
    return _run_ids(target)


def _with_cluster_nodes(target: RedisTarget) -> str:
    """The cluster URL naming every node the driver sees: a task that starts after the
    URL's own node died still finds the cluster."""
    client = target.sync_client()
    try:
        nodes = [(n.host, n.port) for n in client.get_nodes()]  # type: ignore[union-attr]
    finally:
        client.close()
    return target.with_seeds(nodes)


def _announce(target: RedisTarget, registry: Registry, group: str) -> bool:
    """Publish the group's new generation for serving instances' caches (notices)."""
    try:
        with FeatureStore.connect(target, registry) as store:
            return store.announce(group, time.time())
    except FeatureStoreError as e:
        log.warning("could not announce the write of %s: %s", group, e)
        return False


def _run_ids(target: RedisTarget) -> set[str]:
    """The run_id of every server behind the target: it changes when a server restarts."""
    client = target.sync_client()
    try:
        with translated_errors():
            info = client.info("server")
    except StoreError:
        return set()
    finally:
        client.close()
    infos = info.values() if "run_id" not in info else [info]
    return {str(i.get("run_id")) for i in infos if isinstance(i, dict)}


@contextlib.contextmanager
def _spark_errors(counters: Counters) -> Iterator[None]:
    """Spark's exceptions (a failed task, the JVM) as the project's errors."""
    try:
        yield
    except FeatureStoreError:
        raise
    except Exception as e:
        text = str(e)
        partial_counts = (
            f" (tasks that finished before the failure wrote {counters.values.value:,} values "
            f"of {counters.entities.value:,} entities; the run is not complete)"
        )
        for name, error in (
            ("StoreTimeoutError", StoreUnavailableError),
            ("StoreUnavailableError", StoreUnavailableError),
            ("StoreError", StoreError),
        ):
            line = _line_with(text, f"{name}: ")
            if line is not None:
                raise error(f"the ingest job failed: {line}{partial_counts}") from None
        raise FeatureStoreError(
            f"the ingest job failed in Spark: {_cause_line(text) or _first_line(e)}{partial_counts}"
        ) from e


def _cause_line(text: str) -> str | None:
    """The last ``SomeError: message`` line of a (Python worker) traceback in ``text``."""
    found = None
    for line in text.splitlines():
        if _CAUSE.match(line.strip()):
            found = line.strip()
    return found


def _line_with(text: str, marker: str) -> str | None:
    for line in text.splitlines():
        if marker in line:
            return line[line.index(marker) :].strip()
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@contextlib.contextmanager
def _progress(
    spark: SparkSession,
    counters: Counters,
    emit: Callable[[str], None] | None,
    interval: float,
    started: float,
) -> Iterator[None]:
    """A line every ``interval`` seconds while the Spark job runs: tasks done and rate."""
    if emit is None or interval <= 0:
        yield
        return
    stop = threading.Event()
    tracker = spark.sparkContext.statusTracker()

    def loop() -> None:
        while not stop.wait(interval):
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            elapsed = time.monotonic() - started
            values = counters.values.value
            emit(
                f"ingest: {elapsed:.0f}s, tasks {done}/{total}, finished tasks wrote "
                f"{counters.rows.value:,} rows, {values:,} values "
                f"({values / max(elapsed, 1e-9):,.0f} values/s)"
            )

    thread = threading.Thread(target=loop, name="ingest-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _failed_report(base: Mapping[str, object], started: float, message: str) -> IngestReport:
    return IngestReport(
        outcome=Outcome.FAILED,
        rows_read=0,
        entities_written=0,
        entities_skipped=0,
        values_written=0,
        values_removed=0,
        bad_rows=0,
        bad_rows_by_reason={},
        elapsed_seconds=round(time.monotonic() - started, 3),
        values_per_second=0.0,
        chunks=0,
        retries=0,
        tasks=0,
        quarantine=None,
        message=message,
        **base,  # type: ignore[arg-type]
    )


def _with_warning(report: IngestReport, warning: str) -> IngestReport:
    from dataclasses import replace

    return replace(report, warnings=(*report.warnings, warning))
