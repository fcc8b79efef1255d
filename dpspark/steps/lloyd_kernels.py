"""The executor side of the DP Lloyd pass (``dpspark.steps.lloyd_pass``; dplloyd, auto and maxcover
run it): numpy only.

``exact_aggregates`` runs inside ``mapInPandas`` on the executors (and in the numpy
reference on the driver), so this module imports numpy, ``dpspark.privacy.fixedpoint``
and ``dpspark.kernels`` (the shared per-entry distance rule, numpy only) only:
never scikit-learn, OpenDP or pyspark.
"""

from __future__ import annotations

import numpy as np

from dpspark.kernels import nearest_center  # numpy only
from dpspark.privacy.fixedpoint import SCALE, sanitize_fixed


def assign(xq: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (ties to the lowest index), as the Spark pass computes it.

    By maxcover's per-entry rule (``nearest_center``: explicit per-coordinate differences,
    squared and summed in order, no matrix product): a record's label depends only on that
    record and the centroids, never on the batch it arrives in, its size, order or BLAS
    threading. (With ``xq @ centroids.T`` the rounding could depend on the batch shape, so
    near a tie one record's presence could flip another record's cluster.) The Spark pass
    and the numpy reference share this function, so their exact aggregates agree bit for bit.
    """
    return nearest_center(xq, centroids)


def exact_aggregates(q: np.ndarray, centroids: np.ndarray):
    """Exact counts (K,) and fixed-point sums (K, d), int64, of fixed-point points ``q``.

    ``q`` first goes through ``sanitize_fixed`` (second line of defence: a cast NaN, INT64_MIN,
    reads as 0, everything is clamped to [-SCALE, SCALE]), so one row adds exactly 1 to one
    count and at most SCALE in absolute value to each coordinate sum, whatever it holds.
    """
    k, dim = centroids.shape
    q = sanitize_fixed(q).reshape(-1, dim)
    labels = assign(q.astype(np.float64) / SCALE, centroids)
    counts = np.bincount(labels, minlength=k).astype(np.int64)
    sums = np.zeros((k, dim), dtype=np.int64)
    for j in range(dim):
        # float64 bincount of integers is exact while partial sums stay below 2**53
        # (|q| <= 2**20, so up to 2**32 rows per call); converted to int64 at once.
        sums[:, j] = np.bincount(labels, weights=q[:, j], minlength=k).astype(np.int64)
    return counts, sums
