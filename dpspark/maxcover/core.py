"""Driver-side, Spark-free core of the maxcover family (Algorithms 1 and 2 of
``papers/maxcover-dp-clustering.txt``).

What lives here:

- the PUBLIC schedule: distance thresholds on the cost scale d^p
  (:func:`thresholds`), picks per threshold (:func:`picks_per_threshold`) and
  the per-pick weight of the exponential mechanism (:func:`coverage_epsilon`);
- private maximum coverage on a *signature histogram*
  (:func:`cover_from_signatures`): the uncovered points of one threshold,
  grouped by the set of candidates within the threshold radius ("cover
  signature"), with exact counts. Points with the same signature are
  interchangeable for every pick of that threshold, so the m picks run exactly
  on the aggregate;
- the whole coverage loop of Algorithm 2 (:func:`run_coverage`), charged ONCE to
  the accountant under the paper's Lemma 4.1, with the data access abstracted as
  a "signature provider" (one Spark pass per threshold later; a numpy version,
  :class:`NumpySignatureProvider`, for tests and small data);
- the snapping step: exact counts of points per chosen center
  (:func:`snap_counts`, numpy reference) released with discrete Laplace noise
  (:func:`noisy_weights`), and the noise floor below which a released weight is
  read as zero (:func:`significant_weights`, post-processing);
- data-independent candidate sets (:func:`grid_candidates`,
  :func:`random_candidates`) in the unit space [-1, 1]^d.

Nothing here imports pyspark. All noise is drawn through ``dpspark.privacy``
(the accountant's noise source); public, data-independent randomness comes from
an explicit ``numpy.random.Generator`` argument.

Repeated picks (a decision, following the paper)
-------------------------------------------------
Algorithm 1 removes the chosen set from the family (S_{i+1} <- S_i - {S}), so
WITHIN one threshold a candidate is picked at most once: every pick of a
threshold draws from the candidates not yet picked at that threshold. ACROSS
thresholds Algorithm 2 calls Algorithm 1 afresh with the whole of V, so the same
candidate may be picked again at a later threshold (the paper says so explicitly
before Lemma 4.1, and its privacy proof records (candidate, threshold) pairs).
A threshold therefore yields min(m, |V|) picks; both numbers are public, so the
number of releases stays data-independent, as the proof requires. (Re-picking
at the same threshold would be worthless anyway: after a pick its exact coverage
count is 0.)

Cost scale
----------
Thresholds are on the cost scale d^p (t_i compared with dist^p); the coverage
radius of threshold t is t^(1/p).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp

from dpspark.maxcover.kernels import _chunk_rows, _cost_from_sq, _sq_dists  # the executors' distance rule
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.mechanisms import ExponentialMechanism, LaplaceMechanism

__all__ = [
    "COVERAGE_LABEL",
    "COVERAGE_RULE",
    "SNAP_LABEL",
    "NumpySignatureProvider",
    "PerPickScores",
    "SignatureProvider",
    "chosen_candidate_ids",
    "cost_matrix",
    "cover_bruteforce",
    "cover_from_signatures",
    "cover_per_pick",
    "coverage_epsilon",
    "grid_candidates",
    "noisy_weights",
    "picks_per_threshold",
    "random_candidates",
    "run_coverage",
    "signatures_to_csr",
    "significant_weights",
    "snap_counts",
    "thresholds",
]

COVERAGE_LABEL = "maxcover coverage loop"
COVERAGE_RULE = (
    "maxcover paper (maxcover-dp-clustering) Lemma 4.1, proved in appendix Lemmas A.3-A.4 "
    "after Gupta et al.'s unweighted set cover: the whole for loop of Algorithm 2 (all thresholds, "
    "a public number of picks, each by the exponential mechanism with weight "
    "eps' = eps_cov / (2 ln(e/delta)) on exactly updated coverage counts, eps' <= 1) is "
    "(2 eps' ln(e/delta), delta) = (eps_cov, delta)-DP; the paper states it as (eps_p/2, delta_p) "
    "for the eps_cov = eps_p/2 split"
)
SNAP_LABEL = "maxcover snap counts"

# Largest grid grid_candidates builds before asking for another candidate generator.
_MAX_GRID_POINTS = 10_000_000

SignatureProvider = Callable[[int, Sequence[tuple[int, int]]], tuple[object, object]]


# ----------------------------------------------------------------------------
# Validation helpers


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_p(p) -> int:
    return _check_positive_int("p", p, 1)


def _check_coverage_approx(a) -> float:
    if isinstance(a, bool) or not isinstance(a, (int, float, np.floating)) or not (0.0 < a < 1.0):
        raise ValueError(f"coverage_approx must be in (0, 1), got {a!r}")
    return float(a)


def _check_finite_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not (value > 0) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def _as_points(name: str, x, dim: int | None = None) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (rows x dim), got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise ValueError(f"{name} has dimension {arr.shape[1]}, expected {dim}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values")
    return arr


def _as_counts(counts, n_rows: int) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"counts must be exact integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size != n_rows:
        raise ValueError(f"got {arr.size} counts for {n_rows} signatures")
    if arr.size and arr.min() < 0:
        raise ValueError("counts must be >= 0")
    return arr


# ----------------------------------------------------------------------------
# The public schedule


def thresholds(diameter: float, p: int, n_candidates: int, coverage_approx: float, n_upper: int | None = None) -> np.ndarray:
    """Distance thresholds on the cost scale: t_i = (1+a)^(i-1) * Delta^p / N0, i = 1..r.

    ``N0 = n_candidates`` (|V|, the paper's choice, where the private points are a
    subset of V) unless ``n_upper`` is given: a PUBLIC upper bound N on the number
    of private points (a config value, never the data's n), used for Euclidean
    data with n >> |V| (every point closer than t_1 is charged t_1, an additive
    error of about n * t_1). r is the smallest count whose last threshold is
    >= Delta^p. The coverage radius of threshold t is t ** (1 / p).
    """
    diameter = _check_finite_positive("diameter", diameter)
    p = _check_p(p)
    n_candidates = _check_positive_int("n_candidates", n_candidates)
    a = _check_coverage_approx(coverage_approx)
    n0 = n_candidates if n_upper is None else _check_positive_int("n_upper", n_upper)
    top = diameter**p
    t1 = top / n0
    # (1+a)^(r-1) >= N0  <=>  r = ceil(ln N0 / ln(1+a)) + 1; then fix any rounding at the edges.
    r = max(1, int(math.ceil(math.log(n0) / math.log1p(a))) + 1)
    ts = t1 * (1.0 + a) ** np.arange(r, dtype=np.float64)
    while ts[-1] < top:
        ts = np.append(ts, ts[-1] * (1.0 + a))
    while ts.size > 1 and ts[-2] >= top:
        ts = ts[:-1]
    return ts


def picks_per_threshold(k: int, coverage_approx: float) -> int:
    """m = ceil(2 k ln(1/a)): picks of Algorithm 1 per threshold (Algorithm 2, line 4)."""
    k = _check_positive_int("k", k)
    a = _check_coverage_approx(coverage_approx)
    return int(math.ceil(2.0 * k * math.log(1.0 / a)))


def coverage_epsilon(eps_cov: float, delta: float) -> float:
    """eps' = eps_cov / (2 ln(e/delta)): the weight of every pick (Algorithm 1, line 1)."""
    eps_cov = _check_finite_positive("eps_cov", eps_cov)
    delta = _check_delta(delta)
    return eps_cov / (2.0 * (1.0 - math.log(delta)))  # ln(e/delta) = 1 - ln(delta)


# ----------------------------------------------------------------------------
# Distances (numpy reference; the same rule everywhere so that implementations agree)


def cost_matrix(points, candidates, p: int) -> np.ndarray:
    """Dense dist(point, candidate)^p matrix (n x |V|). Tiny inputs only."""
    p = _check_p(p)
    x = _as_points("points", points)
    c = _as_points("candidates", candidates, x.shape[1])
    return _cost_from_sq(_sq_dists(x, c), p)


# ----------------------------------------------------------------------------
# Private maximum coverage (Algorithm 1) on a signature histogram


def signatures_to_csr(signatures, n_candidates: int) -> sp.csr_matrix:
    """Incidence matrix (signatures x candidates, 0/1 as int8) of a signature list.

    ``signatures`` is a sequence of candidate-id sequences (each a set: duplicates
    inside one signature are an error; order does not matter), or a scipy sparse
    matrix whose non-zero pattern is the incidence. Rows may repeat; their
    counts then simply add up.
    """
    n_candidates = _check_positive_int("n_candidates", n_candidates)
    if sp.issparse(signatures):
        inc = sp.csr_matrix(signatures)  # may share arrays with the caller's matrix: never modified in place
        if inc.shape[1] != n_candidates:
            raise ValueError(f"signature matrix has {inc.shape[1]} columns, expected n_candidates={n_candidates}")
        if not inc.has_canonical_format:
            inc = inc.copy()
            inc.sum_duplicates()
        if np.any(inc.data == 0):
            inc = inc.copy()
            inc.eliminate_zeros()
        return sp.csr_matrix((np.ones(inc.nnz, dtype=np.int8), inc.indices, inc.indptr), shape=inc.shape, copy=False)
    n_rows = len(signatures)
    lengths = np.fromiter((len(s) for s in signatures), dtype=np.int64, count=n_rows)
    nnz = int(lengths.sum())
    indices = np.fromiter(itertools.chain.from_iterable(signatures), dtype=np.int64, count=nnz)
    if nnz and (indices.min() < 0 or indices.max() >= n_candidates):
        raise ValueError(f"signature contains a candidate id outside [0, {n_candidates})")
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    idx_dtype = np.int32 if max(nnz, n_candidates) < 2**31 - 1 else np.int64
    inc = sp.csr_matrix(
        (np.ones(nnz, dtype=np.int8), indices.astype(idx_dtype), indptr.astype(idx_dtype)),
        shape=(n_rows, n_candidates),
    )
    inc.sort_indices()
    if nnz > 1:
        idx = inc.indices
        same_row_next = np.ones(nnz - 1, dtype=bool)
        starts = inc.indptr[1:-1]
        starts = starts[(starts > 0) & (starts < nnz)]
        same_row_next[starts - 1] = False
        if np.any((np.diff(idx) == 0) & same_row_next):
            raise ValueError("a signature lists the same candidate twice (a signature is a set)")
    return inc


def _select(block, mech: ExponentialMechanism, scores: np.ndarray, available: np.ndarray) -> int:
    """One exponential-mechanism pick among the candidates still available at this threshold."""
    idx = np.flatnonzero(available)
    j = block.exponential(scores[idx], mech)
    return int(idx[j])


def cover_from_signatures(signatures, counts, n_candidates: int, m: int, block, mech: ExponentialMechanism) -> list[int]:
    """Algorithm 1 (private maximum coverage) for one threshold, on a signature histogram.

    ``signatures[s]`` is the set of candidate ids within the threshold of the
    points of group s (all still uncovered by earlier thresholds), ``counts[s]``
    their exact number. Makes min(m, n_candidates) picks; pick i scores every
    candidate v not yet picked at this threshold by the EXACT number of
    still-uncovered points whose signature contains v (int64) and selects through
    ``block.exponential(scores, mech)`` (already charged as part of the coverage
    loop); then every group containing the pick is removed exactly.

    With all counts zero (or no signatures) the scores are all zero and the picks
    are uniform over the available candidates, still drawn through the mechanism
    because the picks are released.

    Cost: one sparse incidence build, one transpose product for the first
    scores, then each pick touches only the groups it removes (the scores are
    decremented by their exact integer contributions), so a threshold costs
    O(nnz) plus m draws over |V| scores.
    """
    n_candidates = _check_positive_int("n_candidates", n_candidates)
    m = _check_positive_int("m", m, 0)
    inc = signatures_to_csr(signatures, n_candidates)
    alive = _as_counts(counts, inc.shape[0]).copy()
    col_rows = inc.tocsc()  # column v -> the groups whose signature contains v
    scores = np.asarray(inc.T @ alive, dtype=np.int64).reshape(-1)
    available = np.ones(n_candidates, dtype=bool)
    picks: list[int] = []
    for _ in range(min(m, n_candidates)):
        v = _select(block, mech, scores, available)
        picks.append(v)
        available[v] = False
        rows = col_rows.indices[col_rows.indptr[v] : col_rows.indptr[v + 1]]
        rows = rows[alive[rows] > 0]
        if rows.size:
            scores -= np.asarray(inc[rows].T @ alive[rows], dtype=np.int64).reshape(-1)
            alive[rows] = 0
        if scores[v] != 0:  # invariant: a pick covers everything it scored
            raise AssertionError("coverage bookkeeping error: the pick still has uncovered points")
    return picks


def cover_bruteforce(points, candidates, t: float, p: int, m: int, block, mech: ExponentialMechanism, uncovered_mask):
    """Reference Algorithm 1 on a dense point x candidate matrix (tiny inputs only).

    Returns (picks, new_uncovered_mask). Scores are recomputed from scratch on
    the dense matrix before every pick; same rule as :func:`cover_from_signatures`
    (picks among candidates not yet picked at this threshold, ``dist^p <= t``
    covers), so with the same noise draws both give identical picks.
    """
    m = _check_positive_int("m", m, 0)
    within = cost_matrix(points, candidates, p) <= t
    n, n_cand = within.shape
    uncovered = np.asarray(uncovered_mask, dtype=bool).reshape(-1).copy()
    if uncovered.size != n:
        raise ValueError(f"uncovered_mask has {uncovered.size} entries for {n} points")
    available = np.ones(n_cand, dtype=bool)
    picks: list[int] = []
    for _ in range(min(m, n_cand)):
        scores = within[uncovered].sum(axis=0, dtype=np.int64)
        v = _select(block, mech, scores, available)
        picks.append(v)
        available[v] = False
        uncovered &= ~within[:, v]
    return picks, uncovered


# ----------------------------------------------------------------------------
# Algorithm 2's coverage loop


def run_coverage(
    signature_provider: SignatureProvider,
    n_candidates: int,
    thresholds: Sequence[float],
    m: int,
    accountant: Accountant,
    eps_cov: float,
    delta: float,
) -> list[tuple[int, int]]:
    """The for loop of Algorithm 2 over all thresholds; returns [(candidate_id, threshold_index)].

    ``threshold_index`` is the 0-based position in ``thresholds`` (the paper's
    t_{i} is ``thresholds[i-1]``). ``signature_provider(i, covered_picks)`` must
    return ``(signatures, counts)`` for the points NOT covered by any earlier pick
    ``(c, j)`` in ``covered_picks`` (covered means dist(point, c)^p <= thresholds[j]),
    where a point's signature is the set of candidates within thresholds[i]; points
    with an empty signature may be left out. Whether a point is covered, and its
    signature, must depend on that point and public values only.

    Instead of a histogram the provider may return a :class:`PerPickScores` (used
    when a threshold's histogram would be too large for the driver): then every
    pick of that threshold gets the exact scores computed elsewhere, e.g. by a job
    over a histogram kept on the executors (:func:`cover_per_pick`); same picks,
    same draws, same privacy.

    Privacy: the whole loop is charged ONCE, (eps_cov, delta), as one block under
    the paper's Lemma 4.1 (see :data:`COVERAGE_RULE`); every pick uses the
    exponential mechanism with weight eps' = coverage_epsilon(eps_cov, delta).
    The proof needs eps' <= 1 (it bounds e^{eps'} - 1 by 2 eps'), the number of
    picks to be public (len(thresholds) * min(m, n_candidates)), and the counts
    to be exact after every pick. Everything is validated before the charge; if
    the provider fails midway the charge stays (the run is recorded as failed).
    """
    n_candidates = _check_positive_int("n_candidates", n_candidates)
    m = _check_positive_int("m", m, 1)
    ts = np.asarray(thresholds, dtype=np.float64).reshape(-1)
    if ts.size == 0 or not np.all(np.isfinite(ts)) or np.any(ts <= 0):
        raise ValueError("thresholds must be a non-empty sequence of finite values > 0")
    eps_prime = coverage_epsilon(eps_cov, delta)
    if eps_prime > 1.0:
        raise ValueError(
            f"eps' = eps_cov / (2 ln(e/delta)) = {eps_prime:g} > 1: the coverage loop's privacy proof "
            "(Lemma 4.1) needs eps' <= 1; lower eps_cov"
        )
    mech = ExponentialMechanism.with_weight(eps_prime)
    # Lemma 4.1 covers exactly this mechanism (weight eps') and a PUBLIC number of picks:
    # min(m, |V|) per threshold. The block refuses any other mechanism or one pick more.
    n_picks = ts.size * min(m, n_candidates)
    block = accountant.block(COVERAGE_LABEL, float(eps_cov), float(delta), rule=COVERAGE_RULE, releases={mech: n_picks})
    picks: list[tuple[int, int]] = []
    for i in range(ts.size):
        result = signature_provider(i, tuple(picks))
        if isinstance(result, PerPickScores):
            chosen = cover_per_pick(result, n_candidates, m, block, mech)
        else:
            signatures, counts = result
            chosen = cover_from_signatures(signatures, counts, n_candidates, m, block, mech)
        picks.extend((c, i) for c in chosen)
    return picks


class PerPickScores:
    """Exact per-pick coverage scores for one threshold, computed from the data on demand.

    ``scores(threshold_picks)`` returns the int64 vector (one entry per candidate)
    of the number of points that are uncovered by the earlier thresholds' picks AND
    by ``threshold_picks`` (candidate ids already picked at this threshold, which
    cover within this threshold), and lie within this threshold of the candidate.
    One call is one exact pass over the data (e.g. one Spark job).
    """

    def __init__(self, scores: Callable[[Sequence[int]], np.ndarray]):
        self.scores = scores


def cover_per_pick(source: PerPickScores, n_candidates: int, m: int, block, mech: ExponentialMechanism) -> list[int]:
    """Algorithm 1 for one threshold with the scores recomputed exactly before every pick.

    The slow, memory-light twin of :func:`cover_from_signatures`: the same rule
    (picks among the candidates not yet picked at this threshold, scored by the
    exact number of still-uncovered points they cover) and the same draws, so with
    the same noise both return the same picks.
    """
    n_candidates = _check_positive_int("n_candidates", n_candidates)
    m = _check_positive_int("m", m, 0)
    available = np.ones(n_candidates, dtype=bool)
    picks: list[int] = []
    for _ in range(min(m, n_candidates)):
        scores = np.asarray(source.scores(tuple(picks)))
        if scores.dtype.kind not in "iu" or scores.shape != (n_candidates,):
            raise TypeError(f"per-pick scores must be {n_candidates} exact integers, got dtype {scores.dtype}, shape {scores.shape}")
        scores = scores.astype(np.int64)
        if picks and np.any(scores[picks] != 0):  # invariant: a pick covers everything it scored
            raise AssertionError("coverage bookkeeping error: a pick still has uncovered points")
        v = _select(block, mech, scores, available)
        picks.append(v)
        available[v] = False
    return picks


class NumpySignatureProvider:
    """Signature provider on numpy arrays (tests, small data): chunked and vectorised.

    ``points_unit`` (n x d) are the private points in unit space,
    ``candidates_unit`` (|V| x d) the public candidates, ``thresholds`` on the
    cost scale d^p. Each call recomputes coverage by the earlier picks from
    scratch (stateless, like one Spark pass per threshold) and returns
    (list of sorted candidate-id tuples, int64 counts); points with an empty
    signature are left out (they add nothing to any score).
    """

    def __init__(self, points_unit, candidates_unit, thresholds, p: int, chunk_rows: int | None = None):
        self.points = _as_points("points_unit", points_unit)
        self.candidates = _as_points("candidates_unit", candidates_unit, self.points.shape[1])
        self.thresholds = np.asarray(thresholds, dtype=np.float64).reshape(-1)
        self.p = _check_p(p)
        n_cand, dim = self.candidates.shape
        self.chunk_rows = _chunk_rows(n_cand, dim) if chunk_rows is None else _check_positive_int("chunk_rows", chunk_rows)

    def __call__(self, threshold_index: int, covered_picks: Sequence[tuple[int, int]]):
        i = int(threshold_index)
        if not 0 <= i < self.thresholds.size:
            raise IndexError(f"threshold_index {i} out of range")
        t = self.thresholds[i]
        n_cand = self.candidates.shape[0]
        pick_c = np.array([int(c) for c, _ in covered_picks], dtype=np.int64)
        pick_t = self.thresholds[np.array([int(j) for _, j in covered_picks], dtype=np.int64)]
        agg: dict[bytes, int] = {}
        for start in range(0, self.points.shape[0], self.chunk_rows):
            cost = _cost_from_sq(_sq_dists(self.points[start : start + self.chunk_rows], self.candidates), self.p)
            if pick_c.size:
                cost = cost[~np.any(cost[:, pick_c] <= pick_t, axis=1)]
            within = cost <= t
            within = within[within.any(axis=1)]
            if not within.shape[0]:
                continue
            packed, cnt = np.unique(np.packbits(within, axis=1), axis=0, return_counts=True)
            for row, c in zip(packed, cnt):
                key = row.tobytes()
                agg[key] = agg.get(key, 0) + int(c)
        signatures = [
            tuple(int(v) for v in np.flatnonzero(np.unpackbits(np.frombuffer(key, dtype=np.uint8), count=n_cand)))
            for key in agg
        ]
        counts = np.fromiter(agg.values(), dtype=np.int64, count=len(agg))
        return signatures, counts


# ----------------------------------------------------------------------------
# Snapping and the noisy counts


def chosen_candidate_ids(picks: Sequence[tuple[int, int]]) -> list[int]:
    """Distinct candidate ids of the coverage picks, in first-pick order (post-processing).

    A candidate picked at several thresholds is one center: snapping to a
    duplicate would only add a zero count with noise.
    """
    seen: dict[int, None] = {}
    for c, _ in picks:
        seen.setdefault(int(c), None)
    return list(seen)


def snap_counts(points, centers, p: int) -> np.ndarray:
    """Exact int64 number of points whose nearest center is each center (numpy reference).

    Nearest by Euclidean distance (the same for every p, so squared distances are
    compared); ties go to the lowest center index.
    """
    _check_p(p)
    x = _as_points("points", points)
    c = _as_points("centers", centers, x.shape[1])
    if c.shape[0] == 0:
        raise ValueError("need at least one center")
    counts = np.zeros(c.shape[0], dtype=np.int64)
    step = _chunk_rows(*c.shape)
    for start in range(0, x.shape[0], step):
        nearest = np.argmin(_sq_dists(x[start : start + step], c), axis=1)
        counts += np.bincount(nearest, minlength=c.shape[0]).astype(np.int64)
    return counts


def noisy_weights(exact_counts, accountant: Accountant, eps_cnt: float) -> np.ndarray:
    """Release the snap counts with discrete Laplace(1/eps_cnt) noise, charged (eps_cnt, 0).

    Under add/remove of one record exactly one count changes, by 1: L1
    sensitivity 1 (Algorithm 2, line 11; the centers are the coverage loop's
    released output, so this composes with it). Returns the noisy int64 counts,
    which may be negative: clipping them at zero is post-processing left to the
    caller / solver.
    """
    arr = np.asarray(exact_counts)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise TypeError(f"exact_counts must be a non-empty 1-D integer array, got dtype {arr.dtype}, shape {arr.shape}")
    if arr.min() < 0:
        raise ValueError("exact_counts must be >= 0")
    mech = LaplaceMechanism(epsilon=float(_check_finite_positive("eps_cnt", eps_cnt)), sensitivity=1.0)
    return np.asarray(accountant.laplace(SNAP_LABEL, arr.astype(np.int64), mech), dtype=np.int64)


# significant_weights: the expected number of the chosen candidates with no point whose released
# count clears the floor, where nothing says where the data is (1.0), and for candidates outside the
# cells a released histogram saw occupied (0.05). One expected false candidate outside was measured too
# lax there: on a box 10x the data's range a far empty candidate with noise 11 cleared it and took one of
# three centers in 3 of 12 seeded fits; the stricter floor everywhere cost a3 (k = 50, clusters of 150
# points split over many candidates) 0.98 -> 1.24.
WEIGHT_FLOOR_FALSE = 1.0
WEIGHT_FLOOR_FALSE_OUTSIDE = 0.05


def noise_floor(eps_cnt: float, count: int, expected: float = 1.0) -> int:
    """The smallest integer t >= 1 with count * P[Z >= t] <= expected for Z ~ DLap(1/eps_cnt), where
    P[Z >= t] = exp(-eps t) / (1 + exp(-eps)): among ``count`` counts whose exact value is 0, the
    released values reach t ``expected`` times in all, at most (public: eps_cnt, count, expected)."""
    eps = float(_check_finite_positive("eps_cnt", eps_cnt))
    count = int(count)
    if count < 1:
        raise ValueError(f"count={count} should be >= 1")
    expected = float(_check_finite_positive("expected", expected))
    q = math.exp(-eps)
    t = max(1, math.ceil((math.log(count / expected) - math.log1p(q)) / eps))
    while t > 1 and count * math.exp(-eps * (t - 1)) / (1.0 + q) <= expected:
        t -= 1
    while count * math.exp(-eps * t) / (1.0 + q) > expected:
        t += 1
    return t


def significant_weights(noisy_counts, eps_cnt: float, k: int, outside=None) -> np.ndarray:
    """Post-processing of the released snap counts: float weights, zero where the noisy count is below
    ``noise_floor(eps_cnt, len, WEIGHT_FLOOR_FALSE)`` (indistinguishable from an empty candidate's
    noise), or below ``noise_floor(eps_cnt, len, WEIGHT_FLOOR_FALSE_OUTSIDE)`` where the boolean mask
    ``outside`` (itself computed from released values only) is True; the rest as released. When fewer
    than k counts clear their floor, every count clipped at zero instead.

    Why: a candidate picked where no point is (a loose box leaves most of a public grid in empty space;
    a wide threshold's pick covers points it is far from) gets a noisy weight of a few units; the
    weighted k-means optimum keeps a center on such a far candidate rather than pay its weight times
    its squared distance. Measured (numpy reference of the 2-d grid route, epsilon 1, cost /
    non-private, median of 5): s1 1.035 -> 1.022, a3 1.081 -> 1.036, unbalance 1.92 -> 1.61.
    No noise is drawn and no data is read: only the released counts, the mask and public eps_cnt, k."""
    noisy = np.asarray(noisy_counts, dtype=np.float64).reshape(-1)
    if noisy.size == 0:
        raise ValueError("noisy_counts is empty")
    floor = np.full(noisy.size, float(noise_floor(eps_cnt, noisy.size, WEIGHT_FLOOR_FALSE)))
    if outside is not None:
        outside = np.asarray(outside, dtype=bool).reshape(-1)
        if outside.size != noisy.size:
            raise ValueError(f"outside has {outside.size} values for {noisy.size} counts")
        floor[outside] = noise_floor(eps_cnt, noisy.size, WEIGHT_FLOOR_FALSE_OUTSIDE)
    clipped = np.maximum(noisy, 0.0)
    keep = noisy >= floor
    if int(keep.sum()) < int(k):
        return clipped
    return np.where(keep, clipped, 0.0)


# ----------------------------------------------------------------------------
# Data-independent candidate sets (unit space [-1, 1]^d)


def grid_candidates(dim: int, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """A regular grid over [-1, 1]^d with about ``size`` points.

    q = max(2, floor(size^(1/d))) points per axis at the cell centres
    -1 + (2j + 1)/q, so q^d points (for d > log2(size) that is 2^d, more than
    ``size``). With ``rng`` (PUBLIC randomness only) the whole grid is shifted
    by one uniform offset in [-1/q, 1/q)^d, which keeps it inside [-1, 1]^d.
    """
    dim = _check_positive_int("dim", dim)
    size = _check_positive_int("size", size)
    q = int(round(size ** (1.0 / dim)))
    while q > 1 and q**dim > size:
        q -= 1
    while (q + 1) ** dim <= size:
        q += 1
    q = max(q, 2)
    if q**dim > _MAX_GRID_POINTS:
        raise ValueError(f"a grid with {q} points per axis in dimension {dim} has {q**dim} points; use random_candidates")
    axis = -1.0 + (2.0 * np.arange(q) + 1.0) / q
    grid = np.stack(np.meshgrid(*([axis] * dim), indexing="ij"), axis=-1).reshape(-1, dim)
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError("rng must be a numpy.random.Generator (public randomness)")
        grid = grid + rng.uniform(-1.0 / q, 1.0 / q, size=dim)
        grid = np.clip(grid, -1.0, 1.0)
    return grid


def random_candidates(dim: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` points uniform in [-1, 1]^d from the PUBLIC generator ``rng``."""
    dim = _check_positive_int("dim", dim)
    size = _check_positive_int("size", size)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (public randomness)")
    return rng.uniform(-1.0, 1.0, size=(size, dim))
