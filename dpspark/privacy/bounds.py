"""A charged private estimate of the box domain (``domain: {estimate: private}``).

Users rarely know their data's range; a loose public box costs accuracy and the data's own
min/max breaks the guarantee. This module releases per-feature bounds under differential
privacy, from noisy histograms of ONE aggregation pass over the data (two without any
public outer box); everything after the release is post-processing and the bounds are
public from then on.

The mechanism, per feature j (all features released together as one vector):

1. (only without a public outer box) **octaves**: one record falls in one bin of a public,
   signed log-scale partition of the real line: [-2^(e+1), -2^e), a zero bin
   [-2^EMIN, 2^EMIN), [2^e, 2^(e+1)) for e in [EMIN, EMAX] (values beyond 2^EMAX fall in
   the top octave, as in Google's ApproxBounds). The noisy histograms give an outer box:
   from the left edge of the leftmost bin whose noisy count clears the threshold tau to
   the right edge of the rightmost such bin, widened by OCTAVE_MARGIN bins on each side
   (no bin clears it: the public fallback [-1, 1]).
2. **a dyadic tree over the outer box**: levels 1..L, level l cuts the feature's outer
   interval into 2^l equal bins; a record adds 1 to one bin per level. A descent from the
   root finds each bound: for the lower bound, at each level go to the left child when its
   noisy count clears tau, else to the right child when IT clears tau (the left child's
   records, fewer than about tau, are clipped), else stop; the bound is the left edge of
   where the descent ends (the upper bound mirrors it), then the interval is widened by
   MARGIN of its width on each side, never past the outer interval. Where the data sits in
   a small part of a wide box, the descent walks down to it; where the box is already
   tight, both children stay heavy and the bound stays at the box's edge.

Privacy (add/remove of one record, after contribution bounding keeps one row per person):
a record adds 1 to exactly one bin of each feature's octave histogram (L1 sensitivity d,
L2 sqrt(d) for the vector of d histograms) and to exactly one bin per level and feature of
the dyadic trees (L1 d L, L2 sqrt(d L)). Each vector is released once, by the discrete
Laplace (pure epsilon-DP) or the discrete Gaussian (zCDP, converted to (epsilon, delta)),
whichever needs the smaller threshold at the public (d, L, epsilon, delta): the choice
reads no data. A record's bins are a total function of its value: NaN and +-inf never
reach this pass (the rows are dropped, as for every algorithm), and any finite double
falls in exactly one bin (clamped to the extreme bins). The thresholds, the descent, the
fallback and the released clipped fraction are post-processing of the noisy counts.

``tau``: a bin with no record clears tau with probability at most ``BETA`` / m (m: the
number of bins the rule may test), so with probability at least 1 - BETA no empty bin
widens a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from dpspark.privacy.mechanisms import GaussianMechanism, LaplaceMechanism

EMIN = -32  # |x| < 2^EMIN: the zero bin
EMAX = 127  # the top octave [2^127, DBL_MAX] (every larger magnitude falls in it)
OCTAVES = EMAX - EMIN + 1
OCTAVE_BINS = 2 * OCTAVES + 1  # per feature: negative octaves, the zero bin, positive octaves
# The estimate's share of the run's epsilon (domain.epsilon_share). Measured (numpy reference of auto's
# routes, 5 seeded runs, eps 1, s1, a3, electrical, credit, google reviews, 10x outer box and none):
# 0.2 beats 0.1 in 9 of 10 cells (s1 1.13 vs 1.67, credit 1.67 vs 2.20, a3 with no box 1.60 vs 1.64).
DEFAULT_EPSILON_SHARE = 0.2
LEVELS = 10  # dyadic levels: the finest bin is 1/1024 of the outer interval
BETA = 0.05  # chance that noise alone widens some bound
MARGIN = 0.25  # each released interval is widened by this share of its width on both sides (inside the outer one)
OCTAVE_SHARE = 0.4  # without an outer box: the octave pass's share of the estimate's epsilon (and delta)
OCTAVE_MARGIN = 2  # the octave box is widened by this many bins on each side
DELTA_SHARE = 0.1  # the share of the run's delta the estimate may take (only if the Gaussian is chosen)
FALLBACK = (-1.0, 1.0)  # a feature where no octave clears the threshold (too few records for this epsilon)
_DBL_MAX = float(np.finfo(np.float64).max)


def octave_edges() -> np.ndarray:
    """The OCTAVE_BINS + 1 public edges of the signed log-scale partition, ascending (finite)."""
    pos = [2.0 ** e for e in range(EMIN, EMAX + 1)] + [_DBL_MAX]
    return np.array([-p for p in reversed(pos)] + pos, dtype=np.float64)


def octave_index(x: np.ndarray) -> np.ndarray:
    """numpy: the octave bin of each finite value (the rule ``octave_column`` computes in Spark)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(divide="ignore"):
        e = np.clip(np.floor(np.log2(np.where(a > 0, a, 1.0))), EMIN, EMAX).astype(np.int64)
    zero = a < 2.0 ** EMIN
    idx = np.where(x > 0, OCTAVES + 1 + (e - EMIN), OCTAVES - 1 - (e - EMIN))
    return np.where(zero, OCTAVES, idx).astype(np.int64)


