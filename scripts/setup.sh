#!/usr/bin/env bash
# Set up a fresh machine for dpspark: .venv/ with the project installed editable,
# and the Delta Lake JARs fetched from Maven Central into .cache/ivy (Spark's Ivy).
# Idempotent: re-running only redoes what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PYTHON=${PYTHON:-python3}
if ! command -v java >/dev/null 2>&1; then
  echo "setup: Java (17 or newer) is required by Spark; install a JDK first" >&2
  exit 1
fi

stamp=".venv/.dpspark-installed"
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing dpspark and its dependencies into .venv (a few minutes the first time)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
fi

export DPSPARK_IVY_DIR="${DPSPARK_IVY_DIR:-$ROOT/.cache/ivy}"
if ! ls "$DPSPARK_IVY_DIR"/jars/io.delta_delta-spark_*.jar >/dev/null 2>&1; then
  echo "setup: fetching the Delta Lake JARs from Maven Central into $DPSPARK_IVY_DIR"
  .venv/bin/python - <<'PY'
from dpspark.session import build_session
spark = build_session(app_name="dpspark-setup", testing=True)
spark.range(1).collect()
spark.stop()
PY
fi
ls "$DPSPARK_IVY_DIR"/jars/io.delta_delta-spark_*.jar >/dev/null
if ! ls "$DPSPARK_IVY_DIR"/s3a/jars/org.apache.hadoop_hadoop-aws-*.jar >/dev/null 2>&1; then
  echo "setup: fetching the S3A connector (hadoop-aws, AWS SDK v2 S3 modules) into $DPSPARK_IVY_DIR/s3a"
  .venv/bin/python -c 'from dpspark.session import cached_s3a_jars; assert cached_s3a_jars(fetch=True)'
fi
