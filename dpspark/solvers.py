"""Non-private weighted k-means / k-median solvers for small instances on the driver.

Everything here is POST-PROCESSING: the inputs are already released (noisy)
values or public candidates, so running these solvers has no privacy cost.
That is also why this module imports nothing from ``dpspark.privacy`` and
nothing from pyspark: it draws no noise and touches no private table.

All functions take numpy arrays and return numpy arrays. Every source of
randomness is an explicit ``numpy.random.Generator`` argument (``rng``); the
global numpy / Python random state is never used, so a seeded generator makes
every result reproducible.

Public API
----------
- ``weighted_kmeans(points, weights, k, rng, n_init=10, max_iter=300)``
- ``weighted_kmedian(points, weights, k, rng, candidates=None, n_init=5, max_iter=100)``
- ``weighted_cost(points, weights, centers, p)``
- ``nearest(points, centers)``
- ``nearest_pair_merge(centroids, weights, k)``
- ``solve(objective, points, weights, k, rng, candidates=None, **kw)``

Conventions shared by the solvers
---------------------------------
- Negative weights are clipped to zero before solving. Noisy weights (a true
  count plus Laplace noise) can be negative; clipping them is post-processing.
- If every (clipped) weight is zero the solver treats the weights as uniform,
  so it still returns sensible centers. ``assigned_weights`` is still the sum
  of the CLIPPED weights (all zeros in that case): it never invents mass.
- Identical points are merged (their weights summed) before solving; this does
  not change either objective.
- If there are at most k distinct points with positive weight, those points
  are returned as centers (cost 0) and the remaining centers are filled in
  deterministically from ``rng`` (see ``_pad_centers``), so asking for more
  centers than the data supports never crashes and always yields k rows.
- ``assigned_weights[j]`` is the sum of the clipped weights of the input points
  whose nearest returned center is j (ties go to the lowest index).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

__all__ = [
    "weighted_kmeans",
    "weighted_kmedian",
    "weighted_cost",
    "nearest",
    "nearest_pair_merge",
    "solve",
    "OBJECTIVES",
]

OBJECTIVES = ("kmeans", "kmedian")

# Bound on the number of float64 entries of any temporary (rows x centers or
# candidates x points) matrix: about 16 MB. Keeps memory bounded for n = 1e6.
_CHUNK_ENTRIES = 1 << 21

# Entries of one float32 (candidates x points) block in the discrete local
# search (about 2 MB, so the repeated passes over it stay in cache).
_BLOCK_ENTRIES = 1 << 19

# Averaging coefficients in nearest_pair_merge are clipped at this floor so
# that two zero-weight (or negative-weight) centroids still average evenly.
_MERGE_WEIGHT_FLOOR = 1e-9


# --------------------------------------------------------------------------
# Validation: the one place where inputs are checked (sklearn-style messages)
# --------------------------------------------------------------------------


def _check_points(points, name: str = "points") -> np.ndarray:
    arr = np.asarray(points, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"{name} should be a 2-D array of shape (n, d), got shape {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} should have at least one row and one column, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} should contain only finite values, found NaN or infinity")
    return arr


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}={value!r} should be an integer")
    if value < minimum:
        raise ValueError(f"{name}={value} should be >= {minimum}")
    return int(value)


def _validate(
    points,
    weights=None,
    k=None,
    rng=None,
    *,
    centers=None,
    candidates=None,
    n_init=None,
    max_iter=None,
    check_rng: bool = False,
):
    """Check and convert the arguments shared by the public functions.

    Returns ``(points, weights, centers, candidates)`` as float arrays (``None``
    stays ``None``). Raises ``ValueError`` naming the bad value or both shapes,
    and ``TypeError`` when ``rng`` is not a ``numpy.random.Generator``.
    """
    pts = _check_points(points, "points")
    w = None
    if weights is not None:
        w = np.asarray(weights, dtype=float)
        if w.shape != (pts.shape[0],):
            raise ValueError(
                f"weights shape {w.shape} does not match points shape {pts.shape}: "
                f"expected weights of shape ({pts.shape[0]},)"
            )
        if not np.all(np.isfinite(w)):
            raise ValueError("weights should contain only finite values, found NaN or infinity")
    if k is not None:
        _check_int(k, "k", 1)
    if n_init is not None:
        _check_int(n_init, "n_init", 1)
    if max_iter is not None:
        _check_int(max_iter, "max_iter", 1)
    if check_rng and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng should be a numpy.random.Generator, got {type(rng).__name__}")
    return pts, w, _check_like(centers, "centers", pts), _check_like(candidates, "candidates", pts)


def _check_like(arr, name: str, pts: np.ndarray):
    """None, or ``arr`` checked as points with the same number of columns as ``pts``."""
    if arr is None:
        return None
    out = _check_points(arr, name)
    if out.shape[1] != pts.shape[1]:
        raise ValueError(
            f"{name} shape {out.shape} does not match points shape {pts.shape}: "
            f"both need the same number of columns d"
        )
    return out


# --------------------------------------------------------------------------
# Distances
# --------------------------------------------------------------------------


def _sq_dists(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray | None = None) -> np.ndarray:
    """Squared Euclidean distances between rows of a (r, d) and b (s, d): (r, s).

    Uses |a|^2 + |b|^2 - 2 a.b (one matrix product); callers centre the data
    first so that the cancellation error stays small. Clipped at zero.
    """
    if b_sq is None:
        b_sq = np.einsum("ij,ij->i", b, b)
    a_sq = np.einsum("ij,ij->i", a, a)
    out = a @ b.T
    out *= -2.0
    out += a_sq[:, None]
    out += b_sq[None, :]
    np.maximum(out, 0.0, out=out)
    return out


def _nearest_and_dist(points: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels of the nearest center and the exact Euclidean distance to it.

    Processes the points in chunks so that no temporary exceeds
    ``_CHUNK_ENTRIES`` entries (about 16 MB), whatever n is.
    """
    n, k = points.shape[0], centers.shape[0]
    # Translate both sets by the same vector: distances are unchanged, and the
    # expansion |a|^2 + |b|^2 - 2ab loses less precision near the origin.
    shift = centers.mean(axis=0)
    c = centers - shift
    c_sq = np.einsum("ij,ij->i", c, c)
    labels = np.empty(n, dtype=np.intp)
    dist = np.empty(n, dtype=float)
    step = max(1, _CHUNK_ENTRIES // max(k, 1))
    for start in range(0, n, step):
        stop = min(n, start + step)
        block = points[start:stop] - shift
        lab = np.argmin(_sq_dists(block, c, c_sq), axis=1)  # ties -> lowest index
        labels[start:stop] = lab
        diff = block - c[lab]  # exact distance to the chosen center
        dist[start:stop] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    return labels, dist


def nearest(points, centers) -> np.ndarray:
    """Index of the nearest center (Euclidean) for every point; ties go to the lowest index.

    Vectorised and chunked: memory stays bounded (about 16 MB of temporaries)
    even for n = 1e6 points, d = 10, k = 100 centers.
    Post-processing: no privacy cost.
    """
    pts, _, ctr, _ = _validate(points, centers=centers)
    return _nearest_and_dist(pts, ctr)[0]


def weighted_cost(points, weights, centers, p) -> float:
    """sum_i w_i * min_j ||x_i - c_j||^p  (p = 1: k-median, p = 2: k-means).

    The weights are used as given (no clipping): this is the plain objective.
    Post-processing: no privacy cost.
    """
    pts, w, ctr, _ = _validate(points, weights, centers=centers)
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not p > 0:
        raise ValueError(f"p={p!r} should be a number > 0 (1 for k-median, 2 for k-means)")
    _, dist = _nearest_and_dist(pts, ctr)
    return float(np.dot(w, dist**p))


# --------------------------------------------------------------------------
# Shared helpers for the solvers
# --------------------------------------------------------------------------


def _prepare(points: np.ndarray, weights: np.ndarray):
    """Clip weights, fall back to uniform weights, and merge identical points.

    Returns ``(clipped, unique_points, unique_weights)``: ``clipped`` is the
    per-input-point clipped weight (used for ``assigned_weights``), and the
    unique points carry the summed solving weights of their duplicates, with
    zero-weight points dropped.
    """
    clipped = np.clip(weights, 0.0, None)  # post-processing of noisy weights
    solve_w = clipped if clipped.sum() > 0 else np.ones_like(clipped)
    keep = solve_w > 0
    uniq, inverse = np.unique(points[keep], axis=0, return_inverse=True)
    uw = np.bincount(inverse.reshape(-1), weights=solve_w[keep], minlength=uniq.shape[0])
    return clipped, uniq, uw


def _pad_centers(base: np.ndarray, k: int, rng: np.random.Generator, perturb: bool) -> np.ndarray:
    """Return k centers: all rows of ``base`` first, then extra rows drawn from it.

    The extra k - len(base) centers repeat rows of ``base`` chosen uniformly
    by ``rng``. With ``perturb=True`` each repeat is moved by a tiny Gaussian
    offset (1e-6 times the largest coordinate magnitude, or 1e-6 if all are
    zero) so the centers are distinct; the original rows stay nearer to their
    points, so the extras receive (almost) no weight. ``perturb=False`` keeps
    exact copies (used where centers must be candidate rows).
    """
    extra = k - base.shape[0]
    if extra <= 0:
        return base[:k].copy()
    idx = rng.integers(0, base.shape[0], size=extra)
    extras = base[idx].copy()
    if perturb:
        scale = float(np.max(np.abs(base))) or 1.0
        extras += rng.normal(size=extras.shape) * (1e-6 * scale)
    return np.vstack([base, extras])


def _assigned(points: np.ndarray, clipped: np.ndarray, centers: np.ndarray) -> np.ndarray:
    labels, _ = _nearest_and_dist(points, centers)
    return np.bincount(labels, weights=clipped, minlength=centers.shape[0]).astype(float)


def _sample_index(prob: np.ndarray, rng: np.random.Generator) -> int:
    """Draw an index with probability proportional to the non-negative ``prob``."""
    cum = np.cumsum(prob)
    total = cum[-1]
    if not total > 0:
        return int(rng.integers(0, prob.shape[0]))
    idx = int(np.searchsorted(cum, rng.random() * total, side="right"))
    return min(idx, prob.shape[0] - 1)


def _draw_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))


