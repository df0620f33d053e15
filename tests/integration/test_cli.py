"""The feature-store command, run as a user runs it: a real process, a real redis-server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson

from feature_store import sample


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FEATURE_STORE_")}
    return subprocess.run(
        [sys.executable, "-m", "feature_store.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
    )


def _table(stdout: str) -> list[dict[str, str]]:
    """The rows of the table `demo` and `get` print: columns split on runs of 2+ spaces."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("id "))
    header = re.split(r"\s{2,}", lines[start].strip())
    return [
        dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True))
        for line in lines[start + 1 :]
    ]


def test_demo_runs_end_to_end_on_the_embedded_redis(tmp_path: Path) -> None:
    out = cli("demo", "--entities", "300", "--batch", "3", "--data-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "embedded Redis at redis://127.0.0.1:" in out.stdout
    assert "wrote 300 entities, 15,000 feature values" in out.stdout
    table = _table(out.stdout)
    assert [r["id"] for r in table] == ["0", "1", "2", "-1"]
    assert table[1]["int_0"] == str(sample.features(1)["int_0"])
    assert table[-1]["int_0"] == "-"
    assert table[-1]["statuses"] == "50 missing"
    assert table[0]["statuses"].endswith("present")
    assert (tmp_path / "redis" / "appendonlydir").is_dir()  # persisted, and stopped cleanly
    assert not (tmp_path / "redis" / "embedded.port").exists()


def test_demo_uses_a_configured_redis_url(redis_url: str, tmp_path: Path) -> None:
    out = cli(
        "demo", "--entities", "10", "--batch", "1", env={"FEATURE_STORE_REDIS_URL": redis_url}
    )
    assert out.returncode == 0, out.stderr
    assert "embedded" not in out.stdout


def test_unknown_setting_fails_with_its_name() -> None:
    out = cli("demo", env={"FEATURE_STORE_REDIS_ULR": "redis://x"})
    assert out.returncode == 2
    assert "unknown setting FEATURE_STORE_REDIS_ULR" in out.stderr


def test_registry_validate_and_lock(registry_file: Path) -> None:
    out = cli("registry", "validate", str(registry_file))
    assert out.returncode == 0, out.stderr
    assert "group consumer_features (consumer, max_age 129600s)" in out.stdout
    assert "hash-max-listpack-value needed: 131" in out.stdout

    assert cli("registry", "lock", str(registry_file)).returncode == 0
    registry_file.write_text(registry_file.read_text().replace("int_0: int", "int_0: float"))
    out = cli("registry", "validate", str(registry_file))
    assert out.returncode == 2
    assert "int_0: type changed from int to float" in out.stderr


def test_malformed_registry_exits_2_naming_the_entry(tmp_path: Path) -> None:
    bad = tmp_path / "features.yaml"
    bad.write_text(sample.registry_text().replace("embedding(32)", "embeding(32)", 1))
    out = cli("registry", "validate", str(bad))
    assert out.returncode == 2
    assert "features.embedding_0: unknown type 'embeding(32)'" in out.stderr
    assert "Traceback" not in out.stderr


def test_get_prints_values_statuses_and_ages(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    assert cli("demo", "--entities", "20", "--batch", "1", *data).returncode == 0
    registry = tmp_path / "features.yaml"
    out = cli("registry", "sample")
    registry.write_text(out.stdout)
    args = ["get", "consumer", "4", "999", "-f", "int_0", "embedding_0", "--registry"]
    out = cli(*args, str(registry), *data)
    assert out.returncode == 0, out.stderr
    table = _table(out.stdout)
    assert [r["id"] for r in table] == ["4", "999"]
    assert table[0]["int_0"] == str(sample.features(4)["int_0"])
    assert table[0]["embedding_0"].endswith("... 32 items]")
    assert table[0]["statuses"] == "2 present"
    assert (table[1]["int_0"], table[1]["age"], table[1]["statuses"]) == ("-", "-", "2 missing")

    out = cli(*args, str(registry), *data, "--json")
    assert out.returncode == 0, out.stderr
    found, missing = (orjson.loads(line) for line in out.stdout.splitlines())
    assert found["values"]["int_0"] == sample.features(4)["int_0"]
    assert len(found["values"]["embedding_0"]) == 32
    assert found["statuses"] == {"int_0": "present", "embedding_0": "present"}
    assert missing == {
        "id": 999,
        "values": {"int_0": None, "embedding_0": None},
        "statuses": {"int_0": "missing", "embedding_0": "missing"},
        "ages": {"consumer_features": None},
    }
    out = cli("get", "consumer", "4", "-f", "nope", "--registry", str(registry), *data)
    assert out.returncode == 2
    assert "entity type 'consumer' has no feature 'nope'" in out.stderr
