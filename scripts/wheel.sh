#!/usr/bin/env bash
# Builds the package's wheel with its Rust extension compiled, into dist/ (or $WHEEL_DIR):
# a manylinux2014 wheel (glibc 2.17 and later: Debian 10+, Ubuntu 18.04+, RHEL/Amazon
# Linux 2+) that installs with pip on a machine without cargo or rustc, as orjson's and
# pydantic-core's do. cargo links the extension with zig (the ziglang package, a dev
# dependency) against glibc 2.17's symbols, whatever glibc this machine has; maturin then
# checks it against the manylinux2014 policy (its own auditwheel) before tagging it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export PATH="$PWD/.venv/bin:$PATH"  # maturin runs zig through the Python on PATH (ziglang)
if [ ! -x .venv/bin/maturin ]; then
  echo "no .venv/bin/maturin: run ./scripts/setup.sh first" >&2
  exit 1
fi
out="${WHEEL_DIR:-dist}"
.venv/bin/maturin build --release --strip --zig --compatibility manylinux2014 --out "$out" "$@"
ls -1 "$out"/*.whl
