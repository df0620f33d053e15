"""The nightly job on a real Spark standalone cluster (a master and two workers on
loopback, from pyspark's jars), submitted with spark-submit; one worker SIGKILLed mid-job.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka import Producer

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.generate import ID_COLUMN, write_sample
from feature_store.ingest.job import spark_session
from feature_store.ingest.standalone import StandaloneCluster
from feature_store.kafka import EmbeddedKafka, spark_connector_jars
from feature_store.store import FeatureStore

pytestmark = pytest.mark.spark

N = 40_000
SEED = 11


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("standalone") / "consumers.parquet")
    spark = spark_session("local[2]", app_name="feature-store-test-input")
    try:
        write_sample(spark, path, N, seed=SEED, partitions=8)
    finally:
        spark.stop()
    return path


def _check_every_value(url: str) -> None:
    """Read every entity back independently and compare with what the generator wrote."""
    registry = sample.registry()
    group = registry.group(sample.GROUP)
    with redis.Redis.from_url(url) as r:
        assert r.dbsize() == N  # each entity exactly once
    with FeatureStore.connect(url, registry) as store:
        for start in range(0, N, 1000):
            ids = list(range(start, min(start + 1000, N)))
            got = store.read(sample.ENTITY, ids, groups=[sample.GROUP]).as_dicts()
            for i, row in zip(ids, got, strict=True):
                want = sample.features(i, SEED)
                expected = {
                    f.name: f.codec.decode(f.codec.encode(want[f.name])) for f in group.features
                }
                assert row == expected, i


def _job_args(registry: Path, parquet: str, url: str, report: Path) -> list[str]:
    return [
        *("ingest", "--registry", str(registry), "--group", sample.GROUP),
        *("--input", parquet, "--id-column", ID_COLUMN, "--redis-url", url),
        *("--report", str(report), "--chunk-size", "200", "--progress-interval", "0"),
    ]


def test_the_job_on_a_standalone_cluster_survives_a_dead_worker(
    parquet: str, registry_file: Path, tmp_path: Path
) -> None:
    report_path = tmp_path / "report.json"
    with (
        EmbeddedRedis(tmp_path / "redis", persistence=False) as server,
        StandaloneCluster(tmp_path / "spark", workers=2) as cluster,
    ):
        assert cluster.alive_workers() == 2
        killed: dict[str, int] = {}

        def kill_mid_job() -> None:
            client = redis.Redis(port=server.port or 0)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if client.dbsize() >= N // 5:
                    killed["keys"] = client.dbsize()
                    cluster.kill_worker(0)
                    return
                time.sleep(0.01)

        chaos = threading.Thread(target=kill_mid_job)
        chaos.start()
        done = cluster.submit(_job_args(registry_file, parquet, server.url, report_path))
        chaos.join()
        assert "keys" in killed, "the job ended before a worker could be killed"
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(report_path.read_text())
        assert report["outcome"] == "succeeded"
        assert report["entities_written"] >= N  # tasks of the dead worker ran again
        assert cluster.alive_workers() == 1
        _check_every_value(server.url)


def test_the_stream_job_on_a_standalone_cluster(registry_file: Path, tmp_path: Path) -> None:
    """`feature-store stream` submitted to the cluster with the Kafka source's jars: a
    topic's records written through the guard by the cluster's executors."""
    events = [(i % 500, 1_760_000_000 + i, i) for i in range(3000)]  # 6 per entity, in order
    with (
        EmbeddedRedis(tmp_path / "redis", persistence=False) as server,
        EmbeddedKafka(tmp_path / "kafka") as kafka,
        StandaloneCluster(tmp_path / "spark", workers=2) as cluster,
    ):
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "log_level": 2})
        for entity, at, value in reversed(events):  # newest first: the guard must hold
            producer.produce("cluster-events", orjson.dumps(
                {"consumer_id": entity, "event_time": at, "int_0": value}
            ))  # fmt: skip
        assert producer.flush(60) == 0
        done = cluster.submit(
            [
                *("stream", "--registry", str(registry_file), "--group", sample.GROUP),
                *("--topic", "cluster-events", "--bootstrap-servers", kafka.bootstrap),
                *("--checkpoint", str(tmp_path / "checkpoint"), "--available-now"),
                *("--redis-url", server.url, "--quarantine", str(tmp_path / "quarantine")),
            ],
            jars=spark_connector_jars(),
        )
        assert done.returncode == 0, done.stderr[-4000:]
        written = re.findall(r"stream: batch \d+: ([\d,]+) records", done.stderr + done.stdout)
        assert sum(int(n.replace(",", "")) for n in written) == 3000, done.stderr[-4000:]
        with FeatureStore.connect(server.url, sample.registry()) as store:
            got = store.read(sample.ENTITY, list(range(500)), features=["int_0"])
        assert [r.values[0] for r in got.rows] == [2500 + i for i in range(500)]