def octave_column(c):
    """Spark: the octave bin of a finite double column (the same rule as ``octave_index``)."""
    from pyspark.sql import functions as F

    a = F.abs(c)
    e = F.floor(F.log2(F.when(a > F.lit(0.0), a).otherwise(F.lit(1.0))))
    e = F.least(F.greatest(e, F.lit(EMIN)), F.lit(EMAX)).cast("long")
    idx = F.when(c > F.lit(0.0), F.lit(OCTAVES + 1 - EMIN) + e).otherwise(F.lit(OCTAVES - 1 + EMIN) - e)
    return F.when(a < F.lit(2.0 ** EMIN), F.lit(OCTAVES).cast("long")).otherwise(idx)


def dyadic_index(unit: np.ndarray, levels: int = LEVELS) -> np.ndarray:
    """numpy: the finest dyadic bin of unit-space coordinates in [-1, 1] (``dyadic_column`` in Spark)."""
    b = 1 << levels
    return np.minimum(np.floor((np.asarray(unit, dtype=np.float64) + 1.0) * (b / 2.0)), b - 1).astype(np.int64)


def dyadic_column(u, levels: int = LEVELS):
    """Spark: the finest dyadic bin of a unit-space column (values in [-1, 1], never null here)."""
    from pyspark.sql import functions as F

    b = 1 << levels
    return F.least(F.floor((u + F.lit(1.0)) * F.lit(b / 2.0)), F.lit(b - 1)).cast("long")


@dataclass(frozen=True)
class Release:
    """How one histogram vector is released: the mechanism (with its privacy map) and the
    thresholds the rule compares noisy counts with: ``tau`` for a bin tested among ``tests``."""

    mechanism: object
    tests: int
    beta: float = BETA

    @property
    def name(self) -> str:
        return "discrete Laplace" if isinstance(self.mechanism, LaplaceMechanism) else "discrete Gaussian"

    def threshold(self, p: float) -> float:
        """t with P(noise > t) <= p for one bin (Laplace: exp(-t / b) / 2; Gaussian: its upper tail)."""
        if isinstance(self.mechanism, LaplaceMechanism):
            return self.mechanism.scale * math.log(max(1.0 / (2.0 * p), 1.0))
        return self.mechanism.sigma * NormalDist().inv_cdf(1.0 - p)

    @property
    def tau(self) -> float:
        """The threshold of every bin when all ``tests`` bins are tested alike (union bound: BETA in all)."""
        return self.threshold(self.beta / self.tests)

    def level_tau(self, level: int, levels: int, dim: int) -> float:
        """The dyadic descent's threshold at ``level`` (1..L). A bin wrongly taken as holding records
        widens a bound by at most its own width, 2^-level of the outer interval, so the coarse levels
        get the strict thresholds: level l may err with probability BETA 2^-(L - l) / 2 in all (4 d tests
        per level: two sides, two children), BETA over all levels (a union bound)."""
        return self.threshold(self.beta * 2.0 ** -(levels - level) / (2.0 * 4 * dim))


