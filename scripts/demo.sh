#!/usr/bin/env bash
# The main job end to end on the embedded Redis: Spark generates sample feature data,
# the nightly Spark job writes it, and one batch is read back and printed.
# Each step is its own process; the embedded Redis keeps the data between them (AOF).
set -euo pipefail
cd "$(dirname "$0")/.."
fs=.venv/bin/feature-store
if [ ! -x "$fs" ]; then
  echo "scripts/demo.sh: $fs is missing: run ./scripts/setup.sh first (make demo does)" >&2
  exit 2
fi
work="${DEMO_DIR:-.demo}"
entities="${DEMO_ENTITIES:-10000}"
mkdir -p "$work"

# Spark 4 starts its JVM with jdk.incubator.vector, and the JVM announces that on stderr at
# every start ("WARNING: Using incubator modules"); it says nothing about the job. Spark's
# own logging is quiet in local mode (feature_store/ingest/log4j2-local.properties).
quiet_jvm() { "$@" 2> >(grep -v '^WARNING: Using incubator modules' >&2); }

echo "== 1. generate $entities entities of sample features (Spark)"
quiet_jvm "$fs" generate --output "$work/consumers.parquet" --entities "$entities" --overwrite \
  --registry-out "$work/features.yaml"

echo "== 2. nightly job: write them into Redis (Spark)"
quiet_jvm "$fs" ingest --registry "$work/features.yaml" --group consumer_features \
  --input "$work/consumers.parquet" --id-column consumer_id \
  --quarantine "$work/quarantine" --report "$work/report.json"

echo "== 3. read a batch back (ids 0, 1, 2, and -1 which was never written)"
"$fs" get consumer 0 1 2 -1 --registry "$work/features.yaml" \
  -f float_00 float_02 float_03 int_0 int_1 int_list_0 embedding_0
