"""The executor side of the DP Lloyd pass: numpy only.

``exact_aggregates`` runs inside ``mapInPandas`` on the executors (and in the numpy
reference on the driver), so this module imports numpy and
``dpspark.privacy.fixedpoint`` only: never scikit-learn, OpenDP or pyspark.
"""

from __future__ import annotations

import numpy as np

from dpspark.privacy.fixedpoint import SCALE


def assign(xq: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (ties to the lowest index), as the Spark pass computes it.

    argmin_j ||c_j||^2 - 2 x . c_j  (||x||^2 is common to all j). The Spark pass and the
    numpy reference share this function, so their exact aggregates agree bit for bit.
    """
    c_sq = (centroids**2).sum(axis=1)
    return np.argmin(c_sq[None, :] - 2.0 * (xq @ centroids.T), axis=1)


def exact_aggregates(q: np.ndarray, centroids: np.ndarray):
    """Exact counts (K,) and fixed-point sums (K, d), int64, of fixed-point points ``q``."""
    k, dim = centroids.shape
    labels = assign(q.astype(np.float64) / SCALE, centroids)
    counts = np.bincount(labels, minlength=k).astype(np.int64)
    sums = np.zeros((k, dim), dtype=np.int64)
    for j in range(dim):
        # float64 bincount of integers is exact while partial sums stay below 2**53
        # (|q| <= 2**20, so up to 2**32 rows per call); converted to int64 at once.
        sums[:, j] = np.bincount(labels, weights=q[:, j], minlength=k).astype(np.int64)
    return counts, sums
