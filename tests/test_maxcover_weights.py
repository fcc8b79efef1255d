"""The released snap counts below their noise floor read as zero before the weighted solve
(``core.significant_weights``): the floor's tail bound, the rule, and what it fixes (a far candidate
with a noise-sized weight no longer keeps a center to itself)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpspark.maxcover import core
from dpspark.maxcover.estimator import MaxCover
from dpspark.maxcover.passes import PassCounter
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import SeededNoise

DELTA = 1e-6


def tail(eps: float, t: int) -> float:
    """P[Z >= t] for Z ~ DLap(1/eps), t >= 1."""
    return math.exp(-eps * t) / (1.0 + math.exp(-eps))


@pytest.mark.parametrize("eps", [0.05, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("count", [1, 2, 37, 1000, 40_000])
@pytest.mark.parametrize("expected", [1.0, core.WEIGHT_FLOOR_FALSE])
def test_the_floor_is_the_smallest_count_empty_candidates_reach_at_most_expected_times(eps, count, expected):
    t = core.noise_floor(eps, count, expected)
    assert t >= 1 and count * tail(eps, t) <= expected
    assert t == 1 or count * tail(eps, t - 1) > expected


def test_the_floor_refuses_what_is_not_a_count_or_an_epsilon():
    with pytest.raises(ValueError, match="count=0"):
        core.noise_floor(0.5, 0)
    with pytest.raises(ValueError):
        core.noise_floor(float("nan"), 10)


def test_below_the_floor_reads_as_zero_and_the_rest_as_released():
    eps, k = 0.3, 2
    t = core.noise_floor(eps, 6, core.WEIGHT_FLOOR_FALSE)
    noisy = np.array([t - 1, t, -4, 500, 0, t + 7], dtype=np.int64)
    assert core.significant_weights(noisy, eps, k).tolist() == [0.0, t, 0.0, 500.0, 0.0, t + 7.0]


def test_outside_the_cells_the_histogram_saw_the_floor_is_stricter():
    eps, k = 0.3, 1
    mild = core.noise_floor(eps, 4, core.WEIGHT_FLOOR_FALSE)
    strict = core.noise_floor(eps, 4, core.WEIGHT_FLOOR_FALSE_OUTSIDE)
    assert strict > mild
    noisy = np.array([mild, mild, strict, 900], dtype=np.int64)
    outside = np.array([False, True, True, False])
    assert core.significant_weights(noisy, eps, k, outside).tolist() == [mild, 0.0, strict, 900.0]
    assert core.significant_weights(noisy, eps, k).tolist() == [mild, mild, strict, 900.0]
    with pytest.raises(ValueError, match="outside has 3 values for 4 counts"):
        core.significant_weights(noisy, eps, k, outside[:3])


def test_with_fewer_than_k_above_the_floor_every_count_stays_clipped_at_zero():
    eps = 0.3
    t = core.noise_floor(eps, 4, core.WEIGHT_FLOOR_FALSE)
    noisy = np.array([t + 3, 2, -1, 1], dtype=np.int64)
    assert core.significant_weights(noisy, eps, 2).tolist() == [t + 3.0, 2.0, 0.0, 1.0]
    assert core.significant_weights(noisy, eps, 1).tolist() == [t + 3.0, 0.0, 0.0, 0.0]


def test_empty_candidates_pass_the_floor_at_the_stated_rate():
    """Released zeros (exact counts 0, as the chosen candidates in empty space have) clear the floor
    exactly when the noise is >= t: for the stricter floor (outside the cells a released histogram saw) at most
    WEIGHT_FLOOR_FALSE_OUTSIDE (5%) of the time in a whole release by
    construction. 2000 seeded releases of 100 zeros at eps 0.3 (200,000 draws; expected passes
    2000 x 100 x P[Z >= t], about 95); the band is 5 standard deviations (about 6e-7 to fail by chance).
    The mild floor (WEIGHT_FLOOR_FALSE, one expected pass per release) would give about 20x more."""
    eps, count = 0.3, 100
    t = core.noise_floor(eps, count, core.WEIGHT_FLOOR_FALSE_OUTSIDE)
    p = tail(eps, t)
    noise = SeededNoise(61206)
    passes = 0
    for _ in range(2000):
        acc = Accountant(1.0, DELTA, noise)
        noisy = core.noisy_weights(np.zeros(count, dtype=np.int64), acc, eps)
        passes += int((noisy >= t).sum())  # the released counts significant_weights keeps
    draws = 2000 * count
    assert abs(passes - draws * p) <= 5 * math.sqrt(draws * p * (1 - p)), (passes, draws * p)
    assert count * p <= core.WEIGHT_FLOOR_FALSE_OUTSIDE


def test_a_far_candidate_with_a_noise_sized_weight_keeps_no_center():
    """Two heavy candidates and one in a far corner holding 1 (below the floor at eps 0.3 among 3
    counts: t = 2): the corner no longer takes one of the k = 2 centers, whatever the seeding draws."""
    box = Domain(dim=2, lower=(-1.0, -1.0), upper=(1.0, 1.0))
    est = MaxCover(k=2, epsilon=1.0, delta=DELTA, domain=box, candidates="grid")
    params = est._validated_params()
    chosen = np.array([[-0.1, 0.0], [0.1, 0.0], [0.99, 0.99]])
    weights = np.array([400.0, 400.0, 1.0])
    assert core.noise_floor(0.3, 3, core.WEIGHT_FLOOR_FALSE) == 2
    budget = {"coverage": (0.5, DELTA), "counts": (0.3, 0.0)}
    for seed in range(20):
        centers, _ = est.solve_and_polish(params, budget, chosen, weights, chosen, None, np.random.default_rng(seed),
                                          None, Accountant(1.0, DELTA, SeededNoise(1)), PassCounter(), {})
        assert np.abs(centers[:, 1]).max() < 1e-9 and sorted(np.round(centers[:, 0], 9)) == [-0.1, 0.1]
