"""Tests of the driver-side maxcover core (no Spark).

Every random input comes from a seeded numpy Generator and all noise from
SeededNoise / NoNoise (testing aids, NOT private), so each run is reproducible;
the statistical tests state the confidence at which they would fail by chance.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from dpspark.errors import PrivacyAccountingError
from dpspark.maxcover.core import (
    COVERAGE_LABEL,
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
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.mechanisms import ExponentialMechanism, NoNoise, SeededNoise

DELTA = 1e-6


class UncheckedBlock:
    """Unit-test stand-in for a charged block (Algorithm 1 alone): draws through ``noise``.

    A real ``Accountant.block`` only releases the mechanisms and the number of releases
    its theorem declares (issue 13, defect 11); these tests drive Algorithm 1 with
    arbitrary weights, so they use this stand-in. run_coverage's own block is real.
    """

    def __init__(self, noise):
        self.noise = noise
        self.releases = 0

    def exponential(self, scores, mech):
        self.releases += 1
        return mech.select(scores, self.noise)


def make_block(noise, eps=1.0, delta=DELTA):
    return UncheckedBlock(noise)


def clustered_points(rng, n, dim, n_clusters=4, spread=0.15):
    centres = rng.uniform(-0.8, 0.8, size=(n_clusters, dim))
    labels = rng.integers(0, n_clusters, size=n)
    return np.clip(centres[labels] + rng.normal(0.0, spread, size=(n, dim)), -1.0, 1.0)


def random_signature_instance(rng, n_sigs, n_cand, max_len):
    sigs = []
    for _ in range(n_sigs):
        size = int(rng.integers(0, max_len + 1))
        sigs.append(tuple(sorted(rng.choice(n_cand, size=size, replace=False).tolist())))
    counts = rng.integers(0, 30, size=n_sigs).astype(np.int64)
    return sigs, counts


def greedy_reference(sigs, counts, n_cand, m):
    """Plain-Python greedy max coverage; ties to the lowest id; no repeats within the threshold."""
    alive = {s: 0 for s in range(len(sigs))}
    for s, c in enumerate(counts):
        alive[s] = int(c)
    picked = []
    for _ in range(min(m, n_cand)):
        scores = [0] * n_cand
        for s, sig in enumerate(sigs):
            for v in sig:
                scores[v] += alive[s]
        best = max((sc, -v) for v, sc in enumerate(scores) if v not in picked)
        v = -best[1]
        picked.append(v)
        for s, sig in enumerate(sigs):
            if v in sig:
                alive[s] = 0
    return picked


# ----------------------------------------------------------------------------
# The public schedule


@pytest.mark.parametrize(
    "diameter,p,n_cand,a,n_upper",
    [(2.0, 1, 100, 0.5, None), (2.0 * math.sqrt(3), 2, 1728, 0.1, None), (2.0, 2, 50, 0.3, 10**6), (5.0, 1, 7, 0.9, None)],
)
def test_thresholds_formula(diameter, p, n_cand, a, n_upper):
    ts = thresholds(diameter, p, n_cand, a, n_upper=n_upper)
    top = diameter**p
    n0 = n_cand if n_upper is None else n_upper
    assert ts[0] == pytest.approx(top / n0, rel=1e-12)
    np.testing.assert_allclose(ts[1:] / ts[:-1], 1.0 + a, rtol=1e-12)
    assert ts[-1] >= top
    assert ts.size == 1 or ts[-2] < top  # r is the smallest count reaching Delta^p
    assert ts.size == math.ceil(math.log(n0) / math.log(1.0 + a)) + 1
    assert np.all(np.diff(ts) > 0)


def test_thresholds_use_public_bound_and_edge_cases():
    assert thresholds(2.0, 2, 100, 0.5, n_upper=10**6)[0] == pytest.approx(4.0 / 1e6)
    np.testing.assert_allclose(thresholds(3.0, 1, 1, 0.5), [3.0])  # N0 = 1: the single threshold Delta^p
    for bad in [dict(diameter=0.0), dict(p=0), dict(coverage_approx=1.0), dict(coverage_approx=0.0), dict(n_candidates=0), dict(n_upper=0)]:
        kwargs = dict(diameter=2.0, p=2, n_candidates=10, coverage_approx=0.5) | bad
        with pytest.raises(ValueError):
            thresholds(**kwargs)


def test_picks_per_threshold_formula():
    for k in (1, 3, 5, 10, 25):
        for a in (0.05, 0.1, 0.3, 0.5, 0.9):
            assert picks_per_threshold(k, a) == math.ceil(2 * k * math.log(1 / a))
    assert picks_per_threshold(5, 0.1) == 24  # 10 ln 10 = 23.03
    with pytest.raises(ValueError):
        picks_per_threshold(0, 0.1)
    with pytest.raises(ValueError):
        picks_per_threshold(3, 1.5)


def test_coverage_epsilon_formula():
    for eps in (0.1, 0.5, 2.0):
        for delta in (1e-3, 1e-6, 1e-9):
            assert coverage_epsilon(eps, delta) == pytest.approx(eps / (2 * math.log(math.e / delta)), rel=1e-12)
    with pytest.raises(ValueError):
        coverage_epsilon(1.0, 0.0)
    with pytest.raises(ValueError):
        coverage_epsilon(-1.0, 1e-6)


# ----------------------------------------------------------------------------
# Signature version == brute force, exactly


def bruteforce_loop(points, cands, ts, p, m, block, mech):
    uncovered = np.ones(points.shape[0], dtype=bool)
    picks, remaining_per_threshold = [], []
    for i, t in enumerate(ts):
        remaining_per_threshold.append(int(uncovered.sum()))
        chosen, uncovered = cover_bruteforce(points, cands, t, p, m, block, mech, uncovered)
        picks.extend((c, i) for c in chosen)
    return picks, remaining_per_threshold


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [1, 2])
def test_run_coverage_matches_bruteforce_exactly(seed, p):
    rng = np.random.default_rng(1000 + seed)
    dim = 2
    points = clustered_points(rng, 120, dim)
    cands = random_candidates(dim, 25, rng)
    ts = thresholds(2.0 * math.sqrt(dim), p, 25, 0.5, n_upper=200)
    m, eps_cov = 4, 20.0  # eps' = 0.67: picks strongly follow the scores, so a wrong count shows

    acc = Accountant(eps_cov, DELTA, SeededNoise(seed))
    provider = NumpySignatureProvider(points, cands, ts, p, chunk_rows=17)  # odd chunks on purpose
    seen_remaining = []

    def recording_provider(i, covered):
        sigs, counts = provider(i, covered)
        seen_remaining.append(int(counts.sum()))
        return sigs, counts

    picks = run_coverage(recording_provider, 25, ts, m, acc, eps_cov, DELTA)

    block = make_block(SeededNoise(seed), eps_cov)
    mech = ExponentialMechanism.with_weight(coverage_epsilon(eps_cov, DELTA))
    ref_picks, _ = bruteforce_loop(points, cands, ts, p, m, block, mech)
    assert picks == ref_picks
    assert len(picks) == ts.size * m

    # The exact uncovered set, threshold by threshold: uncovered points with a non-empty signature.
    cost = cost_matrix(points, cands, p)
    uncovered = np.ones(points.shape[0], dtype=bool)
    for i, t in enumerate(ts):
        assert seen_remaining[i] == int((uncovered & (cost <= t).any(axis=1)).sum())
        for c, j in picks:
            if j == i:
                uncovered &= cost[:, c] > t


@pytest.mark.parametrize("seed", range(5))
def test_cover_from_signatures_matches_bruteforce_single_threshold(seed):
    rng = np.random.default_rng(seed)
    points = clustered_points(rng, 150, 3)
    cands = grid_candidates(3, 64)
    t = 0.6
    mask = rng.random(150) < 0.8  # some points already covered at earlier thresholds
    provider_pts = points[mask]
    sigs, counts = NumpySignatureProvider(provider_pts, cands, [t], 2)(0, [])
    mech = ExponentialMechanism.with_weight(1.0)
    a = cover_from_signatures(sigs, counts, 64, 10, make_block(SeededNoise(seed)), mech)
    b, new_mask = cover_bruteforce(points, cands, t, 2, 10, make_block(SeededNoise(seed)), mech, mask)
    assert a == b
    within = cost_matrix(points, cands, 2) <= t
    assert np.array_equal(new_mask, mask & ~within[:, a].any(axis=1))


def stale_cover(sigs, counts, n_cand, m, block, mech):
    """WRONG on purpose: coverage counts computed once and never updated after a pick."""
    inc = signatures_to_csr(sigs, n_cand)
    scores = np.asarray(inc.T @ np.asarray(counts, dtype=np.int64), dtype=np.int64)
    available = np.ones(n_cand, dtype=bool)
    picks = []
    for _ in range(m):
        idx = np.flatnonzero(available)
        v = int(idx[block.exponential(scores[idx], mech)])
        picks.append(v)
        available[v] = False
    return picks


def test_stale_counts_give_different_picks():
    # candidate 0 covers 10 points, candidate 1 covers 9 of the same, candidate 2 covers 5 others.
    sigs = [(0, 1), (0,), (2,)]
    counts = np.array([9, 1, 5])
    mech = ExponentialMechanism.with_weight(1.0)
    exact = cover_from_signatures(sigs, counts, 3, 2, make_block(NoNoise()), mech)
    stale = stale_cover(sigs, counts, 3, 2, make_block(NoNoise()), mech)
    assert exact == [0, 2]
    assert stale == [0, 1]
    points = np.array([[0.0, 0.0]] * 9 + [[0.5, 0.0]] + [[-0.9, 0.9]] * 5)
    cands = np.array([[0.3, 0.0], [-0.05, 0.0], [-0.9, 0.9]])
    brute, _ = cover_bruteforce(points, cands, 0.4, 1, 2, make_block(NoNoise()), mech, np.ones(15, bool))
    assert brute == exact  # the brute force agrees with the exact version, not the stale one

    # With noise as well: on random instances the stale version departs from the exact one
    # (so the equality tests above would catch a missing update).
    differ = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        s, c = random_signature_instance(rng, 60, 15, 6)
        a = cover_from_signatures(s, c, 15, 6, make_block(SeededNoise(seed)), mech)
        b = stale_cover(s, c, 15, 6, make_block(SeededNoise(seed)), mech)
        differ += a != b
    assert differ > 0


# ----------------------------------------------------------------------------
# Limits of the mechanism


@pytest.mark.parametrize("seed", range(8))
def test_no_noise_is_exact_greedy(seed):
    rng = np.random.default_rng(seed)
    n_cand = 12
    sigs, counts = random_signature_instance(rng, 80, n_cand, 5)
    m = 15  # more than |V|: capped at |V| picks, each candidate once
    picks = cover_from_signatures(sigs, counts, n_cand, m, make_block(NoNoise()), ExponentialMechanism.with_weight(0.1))
    assert picks == greedy_reference(sigs, counts, n_cand, m)
    assert sorted(picks) == list(range(n_cand))


@pytest.mark.parametrize("seed", range(8))
def test_huge_weight_picks_the_max_coverage_candidate(seed):
    # weight 50: a candidate at least 1 below the max is picked with probability
    # <= (|V| - 1) e^-50 < 1e-19 per pick; over 8 x 10 picks the test fails by chance
    # with probability < 1e-17 (confidence > 1 - 1e-17). Ties are picked among the maxima.
    rng = np.random.default_rng(100 + seed)
    n_cand = 30
    sigs, counts = random_signature_instance(rng, 200, n_cand, 6)
    picks = cover_from_signatures(sigs, counts, n_cand, 10, make_block(SeededNoise(seed)), ExponentialMechanism.with_weight(50.0))
    alive = counts.copy()
    inc = signatures_to_csr(sigs, n_cand).toarray().astype(bool)
    available = np.ones(n_cand, bool)
    for v in picks:
        scores = inc.T.astype(np.int64) @ alive
        assert available[v] and scores[v] == scores[available].max()
        available[v] = False
        alive[inc[:, v]] = 0


def test_tiny_weight_picks_are_uniform():
    # weight 1e-9 with scores up to ~1000: exp(weight * score) differs from 1 by < 1e-5, so the
    # first pick is uniform over the 10 candidates. Chi-square goodness of fit, 9 df, 4000 draws:
    # rejects at p < 0.001, i.e. a correct implementation fails with probability 0.1%
    # (confidence 99.9%); the draws are seeded, so the outcome is fixed.
    n_cand, draws = 10, 4000
    sigs = [(0,), (0, 1), (2, 3, 4), (9,)]
    counts = np.array([1000, 500, 3, 0])
    mech = ExponentialMechanism.with_weight(1e-9)
    block = make_block(SeededNoise(2024))
    firsts = np.array([cover_from_signatures(sigs, counts, n_cand, 1, block, mech)[0] for _ in range(draws)])
    observed = np.bincount(firsts, minlength=n_cand)
    assert stats.chisquare(observed).pvalue > 1e-3
    assert block.releases == draws


# ----------------------------------------------------------------------------
# Empty input and accounting


def test_empty_input_still_yields_m_picks_per_threshold():
    ts = thresholds(2.0, 2, 40, 0.5)
    m = 7
    acc = Accountant(1.0, DELTA, SeededNoise(5))
    picks = run_coverage(lambda i, covered: ([], []), 40, ts, m, acc, 1.0, DELTA)
    assert len(picks) == ts.size * m
    for i in range(ts.size):
        at_i = [c for c, j in picks if j == i]
        assert len(at_i) == m and len(set(at_i)) == m  # no repeat within a threshold
    # all-zero counts, and a provider on no points at all
    zero = cover_from_signatures([(0, 1), (3,)], np.array([0, 0]), 40, m, make_block(SeededNoise(1)), ExponentialMechanism.with_weight(0.5))
    assert len(zero) == m and len(set(zero)) == m
    no_points = NumpySignatureProvider(np.zeros((0, 2)), grid_candidates(2, 40), ts, 2)
    acc = Accountant(1.0, DELTA, SeededNoise(6))
    assert len(run_coverage(no_points, 36, ts, m, acc, 1.0, DELTA)) == ts.size * m


def test_repeats_allowed_across_thresholds():
    # One candidate far better than the rest at every threshold: with no noise it is picked
    # first at every threshold (the paper re-selects centers across thresholds).
    points = np.zeros((50, 2))
    cands = np.array([[0.0, 0.0], [0.9, 0.9], [-0.9, 0.9]])
    ts = [0.01, 0.02, 0.04]
    provider = NumpySignatureProvider(points, cands, ts, 2)
    acc = Accountant(1.0, DELTA, NoNoise())
    picks = run_coverage(provider, 3, ts, 2, acc, 1.0, DELTA)
    assert [c for c, j in picks if j == 0][0] == 0
    assert [(c, j) for c, j in picks if c == 0] == [(0, 0), (0, 1), (0, 2)]


def test_total_charge_is_eps_cov_plus_eps_cnt():
    rng = np.random.default_rng(7)
    points = clustered_points(rng, 300, 2)
    cands = grid_candidates(2, 100)
    eps_cov, eps_cnt = 0.6, 0.4
    acc = Accountant(eps_cov + eps_cnt, DELTA, SeededNoise(7))
    ts = thresholds(2.0 * math.sqrt(2), 2, len(cands), 0.5, n_upper=1000)
    m = picks_per_threshold(3, 0.5)
    picks = run_coverage(NumpySignatureProvider(points, cands, ts, 2), len(cands), ts, m, acc, eps_cov, DELTA)
    centers = cands[chosen_candidate_ids(picks)]
    exact = snap_counts(points, centers, 2)
    assert exact.sum() == 300
    noisy = noisy_weights(exact, acc, eps_cnt)
    assert noisy.dtype == np.int64 and noisy.shape == exact.shape
    assert abs(acc.spent_epsilon - (eps_cov + eps_cnt)) <= 1e-9
    assert abs(acc.spent_delta - DELTA) <= 1e-9 * DELTA
    acc.finish()
    assert [c["step"] for c in acc.summary()] == [COVERAGE_LABEL, SNAP_LABEL]
    assert acc.charges[0].epsilon == eps_cov and acc.charges[0].delta == DELTA
    assert "Lemma 4.1" in acc.charges[0].rule
    assert acc.charges[1].epsilon == pytest.approx(eps_cnt) and acc.charges[1].delta == 0.0


def test_run_coverage_validates_before_charging():
    acc = Accountant(100.0, DELTA, NoNoise())
    with pytest.raises(ValueError, match="eps'"):
        run_coverage(lambda i, c: ([], []), 5, [1.0], 2, acc, 60.0, DELTA)  # eps' = 2.03 > 1
    with pytest.raises(ValueError):
        run_coverage(lambda i, c: ([], []), 5, [], 2, acc, 1.0, DELTA)
    assert acc.charges == []
    small = Accountant(0.5, DELTA, NoNoise())
    with pytest.raises(PrivacyAccountingError):
        run_coverage(lambda i, c: pytest.fail("no data may be read after a refused charge"), 5, [1.0], 2, small, 1.0, DELTA)


# ----------------------------------------------------------------------------
# Snapping and noisy counts


def test_snap_counts_nearest_center_and_ties():
    rng = np.random.default_rng(3)
    points = rng.uniform(-1, 1, size=(500, 3))
    centers = rng.uniform(-1, 1, size=(7, 3))
    ref = np.zeros(7, np.int64)
    for x in points:
        ref[int(np.argmin([np.sum((x - c) ** 2) for c in centers]))] += 1
    for p in (1, 2):
        got = snap_counts(points, centers, p)
        assert got.dtype == np.int64 and np.array_equal(got, ref)
    # ties go to the lowest index: duplicate centers, and a point halfway between two centers
    pts = np.array([[0.0, 0.0], [0.5, 0.5], [0.5, 0.5]])
    cts = np.array([[-0.5, 0.0], [0.5, 0.0], [0.5, 0.5], [0.5, 0.5]])
    assert snap_counts(pts, cts, 2).tolist() == [1, 0, 2, 0]


def test_noisy_weights_release_and_input_checks():
    acc = Accountant(1.0, 0.0, NoNoise())
    exact = np.array([5, 0, 12], dtype=np.int64)
    assert noisy_weights(exact, acc, 1.0).tolist() == [5, 0, 12]
    assert acc.charges[0].label == SNAP_LABEL
    acc2 = Accountant(1.0, 0.0, NoNoise())
    with pytest.raises(TypeError):
        noisy_weights(np.array([1.5, 2.0]), acc2, 1.0)
    assert acc2.charges == []  # refused before charging
    # noise of the right scale: discrete Laplace(1/eps) has variance 2 e^{-1/b} / (1 - e^{-1/b})^2, b = 1/eps
    acc3 = Accountant(0.5, 0.0, SeededNoise(11))
    noise = noisy_weights(np.full(20000, 100, dtype=np.int64), acc3, 0.5) - 100
    q = math.exp(-0.5)
    var = 2 * q / (1 - q) ** 2
    # 20000 draws: the sample variance is within 10% of var with probability > 99.9% (its relative
    # standard error is about sqrt((kurtosis - 1) / n) ~ 1.8%, so 10% is more than 5 standard errors).
    assert abs(noise.var() / var - 1) < 0.1


# ----------------------------------------------------------------------------
# Inputs, candidates, scale


def test_signatures_to_csr_checks():
    inc = signatures_to_csr([(2, 0), (), (1,)], 3)
    assert inc.toarray().tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]
    with pytest.raises(ValueError):
        signatures_to_csr([(0, 0)], 3)
    with pytest.raises(ValueError):
        signatures_to_csr([(0, 3)], 3)
    dense = np.array([[1, 0, 2], [0, 0, 0]])
    m = sp.csr_matrix(dense)
    assert signatures_to_csr(m, 3).toarray().tolist() == [[1, 0, 1], [0, 0, 0]]
    assert m.toarray().tolist() == dense.tolist()  # the caller's matrix is untouched
    with pytest.raises(TypeError):
        cover_from_signatures([(0,)], np.array([1.0]), 3, 1, make_block(NoNoise()), ExponentialMechanism.with_weight(1.0))


def test_grid_and_random_candidates():
    g = grid_candidates(2, 2000)
    assert g.shape == (44 * 44, 2) and np.all(np.abs(g) <= 1)
    assert grid_candidates(3, 1000).shape == (1000, 3)  # 1000^(1/3) is 9.99999... in floating point
    assert grid_candidates(11, 2000).shape == (2**11, 11)  # at least 2 per axis
    assert np.allclose(np.unique(g[:, 0]), -1 + (2 * np.arange(44) + 1) / 44)
    shifted = grid_candidates(2, 100, rng=np.random.default_rng(0))
    assert shifted.shape == (100, 2) and np.all(np.abs(shifted) <= 1)
    r1 = random_candidates(4, 50, np.random.default_rng(9))
    r2 = random_candidates(4, 50, np.random.default_rng(9))
    assert r1.shape == (50, 4) and np.array_equal(r1, r2) and np.all(np.abs(r1) <= 1)
    with pytest.raises(TypeError):
        random_candidates(2, 5, None)


def test_many_signatures_incremental_updates_stay_exact():
    # 300,000 signature groups x 800 candidates: the incremental score updates must give the
    # same picks as recomputing incidence^T @ alive from scratch before every pick.
    rng = np.random.default_rng(42)
    n_sigs, n_cand = 300_000, 800
    lengths = rng.integers(1, 30, size=n_sigs)
    nnz = int(lengths.sum())
    starts = np.repeat(rng.integers(0, n_cand, size=n_sigs), lengths)
    offsets = np.arange(nnz) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    inc = sp.csr_matrix((np.ones(nnz, np.int8), (starts + offsets) % n_cand, indptr), shape=(n_sigs, n_cand))
    counts = rng.integers(0, 40, size=n_sigs)
    mech = ExponentialMechanism.with_weight(0.01)
    m = 20
    picks = cover_from_signatures(inc, counts, n_cand, m, make_block(SeededNoise(3)), mech)

    block = make_block(SeededNoise(3))
    alive = counts.astype(np.int64).copy()
    available = np.ones(n_cand, bool)
    ref = []
    csc = inc.tocsc()
    for _ in range(m):
        scores = np.asarray(inc.T @ alive, dtype=np.int64)
        idx = np.flatnonzero(available)
        v = int(idx[block.exponential(scores[idx], mech)])
        ref.append(v)
        available[v] = False
        alive[csc[:, v].indices] = 0
    assert picks == ref


def test_core_does_not_import_pyspark():
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", "import sys, dpspark.maxcover; print('pyspark' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dim", [2, 10])
def test_signature_aggregator_keys_are_the_packed_rule_whatever_the_box_keeps(dim):
    """The executors' signature keys are ``packbits`` of the rule's (point, candidate) indicator, both when a
    chunk's bounding box keeps every candidate (packed directly) and when it keeps some (scattered first)."""
    import pandas as pd

    from dpspark.maxcover.kernels import _pack_rows, signature_aggregator

    rng = np.random.default_rng(dim)
    x = np.clip(rng.normal(0.0, 0.3, size=(3000, dim)), -1, 1)
    cand = np.clip(rng.normal(0.0, 0.3, size=(45, dim)), -1, 1)
    columns = [f"_u{j}" for j in range(dim)]
    for t in (0.05 * dim, 0.3 * dim, 8.0 * dim):  # few, many and all candidates kept by the boxes
        within = cost_matrix(x, cand, 2) <= t
        want = {}
        for row in np.packbits(within, axis=1):
            want[row.tobytes()] = want.get(row.tobytes(), 0) + 1
        fn = signature_aggregator(cand, np.zeros((0, dim)), np.zeros(0), t, 2, columns)
        got = {}
        for pdf in fn(iter([pd.DataFrame(x[a : a + 1000], columns=columns) for a in range(0, 3000, 1000)])):
            for key, n in zip(pdf["sig"], pdf["n"]):
                got[bytes(key)] = got.get(bytes(key), 0) + int(n)
        assert got == want
    w = rng.random((9, 45)) < 0.3
    for keep in (np.arange(45), np.sort(rng.choice(45, 20, replace=False))):
        full = np.zeros((9, 45), dtype=bool)
        full[:, keep] = w[:, : keep.size]
        assert np.array_equal(_pack_rows(w[:, : keep.size], keep, 45), np.packbits(full, axis=1))


