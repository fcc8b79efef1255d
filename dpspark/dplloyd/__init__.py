"""Family 2: DP Lloyd with cluster merging and adaptive budget allocation (DP-KCCM).

``papers/dp-kmeans-cluster-merging.txt``; estimator in ``dpspark.dplloyd.estimator``.
"""