def choose_release(epsilon: float, delta: float, l1: float, l2: float, tests: int, beta: float = BETA) -> Release:
    """The mechanism (from PUBLIC inputs only) whose threshold for ``tests`` bins is the smaller:
    the discrete Laplace of scale l1 / epsilon, or (when delta > 0) the discrete Gaussian for L2
    sensitivity l2 at (epsilon, delta)."""
    best = Release(LaplaceMechanism(epsilon=epsilon, sensitivity=l1), tests, beta)
    if delta > 0:
        gauss = Release(GaussianMechanism(epsilon=epsilon, delta=delta, sensitivity=l2), tests, beta)
        if gauss.tau < best.tau:
            best = gauss
    return best


@dataclass(frozen=True)
class EstimatePlan:
    """The public plan of the estimate: its budget and the releases it will make."""

    dim: int
    epsilon: float
    delta: float
    outer: tuple[tuple[float, ...], tuple[float, ...]] | None
    levels: int = LEVELS

    def releases(self) -> list[tuple[str, Release, float, float]]:
        """[(label, release, epsilon, delta)] in order: the octave pass (no outer box), the dyadic pass."""
        d, L = self.dim, self.levels
        out = []
        eps_tree, delta_tree = self.epsilon, self.delta
        if self.outer is None:
            eps_oct, delta_oct = OCTAVE_SHARE * self.epsilon, OCTAVE_SHARE * self.delta
            eps_tree, delta_tree = self.epsilon - eps_oct, self.delta - delta_oct
            out.append(("domain estimate: octave histograms", choose_release(eps_oct, delta_oct, d, math.sqrt(d),
                                                                             d * OCTAVE_BINS), eps_oct, delta_oct))
        out.append(("domain estimate: dyadic histograms", choose_release(eps_tree, delta_tree, d * L, math.sqrt(d * L),
                                                                         4 * d * L), eps_tree, delta_tree))
        return out

    def spends(self) -> tuple[float, float]:
        """(epsilon, delta) the estimate charges: delta only where a Gaussian release is chosen."""
        eps = delta = 0.0
        for _, rel, e, dl in self.releases():
            got = rel.mechanism.privacy_map(rel.mechanism.sensitivity)
            eps, delta = eps + got[0], delta + got[1]
        return eps, delta