@pytest.mark.parametrize("dim, p", [(2, 2), (10, 2), (10, 1)])
def test_a_groups_keys_are_each_thresholds_keys_end_to_end(dim, p):
    """``signature_aggregator`` over K thresholds: every point's key is its K single-threshold keys
    end to end. Checked per point (batches of one row), with earlier picks dropping points and a
    point within no threshold under the all-zero key."""
    import pandas as pd

    from dpspark.maxcover.kernels import signature_aggregator

    rng = np.random.default_rng(dim * 10 + p)
    x = np.clip(rng.normal(0.0, 0.35, size=(120, dim)), -1, 1)
    x[0] = 1.0  # far from every candidate
    cand = np.clip(rng.normal(0.0, 0.3, size=(21, dim)), -1, 1)
    picks, pick_t = cand[:2], np.array([0.01 * dim, 0.02 * dim]) ** (p / 2.0)
    columns = [f"_u{j}" for j in range(dim)]
    ts = list(np.array([0.01, 0.04, 0.15, 0.4]) * dim ** (p / 2.0))
    n_bytes = (21 + 7) // 8

    def key_of(point, t):
        out = list(signature_aggregator(cand, picks, pick_t, t, p, columns)(iter([pd.DataFrame(point[None, :], columns=columns)])))
        return None if not out else bytes(out[0]["sig"][0])  # None: dropped by a pick

    zeros = 0
    for point in x:
        joint = key_of(point, ts)
        singles = [key_of(point, t) for t in ts]
        if joint is None:
            assert all(k is None for k in singles)
            continue
        assert len(joint) == len(ts) * n_bytes and joint == b"".join(singles)
        zeros += joint == bytes(len(joint))
    assert zeros >= 1
    with pytest.raises(ValueError, match="ascending"):
        signature_aggregator(cand, picks, pick_t, ts[::-1], p, columns)


