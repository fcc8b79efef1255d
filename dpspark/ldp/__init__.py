"""Family 3: k-means / k-median in the LOCAL model of differential privacy.

``papers/locally-private-kmeans.txt`` (GoodCenters + WeightedCenters); design notes
in ``docs/ldp-design.md``. ``client.py`` (the user's randomizer) and ``oracle.py``
(the frequency oracle) import numpy only; ``protocol.py`` is the driver-side logic;
``spark.py`` runs simulated clients or ingests real reports; the estimator is
``dpspark.ldp.estimator.LocalDP``.
"""
