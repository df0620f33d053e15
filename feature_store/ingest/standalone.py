"""A Spark standalone cluster on loopback: one master, N workers, from pyspark's own jars.

For tests, benchmarks and trying the job on a real cluster manager on one machine (the
recipe is in docs/ingest.md, "On a Spark standalone cluster"). Every process binds to
127.0.0.1 and is stopped by its pid. The executors run this interpreter
(``spark.pyspark.python``), which has feature_store installed: the "same environment on
every worker" way of shipping the package.

    with StandaloneCluster(tmp, workers=2) as cluster:
        cluster.submit(["ingest", "--registry", ...])
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from feature_store.embedded import free_port
from feature_store.errors import FeatureStoreError

START_TIMEOUT_S = 90.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    return env


class StandaloneCluster:
    def __init__(self, work_dir: Path, workers: int = 2, cores: int = 1) -> None:
        self.work_dir = work_dir
        self.workers = workers
        self.cores = cores
        self.port = free_port()
        self.ui_port = free_port()
        self.master: subprocess.Popen[bytes] | None = None
        self.worker_processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _class(self, name: str, args: Sequence[str], log: str) -> subprocess.Popen[bytes]:
        out = open(self.work_dir / log, "wb")  # noqa: SIM115  (the child keeps its copy)
        try:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), name, *args],
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # its own process group: stop() ends its children
            )
        finally:
            out.close()

    def start(self) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.master = self._class(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)],
            "master.log",
        )
        for i in range(self.workers):
            work = self.work_dir / f"worker{i}"
            work.mkdir(exist_ok=True)
            self.worker_processes.append(
                self._class(
                    "org.apache.spark.deploy.worker.Worker",
                    [
                        self.url,
                        *("--host", "127.0.0.1", "--cores", str(self.cores)),
                        *("--memory", "1g", "--webui-port", str(free_port())),
                        *("--work-dir", str(work)),
                    ],
                    f"worker{i}.log",
                )
            )
        self._await_workers(self.workers)
        return self

    def alive_workers(self) -> int:
        try:
            doc = httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return 0
        return sum(1 for w in doc.get("workers", []) if w.get("state") == "ALIVE")

    def _await_workers(self, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.alive_workers() >= count:
                return
            if self.master is not None and self.master.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        tail = (self.work_dir / "master.log").read_text(errors="replace")[-2000:]
        raise FeatureStoreError(f"the Spark standalone cluster did not start:\n{tail}")

    def submit(
        self, args: Sequence[str], timeout: float = 600, jars: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        """spark-submit of the job's entry point (``python -m feature_store.ingest``);
        ``jars`` go on the driver's and the executors' classpath (``--jars``): the stream
        job's Kafka source (``feature_store.kafka.spark_connector_jars()``)."""
        import feature_store.ingest.__main__ as entry

        return subprocess.run(
            [
                str(spark_home() / "bin" / "spark-submit"),
                *("--master", self.url),
                *("--conf", f"spark.pyspark.python={sys.executable}"),
                *("--conf", "spark.ui.enabled=false"),
                *(("--jars", ",".join(jars)) if jars else ()),
                str(entry.__file__),
                *args,
            ],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def kill_worker(self, index: int) -> None:
        """SIGKILL one worker JVM (its executors notice and exit)."""
        os.kill(self.worker_processes[index].pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop every process group started here (a worker's group holds its executors,
        which may outlive a worker that was killed)."""
        for proc in [*self.worker_processes, self.master]:
            if proc is None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
