"""The in-run accountant: every noisy release goes through it and is charged.

An algorithm declares its budget up front (``Accountant(epsilon, delta, noise)``,
checked against the config before any data is read), then releases every noisy
value through ``laplace`` / ``gaussian`` / ``exponential`` (each charges its
mechanism's privacy map for the stated input distance), or through a ``block``:
a group of releases whose joint guarantee is a theorem stated by the caller (for
example the maximum-coverage paper's bound for its whole coverage loop), charged
once. A theorem holds for given mechanisms and a given number of releases, so a
block is opened with exactly those (``releases={mechanism: cap}``) and refuses
any other mechanism, or parameters, and release number cap + 1. A release that
would overspend raises ``PrivacyAccountingError`` before any noise is drawn;
``finish`` checks that the run spent exactly what it declared.

Composition across charges is basic (sequential) composition: the epsilons add
and the deltas add. Releases on disjoint parts of the data (one record touches one
cluster) are one vector-valued release with the sensitivity of the whole vector,
which is parallel composition stated as a sensitivity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dpspark.errors import PrivacyAccountingError
from dpspark.privacy.mechanisms import ExponentialMechanism, GaussianMechanism, LaplaceMechanism, NoiseSource

REL_TOL = 1e-12


@dataclass(frozen=True)
class Charge:
    label: str
    epsilon: float
    delta: float
    rule: str

    def as_dict(self) -> dict:
        return {"step": self.label, "epsilon": self.epsilon, "delta": self.delta, "rule": self.rule}


def _exceeds(total: float, budget: float) -> bool:
    return total > budget * (1 + REL_TOL) + 1e-300


class Accountant:
    def __init__(self, epsilon: float, delta: float, noise: NoiseSource):
        if not (epsilon > 0) or math.isinf(epsilon):
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        if not (0 <= delta < 1):
            raise ValueError(f"delta must be in [0, 1), got {delta!r}")
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.noise = noise
        self.charges: list[Charge] = []

    # -- totals ----------------------------------------------------------------

    @property
    def spent_epsilon(self) -> float:
        return math.fsum(c.epsilon for c in self.charges)

    @property
    def spent_delta(self) -> float:
        return math.fsum(c.delta for c in self.charges)

    @property
    def remaining_epsilon(self) -> float:
        return max(0.0, self.epsilon - self.spent_epsilon)

    def charge(self, label: str, epsilon: float, delta: float = 0.0, rule: str = "basic composition") -> Charge:
        """Charge (epsilon, delta) for ``label``; refuse (before any noise) if it would overspend."""
        if not (epsilon >= 0) or not (delta >= 0) or math.isinf(epsilon):
            raise PrivacyAccountingError(f"invalid charge for {label!r}: epsilon={epsilon!r}, delta={delta!r}")
        new_eps = math.fsum([self.spent_epsilon, epsilon])
        new_delta = math.fsum([self.spent_delta, delta])
        if _exceeds(new_eps, self.epsilon) or _exceeds(new_delta, self.delta):
            raise PrivacyAccountingError(
                f"step {label!r} would spend epsilon={epsilon:g}, delta={delta:g}, bringing the run to "
                f"epsilon={new_eps:.12g}, delta={new_delta:.6g}, over its budget "
                f"epsilon={self.epsilon:.12g}, delta={self.delta:.6g}"
            )
        c = Charge(label, float(epsilon), float(delta), rule)
        self.charges.append(c)
        return c

    def finish(self) -> None:
        """The run must spend exactly its declared budget (within 1e-9): not more, and not silently less."""
        for name, spent, budget in (("epsilon", self.spent_epsilon, self.epsilon), ("delta", self.spent_delta, self.delta)):
            if abs(spent - budget) > 1e-9 * max(1.0, budget):
                raise PrivacyAccountingError(f"the run declared {name}={budget:.12g} but its charges sum to {spent:.12g}")

    def summary(self) -> list[dict]:
        return [c.as_dict() for c in self.charges]

    # -- charged releases ----------------------------------------------------------

    def laplace(self, label: str, exact, mechanism: LaplaceMechanism, d_in: float | None = None) -> np.ndarray:
        eps, delta = mechanism.privacy_map(mechanism.sensitivity if d_in is None else d_in)
        self.charge(label, eps, delta, "discrete Laplace, pure DP")
        return mechanism.release(exact, self.noise)

    def gaussian(self, label: str, exact, mechanism: GaussianMechanism, d_in: float | None = None) -> np.ndarray:
        eps, delta = mechanism.privacy_map(mechanism.sensitivity if d_in is None else d_in)
        self.charge(label, eps, delta, "discrete Gaussian via zCDP")
        return mechanism.release(exact, self.noise)

    def exponential(self, label: str, scores, mechanism: ExponentialMechanism, d_in: float | None = None) -> int:
        eps, delta = mechanism.privacy_map(mechanism.sensitivity if d_in is None else d_in)
        self.charge(label, eps, delta, "exponential mechanism, pure DP")
        return mechanism.select(scores, self.noise)

    def block(self, label: str, epsilon: float, delta: float, rule: str,
              releases: Mapping[object, int] | None = None) -> "Block":
        """Charge (epsilon, delta) once for a group of releases covered by the theorem ``rule``.

        ``releases`` maps every mechanism the theorem is stated for (the exact
        frozen mechanism object: class, epsilon, sensitivity, ...) to the largest
        number of releases of it the theorem covers. The block refuses any other
        mechanism and any release beyond its cap (see :class:`Block`); a block
        declared without ``releases`` can release nothing. Validated before the
        charge.
        """
        declared = _declared_releases(label, releases)
        self.charge(label, epsilon, delta, rule)
        return Block(label, epsilon, delta, rule, self.noise, declared)


_BLOCK_MECHANISMS = (ExponentialMechanism, LaplaceMechanism, GaussianMechanism)


def _declared_releases(label: str, releases) -> dict:
    if releases is None:
        return {}
    if not isinstance(releases, Mapping):
        raise PrivacyAccountingError(f"block {label!r}: releases must map mechanisms to release caps, got {releases!r}")
    declared = {}
    for mech, cap in releases.items():
        if not isinstance(mech, _BLOCK_MECHANISMS):
            raise PrivacyAccountingError(f"block {label!r}: {mech!r} is not a mechanism")
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
            raise PrivacyAccountingError(f"block {label!r}: the release cap of {mech!r} must be an integer >= 1, got {cap!r}")
        declared[mech] = int(cap)
    return declared


class Block:
    """Releases inside a block already charged as a whole (see ``Accountant.block``).

    The caller's theorem, not basic composition, bounds the block; it holds for
    the mechanisms it was proved for and for at most so many releases of each.
    The block therefore checks every release BEFORE any noise is drawn: the
    mechanism must equal a declared one (same class and parameters: a frozen
    dataclass compares all its fields, so a larger epsilon, another sensitivity
    or a subclass is refused), and its release count must stay within the
    declared cap. Either failure raises ``PrivacyAccountingError``: it is a bug in
    the algorithm, and the run fails (its charge stays recorded).
    """

    def __init__(self, label: str, epsilon: float, delta: float, rule: str, noise: NoiseSource,
                 releases: Mapping[object, int] | None = None):
        self.label, self.epsilon, self.delta, self.rule = label, epsilon, delta, rule
        self.noise = noise
        self.caps: dict = _declared_releases(label, releases)
        self.counts: dict = {mech: 0 for mech in self.caps}
        self.releases = 0

    def _admit(self, mechanism, kind: type) -> None:
        """Count one release of ``mechanism``; refuse it if undeclared or over its cap."""
        if not isinstance(mechanism, kind) or mechanism not in self.caps:
            declared = ", ".join(repr(m) for m in self.caps) or "none"
            raise PrivacyAccountingError(
                f"block {self.label!r} was not proved for {mechanism!r}; declared: {declared}"
            )
        if self.counts[mechanism] >= self.caps[mechanism]:
            raise PrivacyAccountingError(
                f"block {self.label!r}: release {self.counts[mechanism] + 1} of {mechanism!r} is over the "
                f"{self.caps[mechanism]} releases its theorem covers"
            )
        self.counts[mechanism] += 1
        self.releases += 1

    def exponential(self, scores, mechanism: ExponentialMechanism) -> int:
        self._admit(mechanism, ExponentialMechanism)
        return mechanism.select(scores, self.noise)

    def laplace(self, exact, mechanism: LaplaceMechanism) -> np.ndarray:
        self._admit(mechanism, LaplaceMechanism)
        return mechanism.release(exact, self.noise)

    def gaussian(self, exact, mechanism: GaussianMechanism) -> np.ndarray:
        self._admit(mechanism, GaussianMechanism)
        return mechanism.release(exact, self.noise)
