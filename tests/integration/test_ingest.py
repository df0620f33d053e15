"""The ingest job end to end: real Spark local[2], real redis-server, one Spark session.

The session is shared by every test here (starting one costs ~20 s), and each test uses
small inputs.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.cli import main
from feature_store.client import FeatureClient
from feature_store.durability import Durability
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis, free_port
from feature_store.errors import FeatureStoreError, RequestError, StoreUnavailableError
from feature_store.ingest.generate import ID_COLUMN, sample_frame, write_sample
from feature_store.ingest.job import IngestJob, run_ingest, spark_session
from feature_store.ingest.report import Outcome, Thresholds
from feature_store.ingest.spec import RetrySpec
from feature_store.registry import Registry, load_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.spark

WRITTEN_AT = 1_760_000_000  # a past snapshot: a future one is refused
N = 300  # entities of the small inputs


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session(
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
        },
        app_name="feature-store-ingest-tests",
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def sample_input(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("ingest") / "sample.parquet")
    sample_frame(spark, N, seed=7, partitions=2).write.parquet(path)
    return path


_RUNS = itertools.count()


def _job(registry_file: Path, input_path: str, url: str, **kw: object) -> IngestJob:
    options: dict[str, object] = {
        "group": sample.GROUP,
        "id_column": ID_COLUMN,
        "written_at": WRITTEN_AT,
        "chunk_size": 64,
        "progress_interval": 0,
        # bad rows beside the input (a temporary directory), not in the working directory
        "quarantine": f"{input_path}.quarantine-{next(_RUNS)}",
    }
    options.update(kw)
    return IngestJob(registry=registry_file, input=input_path, redis_url=url, **options)  # type: ignore[arg-type]


def _expected(registry: Registry, ids: range, seed: int = 7) -> dict[int, dict[str, object]]:
    """What the store must return: each value through its codec (float32 rounding)."""
    group = registry.group(sample.GROUP)
    out = {}
    for i in ids:
        values = sample.features(i, seed)
        out[i] = {f.name: f.codec.decode(f.codec.encode(values[f.name])) for f in group.features}
    return out


def _read_back(url: str, registry: Registry, ids: list[int]) -> dict[int, dict[str, object]]:
    with FeatureStore.connect(url, registry) as store:
        result = store.read(sample.ENTITY, ids, groups=[sample.GROUP])
    return dict(zip(ids, result.as_dicts(), strict=True))


def _differing(
    got: dict[int, dict[str, object]], expected: dict[int, dict[str, object]]
) -> list[int]:
    """The ids whose values differ: a short assertion message where thousands of entities
    are compared (a diff of the two dicts takes pytest minutes)."""
    return sorted(i for i in expected.keys() | got.keys() if got.get(i) != expected.get(i))


def _dump(url: str) -> dict[bytes, dict[bytes, bytes]]:
    with redis.Redis.from_url(url) as client:
        return {key: client.hgetall(key) for key in client.scan_iter(count=1000)}


def test_values_read_back_exactly_and_bytes_match_plan_write(
    spark: SparkSession, sample_input: str, registry_file: Path, redis_url: str
) -> None:
    registry = load_registry(registry_file)
    report = run_ingest(spark, _job(registry_file, sample_input, redis_url))

    assert report.outcome is Outcome.SUCCEEDED
    assert (report.rows_read, report.entities_written) == (N, N)
    assert report.values_written == N * 50
    assert report.values_removed == 0
    assert report.bad_rows == 0
    assert report.values_per_second > 0

    ids = list(range(N))
    assert _read_back(redis_url, registry, ids) == _expected(registry, range(N))

    # the raw bytes are those plan_write produces for the same (float32-rounded) rows
    group = registry.group(sample.GROUP)
    rows = sample_frame(spark, N, seed=7).where(F.col(ID_COLUMN).isin(0, 1, 150, 299)).collect()
    plain = [(r[ID_COLUMN], {f.name: r[f.name] for f in group.features}) for r in rows]
    plan = plan_write(group, plain, now=WRITTEN_AT)
    with redis.Redis.from_url(redis_url) as client:
        for cmd in plan.commands:
            if cmd[0] == "HSET":
                expected = dict(zip(cmd[2::2], cmd[3::2], strict=True))
                assert client.hgetall(cmd[1]) == expected
            elif cmd[0] == "EXPIRE":
                assert 0 < client.ttl(cmd[1]) <= group.entity.ttl_seconds


def test_nulls_remove_fields_and_a_rerun_is_idempotent(
    spark: SparkSession, sample_input: str, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    registry = load_registry(registry_file)
    run_ingest(spark, _job(registry_file, sample_input, redis_url))

    # tonight: every third entity has no float_01 and no embedding_1
    df = spark.read.parquet(sample_input)
    nullable = ("float_01", "embedding_1")
    tonight = df.select(
        *[
            F.when(F.col(ID_COLUMN) % 3 == 0, F.lit(None)).otherwise(F.col(c)).alias(c)
            if c in nullable
            else F.col(c)
            for c in df.columns
        ]
    )
    path = str(tmp_path / "tonight.parquet")
    tonight.write.parquet(path)
    report = run_ingest(spark, _job(registry_file, path, redis_url))
    nulled = len(range(0, N, 3))
    assert report.values_removed == 2 * nulled
    assert report.values_written == N * 50 - 2 * nulled

    got = _read_back(redis_url, registry, list(range(N)))
    expected = _expected(registry, range(N))
    for i in range(N):
        if i % 3 == 0:
            expected[i].update({c: None for c in nullable})
    assert got == expected

    before = _dump(redis_url)
    again = run_ingest(spark, _job(registry_file, path, redis_url))
    assert again.outcome is Outcome.SUCCEEDED
    assert _dump(redis_url) == before
    assert len(before) == N


def test_csv_input_from_generate_reads_back_exactly(
    spark: SparkSession, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "sample.csv")
    write_sample(spark, path, 40, seed=7, partitions=1, format="csv")
    report = run_ingest(spark, _job(registry_file, path, redis_url, format="csv"))
    assert report.outcome is Outcome.SUCCEEDED
    assert report.entities_written == 40
    registry = load_registry(registry_file)
    assert _read_back(redis_url, registry, list(range(40))) == _expected(registry, range(40))


def _write_jsonl(path: Path, rows: list[Mapping[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


SMALL_REGISTRY = """\
version: 1
entities:
  user:
    prefix: u
    id_type: int
    ttl: 1d
