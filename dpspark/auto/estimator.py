"""``AutoClustering``: the default (``algorithm.name: auto``). It picks the method from PUBLIC inputs.

    model = AutoClustering(k=5, epsilon=1.0, delta=1e-6, domain=Domain(dim=24, lower=..., upper=...),
                           features=("f0", ...)).fit(df)
    model.info["auto"]   # what it chose and why

The choice (``choose``) reads only the public inputs: d, k, the objective and the
configured (epsilon, delta); never the data:

- d <= ``GRID_MAX_DIM``, k <= ``MAXCOVER_MAX_K``, delta > 0 and public inputs maxcover's own
  validation accepts (its coverage loop's per-pick weight at most 1): maxcover with its default candidates there,
  ``grid_or_private`` (the best method in 2-3 dimensions in the project's benchmark): a noisy
  row count chooses a public grid of max(1000, 40 k) points, or the private grid cells when
  it shows at least ``maxcover.params.PRIVATE_MIN_SIGNAL`` points per cluster at this epsilon;
  (epsilon, delta)-DP.
- d > ``GRID_MAX_DIM``, k-means, delta > 0 and ``EVOLUTION_MIN_K`` <= k <= ``EVOLUTION_MAX_K`` (many
  clusters in mid dimensions): private evolution of candidate centers (``dpspark.steps.evolution``,
  after PE-means): a noisy row count, then one Spark pass per generation counting each candidate's
  nearest points, released with the discrete Gaussian (zCDP-composed), selection and mutation on the
  driver; (epsilon, delta)-DP. When the noisy count is under ``evolution_min_rows(d, k)`` or
  over ``EVOLUTION_MAX_ROWS``, the tree route below runs on the rest of epsilon instead (``fit_votes``);
- otherwise, k-means: the private LSH-tree coreset (``dpspark.steps.tree``) solved on the
  driver as the start of a few DP Lloyd steps on the full data, pure epsilon-DP;
- otherwise, k-median: the same coreset solved by weighted k-median, pure epsilon-DP.

The configured delta is an upper bound for auto: a pure (tree) route spends (epsilon, 0) and
says so; ``privacy_plan`` states what the run will spend before any data is read.

Budget of the tree + Lloyd route (fractions of epsilon, public constants), in order:

1. ``ROOT_SHARE``: the noisy row count n_hat (the tree's root). From here on the choices
   read the public "signal" n_hat eps / (d k) (``signal``).
2. the tree levels and the leaves' sums (plus any tree levels not used): ``SHARES``, or
   ``SHARES_FEW_POINTS`` when the signal is below ``FEW_POINTS`` and d <= ``FEW_POINTS_MAX_DIM``
   (then a Lloyd step on the whole data is worth more than a finer coreset).
3. the start: ``SOLUTIONS`` weighted k-means restarts on the coreset (post-processing); with a
   signal of at least ``SELECT_MIN_SIGNAL`` one Spark pass computes their exact costs and
   the exponential mechanism picks one (``dpspark.auto.selection``, ``SELECT_SHARE``);
   otherwise the best on the coreset, free.
4. the rest, split evenly over T Lloyd steps; T (1-3) from n_hat and the public d, k,
   epsilon (``lloyd_steps``): a step helps only while the noise of a cluster mean, about
   d k T / (n_hat eps_lloyd) per coordinate, stays small.

k-median: steps 1-3, ``KMEDIAN_TREE_SHARE`` for the tree, the rest for the sums (less
``SELECT_SHARE`` when the selection runs), weighted k-median on the coreset, no Lloyd step.

A Lloyd step (the DP-Lloyd update of ``dpspark.dplloyd.core.noisy_update``, Su et al.'s
split of the step's epsilon between the count vector (sensitivity 1) and the sum vector
(L1 sensitivity d), one record in one cluster): exact counts and fixed-point sums per
nearest center from one Spark pass, released with discrete Laplace; the new center is
noisy sum / noisy count clipped into the domain, but only for a cluster whose noisy count
clears ``lloyd_min_count(eps_t, d)`` (public): below it the noise of the new mean would be
wider than the domain, and the cluster keeps its previous (released) center. Everything after a release is post-processing.
"""

from __future__ import annotations

import math

import numpy as np

