"""Mechanisms: validation, privacy maps, and statistical privacy tests that can fail.

The statistical tests draw many seeded samples of a mechanism on two neighbouring
inputs, histogram the outputs, and estimate the privacy loss max |ln(p/p')| over
bins holding at least ``MIN_BIN`` draws on both sides. With >= 2000 draws per bin,
the standard error of each estimated log-ratio is <= sqrt(2/2000) = 0.032; the
margin 0.2 is over 6 standard errors, so with at most 20 bins a correct mechanism
fails with probability < 1e-8 (Bonferroni). The same test run on a deliberately
broken mechanism (noise scale halved: true loss 2 epsilon) must fail.
"""

from __future__ import annotations


import numpy as np
import pytest

from dpspark.privacy.accountant import Accountant
from dpspark.privacy.mechanisms import (ExponentialMechanism, GaussianMechanism, LaplaceMechanism, NoNoise,
                                        OpenDPNoise, SeededNoise)

from privacy_stats import MARGIN, estimated_loss  # noqa: E402


def laplace_draws(mech, value, n, seed):
    noise = SeededNoise(seed)
    return np.array([mech.release(np.array([value]), noise)[0] for _ in range(n)]) if n < 100 else \
        value + noise.discrete_laplace(mech.scale_steps, n)


class HalvedLaplace(LaplaceMechanism):
    """Deliberately broken: half the noise the privacy map claims."""

    @property
    def scale_steps(self):
        return super().scale_steps / 2


@pytest.mark.parametrize("bad", [
    dict(epsilon=0), dict(epsilon=-1), dict(epsilon=float("inf")), dict(epsilon=float("nan")),
    dict(epsilon=1, sensitivity=0), dict(epsilon=1, sensitivity=-2),
])
def test_laplace_validation(bad):
    with pytest.raises(ValueError) as err:
        LaplaceMechanism(**bad)
    assert "must be" in str(err.value)


def test_gaussian_and_exponential_validation():
    with pytest.raises(ValueError, match="delta"):
        GaussianMechanism(epsilon=1, delta=0)
    with pytest.raises(ValueError, match="delta"):
        GaussianMechanism(epsilon=1, delta=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        ExponentialMechanism(epsilon=0)


def test_privacy_maps():
    assert LaplaceMechanism(0.5).privacy_map(1) == (0.5, 0.0)
    assert LaplaceMechanism(0.5, sensitivity=3).privacy_map(3) == (0.5, 0.0)
    assert LaplaceMechanism(0.5, sensitivity=3).scale == 6.0
    assert LaplaceMechanism(1.0, sensitivity=2, unit=1 / 1024).scale_steps == 2048.0
    em = ExponentialMechanism(0.4)
    assert em.privacy_map(1) == (0.4, 0.0) and em.weight == 0.4
    assert ExponentialMechanism(0.4, monotone=False).weight == 0.2
    assert ExponentialMechanism.with_weight(0.3).epsilon == pytest.approx(0.3)
    g = GaussianMechanism(epsilon=1.0, delta=1e-6)
    eps, delta = g.privacy_map(1.0)
    assert eps == pytest.approx(1.0, rel=1e-9) and delta == 1e-6


def test_mechanisms_take_exact_integers_only():
    with pytest.raises(TypeError, match="integer"):
        LaplaceMechanism(1.0).release(np.array([0.5]), SeededNoise(0))


def test_laplace_statistical_privacy_and_broken_mechanism_is_caught():
    n = 200_000
    good = LaplaceMechanism(1.0)
    loss = estimated_loss(laplace_draws(good, 0, n, 1), laplace_draws(good, 1, n, 2))
    assert loss <= 1.0 + MARGIN
    assert loss >= 1.0 - MARGIN  # the test has power: the bound is attained in the tails
    broken = HalvedLaplace(1.0)
    loss_broken = estimated_loss(laplace_draws(broken, 0, n, 3), laplace_draws(broken, 1, n, 4))
    assert loss_broken > 1.0 + MARGIN


def test_exponential_statistical_privacy_and_broken_mechanism_is_caught():
    n = 250_000
    # One record added to candidate 0's count. The true loss is ln(p0/p0') = 0.90 for epsilon = 1
    # (the exponential mechanism attains epsilon only when the other scores dominate).
    scores, neighbour = np.array([0, 2, 2]), np.array([1, 2, 2])

    def draws(mech, s, seed):
        noise = SeededNoise(seed)
        return np.array([mech.select(s, noise) for _ in range(n)])

    good = ExponentialMechanism(1.0)
    loss = estimated_loss(draws(good, scores, 5), draws(good, neighbour, 6))
    assert 0.9 - MARGIN <= loss <= 1.0 + MARGIN

    class DoubledWeight(ExponentialMechanism):
        @property
        def weight(self):
            return 2 * super().weight

    broken = DoubledWeight(1.0)
    assert estimated_loss(draws(broken, scores, 7), draws(broken, neighbour, 8)) > 1.0 + MARGIN


def test_exponential_extremes_and_huge_scores():
    noise = SeededNoise(11)
    scores = np.array([3_000_000, 3_000_050, 2_999_000], dtype=np.int64)
    picks = [ExponentialMechanism(10.0).select(scores, noise) for _ in range(200)]
    assert set(picks) == {1}  # P(other) < 3 exp(-500)
    tiny = np.array([ExponentialMechanism(1e-9).select(scores, noise) for _ in range(30_000)])
    counts = np.bincount(tiny, minlength=3)
    # Uniform within 5 standard deviations (sd = sqrt(n p (1-p)) = 82)
    assert np.all(np.abs(counts - 10_000) < 5 * 82)


def test_opendp_source_is_secure_and_has_the_right_spread():
    noise = OpenDPNoise()
    assert noise.secure
    draws = noise.discrete_laplace(10.0, 20_000)
    assert draws.dtype == np.int64
    # Variance of the discrete Laplace with scale b is about 2 b^2 = 200; 20k draws: rel. sd ~ 2.2%
    assert 170 < draws.var() < 230
    assert abs(draws.mean()) < 0.5
    picks = [noise.gumbel_argmax(np.array([0, 10_000_000, 9_999_990]), 1.0) for _ in range(20)]
    assert set(picks) == {1}
    g = noise.discrete_gaussian(3.0, 20_000)
    assert 8.0 < g.var() < 10.0


def test_accountant_refuses_overspend_before_drawing_noise():
    class Exploding(NoNoise):
        def discrete_laplace(self, scale, size):
            raise AssertionError("noise drawn although the budget was exceeded")

    acc = Accountant(1.0, 0.0, Exploding())
    with pytest.raises(Exception, match="over its budget"):
        acc.laplace("too much", np.array([1]), LaplaceMechanism(1.5))
    assert acc.spent_epsilon == 0.0


def test_accountant_totals_and_finish():
    acc = Accountant(1.0, 1e-6, NoNoise())
    for _ in range(10):
        acc.laplace("tenth", np.array([3]), LaplaceMechanism(0.1))
    with pytest.raises(Exception, match="charges sum"):
        acc.finish()  # spent 1.0 epsilon but declared delta 1e-6 not spent
    acc.block("a theorem-covered loop", 0.0, 1e-6, rule="Lemma X")
    acc.finish()
    assert acc.spent_epsilon == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(Exception, match="over its budget"):
        acc.charge("one more", 1e-6)