feature_groups:
  user_features:
    entity: user
    features:
      score: float
      visits: int
      tags: int_list
      vec: embedding(3)
"""


def test_bad_rows_are_quarantined_counted_and_fail_the_threshold(
    spark: SparkSession, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry_path = tmp_path / "features.yaml"
    registry_path.write_text(SMALL_REGISTRY)
    good = {"score": 0.5, "visits": "3", "tags": [1, 2, 2], "vec": [0.1, 0.2, 0.3]}
    rows = [
        {"user_id": 1, **good},
        {"user_id": 2, **good, "visits": "many"},  # unparseable
        {"user_id": 3, **good, "vec": [0.1, 0.2]},  # wrong dimension
        {"user_id": None, **good},  # null id
        {"user_id": 5, **good, "score": None},  # good: the null removes the field
        {"user_id": 6, **good, "visits": "99999999999999999999"},  # beyond int64
    ]
    _write_jsonl(tmp_path / "in.json", rows)
    quarantine = tmp_path / "quarantine"
    report_path = tmp_path / "report.json"
    args = [
        "ingest",
        "--registry",
        str(registry_path),
        "--group",
        "user_features",
        "--input",
        str(tmp_path / "in.json"),
        "--format",
        "json",
        "--id-column",
        "user_id",
        "--redis-url",
        redis_url,
        "--quarantine",
        str(quarantine),
        "--report",
        str(report_path),
        "--progress-interval",
        "0",
    ]
    assert main(args) == 1  # over the default threshold of 0 bad rows
    out = capsys.readouterr().out
    assert "bad_rows_over_threshold" in out

    report = json.loads(report_path.read_text())
    assert report["outcome"] == "bad_rows_over_threshold"
    assert report["bad_rows_by_reason"] == {
        "invalid_value": 1,
        "null_id": 1,
        "unparseable_value": 1,
        "wrong_embedding_dim": 1,
    }
    assert (report["rows_read"], report["entities_written"], report["bad_rows"]) == (6, 2, 4)
    assert report["values_written"] == 4 + 3
    assert report["values_removed"] == 1

    bad = pq.read_table(quarantine).to_pylist()
    by_id = {r["user_id"]: r for r in bad}
    assert set(by_id) == {2, 3, None, 6}
    assert by_id[2]["_ingest_reason"] == "unparseable_value"
    assert "visits" in by_id[2]["_ingest_detail"]
    assert by_id[2]["visits"] == "many"
    assert by_id[3]["_ingest_reason"] == "wrong_embedding_dim"
    assert by_id[3]["vec"] == [0.1, 0.2]

    registry = load_registry(registry_path)
    with FeatureStore.connect(redis_url, registry) as store:
        result = store.read("user", [1, 2, 3, 5, 6], groups=["user_features"])
    assert [r.found for r in result.rows] == [True, False, False, True, False]
    assert result.as_dicts()[0] == {
        "score": 0.5,
        "visits": 3,
        "tags": [1, 2, 2],
        "vec": pytest.approx([0.1, 0.2, 0.3], rel=1e-6),
    }
    assert result.as_dicts()[3]["score"] is None

    # a tolerance of 4 bad rows lets the same input succeed
    assert main([*args, "--max-bad-rows", "4"]) == 0


def test_schema_mismatch_stops_before_touching_redis(
    spark: SparkSession, sample_input: str, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    df: DataFrame = spark.read.parquet(sample_input)
    wrong = df.withColumn("int_3", F.col("embedding_0"))  # an array where an int belongs
    path = str(tmp_path / "wrong.parquet")
    wrong.write.parquet(path)
    with pytest.raises(RequestError, match=r"column 'int_3' has type array<float>"):
        run_ingest(spark, _job(registry_file, path, redis_url))
    with redis.Redis.from_url(redis_url) as client:
        assert client.dbsize() == 0


@pytest.mark.cluster
def test_redis_cluster_target(
    spark: SparkSession, sample_input: str, registry_file: Path, cluster_url: str
) -> None:
    registry = load_registry(registry_file)
    report = run_ingest(spark, _job(registry_file, sample_input, cluster_url))
    assert report.outcome is Outcome.SUCCEEDED
    assert report.entities_written == N
    assert _read_back(cluster_url, registry, list(range(N))) == _expected(registry, range(N))


FAULT_N = 6000


@pytest.fixture(scope="module")
def fault_input(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("fault") / "sample.parquet")
    sample_frame(spark, FAULT_N, seed=7, partitions=2).write.parquet(path)
    return path


def _kill_when_keys(server: EmbeddedRedis, keys: int, outage: float | None) -> threading.Thread:
    """Kill the server once it holds ``keys`` keys; restart it ``outage`` seconds later."""
    state: dict[str, object] = {}

    def chaos() -> None:
        client = redis.Redis(port=server.port or 0, socket_timeout=1)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if client.dbsize() >= keys:
                    break
            except redis.RedisError:
                pass
            time.sleep(0.002)
        state["keys_at_kill"] = client.dbsize()
        server.kill()
        state["killed"] = True
        if outage is not None:
            time.sleep(outage)
            server.restart()

    thread = threading.Thread(target=chaos, name="redis-chaos")
    thread.state = state  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_redis_killed_mid_job_retries_and_finishes(
    spark: SparkSession, fault_input: str, registry_file: Path, tmp_path: Path
) -> None:
    registry = load_registry(registry_file)
    # appendfsync always: every acknowledged write survives the kill
    with EmbeddedRedis(tmp_path / "redis", extra_config={"appendfsync": "always"}) as server:
        chaos = _kill_when_keys(server, 300, outage=1.5)
        job = _job(
            registry_file,
            fault_input,
            server.url,
            chunk_size=20,
            retry=RetrySpec(retries=12, base_delay=0.05, max_delay=1.0),
        )
        report = run_ingest(spark, job)
        chaos.join()
        state = chaos.state  # type: ignore[attr-defined]
        assert state.get("killed")
        assert int(state["keys_at_kill"]) < FAULT_N
        assert report.outcome is Outcome.SUCCEEDED
        assert report.retries >= 1
        assert report.entities_written == FAULT_N
        got = _read_back(server.url, registry, list(range(FAULT_N)))
        assert _differing(got, _expected(registry, range(FAULT_N))) == []


def test_outage_beyond_the_retry_bound_fails_clearly(
    spark: SparkSession, fault_input: str, registry_file: Path, tmp_path: Path
) -> None:
    report_path = tmp_path / "report.json"
    with EmbeddedRedis(tmp_path / "redis") as server:
        chaos = _kill_when_keys(server, 300, outage=None)
        job = _job(
            registry_file,
            fault_input,
            server.url,
            chunk_size=20,
            retry=RetrySpec(retries=2, base_delay=0.05, max_delay=0.1),
            report_path=report_path,
        )
        with pytest.raises(StoreUnavailableError, match="after 2 retries"):
            run_ingest(spark, job)
        chaos.join()
        assert chaos.state.get("killed")  # type: ignore[attr-defined]
        server.restart()  # so that the context manager can stop it
    report = json.loads(report_path.read_text())
    assert report["outcome"] == "failed"
    assert "after 2 retries" in report["message"]


def test_thresholds_by_fraction() -> None:
    assert Thresholds(None, 0.1).exceeded(10, 100) is None
    assert "fraction" in (Thresholds(None, 0.1).exceeded(11, 100) or "")
    assert Thresholds(None, None).exceeded(10**6, 10**6) is None


def test_local_spark_logs_nothing_but_errors(tmp_path: Path) -> None:
    """A local run prints the command's own lines, not Spark's start-up warnings."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "feature_store.cli", "generate", "--entities", "50"),
            *("--output", str(tmp_path / "x.parquet"), "--master", "local[1]"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"},
    )
    assert out.returncode == 0, out.stderr
    assert "wrote 50 consumer rows" in out.stdout
    # the one line left is the JVM's own notice of the module Spark 4 loads (see demo.sh)
    noise = [
        line
        for line in out.stderr.splitlines()
        if line.strip() and not line.startswith("WARNING: Using incubator modules")
    ]
    assert noise == []


