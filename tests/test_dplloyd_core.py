"""dplloyd driver logic without Spark: budget shares, initial centroids, noiseless
limit, re-seeding, and a statistical privacy test of a full small run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpspark import solvers
from dpspark.dplloyd import core
from dpspark.dplloyd.params import DPLloydParams
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import LaplaceMechanism, NoNoise, SeededNoise
from dpspark.steps import lloyd as lloyd_step

from conftest import blobs

BOX2 = Domain(dim=2, lower=(-1.0, -1.0), upper=(1.0, 1.0))


@pytest.mark.parametrize("schedule", ["average", "allocation"])
@pytest.mark.parametrize("iterations", [3, 4, 5, 7, 12, 13, 30, 100])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 2.5])
def test_shares_sum_exactly_to_epsilon(schedule, iterations, epsilon):
    shares = core.iteration_shares(epsilon, iterations, schedule)
    assert len(shares) == iterations
    assert abs(math.fsum(shares) - epsilon) <= 1e-12 * epsilon
    assert all(s > 0 for s in shares)
    if schedule == "allocation":
        assert shares == sorted(shares)  # later iterations never get less


def test_allocation_is_the_papers_for_twelve_iterations():
    shares = core.iteration_shares(1.0, 12, "allocation")
    assert shares[:4] == pytest.approx([1 / 24] * 4, abs=1e-15)
    assert shares[4:8] == pytest.approx([1 / 12] * 4, abs=1e-15)
    assert shares[8:] == pytest.approx([1 / 8] * 4, abs=1e-15)


@pytest.mark.parametrize("dim", [1, 2, 5, 10, 24])
def test_su_split_sums_to_the_share_and_is_not_swapped(dim):
    eps_count, eps_sums = core.su_split(0.3, dim)
    assert eps_count + eps_sums == pytest.approx(0.3, abs=1e-15)
    c = (4 * dim * 0.225**2) ** (1 / 3)
    assert eps_count == pytest.approx(0.3 * c / (dim + c))
    assert eps_sums / dim == pytest.approx(0.3 / (dim + c))  # each coordinate sum


@pytest.mark.parametrize("noise", ["su", "paper"])
def test_every_variant_charges_exactly_epsilon(noise):
    for variant, (schedule, merges) in {"average_k": ("average", False), "allocation_k": ("allocation", False),
                                        "average_nk": ("average", True), "allocation_nk": ("allocation", True)}.items():
        params = DPLloydParams(variant=variant, schedule=schedule, iterations=7, noise=noise)
        acc = Accountant(0.7, 0.0, SeededNoise(1))
        pts = blobs(50, [(-0.5, -0.5), (0.5, 0.5)], 0.05, seed=2)
        core.run_lloyd(core.numpy_aggregate(pts), BOX2, 3, params, acc, np.random.default_rng(0), 0.7)
        acc.finish()
        assert acc.spent_epsilon == pytest.approx(0.7, abs=1e-12) and acc.spent_delta == 0.0
        assert len(acc.charges) == 7 * (2 if noise == "su" else 1)


def test_initial_centroids_are_data_independent_and_separated():
    d = Domain(dim=3, lower=(0, 0, 0), upper=(1, 1, 1))
    a = core.initial_centroids(d, 15, np.random.default_rng(5))
    b = core.initial_centroids(d, 15, np.random.default_rng(5))
    assert np.array_equal(a, b)  # depends only on the public rng: no data argument at all
    assert a.shape == (15, 3) and np.all(np.abs(a) <= 1)
    dists = np.linalg.norm(a[:, None] - a[None], axis=2) + np.eye(15) * 10
    assert dists.min() > 0.1


def test_noiseless_limit_is_plain_lloyd_from_the_same_initial_centroids():
    pts = blobs(200, [(-0.6, -0.6), (0.6, -0.5), (0.0, 0.6)], 0.08, seed=3)
    params = DPLloydParams(variant="average_k", schedule="average", iterations=6)
    centers, weights, _ = core.run_lloyd(core.numpy_aggregate(pts), BOX2, 3, params,
                                         Accountant(1.0, 0.0, NoNoise()), np.random.default_rng(9), 1.0)
    # Plain Lloyd by hand, from the same data-independent start.
    c = core.initial_centroids(BOX2, 3, np.random.default_rng(9))
    x = np.rint(pts * 2**20) / 2**20
    for _ in range(6):
        labels = solvers.nearest(x, c)
        c = np.array([x[labels == j].mean(axis=0) for j in range(3)])
    assert np.allclose(centers, c, atol=1e-9)
    assert weights.sum() == len(pts)


def test_empty_cluster_is_reseeded_not_kept():
    pts = blobs(100, [(0.5, 0.5)], 0.01, seed=4)
    params = DPLloydParams(variant="average_k", schedule="average", iterations=1)
    acc = Accountant(1.0, 0.0, NoNoise())
    centers, weights, trace = core.run_lloyd(core.numpy_aggregate(pts), BOX2, 2, params, acc, np.random.default_rng(1), 1.0)
    start = core.initial_centroids(BOX2, 2, np.random.default_rng(1))
    empty = int(np.argmin(weights))
    assert weights[empty] == 0 and trace.reseeded == [1]
    assert not np.allclose(centers[empty], start[empty])  # re-seeded uniformly, not the old centroid


def test_merging_reduces_nk_clusters_to_k_for_both_merges():
    pts = blobs(100, [(-0.5, 0.0), (0.5, 0.0)], 0.05, seed=6)
    for merge in ("weighted_kmeans", "nearest_pair"):
        params = DPLloydParams(variant="average_nk", schedule="average", iterations=4, merge=merge)
        centers, weights, _ = core.run_lloyd(core.numpy_aggregate(pts), BOX2, 2, params,
                                             Accountant(1.0, 0.0, NoNoise()), np.random.default_rng(2), 1.0)
        assert centers.shape == (2, 2)
        assert sorted(np.round(centers[:, 0], 1)) == [-0.5, 0.5]
        assert weights.sum() == pytest.approx(200)


class _HalvedLaplace(LaplaceMechanism):
    @property
    def scale_steps(self):
        return super().scale_steps / 2


def _released(points, runs, seed, monkeypatch=None):
    """Many seeded runs of a whole (tiny) DP Lloyd: k = 1, one iteration, d = 1."""
    domain = Domain(dim=1, lower=(-1.0,), upper=(1.0,))
    params = DPLloydParams(variant="average_k", schedule="average", iterations=1, noise="su")
    agg = core.numpy_aggregate(points)
    noise = SeededNoise(seed)
    out = np.empty((runs, 2))
    for i in range(runs):
        c, w, _ = core.run_lloyd(agg, domain, 1, params, Accountant(1.0, 0.0, noise), np.random.default_rng(0), 1.0)
        out[i] = (c[0, 0], w[0])
    return out


def _quadrants(out, count_cut, sum_cut):
    """Bin each release (center, noisy weight) by the noisy count and the noisy sum it reveals."""
    centers, weights = out[:, 0], out[:, 1]
    sums = centers * weights
    return (weights <= count_cut).astype(int) * 2 + (sums <= sum_cut).astype(int)


def test_full_run_statistical_privacy_and_broken_noise_is_caught(monkeypatch):
    """Neighbours: 20 points at 0, and the same plus one point at 1 (count +1, sum +1).

    In the quadrant {noisy count <= 20, noisy sum <= 0} the likelihood ratio of the
    two releases is exactly exp(eps_count + eps_sums) = e^1, so a correct run shows a
    loss near 1 and never above 1 + margin; with the noise scale halved it shows ~2.
    20k runs per side put >= 4,000 releases in that quadrant: the log-ratio's standard
    error is < 0.025 and the margin 0.15 is 6 standard errors (4 bins: false alarm < 1e-8).
    """
    from privacy_stats import estimated_loss

    d0 = np.zeros((20, 1))
    d1 = np.vstack([d0, [[1.0]]])
    runs = 20_000
    loss = estimated_loss(_quadrants(_released(d0, runs, 1), 20.5, 0.0), _quadrants(_released(d1, runs, 2), 20.5, 0.0))
    assert 0.85 <= loss <= 1.15
    monkeypatch.setattr(lloyd_step, "LaplaceMechanism", _HalvedLaplace)  # the noisy update is dpspark.steps.lloyd's
    broken = estimated_loss(_quadrants(_released(d0, runs, 3), 20.5, 0.0), _quadrants(_released(d1, runs, 4), 20.5, 0.0))
    assert broken > 1.15
