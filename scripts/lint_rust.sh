#!/usr/bin/env bash
# rustfmt and clippy on the native extension, where the toolchain has them (rustup's does;
# Debian's cargo package comes without clippy, and then this says so and passes).
set -euo pipefail
cd "$(dirname "$0")/../native"
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --check
else
  echo "lint_rust: cargo fmt is not installed; skipped"
fi
if cargo clippy --version >/dev/null 2>&1; then
  # the extension's interpreter: the project's own, never the system python3
  PYO3_PYTHON="$PWD/../.venv/bin/python" cargo clippy --release --quiet -- -D warnings
else
  echo "lint_rust: cargo clippy is not installed; skipped"
fi
