"""The estimator families by name, and the estimator a run or a fit uses (``build_estimator``).

Below the command line, the runner, the config layer and ``dpspark.ml`` (each builds its estimator
here: the config layer to validate a plan before Spark starts, the others to run it); above the
families, which it imports only when one is asked for. It reads a validated config's attributes and
never imports ``dpspark.config``.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

from dpspark.privacy.randomness import Randomness

ESTIMATORS = {
    "auto": "dpspark.auto.estimator:AutoClustering",
    "dplloyd": "dpspark.dplloyd.estimator:DPLloyd",
    "maxcover": "dpspark.maxcover.estimator:MaxCover",
    "ldp": "dpspark.ldp.estimator:LocalDP",
}


def estimator_class(name: str):
    module, _, attr = ESTIMATORS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def build_estimator(config, randomness: Randomness | None = None):
    """The estimator a run or a fit uses: the family's, behind a private estimate of its box when
    ``domain.estimate`` is set (``dpspark.estimated_domain``)."""
    family = estimator_class(config.algorithm.name)
    if config.domain.estimate is None:
        return family.from_config(config, randomness=randomness)
    from dpspark.estimated_domain import DomainEstimating

    def build(epsilon: float, delta: float, domain):
        released = replace(config.domain, dim=domain.dim, lower=tuple(domain.lower), upper=tuple(domain.upper),
                           radius=None, estimate=None, epsilon_share=None)
        inner = replace(config, domain=released,
                        privacy=replace(config.privacy, epsilon=epsilon, delta=delta))
        return family.from_config(inner, randomness=randomness)

    d = config.domain
    return DomainEstimating(build, dim=d.dim, epsilon=config.privacy.epsilon, delta=config.privacy.delta,
                            outer=None if d.lower is None else (tuple(d.lower), tuple(d.upper)),
                            features=config.input.features, privacy_unit=config.input.privacy_unit,
                            epsilon_share=d.epsilon_share, seed=config.seed, randomness=randomness)
