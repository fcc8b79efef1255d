"""Config keys of the maxcover family (``algorithm.*``), validated before Spark starts.

=====================  =========================================================  =================
key                    meaning                                                    default
=====================  =========================================================  =================
``candidates``         ``table`` | ``grid`` | ``random`` | ``private`` |          d <= 3:
                       ``tree`` | ``grid_or_private`` (a noisy row count          ``grid_or_``
                       chooses: see ``choose_candidates``)                        ``private``,
                                                                                  else ``tree``
``candidate_table``    path of a PUBLIC Delta table of candidate points (its      (required for
                       feature columns have the names of ``input.features``)      ``table``)
``candidate_count``    grid / random: about this many candidates; private and     1000
                       tree: at most this many (highest noisy counts kept);
                       grid_or_private: its grid has max(this, 40 k) points
``candidate_scales``   private: number of grid scales (side 1, 1/2, 1/4, ... in   5
                       the unit space [-1, 1]^d)
``coverage_approx``    a of the thresholds t_i = (1+a)^(i-1) Delta^p / N, (0, 1)  0.5
``eps_split``          fractions of privacy.epsilon: a mapping                    see below
                       {candidates, coverage, counts} or a list
                       [candidates, coverage, counts] ([coverage, counts] for
                       public candidates)
``eps_candidates``     the same, one key each (instead of ``eps_split``)
``eps_coverage``
``eps_counts``
``delta_candidates``   private: fraction of privacy.delta for the candidate       0.5
                       generator; the coverage loop gets the rest (public
                       candidates: the coverage loop gets all of delta)
``n_upper``            PUBLIC upper bound N on the number of private points, for  null (= abs(V))
                       the first threshold (never the data's n)
``solver``             kmeans: ``weighted_kmeans``; kmedian: ``local_search``     see below
                       (discrete, centers restricted to the candidate set) or
                       ``weiszfeld`` (Euclidean)
``lloyd_share``        kmeans: fraction of epsilon for one DP Lloyd step on the   tree: 0.5,
                       data after the solve (``MaxCover.polish``); eps_split     else 0
                       then divides the rest; kmedian: 0
``max_signatures``     driver bound on the signature histogram of one threshold;  $DPSPARK_MAX_
                       at most the deployment's ceiling $DPSPARK_MAX_SIGNATURES   SIGNATURES, else
                       (a config may only lower it);                              2000000
                       above it the histogram stays on the executors (one
                       small job per pick over it; no extra data pass)
``max_pairs``          driver bound on the (signature, candidate) pairs of one    $DPSPARK_MAX_
                       threshold's histogram (its incidence: about 10 bytes a     PAIRS, else
                       pair); above it, the same as above; at most the            32000000
                       deployment's ceiling $DPSPARK_MAX_PAIRS
=====================  =========================================================  =================

``tree`` (private LSH-tree leaves, pure epsilon) takes the candidates' share of epsilon
and no delta: the coverage loop gets all of delta, as with public candidates.
``grid_or_private`` spends ``CHOICE_SHARE`` of epsilon on a noisy row count, then runs as
``grid`` or ``private`` with that mode's default split of the rest (its split and
delta_candidates are not configurable: name the mode to set them). Its ``grid`` branch
also spends ``ZOOM_SHARE`` of epsilon on a coarse histogram of the box (the same Spark pass
as the count) and puts half its grid on the cells that show data
(``candidates.zoomed_grid``): with a loose box the public grid alone leaves most of its
points in empty space.
Default epsilon split: private and tree candidates 0.4 / coverage 0.3 / counts 0.3 (measured,
private:
bench/results/maxcover/tuning.md: better than the earlier 0.2 / 0.4 / 0.4 in 9 of 12
small-n cells and at n = 10^5-10^6, 4-10% worse at epsilon 0.5 on three datasets); public
candidates (table, grid, random) coverage 0.5 / counts 0.5. The fractions must sum
to 1. Default solver: kmeans ``weighted_kmeans``; kmedian ``local_search`` with
table candidates, ``weiszfeld`` otherwise.

The family is (eps, delta)-DP with delta > 0 (the coverage loop's theorem, and the
stability-based candidate generator, need it): privacy.delta = 0 is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Mapping

from dpspark.errors import ConfigError

CANDIDATE_MODES = ("table", "grid", "random", "private", "tree", "grid_or_private")
CHARGED_MODES = ("private", "tree", "grid_or_private")  # candidate sources that read the data (charged)
PUBLIC_MODES = ("table", "grid", "random")
SOLVERS = {"kmeans": ("weighted_kmeans",), "kmedian": ("local_search", "weiszfeld")}
KEYS = (
    "candidates", "candidate_table", "candidate_count", "candidate_scales", "coverage_approx",
    "eps_split", "eps_candidates", "eps_coverage", "eps_counts", "delta_candidates",
    "n_upper", "solver", "max_signatures", "max_pairs", "lloyd_share",
)
DEFAULT_SPLIT_PRIVATE = (0.4, 0.3, 0.3)  # candidates, coverage, counts
DEFAULT_SPLIT_PUBLIC = (0.0, 0.5, 0.5)
MAX_GRID_POINTS = 1_000_000
SPLIT_TOL = 1e-9
# driver bounds' defaults and the variables of their deployment ceilings (``deployment_ceiling``)
MAX_SIGNATURES_ENV = "DPSPARK_MAX_SIGNATURES"
MAX_PAIRS_ENV = "DPSPARK_MAX_PAIRS"
DEFAULT_MAX_SIGNATURES = 2_000_000
DEFAULT_MAX_PAIRS = 32_000_000


@dataclass(frozen=True)
class MaxCoverParams:
    candidates: str = "private"
    candidate_table: str | None = None
    candidate_count: int = 1000
    candidate_scales: int = 5
    coverage_approx: float = 0.5
    eps_candidates: float = DEFAULT_SPLIT_PRIVATE[0]  # fractions of privacy.epsilon
    eps_coverage: float = DEFAULT_SPLIT_PRIVATE[1]
    eps_counts: float = DEFAULT_SPLIT_PRIVATE[2]
    delta_candidates: float = 0.5  # fraction of privacy.delta (private candidates only)
    n_upper: int | None = None
    solver: str = "weiszfeld"
    max_signatures: int = DEFAULT_MAX_SIGNATURES
    max_pairs: int = DEFAULT_MAX_PAIRS
    lloyd_share: float = 0.0  # fraction of epsilon for the last DP Lloyd step (k-means)

    @property
    def private_candidates(self) -> bool:
        """The candidates come from the data (charged): ``private`` or ``tree``."""
        return self.candidates in CHARGED_MODES


# Driver-memory bounds whose ceiling is the DEPLOYMENT's (an environment variable of the driver, set by
# the administrator; no config key or Param can set it): a config or a Python call may only lower
# them. Above its bound a threshold's histogram stays on the executors (same picks), so these bound
# the driver's memory by public values; an analyst who could raise them could make success after the
# charge depend on the data's signature structure (an out-of-memory driver), like
# spark.driver.maxResultSize, which configs may not set either. Unset: these defaults.
_BOUND_LIMITS = {MAX_SIGNATURES_ENV: (DEFAULT_MAX_SIGNATURES, 10**9), MAX_PAIRS_ENV: (DEFAULT_MAX_PAIRS, 10**12)}


def deployment_ceiling(env: str) -> int:
    """The deployment's ceiling of a driver bound: ``$env`` (a whole number >= 1), else its default.
    A malformed value is the deployment's mistake: refused (``ConfigError`` naming the variable)."""
    import os

    default, high = _BOUND_LIMITS[env]
    text = os.environ.get(env)
    if text is None or not text.strip():
        return default
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        value = 0
    if not 1 <= value <= high:
        raise ConfigError(f"${env}", f"the deployment's ceiling must be a whole number from 1 to {high}, got {text!r}")
    return value


