"""The alert rules and the Grafana dashboard against a real Prometheus scraping a real server.

Debian's `prometheus` (installed by scripts/setup.sh) scrapes a `serve --workers 2` under
REST and gRPC load every second and evaluates deploy/prometheus/rules.yml every second.
The recorded series must hold data, every query of every panel of
deploy/grafana/feature-store.json must return some, and with Redis SIGSTOPped the
circuit alert must go pending. Then a `feature-store stream --metrics-port` after a known
run: its counters equal what the run did, and the stream row's queries return data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
import redis

from feature_store import sample
from feature_store.embedded import EmbeddedRedis, free_port
from feature_store.layout import entity_key
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1 import serving_pb2_grpc as pb_grpc
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "feature-store.json"
GROUP, ENTITY = sample.GROUP, sample.ENTITY
REGISTRY = sample.registry()
BROKEN = 13  # an entity whose key holds a string: answered with status error


class Prometheus:
    """A prometheus process on a free loopback port, with its data in ``workdir``."""

    def __init__(self, workdir: Path, target: str, job: str = "feature-serving") -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {"job_name": job, "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        self.log = (workdir / "prometheus.log").open("wb")
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus is not installed: run ./scripts/setup.sh"
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=self.log,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        until(lambda: self._ready(), "Prometheus to start", 30)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> list[dict[str, object]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        body = r.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def alerts(self) -> list[dict[str, object]]:
        alerts: list[dict[str, object]] = httpx.get(f"{self.url}/api/v1/alerts", timeout=5).json()[
            "data"
        ]["alerts"]
        return alerts

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def dashboard_exprs(prefix: str) -> list[str]:
    """The dashboard's queries of the series named ``prefix*`` (its rows hold none)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return [e for e in exprs if prefix in e]


def until(check: Callable[[], bool], what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.25)


def load(rest_url: str, grpc_target: str, stop: threading.Event) -> None:
    """REST and gRPC lookups (one id broken, one bad request now and then), bounded."""
    deadline = time.monotonic() + 240
    with (
        httpx.Client(base_url=rest_url, timeout=2) as http,
        grpc.insecure_channel(grpc_target) as channel,
    ):
        stub = pb_grpc.FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
        i = 0
        while not stop.is_set() and time.monotonic() < deadline:
            i += 1
            ids = [i % 200, (i * 7) % 200, BROKEN]
            http.post(
                "/v1/features/get", json={"entity_type": ENTITY, "ids": ids, "groups": [GROUP]}
            )
            if i % 10 == 0:
                http.post("/v1/features/get", json={"entity_type": ENTITY, "ids": ["x"]})
            with contextlib.suppress(grpc.RpcError):  # while Redis is stopped
                stub.GetFeatures(
                    pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=ids, groups=[GROUP]),
                    timeout=2,
                )
            time.sleep(0.01)