def test_arrow_batches_read_as_the_pandas_batches_did_hostile_values_included():
    """The passes read Arrow batches (``mapInArrow``): the points are the pandas path's bit for bit,
    a null, NaN, +-inf, 1e308 and -0.0 included, and ``arrow_out`` turns a kernel's frames into
    RecordBatches with the same values."""
    import pandas as pd
    import pyarrow as pa

    from dpspark.maxcover.kernels import _batches_of_points, arrow_out, signature_aggregator

    columns = ["_u0", "_u1", "_u2"]
    values = [[0.25, None, -0.5], [float("nan"), 1e308, -1e308], [float("inf"), -float("inf"), -0.0],
              [0.1, 0.2, 0.3], [-1.0, 1.0, 0.999999]]
    table = pa.table({c: pa.array([row[j] for row in values], pa.float64()) for j, c in enumerate(columns)})
    arrow = list(_batches_of_points(table.to_batches(max_chunksize=2), columns))
    frames = list(_batches_of_points([table.slice(a, 2).to_pandas() for a in range(0, 5, 2)], columns))
    assert len(arrow) == len(frames) == 3
    for a, b in zip(arrow, frames):
        assert a.tobytes() == b.tobytes()
    assert np.concatenate(arrow)[0, 1] == 0.0 and np.concatenate(arrow)[1, 1] == 1.0  # null -> 0, 1e308 clipped
    cand = np.array([[0.0, 0.0, 0.0], [0.2, 0.2, 0.2]])
    fn = signature_aggregator(cand, np.zeros((0, 3)), np.zeros(0), 0.5, 2, columns)
    via_arrow = pa.Table.from_batches(list(arrow_out(fn)(iter(table.to_batches(max_chunksize=2))))).to_pandas()
    via_pandas = pd.concat(list(fn(iter([table.to_pandas()]))), ignore_index=True)
    assert sorted(zip(via_arrow["sig"], via_arrow["n"])) == sorted(zip(via_pandas["sig"], via_pandas["n"]))
    assert int(via_arrow["n"].sum()) == 5


