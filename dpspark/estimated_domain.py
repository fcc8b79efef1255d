"""``domain: {estimate: private}``: any central family, run on a box domain released by the run itself.

    DomainEstimating(build, dim=2, epsilon=1.0, delta=1e-6, outer=None, features=("x", "y")).fit(df)

The run's budget (epsilon, delta) is split BEFORE any data is read, from public inputs only:
``epsilon_share`` of epsilon (and, if its Gaussian release is chosen, ``DELTA_SHARE`` of delta)
for the estimate (``dpspark.privacy.bounds``: its mechanism and privacy argument), the rest
for the family, which is built by ``build(epsilon, delta, domain)`` on the RELEASED box and
treats it as public like any configured box. One accountant per part; the model's charges
list both, in order, and sum to the plan (``privacy_plan``).

Spark passes: one aggregation (two without a public outer box) over the feature columns,
after contribution bounding and the dropping of invalid rows as every family does; each is
a ``mapInArrow`` pass in which every partition counts its (feature, bin) pairs with numpy
(``histogram_kernel``: the rules ``bounds.octave_index`` and ``bounds.dyadic_index``) and
returns one (d, bins) array. The driver sums them, releases the histograms and decides the
bounds.
"""

from __future__ import annotations

import logging

import numpy as np

from dpspark import tables
from dpspark.privacy import bounds
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import LaplaceMechanism
from dpspark.privacy.randomness import Randomness
from dpspark.progress import step

log = logging.getLogger("dpspark")

DEFAULT_EPSILON_SHARE = bounds.DEFAULT_EPSILON_SHARE


class DomainEstimating:
    """A family estimator behind a private estimate of its box (see the module docstring)."""

    def __init__(self, build, dim: int, epsilon: float, delta: float, outer=None, features=("x", "y"),
                 privacy_unit: str | None = None, epsilon_share: float = DEFAULT_EPSILON_SHARE,
                 seed: int | None = None, randomness: Randomness | None = None, levels: int = bounds.LEVELS):
        self.build = build
        self.dim = dim
        self.epsilon = epsilon
        self.delta = delta
        self.outer = outer
        self.features = tuple(features)
        self.privacy_unit = privacy_unit
        self.epsilon_share = epsilon_share
        self.seed = seed
        self.randomness = randomness
        self.levels = levels

    # -- the plan (public inputs only) -------------------------------------------

    def _validated(self) -> bounds.EstimatePlan:
        if not (0.0 < float(self.epsilon_share) < 1.0):
            raise ValueError(f"epsilon_share={self.epsilon_share!r} should be in (0, 1)")
        if self.outer is not None:
            lower, upper = self.outer
            if len(lower) != self.dim or len(upper) != self.dim:
                raise ValueError(f"the outer box should have {self.dim} lower and upper bounds")
        eps_b = float(self.epsilon) * float(self.epsilon_share)
        delta_b = float(self.delta) * bounds.DELTA_SHARE
        return bounds.EstimatePlan(dim=self.dim, epsilon=eps_b, delta=delta_b,
                                   outer=None if self.outer is None else (tuple(self.outer[0]), tuple(self.outer[1])),
                                   levels=self.levels)

    def _family_budget(self) -> tuple[float, float]:
        eps_b, delta_b = self._validated().spends()
        return float(self.epsilon) - eps_b, float(self.delta) - delta_b

    def _placeholder(self):
        """The family on the public unit box: its validation and plan never depend on the box's values."""
        eps, delta = self._family_budget()
        return self.build(eps, delta, Domain(dim=self.dim, lower=(-1.0,) * self.dim, upper=(1.0,) * self.dim))

    def privacy_plan(self) -> tuple[float, float]:
        eps_b, delta_b = self._validated().spends()
        eps_f, delta_f = self._placeholder().privacy_plan()
        return eps_b + eps_f, delta_b + delta_f

    @property
    def name(self) -> str:
        return self._placeholder().name

    @property
    def guarantee(self) -> str:
        return getattr(self._placeholder(), "guarantee", "central")

    def preflight(self, spark, input_key, ledger) -> None:
        check = getattr(self._placeholder(), "preflight", None)
        if check is not None:
            check(spark, input_key, ledger)

    # -- fit ---------------------------------------------------------------------------

    def fit(self, df, timings: dict | None = None, operational: dict | None = None):
        plan = self._validated()
        timings = {} if timings is None else timings
        randomness = self.randomness or Randomness(self.seed)
        eps_b, delta_b = plan.spends()
        accountant = Accountant(eps_b, delta_b, randomness.noise)
        raw, _ = tables.prepare_raw(df, self.features, self.privacy_unit, self.dim, randomness.run_key)
        outer = plan.outer
        released = []
        lower = upper = clipped = None
        fell_back = np.zeros(self.dim, dtype=bool)
        for label, release, _, _ in plan.releases():
            if outer is None:
                with step("domain estimate: octave pass", timings):
                    exact_counts = octave_counts(raw, self.dim)
                noisy_counts = _release(accountant, label, exact_counts, release)
                lower, upper, fell_back = bounds.octave_box(noisy_counts, release.tau)
                outer = (tuple(lower), tuple(upper))
                if fell_back.any():  # post-processing of the noisy counts: public
                    log.warning("domain estimate: for feature(s) %s no octave's noisy count cleared its threshold "
                                "(too few records for this epsilon): their outer interval is the fallback %s; give "
                                "a loose public box (domain.lower/upper) or a larger domain.epsilon_share",
                                [int(j) for j in np.flatnonzero(fell_back)], list(bounds.FALLBACK))
            else:
                box = Domain(dim=self.dim, lower=tuple(outer[0]), upper=tuple(outer[1]))
                with step("domain estimate: dyadic pass", timings):
                    exact_counts = bounds.tree_levels(dyadic_counts(raw, box, self.levels), self.levels)
                noisy_counts = _release(accountant, label, exact_counts, release)
                lower, upper, clipped = bounds.tree_box(noisy_counts, release, outer[0], outer[1], self.levels)
            released.append({"step": label, "mechanism": release.name})
        accountant.finish()
        domain = Domain(dim=self.dim, lower=tuple(float(v) for v in lower), upper=tuple(float(v) for v in upper))
        eps_f, delta_f = float(self.epsilon) - eps_b, float(self.delta) - delta_b
        model = self.build(eps_f, delta_f, domain).fit(df, timings=timings, operational=operational)
        estimate = {"estimate": "private", "lower": list(domain.lower), "upper": list(domain.upper),
                    "noisy_clipped_fraction": [float(c) for c in clipped],
                    "outer": "public" if self.outer is not None else "estimated (octaves)",
                    "fallback_features": [int(j) for j in np.flatnonzero(fell_back)],
                    "epsilon": eps_b, "delta": delta_b, "releases": released}
        model.charges = accountant.summary() + list(model.charges)
        model.epsilon_spent = eps_b + model.epsilon_spent
        model.delta_spent = delta_b + model.delta_spent
        model.parameters = {**model.parameters,
                            "domain": f"private estimate (epsilon={eps_b:.6g}, delta={delta_b:.6g} of the total)"}
        model.info = {**model.info, "domain_estimate": estimate}
        return model


