"""Family 1, "maxcover": (eps, delta)-DP k-median / k-means over a public candidate set.

``core`` is the driver-side, Spark-free part (Algorithms 1 and 2 of
``papers/maxcover-dp-clustering.txt``); it imports numpy, scipy and
``dpspark.privacy`` only, never pyspark.
"""

from dpspark.maxcover import core
from dpspark.maxcover.core import *  # noqa: F401,F403  the driver-side API, re-exported

__all__ = list(core.__all__)