from dpspark import solvers, tables
from dpspark.auto import selection
from dpspark.kernels import PACKED_COLUMN
from dpspark.model import ClusteringModel
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.randomness import Randomness
from dpspark.progress import step
from dpspark.steps import evolution, tree
from dpspark.steps.lloyd import lloyd_min_count, lloyd_move, noisy_update
from dpspark.steps.lloyd_pass import spark_aggregate

GRID_MAX_DIM = 3
# The maxcover route's driver work grows with k^2 (a grid of max(1000, 40 k) candidates, 2 k ln 2
# picks per threshold, each an exponential mechanism over the grid): at k = 1001 on a 120-row table a
# fit took over 15 minutes after its charge (the config fuzzer). Above this public k, the tree route.
MAXCOVER_MAX_K = 128
ROOT_SHARE = 0.04
# (tree, sums) shares of epsilon for k-means; the rest goes to the selection and the Lloyd steps.
# Measured (numpy reference, 11-31 seeded runs per cell, eps 0.5 and 1) against (0.26, 0.20):
# (0.20, 0.30) is better on google_review_ratings (1.14 vs 1.16), the same on electrical, credit and
# adult; a smaller tree share (0.15) gains more there (1.10) but makes the tree too shallow to
# separate tight, well-separated blobs in 20 dimensions (2.5 vs 1.45; tests/test_auto.py). With
# few points in few dimensions a bigger Lloyd share wins (against (0.15, 0.30): tripadvisor 1.38 vs 1.39, blood 1.45 vs
# 1.58; at eps 0.5 1.63 vs 1.75 and 2.1 vs 2.6); in 24 dimensions it loses.
SHARES = (0.20, 0.30)
SHARES_FEW_POINTS = (0.17, 0.10)  # when the signal is below FEW_POINTS and d <= FEW_POINTS_MAX_DIM
FEW_POINTS = 50.0
FEW_POINTS_MAX_DIM = 12
KMEDIAN_TREE_SHARE = 0.50  # k-median (no Lloyd steps): the sums take the rest (0.46)
SOLUTIONS = 10  # coreset solutions (weighted k-means restarts) ...
SELECT_SHARE = 0.05  # ... chosen privately on the data with this share of epsilon ...
SELECT_MIN_SIGNAL = 100.0  # ... when n_hat eps / (d k) is at least this (else: the best on the coreset, free)
OBJECTIVES = ("kmeans", "kmedian")
# k-means with delta > 0 in d > GRID_MAX_DIM from this k on: the evolution route (dpspark.steps.evolution).
EVOLUTION_MIN_K = 8
# ... up to this k (a generation's selection is a weighted k-means of up to evolution.POPULATION_CAP candidates
# with k restarts' work each; above it, the tree route, as for maxcover).
EVOLUTION_MAX_K = 128
# The evolution route's released row count n_hat picks its branch (post-processing): evolution when
# evolution_min_rows(d, k) <= n_hat <= EVOLUTION_MAX_ROWS, else the tree route with the rest of epsilon.
# Below: too few points per cluster for noisy votes. Where that is depends on d (public): in d = 5 the tree
# route is better from 100 rows per cluster down (blood, 748 rows, k 8-64: tree 2.69/4.05/6.73/14.4 against
# evolution 2.92/5.88/8.33/20.2), in d >= 10 evolution is better down to 10 (tripadvisor, 980 rows, d 10, k 8-64:
# 1.52/1.94/2.22/2.81 against 1.61/2.16/2.75/3.73; google reviews, d 24, k 64: 2.13 against 2.47); median of 5,
# docs/benchmarks.md "Few rows per cluster".
# Above: T passes over the data with up to evolution.POPULATION_CAP candidates each cost many times the tree
# route's 3-5 passes (at 3e4 x 24, k 16: about 20x), and the gain is measured only up to 3.3e4 rows (issue 51).
EVOLUTION_MIN_ROWS_PER_CLUSTER = 100.0
EVOLUTION_FEW_ROWS_MIN_DIM = 8  # from this d on ...
EVOLUTION_MIN_ROWS_PER_CLUSTER_FEW_ROWS = 10.0  # ... this many noisy rows per cluster are enough
EVOLUTION_MAX_ROWS = 100_000.0
# Not chosen, measured (docs/benchmarks.md, "auto against maxcover at k = 2-7 in d > 3"): maxcover in d > 3 at
# k < EVOLUTION_MIN_K is ahead of the tree route by 1-6% in 8 of 36 (table, k) cells, mostly the two 24-d tables
# at k 3-6, and behind in 16 (up to 60%: blood k 7; 26%: credit k 7); no rule on d, k and a noisy row count
# kept the gains without the losses. The evolution route below k 8 lost 20% on google reviews at k 2-3.

