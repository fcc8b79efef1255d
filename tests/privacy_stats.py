"""The empirical privacy-loss estimate shared by the statistical privacy tests.

Draw many seeded outputs of a mechanism on two neighbouring inputs, and estimate the
privacy loss as max |ln(p/p')| over output values holding at least ``MIN_BIN`` draws
on both sides. With >= 2000 draws per value the standard error of each estimated
log-ratio is <= sqrt(2/2000) = 0.032, so ``MARGIN`` = 0.2 is over 6 standard errors:
with at most 20 values a correct mechanism exceeds epsilon + MARGIN with probability
< 1e-8 (Bonferroni). Each test also runs a deliberately broken mechanism, which must
exceed it.
"""

from __future__ import annotations

import math

import numpy as np

MIN_BIN = 2000
MARGIN = 0.2


def estimated_loss(a: np.ndarray, b: np.ndarray, min_bin: int = MIN_BIN) -> float:
    values = np.union1d(np.unique(a), np.unique(b))
    worst = 0.0
    for v in values:
        ca, cb = int(np.sum(a == v)), int(np.sum(b == v))
        if ca >= min_bin and cb >= min_bin:
            worst = max(worst, abs(math.log((ca / len(a)) / (cb / len(b)))))
    return worst


# ----------------------------------------------------------------------------
# Added for tests/test_privacy_stats_e2e.py: per-bin standard errors instead of one fixed margin
# (bins may then hold fewer draws), and estimators for the production samplers.

Z_BOUND = 7.0  # standard errors: a one-sided normal tail beyond 7 sd is 1.3e-12


def log_ratio(count_a: float, total_a: float, count_b: float, total_b: float) -> tuple[float, float]:
    """ln((count_a/total_a) / (count_b/total_b)) and its delta-method standard error.

    ``total`` may itself be a count (a conditional frequency, count <= total): the
    binomial variance of ln(count/total) is 1/count - 1/total.
    """
    lr = math.log((count_a / total_a) / (count_b / total_b))
    se = math.sqrt(max(1.0 / count_a - 1.0 / total_a, 0.0) + max(1.0 / count_b - 1.0 / total_b, 0.0))
    return lr, se


def binned_log_ratios(a: np.ndarray, b: np.ndarray, min_count: int = 500) -> dict:
    """{output value: (ln(p_a/p_b), standard error)} over the values with >= ``min_count`` draws on both sides.

    With >= 500 draws a side, ln(count) is close to normal even 7 sd out: Z_BOUND = 7
    sd of the log-ratio is at least 6 sd of either Poisson count, so one bin's
    estimate exceeds its true value + 7 se with probability < 1e-8.
    """
    out = {}
    for v in np.union1d(np.unique(a), np.unique(b)):
        ca, cb = int(np.sum(a == v)), int(np.sum(b == v))
        if ca >= min_count and cb >= min_count:
            out[v.item() if hasattr(v, "item") else v] = log_ratio(ca, len(a), cb, len(b))
    return out


def worst_excess(ratios: dict, bound) -> float:
    """max over bins of (|log-ratio| - bound(bin)) / se: > Z_BOUND means the bin's loss exceeds its bound.

    ``bound`` is a number or a function of the bin's value. -inf when no bin qualified.
    """
    worst = -math.inf
    for v, (lr, se) in ratios.items():
        limit = bound(v) if callable(bound) else bound
        worst = max(worst, (abs(lr) - limit) / se)
    return worst


def discrete_laplace_epsilon(draws: np.ndarray) -> tuple[float, float]:
    """Maximum-likelihood estimate of 1/scale of centred discrete Laplace draws, with its standard error.

    P(z) = (1-q)/(1+q) q^|z|, q = exp(-1/scale). With m = mean |z| the likelihood is
    maximal at q = (sqrt(1+m^2) - 1)/m, i.e. 1/scale = asinh(1/m). 1/scale is the
    privacy loss of a shift by ONE integer step (P(z)/P(z+1) = e^{1/scale} for z >= 0),
    so sensitivity_steps * estimate is the privacy loss of one record. The standard
    error is the delta method on m: sd(|z|) / sqrt(n) * |d asinh(1/m) / dm|.
    All draws zero (a scale far too small) gives (inf, 0).
    """
    z = np.abs(np.asarray(draws, dtype=np.float64))
    m = float(z.mean())
    if m == 0.0:
        return math.inf, 0.0
    est = math.asinh(1.0 / m)
    se = float(z.std()) / math.sqrt(z.size) / (m * math.sqrt(m * m + 1.0))
    return est, se
