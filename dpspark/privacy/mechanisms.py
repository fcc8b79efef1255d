"""Noise sources and mechanisms: the only place in dpspark where noise is drawn.

Noise is integer-valued and exact: discrete Laplace and discrete Gaussian on
integer (fixed-point) queries, and the exponential mechanism by Gumbel-max on
integer scores. The default source is OpenDP's exact samplers, which draw from
the operating system's cryptographically secure generator. A seeded source
exists for tests only: it is NOT private (numpy's generator is predictable and
its float samplers are not exact), and a run that uses it says so in its record.

Every mechanism is a small frozen object with validated parameters and an
explicit privacy map, in OpenDP's style: ``mech.privacy_map(d_in)`` is the
epsilon (and delta) spent for input distance ``d_in``. Mechanisms do not charge
anything themselves: the accountant charges, then calls ``release``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


# ----------------------------------------------------------------------------
# Noise sources


class NoiseSource(ABC):
    """Draws integer-valued noise. Passed in explicitly; never global."""

    secure: bool = False
    description: str = ""

    @abstractmethod
    def discrete_laplace(self, scale: float, size: int) -> np.ndarray:
        """``size`` draws of the discrete Laplace with P(z) ∝ exp(-|z| / scale), as int64."""

    @abstractmethod
    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        """``size`` draws of the discrete Gaussian with P(z) ∝ exp(-z^2 / (2 sigma^2)), as int64."""

    @abstractmethod
    def gumbel_argmax(self, scores: np.ndarray, scale: float) -> int:
        """Index i drawn with probability ∝ exp(scores[i] / scale) (the exponential mechanism)."""


class OpenDPNoise(NoiseSource):
    """OpenDP's exact samplers, seeded from the OS's cryptographically secure source."""

    secure = True
    description = "OpenDP exact samplers (cryptographically secure)"

    def __init__(self):
        import opendp.prelude as dp

        dp.enable_features("contrib")
        self._dp = dp

    def _space(self, metric):
        dp = self._dp
        return dp.vector_domain(dp.atom_domain(T="i64")), metric

    def discrete_laplace(self, scale: float, size: int) -> np.ndarray:
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        dp = self._dp
        meas = dp.m.make_laplace(*self._space(dp.l1_distance(T="i64")), scale=float(scale))
        return np.asarray(meas([0] * size), dtype=np.int64)

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        dp = self._dp
        meas = dp.m.make_gaussian(*self._space(dp.l2_distance(T="i64")), scale=float(sigma))
        return np.asarray(meas([0] * size), dtype=np.int64)

    def gumbel_argmax(self, scores: np.ndarray, scale: float) -> int:
        dp = self._dp
        # make_noisy_max with zero-concentrated divergence adds Gumbel noise: Gumbel-max on
        # integer scores is exactly the exponential mechanism, sampled in log space.
        meas = dp.m.make_noisy_max(
            *self._space(dp.linf_distance(T="i64", monotonic=True)),
            dp.zero_concentrated_divergence(),
            scale=float(scale),
        )
        return int(meas([int(s) for s in np.asarray(scores, dtype=np.int64)]))


class SeededNoise(NoiseSource):
    """TESTING AID ONLY, NOT PRIVATE: reproducible noise from numpy's PCG64.

    The distributions are the right ones (discrete Laplace as a difference of two
    geometric draws, Gumbel-max in log space) so that statistical tests of the
    mechanisms are meaningful, but numpy's generator is predictable from its seed.
    """

    secure = False
    description = "seeded numpy PCG64 (testing aid, NOT private)"

    def __init__(self, seed: int | np.random.SeedSequence):
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def discrete_laplace(self, scale: float, size: int) -> np.ndarray:
        p = -math.expm1(-1.0 / scale)  # 1 - exp(-1/scale), success probability
        return (self.rng.geometric(p, size=size) - self.rng.geometric(p, size=size)).astype(np.int64)

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        return np.rint(self.rng.normal(0.0, sigma, size=size)).astype(np.int64)

    def gumbel_argmax(self, scores: np.ndarray, scale: float) -> int:
        s = np.asarray(scores, dtype=np.float64) / scale
        return int(np.argmax(s + self.rng.gumbel(size=s.shape)))


class NoNoise(NoiseSource):
    """TESTING AID ONLY, NOT PRIVATE: adds no noise (the limit epsilon -> infinity).

    Lets tests check that an algorithm reduces to its non-private counterpart.
    Never reachable from a config file.
    """

    secure = False
    description = "no noise (testing aid, NOT private)"

    def discrete_laplace(self, scale, size):
        return np.zeros(size, dtype=np.int64)

    def discrete_gaussian(self, sigma, size):
        return np.zeros(size, dtype=np.int64)

    def gumbel_argmax(self, scores, scale):
        return int(np.argmax(np.asarray(scores)))


# ----------------------------------------------------------------------------
# Mechanisms


def _check_epsilon(epsilon: float) -> None:
    if not (isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool)) or not (epsilon > 0) or math.isinf(epsilon):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")


def _check_delta(delta: float, *, positive: bool = False) -> None:
    if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not (0 <= delta < 1) or (positive and delta == 0):
        raise ValueError(f"delta must be {'in (0, 1)' if positive else 'in [0, 1)'}, got {delta!r}")


def _check_sensitivity(sensitivity: float) -> None:
    if not isinstance(sensitivity, (int, float)) or isinstance(sensitivity, bool) or not (sensitivity > 0) or math.isinf(sensitivity):
        raise ValueError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")


def _integer_queries(exact) -> np.ndarray:
    arr = np.asarray(exact)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"mechanisms take exact integer (fixed-point) queries, got dtype {arr.dtype}")
    return arr.astype(np.int64)


@dataclass(frozen=True)
class LaplaceMechanism:
    """epsilon-DP discrete Laplace on a vector of integer queries.

    ``sensitivity`` is the L1 sensitivity of the whole vector in value units, and
    ``unit`` the value of one integer step (1 for counts, ``1/fixedpoint.SCALE``
    for fixed-point sums). Noise scale in integer steps: sensitivity / unit / epsilon.
    Privacy map: epsilon * d_in / sensitivity (pure DP).
    """

    epsilon: float
    sensitivity: float = 1.0
    unit: float = 1.0

    def __post_init__(self):
        _check_epsilon(self.epsilon)
        _check_sensitivity(self.sensitivity)
        _check_sensitivity(self.unit)

    @property
    def scale(self) -> float:
        """Noise scale in value units (b of Laplace(b))."""
        return self.sensitivity / self.epsilon

    @property
    def scale_steps(self) -> float:
        return self.sensitivity / self.unit / self.epsilon

    def privacy_map(self, d_in: float) -> tuple[float, float]:
        return self.epsilon * d_in / self.sensitivity, 0.0

    def release(self, exact, noise: NoiseSource) -> np.ndarray:
        q = _integer_queries(exact)
        return q + noise.discrete_laplace(self.scale_steps, q.size).reshape(q.shape)


@dataclass(frozen=True)
class GaussianMechanism:
    """(epsilon, delta)-DP discrete Gaussian on a vector of integer queries.

    sigma is set through zero-concentrated DP: the discrete Gaussian with
    sigma = l2_sensitivity / sqrt(2 rho) is rho-zCDP (Canonne, Kamath, Steinke
    2020), and rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP (Bun and
    Steinke 2016, Prop. 1.3); rho is the largest value meeting ``epsilon``.
    """

    epsilon: float
    delta: float
    sensitivity: float = 1.0  # L2, value units
    unit: float = 1.0

    def __post_init__(self):
        _check_epsilon(self.epsilon)
        _check_delta(self.delta, positive=True)
        _check_sensitivity(self.sensitivity)
        _check_sensitivity(self.unit)

    @property
    def rho(self) -> float:
        log_term = math.log(1.0 / self.delta)
        return (math.sqrt(self.epsilon + log_term) - math.sqrt(log_term)) ** 2

    @property
    def sigma(self) -> float:
        return self.sensitivity / math.sqrt(2.0 * self.rho)

    def privacy_map(self, d_in: float) -> tuple[float, float]:
        rho = self.rho * (d_in / self.sensitivity) ** 2
        log_term = math.log(1.0 / self.delta)
        return rho + 2.0 * math.sqrt(rho * log_term), self.delta

    @classmethod
    def with_sigma(cls, sigma: float, delta: float, sensitivity: float = 1.0) -> "GaussianMechanism":
        """The mechanism whose sigma is ``sigma`` or a hair above it, never below (float rounding of the
        epsilon <-> rho round trip); for callers whose own theorem fixes sigma (e.g. a composed block)."""
        if not (sigma > 0) or math.isinf(sigma):
            raise ValueError(f"sigma={sigma!r} should be a finite number > 0")
        for nudge in (1.0, 1.0 + 1e-12, 1.0 + 1e-9, 1.0 + 1e-6):
            rho = (sensitivity / (sigma * nudge)) ** 2 / 2.0
            mech = cls(rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)), delta, sensitivity=sensitivity)
            if mech.sigma >= sigma:
                return mech
        raise AssertionError(f"no GaussianMechanism with sigma >= {sigma!r}")  # not reached: floats round within 1e-15

    def release(self, exact, noise: NoiseSource) -> np.ndarray:
        q = _integer_queries(exact)
        return q + noise.discrete_gaussian(self.sigma / self.unit, q.size).reshape(q.shape)


@dataclass(frozen=True)
class ExponentialMechanism:
    """The exponential mechanism over a finite candidate set, by Gumbel-max.

    Picks i with probability ∝ exp(epsilon * score_i / (c * sensitivity)) where
    c = 1 for monotone scores (counts: adding a record never lowers a score) and
    c = 2 otherwise. Privacy map: epsilon * d_in / sensitivity (pure DP).
    ``weight`` = epsilon / (c * sensitivity) is the factor in the exponent.
    """

    epsilon: float
    sensitivity: float = 1.0
    monotone: bool = True

    def __post_init__(self):
        _check_epsilon(self.epsilon)
        _check_sensitivity(self.sensitivity)

    @classmethod
    def with_weight(cls, weight: float, sensitivity: float = 1.0, monotone: bool = True) -> "ExponentialMechanism":
        """The mechanism that samples ∝ exp(weight * score) (as papers write it)."""
        return cls(epsilon=weight * (1 if monotone else 2) * sensitivity, sensitivity=sensitivity, monotone=monotone)

    @property
    def weight(self) -> float:
        return self.epsilon / ((1 if self.monotone else 2) * self.sensitivity)

    def privacy_map(self, d_in: float) -> tuple[float, float]:
        return self.epsilon * d_in / self.sensitivity, 0.0

    def select(self, scores, noise: NoiseSource) -> int:
        s = _integer_queries(scores)
        if s.ndim != 1 or s.size == 0:
            raise ValueError(f"scores must be a non-empty vector, got shape {s.shape}")
        return noise.gumbel_argmax(s, 1.0 / self.weight)
