#!/usr/bin/env bash
# The native extension's own unit tests (cargo test), with the project's interpreter.
set -euo pipefail
cd "$(dirname "$0")/../native"
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
# the extension's interpreter: the project's own, never the system python3
PYO3_PYTHON="$PWD/../.venv/bin/python" cargo test --release --quiet
