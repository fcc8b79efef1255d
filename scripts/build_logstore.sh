#!/usr/bin/env bash
# Rebuild dpspark/jars/dpspark-logstore.jar from dpspark/java/: the LogStore that makes a Delta
# commit exclusive between drivers, and the small-file functions a Spark Connect server runs for
# its clients (see their sources). Needs a JDK (javac, jar) and the Delta JARs fetched by
# scripts/setup.sh. The jar records the SHA-256 of each source: tests check it is current.
set -euo pipefail
cd "$(dirname "$0")/.."
IVY="${DPSPARK_IVY_DIR:-$(pwd)/.cache/ivy}"
SPARK_JARS=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
LOG_STORE=dpspark/java/io/dpspark/delta/ExclusiveCreateLogStore.java
SMALL_FILES=dpspark/java/io/dpspark/io/SmallFiles.java
CP="$(ls "$IVY"/jars/io.delta_delta-storage-*.jar | head -1):$(ls "$SPARK_JARS"/hadoop-client-api-*.jar | head -1)"
for name in spark-core_ spark-common-utils_ spark-sql-api_ scala-library-; do
  CP="$CP:$(ls "$SPARK_JARS"/$name*.jar | head -1)"
done
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
javac --release 17 -nowarn -d "$BUILD/classes" -cp "$CP" "$LOG_STORE" "$SMALL_FILES"
mkdir -p "$BUILD/classes/META-INF"
sha256sum "$LOG_STORE" | cut -d' ' -f1 > "$BUILD/classes/META-INF/dpspark-logstore.sha256"
sha256sum "$SMALL_FILES" | cut -d' ' -f1 > "$BUILD/classes/META-INF/dpspark-smallfiles.sha256"
mkdir -p dpspark/jars
jar --create --date=2026-01-01T00:00:00Z --file dpspark/jars/dpspark-logstore.jar -C "$BUILD/classes" .
echo "built dpspark/jars/dpspark-logstore.jar from $LOG_STORE and $SMALL_FILES"
