"""Apache Kafka for the stream writer: where its jars are, and a broker of our own.

``scripts/setup.sh`` fetches two sets of release jars from Maven Central into the project's
environment (``kafka/*.pom.xml``): Kafka's broker, and Spark's Kafka source with the jars it
needs that pyspark does not ship. ``FEATURE_STORE_KAFKA_JARS`` points elsewhere.

``EmbeddedKafka`` runs one broker in KRaft mode (broker and controller in one JVM, no
ZooKeeper) on free loopback ports with its log in a directory of ours, for tests and
benchmarks, as ``EmbeddedRedis`` runs a redis-server. Stopped by its pid.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from feature_store.embedded import free_port
from feature_store.errors import FeatureStoreError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
SETUP_HINT = "run ./scripts/setup.sh (it fetches them with Maven), or set FEATURE_STORE_KAFKA_JARS"


class KafkaError(FeatureStoreError):
    """The embedded broker could not start, or Kafka's jars are missing."""


def jars_dir() -> Path:
    """Where the jars are: ``$FEATURE_STORE_KAFKA_JARS``, else the environment's ``kafka/``."""
    configured = os.environ.get("FEATURE_STORE_KAFKA_JARS")
    return Path(configured) if configured else Path(sys.prefix) / "kafka"


def spark_connector_jars() -> list[str]:
    """The jars of Spark's Kafka source, for ``spark.jars``."""
    directory = jars_dir() / "spark"
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise KafkaError(f"Spark's Kafka connector is not in {directory}: {SETUP_HINT}")
    return jars


class EmbeddedKafka:
    """One Kafka broker in KRaft mode on 127.0.0.1; ``bootstrap`` once started.

    The same ``data_dir`` and ``port`` after ``kill()`` or ``stop()`` restart the same
    broker with its topics and offsets."""

    def __init__(self, data_dir: Path, port: int | None = None, heap: str = "384m") -> None:
        self.data_dir = data_dir
        self.port = port
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None
        self._controller_port: int | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise KafkaError("the broker has not started")
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise KafkaError("java was not found on PATH (Debian: apt-get install openjdk-17-jre)")
        broker = jars_dir() / "broker"
        if not any(broker.glob("kafka_2.13-*.jar")):
            raise KafkaError(f"Kafka's broker jars are not in {broker}: {SETUP_HINT}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self._controller_port = self._controller_port or free_port()
        config = self.data_dir / "server.properties"
        config.write_text(self._config())
        classpath = f"{broker}/*"
        logs = self.data_dir / "logs"
        if not (logs / "meta.properties").exists():
            self._run(
                java,
                classpath,
                "format",
                "-t",
                "feature-store-embedded0",
                "-c",
                str(config),
                "--standalone",
            )
        out = (self.data_dir / "broker.log").open("ab")
        self.process = subprocess.Popen(
            [
                java,
                f"-Xmx{self.heap}",
                "-XX:+UseSerialGC",
                "-cp",
                classpath,
                "kafka.Kafka",
                str(config),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "KAFKA_LOG4J_OPTS": ""},
        )
        out.close()
        self._wait_ready()
        return self.bootstrap

    def _config(self) -> str:
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self._controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self._controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "2",
            "auto.create.topics.enable": "true",
        }
        return "".join(f"{k}={v}\n" for k, v in lines.items())

    def _run(self, java: str, classpath: str, *args: str) -> None:
        done = subprocess.run(
            [java, "-cp", classpath, "kafka.tools.StorageTool", *args],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise KafkaError(f"formatting Kafka's log directory failed: {done.stdout[-2000:]!r}")

    def _wait_ready(self) -> None:
        """Until the broker accepts connections on its port, or exits, or the timeout. (Its
        jars carry no SLF4J binding, so it logs nothing to wait for.) Clients retry the
        moments until its metadata is ready."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KafkaError(f"the Kafka broker exited: see {self.data_dir / 'broker.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port or 0), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise KafkaError(f"the Kafka broker did not start in {START_TIMEOUT_S:.0f} s")

    def kill(self) -> None:
        """SIGKILL, as a crash: the next ``start()`` recovers its log."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: signal.Signals) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> EmbeddedKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
