"""``MaxCover``: the estimator of the maxcover family (Algorithm 2 of ``papers/maxcover-dp-clustering.txt``).

    model = MaxCover(k=5, epsilon=1.0, delta=1e-6, domain=Domain(dim=2, lower=(0, 0), upper=(1, 1)),
                     features=("x", "y"), objective="kmedian", candidates="grid").fit(df)
    model.centers, model.epsilon_spent, model.delta_spent

A run, all distances in the unit space of the domain (Delta = ``domain.unit_diameter``):

0. ``grid_or_private`` (the default in d <= 3) first releases the row count, which
   chooses between ``grid`` and ``private`` (``choose_by_count``); its grid branch then
   releases a coarse histogram of the box (the same Spark pass as the count) and puts half
   the grid on the cells it shows occupied (``zoomed_candidates``, charged (eps_zoom, 0));
1. candidates V: public (table / grid / random), the DP grid generator (``private``:
   one Spark pass, two from d = 4 on, charged (eps_cand, delta_cand)) or the private
   LSH tree's leaf means (``tree``: one Spark pass, charged (eps_cand, 0));
2. the coverage loop (``core.run_coverage``): thresholds t_i = (1+a)^(i-1)
   Delta^p / N (N = ``n_upper`` or |V|), one Spark pass per threshold returning
   the uncovered points' cover-signature histogram, all m picks exactly on the
   driver; charged (eps_cov, delta_cov) once under the paper's Lemma 4.1;
3. one Spark pass snapping every point to its nearest chosen candidate; the
   counts are released with discrete Laplace(1/eps_cnt), charged (eps_cnt, 0);
4. post-processing: the driver solver (``solver``) on the chosen candidates
   weighted by max(noisy count, 0), counts below their noise floor read as zero
   (``core.significant_weights``);
5. with a ``lloyd_share`` (k-means; 0.5 with tree candidates), one more Spark
   pass: a DP Lloyd step from the solved centers (``polish``), charged (eps_lloyd, 0).

Passes over the data: r + 1 (+ 1 for private or tree candidates; + 2 for private
candidates from d = 4 on, see ``passes.cell_aggregates``; + 1 for the row count of
``grid_or_private``, the default in d <= 3), for every n and d: a
threshold whose histogram has more than ``max_signatures`` distinct signatures
(or more than ``max_pairs`` (signature, candidate) pairs) keeps it on the executors and runs one job per pick over that histogram, never
over the data again. The pass and job counts, the list of such thresholds, the
signature histogram sizes and the timings depend on the data and are
not DP outputs: they go to the caller's ``operational`` dict (NON-PRIVATE
operational metadata), never onto the model, which holds released and public
values only.

Budget: epsilon = [eps_choice + [eps_zoom] +] eps_cand + eps_cov + eps_cnt [+ eps_lloyd] (fractions from the
config; the split divides what the row count and the Lloyd step leave), delta =
delta_cand + delta_cov (private candidates: ``delta_candidates`` of delta, default
half; tree and public candidates: all of delta to the coverage loop).
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np

from dpspark import solvers, tables
from dpspark.maxcover import candidates as cand_mod
from dpspark.maxcover import core
from dpspark.maxcover.params import (CANDIDATE_MODES, CHARGED_MODES, CHOICE_SHARE, ZOOM_SHARE, DEFAULT_SPLIT_PRIVATE, DEFAULT_SPLIT_PUBLIC,
                                     GRID_PER_CLUSTER, MAX_GRID_POINTS, PRIVATE_MIN_SIGNAL, SOLVERS, MaxCoverParams, budget_split, choose_candidates,
                                     chosen_params, default_candidates, default_lloyd_share, default_solver,
                                     MAX_LLOYD_SHARE, MAX_PAIRS_ENV, MAX_SIGNATURES_ENV, bounded)
from dpspark.maxcover.passes import PassCounter, SparkCoverage, snap_counts
from dpspark.errors import ConfigError, SchemaError
from dpspark.kernels import PACKED_COLUMN
from dpspark.model import ClusteringModel
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import LaplaceMechanism
from dpspark.privacy.randomness import Randomness
from dpspark.progress import log, step
from dpspark.steps.lloyd import lloyd_min_count, lloyd_move, noisy_update
from dpspark.steps.lloyd_pass import spark_aggregate
from dpspark.steps.tree import spark_tree_aggregates

POWER = {"kmedian": 1, "kmeans": 2}


class MaxCover:
    name = "maxcover"

    def __init__(self, k: int, epsilon: float, delta: float, domain: Domain, features=("x", "y"),
                 objective: str = "kmeans", candidates: str | None = None, candidate_table: str | None = None,
                 candidate_count: int = 1000, candidate_scales: int = 5, coverage_approx: float = 0.5,
                 eps_candidates: float | None = None, eps_coverage: float | None = None, eps_counts: float | None = None,
                 delta_candidates: float = 0.5, n_upper: int | None = None, solver: str | None = None,
                 max_signatures: int | None = None, max_pairs: int | None = None, lloyd_share: float | None = None, privacy_unit: str | None = None,
                 seed: int | None = None, randomness: Randomness | None = None):
        self.k = k
        self.epsilon = epsilon
        self.delta = delta
        self.domain = domain
        self.features = tuple(features)
        self.objective = objective
        self.candidates = candidates
        self.candidate_table = candidate_table
        self.candidate_count = candidate_count
        self.candidate_scales = candidate_scales
        self.coverage_approx = coverage_approx
        self.eps_candidates = eps_candidates
        self.eps_coverage = eps_coverage
        self.eps_counts = eps_counts
        self.delta_candidates = delta_candidates
        self.n_upper = n_upper
        self.solver = solver
        self.max_signatures = max_signatures
        self.max_pairs = max_pairs
        self.lloyd_share = lloyd_share
        self.privacy_unit = privacy_unit
        self.seed = seed
        self.randomness = randomness

    @classmethod
    def from_config(cls, config, randomness: Randomness | None = None) -> "MaxCover":
        p: MaxCoverParams = config.algorithm.params
        if p.candidates == "grid_or_private":  # its split is the chosen mode's default (the config refuses one)
            p = replace(p, eps_candidates=None, eps_coverage=None, eps_counts=None, delta_candidates=0.5)
        return cls(k=config.algorithm.k, epsilon=config.privacy.epsilon, delta=config.privacy.delta,
                   domain=Domain.from_config(config.domain), features=config.input.features,
                   objective=config.algorithm.objective, candidates=p.candidates, candidate_table=p.candidate_table,
                   candidate_count=p.candidate_count, candidate_scales=p.candidate_scales,
                   coverage_approx=p.coverage_approx, eps_candidates=p.eps_candidates, eps_coverage=p.eps_coverage,
                   eps_counts=p.eps_counts, delta_candidates=p.delta_candidates, n_upper=p.n_upper, solver=p.solver,
                   max_signatures=p.max_signatures, max_pairs=p.max_pairs, lloyd_share=p.lloyd_share, privacy_unit=config.input.privacy_unit,
                   seed=config.seed,
                   randomness=randomness)

    # -- validation (one place) ------------------------------------------------

    def _validated_params(self) -> MaxCoverParams:
        def is_int(v, low):
            return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= low

        def is_frac(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0

        if not is_int(self.k, 1):
            raise ValueError(f"k={self.k!r} should be an integer >= 1")
        if not isinstance(self.epsilon, (int, float)) or not (self.epsilon > 0) or math.isinf(self.epsilon):
            raise ValueError(f"epsilon={self.epsilon!r} should be a finite number > 0")
        if not isinstance(self.delta, (int, float)) or not (0 < self.delta < 1):
            raise ValueError(f"delta={self.delta!r} should be in (0, 1): maxcover is (epsilon, delta)-DP")
        if self.objective not in POWER:
            raise ValueError(f"objective={self.objective!r} should be one of {list(POWER)}")
        mode = default_candidates(self.domain.dim) if self.candidates is None else self.candidates
        if mode not in CANDIDATE_MODES:
            raise ValueError(f"candidates={mode!r} should be one of {list(CANDIDATE_MODES)}")
        if mode == "table" and not self.candidate_table:
            raise ValueError("candidates='table' needs candidate_table (path of a public Delta table)")
        for name in ("candidate_count", "candidate_scales", "max_signatures", "max_pairs"):
            if not is_int(getattr(self, name), 1) and not (name.startswith("max_") and getattr(self, name) is None):
                raise ValueError(f"{name}={getattr(self, name)!r} should be an integer >= 1")
        # driver-memory bounds: None is the deployment's ceiling, a value above it is refused
        max_signatures = bounded("max_signatures", self.max_signatures, MAX_SIGNATURES_ENV)
        max_pairs = bounded("max_pairs", self.max_pairs, MAX_PAIRS_ENV)
        if mode != "table" and self.candidate_count < self.k:
            raise ValueError(f"candidate_count={self.candidate_count} should be >= k={self.k}")
        if not isinstance(self.coverage_approx, (int, float)) or not (0 < self.coverage_approx < 1):
            raise ValueError(f"coverage_approx={self.coverage_approx!r} should be in (0, 1)")
        if self.n_upper is not None and not is_int(self.n_upper, 1):
            raise ValueError(f"n_upper={self.n_upper!r} should be an integer >= 1 or None")
        private = mode in CHARGED_MODES
        default = DEFAULT_SPLIT_PRIVATE if private else DEFAULT_SPLIT_PUBLIC
        given = (self.eps_candidates, self.eps_coverage, self.eps_counts)
        if mode == "grid_or_private":  # the chosen mode's default split (chosen_params); none is configurable
            if any(v is not None for v in given) or self.delta_candidates != 0.5:
                raise ValueError("candidates='grid_or_private' takes the chosen mode's default split: leave eps_candidates, "
                                 "eps_coverage, eps_counts and delta_candidates unset (or name grid or private)")
            points = max(int(self.candidate_count), GRID_PER_CLUSTER * int(self.k))
            q = max(2, int(math.floor(points ** (1.0 / self.domain.dim) + 1e-9)))
            if q**self.domain.dim > MAX_GRID_POINTS:  # the grid branch must be buildable before the count is charged
                raise ValueError(f"candidates='grid_or_private': its grid in dimension {self.domain.dim} would have "
                                 f"{q**self.domain.dim} points (over {MAX_GRID_POINTS}); use tree, random or private")
            split = (0.0, 0.0, 0.0)
        else:
            split = tuple(default[i] if v is None else v for i, v in enumerate(given))
            if not private and self.eps_candidates is None:
                split = (0.0, split[1], split[2])
            if not all(is_frac(v) for v in split) or abs(math.fsum(split) - 1.0) > 1e-9:
                raise ValueError(f"eps_candidates/eps_coverage/eps_counts={split} should be fractions in [0, 1] summing to 1")
            if not private and split[0] != 0.0:
                raise ValueError("public candidates spend no budget: eps_candidates should be 0")
            if (private and split[0] <= 0) or split[1] <= 0 or split[2] <= 0:
                raise ValueError(f"every step needs a positive share of epsilon, got {split}")
        if mode == "private" and not (isinstance(self.delta_candidates, (int, float)) and 0 < self.delta_candidates < 1):
            raise ValueError(f"delta_candidates={self.delta_candidates!r} should be in (0, 1)")
        solver = self.solver or default_solver(self.objective, mode)
        if solver not in SOLVERS[self.objective]:
            raise ValueError(f"solver={solver!r} should be one of {list(SOLVERS[self.objective])} for objective {self.objective!r}")
        if len(self.features) not in (1, self.domain.dim):
            raise ValueError(f"features={list(self.features)} should name {self.domain.dim} columns or one array column")
        lloyd_share = default_lloyd_share(self.objective, mode) if self.lloyd_share is None else self.lloyd_share
        if not is_frac(lloyd_share) or lloyd_share > MAX_LLOYD_SHARE:
            raise ValueError(f"lloyd_share={lloyd_share!r} should be a fraction in [0, {MAX_LLOYD_SHARE}]")
        if self.objective != "kmeans" and lloyd_share > 0:
            raise ValueError(f"lloyd_share={lloyd_share!r}: a Lloyd step is k-means only, not objective {self.objective!r}")
        params = MaxCoverParams(
            candidates=mode, candidate_table=self.candidate_table, candidate_count=int(self.candidate_count),
            candidate_scales=int(self.candidate_scales), coverage_approx=float(self.coverage_approx),
            eps_candidates=float(split[0]), eps_coverage=float(split[1]), eps_counts=float(split[2]),
            delta_candidates=float(self.delta_candidates) if mode == "private" else 0.0,
            n_upper=None if self.n_upper is None else int(self.n_upper), solver=solver,
            max_signatures=max_signatures, max_pairs=max_pairs, lloyd_share=float(lloyd_share),
        )
        # grid_or_private: both branches must be valid (the grid's per-pick weight is the larger one)
        branches = [chosen_params(params, "grid", self.k)] if mode == "grid_or_private" else [params]
        rest = self.epsilon * (1.0 - CHOICE_SHARE - ZOOM_SHARE) if mode == "grid_or_private" else self.epsilon
        for branch in branches:
            eps_cov, delta_cov = budget_split(rest, self.delta, branch)["coverage"]
            core.coverage_epsilon(eps_cov, delta_cov)  # validates
            if eps_cov / (2.0 * (1.0 - math.log(delta_cov))) > 1.0:
                raise ValueError("the coverage loop's per-pick weight eps_cov / (2 ln(e/delta_cov)) exceeds 1: lower epsilon or eps_coverage")
        return params

    def privacy_plan(self) -> tuple[float, float]:
        """(epsilon, delta) that ``fit`` will spend: public, known before any data is read."""
        self._validated_params()
        return float(self.epsilon), float(self.delta)

    # -- fitting -------------------------------------------------------------------

    def zoomed_candidates(self, exact_coarse: np.ndarray, noisy_rows: float, params: MaxCoverParams, budget: dict,
                          accountant: Accountant) -> tuple[np.ndarray, dict, np.ndarray | None]:
        """grid_or_private's grid branch: the ONE release of the exact coarse histogram ``exact_coarse``
        (NOT private; all cells, L1 sensitivity 1, charged budget["zoom"]), then the grid half public,
        half on the occupied cells of the level the noisy counts and the released ``noisy_rows`` choose
        (``candidates.zoomed_grid``, post-processing). Returns (unit-space candidates, info, which
        candidates lie outside the level's sure cells, or None without a zoom level)."""
        eps_zoom = budget["zoom"][0]
        noisy_counts = cand_mod.release_coarse(exact_coarse, eps_zoom, accountant)
        unit, info, level = cand_mod.zoomed_grid(noisy_counts, noisy_rows, self.domain.dim, params.candidate_count,
                                                 eps_zoom)
        if self.domain.is_ball:
            unit = np.unique(self.domain.clip_unit(unit), axis=0)
        return unit, {"zoom": info}, (None if level is None else cand_mod.outside_cells(unit, *level))

    def _candidates(self, spark, cached, columns, params, budget, accountant, randomness, counter, timings):
        """(unit-space candidates, original-unit rows for table candidates or None, info)."""
        rng = randomness.public_rng("maxcover.candidates")
        if params.candidates == "table":
            with step("maxcover: read the public candidate table", timings):
                unit, original = cand_mod.table_candidates(spark, params.candidate_table, self.features, self.domain)
            return unit, original, {}
        if params.candidates in ("grid", "random"):
            return cand_mod.public_candidates(params.candidates, self.domain, params.candidate_count, rng), None, {}
        eps_cand, delta_cand = budget["candidates"]
        if params.candidates == "tree":
            unit, info = cand_mod.tree_candidates(
                spark_tree_aggregates(cached, columns, counter=counter, timings=timings), self.domain,
                params.candidate_count, self.k, eps_cand, accountant, rng)
            info.pop("leaf_nodes")
            return unit, None, info
        unit, info = cand_mod.private_candidates(
            cached, columns, self.domain, params.candidate_count, params.candidate_scales, self.k,
            eps_cand, delta_cand, accountant, rng, counter=counter, timings=timings,
        )
        return unit, None, info

    def _solve(self, params, chosen_unit, weights, cand_unit, cand_original, rng):
        """Post-processing: k centers (unit space, or original units for table candidates) and their weights."""
        if self.objective == "kmeans":
            centers, w = solvers.weighted_kmeans(chosen_unit, weights, self.k, rng)
            return self.domain.from_unit(self.domain.clip_unit(centers)), w
        if params.solver == "weiszfeld":
            centers, w = solvers.weighted_kmedian(chosen_unit, weights, self.k, rng)
            return self.domain.from_unit(self.domain.clip_unit(centers)), w
        centers, w = solvers.weighted_kmedian(chosen_unit, weights, self.k, rng, candidates=cand_unit)
        if cand_original is None:
            return self.domain.from_unit(self.domain.clip_unit(centers)), w
        # Discrete setting: report the candidate table's rows themselves (no unit-space round trip).
        index = {row.tobytes(): i for i, row in reversed(list(enumerate(np.ascontiguousarray(cand_unit))))}
        rows = [index[np.ascontiguousarray(c, dtype=np.float64).tobytes()] for c in centers]
        return cand_original[rows].copy(), w

    def solve_and_polish(self, params, budget, chosen_unit, weights, cand_unit, cand_original, rng, lloyd_aggregate,
                         accountant: Accountant, counter: PassCounter, timings: dict, outside=None):
        """The weighted instance solved on the driver (post-processing: the released weights below their
        noise floor read as zero, ``core.significant_weights``, with the stricter floor where ``outside``,
        a mask over the chosen candidates from released values, says no data was seen), then, with a
        ``lloyd`` share (k-means), one DP Lloyd step on the data (``polish``). Returns (centers in original
        units, weights)."""
        eps_lloyd = budget.get("lloyd", (0.0, 0.0))[0]
        weights = core.significant_weights(weights, budget["counts"][0], self.k, outside)
        with step("maxcover: solve the weighted instance (post-processing)", timings):
            if not (eps_lloyd > 0):
                return self._solve(params, chosen_unit, weights, cand_unit, cand_original, rng)
            centers, center_weights = solvers.weighted_kmeans(chosen_unit, weights, self.k, rng)
        centers, center_weights = self.polish(self.domain.clip_unit(centers), lloyd_aggregate, eps_lloyd, accountant,
                                              counter, timings)
        return self.domain.from_unit(centers), center_weights

    def polish(self, centers_unit: np.ndarray, aggregate, eps_lloyd: float, accountant: Accountant,
               counter: PassCounter, timings: dict):
        """One DP Lloyd step from the solved centers: (new unit-space centers, their noisy counts clipped at 0).

        Privacy: the centers going in are post-processing of releases (coverage picks, noisy counts).
        One Spark pass (``aggregate``, as ``steps.lloyd_pass.spark_aggregate``) gives each center's exact
        count and fixed-point coordinate sum of the points nearest to it; one record lies in exactly one
        cluster, so the count vector has L1 sensitivity 1 and the sum vector L1 sensitivity d (unit
        space): ``dplloyd.core.noisy_update`` releases both with discrete Laplace under Su et al.'s split,
        charged exactly eps_lloyd. The move (``steps.lloyd.lloyd_move``: noisy mean, clipped into the
        domain, only where the noisy count clears the public ``lloyd_min_count``) is post-processing. The
        same step as auto's and dplloyd's, with the same tests of its noise.
        """
        with step("maxcover pass: DP Lloyd step on the solved centers", timings):
            exact_counts, exact_sums = aggregate(centers_unit)
        counter.add("lloyd")
        noisy_counts, noisy_sums = noisy_update(exact_counts, exact_sums, eps_lloyd, "su", accountant, LLOYD_LABEL)
        return lloyd_move(centers_unit, noisy_counts, noisy_sums, lloyd_min_count(eps_lloyd, self.domain.dim, "su"),
                          self.domain)

    def preflight(self, spark, input_key: str | None = None, ledger=None) -> None:
        """Before any charge: the public candidate table exists, is not the input itself and, in a run
        charged to ``ledger``, was declared PUBLIC there by its administrator (``Ledger.is_public``:
        ``dpspark ledger set-public``; a table with a budget never is), all from the table's Delta log
        before any of its rows is read; then it is read (its rows may come out verbatim as centers)."""
        params = self._validated_params()
        if params.candidates != "table":
            return
        try:
            cand = tables.ledger_key_of(spark, params.candidate_table, "delta")
        except Exception as exc:
            raise SchemaError(f"candidate table (algorithm.candidate_table={params.candidate_table!r}): {exc}") from None
        if input_key is not None and cand == input_key:
            raise SchemaError(f"algorithm.candidate_table={params.candidate_table!r} is the input table itself: "
                              "candidates must be PUBLIC")
        if ledger is not None and not ledger.is_public(cand):
            why = ("has a privacy budget in the ledger: it is private data, never candidates"
                   if ledger.has_balance(cand) else "is not declared public in the ledger")
            raise ConfigError("algorithm.candidate_table",
                              f"{params.candidate_table!r} {why}. Candidate rows may be released verbatim, so in a run "
                              f"charged to a ledger only a table its administrator declared public may be named: "
                              f"`dpspark ledger set-public --ledger {ledger.path} --table {params.candidate_table}`")
        cand_mod.table_candidates(spark, params.candidate_table, self.features, self.domain)

    def resolve_candidates(self, params: MaxCoverParams, exact_histogram, accountant: Accountant) -> tuple[MaxCoverParams, dict, dict]:
        """(params, budget, choice info) of the run: for ``grid_or_private`` the row count is released first
        and chooses the mode (``choose_by_count``). ``exact_histogram()`` (the exact coarse histogram of
        ``candidates.coarse_histogram``, one Spark pass; NOT private) is called only then: its sum is the row
        count; the grid branch releases the histogram itself later (``zoomed_candidates``)."""
        epsilon, delta = float(self.epsilon), float(self.delta)
        if params.candidates != "grid_or_private":
            return params, budget_split(epsilon, delta, params), {}
        return choose_by_count(int(np.asarray(exact_histogram()).sum()), params, epsilon, delta, int(self.k), accountant)

    def fit(self, df, timings: dict | None = None, operational: dict | None = None) -> ClusteringModel:
        configured = self._validated_params()
        epsilon, delta = self.privacy_plan()
        randomness = self.randomness or Randomness(self.seed)
        accountant = Accountant(epsilon, delta, randomness.noise)
        timings = {} if timings is None else timings
        counter = PassCounter()
        p = POWER[self.objective]
        unit_df, feature_names = tables.prepare_points(df, self.features, self.privacy_unit, self.domain, randomness.run_key)
        columns = [PACKED_COLUMN]  # one packed column: each batch read as one buffer (``kernels.batch_points``)
        cached = tables.packed_points(unit_df, self.domain.dim).persist()
        provider = None
        try:
            coarse = {}

            def exact_histogram() -> np.ndarray:
                with step("maxcover pass: coarse histogram (the row count chooses the candidates; the grid goes "
                          "where the data is)", timings):
                    counter.add("count")
                    coarse["counts"] = cand_mod.coarse_histogram(cached, columns, cand_mod.zoom_side(self.domain.dim), self.domain.dim)
                    return coarse["counts"]

            params, budget, choice = self.resolve_candidates(configured, exact_histogram, accountant)
            outside = None  # zoomed grid: which candidates lie where the released histogram saw no data
            if params.candidates == "grid" and "zoom" in budget:
                cand_original = None
                cand_unit, cand_info, outside = self.zoomed_candidates(coarse["counts"], choice["noisy_rows"], params,
                                                                       budget, accountant)
            else:
                cand_unit, cand_original, cand_info = self._candidates(
                    df.sparkSession, cached, columns, params, budget, accountant, randomness, counter, timings)
            n_cand = cand_unit.shape[0]
            diameter = cand_mod.coverage_diameter(self.domain.unit_diameter, cand_info.get("zoom"))
            ts = core.thresholds(diameter, p, n_cand, params.coverage_approx, params.n_upper)
            m = core.picks_per_threshold(self.k, params.coverage_approx)
            log.info("maxcover: %d candidates, %d thresholds, %d picks per threshold", n_cand, ts.size, min(m, n_cand))
            max_signatures = signatures_within_result_limit(df.sparkSession, params.max_signatures, n_cand)
            provider = SparkCoverage(cached, columns, cand_unit, ts, p, max_signatures, counter, timings,
                                     max_pairs=params.max_pairs)
            eps_cov, delta_cov = budget["coverage"]
            with step(f"maxcover: coverage loop ({ts.size} thresholds, one pass each)"):
                picks = core.run_coverage(provider, n_cand, ts, m, accountant, eps_cov, delta_cov)
            chosen = core.chosen_candidate_ids(picks)
            chosen_unit = cand_unit[chosen]
            provider.close()
            exact = snap_counts(cached, columns, chosen_unit, counter, timings)
            noisy = core.noisy_weights(exact, accountant, budget["counts"][0])
            centers, center_weights = self.solve_and_polish(
                params, budget, chosen_unit, np.maximum(noisy, 0).astype(np.float64), cand_unit, cand_original,
                randomness.public_rng("maxcover.solver"), spark_aggregate(cached, columns), accountant, counter, timings,
                outside=None if outside is None else outside[chosen])
        finally:
            if provider is not None:
                provider.close()
            cached.unpersist()
        accountant.finish()
        if operational is not None:  # NON-PRIVATE: depends on the data
            operational.update({
                "spark_passes": counter.passes, "histogram_jobs": counter.histogram_jobs,
                "passes_by_kind": dict(counter.by_kind),
                "fallback_thresholds": [i + 1 for i in provider.fallback_thresholds],
                "histogram_sizes": list(provider.histogram_sizes),
                "histogram_pairs": list(provider.histogram_pairs),
                "thresholds_spilled_for_pairs": [i + 1 for i in provider.pair_spills],
                "shrunk_at_thresholds": [i + 1 for i in provider.shrinks],
                "thresholds_without_pass": [i + 1 for i in provider.skipped],
                "thresholds_from_a_group": [i + 1 for i in provider.grouped],
                "thresholds_read_again": [i + 1 for i in provider.regrouped],
            })
        return ClusteringModel(
            algorithm=self.name, objective=self.objective, centers=np.asarray(centers, dtype=np.float64),
            noisy_weights=np.asarray(center_weights, dtype=np.float64), epsilon_spent=accountant.spent_epsilon,
            delta_spent=accountant.spent_delta, charges=accountant.summary(), domain=self.domain,
            features=self.features, feature_names=feature_names,
            parameters={"k": self.k, "objective": self.objective, **asdict(params),
                        # eps_* and delta_candidates are FRACTIONS of the run's epsilon and delta
                        "epsilon_by_step": {k: v[0] for k, v in budget.items()}},
            info={
                "candidates": params.candidates, "candidate_count": int(n_cand), "thresholds": int(ts.size),
                "picks_per_threshold": int(min(m, n_cand)), "picks": len(picks), "chosen_centers": len(chosen),
                "private_candidates": cand_info, "budget": {k: list(v) for k, v in budget.items()},
                **({"candidate_choice": choice} if choice else {}),
                "randomness": randomness.describe(),
            },
        )


CHOICE_LABEL = "maxcover: noisy row count (chooses grid or private candidates)"
LLOYD_LABEL = "maxcover: DP Lloyd step on the solved centers"


def choose_by_count(exact_rows: int, params: MaxCoverParams, epsilon: float, delta: float, k: int,
                    accountant: Accountant) -> tuple[MaxCoverParams, dict, dict]:
    """``candidates: grid_or_private``: release the row count, let it choose grid or private candidates.

    Privacy: the count of the prepared rows (one per person when ``privacy_unit`` is set) changes by
    at most 1 when one record is added or removed, so n + DLap(1 / eps_choice) is pure eps_choice-DP
    with eps_choice = CHOICE_SHARE * epsilon, charged here. The mode (``params.choose_candidates``
    on n_hat, epsilon, k), the chosen mode's parameters and the split of the rest,
    (epsilon - eps_choice, delta), are post-processing of that release and public inputs; the run
    then spends exactly the rest as that mode does, so its total is (epsilon, delta) either way,
    as ``privacy_plan`` states before any data is read (basic composition). The grid branch sets
    eps_zoom = ZOOM_SHARE * epsilon of that rest aside for its coarse histogram
    (``zoomed_candidates``) and splits the remainder as grid's default.

    Returns (chosen params, budget with a "choice" entry, info with the released count and the mode).
    """
    eps_choice = CHOICE_SHARE * float(epsilon)
    mech = LaplaceMechanism(epsilon=eps_choice, sensitivity=1.0)
    noisy_rows = float(accountant.laplace(CHOICE_LABEL, np.array([int(exact_rows)], dtype=np.int64), mech)[0])
    mode = choose_candidates(noisy_rows, epsilon, k)
    chosen = chosen_params(params, mode, k)
    if mode == "grid":  # the grid goes where a released coarse histogram shows the data (``_candidates``)
        eps_zoom = ZOOM_SHARE * float(epsilon)
        budget = {"choice": (eps_choice, 0.0), "zoom": (eps_zoom, 0.0),
                  **budget_split(float(epsilon) - eps_choice - eps_zoom, float(delta), chosen)}
    else:
        budget = {"choice": (eps_choice, 0.0), **budget_split(float(epsilon) - eps_choice, float(delta), chosen)}
    why = (f"noisy rows {noisy_rows:.0f} x epsilon {epsilon:g} / k {k} "
           f"{'>=' if mode == 'private' else '<'} {PRIVATE_MIN_SIGNAL:g}")
    return chosen, budget, {"noisy_rows": noisy_rows, "chosen": mode, "why": why}


def _bytes(text: str) -> int:
    """Spark's size strings ("1g", "512m", "0", "1024") in bytes; 0 means unlimited."""
    text = str(text).strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text))


def signatures_within_result_limit(spark, max_signatures: int, n_candidates: int) -> int:
    """``max_signatures``, lowered so that the largest histogram the driver may collect (``max_signatures
    + 2`` rows of ceil(|V| / 8) key bytes plus a count) stays well inside ``spark.driver.maxResultSize``:
    a collect over that limit would fail the run after its charge, depending on how many distinct
    signatures the data has. Public: the config, |V| and the deployment's setting, never the data;
    a threshold with more signatures keeps its histogram on the executors, as it always could."""
    try:
        limit = _bytes(spark.conf.get("spark.driver.maxResultSize", "1g"))
    except Exception:
        limit = 1 << 30
    if limit <= 0:
        return int(max_signatures)
    row_bytes = (int(n_candidates) + 7) // 8 + 32  # key bytes, the count, Arrow's offsets and slack
    fits = int(limit * 0.5) // row_bytes - 2
    return int(max(1, min(int(max_signatures), fits)))

