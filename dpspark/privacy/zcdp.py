"""(epsilon, delta) of composed discrete Gaussian releases, by OpenDP's privacy maps.

A discrete Gaussian with scale sigma on integer queries of L2 sensitivity Delta is
rho = Delta^2 / (2 sigma^2)-zCDP (Canonne, Kamath, Steinke 2020, Thm. 14); R such releases,
each chosen from earlier releases and public values only, compose to R rho-zCDP (Bun and
Steinke 2016, Lemma 2.3: zCDP composes adaptively); rho-zCDP implies (epsilon, delta)-DP
with delta = inf over alpha > 1 of exp((alpha - 1)(alpha rho - epsilon)) / (alpha - 1)
(1 - 1/alpha)^alpha (Canonne, Kamath, Steinke 2020, Cor. 13), about 15% less noise at
epsilon 1, delta 1e-6 than Bun and Steinke's rho + 2 sqrt(rho ln(1/delta)).

OpenDP states the three as privacy maps (``make_gaussian`` on an i64 vector,
``make_composition``, ``make_zCDP_to_approxDP``); this module only asks them. OpenDP's
``make_composition`` is stated for non-adaptive composition; its rho (the sum) is the same
number adaptive zCDP composition gives (Bun and Steinke 2016, Lemma 2.3), which is the theorem
the evolution route rests on. The maps round conservatively (up), so an epsilon read here is
never below the true one.
"""

from __future__ import annotations

import math

from dpspark.privacy.mechanisms import GaussianMechanism


def _dp():
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


def gaussian_releases_rho(sigma: float, releases: int, l2_sensitivity: int = 1) -> float:
    """rho of ``releases`` discrete Gaussian releases with scale ``sigma`` (OpenDP's zCDP map)."""
    dp = _dp()
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64")
    one = dp.m.make_gaussian(*space, scale=float(sigma))
    return float(dp.c.make_composition([one] * int(releases)).map(int(l2_sensitivity)))


def gaussian_releases_epsilon(sigma: float, releases: int, delta: float, l2_sensitivity: int = 1) -> float:
    """epsilon at ``delta`` of ``releases`` adaptively composed discrete Gaussian releases with scale ``sigma``."""
    if isinstance(releases, bool) or int(releases) != releases or releases < 1:
        raise ValueError(f"releases={releases!r} should be an integer >= 1")
    if not (0 < delta < 1):
        raise ValueError(f"delta={delta!r} should be in (0, 1)")
    if not (sigma > 0) or math.isinf(sigma):
        raise ValueError(f"sigma={sigma!r} should be a finite number > 0")
    dp = _dp()
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64")
    one = dp.m.make_gaussian(*space, scale=float(sigma))
    composed = dp.c.make_composition([one] * int(releases))
    return float(dp.c.make_zCDP_to_approxDP(composed).map(int(l2_sensitivity)).epsilon(float(delta)))


def smallest_sigma(epsilon: float, delta: float, releases: int, l2_sensitivity: int = 1) -> float:
    """The smallest scale (to 1e-10 relative) whose ``releases`` composed releases are (epsilon, delta)-DP.

    Bisection on the monotone map, started from the scale Bun and Steinke's looser conversion
    gives (which meets epsilon: Cor. 13 is never looser); the returned sigma is the upper end of
    the final bracket, so ``gaussian_releases_epsilon(sigma, ...) <= epsilon`` holds, and it is
    checked."""
    if not (epsilon > 0) or math.isinf(epsilon):
        raise ValueError(f"epsilon={epsilon!r} should be a finite number > 0")
    if not (0 < delta < 1):
        raise ValueError(f"delta={delta!r} should be in (0, 1)")

    def eps_at(s: float) -> float:
        return gaussian_releases_epsilon(s, releases, delta, l2_sensitivity)

    one_release = GaussianMechanism(epsilon, delta, sensitivity=float(l2_sensitivity))  # Bun-Steinke's sigma for eps
    hi = one_release.sigma * math.sqrt(int(releases))  # ... for the composition
    while eps_at(hi) > epsilon:
        hi *= 1.5
        if hi > 1e12:
            raise ValueError(f"no scale meets epsilon={epsilon!r} at delta={delta!r} for {releases} releases")
    lo = hi / 2.0
    while eps_at(lo) <= epsilon:
        lo, hi = lo / 2.0, lo
    while hi - lo > 1e-10 * hi:
        mid = 0.5 * (lo + hi)
        if eps_at(mid) > epsilon:
            lo = mid
        else:
            hi = mid
    if not eps_at(hi) <= epsilon:
        raise AssertionError(f"smallest_sigma: {hi!r} misses epsilon={epsilon!r}")
    return hi
