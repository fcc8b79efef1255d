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
