"""Family 1, "maxcover": (eps, delta)-DP k-median / k-means over a public candidate set.

``core`` is the driver-side, Spark-free part (Algorithms 1 and 2 of
``papers/maxcover-dp-clustering.txt``); it imports numpy, scipy and
``dpspark.privacy`` only, never pyspark.
"""

from dpspark.maxcover.core import (
    COVERAGE_LABEL,
    COVERAGE_RULE,
    SNAP_LABEL,
    NumpySignatureProvider,
    chosen_candidate_ids,
    cost_matrix,
    cover_bruteforce,
    cover_from_signatures,
    coverage_epsilon,
    grid_candidates,
    noisy_weights,
    picks_per_threshold,
    random_candidates,
    run_coverage,
    signatures_to_csr,
    snap_counts,
    thresholds,
)

__all__ = [
    "COVERAGE_LABEL",
    "COVERAGE_RULE",
    "SNAP_LABEL",
    "NumpySignatureProvider",
    "chosen_candidate_ids",
    "cost_matrix",
    "cover_bruteforce",
    "cover_from_signatures",
    "coverage_epsilon",
    "grid_candidates",
    "noisy_weights",
    "picks_per_threshold",
    "random_candidates",
    "run_coverage",
    "signatures_to_csr",
    "snap_counts",
    "thresholds",
]
