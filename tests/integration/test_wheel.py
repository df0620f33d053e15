"""`make wheel`'s wheel installs and runs where there is no Rust toolchain.

The wheel is built by scripts/wheel.sh (maturin, release profile, the extension checked
against the manylinux policy), then installed with its gRPC extra into a fresh virtual
environment with a PATH that holds no cargo and no rustc, as on a model server. From that
environment: `feature-store --help`, a `feature-store serve`, and the REST and gRPC
clients against it, with the native extension loaded, answering what the library reads.
Then, with its spark extra, `feature-store fetch-jars` (Maven) and a `feature-store stream`
from a Kafka topic, with the documented FEATURE_STORE_KAFKA_JARS set.

The wheel is built for the stable ABI (abi3), so the one wheel serves every Python from
3.11 on: it is installed into Python 3.12's and 3.13's environments too, and serves the
same answers there (found on PATH or under pyenv's versions; a machine without one skips
it, saying so).
"""

from __future__ import annotations

import glob
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


def _interpreter(version: str) -> str | None:
    """A Python ``version`` (e.g. "3.12") that runs: on PATH, or one of pyenv's versions."""
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found = [shutil.which(f"python{version}")]
    found += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in filter(None, found):
        ran = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return candidate
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make wheel``'s wheel, built once for this module's tests."""
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [str(ROOT / "scripts" / "wheel.sh")],
        env={**os.environ, "WHEEL_DIR": str(dist)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    (found,) = dist.glob("*.whl")
    # the stable ABI from 3.11 on, glibc 2.17 on
    assert "-cp311-abi3-manylinux2014_x86_64" in found.name, found
    return found


def _installed(python: str, wheel: Path, tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """A fresh environment of ``python`` with the wheel and its gRPC extra installed from
    binaries alone, and a PATH without cargo or rustc: the environment, its python, its env."""
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    path = os.pathsep.join([str(venv / "bin"), _path_without_rust()])
    assert shutil.which("cargo", path=path) is None
    assert shutil.which("rustc", path=path) is None
    env = {**os.environ, "PATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYENV_VERSION", None)
    venv_python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [venv_python, "-m", "pip", "install", "-q", "--only-binary", ":all:", f"{wheel}[grpc]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    return venv, venv_python, env


def _serves_what_the_library_reads(
    redis_url: str, venv: Path, python: str, env: dict[str, str], tmp_path: Path
) -> None:
    """A server run from ``venv`` answers the REST and gRPC clients of ``venv`` with what
    this checkout's library reads, the native extension loaded from ``venv``."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(5))
        expected = store.read(ENTITY, [1, 2, 999], ["int_0", "float_00", "embedding_0"])
    # the server runs from the wheel's environment, away from this checkout
    with ServingProcess(
        redis_url, python=python, cwd=tmp_path, env={"PATH": env["PATH"]}
    ) as server:
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
    assert got["native"].endswith(".abi3.so"), got["native"]

    def rounded(rows: list[list[list[object]]]) -> list[object]:
        """Values with embeddings' elements to 5 places (float32 through JSON and protobuf)."""
        return [
            [[[round(x, 5) for x in v] if isinstance(v, list) else v for v in values], statuses]
            for values, statuses in rows
        ]

    want = [[r.values, [s.value for s in r.statuses]] for r in expected.rows]
    for api in ("rest", "grpc"):
        assert rounded(got[api]) == rounded(want), api  # type: ignore[arg-type]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_one_wheel_serves_on_later_pythons(
    version: str, wheel: Path, redis_url: str, tmp_path: Path
) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (PATH or pyenv)")
    venv, venv_python, env = _installed(python, wheel, tmp_path)
    ran = subprocess.run(
        [venv_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.strip() == version
    _serves_what_the_library_reads(redis_url, venv, venv_python, env, tmp_path)


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_serves_without_a_rust_toolchain(
    wheel: Path, redis_url: str, tmp_path: Path
) -> None:
    venv, python, env = _installed(sys.executable, wheel, tmp_path)
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

    _serves_what_the_library_reads(redis_url, venv, python, env, tmp_path)

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
