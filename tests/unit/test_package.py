"""Package hygiene: public names, dependency direction, generated code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import feature_store

ROOT = Path(__file__).resolve().parents[2]


def test_all_is_complete_and_sorted() -> None:
    public = {
        name
        for name, value in vars(feature_store).items()
        if not name.startswith("_") and not isinstance(value, type(sys))
    }
    assert set(feature_store.__all__) == public
    assert feature_store.__all__ == sorted(feature_store.__all__)


def test_core_imports_no_web_grpc_or_spark() -> None:
    code = (
        "import sys, feature_store, feature_store.store, feature_store.cli, feature_store.sample;"
        "feature_store.cli.build_parser();"
        "heavy = ('fastapi', 'uvicorn', 'grpc', 'pyspark', 'starlette');"
        "bad = [m for m in heavy if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_serialization_is_pure() -> None:
    """Its modules import only the stdlib, the codec libraries, errors and generated code."""
    allowed = {"xxhash", "snappy", "google", "orjson", "feature_store"}  # orjson: answers.py
    allowed_project = ("feature_store.errors", "feature_store.proto", "feature_store.serialization")
    for path in (ROOT / "feature_store" / "serialization").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in allowed, (path.name, name)
                if top == "feature_store":
                    assert name.startswith(allowed_project), (path.name, name)


def test_generated_protobuf_code_matches_the_sources() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