@pytest.mark.parametrize("fault", ["refused port", "wrong password", "TLS to plain Redis"])
def test_a_job_that_fails_before_it_starts_still_writes_its_report(
    spark: SparkSession,
    sample_input: str,
    registry_file: Path,
    redis_server: EmbeddedRedis,
    tmp_path: Path,
    fault: str,
) -> None:
    host_port = redis_server.url.removeprefix("redis://")
    url = {
        "refused port": f"redis://127.0.0.1:{free_port()}",
        "wrong password": f"redis://nobody:wrong-password@{host_port}",  # no such ACL user
        "TLS to plain Redis": f"rediss://{host_port}",
    }[fault]
    report_path = tmp_path / "report.json"
    job = _job(registry_file, sample_input, url, report_path=report_path, connect_timeout=1.0)
    with pytest.raises(FeatureStoreError) as raised:
        run_ingest(spark, job)
    report = json.loads(report_path.read_text())
    assert report["outcome"] == "failed"
    assert report["message"] == str(raised.value)
    assert report["entities_written"] == 0
    assert "wrong-password" not in report["target"]  # redacted


def test_serving_sees_the_job_s_values_at_its_end_not_at_its_cache_ttl(
    spark: SparkSession, sample_input: str, registry_file: Path, redis_url: str
) -> None:
    """The job announces its group's generation; a serving cache refreshes what is older."""
    registry = load_registry(registry_file)
    with FeatureStore.connect(redis_url, registry, notify=False) as store:  # yesterday's run
        store.write(
            sample.GROUP, [(i, {"int_0": -1}) for i in range(N)], event_time=WRITTEN_AT - 86400
        )
    env = {"FEATURE_SERVING_CACHE_TTL": "3600", "FEATURE_SERVING_SHADOW_FRACTION": "0"}
    with (
        ServingProcess(redis_url, registry=registry_file, env=env, grpc=False) as server,
        FeatureClient(server.rest_url, timeout=10) as client,
    ):
        ids = list(range(N))
        assert {r.values[0] for r in client.get(sample.ENTITY, ids, ["int_0"]).rows} == {-1}
        report = run_ingest(spark, _job(registry_file, sample_input, redis_url))
        assert report.outcome is Outcome.SUCCEEDED
        assert not report.warnings
        expected = [v["int_0"] for v in _expected(registry, range(N)).values()]
        deadline = time.monotonic() + 15
        while [r.values[0] for r in client.get(sample.ENTITY, ids, ["int_0"]).rows] != expected:
            assert time.monotonic() < deadline, "serving kept the cached values"
            time.sleep(0.1)


