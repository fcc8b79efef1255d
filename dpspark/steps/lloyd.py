"""The DP Lloyd step that dplloyd, auto's tree route and maxcover's Lloyd polish share (below the
families). Its Spark pass is ``dpspark.steps.lloyd_pass`` (executor kernel ``lloyd_kernels``).

A Lloyd step releases, per nearest center, a noisy count and noisy coordinate sums
(``noisy_update``, with Su et al.'s split of the step's epsilon, ``su_split``). What follows the
release reads no data: the public threshold a noisy count must clear for its center to move
(``lloyd_min_count``), and the move itself (``lloyd_move``), post-processing of the release.
"""

from __future__ import annotations

import math

import numpy as np

from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE
from dpspark.privacy.mechanisms import LaplaceMechanism

# Su et al. (2016/2017), "Differentially private k-means clustering" (DPLloyd-Impr):
# within one iteration's share eps_t, the count gets eps_t * c / (d + c) and each of the
# d coordinate sums eps_t / (d + c), with c = cbrt(4 d rho^2) and rho = 0.225. (The
# well-known library bug swaps these two shares, which overspends for d >= 5.)
SU_RHO = 0.225


def su_split(eps_t: float, dim: int) -> tuple[float, float]:
    """(epsilon of the count vector, epsilon of the whole d-dimensional sum vector); they add to eps_t."""
    c = (4.0 * dim * SU_RHO**2) ** (1.0 / 3.0)
    eps_count = eps_t * c / (dim + c)
    eps_sums = eps_t - eps_count  # = eps_t * d / (d + c): d coordinates at eps_t / (d + c) each
    return eps_count, eps_sums


def noisy_update(counts: np.ndarray, sums: np.ndarray, eps_t: float, noise_rule: str, accountant: Accountant, label: str):
    """Release noisy counts (K,) and noisy unit-space sums (K, d) for one iteration.

    ``counts`` are exact int64 counts, ``sums`` exact fixed-point int64 sums (units of
    1/SCALE). Charges exactly eps_t.
    """
    dim = sums.shape[1]
    if noise_rule == "su":
        eps_count, eps_sums = su_split(eps_t, dim)
        noisy_counts = accountant.laplace(f"{label} counts", counts, LaplaceMechanism(eps_count, sensitivity=1.0)).astype(np.float64)
        noisy_sums = accountant.laplace(
            f"{label} sums", sums, LaplaceMechanism(eps_sums, sensitivity=float(dim), unit=1.0 / SCALE)
        ).astype(np.float64) / SCALE
    elif noise_rule == "paper":
        # The paper's Algorithm 1: Lap((d r + 1) / eps_t) on the count and on each sum (r = 1):
        # one release of the (count, sums) vector, whose L1 sensitivity is d + 1.
        vector = np.concatenate([counts.astype(np.int64)[:, None] * SCALE, sums], axis=1)
        noisy = accountant.laplace(
            f"{label} counts+sums", vector, LaplaceMechanism(eps_t, sensitivity=float(dim + 1), unit=1.0 / SCALE)
        ).astype(np.float64) / SCALE
        noisy_counts, noisy_sums = noisy[:, 0], noisy[:, 1:]
    else:
        raise ValueError(f"noise={noise_rule!r} should be 'su' or 'paper'")
    return noisy_counts, noisy_sums

# A Lloyd step moves a cluster's center only when its noisy count is at least this many noise
# standard deviations of its (count, coordinate sum) pair (``lloyd_min_count``): 0.5, i.e. unless the
# noisy mean's noise exceeds the whole width (2) of a coordinate's range. Measured against the old
# rule (noisy count >= 1; scripts/bench_auto_lloyd_threshold.py and numpy-reference runs, 80 paired
# seeds, eps 0.5 and 1, adult, blood, tripadvisor): 0.5 changes the mean paired cost by -0.3% to
# +0.2% (medians unchanged); 1 by -0.2% to +0.9% (blood worse); 3 ("a few sd") by up to +2.1% on
# blood and +1.3% on adult (13 of 40 adult seeds worse by > 1%): the previous center, from the coreset,
# is often no better than a noisy mean clipped into the domain, so a higher bar costs utility.
LLOYD_MIN_COUNT_SDS = 0.5


def lloyd_min_count(eps_t: float, dim: int, noise_rule: str = "su") -> float:
    """The noisy count a cluster needs for a Lloyd step to move its center: PUBLIC (eps_t, d, the noise rule).

    The new center's coordinate j is (S_j + e_j) / (n + e_n) ~ S_j / n + (e_j - (S_j / n) e_n) / n,
    with |S_j / n| <= 1 in unit space: its noise has a standard deviation of at most
    sd = sqrt(sd_sum^2 + sd_count^2) / n, where sd_sum and sd_count are those of the noise on one
    coordinate sum and on the count (a Laplace of scale b has sd sqrt(2) b). The center moves
    only when the noisy count is at least LLOYD_MIN_COUNT_SDS * sqrt(sd_sum^2 + sd_count^2), i.e.
    when that noise is at most 1 / LLOYD_MIN_COUNT_SDS (= 2, the width of a coordinate's range
    [-1, 1]); below, the new center would be noise spread wider than the domain and the previous
    (released) center is kept. Never below 1 (the old rule). Reads no data: post-processing of the
    step's release, no charge.
    """
    if noise_rule == "su":
        eps_count, eps_sums = su_split(eps_t, dim)
        sd_count, sd_sum = math.sqrt(2.0) / eps_count, math.sqrt(2.0) * dim / eps_sums
    elif noise_rule == "paper":  # one (count, sums) vector, Laplace((d + 1) / eps_t) on every entry
        sd_count = sd_sum = math.sqrt(2.0) * (dim + 1) / eps_t
    else:
        raise ValueError(f"noise_rule={noise_rule!r} should be 'su' or 'paper'")
    return max(1.0, LLOYD_MIN_COUNT_SDS * math.hypot(sd_count, sd_sum))


def lloyd_move(centers: np.ndarray, noisy_counts: np.ndarray, noisy_sums: np.ndarray, min_count: float, domain: Domain):
    """Post-processing of one Lloyd step's release: (new centers, weights). A cluster whose noisy count is
    below the public ``min_count`` keeps its previous (released) center; the others move to their noisy
    mean, clipped into the domain. Weights are the noisy counts clipped at 0."""
    ok = noisy_counts >= min_count
    new = np.array(centers, dtype=np.float64, copy=True)
    new[ok] = noisy_sums[ok] / noisy_counts[ok, None]
    return domain.clip_unit(new), np.maximum(noisy_counts, 0.0)
