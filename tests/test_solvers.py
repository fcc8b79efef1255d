"""Tests for dpspark.solvers (non-private post-processing solvers). No Spark.

Every test uses a fixed numpy Generator; tolerances are stated next to each
assertion.
"""

import ast
import itertools
import pathlib
import time

import numpy as np
import pytest

from dpspark import solvers
from dpspark.solvers import (
    nearest,
    nearest_pair_merge,
    solve,
    weighted_cost,
    weighted_kmeans,
    weighted_kmedian,
)

BLOB_CENTERS = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])


def blobs(rng, n_per=200, scale=0.3):
    """Three well-separated Gaussian blobs with random positive weights."""
    pts = np.vstack([c + scale * rng.normal(size=(n_per, 2)) for c in BLOB_CENTERS])
    w = rng.uniform(0.5, 2.0, size=pts.shape[0])
    return pts, w


def match_error(found, expected):
    """Largest distance from an expected center to its nearest found center."""
    d = np.linalg.norm(expected[:, None, :] - found[None, :, :], axis=2)
    return d.min(axis=1).max()


def is_candidate_row(centers, candidates):
    """True per center if it is EXACTLY equal to some candidate row."""
    return np.all(centers[:, None, :] == candidates[None, :, :], axis=2).any(axis=1)


# ---------------------------------------------------------------- module rules


def test_solvers_imports_no_privacy_and_no_pyspark():
    source = pathlib.Path(solvers.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not any(m.startswith("dpspark.privacy") or m.startswith("pyspark") for m in imported), imported


# ---------------------------------------------------------------- weighted_kmeans


def test_kmeans_recovers_three_blobs():
    pts, w = blobs(np.random.default_rng(0))
    centers, assigned = weighted_kmeans(pts, w, 3, np.random.default_rng(1))
    assert centers.shape == (3, 2) and assigned.shape == (3,)
    # Blob std 0.3 with 200 points: the means are within ~0.05; allow 0.2.
    assert match_error(centers, BLOB_CENTERS) < 0.2
    # Every point goes to some center: assigned weights sum to the total weight.
    assert assigned.sum() == pytest.approx(w.sum(), rel=1e-12)
    assert np.sort(assigned) == pytest.approx(np.sort([w[:200].sum(), w[200:400].sum(), w[400:].sum()]))


def test_kmeans_weights_pull_the_center():
    pts = np.array([[0.0], [10.0]])
    even, _ = weighted_kmeans(pts, [1.0, 1.0], 1, np.random.default_rng(0))
    heavy, _ = weighted_kmeans(pts, [1.0, 9.0], 1, np.random.default_rng(0))
    assert even[0, 0] == pytest.approx(5.0, abs=1e-9)
    assert heavy[0, 0] == pytest.approx(9.0, abs=1e-9)  # (0*1 + 10*9) / 10


def test_kmeans_clips_negative_weights():
    rng = np.random.default_rng(2)
    pts = np.vstack([rng.normal(size=(50, 2)), rng.normal(size=(50, 2)) + [20.0, 0.0]])
    w = np.ones(100)
    w[:50] = -5.0  # noisy weights below zero carry no mass after clipping
    centers, assigned = weighted_kmeans(pts, w, 1, rng)
    # Unclipped the weighted "mean" would be far outside the data (total weight -200).
    assert centers[0] == pytest.approx(pts[50:].mean(axis=0), abs=1e-9)
    assert assigned == pytest.approx([50.0])  # sum of CLIPPED weights


def test_kmeans_all_zero_weights_treated_as_uniform():
    pts = np.array([[0.0], [10.0], [20.0]])
    centers, assigned = weighted_kmeans(pts, np.zeros(3), 1, np.random.default_rng(0))
    assert centers[0, 0] == pytest.approx(10.0, abs=1e-9)
    assert assigned == pytest.approx([0.0])  # no mass is invented


def test_kmeans_more_clusters_than_distinct_points():
    pts = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [5.0, 5.0], [9.0, 9.0]])
    w = np.array([1.0, 2.0, 1.0, 1.0, 0.0])  # [9, 9] has zero weight: 3 useful points
    centers, assigned = weighted_kmeans(pts, w, 5, np.random.default_rng(0))
    assert centers.shape == (5, 2) and np.all(np.isfinite(centers))
    for p in ([0.0, 0.0], [1.0, 1.0], [5.0, 5.0]):  # the available points are returned exactly
        assert np.any(np.all(centers == p, axis=1))
    assert assigned.sum() == pytest.approx(w.sum())
    # Deterministic given the generator.
    again, _ = weighted_kmeans(pts, w, 5, np.random.default_rng(0))
    assert np.array_equal(centers, again)