def test_group_sums_and_hash_merges_are_exact_with_wrapping_prefixes_and_colliding_hashes():
    from dpspark.maxcover import kernels

    big = np.int64(2**62)
    a = np.array([[big, 1], [big, -2], [-big, 3], [5, 4], [-big, 0], [-big, 0]], dtype=np.int64)
    starts = np.array([0, 3, 4])
    # The prefix sums wrap past int64 (2^62 + 2^62); the group sums fit, and come out exact.
    np.testing.assert_array_equal(kernels._group_sums(a, starts), np.add.reduceat(a, starts, axis=0))
    np.testing.assert_array_equal(kernels._group_sums(a, np.arange(6)), a)

    r = np.random.default_rng(9)
    g = r.integers(-3, 4, size=(4000, 12)).astype(np.int32)
    g[2000:] = g[:2000]  # every cell at least twice
    g[:300, 1:] = 0  # and some very heavy ones
    counts = np.ones(4000, dtype=np.int64)
    sums = r.integers(-(2**19), 2**19, size=(4000, 12))
    key_type = np.dtype((np.void, 4 * 12))
    uniq, inverse = np.unique(np.ascontiguousarray(g).view(key_type).reshape(-1), return_inverse=True)
    inverse = inverse.reshape(-1)
    want_n = np.bincount(inverse).astype(np.int64)
    want_s = np.zeros((uniq.shape[0], 12), dtype=np.int64)
    np.add.at(want_s, inverse, sums)
    want_g = uniq.view(np.int32).reshape(-1, 12)
    by_coords = np.lexsort(want_g.T[::-1])
    want_g, want_n, want_s = want_g[by_coords], want_n[by_coords], want_s[by_coords]
    for bits in (64, 4, 1):  # 1 and 4 bits: nearly every pair of cells collides
        h = kernels.cell_hashes(g, bits)
        assert bits == 64 or h.max() < 2**bits
        hs, gs, ns, ss = kernels._merge_hashed(h, g, counts, sums)
        np.testing.assert_array_equal(hs, kernels.cell_hashes(gs, bits))
        order = np.lexsort(gs.T[::-1])
        np.testing.assert_array_equal(gs[order], want_g)
        np.testing.assert_array_equal(ns[order], want_n)
        np.testing.assert_array_equal(ss[order], want_s)
    assert len(np.unique(kernels.cell_hashes(want_g))) == want_g.shape[0]  # 64 bits: no collision among these


