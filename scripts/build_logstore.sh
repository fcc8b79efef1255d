#!/usr/bin/env bash
# Rebuild dpspark/jars/dpspark-logstore.jar from dpspark/java/ (the LogStore that makes a Delta
# commit exclusive between drivers; see its source). Needs a JDK (javac, jar) and the Delta JARs
# fetched by scripts/setup.sh. The jar records the SHA-256 of its source: tests check it is current.
set -euo pipefail
cd "$(dirname "$0")/.."
IVY="${DPSPARK_IVY_DIR:-$(pwd)/.cache/ivy}"
SPARK_JARS=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
SRC=dpspark/java/io/dpspark/delta/ExclusiveCreateLogStore.java
CP="$(ls "$IVY"/jars/io.delta_delta-storage-*.jar | head -1):$(ls "$SPARK_JARS"/hadoop-client-api-*.jar | head -1)"
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
javac --release 17 -nowarn -d "$BUILD/classes" -cp "$CP" "$SRC"
mkdir -p "$BUILD/classes/META-INF"
sha256sum "$SRC" | cut -d' ' -f1 > "$BUILD/classes/META-INF/dpspark-logstore.sha256"
mkdir -p dpspark/jars
jar --create --date=2026-01-01T00:00:00Z --file dpspark/jars/dpspark-logstore.jar -C "$BUILD/classes" .
echo "built dpspark/jars/dpspark-logstore.jar from $SRC"
