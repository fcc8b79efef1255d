"""Config keys of the dplloyd family (``algorithm.*``), validated before Spark starts.

Variants, named as in the paper:

=================  ============  =====================
variant            schedule      clusters, then merge
=================  ============  =====================
``average_k``      average       k  (DPLloyd-Impr, Su et al.)
``allocation_k``   allocation    k
``average_nk``     average       merge_factor * k, merged into k
``allocation_nk``  allocation    merge_factor * k, merged into k (DP-KCCM, default)
=================  ============  =====================
"""

from __future__ import annotations

from dataclasses import dataclass

from dpspark.errors import ConfigError

VARIANTS = {
    "average_k": ("average", False),
    "allocation_k": ("allocation", False),
    "average_nk": ("average", True),
    "allocation_nk": ("allocation", True),
}
NOISE_RULES = ("su", "paper")
MERGES = ("weighted_kmeans", "nearest_pair")
KEYS = ("variant", "iterations", "merge_factor", "schedule", "noise", "merge", "min_count")


@dataclass(frozen=True)
class DPLloydParams:
    variant: str = "allocation_nk"
    iterations: int = 12
    merge_factor: int = 3
    schedule: str = "allocation"
    noise: str = "su"
    merge: str = "weighted_kmeans"
    min_count: float = 1.0

    @property
    def merges(self) -> bool:
        return VARIANTS[self.variant][1]

    def n_clusters(self, k: int) -> int:
        """How many clusters the Lloyd iterations run with."""
        return k * self.merge_factor if self.merges else k


def validate_params(section, *, objective: str, k: int, dim: int, privacy) -> DPLloydParams:
    for key in section.data:
        if key not in KEYS:
            raise ConfigError(f"algorithm.{key}", f"unknown key for algorithm.name=dplloyd; allowed keys: {['name', 'objective', 'k', *KEYS]}")
    if objective != "kmeans":
        raise ConfigError("algorithm.objective", f"{objective!r} is not supported by dplloyd; allowed: ['kmeans'] (use maxcover for kmedian)")
    if privacy.delta != 0:
        raise ConfigError("privacy.delta", f"dplloyd is pure epsilon-DP and spends no delta: set privacy.delta to 0, got {privacy.delta:g} "
                          "(a run's charges must equal its configured budget)")
    variant = section.string("variant", "allocation_nk", choices=tuple(VARIANTS))
    default_schedule, merges = VARIANTS[variant]
    schedule = section.string("schedule", default_schedule, choices=("average", "allocation"))
    if schedule != default_schedule:
        raise ConfigError("algorithm.schedule", f"{schedule!r} contradicts algorithm.variant={variant!r}, whose schedule is {default_schedule!r}")
    iterations = section.integer("iterations", 12, low=1, high=1000)
    if schedule == "allocation" and iterations < 3:
        raise ConfigError("algorithm.iterations", f"the allocation schedule needs >= 3 iterations (three phases), got {iterations}")
    merge_factor = section.integer("merge_factor", 3, low=1, high=100)
    if merges and merge_factor < 2:
        raise ConfigError("algorithm.merge_factor", f"variant {variant!r} merges merge_factor*k clusters into k: merge_factor must be >= 2, got {merge_factor}")
    return DPLloydParams(
        variant=variant,
        iterations=iterations,
        merge_factor=merge_factor,
        schedule=schedule,
        noise=section.string("noise", "su", choices=NOISE_RULES),
        merge=section.string("merge", "weighted_kmeans", choices=MERGES),
        min_count=section.number("min_count", 1.0, low=0.0, high=1e12),
    )
