"""`make wheel`'s wheel installs and runs where there is no Rust toolchain.

The wheel is built by scripts/wheel.sh (maturin, release profile, the extension checked
against the manylinux policy), then installed with its gRPC extra into a fresh virtual
environment with a PATH that holds no cargo and no rustc, as on a model server. From that
environment: `feature-store --help`, a `feature-store serve`, and the REST and gRPC
clients against it, with the native extension loaded, answering what the library reads.
Then, with its spark extra, `feature-store fetch-jars` (Maven) and a `feature-store stream`
from a Kafka topic, with the documented FEATURE_STORE_KAFKA_JARS set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from feature_store import sample
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

ROOT = Path(__file__).resolve().parents[2]
GROUP, ENTITY = sample.GROUP, sample.ENTITY

CLIENTS = """
import json, sys
import feature_store, feature_store._native
from feature_store.client import FeatureClient, GrpcFeatureClient
rest_url, grpc_target = sys.argv[1], sys.argv[2]
with FeatureClient(rest_url, timeout=10) as rest, GrpcFeatureClient(grpc_target, timeout=10) as g:
    a = rest.get("consumer", [1, 2, 999], ["int_0", "float_00", "embedding_0"])
    b = g.get("consumer", [1, 2, 999], ["int_0", "float_00", "embedding_0"])
print(json.dumps({
    "package": feature_store.__file__,
    "native": feature_store._native.__file__,
    "rest": [[r.values, [s.value for s in r.statuses]] for r in a.rows],
    "grpc": [[r.values, [s.value for s in r.statuses]] for r in b.rows],
}))
"""


def _path_without_rust() -> str:
    dirs = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d, "cargo").exists() or Path(d, "rustc").exists())
    ]
    return os.pathsep.join(dirs)


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_serves_without_a_rust_toolchain(
    redis_url: str, tmp_path: Path
) -> None:
    built = subprocess.run(
        [str(ROOT / "scripts" / "wheel.sh")],
        env={**os.environ, "WHEEL_DIR": str(tmp_path / "dist")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert "-cp311-cp311-manylinux2014_x86_64" in wheel.name, wheel  # glibc 2.17 on

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    path = os.pathsep.join([str(venv / "bin"), _path_without_rust()])
    assert shutil.which("cargo", path=path) is None
    assert shutil.which("rustc", path=path) is None
    env = {**os.environ, "PATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--only-binary", ":all:", f"{wheel}[grpc]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    # the spark extra: pyspark is published as a source distribution only (pure Python)
    spark_extra = subprocess.run(
        [python, "-m", "pip", "install", "-q", f"{wheel}[spark]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert spark_extra.returncode == 0, spark_extra.stderr[-4000:]

    helped = subprocess.run(
        [str(venv / "bin" / "feature-store"), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert helped.returncode == 0, helped.stderr
    assert "serve" in helped.stdout
    assert "import-feast" in helped.stdout
    # without the feast extra, the import says how to get it
    no_feast = subprocess.run(
        [str(venv / "bin" / "feature-store"), "import-feast", ".", "--output", "out.yaml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert no_feast.returncode == 2
    assert "pip install 'feature-store[feast]'" in no_feast.stderr

    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(5))
        expected = store.read(ENTITY, [1, 2, 999], ["int_0", "float_00", "embedding_0"])
    # the server runs from the wheel's environment, away from this checkout
    with ServingProcess(redis_url, python=python, cwd=tmp_path, env={"PATH": path}) as server:
        done = subprocess.run(
            [python, "-c", CLIENTS, server.rest_url, server.grpc_target],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout)
    assert got["package"].startswith(str(venv))
    assert got["native"].startswith(str(venv))

    def rounded(rows: list[list[list[object]]]) -> list[object]:
        """Values with embeddings' elements to 5 places (float32 through JSON and protobuf)."""
        return [
            [[[round(x, 5) for x in v] if isinstance(v, list) else v for v in values], statuses]
            for values, statuses in rows
        ]

    want = [[r.values, [s.value for s in r.statuses]] for r in expected.rows]
    for api in ("rest", "grpc"):
        assert rounded(got[api]) == rounded(want), api  # type: ignore[arg-type]

    # the stream writer, from the wheel: its jars fetched by the documented command
    fetched = subprocess.run(
        [str(venv / "bin" / "feature-store"), "fetch-jars"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert fetched.returncode == 0, fetched.stderr[-4000:]
    jars = sorted(p.name for p in (venv / "kafka" / "spark").glob("*.jar"))
    assert any(j.startswith("spark-sql-kafka-0-10_2.13-") for j in jars), jars
    assert any(j.startswith("spark-avro_2.13-") for j in jars), jars
    registry_file = tmp_path / "features.yaml"
    registry_file.write_text(sample.registry_text())
    from confluent_kafka import Producer

    from feature_store.kafka import EmbeddedKafka

    with EmbeddedKafka(tmp_path / "kafka") as kafka:
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "log_level": 2})
        for i in range(50):
            record = {"consumer_id": 1000 + i, "event_time": 1_760_000_000 + i, "int_0": i}
            producer.produce("wheel-events", json.dumps(record).encode())
        assert producer.flush(60) == 0
        streamed = subprocess.run(
            [
                str(venv / "bin" / "feature-store"),
                "stream",
                "--registry",
                str(registry_file),
                "--group",
                GROUP,
                "--topic",
                "wheel-events",
                "--bootstrap-servers",
                kafka.bootstrap,
                "--checkpoint",
                str(tmp_path / "checkpoint"),
                "--redis-url",
                redis_url,
                "--available-now",
                "--master",
                "local[1]",
                "--conf",
                "spark.ui.enabled=false",
            ],
            env={**env, "FEATURE_STORE_KAFKA_JARS": str(venv / "kafka")},
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    assert streamed.returncode == 0, streamed.stderr[-4000:]
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        rows = store.read(ENTITY, [1000 + i for i in range(50)], ["int_0"]).rows
    assert [r.values[0] for r in rows] == list(range(50))