def bounded(name: str, value, env: str) -> int:
    """A configured driver bound (None: the deployment's ceiling), refused above the ceiling."""
    ceiling = deployment_ceiling(env)
    if value is None:
        return ceiling
    if value > ceiling:
        raise ConfigError(f"algorithm.{name}", f"{value} is above the deployment's ceiling {ceiling} (${env}, set by the "
                                               "administrator): a config may only lower this driver-memory bound")
    return int(value)


TREE_DEFAULT_MIN_DIM = 4
# grid_or_private: the noisy row count's share of epsilon, the signal n_hat eps / k from which the
# private grid cells replace the public grid, and the public grid's size per cluster.
CHOICE_SHARE = 0.02
# The grid branch's share of epsilon for the coarse histogram that places the grid where the data is
# (``candidates.occupied_grid``); the coverage loop and the counts split the rest.
ZOOM_SHARE = 0.1
PRIVATE_MIN_SIGNAL = 5000.0
GRID_PER_CLUSTER = 40


def default_candidates(dim: int) -> str:
    """The default candidate source, from d only (public): ``grid_or_private`` for d <= 3, ``tree`` above.

    Measured (scripts/bench_utility.py, Spark estimators, epsilon 1, median of 5 runs, k-means cost /
    non-private): in 2-3 dimensions the public grid beats the private grid cells on the small shared
    tables (s1 1.03 vs 3.86, a3 1.10 vs 5.62, unbalance 1.24 vs 55, skin 1.002 vs 1.007) and the private
    cells win with many points per cluster (birch2, 1000 per cluster: 1.10 vs 1.14 with 4000 grid points;
    10^6 points, k = 15: 1.002 vs 1.052 of the true means, bench/results/maxcover/speed.md), hence
    ``grid_or_private`` (``choose_candidates``). From d = 4 tree beats private on every shared table
    (numpy engine, seeded: blood 3.5 vs 13.2, tripadvisor 2.1 vs 7.6, adult 1.108 vs 1.116, electrical
    1.06 vs 1.69, credit 1.36 vs 2.79, google reviews 1.36 vs 2.74); a grid there has too few points per
    axis.
    """
    return "tree" if dim >= TREE_DEFAULT_MIN_DIM else "grid_or_private"