ROUTES = {
    "maxcover": "maxcover with its default candidates (a noisy row count chooses the public grid or private grid cells)",
    "evolution": "private evolution of candidate centers (noisy nearest-candidate votes per generation, PE-means)",
    "tree_lloyd": "private LSH-tree coreset, then DP Lloyd steps",
    "tree_kmedian": "private LSH-tree coreset, solved by weighted k-median",
}


def evolution_min_rows(dim: int, k: int) -> float:
    """The fewest noisy rows for which the evolution route runs its votes (public: from d and k)."""
    per_cluster = (EVOLUTION_MIN_ROWS_PER_CLUSTER_FEW_ROWS if dim >= EVOLUTION_FEW_ROWS_MIN_DIM
                   else EVOLUTION_MIN_ROWS_PER_CLUSTER)
    return per_cluster * k


def choose(dim: int, objective: str, delta: float, k: int | None = None) -> tuple[str, str]:
    """(route, why) from public inputs only."""
    if dim <= GRID_MAX_DIM and delta > 0:
        return "maxcover", (f"d={dim} <= {GRID_MAX_DIM} and delta={delta:g} > 0: maxcover, with a public grid or private "
                            "grid cells as candidates (a noisy row count picks one), is the most accurate method "
                            "measured in few dimensions")
    if objective == "kmeans" and delta > 0 and k is not None and EVOLUTION_MIN_K <= k <= EVOLUTION_MAX_K:
        return "evolution", (f"many clusters in mid dimensions (k={k} >= {EVOLUTION_MIN_K}, d={dim} > {GRID_MAX_DIM}, "
                             f"delta={delta:g} > 0): private evolution of candidate centers, which beat the tree "
                             "coreset there in the project's benchmark, when a noisy row count is between "
                             f"{evolution_min_rows(dim, 1):g} k (d {'>=' if dim >= EVOLUTION_FEW_ROWS_MIN_DIM else '<'} "
                             f"{EVOLUTION_FEW_ROWS_MIN_DIM}) and {EVOLUTION_MAX_ROWS:g}")
    why = (f"d={dim} > {GRID_MAX_DIM}: grid cells thin out in many dimensions, random hyperplane cells do not"
           if dim > GRID_MAX_DIM else "delta=0: maxcover needs delta > 0, the tree route is pure epsilon-DP")
    return ("tree_lloyd" if objective == "kmeans" else "tree_kmedian"), why


def signal(noisy_n: float, dim: int, k: int, epsilon: float) -> float:
    """n_hat eps / (d k): how many points per cluster and dimension the budget sees (public)."""
    return max(noisy_n, 0.0) * epsilon / (dim * k)


def lloyd_steps(noisy_n: float, dim: int, k: int, eps_lloyd: float) -> int:
    """How many DP Lloyd steps the rest of the budget buys (public: n_hat is released)."""
    noise = dim * k / max(noisy_n * eps_lloyd, 1e-12)
    if noise > 0.02:
        return 1
    if noise > 0.005:
        return 2
    return 3