def test_cell_keys_pack_into_int64_exactly_and_give_the_same_cells(monkeypatch):
    """The cell pass's int64 keys (issue 15): every coordinate a point in [-1, 1]^d can get packs and unpacks
    exactly, d = 50 at side 1/16 does not pack, and the aggregator's rows are those of the hash-merged cells."""
    import pandas as pd

    from dpspark.maxcover import kernels
    from dpspark.maxcover.candidates import scale_sides

    rng = np.random.default_rng(3)
    dim = 10
    sides = scale_sides(5)
    shifts = [rng.uniform(0.0, s, size=dim) for s in sides]
    shifts[-1][:2] = [0.0, np.nextafter(sides[-1], 0.0)]  # the extremes of a shift
    for side, shift in zip(sides, shifts):
        layout = kernels._cell_key_layout(side, shift)
        assert layout is not None and layout[0] * dim <= 62
        x = np.vstack([np.full((1, dim), -1.0), np.full((1, dim), 1.0), rng.uniform(-1, 1, size=(500, dim)),
                       np.nextafter(np.ones((1, dim)), 0.0)])
        g = kernels.cell_indices(x, side, shift)
        assert np.array_equal(kernels._unpack_cells(kernels._pack_cells(g, layout), layout, dim), g)
        with pytest.raises(AssertionError):
            kernels._pack_cells(g + (1 << layout[0]), layout)
    assert kernels._cell_key_layout(sides[-1], np.zeros(50)) is None
    assert kernels._cell_key_layout(0.5, np.array([np.nan, 0.0])) is None

    x = np.clip(rng.normal(0.0, 0.4, size=(4000, dim)), -1, 1)
    x[:50] = x[50:100]  # repeated points: cells of several points at every scale
    columns = [f"_u{j}" for j in range(dim)]

    def rows():
        fn = kernels.cell_aggregator(sides, shifts, columns, 1 << 16)
        pdf = pd.concat(list(fn(iter([pd.DataFrame(x[a : a + 700], columns=columns) for a in range(0, 4000, 700)]))))
        return sorted(map(tuple, pdf.to_numpy(dtype=np.int64).tolist()))

    packed = rows()
    monkeypatch.setattr(kernels, "_CELL_MERGE_ROWS", 1000)  # compactions mid-partition: still the same rows
    assert rows() == packed
    monkeypatch.setattr(kernels, "_cell_key_layout", lambda side, shift: None)
    assert rows() == packed and len(packed) > 0 and max(r[1 + dim] for r in packed) > 1


