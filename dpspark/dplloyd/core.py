"""Driver-side logic of DP Lloyd (no Spark here): initial centroids, budget
schedule, the noisy update, merging. The exact per-cluster aggregates come from
an ``aggregate(centroids) -> (counts, fixed_point_sums)`` callable: a Spark pass
in production (``dpspark.steps.lloyd_pass``), numpy in tests.

All work happens in unit space (the public domain mapped onto [-1, 1]^d), where
under add/remove of one record a cluster count changes by 1 and each coordinate
sum by at most 1; the clusters partition the data, so one record touches one
cluster (parallel composition).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np

from dpspark import solvers
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
# The DP Lloyd step the families share (re-exported: dplloyd's callers and tests read them here).
from dpspark.steps.lloyd import SU_RHO, noisy_update, su_split  # noqa: F401
from dpspark.steps.lloyd_kernels import exact_aggregates  # the executors run it too

log = logging.getLogger("dpspark")

def iteration_shares(epsilon: float, iterations: int, schedule: str) -> list[float]:
    """Per-iteration budget shares, summing to ``epsilon``.

    ``average``: epsilon / T each. ``allocation`` (the paper's adaptive budget): the
    iterations fall in three consecutive phases of (nearly) equal length whose
    per-iteration weights are 1 : 2 : 3; for T = 12 this is exactly the paper's
    eps/24 (iterations 1-4), eps/12 (5-8), eps/8 (9-12). Weights are exact fractions,
    so the shares sum to epsilon up to one rounding per share.
    """
    if schedule == "average":
        weights = [Fraction(1)] * iterations
    elif schedule == "allocation":
        if iterations < 3:
            raise ValueError(f"iterations={iterations} should be >= 3 for the allocation schedule")
        weights = [Fraction((3 * i) // iterations + 1) for i in range(iterations)]
    else:
        raise ValueError(f"schedule={schedule!r} should be 'average' or 'allocation'")
    total = sum(weights)
    return [float(Fraction(epsilon) * w / total) for w in weights]


def initial_centroids(domain: Domain, n_clusters: int, rng: np.random.Generator, a0: float = 1.0, tries: int = 100) -> np.ndarray:
    """Data-independent, well-separated initial centroids (Su et al.'s "sphere packing").

    Start with a = a0 (half of the smallest unit-space width, 2 / 2 = 1); draw each
    centroid uniformly in the domain shrunk by a on every side and accept it if it is
    at least 2a from every accepted one (up to ``tries`` draws per centroid); when a
    centroid cannot be placed, halve a and start again. Never looks at the data.
    """
    a = a0
    dim = domain.dim
    while True:
        accepted: list[np.ndarray] = []
        for _ in range(n_clusters):
            for _ in range(tries):
                if domain.is_ball:
                    c = domain.sample_unit(rng, 1)[0] * max(1.0 - a, 0.0)
                else:
                    c = rng.uniform(-1.0 + a, 1.0 - a, size=dim)
                if all(np.linalg.norm(c - other) >= 2.0 * a for other in accepted):
                    accepted.append(c)
                    break
            else:
                break
        if len(accepted) == n_clusters:
            return np.array(accepted)
        a /= 2.0
        if a < 1e-12:  # cannot happen for finite n_clusters, but never loop forever
            return domain.sample_unit(rng, n_clusters)


@dataclass
class LloydTrace:
    """What happened in each iteration (released values only)."""

    shares: list[float] = field(default_factory=list)
    reseeded: list[int] = field(default_factory=list)
    initial_centroids: list = field(default_factory=list)  # public: drawn before looking at the data


def run_lloyd(
    aggregate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    domain: Domain,
    k: int,
    params,
    accountant: Accountant,
    rng: np.random.Generator,
    epsilon: float,
    progress: Callable[[str], object] | None = None,
):
    """DP Lloyd on the aggregates; returns (centers (k, d) unit space, noisy_weights (k,), trace).

    ``epsilon`` is the whole budget of the iterations (the run's epsilon).
    """
    n_clusters = params.n_clusters(k)
    centroids = initial_centroids(domain, n_clusters, rng)
    trace = LloydTrace(shares=iteration_shares(epsilon, params.iterations, params.schedule), initial_centroids=centroids.tolist())
    noisy_counts = np.zeros(n_clusters)
    for t, eps_t in enumerate(trace.shares, start=1):
        label = f"iteration {t}/{params.iterations}"
        if progress is not None:
            with progress(f"dplloyd {label}: Spark aggregation pass"):
                counts, sums = aggregate(centroids)
        else:
            counts, sums = aggregate(centroids)
        noisy_counts, noisy_sums = noisy_update(counts, sums, eps_t, params.noise, accountant, label)
        # Post-processing of the noisy release from here on.
        new = np.empty_like(centroids)
        tiny = noisy_counts < max(params.min_count, 1e-9)
        safe = np.where(tiny, 1.0, noisy_counts)
        new[~tiny] = (noisy_sums / safe[:, None])[~tiny]
        if tiny.any():
            # Data-independent re-seed: a uniform point of the domain, never the old centroid kept silently.
            new[tiny] = domain.sample_unit(rng, int(tiny.sum()))
            # routine with merge_factor * k clusters (an empty one is re-seeded): DEBUG, counted in the trace
            log.debug("dplloyd %s: %d cluster(s) with noisy count < %g re-seeded uniformly in the domain", label, int(tiny.sum()), params.min_count)
        trace.reseeded.append(int(tiny.sum()))
        centroids = domain.clip_unit(new)
    # A cluster re-seeded in the last iteration is a fresh public point: it carries no weight
    # (post-processing of the noisy counts).
    noisy_counts = np.where(tiny, 0.0, noisy_counts)
    weights = np.maximum(noisy_counts, 0.0)
    if n_clusters == k:
        return centroids, noisy_counts, trace
    if params.merge == "nearest_pair":
        centers, merged = solvers.nearest_pair_merge(centroids, weights, k)
    else:
        centers, merged = solvers.weighted_kmeans(centroids, weights, k, rng, n_init=10)
    return domain.clip_unit(centers), np.asarray(merged, dtype=np.float64), trace


def numpy_aggregate(unit_points: np.ndarray) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Reference aggregation on one machine (tests, benchmarks): exact counts and fixed-point sums."""
    from dpspark.privacy.fixedpoint import quantize

    q = quantize(unit_points).reshape(len(unit_points), -1)
    chunk = 1 << 20

    def aggregate(centroids: np.ndarray):
        centroids = np.asarray(centroids, dtype=np.float64)
        counts = np.zeros(len(centroids), dtype=np.int64)
        sums = np.zeros(centroids.shape, dtype=np.int64)
        for start in range(0, len(q), chunk):
            c, s_ = exact_aggregates(q[start:start + chunk], centroids)
            counts += c
            sums += s_
        return counts, sums

    return aggregate


def plan(epsilon: float) -> tuple[float, float]:
    """What a dplloyd run spends: all of epsilon, and no delta (pure epsilon-DP)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon={epsilon!r} should be a finite number > 0")
    return epsilon, 0.0