class AutoClustering:
    name = "auto"

    def __init__(self, k: int, epsilon: float, delta: float, domain: Domain, features=("x", "y"), objective: str = "kmeans",
                 privacy_unit: str | None = None, seed: int | None = None, randomness: Randomness | None = None):
        self.k = k
        self.epsilon = epsilon
        self.delta = delta
        self.domain = domain
        self.features = tuple(features)
        self.objective = objective
        self.privacy_unit = privacy_unit
        self.seed = seed
        self.randomness = randomness

    @classmethod
    def from_config(cls, config, randomness: Randomness | None = None) -> "AutoClustering":
        return cls(k=config.algorithm.k, epsilon=config.privacy.epsilon, delta=config.privacy.delta,
                   domain=Domain.from_config(config.domain), features=config.input.features,
                   objective=config.algorithm.objective, privacy_unit=config.input.privacy_unit, seed=config.seed,
                   randomness=randomness)

    # -- validation (one place) ------------------------------------------------

    def _validated(self) -> tuple[str, str]:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"k={self.k!r} should be an integer >= 1")
        if not isinstance(self.epsilon, (int, float)) or isinstance(self.epsilon, bool) or not (self.epsilon > 0) or math.isinf(self.epsilon):
            raise ValueError(f"epsilon={self.epsilon!r} should be a finite number > 0")
        if not isinstance(self.delta, (int, float)) or isinstance(self.delta, bool) or not (0 <= self.delta < 1):
            raise ValueError(f"delta={self.delta!r} should be in [0, 1) (an upper bound: auto may spend less)")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r} should be one of {list(OBJECTIVES)}")
        if len(self.features) not in (1, self.domain.dim):
            raise ValueError(f"features={list(self.features)} should name {self.domain.dim} columns or one array column")
        route, why = choose(self.domain.dim, self.objective, float(self.delta), int(self.k))
        if route == "maxcover" and int(self.k) > MAXCOVER_MAX_K:
            return (("tree_lloyd" if self.objective == "kmeans" else "tree_kmedian"),
                    f"k={self.k} > {MAXCOVER_MAX_K}: maxcover's driver work grows with k^2 (a grid of 40 k candidates, "
                    "2 k ln 2 picks per threshold); the tree route's does not")
        if route == "maxcover":
            # The route's own validation, before any charge: public inputs for which maxcover cannot
            # run (its coverage loop's per-pick weight eps' > 1 at a large epsilon, a grid too large
            # for a huge k) take the tree route, which runs with any of them.
            try:
                self._maxcover(None)._validated_params()
            except ValueError as exc:
                fallback = "tree_lloyd" if self.objective == "kmeans" else "tree_kmedian"
                return fallback, (f"maxcover cannot run with these public inputs ({exc}); the tree route needs no delta "
                                  "and takes any epsilon and k")
        if route == "evolution":
            # Its plan (sigma from OpenDP's maps), before any charge: where none exists for these public inputs
            # (e.g. an epsilon of 10^4 overflows the conversion), the tree route, as for maxcover.
            try:
                for noisy_n in (None, 0.0):  # the default T and the deep one (a small n_hat): either may run
                    evolution.plan(float(self.epsilon), float(self.delta), self.domain.dim,
                                   generations_override=evolution.generations(self.domain.dim, noisy_n))
            except Exception as exc:  # ValueError, AssertionError, OpenDP's errors: all from public inputs
                return "tree_lloyd", (f"the evolution route has no plan for these public inputs ({type(exc).__name__}: "
                                      f"{str(exc)[:200]}); the tree route needs no delta and takes any epsilon")
        return route, why

    def privacy_plan(self) -> tuple[float, float]:
        """(epsilon, delta) that ``fit`` will spend: public, known before any data is read."""
        route, _ = self._validated()
        return (float(self.epsilon), float(self.delta)) if route in ("maxcover", "evolution") else (float(self.epsilon), 0.0)

    # -- fit -----------------------------------------------------------------------

    def fit(self, df, timings: dict | None = None, operational: dict | None = None) -> ClusteringModel:
        route, why = self._validated()
        timings = {} if timings is None else timings
        randomness = self.randomness or Randomness(self.seed)
        if route == "maxcover":
            model = self._maxcover(randomness).fit(df, timings=timings, operational=operational)
            chosen = {"route": route, "method": ROUTES[route], "why": why}
            model.algorithm = self.name
            model.parameters = {"k": self.k, "objective": self.objective, "chosen": route, "why": why,
                                **{key: v for key, v in model.parameters.items() if key not in ("k", "objective")}}
            model.info = {**model.info, "auto": chosen}
            return model
        if route == "evolution":
            return self._evolution(df, why, randomness, timings, operational)
        return self._tree(df, route, why, randomness, timings, operational)

    def _maxcover(self, randomness: Randomness):
        from dpspark.maxcover.estimator import MaxCover

        # candidate_count: the private cells keep at most this many, so at least k (the grid has
        # max(1000, 40 k) points whatever it is)
        return MaxCover(k=self.k, epsilon=self.epsilon, delta=self.delta, domain=self.domain, features=self.features,
                        objective=self.objective, candidates="grid_or_private", candidate_count=max(1000, int(self.k)),
                        privacy_unit=self.privacy_unit, seed=self.seed, randomness=randomness)

    def _tree(self, df, route: str, why: str, randomness: Randomness, timings: dict, operational: dict | None) -> ClusteringModel:
        unit_df, feature_names = tables.prepare_points(df, self.features, self.privacy_unit, self.domain, randomness.run_key)
        columns = [PACKED_COLUMN]  # one packed column: each batch read as one buffer (``kernels.batch_points``)
        cached = tables.packed_points(unit_df, self.domain.dim).persist()
        try:
            return self.fit_aggregates(tree.spark_tree_aggregates(cached, columns, timings=timings),
                                       spark_aggregate(cached, columns), selection.spark_costs(cached, columns, timings),
                                       feature_names, randomness, timings, operational)
        finally:
            cached.unpersist()

    def _evolution(self, df, why: str, randomness: Randomness, timings: dict, operational: dict | None) -> ClusteringModel:
        unit_df, feature_names = tables.prepare_points(df, self.features, self.privacy_unit, self.domain, randomness.run_key)
        columns = [PACKED_COLUMN]  # one packed column: each batch read as one buffer (``kernels.batch_points``)
        cached = tables.packed_points(unit_df, self.domain.dim).persist()
        try:
            aggregate = spark_aggregate(cached, columns)
            tree_branch = (tree.spark_tree_aggregates(cached, columns, timings=timings), aggregate,
                           selection.spark_costs(cached, columns, timings))
            return self.fit_votes(cached.count, lambda population: aggregate(population)[0], feature_names, randomness,
                                  timings, operational, tree_branch)
        finally:
            cached.unpersist()

    def fit_votes(self, exact_count, votes, feature_names, randomness: Randomness | None = None,
                  timings: dict | None = None, operational: dict | None = None, tree_branch=None) -> ClusteringModel:
        """The evolution route on given exact aggregations: ``exact_count()`` -> n, ``votes(population)`` -> exact
        nearest-candidate counts, ``tree_branch`` = (tree_aggregate, lloyd_aggregate, costs) as ``fit_aggregates``
        takes them (Spark passes in ``fit``; numpy references in tests). (epsilon, delta)-DP:

        1. n_hat, the row count with DLap noise (``evolution.COUNT_SHARE`` of epsilon);
        2. from n_hat only (post-processing), one branch with the rest, (epsilon - eps_count, delta):
           evolution_min_rows(d, k) <= n_hat <= EVOLUTION_MAX_ROWS: the T vote histograms, T =
           ``evolution.generations(d, n_hat)`` and sigma from it (``dpspark.steps.evolution``); else the tree + Lloyd route on epsilon - eps_count, pure, and the
           delta charged as planned (adaptive composition bounds the run by the count plus the costlier
           branch; what the run reports is that bound).
        """
        route, why = self._validated()
        if route != "evolution":
            raise ValueError(f"fit_votes runs the evolution route only (chosen: {route})")
        if tree_branch is None or len(tree_branch) != 3:
            raise ValueError("fit_votes needs tree_branch=(tree_aggregate, lloyd_aggregate, costs): the noisy row count "
                             "may choose the tree branch")
        timings = {} if timings is None else timings
        randomness = randomness or self.randomness or Randomness(self.seed)
        epsilon, delta, k = float(self.epsilon), float(self.delta), int(self.k)
        accountant = Accountant(epsilon, delta, randomness.noise)
        plan = evolution.plan(epsilon, delta, self.domain.dim)
        passes = {"count": 1, "votes": 0}
        noisy_n = evolution.noisy_row_count(exact_count, plan, accountant)
        min_rows = evolution_min_rows(self.domain.dim, k)
        if not (min_rows <= noisy_n <= EVOLUTION_MAX_ROWS):
            reason = (f"{why}; but its noisy row count {noisy_n:.0f} is "
                      + (f"below {min_rows / k:g} k = {min_rows:g}: too few points "
                         "per cluster for noisy votes" if noisy_n < min_rows else
                         f"above {EVOLUTION_MAX_ROWS:g}: {plan.generations} passes with up to {evolution.POPULATION_CAP} "
                         "candidates would cost many times the tree route")
                      + ", so the tree route runs on the rest of epsilon")
            accountant.charge("auto: the evolution branch's delta (the branch is chosen from the noisy row count)",
                              0.0, delta, "adaptive composition: the run is bounded by the count plus its costlier "
                              "branch, (epsilon - eps_count, delta); the tree branch spends no delta itself")
            return self._tree_on("tree_lloyd", reason, accountant, plan.block_epsilon, tree_branch, feature_names,
                                 randomness, timings, operational, passes={"count": 1},
                                 spends="epsilon and delta (a noisy row count chose the tree branch of the evolution route)",
                                 delta_note="the configured delta is charged: the branch was chosen from a noisy count")
        # T (and so sigma) from the released n_hat and public inputs: the same block budget, more generations
        # where a pass is cheap (evolution.generations); both plans were validated before the count's charge
        plan = evolution.plan(epsilon, delta, self.domain.dim,
                              generations_override=evolution.generations(self.domain.dim, noisy_n))

        def counted_votes(population):
            with step(f"auto pass: nearest-candidate votes of {population.shape[0]} candidates "
                      f"(generation {passes['votes'] + 1}/{plan.generations})", timings):
                out = votes(population)
            passes["votes"] += 1
            return out

        result = evolution.evolve(noisy_n, counted_votes, self.domain, k, plan, accountant,
                                  randomness.public_rng("auto.evolution"))
        accountant.finish()
        if operational is not None:
            operational["spark_passes"] = sum(passes.values())
            operational["passes_by_kind"] = passes
        chosen = {"route": route, "method": ROUTES[route], "why": why, "noisy_rows": result.noisy_n,
                  "evolution": result.info}
        return ClusteringModel(
            algorithm=self.name, objective=self.objective, centers=self.domain.from_unit(result.centers),
            noisy_weights=result.weights, epsilon_spent=accountant.spent_epsilon, delta_spent=accountant.spent_delta,
            charges=accountant.summary(), domain=self.domain, features=self.features, feature_names=list(feature_names),
            parameters={"k": k, "objective": self.objective, "chosen": route, "why": why,
                        "generations": plan.generations, "spends": "epsilon and delta (zCDP-composed Gaussian votes)"},
            info={"auto": chosen, "randomness": randomness.describe()},
        )

    def fit_aggregates(self, tree_aggregate, lloyd_aggregate, costs, feature_names, randomness: Randomness | None = None,
                       timings: dict | None = None, operational: dict | None = None) -> ClusteringModel:
        """The tree routes on given exact aggregations (Spark passes in ``fit``; numpy references in tests).

        ``tree_aggregate(w, b)`` as ``tree.spark_tree_aggregates``; ``lloyd_aggregate(centers)`` as
        ``steps.lloyd_pass.spark_aggregate``; ``costs(solutions, power, cap)`` as ``selection.spark_costs``.
        """
        route, why = self._validated()
        if route not in ("tree_lloyd", "tree_kmedian"):
            raise ValueError(f"fit_aggregates runs the tree routes only (chosen: {route})")
        randomness = randomness or self.randomness or Randomness(self.seed)
        epsilon = float(self.epsilon)
        return self._tree_on(route, why, Accountant(epsilon, 0.0, randomness.noise), epsilon,
                             (tree_aggregate, lloyd_aggregate, costs), feature_names, randomness, timings, operational,
                             passes={}, spends="epsilon only (pure epsilon-DP)",
                             delta_note="pure epsilon-DP: spends no delta"
                             + (f" (configured delta={self.delta:g} is an upper bound)" if self.delta > 0 else ""))

    def _tree_on(self, route, why, accountant: Accountant, epsilon: float, aggregates, feature_names,
                 randomness: Randomness, timings: dict | None, operational: dict | None, passes: dict, spends: str,
                 delta_note: str) -> ClusteringModel:
        """The tree route with ``epsilon`` of ``accountant``'s budget (all of what is left of it)."""
        tree_aggregate, lloyd_aggregate, costs = aggregates
        timings = {} if timings is None else timings
        rng = randomness.public_rng("auto")
        k, dim = int(self.k), self.domain.dim
        passes = {**passes, "tree": 1, "selection": 0, "lloyd": 0}
        eps_root = ROOT_SHARE * epsilon

        def split(noisy_n: float) -> tuple[float, float]:  # from public inputs and the released row count
            if route == "tree_kmedian":
                select = SELECT_SHARE * epsilon if signal(noisy_n, dim, k, epsilon) >= SELECT_MIN_SIGNAL else 0.0
                return KMEDIAN_TREE_SHARE * epsilon, epsilon - eps_root - KMEDIAN_TREE_SHARE * epsilon - select
            few = signal(noisy_n, dim, k, epsilon) < FEW_POINTS and dim <= FEW_POINTS_MAX_DIM
            tree_share, sums_share = SHARES_FEW_POINTS if few else SHARES
            return tree_share * epsilon, sums_share * epsilon

        coreset = tree.private_coreset(tree_aggregate, self.domain, k, eps_root, split, accountant, rng)
        centers, weights, chosen_solution = self._start(coreset, route, accountant, rng, costs, epsilon, passes)
        steps = 0
        if route == "tree_lloyd":
            centers, weights, steps = self._lloyd(centers, weights, coreset.noisy_n, accountant, lloyd_aggregate, timings, passes)
        accountant.finish()
        if operational is not None:
            operational["spark_passes"] = sum(passes.values())
            operational["passes_by_kind"] = passes
        chosen = {"route": route, "method": ROUTES[route], "why": why, "noisy_rows": coreset.noisy_n,
                  "tree": coreset.info, "start": chosen_solution, "lloyd_steps": steps, "delta_note": delta_note}
        return ClusteringModel(
            algorithm=self.name, objective=self.objective, centers=self.domain.from_unit(centers),
            noisy_weights=np.asarray(weights, dtype=np.float64), epsilon_spent=accountant.spent_epsilon,
            delta_spent=accountant.spent_delta, charges=accountant.summary(), domain=self.domain, features=self.features,
            feature_names=list(feature_names),
            parameters={"k": k, "objective": self.objective, "chosen": route, "why": why, "start": chosen_solution,
                        "lloyd_steps": steps, "spends": spends},
            info={"auto": chosen, "randomness": randomness.describe()},
        )

    def _start(self, coreset, route, accountant, rng, costs, epsilon, passes):
        """k centers from the released coreset: SOLUTIONS restarts, the best chosen on the coreset (free) or,
        with enough signal, privately on the data (``selection``)."""
        k, dim = int(self.k), self.domain.dim
        if coreset.points.shape[0] == 0 or not (coreset.weights > 0).any():
            return self.domain.sample_unit(rng, k), np.zeros(k), "public random points (the tree released no leaf)"
        power = 2 if route == "tree_lloyd" else 1
        solve = solvers.weighted_kmeans if power == 2 else solvers.weighted_kmedian
        solutions = [solve(coreset.points, coreset.weights, k, rng, n_init=1) for _ in range(SOLUTIONS)]
        centers = np.stack([self.domain.clip_unit(np.asarray(c, dtype=np.float64)) for c, _ in solutions])
        if signal(coreset.noisy_n, dim, k, epsilon) >= SELECT_MIN_SIGNAL:
            i = selection.select_solution(costs, centers, self.domain, power, SELECT_SHARE * epsilon, accountant)
            passes["selection"] += 1
            how = f"solution {i + 1} of {SOLUTIONS} on the coreset, chosen privately by its cost on the data"
        else:
            coreset_costs = [solvers.weighted_cost(coreset.points, coreset.weights, c, power) for c in centers]
            i = int(np.argmin(coreset_costs))
            how = f"the best of {SOLUTIONS} solutions by their cost on the coreset"
        return centers[i], np.asarray(solutions[i][1], dtype=np.float64), how

    def _lloyd(self, centers, weights, noisy_n, accountant, aggregate, timings, passes):
        """DP Lloyd steps on the data with the rest of the budget."""
        eps_lloyd = accountant.remaining_epsilon
        steps = lloyd_steps(noisy_n, self.domain.dim, int(self.k), eps_lloyd)
        shares = [eps_lloyd / steps] * (steps - 1)
        shares.append(eps_lloyd - math.fsum(shares))
        for t, eps_t in enumerate(shares, start=1):
            with step(f"auto pass: DP Lloyd step {t}/{steps}", timings):
                exact_counts, exact_sums = aggregate(centers)
            passes["lloyd"] += 1
            noisy_counts, noisy_sums = noisy_update(exact_counts, exact_sums, eps_t, "su", accountant, f"auto: Lloyd step {t}/{steps}")
            centers, weights = lloyd_move(centers, noisy_counts, noisy_sums, lloyd_min_count(eps_t, self.domain.dim, "su"),
                                          self.domain)
        return centers, weights, steps