def test_distinct_padded_drops_repeats_in_order_and_pads_with_public_points_to_k():
    """The charged generators' shared post-processing: the first of equal points kept, order kept,
    public points inside the domain added only up to k (none when there are k or more)."""
    from dpspark.maxcover.candidates import distinct_padded
    from dpspark.privacy.domain import Domain

    dom = Domain(dim=2, lower=(-1.0, -1.0), upper=(1.0, 1.0))
    pts = np.array([[0.5, 0.5], [0.1, -0.2], [0.5, 0.5], [-0.3, 0.0], [0.1, -0.2]])
    cand, padded = distinct_padded(pts, dom, 2, np.random.default_rng(0), "%d points")
    assert padded == 0 and cand.tolist() == [[0.5, 0.5], [0.1, -0.2], [-0.3, 0.0]]
    cand, padded = distinct_padded(pts, dom, 5, np.random.default_rng(0), "%d points")
    assert padded == 2 and cand.shape == (5, 2) and cand[:3].tolist() == [[0.5, 0.5], [0.1, -0.2], [-0.3, 0.0]]
    assert np.all(np.abs(cand) <= 1.0) and len(np.unique(cand, axis=0)) == 5
    cand, padded = distinct_padded(np.zeros((0, 2)), dom, 3, np.random.default_rng(0), "%d points")
    assert padded == 3 and cand.shape == (3, 2)
