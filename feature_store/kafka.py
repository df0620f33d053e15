"""Apache Kafka for the stream writer: where its jars are, how to fetch them, a broker of our own.

``feature-store fetch-jars`` copies release jars from Maven Central into the environment
(``<sys.prefix>/kafka``) with Maven, from the POM files shipped in this package
(``feature_store/jars/``): Spark's Kafka source and Avro functions with the jars they need
that pyspark does not ship, and, when asked, Kafka's broker. ``scripts/setup.sh`` runs it
for a checkout; a wheel's user runs it once. The setting ``FEATURE_STORE_KAFKA_JARS``
(``Settings.kafka_jars``) points elsewhere.

``EmbeddedKafka`` runs one broker in KRaft mode (broker and controller in one JVM, no
ZooKeeper) on free loopback ports with its log in a directory of ours, for tests and
benchmarks, as ``EmbeddedRedis`` runs a redis-server. Stopped by its pid.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from feature_store.embedded import free_port
from feature_store.errors import FeatureStoreError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
FETCH_HINT = "run `feature-store fetch-jars` (Maven), or set FEATURE_STORE_KAFKA_JARS"
POMS = Path(__file__).resolve().parent / "jars"
# what of spark.pom.xml's dependency tree goes on spark.jars: pyspark ships the rest
SPARK_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
    "spark-avro_2.13",
)
STAMP = ".sources"  # in the jars directory: the POMs' hash its jars came from


class KafkaError(FeatureStoreError):
    """The embedded broker could not start, or Kafka's jars are missing."""


def jars_dir(configured: Path | None = None) -> Path:
    """Where the jars are: ``configured`` (``Settings.kafka_jars``), else
    ``FEATURE_STORE_KAFKA_JARS`` (read through ``Settings``, so a typo in another setting
    is caught here too), else the environment's ``kafka/``."""
    if configured is None:
        from feature_store.settings import Settings

        configured = Settings.from_env().kafka_jars
    return configured if configured is not None else Path(sys.prefix) / "kafka"


def spark_connector_jars(configured: Path | None = None) -> list[str]:
    """The jars of Spark's Kafka source and Avro functions, for ``spark.jars``."""
    directory = jars_dir(configured) / "spark"
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise KafkaError(f"Spark's Kafka connector is not in {directory}: {FETCH_HINT}")
    return jars


def connector_conf(conf: Mapping[str, str], configured: Path | None = None) -> dict[str, str]:
    """Spark settings that put the Kafka source on the classpath, unless the user's own
    ``conf`` already names it (``spark.jars.packages`` resolved by Spark's Ivy, or
    ``spark.jars``): then those are used as given."""
    given = conf.get("spark.jars.packages", "") + "," + conf.get("spark.jars", "")
    if "spark-sql-kafka" in given:
        return {}
    return {"spark.jars": ",".join(spark_connector_jars(configured))}


def fetch_jars(dest: Path, *, broker: bool = False, mvn: str | None = None) -> bool:
    """Copy the jars into ``dest`` (``spark/``, and ``broker/`` if asked) with Maven, from
    Maven Central or the mirror in Maven's settings. False when they are there already
    (the POMs unchanged since). Replaces what an older fetch left."""
    mvn = mvn or shutil.which("mvn")
    if mvn is None:
        raise KafkaError(
            "Maven (mvn) was not found on PATH: install it (Debian: apt-get install maven), "
            "or copy the jars named in feature_store/jars/*.pom.xml into "
            f"{dest}/spark and set FEATURE_STORE_KAFKA_JARS={dest}"
        )
    dest = dest.resolve()
    poms = [POMS / "spark.pom.xml", *([POMS / "broker.pom.xml"] if broker else [])]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in poms)).hexdigest()
    stamp = dest / STAMP
    if stamp.exists() and digest in stamp.read_text().split():
        return False
    for pom in poms:
        out = dest / pom.name.removesuffix(".pom.xml")
        shutil.rmtree(out, ignore_errors=True)
        args = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies"]
        args.append(f"-DoutputDirectory={out}")
        if pom.name == "spark.pom.xml":
            args.append("-DincludeArtifactIds=" + ",".join(SPARK_ARTIFACTS))
        done = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            raise KafkaError(f"Maven could not fetch {pom.name}'s jars:\n{done.stdout[-3000:]}")
    dest.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest + "\n")
    return True


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
            raise KafkaError(
                f"Kafka's broker jars are not in {broker}: run `feature-store fetch-jars "
                "--broker` (Maven), or set FEATURE_STORE_KAFKA_JARS"
            )
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
