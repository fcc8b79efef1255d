"""Executor kernel of auto's private selection: the exact costs of several candidate solutions
(numpy only; the executors run it). The LSH tree's kernel is ``dpspark.steps.tree_kernels``.
"""

from __future__ import annotations

import math

import numpy as np

from dpspark.kernels import batch_points, nearest_center_each  # numpy only
from dpspark.privacy.fixedpoint import SCALE, quantize


# ----------------------------------------------------------------------------
# Exact clustering costs of several candidate solutions (the private selection pass)
#
# A solution's cost is a sum over ALL the points, each term up to cap * 2**COST_BITS (about
# 2**24.6 at d = 50): an int64 total would wrap after about 3.6e11 rows there, and numpy (and
# Spark's non-ANSI sum) wrap silently, which would feed the exponential mechanism wrong scores.
# So the totals are never held in an int64: every term is below MAX_TERM = 2**53, terms are
# added in int64 only in chunks of at most 2**10 of them (< 2**63: exact), the chunk sums are
# added as Python integers (unbounded), and a partition's totals leave the executor as decimal
# TEXT (Spark never adds them); the driver adds them as Python integers. Nothing bounds n.

COST_BITS = 20  # per-point costs in fixed point: round(cost * 2**20), at most cap * 2**20
MAX_TERM = 1 << 53  # a term (an integer-valued float64) is exact below this; 2**10 of them fit in an int64
TERM_CHUNK = 1 << 10  # terms added in int64 at a time: TERM_CHUNK * MAX_TERM = 2**63, never reached


def term_limit(cap: float) -> int:
    """floor(cap * 2**COST_BITS): the largest fixed-point term, <= the sensitivity the mechanism is given."""
    cap = float(cap)
    limit = math.floor(cap * (1 << COST_BITS)) if math.isfinite(cap) else -1
    if not (0 < limit < MAX_TERM):
        raise ValueError(f"cap={cap!r} should be a finite number with 0 < floor(cap * 2**{COST_BITS}) < 2**53")
    return limit


def exact_sum(terms: np.ndarray) -> int:
    """The exact sum (a Python int) of int64 terms in [0, MAX_TERM): int64 sums of TERM_CHUNK terms, then Python."""
    terms = np.asarray(terms, dtype=np.int64).ravel()
    if terms.size <= TERM_CHUNK:
        return int(terms.sum())
    pad = (-terms.size) % TERM_CHUNK
    chunks = np.concatenate([terms, np.zeros(pad, dtype=np.int64)]).reshape(-1, TERM_CHUNK).sum(axis=1)
    return sum(int(c) for c in chunks)


def solution_costs(fixed_points: np.ndarray, solutions: np.ndarray, power: int, cap: float) -> np.ndarray:
    """(M,) exact costs as Python ints (an object array): sum over the points of min(min_c ||x - c||^power, cap),
    each term in fixed point.

    ``solutions`` is (M, k, d) in unit space. A point's distance to a solution is the per-entry
    distance rule of ``maxcover.kernels`` (explicit differences squared and summed in order) to
    its nearest center by that rule (``nearest_center_each``: every solution from one screen), so a point's term depends only on that
    point and the public solutions; the cap bounds it whatever the point holds. The sums cannot
    wrap (``exact_sum``): whatever the number of points, the result is the exact integer.
    """
    sols = np.asarray(solutions, dtype=np.float64)
    m, k, dim = sols.shape
    x = fixed_points.astype(np.float64) / SCALE
    limit = float(term_limit(cap))  # an integer < 2**53, exact as a float
    out = np.empty(m, dtype=object)
    labels = nearest_center_each(x, sols)  # (rows x M): every solution's nearest center, each label the rule's
    which = np.arange(m)[None, :]
    d2 = np.zeros((x.shape[0], m), dtype=np.float64)
    for j in range(dim):  # the rule's entry for the nearest center (the minimum over the centers), per solution
        diff = x[:, j, None] - sols[:, :, j][which, labels]  # coordinate j of each nearest center: rows x M, never rows x M x d
        d2 += diff * diff
    term = d2 if power == 2 else np.sqrt(d2)
    terms = np.minimum(np.rint(term * (1 << COST_BITS)), limit).astype(np.int64)
    for i in range(m):
        out[i] = exact_sum(terms[:, i])
    return out


def cost_aggregator(solutions: np.ndarray, power: int, cap: float, columns: list[str]):
    """The selection pass's function of a partition's batches (Arrow or pandas, ``batch_points``): its exact costs of every solution,
    as decimal text (schema ``solution INT, cost STRING``): a Python int of any size, never an int64."""
    sols = np.asarray(solutions, dtype=np.float64)

    def aggregate(batches):
        import pandas as pd

        total = [0] * sols.shape[0]  # Python ints: unbounded
        for batch in batches:
            if len(batch):
                part = solution_costs(quantize(batch_points(batch, columns, sols.shape[2])), sols, power, cap)
                total = [t + int(c) for t, c in zip(total, part)]
        yield pd.DataFrame({"solution": np.arange(sols.shape[0], dtype=np.int32), "cost": [str(t) for t in total]})

    return aggregate
