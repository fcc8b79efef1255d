"""The one SparkSession builder: local mode by default, Delta Lake configured.

- Under ``spark-submit`` (a cluster, or ``--master local[*]``) the master and the
  JARs come from spark-submit: this builder never sets the master there, and the
  Delta package must be passed with ``--packages`` (see README).
- Anywhere else (``dpspark run``, tests, notebooks) it starts ``local[*]`` (or
  ``spark.master`` from the config, or ``$DPSPARK_MASTER``) and asks Spark to load
  the Delta JARs from Maven Central through Ivy, cached in ``$DPSPARK_IVY_DIR``
  (default: ``.cache/ivy`` in the project root, filled by ``scripts/setup.sh``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# delta-spark 4.4.0 pins pyspark <= 4.2.0; the JAR is built per Spark minor version.
DELTA_VERSION = "4.4.0"
SPARK_MINOR = "4.2"
DELTA_PACKAGE = f"io.delta:delta-spark_{SPARK_MINOR}_2.13:{DELTA_VERSION}"

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # dpspark's only MERGEs (the ledger) take a one-row local source: no need to materialize it.
    "spark.databricks.delta.merge.materializeSource": "none",
}

# Sensible defaults for one machine; a config's spark.conf overrides them.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "8",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": os.environ.get("DPSPARK_DRIVER_MEMORY", "4g"),
    "spark.ui.showConsoleProgress": "false",
}


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def ivy_dir() -> str:
    return os.environ.get("DPSPARK_IVY_DIR") or str(project_root() / ".cache" / "ivy")


def cached_delta_jars() -> list[str]:
    """The Delta JARs (and their dependencies) already fetched into the Ivy cache, if any."""
    jars = Path(ivy_dir()) / "jars"
    if not any(jars.glob(f"io.delta_delta-spark_{SPARK_MINOR}_2.13-{DELTA_VERSION}.jar")):
        return []
    return sorted(str(p) for p in jars.glob("*.jar"))


def launched_by_spark_submit() -> bool:
    """True inside a Python driver started by spark-submit (or the pyspark shell)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, app_name: str = "dpspark", conf: dict | tuple = (), testing: bool = False):
    """Get or create the SparkSession, with Delta Lake configured."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in DELTA_CONF.items():
        builder = builder.config(key, value)
    if not launched_by_spark_submit():
        # Local Python workers run the driver's interpreter (the project's .venv).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(master or os.environ.get("DPSPARK_MASTER") or "local[*]")
        jars = cached_delta_jars()
        if jars:  # fetched before (scripts/setup.sh): no resolution, no network at start-up
            builder = builder.config("spark.jars", ",".join(jars))
        else:
            builder = builder.config("spark.jars.packages", DELTA_PACKAGE).config("spark.jars.ivy", ivy_dir())
        for key, value in LOCAL_DEFAULTS.items():
            builder = builder.config(key, value)
        if testing:
            builder = builder.config("spark.ui.enabled", "false")
    for key, value in dict(conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DPSPARK_SPARK_LOG_LEVEL", "WARN"))
    return spark
