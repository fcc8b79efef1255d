"""Config keys of ``algorithm.name: auto`` (the default): none beyond name, objective and k.

auto chooses its method and parameters from public inputs (see ``dpspark.auto.estimator``);
a user who wants to set family keys names the family (``maxcover``, ``dplloyd``, ``ldp``).
privacy.delta is an upper bound: auto may spend (epsilon, 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpspark.errors import ConfigError

KEYS: tuple[str, ...] = ()


@dataclass(frozen=True)
class AutoParams:
    pass


def validate_params(section, *, objective: str, k: int, dim: int, privacy) -> AutoParams:
    for key in section.data:
        raise ConfigError(f"algorithm.{key}", "unknown key for algorithm.name=auto, which chooses its own parameters; "
                                              "allowed keys: ['name', 'objective', 'k'] (name a family, e.g. "
                                              "algorithm.name=maxcover, to set family keys)")
    return AutoParams()