def choose_candidates(noisy_n: float, epsilon: float, k: int) -> str:
    """``grid_or_private``: ``private`` when the released row count gives at least PRIVATE_MIN_SIGNAL
    points per cluster at this epsilon (n_hat eps / k), else ``grid``. Post-processing of the released
    n_hat and public inputs (epsilon, k): no charge of its own.

    The threshold sits well above the small tables' signal (unbalance 812 at epsilon 1, 1625 at 2, where
    private cells stay 10-50x worse: small clusters fail their stability threshold) and below the
    signal of the tables where private cells measured better (10^6 points, k = 15: 66,667).
    """
    return "private" if max(float(noisy_n), 0.0) * float(epsilon) / int(k) >= PRIVATE_MIN_SIGNAL else "grid"


def chosen_params(params: "MaxCoverParams", mode: str, k: int) -> "MaxCoverParams":
    """The parameters of ``grid_or_private`` once the count chose ``mode`` (grid or private): that mode's
    default split, the grid at max(candidate_count, GRID_PER_CLUSTER k) points. Public inputs only."""
    if params.candidates != "grid_or_private" or mode not in ("grid", "private"):
        raise ValueError(f"chosen_params: candidates={params.candidates!r}, mode={mode!r}")
    if mode == "grid":
        return replace(params, candidates="grid", candidate_count=max(params.candidate_count, GRID_PER_CLUSTER * int(k)),
                       eps_candidates=0.0, eps_coverage=DEFAULT_SPLIT_PUBLIC[1], eps_counts=DEFAULT_SPLIT_PUBLIC[2],
                       delta_candidates=0.0)
    return replace(params, candidates="private", eps_candidates=DEFAULT_SPLIT_PRIVATE[0],
                   eps_coverage=DEFAULT_SPLIT_PRIVATE[1], eps_counts=DEFAULT_SPLIT_PRIVATE[2], delta_candidates=0.5)


