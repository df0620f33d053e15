"""The OpenAPI document is the contract: a real fuzzer (schemathesis) checks it against a
running server with every check it has: answers match their schemas, valid requests are
accepted, invalid ones refused, undocumented methods get 405 with Allow, and so on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

# schemathesis counts 413 as wrong for too many items; it is this API's answer to a batch
# over its limits (docs/serving.md), so it is added to the statuses that refuse bad data
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429"]
"""


def test_schemathesis_all_checks_pass(redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    with FeatureStore.connect(redis_server.url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(100))
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    schemathesis = Path(sys.executable).parent / "schemathesis"
    with ServingProcess(redis_server.url) as server:
        done = subprocess.run(
            [
                *(str(schemathesis), "run", f"{server.rest_url}/openapi.json"),
                *("--checks", "all", "--max-examples", "25", "--seed", "1"),
                *("--generation-database", "none", "--request-timeout", "10"),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    assert " passed" in output
    assert "failure" not in output.lower().split("summary")[-1], output[-4000:]
