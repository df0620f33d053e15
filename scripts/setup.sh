#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian/Ubuntu machine, then the package itself
# into .venv. Safe to run again: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# a Rust toolchain from rustup, where one is installed but not on this shell's PATH
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

need_apt=()
command -v cargo >/dev/null 2>&1 || need_apt+=(cargo rustc)  # builds the native extension
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)  # PySpark, YCSB bindings
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)  # builds the YCSB bindings
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)  # YCSB's disk store
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # TLS test certificates
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)  # HTTP load generator (benchmarks)
command -v h2load >/dev/null 2>&1 || need_apt+=(nghttp2-client)  # gRPC load (benchmarks)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)  # alert rules: checks, tests
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]} from Debian's packages"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependencies or the Rust extension changed (the Python code is an
# editable install; the extension is compiled into feature_store/ by maturin and cargo).
stamp=.venv/.installed-sources
sources=$(find native/src -name "*.rs" | sort | xargs cat pyproject.toml native/Cargo.toml native/Cargo.lock | sha256sum)
if [ "$sources" != "$(cat "$stamp" 2>/dev/null)" ] || ! ls feature_store/_native*.so >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --upgrade pip
  echo "building the package and its Rust extension (cargo, release profile)"
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$sources" > "$stamp"
fi

# Apache Kafka's broker (KRaft, for the stream tests and benchmarks), Spark's Kafka source and
# Avro functions (for `feature-store stream`): release jars from Maven Central, into the
# environment, by the command a wheel's user runs too (skipped when they are there).
.venv/bin/feature-store fetch-jars --broker --dest .venv/kafka >/dev/null

# grpcurl: the tests check reflection and TLS with it, as users do. Built from its Go
# module into the project's environment (Debian has no package of it); Go from Debian's
# packages where none is installed.
GRPCURL_VERSION=v1.9.3
if ! command -v grpcurl >/dev/null 2>&1 && [ ! -x .venv/bin/grpcurl ]; then
  if ! command -v go >/dev/null 2>&1; then
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq golang-go >/dev/null
  fi
  echo "building grpcurl $GRPCURL_VERSION (go install)"
  GOBIN="$PWD/.venv/bin" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
fi