# --------------------------------------------------------------------------
# k-means
# --------------------------------------------------------------------------


def weighted_kmeans(points, weights, k, rng, n_init=10, max_iter=300):
    """Weighted k-means: scikit-learn KMeans (k-means++ init, Lloyd) with sample weights.

    Post-processing: no privacy cost.

    Negative weights are clipped to zero first (they arise as noisy counts; the
    clipping is post-processing). All-zero weights are treated as uniform. If
    at most k distinct points have positive weight, those points are returned
    plus extra centers that repeat them with a tiny rng-drawn perturbation
    (see module docstring). The KMeans ``random_state`` is an integer drawn
    from ``rng``.

    Returns ``(centers (k, d), assigned_weights (k,))``.
    """
    pts, w, _, _ = _validate(points, weights, k, rng, n_init=n_init, max_iter=max_iter, check_rng=True)
    clipped, uniq, uw = _prepare(pts, w)
    if uniq.shape[0] <= k:
        centers = _pad_centers(uniq, k, rng, perturb=True)
    else:
        km = KMeans(
            n_clusters=k,
            init="k-means++",
            n_init=n_init,
            max_iter=max_iter,
            random_state=_draw_seed(rng),
        )
        with warnings.catch_warnings():
            # Heavily skewed weights can leave fewer than k distinct clusters;
            # sklearn warns about it, the result is still valid.
            warnings.simplefilter("ignore", category=UserWarning)
            km.fit(uniq, sample_weight=uw)
        centers = np.asarray(km.cluster_centers_, dtype=float)
    return centers, _assigned(pts, clipped, centers)


