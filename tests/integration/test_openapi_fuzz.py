"""The OpenAPI document is the contract: a real fuzzer (schemathesis) checks it against a
running server with every check it has: answers match their schemas, valid requests are
accepted, invalid ones refused, undocumented methods get 405 with Allow, and so on."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from feature_store import sample
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

# schemathesis counts 413 as wrong for too many items; it is this API's answer to a batch
# over its limits (docs/serving.md), so it is added to the statuses that refuse bad data
# An event time more than an hour ahead is refused with a 400 (docs/streaming.md): "not
# after now + 1 h" is a rule JSON Schema cannot state, so valid-looking writes may get one.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422",
                     "428", "429"]

[[operations]]
include-name = "POST /v1/features/write"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404",
                                                     "409", "429", "5xx"]
"""


def test_schemathesis_all_checks_pass(redis_url: str, tmp_path: Path) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(100))
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    schemathesis = Path(sys.executable).parent / "schemathesis"
    with ServingProcess(redis_url) as server:
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


def test_a_client_generated_from_the_document_reads_a_batch(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """openapi-python-client turns the served document into a typed client that works."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(5))
    with ServingProcess(redis_url) as server:
        (tmp_path / "openapi.json").write_bytes(
            httpx.get(f"{server.rest_url}/openapi.json").content
        )
        (tmp_path / "generator.yaml").write_text("post_hooks: []\n")  # no formatter run
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "openapi-python-client"),
                *("generate", "--path", "openapi.json", "--meta", "none"),
                *("--output-path", "feature_api", "--config", "generator.yaml"),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Warning" not in done.stdout, done.stdout
        monkeypatch.syspath_prepend(str(tmp_path))
        api = importlib.import_module("feature_api")
        models = importlib.import_module("feature_api.models")
        get = importlib.import_module("feature_api.api.default.get_features_v1_features_get_post")

        body = models.GetFeaturesRequest(
            entity_type=models.GetFeaturesRequestEntityType("consumer"),
            ids=[1, 2, 99],
            features=[models.GetFeaturesRequestFeaturesItem(n) for n in ("int_0", "float_00")],
        )
        with api.Client(base_url=server.rest_url) as client:
            answer = get.sync(client=client, body=body)
    assert isinstance(answer, models.GetFeaturesResponse), answer
    assert answer.features == ["int_0", "float_00"]
    assert answer.types == ["int", "float"]
    rows = {row.id: row for row in answer.results}
    for i in (1, 2):
        expected = sample.features(i)
        assert rows[i].values == [expected["int_0"], pytest.approx(expected["float_00"])]
        assert rows[i].statuses == ["present", "present"]
    assert rows[99].values == [None, None]
    assert rows[99].statuses == ["missing", "missing"]