def test_kmeans_reproducible_with_same_seed():
    pts, w = blobs(np.random.default_rng(3), n_per=50, scale=2.0)
    a, _ = weighted_kmeans(pts, w, 4, np.random.default_rng(7))
    b, _ = weighted_kmeans(pts, w, 4, np.random.default_rng(7))
    assert np.array_equal(a, b)


# ---------------------------------------------------------------- weighted_kmedian


def test_kmedian_with_candidates_returns_only_candidate_rows():
    rng = np.random.default_rng(4)
    pts, w = blobs(rng, n_per=100)
    candidates = rng.uniform(-2, 12, size=(300, 2))
    centers, assigned = weighted_kmedian(pts, w, 3, np.random.default_rng(5), candidates=candidates)
    assert centers.shape == (3, 2)
    assert is_candidate_row(centers, candidates).all()  # exact membership
    assert len({tuple(c) for c in centers}) == 3  # distinct medoids
    # 300 candidates over a 14 x 14 square: nearest one within ~1 of each blob center.
    assert match_error(centers, BLOB_CENTERS) < 1.5
    assert assigned.sum() == pytest.approx(w.sum())


def test_kmedian_candidates_matches_brute_force_on_small_instances():
    rng = np.random.default_rng(6)
    for trial in range(5):
        pts = rng.normal(size=(40, 2))
        w = rng.exponential(size=40)
        cand = rng.normal(size=(10, 2))
        best = min(weighted_cost(pts, w, cand[list(c)], 1) for c in itertools.combinations(range(10), 3))
        centers, _ = weighted_kmedian(pts, w, 3, np.random.default_rng(trial), candidates=cand)
        # Swap local search from 5 restarts finds the optimum on these tiny instances.
        assert weighted_cost(pts, w, centers, 1) == pytest.approx(best, rel=1e-9)


def test_kmedian_candidates_result_is_swap_local_optimum():
    rng = np.random.default_rng(16)
    pts = rng.normal(size=(150, 2)) * 3
    w = rng.exponential(size=150)
    cand = rng.uniform(-6, 6, size=(40, 2))
    k = 4
    centers, _ = weighted_kmedian(pts, w, k, np.random.default_rng(0), candidates=cand, n_init=1)
    cost = weighted_cost(pts, w, centers, 1)
    # Brute force over every single swap (medoid out, candidate in): none improves by > 1e-9 relative.
    for j in range(k):
        for c in cand:
            trial = centers.copy()
            trial[j] = c
            assert weighted_cost(pts, w, trial, 1) >= cost * (1 - 1e-9)


def test_kmedian_fewer_candidates_than_k():
    pts = np.array([[0.0], [5.0], [10.0]])
    cand = np.array([[1.0], [9.0]])
    centers, assigned = weighted_kmedian(pts, np.ones(3), 4, np.random.default_rng(0), candidates=cand)
    assert centers.shape == (4, 1)
    assert is_candidate_row(centers, cand).all()
    assert assigned.sum() == pytest.approx(3.0)


def test_euclidean_kmedian_robust_to_outlier_kmeans_is_not():
    rng = np.random.default_rng(8)
    pts = np.vstack([0.1 * rng.normal(size=(20, 2)), [[1000.0, 1000.0]]])
    w = np.ones(21)
    med, _ = weighted_kmedian(pts, w, 1, np.random.default_rng(0))
    mean, _ = weighted_kmeans(pts, w, 1, np.random.default_rng(0))
    # Geometric median stays inside the cluster (radius ~0.3); the mean moves ~67 away.
    assert np.linalg.norm(med[0]) < 0.5
    assert np.linalg.norm(mean[0]) > 10.0


def test_euclidean_kmedian_recovers_blobs_and_beats_its_seed():
    pts, w = blobs(np.random.default_rng(9))
    centers, assigned = weighted_kmedian(pts, w, 3, np.random.default_rng(10))
    assert match_error(centers, BLOB_CENTERS) < 0.2  # geometric medians of std-0.3 blobs
    assert assigned.sum() == pytest.approx(w.sum())
    # Not worse than the k-means centers under the k-median objective (+0.1% slack).
    km, _ = weighted_kmeans(pts, w, 3, np.random.default_rng(10))
    assert weighted_cost(pts, w, centers, 1) <= 1.001 * weighted_cost(pts, w, km, 1)