# One DP Lloyd step after the solve (k-means, tree candidates), its share of epsilon. Measured (numpy
# engine, epsilon 1, cost / non-private, median of 5 seeded runs at shares 0 / 0.2 / 0.35, then of 9 at
# 0.25 / 0.35 / 0.5): blood 2.49 / 2.49 / 2.06, then 2.54 / 2.33 / 2.11; tripadvisor 1.99 / 1.85 / 1.49,
# then 1.67 / 1.51 / 1.44; google reviews 1.35 / 1.18 / 1.20, then 1.162 / 1.193 / 1.161; credit 1.47 /
# 1.09 / 1.08, then 1.089 / 1.092 / 1.091; electrical 1.063 / 1.045 / 1.031, then 1.034 / 1.031 / 1.033;
# adult 1.18 / 1.08 / 1.069, then 1.076 / 1.096 / 1.075. In 2 dimensions with many clusters the step
# hurts (s1 1.03 / 2.05 / 1.50, a3 1.10 / 4.78 / 3.53, unbalance 1.19 / 2.73 / 2.31): the grid's picks
# are already fine there and the step's noise per cluster is not, hence tree candidates only.
DEFAULT_LLOYD_SHARE_TREE = 0.5
MAX_LLOYD_SHARE = 0.9


def default_lloyd_share(objective: str, candidates: str) -> float:
    """The last Lloyd step's share of epsilon, from public inputs: 0.5 for k-means on tree candidates, else 0."""
    return DEFAULT_LLOYD_SHARE_TREE if objective == "kmeans" and candidates == "tree" else 0.0


def default_solver(objective: str, candidates: str) -> str:
    if objective == "kmeans":
        return "weighted_kmeans"
    return "local_search" if candidates == "table" else "weiszfeld"


def budget_split(epsilon: float, delta: float, params: MaxCoverParams) -> dict:
    """The run's (epsilon, delta) split into its three steps; the parts add up to (epsilon, delta).

    Returns {"candidates": (eps, delta), "coverage": (eps, delta), "counts": (eps, 0)}.
    The candidate step is (0, 0) for public candidates. The coverage part is computed
    as the remainder, so the sum is exact up to one rounding.
    """
    if params.candidates == "grid_or_private":
        raise ValueError("budget_split: grid_or_private is split once its row count chose (chosen_params)")
    eps_lloyd = epsilon * params.lloyd_share
    if eps_lloyd > 0:  # the three steps split what the last Lloyd step leaves
        rest = budget_split(epsilon - eps_lloyd, delta, replace(params, lloyd_share=0.0))
        return {**rest, "lloyd": (eps_lloyd, 0.0)}
    eps_cnt = epsilon * params.eps_counts
    if params.private_candidates:
        eps_cand = epsilon * params.eps_candidates
        delta_cand = delta * params.delta_candidates if params.candidates == "private" else 0.0
    else:
        eps_cand, delta_cand = 0.0, 0.0
    eps_cov = epsilon - eps_cand - eps_cnt
    delta_cov = delta - delta_cand
    return {"candidates": (eps_cand, delta_cand), "coverage": (eps_cov, delta_cov), "counts": (eps_cnt, 0.0)}


def _fraction(section, key: str) -> float:
    return section.number(key, low=0.0, high=1.0)