# --------------------------------------------------------------------------
# k-median, Euclidean setting (centers anywhere)
# --------------------------------------------------------------------------


def _greedy_d1_seed(x, w, k, rng, open_point=None):
    """Greedy weighted k-means++ seeding with D^1 sampling (for k-median).

    Each step draws 2 + floor(ln k) trial points with probability proportional
    to w_i * D(x_i) (D = distance to the nearest center so far; first step:
    proportional to w_i) and keeps the trial that lowers sum w_i D(x_i) the
    most, as scikit-learn's greedy k-means++ does for D^2.

    ``open_point(i, tags)`` maps a drawn point index to ``(center, tag)``:
    the center actually opened and a tag for it, given the tags opened so
    far; by default the point itself, tagged by its index. The discrete
    setting opens the nearest candidate not in ``tags``. Returns the
    (k, d) array of centers and the list of tags.
    """
    n_trials = 2 + int(np.log(k))
    dist = None
    centers, tags = [], []
    for _ in range(k):
        prob = w if dist is None else w * dist
        best = None
        for _ in range(n_trials if dist is not None else 1):
            i = _sample_index(prob, rng)
            center, tag = (x[i], i) if open_point is None else open_point(i, tags)
            diff = x - center
            d_new = np.sqrt(np.einsum("ij,ij->i", diff, diff))
            if dist is not None:
                np.minimum(d_new, dist, out=d_new)
            pot = float(np.dot(w, d_new))
            if best is None or pot < best[0]:
                best = (pot, center, tag, d_new)
        _, center, tag, dist = best
        centers.append(np.array(center, dtype=float))
        tags.append(tag)
    return np.array(centers), tags


