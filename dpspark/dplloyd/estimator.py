"""``DPLloyd``: the estimator of the dplloyd family.

    model = DPLloyd(k=5, epsilon=1.0, domain=Domain(dim=2, lower=(0, 0), upper=(1, 1)),
                    features=("x", "y")).fit(df)
    model.centers, model.epsilon_spent
    model.transform(df)   # adds "prediction" (NOT private: computed from the rows)

Constructors only store parameters; ``fit`` validates them in one place
(``_validated_params``) before touching the data.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from dpspark import tables
from dpspark.dplloyd import core
from dpspark.kernels import PACKED_COLUMN
from dpspark.dplloyd.params import MERGES, NOISE_RULES, VARIANTS, DPLloydParams
from dpspark.model import ClusteringModel
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.randomness import Randomness
from dpspark.progress import step
from dpspark.steps.lloyd_pass import spark_aggregate


class DPLloyd:
    name = "dplloyd"

    def __init__(self, k: int, epsilon: float, domain: Domain, features=("x", "y"), variant: str = "allocation_nk",
                 iterations: int = 12, merge_factor: int = 3, noise: str = "su", merge: str = "weighted_kmeans",
                 min_count: float = 1.0, privacy_unit: str | None = None, seed: int | None = None, randomness: Randomness | None = None):
        self.k = k
        self.epsilon = epsilon
        self.domain = domain
        self.features = tuple(features)
        self.variant = variant
        self.iterations = iterations
        self.merge_factor = merge_factor
        self.noise = noise
        self.merge = merge
        self.min_count = min_count
        self.privacy_unit = privacy_unit
        self.seed = seed
        self.randomness = randomness

    @classmethod
    def from_config(cls, config, randomness: Randomness | None = None) -> "DPLloyd":
        p: DPLloydParams = config.algorithm.params
        return cls(k=config.algorithm.k, epsilon=config.privacy.epsilon, domain=Domain.from_config(config.domain),
                   features=config.input.features, variant=p.variant, iterations=p.iterations,
                   merge_factor=p.merge_factor, noise=p.noise, merge=p.merge, min_count=p.min_count,
                   privacy_unit=config.input.privacy_unit, seed=config.seed, randomness=randomness)

    def _validated_params(self) -> DPLloydParams:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k={self.k!r} should be an integer >= 1")
        if not isinstance(self.epsilon, (int, float)) or not (self.epsilon > 0) or math.isinf(self.epsilon):
            raise ValueError(f"epsilon={self.epsilon!r} should be a finite number > 0")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant={self.variant!r} should be one of {sorted(VARIANTS)}")
        if self.noise not in NOISE_RULES:
            raise ValueError(f"noise={self.noise!r} should be one of {list(NOISE_RULES)}")
        if self.merge not in MERGES:
            raise ValueError(f"merge={self.merge!r} should be one of {list(MERGES)}")
        schedule, merges = VARIANTS[self.variant]
        if not isinstance(self.iterations, int) or self.iterations < (3 if schedule == "allocation" else 1):
            raise ValueError(f"iterations={self.iterations!r} should be an integer >= {3 if schedule == 'allocation' else 1} for variant {self.variant!r}")
        if merges and (not isinstance(self.merge_factor, int) or self.merge_factor < 2):
            raise ValueError(f"merge_factor={self.merge_factor!r} should be an integer >= 2 for variant {self.variant!r}")
        if len(self.features) not in (1, self.domain.dim):
            raise ValueError(f"features={list(self.features)} should name {self.domain.dim} columns or one array column")
        return DPLloydParams(variant=self.variant, iterations=self.iterations, merge_factor=self.merge_factor,
                             schedule=schedule, noise=self.noise, merge=self.merge, min_count=float(self.min_count))

    def privacy_plan(self) -> tuple[float, float]:
        """(epsilon, delta) that ``fit`` will spend: public, known before any data is read."""
        self._validated_params()
        return core.plan(self.epsilon)

    def fit(self, df, timings: dict | None = None, operational: dict | None = None) -> ClusteringModel:
        params = self._validated_params()
        epsilon, delta = core.plan(self.epsilon)
        randomness = self.randomness or Randomness(self.seed)
        accountant = Accountant(epsilon, delta, randomness.noise)
        timings = {} if timings is None else timings
        unit_df, feature_names = tables.prepare_points(df, self.features, self.privacy_unit, self.domain, randomness.run_key)
        # one packed column: the passes read each batch as one buffer (``kernels.batch_points``)
        columns = [PACKED_COLUMN]
        cached = tables.packed_points(unit_df, self.domain.dim).persist()
        try:
            centers_unit, noisy_weights, trace = core.run_lloyd(
                spark_aggregate(cached, columns), self.domain, self.k, params, accountant,
                randomness.public_rng("dplloyd"), epsilon, progress=lambda name: step(name, timings, repeated=True),
            )
        finally:
            cached.unpersist()
        accountant.finish()
        return ClusteringModel(
            algorithm=self.name, objective="kmeans", centers=self.domain.from_unit(centers_unit),
            noisy_weights=noisy_weights, epsilon_spent=accountant.spent_epsilon, delta_spent=accountant.spent_delta,
            charges=accountant.summary(), domain=self.domain, features=self.features, feature_names=feature_names,
            parameters={"k": self.k, **asdict(params)},
            info={"iteration_shares": trace.shares, "initial_centroids_unit": trace.initial_centroids, "reseeded_per_iteration": trace.reseeded,
                  "randomness": randomness.describe()},
        )