def _split_from_config(section, private: bool) -> tuple[float, float, float]:
    explicit = [k for k in ("eps_candidates", "eps_coverage", "eps_counts") if section.has(k)]
    if section.has("eps_split") and explicit:
        raise ConfigError(f"algorithm.{explicit[0]}", "give either algorithm.eps_split or the eps_candidates/eps_coverage/eps_counts fractions, not both")
    needed = ("eps_candidates", "eps_coverage", "eps_counts") if private else ("eps_coverage", "eps_counts")
    if section.has("eps_split"):
        raw = section.raw("eps_split")
        key = "algorithm.eps_split"
        if isinstance(raw, Mapping):
            allowed = ("candidates", "coverage", "counts") if private else ("coverage", "counts")
            unknown = sorted(set(map(str, raw)) - set(allowed))
            if unknown:
                raise ConfigError(f"{key}.{unknown[0]}", f"unknown key; allowed keys: {list(allowed)}")
            missing = [a for a in allowed if raw.get(a) is None]
            if missing:
                raise ConfigError(f"{key}.{missing[0]}", f"is required: give all of {list(allowed)} (fractions of privacy.epsilon summing to 1)")
            values = [raw[a] for a in allowed]
        elif isinstance(raw, (list, tuple)):
            want = 3 if private else 2
            if len(raw) != want:
                what = "[candidates, coverage, counts]" if private else "[coverage, counts] (public candidates spend nothing)"
                raise ConfigError(key, f"must list {want} fractions {what}, got {list(raw)!r}")
            values = list(raw)
        else:
            raise ConfigError(key, f"must be a mapping {{candidates, coverage, counts}} or a list of fractions, got {raw!r}")
        from dpspark.checks import check_number

        names = ("candidates", "coverage", "counts") if private else ("coverage", "counts")
        fr = [check_number(f"{key}.{n}", v, low=0.0, high=1.0) for n, v in zip(names, values)]
        split = (fr[0], fr[1], fr[2]) if private else (0.0, fr[0], fr[1])
    elif explicit:
        if not private and section.has("eps_candidates") and section.number("eps_candidates", low=0.0, high=1.0) != 0.0:
            raise ConfigError("algorithm.eps_candidates", "public candidates (table, grid, random) spend no budget: leave eps_candidates unset or 0")
        missing = [k for k in needed if not section.has(k)]
        if missing:
            raise ConfigError(f"algorithm.{missing[0]}", f"is required when any of {list(needed)} is given (fractions of privacy.epsilon summing to 1)")
        split = (_fraction(section, "eps_candidates") if private else 0.0, _fraction(section, "eps_coverage"), _fraction(section, "eps_counts"))
    else:
        split = DEFAULT_SPLIT_PRIVATE if private else DEFAULT_SPLIT_PUBLIC
    where = "algorithm.eps_split" if section.has("eps_split") else f"algorithm.{needed[0]}"
    total = math.fsum(split)
    if abs(total - 1.0) > SPLIT_TOL:
        raise ConfigError(where, f"the epsilon fractions {dict(zip(('candidates', 'coverage', 'counts'), split))} must sum to 1, got {total:.12g}")
    for name, v in zip(("candidates", "coverage", "counts"), split):
        if (private or name != "candidates") and not v > 0:
            raise ConfigError(where, f"the {name} fraction must be > 0, got {v:g}")
    return split