def _weiszfeld_step(x, w, labels, centers, coincide_tol):
    """One modified Weiszfeld (Vardi-Zhang) step for every cluster at once.

    For cluster j with center y: T = sum(w_i x_i / d_i) / sum(w_i / d_i) over
    points not at y; eta = weight of points at y; R = sum w_i (x_i - y) / d_i.
    y' = max(0, 1 - eta/|R|) T + min(1, eta/|R|) y. This never increases the
    cluster's weighted sum of distances, and (unlike plain Weiszfeld) it does
    not get stuck on a data point that is not the median. Clusters with no
    weight keep their center.
    """
    k, d = centers.shape
    diff = x - centers[labels]
    dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    at = dist <= coincide_tol
    inv = np.where(at, 0.0, w / np.where(at, 1.0, dist))
    den = np.bincount(labels, weights=inv, minlength=k)
    eta = np.bincount(labels, weights=np.where(at, w, 0.0), minlength=k)
    num = np.empty((k, d))
    for col in range(d):
        num[:, col] = np.bincount(labels, weights=inv * x[:, col], minlength=k)
    new = centers.copy()
    ok = den > 0
    if not np.any(ok):
        return new
    t = num[ok] / den[ok, None]
    r_vec = num[ok] - den[ok, None] * centers[ok]
    r = np.sqrt(np.einsum("ij,ij->i", r_vec, r_vec))
    # eta = 0 gives ratio 0: the plain Weiszfeld step y' = T. r = 0 means y is
    # already optimal for the cluster: ratio inf keeps y' = y.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(r > 0, eta[ok] / r, np.inf)
    a = np.maximum(0.0, 1.0 - ratio)
    b = np.minimum(1.0, ratio)
    new[ok] = a[:, None] * t + b[:, None] * centers[ok]
    return new


def _kmedian_euclidean_once(x, w, k, rng, max_iter, inner_steps=5, rel_tol=1e-7):
    scale = float(np.max(np.abs(x))) or 1.0
    coincide_tol = 1e-12 * scale
    centers, _ = _greedy_d1_seed(x, w, k, rng)
    labels, dist = _nearest_and_dist(x, centers)
    cost = float(np.dot(w, dist))
    for _ in range(max_iter):
        # Clusters that received no weight: move each to the point that pays
        # most (largest w_i * d_i); that point then costs 0, so cost drops.
        assigned = np.bincount(labels, weights=w, minlength=k)
        for j in np.flatnonzero(assigned <= 0):
            i = int(np.argmax(w * dist))
            if not w[i] * dist[i] > 0:
                break
            centers[j] = x[i]
            diff = x - x[i]
            dnew = np.sqrt(np.einsum("ij,ij->i", diff, diff))
            closer = dnew < dist
            labels[closer] = j
            dist[closer] = dnew[closer]
        cost = float(np.dot(w, dist))
        # A few Weiszfeld steps with the assignment fixed, then reassign.
        previous = centers.copy()
        for _ in range(inner_steps):
            centers = _weiszfeld_step(x, w, labels, centers, coincide_tol)
        labels, dist = _nearest_and_dist(x, centers)
        new_cost = float(np.dot(w, dist))
        if new_cost > cost:  # only rounding can do this: keep the better centers
            centers = previous
            break
        done = new_cost >= cost * (1.0 - rel_tol)
        cost = new_cost
        if done:
            break
    return centers, cost