def test_weiszfeld_single_cluster_matches_scipy_minimizer():
    from scipy.optimize import minimize

    rng = np.random.default_rng(11)
    pts = rng.normal(size=(30, 3))
    w = rng.uniform(0.1, 3.0, size=30)
    centers, _ = weighted_kmedian(pts, w, 1, np.random.default_rng(0))
    ref = minimize(lambda c: np.dot(w, np.linalg.norm(pts - c, axis=1)), pts.mean(axis=0), method="Nelder-Mead",
                   options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000})
    # Both optimise a convex function; costs agree to 1e-6 relative.
    assert weighted_cost(pts, w, centers, 1) == pytest.approx(ref.fun, rel=1e-6)


def test_geometric_median_at_a_heavy_data_point():
    # One point carries more weight than all others together: it IS the median.
    pts = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, -1.0], [3.0, 2.0]])
    w = np.array([10.0, 1.0, 1.0, 1.0, 1.0])
    for seed in range(3):
        centers, _ = weighted_kmedian(pts, w, 1, np.random.default_rng(seed))
        assert np.abs(centers[0]).max() < 1e-6


def test_kmedian_clips_negative_weights_and_handles_zero_weights():
    pts = np.array([[0.0], [1.0], [2.0], [100.0]])
    centers, assigned = weighted_kmedian(pts, [1.0, 1.0, 1.0, -50.0], 1, np.random.default_rng(0))
    assert centers[0, 0] == pytest.approx(1.0, abs=1e-6)  # median of 0, 1, 2 (100 clipped to weight 0)
    assert assigned == pytest.approx([3.0])
    centers, assigned = weighted_kmedian(pts, np.zeros(4), 2, np.random.default_rng(0))
    assert centers.shape == (2, 1) and assigned == pytest.approx([0.0, 0.0])


def test_discrete_kmedian_is_fast_enough():
    rng = np.random.default_rng(12)
    true = 5 * rng.normal(size=(10, 5))
    pts = true[rng.integers(10, size=5000)] + rng.normal(size=(5000, 5))
    cand = np.vstack([pts[:300], rng.uniform(-10, 10, size=(700, 5))])
    start = time.perf_counter()
    centers, _ = weighted_kmedian(pts, rng.exponential(size=5000), 10, np.random.default_rng(0), candidates=cand)
    elapsed = time.perf_counter() - start
    assert is_candidate_row(centers, cand).all()
    assert elapsed < 15.0  # about 0.5 s on one core; generous for loaded CI machines


# ---------------------------------------------------------------- cost, nearest


def test_weighted_cost_matches_brute_force():
    rng = np.random.default_rng(13)
    pts = rng.normal(size=(57, 4)) * 10 + 100.0  # offset from origin on purpose
    w = rng.normal(size=57)  # cost uses the weights as given, negatives too
    ctr = rng.normal(size=(6, 4)) * 10 + 100.0
    for p in (1, 2):
        brute = 0.0
        for i in range(57):
            brute += w[i] * min(np.sqrt(sum((pts[i, t] - ctr[j, t]) ** 2 for t in range(4))) ** p for j in range(6))
        assert weighted_cost(pts, w, ctr, p) == pytest.approx(brute, rel=1e-10)


def test_nearest_matches_brute_force_across_chunks(monkeypatch):
    monkeypatch.setattr(solvers, "_CHUNK_ENTRIES", 64)  # force many small chunks
    rng = np.random.default_rng(14)
    pts = rng.normal(size=(1000, 3))
    ctr = rng.normal(size=(7, 3))
    brute = np.argmin(np.linalg.norm(pts[:, None, :] - ctr[None, :, :], axis=2), axis=1)
    assert np.array_equal(nearest(pts, ctr), brute)


def test_nearest_ties_go_to_lowest_index():
    assert nearest([[0.0], [5.0]], [[-1.0], [1.0], [4.0], [6.0]]).tolist() == [0, 2]


# ---------------------------------------------------------------- nearest_pair_merge


def test_nearest_pair_merge_hand_computed():
    cents = np.array([[0.0], [1.0], [5.0], [7.0]])
    w = np.array([1.0, 3.0, 2.0, 2.0])
    # Nearest pair (0, 1) at distance 1 -> (0*1 + 1*3)/4 = 0.75, weight 4.
    # Then 0.75, 5, 7: nearest pair (5, 7) at 2 -> 6, weight 4.
    c2, w2 = nearest_pair_merge(cents, w, 2)
    assert c2.tolist() == [[0.75], [6.0]] and w2.tolist() == [4.0, 4.0]
    # Then 0.75 and 6 -> (0.75*4 + 6*4)/8 = 3.375, weight 8.
    c1, w1 = nearest_pair_merge(cents, w, 1)
    assert c1.tolist() == [[3.375]] and w1.tolist() == [8.0]
    # Inputs are not modified.
    assert cents.tolist() == [[0.0], [1.0], [5.0], [7.0]]