def test_event_time_column_never_overwrites_newer_push_writes(
    spark: SparkSession, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    """Each row's event time from a timestamp column: entities pushed with newer events
    keep them (skipped and counted), older pushes are overwritten, a null time is
    quarantined; a second run of the same input changes nothing but writes again."""
    registry = load_registry(registry_file)
    t0 = 1_760_000_000
    path = str(tmp_path / "events.parquet")
    seconds = F.col(ID_COLUMN).cast("long") + t0
    frame = sample_frame(spark, N, seed=7, partitions=2).withColumn(
        "ts", F.when(F.col(ID_COLUMN) == N - 1, None).otherwise(F.timestamp_seconds(seconds))
    )
    frame.write.parquet(path)
    with FeatureStore.connect(redis_url, registry, notify=False) as store:
        store.write(sample.GROUP, [(i, {"int_0": -7}, t0 + 10_000) for i in range(100)])
        store.write(sample.GROUP, [(i, {"int_0": -8}, t0 - 10_000) for i in range(100, 150)])
    job = _job(registry_file, path, redis_url, event_time_column="ts")
    report = run_ingest(spark, job)
    assert report.outcome is Outcome.BAD_ROWS_OVER_THRESHOLD  # the null time, quarantined
    assert report.bad_rows_by_reason == {"null_event_time": 1}
    assert report.quarantine is not None
    assert [r[ID_COLUMN] for r in pq.read_table(report.quarantine).to_pylist()] == [N - 1]
    assert (report.entities_written, report.entities_skipped) == (N - 101, 100)
    assert report.event_time_column == "ts"
    expected = _expected(registry, range(N))
    got = _read_back(redis_url, registry, list(range(N - 1)))
    assert all(got[i]["int_0"] == -7 for i in range(100))
    assert all(got[i] == expected[i] for i in range(100, N - 1))
    group = registry.group(sample.GROUP)
    with redis.Redis.from_url(redis_url) as client:
        key = f"{group.entity.prefix}:150".encode()
        assert client.hget(key, group.freshness_field) == str(t0 + 150).encode()
    again = run_ingest(spark, job)  # equal event times: written again, nothing regresses
    assert (again.entities_written, again.entities_skipped) == (N - 101, 100)
    assert _read_back(redis_url, registry, list(range(N - 1))) == got


def test_a_snapshot_older_than_the_stored_events_is_skipped_not_written(
    spark: SparkSession, sample_input: str, registry_file: Path, redis_url: str
) -> None:
    """A nightly run whose snapshot time is older than a push write does not undo it;
    --no-ordering does (last writer wins)."""
    registry = load_registry(registry_file)
    with FeatureStore.connect(redis_url, registry, notify=False) as store:
        store.write(sample.GROUP, [(5, {"int_0": -9})], event_time=WRITTEN_AT + 60)
    report = run_ingest(spark, _job(registry_file, sample_input, redis_url))
    assert (report.entities_written, report.entities_skipped) == (N - 1, 1)
    assert _read_back(redis_url, registry, [5])[5]["int_0"] == -9
    report = run_ingest(spark, _job(registry_file, sample_input, redis_url, ordered=False))
    assert (report.entities_written, report.entities_skipped, report.ordered) == (N, 0, False)
    assert _read_back(redis_url, registry, [5])[5] == _expected(registry, range(5, 6))[5]


@pytest.mark.cluster
def test_a_master_failover_mid_job_is_retried_and_every_durable_value_lands(
    spark: SparkSession, fault_input: str, registry_file: Path, tmp_path: Path
) -> None:
    """3 masters + 3 replicas; one master SIGKILLed mid-job: its replica takes over, the
    job retries its chunks and finishes, and every key is read back independently.

    The job asks for durable writes (WAIT for one replica): without it Redis replicates
    asynchronously and a master killed under load takes with it the writes it had
    acknowledged but not yet sent to its replica (seen here: values missing after the
    failover on a busy host). The killed master is started again 3 s later, as an operator
    would, and rejoins as its replacement's replica, so the replaced shard can confirm
    writes again; until then its chunks are not confirmed and are retried."""
    registry = load_registry(registry_file)
    report_path = tmp_path / "report.json"
    with EmbeddedCluster(tmp_path / "cluster", replicas=1, node_timeout_ms=1000) as cluster:
        victim = cluster.master_nodes()[0]
        chaos = _kill_when_keys(victim, 300, outage=3.0)  # keys on that master alone
        job = _job(
            registry_file,
            fault_input,
            cluster.url,
            chunk_size=20,
            retry=RetrySpec(retries=12, base_delay=0.2, max_delay=2.0),
            report_path=report_path,
            durability=Durability(1, 500),
        )
        t0 = time.monotonic()
        report = run_ingest(spark, job)
        elapsed = time.monotonic() - t0
        chaos.join()
        assert chaos.state.get("killed")  # type: ignore[attr-defined]
        assert report.outcome is Outcome.SUCCEEDED
        assert report.retries > 0
        assert report.entities_written == FAULT_N
        print(f"\njob with a failover: {elapsed:.1f} s, {report.retries} chunk retries")
        live = f"{cluster.master_nodes()[0].url}?cluster=true"  # the URL's own node died
        got = _read_back(live, registry, list(range(FAULT_N)))
        assert _differing(got, _expected(registry, range(FAULT_N))) == []


@pytest.mark.cluster
def test_write_durability_reaches_every_task_and_a_shortfall_fails_the_job(
    spark: SparkSession, sample_input: str, registry_file: Path, tmp_path: Path
) -> None:
    """``--write-durability`` (here the job's field) reaches the Spark tasks' writers:
    every chunk is followed by a WAIT on each master it wrote to, and a chunk fewer
    replicas confirmed than asked is retried, then fails the job, never reported written."""
    registry = load_registry(registry_file)
    with EmbeddedCluster(tmp_path / "cluster", replicas=1) as cluster:
        report = run_ingest(
            spark, _job(registry_file, sample_input, cluster.url, durability=Durability(1, 200))
        )
        assert report.outcome is Outcome.SUCCEEDED
        assert _read_back(cluster.url, registry, list(range(N))) == _expected(registry, range(N))
        waits = 0
        for node in cluster.master_nodes():
            with redis.Redis(port=node.port) as r:
                waits += int(r.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
        assert waits >= report.chunks  # one WAIT per master of each chunk
        short = _job(
            registry_file,
            sample_input,
            cluster.url,
            durability=Durability(2, 50),  # one replica per master: never enough
            retry=RetrySpec(retries=1, base_delay=0.05, max_delay=0.1),
            report_path=tmp_path / "report.json",
        )
        with pytest.raises(StoreUnavailableError, match="confirmed by 1 of 2 replica"):
            run_ingest(spark, short)
    assert "not durable" in json.loads((tmp_path / "report.json").read_text())["message"]


def test_by_default_a_snapshot_is_as_old_as_its_input_files(
    spark: SparkSession, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    """Without --event-time, the snapshot's event time is the newest modification time of
    its input files: a push made after the input was written (and before the job) stays; a
    push older than the files is overwritten by them."""
    path = tmp_path / "nightly.parquet"
    sample_frame(spark, N, seed=7, partitions=2).write.parquet(str(path))
    newest = max(f.stat().st_mtime for f in path.glob("*.parquet"))
    registry = load_registry(registry_file)
    with FeatureStore.connect(redis_url, registry, notify=False) as store:
        store.write(sample.GROUP, [(5, {"int_0": -9})], event_time=newest + 0.5)
        store.write(sample.GROUP, [(6, {"int_0": -8})], event_time=newest - 60)
    time.sleep(1)  # the job's start is later than the newer push
    report = run_ingest(spark, _job(registry_file, str(path), redis_url, written_at=None))
    assert report.written_at_from == "input files"
    assert abs(report.written_at - newest) < 0.002  # the file system's time, to the ms
    assert (report.entities_written, report.entities_skipped) == (N - 1, 1)
    got = _read_back(redis_url, registry, [5, 6])
    assert got[5]["int_0"] == -9
    assert got[6] == _expected(registry, range(6, 7))[6]
    assert not report.warnings
