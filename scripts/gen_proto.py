"""Generate the Python code for proto/ into feature_store/proto/.

    make proto                                     # regenerate
    .venv/bin/python scripts/gen_proto.py --check  # exit 1 if the committed code is stale

The output depends only on the .proto sources and the grpcio-tools version, so
tests/unit/test_package.py can run --check and catch a forgotten regeneration.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

try:
    from grpc_tools import protoc
except ImportError:  # the system python3, say: the pinned grpcio-tools is in the project's .venv
    raise SystemExit(
        f"{sys.executable} has no grpcio-tools: run `make proto` (after ./scripts/setup.sh)"
    ) from None

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_PACKAGE = "feature_store/proto"
GRPC_PROTOS = {"serving.proto"}
WELL_KNOWN = Path(protoc.__file__).parent / "_proto"  # the files that declare a service


def generate(out_root: Path) -> list[Path]:
    sources = sorted(PROTO_DIR.rglob("*.proto"))
    for src in sources:
        rel = src.relative_to(PROTO_DIR)
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{WELL_KNOWN}",  # google/protobuf/timestamp.proto, shipped with grpcio-tools
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
        ]
        if src.name in GRPC_PROTOS:
            args.append(f"--grpc_python_out={out_root}")
        if protoc.main([*args, str(rel)]) != 0:
            raise SystemExit(f"protoc failed on {rel}")
    generated = sorted((out_root / OUT_PACKAGE).rglob("*_pb2*.py*"))
    for directory in {p.parent for p in generated} | {out_root / OUT_PACKAGE}:
        init = directory / "__init__.py"
        while init.parent != out_root and not init.exists():
            init.write_text("")
            init = init.parent.parent / "__init__.py"
    return generated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    if not args.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            committed = ROOT / path.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
        if stale:
            print("stale generated code (run: make proto):", *stale, sep="\n  ")
            return 1
    print("generated protobuf code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
