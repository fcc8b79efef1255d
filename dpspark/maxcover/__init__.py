"""Family 1, "maxcover": (eps, delta)-DP k-median / k-means over a public candidate set.

``core`` is the driver-side, Spark-free part (Algorithms 1 and 2 of
``papers/maxcover-dp-clustering.txt``); it imports numpy, scipy and
``dpspark.privacy`` only, never pyspark. ``kernels`` is the executor side of the
Spark passes (numpy only); ``passes`` drives them; ``candidates`` builds the
candidate set; the estimator is ``dpspark.maxcover.estimator.MaxCover``.

``core``'s API is re-exported here lazily: importing ``dpspark.maxcover.kernels``
on an executor must not import ``core`` (and with it scipy and OpenDP, which
executors do not need).
"""

import importlib


def __getattr__(name):
    core = importlib.import_module("dpspark.maxcover.core")
    if name == "core":
        return core
    if name in core.__all__:
        return getattr(core, name)
    raise AttributeError(f"module 'dpspark.maxcover' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(importlib.import_module("dpspark.maxcover.core").__all__))