def validate_params(section, *, objective: str, k: int, dim: int, privacy) -> MaxCoverParams:
    for key in section.data:
        if key not in KEYS:
            raise ConfigError(f"algorithm.{key}", f"unknown key for algorithm.name=maxcover; allowed keys: {['name', 'objective', 'k', *KEYS]}")
    if objective not in SOLVERS:
        raise ConfigError("algorithm.objective", f"{objective!r} is not supported by maxcover; allowed: {list(SOLVERS)}")
    if not (privacy.delta > 0):
        raise ConfigError("privacy.delta", "maxcover is (epsilon, delta)-DP and needs privacy.delta > 0 (e.g. 1e-6); got 0")
    candidates = section.string("candidates", default_candidates(dim), choices=CANDIDATE_MODES)
    table = section.string("candidate_table")
    if candidates == "table" and table is None:
        raise ConfigError("algorithm.candidate_table", "is required with algorithm.candidates=table (path of a PUBLIC Delta table of candidate points)")
    if candidates != "table" and table is not None:
        raise ConfigError("algorithm.candidate_table", f"is only used with algorithm.candidates=table, not {candidates!r}")
    count = section.integer("candidate_count", 1000, low=1, high=10_000_000)
    if candidates in ("grid", "random", "private", "tree", "grid_or_private") and count < k:
        raise ConfigError("algorithm.candidate_count", f"must be >= k={k}, got {count}")
    if candidates in ("grid", "grid_or_private"):
        points = count if candidates == "grid" else max(count, GRID_PER_CLUSTER * k)
        q = max(2, int(math.floor(points ** (1.0 / dim) + 1e-9)))
        if q**dim > MAX_GRID_POINTS:
            raise ConfigError("algorithm.candidates", f"a grid in dimension {dim} has at least 2^{dim} = {q**dim} points (over {MAX_GRID_POINTS}); use random or private")
    scales = section.integer("candidate_scales", 5, low=1, high=20)
    if candidates not in ("private", "grid_or_private") and section.has("candidate_scales"):
        raise ConfigError("algorithm.candidate_scales", "is only used with algorithm.candidates=private (or grid_or_private)")
    a = section.number("coverage_approx", 0.5, low=0.0, high=1.0, low_open=True, high_open=True)
    lloyd_share = section.number("lloyd_share", default_lloyd_share(objective, candidates), low=0.0, high=MAX_LLOYD_SHARE)
    if objective != "kmeans" and lloyd_share > 0:
        raise ConfigError("algorithm.lloyd_share", f"a Lloyd step moves centers to means: k-means only, not {objective!r} (leave it unset or 0)")
    if candidates == "grid_or_private":
        for key in ("eps_split", "eps_candidates", "eps_coverage", "eps_counts", "delta_candidates"):
            if section.has(key):
                raise ConfigError(f"algorithm.{key}", "is not used with algorithm.candidates=grid_or_private (a noisy row "
                                  "count picks grid or private with that mode's default split): set candidates: grid or private "
                                  "to choose the split")
    private = candidates in CHARGED_MODES
    eps_cand, eps_cov, eps_cnt = (0.0, 0.0, 0.0) if candidates == "grid_or_private" else _split_from_config(section, private)
    delta_cand = section.number("delta_candidates", 0.5, low=0.0, high=1.0, low_open=True, high_open=True)
    if candidates not in ("private", "grid_or_private") and section.has("delta_candidates"):
        raise ConfigError("algorithm.delta_candidates", "is only used with algorithm.candidates=private "
                          f"(candidates={candidates} spends no delta)")
    if candidates != "private":
        delta_cand = 0.0
    if candidates == "grid_or_private":  # the grid branch has the larger per-pick weight
        eps_prime = privacy.epsilon * (1.0 - CHOICE_SHARE - ZOOM_SHARE) * (1.0 - lloyd_share) * DEFAULT_SPLIT_PUBLIC[1] / (2.0 * (1.0 - math.log(privacy.delta)))
    else:
        eps_prime = privacy.epsilon * (1.0 - lloyd_share) * eps_cov / (2.0 * (1.0 - math.log(privacy.delta * (1.0 - delta_cand))))
    if eps_prime > 1.0:
        raise ConfigError(
            "algorithm.eps_coverage",
            f"the coverage loop's per-pick weight eps' = eps_cov / (2 ln(e/delta_cov)) = {eps_prime:.4g} exceeds 1 "
            "(its privacy theorem needs eps' <= 1): lower privacy.epsilon or the coverage fraction",
        )
    n_upper = section.integer("n_upper", None, low=1, high=10**15)
    solver = section.string("solver", default_solver(objective, candidates), choices=SOLVERS[objective])
    max_signatures = bounded("max_signatures", section.integer("max_signatures", None, low=1, high=10**9), MAX_SIGNATURES_ENV)
    max_pairs = bounded("max_pairs", section.integer("max_pairs", None, low=1, high=10**12), MAX_PAIRS_ENV)
    return MaxCoverParams(
        candidates=candidates, candidate_table=table, candidate_count=count, candidate_scales=scales,
        coverage_approx=a, eps_candidates=eps_cand, eps_coverage=eps_cov, eps_counts=eps_cnt,
        delta_candidates=delta_cand, n_upper=n_upper, solver=solver, max_signatures=max_signatures,
        max_pairs=max_pairs, lloyd_share=lloyd_share,
    )
