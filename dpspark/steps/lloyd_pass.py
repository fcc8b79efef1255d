"""The Spark pass of one DP Lloyd iteration (dplloyd, auto and maxcover run it): executors
aggregate, the driver decides.

Each executor task reads its Arrow batches of unit-space points (``mapInArrow``; the d double
columns or the one packed column, ``dpspark.kernels.batch_points``), quantizes them to
fixed point, assigns every point to its nearest centroid (vectorised numpy), and
emits one row per centroid with the exact count and the exact int64 coordinate
sums of its partition. The driver adds the per-partition rows as int64: integer
addition is exact and associative, so the result does not depend on the
partitioning or on the order partitions arrive in.
"""

from __future__ import annotations

import numpy as np

from dpspark.kernels import arrow_out, batch_points
from dpspark.privacy.fixedpoint import quantize
from dpspark.steps.lloyd_kernels import exact_aggregates


def _schema(dim: int) -> str:
    return "cluster INT, count LONG, " + ", ".join(f"s{j} LONG" for j in range(dim))


def partition_aggregator(centroids: np.ndarray, columns: list[str]):
    """Exact partial aggregates of one partition, as one pandas frame, from its batches (Arrow or pandas;
    the Spark pass runs it through ``arrow_out``)."""
    centroids = np.asarray(centroids, dtype=np.float64)
    k, dim = centroids.shape

    def aggregate(batches):
        import pandas as pd

        counts = np.zeros(k, dtype=np.int64)
        sums = np.zeros((k, dim), dtype=np.int64)
        for batch in batches:
            if len(batch) == 0:
                continue
            q = quantize(batch_points(batch, columns, dim))  # fixed point, bounded (NaN -> 0, clamped)
            c, s_ = exact_aggregates(q, centroids)
            counts += c
            sums += s_
        out = {"cluster": np.arange(k, dtype=np.int32), "count": counts}
        for j in range(dim):
            out[f"s{j}"] = sums[:, j]
        yield pd.DataFrame(out)

    return aggregate


def spark_aggregate(df, columns: list[str]):
    """An ``aggregate(centroids) -> (counts, fixed_point_sums)`` callable backed by one Spark pass each."""

    def aggregate(centroids: np.ndarray):
        centroids = np.asarray(centroids, dtype=np.float64)
        k, dim = centroids.shape
        parts = df.mapInArrow(arrow_out(partition_aggregator(centroids, columns)), _schema(dim)).toPandas()
        counts = np.zeros(k, dtype=np.int64)
        sums = np.zeros((k, dim), dtype=np.int64)
        if len(parts):
            cluster = parts["cluster"].to_numpy(dtype=np.int64)
            np.add.at(counts, cluster, parts["count"].to_numpy(dtype=np.int64))
            np.add.at(sums, cluster, parts[[f"s{j}" for j in range(dim)]].to_numpy(dtype=np.int64))
        return counts, sums

    return aggregate