def _release(accountant: Accountant, label: str, exact_counts: np.ndarray, release: bounds.Release) -> np.ndarray:
    if isinstance(release.mechanism, LaplaceMechanism):
        return accountant.laplace(label, exact_counts, release.mechanism).astype(np.float64)
    return accountant.gaussian(label, exact_counts, release.mechanism).astype(np.float64)


def histogram_kernel(rule, dim: int, size: int):
    """A ``mapInArrow`` kernel: the exact (feature, bin) counts of one partition's rows, bins by the numpy
    ``rule`` ((rows, d) float64 values -> (rows, d) int64 bins in [0, size)), as ONE row holding the
    (d, size) int64 counts as bytes (NOT private; summed on the driver). The rows are already valid
    (``tables.prepare_raw``: finite doubles) and each falls in exactly one bin per feature."""

    def run(batches):
        import pyarrow as pa

        exact_counts = np.zeros((dim, size), dtype=np.int64)
        for batch in batches:
            if not len(batch):
                continue
            x = np.column_stack([batch.column(f"__f{j}").to_numpy(zero_copy_only=False) for j in range(dim)])
            bins = np.asarray(rule(x.astype(np.float64, copy=False)), dtype=np.int64).reshape(-1, dim)
            for j in range(dim):
                exact_counts[j] += np.bincount(bins[:, j], minlength=size)[:size]
        yield pa.RecordBatch.from_arrays([pa.array([exact_counts.tobytes()], type=pa.binary())], names=["counts"])

    return run


def _histograms(raw, rule, dim: int, size: int) -> np.ndarray:
    """One Spark job over the rows of ``raw``: exact counts of (feature, bin), (dim, size) int64, one
    partial histogram per partition (``histogram_kernel``) summed on the driver."""
    parts = (raw.select(*[f"__f{j}" for j in range(dim)])
             .mapInArrow(histogram_kernel(rule, dim, size), "counts binary").collect())
    exact_counts = np.zeros((dim, size), dtype=np.int64)
    for r in parts:
        exact_counts += np.frombuffer(r["counts"], dtype=np.int64).reshape(dim, size)
    return exact_counts


def octave_counts(raw, dim: int) -> np.ndarray:
    return _histograms(raw, bounds.octave_index, dim, bounds.OCTAVE_BINS)


def dyadic_counts(raw, box: Domain, levels: int) -> np.ndarray:
    return _histograms(raw, _DyadicRule(box, levels), box.dim, 1 << levels)


class _DyadicRule:
    """The finest dyadic bin of each value clipped into ``box`` (``Domain.clip_to_unit``, then
    ``bounds.dyadic_index``): a picklable callable for the executors."""

    def __init__(self, box: Domain, levels: int):
        self.box = box
        self.levels = levels

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return bounds.dyadic_index(self.box.clip_to_unit(x), self.levels)
