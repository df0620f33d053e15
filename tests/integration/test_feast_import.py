"""``feature-store import-feast`` on a real Feast repository, then the nightly job loads the
parquet that repository's FileSource points at.

The repository declares the standard shape the way a team on Feast would (a Python file,
``feast apply`` run by Feast's own CLI); the imported registry must equal this project's
sample registry in everything a lookup depends on, and ``feature-store ingest`` with it must
load Feast's parquet (join key column, ``event_timestamp`` beside the features).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feature_store import sample
from feature_store.registry import load_registry
from feature_store.serialization import Codec
from feature_store.store import FeatureStore

FEAST = str(Path(sys.executable).parent / "feast")
GROUP, ENTITY = sample.GROUP, sample.ENTITY
ENTITIES = 200


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FEATURE_STORE_")}
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=300, cwd=cwd, env=clean
    )


def import_feast(repo: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``feature-store import-feast REPO --output OUT``, run as a user runs it."""
    return run(
        sys.executable, "-m", "feature_store.cli", "import-feast", str(repo), "--output", str(out)
    )


@pytest.fixture(scope="module")
def feast_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = sample.feast_repo(
        tmp_path_factory.mktemp("feast_repo"),
        "  type: sqlite\n  path: data/online.db",
        ENTITIES,
        event_time=time.time() - 3600,
    )
    applied = run(FEAST, "apply", cwd=repo)
    assert applied.returncode == 0, applied.stderr
    return repo


def test_import_feast_gives_the_sample_registry(feast_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "features.yaml"
    done = import_feast(feast_repo, out)
    assert done.returncode == 0, done.stderr
    assert "1 entity type(s), 1 feature group(s), 50 features, 1 feature service(s)" in done.stdout
    imported = load_registry(out, check_lock=False)
    ours = sample.registry()
    e, o = imported.entities[ENTITY], ours.entities[ENTITY]
    assert (e.prefix, e.id_type, e.join_key) == (o.prefix, o.id_type, o.join_key)
    assert e.ttl_seconds == o.ttl_seconds  # 7 d, more than the view's 36 h
    g, h = imported.groups[GROUP], ours.groups[GROUP]
    assert [(f.name, f.codec.signature, f.field) for f in g.features] == [
        (f.name, f.codec.signature, f.field) for f in h.features
    ]
    assert g.max_age_seconds == h.max_age_seconds == 36 * 3600
    assert g.push_source == "consumer_push"
    assert g.description == h.description
    assert imported.services == {"consumer_small": (f"{GROUP}:int_0", f"{GROUP}:embedding_0")}
    assert imported.fingerprint() == ours.fingerprint()  # the same data on Redis
    # an existing file is not replaced without --force
    again = import_feast(feast_repo, out)
    assert again.returncode == 2
    assert "--force" in again.stderr


@pytest.mark.spark
def test_ingest_loads_the_parquet_feast_reads(
    feast_repo: Path, tmp_path: Path, redis_url: str
) -> None:
    out = tmp_path / "features.yaml"
    done = import_feast(feast_repo, out)
    assert done.returncode == 0, done.stderr
    ingest = run(
        sys.executable, "-m", "feature_store.cli", "ingest",
        "--registry", str(out), "--group", GROUP,
        "--input", str(feast_repo / "data" / "consumer.parquet"),
        "--id-column", "consumer_id", "--redis-url", redis_url,
        "--ignore-extra-columns", "--progress-interval", "0", "--master", "local[1]",
    )  # fmt: skip
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    registry = load_registry(out, check_lock=False)
    ids = [0, 1, 57, ENTITIES - 1]
    with FeatureStore.connect(redis_url, registry) as store:
        got = store.read(ENTITY, ids, groups=[GROUP])
    expected = dict(sample.rows(ENTITIES))
    features = registry.groups[GROUP].features

    def stored(value: object, codec: Codec) -> object:  # as Redis holds it (float32)
        return None if value is None else codec.decode(codec.encode(value))

    for entity_id, row in zip(ids, got.rows, strict=True):
        want = [stored(expected[entity_id][f.name], f.codec) for f in features]
        assert list(row.values) == want, entity_id
