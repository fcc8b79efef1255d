"""Shared fixtures: ONE local SparkSession (with real Delta Lake) for the whole test session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def spark():
    from dpspark.session import build_session

    # One partition per core: the tests' tables have tens to thousands of rows, and every extra
    # partition is one more task per stage (and Delta's snapshot state one more per commit read).
    # With the S3A connector: tests/test_object_store.py points s3a:// at a local moto server.
    session = build_session(master="local[2]", app_name="dpspark-tests", testing=True, object_store=True,
                            conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                  "spark.databricks.delta.snapshotPartitions": "1"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3(spark):
    """A local S3 (moto's server, ``tests/s3mock.py``) with a bucket ``lake``, and the shared session
    pointed at it. Its JVM started before the server set the AWS variables (processes started later
    inherit them): the same test credentials go to this session as Hadoop settings."""
    from s3mock import S3Server

    server = S3Server()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in {**server.hadoop_conf(), "fs.s3a.access.key": "testing", "fs.s3a.secret.key": "testing"}.items():
        hadoop.set(key, value)
    server.create_bucket("lake")
    yield server
    server.stop()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def blobs(n_per: int, centers, scale: float, seed: int) -> np.ndarray:
    """Well-separated Gaussian blobs (test data)."""
    r = np.random.default_rng(seed)
    return np.concatenate([np.asarray(c) + r.normal(0, scale, size=(n_per, len(c))) for c in centers])


@pytest.fixture
def write_delta(spark, tmp_path):
    """Write a pandas DataFrame as a real Delta table under tmp_path; return its path."""
    counter = {"n": 0}

    def _write(pdf, name: str | None = None, partitions: int = 2) -> str:
        counter["n"] += 1
        path = str(tmp_path / (name or f"table{counter['n']}"))
        spark.createDataFrame(pdf).repartition(partitions).write.format("delta").mode("overwrite").save(path)
        return path

    return _write
