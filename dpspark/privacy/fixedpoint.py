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


def quantize(unit_values: np.ndarray) -> np.ndarray:
    """Unit-space floats -> fixed-point int64 (round half to even)."""
    return np.rint(np.asarray(unit_values, dtype=np.float64) * SCALE).astype(np.int64)


def dequantize(fixed: np.ndarray) -> np.ndarray:
    return np.asarray(fixed, dtype=np.float64) / SCALE