def octave_box(noisy_counts: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Post-processing: per feature (rows of ``noisy_counts``, shape (d, OCTAVE_BINS)), the outer
    interval, and whether it is the FALLBACK (no bin cleared tau: too few records for this epsilon)."""
    edges = octave_edges()
    lower, upper = np.empty(noisy_counts.shape[0]), np.empty(noisy_counts.shape[0])
    fell_back = np.zeros(noisy_counts.shape[0], dtype=bool)
    for j, row in enumerate(np.asarray(noisy_counts, dtype=np.float64)):
        heavy = np.flatnonzero(row > tau)
        if heavy.size == 0:
            lower[j], upper[j] = FALLBACK
            fell_back[j] = True
        else:
            # widened by OCTAVE_MARGIN bins on each side: the next stage finds the data inside
            # never wider than [-DBL_MAX / 4, DBL_MAX / 4]: a width whose double overflows to inf would make
            # every map from unit space back to original units NaN (many records near +-1e308)
            lower[j] = max(edges[max(heavy[0] - OCTAVE_MARGIN, 0)], -_DBL_MAX / 4)
            upper[j] = min(edges[min(heavy[-1] + 1 + OCTAVE_MARGIN, OCTAVE_BINS)], _DBL_MAX / 4)
    return lower, upper, fell_back


def tree_levels(finest: np.ndarray, levels: int = LEVELS) -> np.ndarray:
    """Exact counts of every level 1..L from the finest level's (shape (d, 2^L)): (d, 2^(L+1) - 2),
    level l at [2^l - 2, 2^(l+1) - 2)."""
    finest = np.asarray(finest, dtype=np.int64)
    parts, cur = [finest], finest
    for _ in range(levels - 1):
        cur = cur.reshape(cur.shape[0], -1, 2).sum(axis=2)
        parts.append(cur)
    return np.concatenate(parts[::-1], axis=1)


def _level(counts: np.ndarray, l: int) -> np.ndarray:
    return counts[(1 << l) - 2:(1 << (l + 1)) - 2]


def descend(noisy_levels: np.ndarray, taus, levels: int = LEVELS) -> tuple[int, int, int, int]:
    """Post-processing of one feature's noisy tree: (lower bin, its level, upper bin, its level).
    ``taus[l - 1]`` is level l's threshold.

    For the lower bound, from the root: the left child's noisy count clears the threshold -> go
    there; else the right child's does -> go right (the left child's records, fewer than about the
    threshold, are clipped: the margin of ``tree_box`` takes most of them back); else stop. The lower bound is the left edge of bin ``lower``
    at its level; the upper bound mirrors it (bins of level l are 1 / 2^l of the outer interval)."""
    def walk(first_left: bool) -> tuple[int, int]:
        node, level = 0, 0
        for l in range(1, levels + 1):
            row, tau = _level(noisy_levels, l), taus[l - 1]
            near, far = (2 * node, 2 * node + 1) if first_left else (2 * node + 1, 2 * node)
            if row[near] > tau:
                node = near
            elif row[far] > tau:
                node = far
            else:
                break
            level = l
        return node, level

    lo, lo_level = walk(True)
    hi, hi_level = walk(False)
    return lo, lo_level, hi, hi_level


def tree_box(noisy: np.ndarray, release: Release, outer_lower, outer_upper, levels: int = LEVELS):
    """Per feature, the released interval inside the outer one, and the noisy share of records outside
    it (the noisy counts of the bins outside, at the level each bound was found, over the root's)."""
    d = noisy.shape[0]
    taus = [release.level_tau(l, levels, d) for l in range(1, levels + 1)]
    lower, upper, clipped = np.empty(d), np.empty(d), np.empty(d)
    for j in range(d):
        lo_o, hi_o = float(outer_lower[j]), float(outer_upper[j])
        a, la, b, lb = descend(noisy[j], taus, levels)
        lo = _between(lo_o, hi_o, a / (1 << la))
        hi = _between(lo_o, hi_o, (b + 1) / (1 << lb))
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            lo, hi, a, la, b, lb = lo_o, hi_o, 0, 0, 0, 0
        # The margin: the descent clips tails of up to about tau records per level; widening by MARGIN
        # of the width (never past the outer interval) takes most of them back at little cost.
        grow = MARGIN * (hi - lo) if math.isfinite(hi - lo) else 0.0
        lower[j], upper[j] = max(lo - grow, lo_o), min(hi + grow, hi_o)
        total = float(_level(noisy[j], 1).sum())
        outside = _outside(noisy[j], la, lo_o, hi_o, lower[j], left=True) + _outside(noisy[j], lb, lo_o, hi_o, upper[j], left=False)
        clipped[j] = min(max(outside / total, 0.0), 1.0) if total > 0 else 0.0
    return lower, upper, clipped


def _outside(noisy_levels: np.ndarray, level: int, lo_o: float, hi_o: float, edge: float, left: bool) -> float:
    """The noisy count of the bins of ``level`` wholly beyond ``edge`` (left of a lower bound, right of an upper)."""
    if level == 0:
        return 0.0
    n = 1 << level
    row = _level(noisy_levels, level)
    if left:
        keep = [i for i in range(n) if _between(lo_o, hi_o, (i + 1) / n) <= edge]
    else:
        keep = [i for i in range(n) if _between(lo_o, hi_o, i / n) >= edge]
    return float(row[keep].sum()) if keep else 0.0


def _between(lo: float, hi: float, f: float) -> float:
    """lo + f (hi - lo) for f in [0, 1], without overflow when hi - lo exceeds the float range."""
    return lo * (1.0 - f) + hi * f
