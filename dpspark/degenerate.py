"""Honest degenerate results: say so when the released centers collapse.

Post-processing of RELEASED values only (the noisy centers, their noisy weights)
and PUBLIC parameters (k, epsilon, the domain's width, the algorithm's name): no
data, no noise, no privacy cost. numpy only.

A release has collapsed when

- fewer than k of its centers are distinct (two centers are equal when every
  coordinate differs by at most ``EQUAL_TOLERANCE`` times the domain's width in
  that coordinate), or
- almost all of the positive noisy weight (``TOP_SHARE`` = 95% or more) sits on
  one center (only for k >= 2: with k = 1 one center holds everything by design), or
- no center has a positive noisy weight at all (the noise swamped every count).

``describe_collapse`` returns None for a healthy release, else a dict the runner
writes to the log, summary.json ("degenerate") and the report.

The likely cause. Central families (maxcover, dplloyd): epsilon is too small for
this k, or the public domain is much larger than the data. ldp (local model): too
few users for this epsilon. Every user randomizes their own report, so a cluster's
estimated size carries an error that grows like sqrt(n)/epsilon (the LDP paper's
bound, up to log factors); a cluster of n/k users stands out only when
n/k >> sqrt(n)/epsilon, i.e. n >> (k/epsilon)^2. The rough rule used here,

    n_needed ~= _LDP_USERS_CONSTANT * k^2 * V(epsilon),  V(eps) = 4 e^eps / (e^eps - 1)^2

(V is the per-user variance of an optimal local frequency oracle, about 4/eps^2 for
small eps: the sqrt(n)/epsilon law), was calibrated on scripts/bench_ldp.py's
well-separated 2-D mixture (k = 5, default settings: the released centers' k-means
cost is within about 2x of non-private at n = 3e5, 1e5, 1e4 for eps = 1, 2, 4). The
number of users it is compared with is a RELEASED estimate: the sum of the noisy
weights (ldp scales them to all reporting users), or ``n_hint`` when the caller has a
public count (e.g. the number of reports an ldp ingest run received). It is a rough
estimate and the message says so.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["describe_collapse", "coinciding_groups", "EQUAL_TOLERANCE", "TOP_SHARE"]

# Two released centers are "the same" when every coordinate differs by at most this
# fraction of the domain's width in that coordinate (0.01%: the report draws them as one;
# ldp's collapsed centers differ in the 7th digit).
EQUAL_TOLERANCE = 1e-4
# "Almost all the weight on one center": this share of the positive noisy weight or more.
TOP_SHARE = 0.95
# Families whose guarantee is local (each user randomizes their own report).
LOCAL_FAMILIES = ("ldp",)
# Calibration of the rough ldp rule n_needed ~= C k^2 V(eps) (see the module docstring).
_LDP_USERS_CONSTANT = 5000.0


def coinciding_groups(points, widths, rel_tol: float = EQUAL_TOLERANCE) -> list[np.ndarray]:
    """Group rows of ``points`` (m, d) that are equal up to ``rel_tol * widths`` in every coordinate.

    ``widths``: a positive number or one per coordinate (the domain's width; +inf, from a box
    whose upper - lower overflows, counts as the largest double). Greedy, in
    index order: each group is a row and every later ungrouped row within the tolerance
    of it, so every member is within the tolerance of the group's first row (its
    smallest index). A row with a non-finite coordinate is only ever grouped with itself.
    Returns the groups as sorted index arrays, ordered by their first index.
    """
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"points must be a (m, d) array, got shape {p.shape}")
    tol = float(rel_tol) * _widths(widths, p.shape[1])
    free = np.ones(p.shape[0], dtype=bool)
    groups = []
    if p.shape[0] == 0 or p.shape[1] == 0:
        return [np.arange(p.shape[0])] if p.shape[0] else groups
    # Only rows whose first coordinate is within the tolerance of row i's can be close to it: they are a
    # window of the rows sorted by that coordinate (non-finite ones sort last and are never in it), so
    # each row is compared with its window only (k = 100,000 distinct centers: seconds, not hours).
    first = p[:, 0]
    order = np.argsort(first, kind="stable")
    sorted_first = first[order]
    finite = np.all(np.isfinite(p), axis=1)
    for i in range(p.shape[0]):
        if not free[i]:
            continue
        if not finite[i]:
            free[i] = False
            groups.append(np.array([i]))
            continue
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, 1e308 - -1e308: inf, never "close"
            lo = np.searchsorted(sorted_first, first[i] - tol[0], side="left")
            hi = np.searchsorted(sorted_first, first[i] + tol[0], side="right")
            window = order[lo:hi]
            window = window[free[window]]
            close = window[np.all(np.abs(p[window] - p[i]) <= tol, axis=1)]
        members = np.union1d(close, [i])
        free[members] = False
        groups.append(members)
    return groups


def describe_collapse(centers, noisy_weights, k, domain_width, algorithm, epsilon, n_hint=None) -> dict | None:
    """None for a healthy release, else a description of how the released centers collapsed.

    centers: (rows, d) released centers (original units); noisy_weights: one released
    noisy weight per center; k: the configured k; domain_width: the PUBLIC domain's width,
    one number or one per coordinate (box: upper - lower; ball: 2 * radius); algorithm:
    the family's name ("ldp" is the local model); epsilon: the configured epsilon;
    n_hint: optional PUBLIC number of users (never a private count) used instead of the
    released weights' sum for the ldp estimate.

    Returns {"distinct_centers", "k", "top_weight_share", "message", "likely_cause"}.
    Post-processing of released values: no privacy cost.
    """
    k = int(k)
    c = np.asarray(centers, dtype=np.float64)
    if c.ndim == 1:  # no rows, or a flat list of 1-D centers
        c = c.reshape(-1, 1) if c.size else c.reshape(0, 1)
    w = np.asarray(noisy_weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != c.shape[0]:
        raise ValueError(f"noisy_weights has {w.shape[0]} values but centers has {c.shape[0]} rows")

    distinct = len(coinciding_groups(c, domain_width)) if c.shape[0] else 0
    positive = np.where(np.isfinite(w) & (w > 0), w, 0.0)
    total = float(positive.sum())
    top_share = float(positive.max() / total) if total > 0 else 0.0

    problems = []
    if distinct < k:
        problems.append(f"only {distinct} distinct center{'s' if distinct != 1 else ''} among the "
                        f"{c.shape[0]} released for k = {k}")
    if k >= 2 and total > 0 and top_share >= TOP_SHARE:
        problems.append(f"{100 * top_share:.1f}% of the positive noisy weight is on one center")
    if k >= 1 and c.shape[0] and total <= 0:
        problems.append("no center has a positive noisy weight")
    if not problems:
        return None

    message = "The released centers collapsed: " + "; ".join(problems) + "."
    if str(algorithm) in LOCAL_FAMILIES:
        cause = _ldp_cause(w, k, epsilon, n_hint)
    else:
        cause = ("epsilon too small for this k, or the domain much larger than the data "
                 "(try a larger epsilon, a smaller k, or tighter public bounds)")
    return {"distinct_centers": int(distinct), "k": k, "top_weight_share": top_share,
            "message": message, "likely_cause": cause}


def _widths(widths, d: int) -> np.ndarray:
    w = np.asarray(widths, dtype=np.float64)
    if w.ndim == 0:
        w = np.full(d, float(w))
    w = w.reshape(-1)
    if w.shape[0] != d:
        raise ValueError(f"domain_width has {w.shape[0]} values, the centers have {d} coordinates")
    if not np.all(w > 0):  # also catches NaN
        raise ValueError(f"domain_width must be positive, got {w.tolist()}")
    # A box whose upper - lower overflows has width +inf: the largest double stands in for it.
    return np.minimum(w, np.finfo(np.float64).max)


def _ldp_variance(epsilon: float) -> float:
    """4 e^eps / (e^eps - 1)^2: per-user variance of an optimal local frequency oracle (~4/eps^2)."""
    e = min(float(epsilon), 50.0)  # beyond 50 the value is ~0 anyway; avoids overflow
    return 4.0 * math.exp(e) / math.expm1(e) ** 2


def _ldp_cause(w: np.ndarray, k: int, epsilon, n_hint) -> str:
    head = ("too few users for the local model at this epsilon: the LDP paper's error grows like "
            "sqrt(n)/epsilon")
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        eps = float("nan")
    if n_hint is not None and math.isfinite(float(n_hint)) and float(n_hint) >= 1:
        n_est, source = float(n_hint), "users"
    else:
        # The released noisy weights sum to a released estimate of the number of users.
        n_est, source = float(np.sum(w[np.isfinite(w)])), "users by the released weights"
    if not (math.isfinite(eps) and eps > 0) or not (math.isfinite(n_est) and n_est >= 1):
        return head + "; the released values give no usable estimate of n, so no factor is given"
    needed = _LDP_USERS_CONSTANT * k * k * _ldp_variance(eps)
    factor = needed / n_est
    rough = (f"rough estimate: about {_round2(needed):,.0f} users needed for k = {k} at epsilon = {eps:g}, "
             f"about {_round2(n_est):,.0f} {source}")
    if factor >= 1.5:
        return (f"{head}; about {_round2(factor):g} times more users would help, or a larger epsilon "
                f"(the users needed fall like 1/epsilon^2) ({rough})")
    return (f"{head}; by a rough rule the number of users looks sufficient ({rough}): the data may hold "
            f"fewer than k separate clusters, or more users would still help")


def _round2(x: float) -> float:
    """x to two significant digits (a rough estimate should not look precise)."""
    if x <= 0 or not math.isfinite(x):
        return x
    return round(x, 1 - int(math.floor(math.log10(x))))