# --------------------------------------------------------------------------
# k-median, discrete setting (centers restricted to candidate rows)
# --------------------------------------------------------------------------


def _first_second(dm: np.ndarray):
    """Nearest medoid index, its distance, and the second-nearest distance."""
    n, k = dm.shape
    n1 = np.argmin(dm, axis=1)
    d1 = dm[np.arange(n), n1]
    if k == 1:
        d2 = np.full(n, np.inf)
    else:
        tmp = dm.copy()
        tmp[np.arange(n), n1] = np.inf
        d2 = tmp.min(axis=1)
    return n1, d1, d2


def _col_dist(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Exact float64 distances from every row of x to one point c."""
    diff = x - c
    return np.sqrt(np.einsum("ij,ij->i", diff, diff))


def _kmedian_discrete_once(x, w, cand, k, rng, max_iter):
    """Seeding plus PAM-style local search over candidate rows.

    Seeding: greedy D^1 sampling of points, each drawn point opening its
    nearest candidate that is not open yet. Local search: single swaps
    (medoid out, candidate in) while the weighted cost strictly improves; at
    most ``max_iter`` passes over the candidates.

    The gain of every swap is computed as in FastPAM1 (Schubert & Rousseeuw,
    2019), for a block of candidates at once. With d1/d2 the distances to the
    nearest and second-nearest medoid and dx the distance to candidate x,
      gain(x, j) = sum_i w_i (min(dx_i, d1_i) - d1_i)                       (all i)
                 + sum_{i: nearest(i) = j} w_i (clip(dx_i, d1_i, d2_i) - d1_i).
    The points are kept sorted by nearest medoid so the second sum is one
    dot product per medoid. Gains are screened in float32 (speed), and the
    best swap of each block is re-checked exactly in float64 before it is
    applied ("eager" swapping), so the true cost strictly decreases with every
    swap and the search cannot cycle. A pass over m candidates costs O(m n d).

    Returns ``(candidate indices of the k medoids, weighted cost)``.
    """
    n, m = x.shape[0], cand.shape[0]

    def open_nearest_candidate(i, opened):
        diff = cand - x[i]
        dc = np.einsum("ij,ij->i", diff, diff)
        dc[opened] = np.inf  # never open a candidate twice (m > k here)
        j = int(np.argmin(dc))
        return cand[j], j

    _, med = _greedy_d1_seed(x, w, k, rng, open_point=open_nearest_candidate)
    med = np.array(med, dtype=np.intp)
    is_med = np.zeros(m, dtype=bool)
    is_med[med] = True

    dm = np.column_stack([_col_dist(x, cand[j]) for j in med])  # (n, k), float64
    n1, d1, d2 = _first_second(dm)
    cost = float(np.dot(w, d1))

    x32 = x.astype(np.float32)
    cand32 = cand.astype(np.float32)
    x_sq = np.einsum("ij,ij->i", x32, x32)
    c_sq = np.einsum("ij,ij->i", cand32, cand32)
    block = int(np.clip(_BLOCK_ENTRIES // max(n, 1), 1, m))

    def sorted_state():
        """Points (float32) sorted by nearest medoid, with each medoid's slice bounds."""
        order = np.argsort(n1, kind="stable")
        bounds = np.searchsorted(n1[order], np.arange(k + 1))
        return (
            bounds,
            x32[order],
            x_sq[order],
            w[order].astype(np.float32),
            d1[order].astype(np.float32),
            d2[order].astype(np.float32),
        )

    bounds, xs, xs_sq, ws, d1s, d2s = sorted_state()
    base_j = np.bincount(n1, weights=w * d1, minlength=k)  # sum of w d1 per medoid
    buf = np.empty((block, n), dtype=np.float32)
    tmp = np.empty((block, n), dtype=np.float32)
    for _ in range(max_iter):
        improved = False
        for start in range(0, m, block):
            if cost <= 0:
                break
            stop = min(m, start + block)
            b = stop - start
            dx, r = buf[:b], tmp[:b]
            # Distances candidate-block x points in float32, (b, n).
            np.matmul(cand32[start:stop], xs.T, out=dx)
            dx *= -2.0
            dx += c_sq[start:stop, None]
            dx += xs_sq[None, :]
            np.maximum(dx, 0.0, out=dx)
            np.sqrt(dx, out=dx)
            np.minimum(dx, d1s, out=r)
            shared = r @ ws - cost  # sum_i w_i (min(dx, d1) - d1)
            np.maximum(dx, d1s, out=r)
            np.minimum(r, d2s, out=r)
            per_medoid = np.empty((b, k))
            for j in range(k):
                lo, hi = bounds[j], bounds[j + 1]
                per_medoid[:, j] = r[:, lo:hi] @ ws[lo:hi] - base_j[j]
            gain = shared[:, None] + per_medoid
            gain[is_med[start:stop]] = np.inf  # already open: not a swap
            bb, jj = np.unravel_index(int(np.argmin(gain)), gain.shape)
            if not gain[bb, jj] < -1e-6 * cost:
                continue
            # Re-check the chosen swap exactly in float64.
            c_new = start + int(bb)
            new_col = _col_dist(x, cand[c_new])
            old_col = dm[:, jj].copy()
            dm[:, jj] = new_col
            n1_new, d1_new, d2_new = _first_second(dm)
            new_cost = float(np.dot(w, d1_new))
            if new_cost < cost * (1.0 - 1e-12):
                is_med[med[jj]] = False
                is_med[c_new] = True
                med[jj] = c_new
                n1, d1, d2, cost = n1_new, d1_new, d2_new, new_cost
                bounds, xs, xs_sq, ws, d1s, d2s = sorted_state()
                base_j = np.bincount(n1, weights=w * d1, minlength=k)
                improved = True
            else:
                dm[:, jj] = old_col
        if not improved:
            break
    return med, cost


def weighted_kmedian(points, weights, k, rng, candidates=None, n_init=5, max_iter=100):
    """Weighted k-median (sum of w_i * distance to the nearest center).

    Post-processing: no privacy cost.

    - ``candidates`` given, array (m, d): DISCRETE setting, every returned
      center is exactly one of the candidate rows. D^1 seeding over the
      candidates, then PAM-style single-swap local search while the cost
      strictly improves (at most ``max_iter`` passes over the candidates).
      If there are fewer than k distinct candidates, all of them are returned
      and the rest are exact repeats drawn by ``rng`` (they get zero weight).
    - ``candidates`` None: EUCLIDEAN setting. Weighted k-means++ seeding with
      D^1 sampling, then alternate nearest-center assignment and weighted
      (Vardi-Zhang modified) Weiszfeld geometric-median updates per cluster,
      at most ``max_iter`` rounds, until the cost stops improving.

    The best of ``n_init`` restarts by weighted cost is returned. Negative
    weights are clipped to zero, all-zero weights are treated as uniform, and
    at most k distinct positive-weight points are handled as in
    ``weighted_kmeans`` (Euclidean setting only).

    Returns ``(centers (k, d), assigned_weights (k,))``.
    """
    pts, w, _, cand = _validate(
        points, weights, k, rng, candidates=candidates, n_init=n_init, max_iter=max_iter, check_rng=True
    )
    clipped, uniq, uw = _prepare(pts, w)
    # The loops below do many small matrix products; multi-threaded BLAS only
    # adds contention there (10x slower on a busy 2-core driver), so use one thread.
    with threadpool_limits(limits=1, user_api="blas"):
        centers = _kmedian_centers(uniq, uw, cand, k, rng, n_init, max_iter)
    return centers, _assigned(pts, clipped, centers)


def _kmedian_centers(uniq, uw, cand, k, rng, n_init, max_iter):
    """Centers of weighted_kmedian for merged points ``uniq`` with weights ``uw`` (> 0)."""
    if cand is not None:
        cand_u = np.unique(cand, axis=0)  # duplicates would only waste swaps
        if cand_u.shape[0] <= k:
            return _pad_centers(cand_u, k, rng, perturb=False)
        # Translate everything by one vector (distances unchanged) for precision.
        shift = uniq.mean(axis=0)
        xs, cs = uniq - shift, cand_u - shift
        best_med, best_cost = None, np.inf
        for _ in range(n_init):
            med, cost = _kmedian_discrete_once(xs, uw, cs, k, rng, max_iter)
            if cost < best_cost:
                best_med, best_cost = med, cost
        return cand_u[best_med].copy()  # exact candidate rows

    if uniq.shape[0] <= k:
        return _pad_centers(uniq, k, rng, perturb=True)
    best_centers, best_cost = None, np.inf
    for _ in range(n_init):
        centers, _ = _kmedian_euclidean_once(uniq, uw, k, rng, max_iter)
        cost = float(np.dot(uw, _nearest_and_dist(uniq, centers)[1]))
        if cost < best_cost:
            best_centers, best_cost = centers, cost
    return best_centers


# --------------------------------------------------------------------------
# Cluster merging (the DP-KCCM paper's rule)
# --------------------------------------------------------------------------


def nearest_pair_merge(centroids, weights, k):
    """Merge noisy centroids down to k by the cluster-merging paper's rule.

    Post-processing: no privacy cost.

    Repeatedly replace the two nearest centroids (Euclidean) by their
    weight-weighted combination (w_a c_a + w_b c_b) / (w_a + w_b), until k
    remain. The averaging coefficients are the weights clipped at a small
    positive floor (1e-9), so zero or negative weights still average evenly.
    The weight of a merged centroid is the plain sum of the input weights it
    absorbed (so the total, e.g. a noisy total count, is preserved); it is
    clipped again only when used as a coefficient.

    Deterministic: among equally near pairs the one with the smallest first
    index, then smallest second index is merged; the merged centroid takes the
    place of the lower index. The output keeps the input order of the
    surviving slots. If k >= the number of centroids they are returned unchanged.

    Returns ``(centers (k', d), merged_weights (k',))`` with k' = min(k, m).
    Cost O(m^2) per merge; meant for m up to a few hundred.
    """
    c, w, _, _ = _validate(centroids, weights, k)
    c = c.copy()
    w = w.copy()
    m = c.shape[0]
    if k >= m:
        return c, w
    alive = np.ones(m, dtype=bool)
    # Squared distances, only the upper triangle (i < j) is used.
    dist = _sq_dists(c - c.mean(axis=0), c - c.mean(axis=0))
    dist[np.tril_indices(m)] = np.inf
    for _ in range(m - k):
        flat = int(np.argmin(dist))  # row-major: smallest (i, j) among ties
        i, j = divmod(flat, m)
        a_i = max(w[i], _MERGE_WEIGHT_FLOOR)
        a_j = max(w[j], _MERGE_WEIGHT_FLOOR)
        c[i] = (a_i * c[i] + a_j * c[j]) / (a_i + a_j)
        w[i] = w[i] + w[j]
        alive[j] = False
        dist[j, :] = np.inf
        dist[:, j] = np.inf
        # Refresh the distances of the merged centroid to every live one.
        diff = c - c[i]
        d_i = np.einsum("ij,ij->i", diff, diff)
        d_i[~alive] = np.inf
        dist[:i, i] = d_i[:i]
        dist[i, i + 1 :] = d_i[i + 1 :]
    return c[alive], w[alive]


# --------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------


def solve(objective, points, weights, k, rng, candidates=None, **kw):
    """Dispatch to the weighted solver for ``objective``.

    Post-processing: no privacy cost.

    ``"kmeans"`` -> ``weighted_kmeans`` (``candidates`` must be None: the
    design solves the weighted k-means instance with unrestricted centers);
    ``"kmedian"`` -> ``weighted_kmedian`` (with or without ``candidates``).
    Extra keyword arguments (``n_init``, ``max_iter``) are passed through.
    Returns ``(centers, assigned_weights)``.
    """
    if objective == "kmeans":
        if candidates is not None:
            raise ValueError(
                "candidates are only supported for objective='kmedian'; "
                "objective='kmeans' places centers freely"
            )
        return weighted_kmeans(points, weights, k, rng, **kw)
    if objective == "kmedian":
        return weighted_kmedian(points, weights, k, rng, candidates=candidates, **kw)
    raise ValueError(f"objective={objective!r} should be one of {', '.join(repr(o) for o in OBJECTIVES)}")