@pytest.mark.timeout(300)
def test_rules_and_dashboard_in_a_real_prometheus(own_redis: EmbeddedRedis, tmp_path: Path) -> None:
    with FeatureStore.connect(own_redis.url, REGISTRY) as store:
        store.write(GROUP, sample.rows(200))
        # a batch write an hour ago, announced as the nightly job does
        store.announce(GROUP, int(time.time()) - 3600)
    prefix, id_type = REGISTRY.entities[ENTITY].prefix, REGISTRY.entities[ENTITY].id_type
    with redis.Redis.from_url(own_redis.url) as r:
        r.set(entity_key(prefix, id_type, BROKEN), b"not a hash")
    env = {
        "FEATURE_SERVING_CACHE_TTL": "1",
        "FEATURE_SERVING_SHADOW_FRACTION": "0.5",
        "FEATURE_SERVING_BREAKER_FAILURES": "3",
        "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "0.3",
    }
    stop = threading.Event()
    with ServingProcess(own_redis.url, args=["--workers", "2"], env=env) as server:
        # the notice above came before the server: announce again, now that it listens
        with FeatureStore.connect(own_redis.url, REGISTRY) as store:
            store.announce(GROUP, int(time.time()) - 3600)
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{server.port}")
        worker = threading.Thread(target=load, args=(server.rest_url, server.grpc_target, stop))
        worker.start()
        try:
            # the recorded series, for both APIs
            for rule in (
                "api:feature_serving_requests:rate5m",
                "api:feature_serving_availability:rate5m",
                "api:feature_serving_get_latency_p99:rate5m",
                "api:feature_serving_entity_error_ratio:rate5m",
            ):
                until(
                    lambda r=rule: (
                        {s["metric"]["api"] for s in prometheus.query(r)}  # type: ignore[index]
                        == {"rest", "grpc"}
                    ),
                    f"{rule} for REST and gRPC",
                    60,
                )
            until(
                lambda: bool(prometheus.query("feature_serving_cache_hit_ratio:rate5m")),
                "hit ratio",
                30,
            )
            age = prometheus.query("group:feature_serving_batch_data_age_seconds")
            assert [s["metric"]["group"] for s in age] == [GROUP]  # type: ignore[index]
            assert 3500 < float(age[0]["value"][1]) < 3700  # type: ignore[index]
            ratio = prometheus.query('api:feature_serving_entity_error_ratio:rate5m{api="rest"}')
            assert 0.2 < float(ratio[0]["value"][1]) < 0.45  # type: ignore[index]  # 1 of 3 ids

            # every serving panel's every query has data
            exprs = dashboard_exprs("feature_serving")
            assert len(exprs) >= 20
            stopped = own_redis.process
            assert stopped is not None
            os.kill(stopped.pid, signal.SIGSTOP)  # the circuit opens; stale serves, 503s
            try:
                until(
                    lambda: any(
                        a["labels"]["alertname"] == "FeatureServingCircuitOpen"  # type: ignore[index]
                        and a["state"] in ("pending", "firing")
                        for a in prometheus.alerts()
                    ),
                    "the circuit alert to go pending",
                    60,
                )
                for expr in exprs:
                    until(lambda e=expr: bool(prometheus.query(e)), f"data for {expr}", 60)
            finally:
                os.kill(stopped.pid, signal.SIGCONT)
        finally:
            stop.set()
            worker.join(timeout=30)
            prometheus.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample_ in family.samples:
            if sample_.name == name and all(sample_.labels.get(k) == v for k, v in labels.items()):
                return float(sample_.value)
    raise AssertionError(f"no {name} {labels}")


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_stream_metrics_after_a_known_run_in_a_real_prometheus(
    own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """203 records: 100 entities twice (keyed, so each entity's two are in one partition
    and one micro-batch), 10 of them older than what Redis holds, 3 bad records."""
    import orjson
    from confluent_kafka import Producer

    from feature_store.kafka import EmbeddedKafka

    registry_file = tmp_path / "features.yaml"
    registry_file.write_text(sample.registry_text())
    t0 = time.time() - 600
    with FeatureStore.connect(own_redis.url, REGISTRY) as store:
        store.write(GROUP, [(i, {"int_0": -1}, t0 + 100) for i in range(10)])
    with EmbeddedKafka(tmp_path / "kafka") as kafka:
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "log_level": 2})
        for step in (1, 2):
            for i in range(100):
                value = {"consumer_id": i, "event_time": t0 + step, "int_0": step}
                producer.produce("orders", orjson.dumps(value), key=str(i).encode())
        for bad in (b"nope", b'{"event_time": 1}', b'{"consumer_id": 1, "event_time": 1, "x": 1}'):
            producer.produce("orders", bad, key=b"1")
        assert producer.flush(60) == 0
        port = free_port()
        job = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "feature_store.cli",
                "stream",
                "--registry",
                str(registry_file),
                "--group",
                GROUP,
                "--topic",
                "orders",
                "--bootstrap-servers",
                kafka.bootstrap,
                "--checkpoint",
                str(tmp_path / "checkpoint"),
                "--quarantine",
                str(tmp_path / "quarantine"),
                "--redis-url",
                own_redis.url,
                "--master",
                "local[2]",
                "--conf",
                "spark.ui.enabled=false",
                "--metrics-port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        prometheus = None
        try:
            url = f"http://127.0.0.1:{port}/metrics"

            def scraped() -> str:
                try:
                    return httpx.get(url, timeout=2).text
                except httpx.HTTPError:
                    return ""

            def read_all() -> bool:
                text = scraped()
                return (
                    "feature_stream_records_read_total{" in text
                    and _metric(text, "feature_stream_records_read_total") == 203
                )

            until(read_all, "the stream job to read 203 records", 180)
            text = scraped()
            assert _metric(text, "feature_stream_records_written_total") == 90
            assert _metric(text, "feature_stream_records_skipped_total") == 10
            assert _metric(text, "feature_stream_records_superseded_total") == 100
            for reason in ("malformed_record", "null_id", "unknown_field"):
                assert _metric(text, "feature_stream_records_quarantined_total", reason=reason) == 1
            assert _metric(text, "feature_stream_event_to_written_seconds_count") == 90
            assert _metric(text, "feature_stream_event_to_written_seconds_bucket", le="60.0") == 0
            assert (
                _metric(text, "feature_stream_event_to_written_seconds_bucket", le="3600.0") == 90
            )

            prometheus = Prometheus(tmp_path, f"127.0.0.1:{port}", job="feature-stream")
            until(
                lambda: (
                    bool(prometheus.query("topic:feature_stream_bad_ratio:rate10m"))  # type: ignore[union-attr]
                    or True
                ),
                "",
                1,
            )
            for expr in dashboard_exprs("feature_stream"):
                until(lambda e=expr: bool(prometheus.query(e)), f"data for {expr}", 60)  # type: ignore[union-attr]
            lag = prometheus.query("feature_stream_lag_records")
            assert [float(s["value"][1]) for s in lag] == [0.0]  # type: ignore[index]
        finally:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
            if prometheus is not None:
                prometheus.stop()
