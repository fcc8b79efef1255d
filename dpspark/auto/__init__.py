"""``algorithm.name: auto``: the default; chooses the method from public inputs (see ``estimator``)."""

from dpspark.auto.estimator import AutoClustering

__all__ = ["AutoClustering"]
