"""Generate the code for proto/: Python into feature_store/proto/, Go into clients/go/.

The Go code needs protoc-gen-go and protoc-gen-go-grpc in the environment's bin directory
(scripts/setup.sh installs the pinned versions there). The Java client generates its code
from proto/ at every build (clients/java/pom.xml), so it is never stale.

    make proto                                     # regenerate
    .venv/bin/python scripts/gen_proto.py --check  # exit 1 if the committed code is stale

The output depends only on the .proto sources and the pinned grpcio-tools and Go plugin
versions, so
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
GO_MODULE = "github.com/feature-store/feature-store/clients/go"  # clients/go/go.mod
GO_OUT = "clients/go"
BIN = Path(sys.executable).parent


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
        if protoc.main([*go_args(out_root), str(rel)]) != 0:
            raise SystemExit(f"protoc failed on {rel} (Go)")
    generated = sorted((out_root / OUT_PACKAGE).rglob("*_pb2*.py*"))
    for directory in {p.parent for p in generated} | {out_root / OUT_PACKAGE}:
        init = directory / "__init__.py"
        while init.parent != out_root and not init.exists():
            init.write_text("")
            init = init.parent.parent / "__init__.py"
    return generated + sorted((out_root / GO_OUT).rglob("*.pb.go"))


def go_args(out_root: Path) -> list[str]:
    plugins = {name: BIN / name for name in ("protoc-gen-go", "protoc-gen-go-grpc")}
    missing = [name for name, path in plugins.items() if not path.exists()]
    if missing:
        raise SystemExit(f"{', '.join(missing)} missing in {BIN}: run ./scripts/setup.sh")
    out = out_root / GO_OUT
    out.mkdir(parents=True, exist_ok=True)
    return [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{WELL_KNOWN}",
        *(f"--plugin={name}={path}" for name, path in plugins.items()),
        f"--go_out={out}",
        f"--go_opt=module={GO_MODULE}",
        f"--go-grpc_out={out}",
        f"--go-grpc_opt=module={GO_MODULE}",
    ]


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
