"""Fixed-point integers for sums computed on Spark.

Unit-space coordinates (|x| <= 1) are stored as integers ``round(x * SCALE)``
with ``SCALE = 2**20`` (resolution about 1e-6). Sums of integers are exact and
associative, so a per-cluster sum does not depend on the partitioning of the
data or on the order of the reduce; the driver adds integer-valued noise to the
exact integer sums. With |q| <= 2**20 per record, int64 sums are exact for up to
2**43 records.
"""

from __future__ import annotations

import numpy as np

SCALE_BITS = 20
SCALE = 1 << SCALE_BITS


# ----------------------------------------------------------------------------
# The executors' second line of defence
#
# ``Domain.unit_columns`` already maps every record into [-1, 1]^d. The executor kernels
# do not rely on it: every unit-space value they read goes through ``sanitize_unit`` (or,
# for values already in fixed point, ``sanitize_fixed``) first. ONE rule everywhere:
# clamp and zero, never drop --
#   NaN -> 0, +inf -> 1, -inf -> -1, every other value clamped into [-1, 1].
# A row therefore stays one row (one count) whose coordinates are bounded by 1, so one
# record moves one count by 1 and each coordinate sum by at most 1 (1 unit = SCALE in
# fixed point), whatever it holds; and no NaN ever reaches a comparison (a NaN in a
# bounding-box test would silently drop a whole chunk of OTHER records).


def sanitize_unit(unit_values: np.ndarray) -> np.ndarray:
    """A float64 copy with NaN -> 0, +-inf -> +-1 and every value clamped into [-1, 1]."""
    x = np.array(unit_values, dtype=np.float64)  # always a copy: callers' arrays are left alone
    np.nan_to_num(x, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
    np.clip(x, -1.0, 1.0, out=x)
    return x


# What numpy's float -> int64 cast makes of NaN (and, on x86, of +-inf and of values beyond
# +-2**63): never a valid fixed-point value, since |q| <= SCALE.
_CAST_OF_NAN = np.iinfo(np.int64).min


def sanitize_fixed(fixed: np.ndarray) -> np.ndarray:
    """Fixed-point int64 values read by the rule above: INT64_MIN (a cast NaN) -> 0, clamp to [-SCALE, SCALE].

    For values quantized by a caller that did not sanitize first (``np.rint(x * SCALE).astype(int64)``).
    A cast +-inf may also arrive as INT64_MIN (x86) and then reads as 0 rather than +-SCALE:
    still a bounded value, which is all the privacy argument needs.
    """
    q = np.array(fixed, dtype=np.int64)
    q[q == _CAST_OF_NAN] = 0
    np.clip(q, -SCALE, SCALE, out=q)
    return q


def quantize(unit_values: np.ndarray) -> np.ndarray:
    """Unit-space floats -> fixed-point int64 (round half to even), after ``sanitize_unit``: |q| <= SCALE."""
    return np.rint(sanitize_unit(unit_values) * SCALE).astype(np.int64)


def dequantize(fixed: np.ndarray) -> np.ndarray:
    return np.asarray(fixed, dtype=np.float64) / SCALE