def test_nearest_pair_merge_zero_and_negative_weights():
    # Two zero-weight centroids still average evenly (floor on coefficients).
    c, w = nearest_pair_merge([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0]], [0.0, 0.0, 5.0], 2)
    assert c.tolist() == [[1.0, 0.0], [10.0, 0.0]] and w.tolist() == [0.0, 5.0]
    # A negative weight counts as the floor in the average, but the returned weight is the plain sum.
    c, w = nearest_pair_merge([[0.0], [1.0]], [-4.0, 6.0], 1)
    assert c[0, 0] == pytest.approx(1.0, abs=1e-9) and w.tolist() == [2.0]


def test_nearest_pair_merge_ties_are_deterministic_and_k_ge_m_is_identity():
    cents = [[0.0], [1.0], [2.0]]  # pairs (0,1) and (1,2) tie: the first is merged
    c, w = nearest_pair_merge(cents, [1.0, 1.0, 1.0], 2)
    assert c.tolist() == [[0.5], [2.0]] and w.tolist() == [2.0, 1.0]
    c, w = nearest_pair_merge(cents, [1.0, 2.0, 3.0], 5)
    assert c.tolist() == cents and w.tolist() == [1.0, 2.0, 3.0]


# ---------------------------------------------------------------- solve, validation


def test_solve_dispatches():
    pts, w = blobs(np.random.default_rng(15), n_per=30)
    a, _ = solve("kmeans", pts, w, 3, np.random.default_rng(1))
    b, _ = weighted_kmeans(pts, w, 3, np.random.default_rng(1))
    assert np.array_equal(a, b)
    cand = pts[::7]
    c, _ = solve("kmedian", pts, w, 3, np.random.default_rng(1), candidates=cand, n_init=2)
    d, _ = weighted_kmedian(pts, w, 3, np.random.default_rng(1), candidates=cand, n_init=2)
    assert np.array_equal(c, d)
    with pytest.raises(ValueError, match="objective='kmedoids' should be one of 'kmeans', 'kmedian'"):
        solve("kmedoids", pts, w, 3, np.random.default_rng(1))
    with pytest.raises(ValueError, match="candidates are only supported for objective='kmedian'"):
        solve("kmeans", pts, w, 3, np.random.default_rng(1), candidates=cand)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda r: weighted_kmeans(np.zeros((4, 2)), np.ones(4), 0, r), "k=0 should be >= 1"),
        (lambda r: weighted_kmeans(np.zeros((4, 2)), np.ones(4), 2.5, r), "k=2.5 should be an integer"),
        (lambda r: weighted_kmeans(np.zeros((4, 2)), np.ones(3), 2, r), r"weights shape \(3,\) does not match points shape \(4, 2\)"),
        (lambda r: weighted_kmeans(np.zeros(4), np.ones(4), 2, r), r"points should be a 2-D array .* got shape \(4,\)"),
        (lambda r: weighted_kmeans(np.full((4, 2), np.nan), np.ones(4), 2, r), "points should contain only finite values"),
        (lambda r: weighted_kmeans(np.zeros((4, 2)), np.ones(4), 2, r, n_init=0), "n_init=0 should be >= 1"),
        (lambda r: weighted_kmedian(np.zeros((4, 2)), np.ones(4), 2, r, max_iter=-3), "max_iter=-3 should be >= 1"),
        (lambda r: weighted_kmedian(np.zeros((4, 2)), np.ones(4), 2, r, candidates=np.zeros((5, 3))),
         r"candidates shape \(5, 3\) does not match points shape \(4, 2\)"),
        (lambda r: weighted_cost(np.zeros((4, 2)), np.ones(4), np.zeros((2, 3)), 2),
         r"centers shape \(2, 3\) does not match points shape \(4, 2\)"),
        (lambda r: weighted_cost(np.zeros((4, 2)), np.ones(4), np.zeros((2, 2)), 0), "p=0 should be a number > 0"),
        (lambda r: nearest_pair_merge(np.zeros((4, 2)), np.ones(4), -1), "k=-1 should be >= 1"),
    ],
)
def test_validation_messages_name_the_bad_value(call, message):
    with pytest.raises(ValueError, match=message):
        call(np.random.default_rng(0))


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="rng should be a numpy.random.Generator, got int"):
        weighted_kmeans(np.zeros((4, 2)), np.ones(4), 2, 42)
