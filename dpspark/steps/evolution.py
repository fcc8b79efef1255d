"""Private evolution of candidate centers: auto's route for many clusters (driver side).

After PE-means (Humphries et al., arXiv 2606.00342). A population of public candidate points
evolves over T generations. In each generation the executors count, for every candidate, the
points whose nearest candidate it is (one Spark pass, ``steps.lloyd_pass``: the counts only);
the driver releases that vote histogram with the discrete Gaussian and decides everything else
from released values and public randomness:

- truncation: the noisy votes are sorted, the largest kept up to the first whose running total
  reaches n_hat (the released row count), the rest read as 0 (``truncate``);
- selection: k centers = weighted k-means of the population with the truncated votes;
- variation: the next population is the k centers and L Levy-flight mutants of each
  (``mutate``), projected back into the domain; L halves (not below ``L_MIN``) when the
  released histogram's signal-to-noise ratio falls below 1 (``next_mutants``).

The centers of the last generation are the result; a center's weight is the truncated noisy
votes weighted k-means assigned to it.

Privacy, under add/remove of one record x (``tables.prepare_points`` has already clipped every
record into the unit-space domain, so x votes for exactly one candidate, whatever it holds):

1. ``eps_count``: the row count n + DLap(1/eps_count): n_hat, pure eps_count-DP (L1 sensitivity 1).
2. the T vote histograms. x adds 1 to exactly one count of a histogram: L2 sensitivity 1.
   The discrete Gaussian with sigma on integer counts of L2 sensitivity 1 is 1/(2 sigma^2)-zCDP
   (Canonne, Kamath, Steinke 2020, Thm. 14). Each generation's population is a function of
   released histograms, n_hat and public randomness only, so the T histograms are an adaptive
   composition: T/(2 sigma^2)-zCDP (Bun and Steinke 2016, Lemma 2.3), converted to
   (epsilon, delta)-DP by Canonne, Kamath, Steinke 2020, Cor. 13. OpenDP states all three as
   privacy maps (``dpspark.privacy.zcdp`` asks them). ``plan`` picks the smallest sigma whose
   T-fold composition meets (epsilon - eps_count, delta) by that map; the accountant charges
   epsilon - eps_count once, as a block that admits exactly T releases of that one mechanism
   (``evolve``).

Total (epsilon, delta) by basic composition of 1 and 2. Every other step (truncation, k-means,
mutation, the population size) is post-processing of released values.

Public constants (as published, run_ours.py and PE_PARAMS, except where said):
``generations(d)`` = max(1, int(4 sqrt d)) (twice that where n_hat d <= ``DEEP_MAX_WORK``: not in the
paper, T and sigma are then chosen from the released n_hat and public inputs); L = n_hat / (5 k) clipped to [L_MIN, population cap];
the population is at most ``POPULATION_CAP`` candidates (not in the paper: a pass costs
n x population x d, so the cap keeps it within a Spark job's time at any n); mutation steps
are ``VAR_SCALE`` x the domain's radius x Levy(``LEVY_BETA``) (Mantegna's algorithm); the first
population is uniform in the domain (the paper packs spheres in the ball around the box; in
many dimensions most of that ball lies outside the box, where no point can be).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from dpspark import solvers
from dpspark.privacy import zcdp
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import GaussianMechanism, LaplaceMechanism

COUNT_SHARE = 0.02  # share of epsilon on the noisy row count n_hat
POPULATION_CAP = 4096  # candidates per generation, at most (public: bounds a pass's work whatever n)
L_MIN = 4  # mutants per center, at least
POINTS_PER_CANDIDATE = 5.0  # L = n_hat / (POINTS_PER_CANDIDATE k) before the caps
VAR_SCALE = 0.01  # mutation step, in units of the domain's radius
LEVY_BETA = 1.75
SNR_FLOOR = 1.0  # below this signal-to-noise ratio of a released histogram, L halves
SELECT_RESTARTS = 10  # weighted k-means restarts per selection
# Twice PE-means' generations (8 sqrt d) where n_hat d <= DEEP_MAX_WORK, i.e. where a pass over the rows is cheap
# (at most 5 x 10^5 coordinates x POPULATION_CAP candidates: credit, 30000 x 24, stays at 4 sqrt d,
# unmeasured with 8). Not in the paper; measured with the numpy reference
# (eps 1, median of 5 seeded runs; int(4 sqrt d) -> int(8 sqrt d)): google reviews k 8 1.299 -> 1.187, k 32
# 1.551 -> 1.413; tripadvisor k 16 1.827 -> 1.563; adult k 32 1.221 -> 1.153, k 8 1.065 -> 1.064; electrical k 16
# 1.059 -> 1.066 (docs/benchmarks.md, "Generations").
DEEP_GENERATIONS = 8.0
DEEP_MAX_WORK = 500_000.0


def generations(dim: int, noisy_n: float | None = None) -> int:
    """T, public: int(4 sqrt(d)) generations, at least 1 (PE-means' default); int(8 sqrt(d)) when the released
    row count shows a pass is cheap (n_hat d <= ``DEEP_MAX_WORK``; ``noisy_n`` None: the default)."""
    per_root_d = DEEP_GENERATIONS if noisy_n is not None and max(float(noisy_n), 0.0) * dim <= DEEP_MAX_WORK else 4.0
    return max(1, int(per_root_d * math.sqrt(dim)))


@dataclass(frozen=True)
class Plan:
    """The releases of one run of the route (public: from epsilon, delta, d only)."""

    count: LaplaceMechanism  # n_hat
    votes: GaussianMechanism  # one generation's histogram (L2 sensitivity 1)
    generations: int
    block_epsilon: float  # the budget of the T histograms together: what the block is charged
    mapped_epsilon: float  # their epsilon by OpenDP's map at votes.sigma: <= block_epsilon (to ~1e-9)
    delta: float

    @property
    def sigma(self) -> float:
        return self.votes.sigma

    @property
    def rho(self) -> float:
        """zCDP of the T histograms together."""
        return self.generations / (2.0 * self.sigma ** 2)


@functools.lru_cache(maxsize=64)
def _smallest_sigma(block_epsilon: float, delta: float, t: int) -> float:
    return zcdp.smallest_sigma(block_epsilon, delta, t)


def plan(epsilon: float, delta: float, dim: int, generations_override: int | None = None) -> Plan:
    """Split (epsilon, delta): COUNT_SHARE for n_hat, the rest for T zCDP-composed histograms."""
    if not (epsilon > 0) or math.isinf(epsilon):
        raise ValueError(f"epsilon={epsilon!r} should be a finite number > 0")
    if not (0 < delta < 1):
        raise ValueError(f"delta={delta!r} should be in (0, 1): the vote histograms are Gaussian")
    eps_count = COUNT_SHARE * epsilon
    block_epsilon = epsilon - eps_count
    t = generations(dim) if generations_override is None else int(generations_override)
    if t < 1:
        raise ValueError(f"generations={t!r} should be >= 1")
    votes = GaussianMechanism.with_sigma(_smallest_sigma(float(block_epsilon), float(delta), t), delta)
    mapped = zcdp.gaussian_releases_epsilon(votes.sigma, t, delta)
    if mapped > block_epsilon:  # sigma only grew from the one that meets it, and the map is monotone
        raise AssertionError(f"evolution plan: {t} releases at sigma={votes.sigma!r} cost {mapped!r} > {block_epsilon!r}")
    return Plan(LaplaceMechanism(eps_count, sensitivity=1.0), votes, t, block_epsilon, mapped, delta)


def composed_epsilon(p: Plan) -> float:
    """The T histograms' epsilon at p.delta by OpenDP's zCDP composition and conversion maps (<= p.block_epsilon,
    which the block is charged: an (e, delta)-DP release is (e', delta)-DP for every e' >= e)."""
    return p.mapped_epsilon


# -- post-processing of released values --------------------------------------------------------------


def truncate(noisy_votes: np.ndarray, noisy_n: float) -> np.ndarray:
    """Keep the largest noisy votes up to the first whose running total (largest first) reaches n_hat, that one
    included (PE-means' threshold); 0 elsewhere, and negative votes read as 0."""
    v = np.asarray(noisy_votes, dtype=np.float64)
    order = np.argsort(-v, kind="stable")
    running = np.cumsum(v[order])  # rises while the votes are positive, then falls: not sorted, so no bisection
    reached = running >= max(noisy_n, 0.0)
    if not reached.any():
        return np.maximum(v, 0.0)
    reach = int(np.argmax(reached))  # the first index whose running total reaches n_hat
    threshold = v[order[reach]]
    return np.where(v >= threshold, np.maximum(v, 0.0), 0.0)


def mutants_per_center(noisy_n: float, k: int) -> int:
    """L for the first generation: n_hat / (5 k), within [L_MIN, POPULATION_CAP / k - 1]."""
    top = max(L_MIN, POPULATION_CAP // k - 1)
    return int(min(max(L_MIN, max(noisy_n, 0.0) / (POINTS_PER_CANDIDATE * k)), top))


def next_mutants(mutants: int, kept_votes: np.ndarray, sigma: float) -> int:
    """Halve L (not below L_MIN) when the released histogram is mostly noise (PE-means' rule)."""
    snr = float(np.sum(np.square(kept_votes))) / (kept_votes.size * sigma * sigma)
    return max(L_MIN, mutants // 2) if snr < SNR_FLOOR else mutants


def levy_steps(rng: np.random.Generator, size: tuple[int, int], beta: float = LEVY_BETA) -> np.ndarray:
    """Levy-stable steps by Mantegna's algorithm (public randomness)."""
    num = math.gamma(1 + beta) * math.sin(math.pi * beta / 2)
    den = math.gamma((1 + beta) / 2) * beta * 2 ** ((beta - 1) / 2)
    sigma_u = (num / den) ** (1 / beta)
    u = rng.normal(0.0, sigma_u, size)
    v = rng.standard_normal(size)
    return u / np.maximum(np.abs(v), 1e-300) ** (1 / beta)


def mutate(centers: np.ndarray, mutants: int, domain: Domain, rng: np.random.Generator) -> np.ndarray:
    """``mutants`` Levy-flight copies of every center, projected into the unit-space domain."""
    targets = np.repeat(np.asarray(centers, dtype=np.float64), mutants, axis=0)
    radius = domain.unit_diameter / 2.0
    moved = targets + VAR_SCALE * radius * levy_steps(rng, targets.shape)
    return domain.clip_unit(np.nan_to_num(moved, nan=0.0, posinf=1.0, neginf=-1.0))


@dataclass
class Result:
    centers: np.ndarray  # (k, d) unit space
    weights: np.ndarray  # (k,) truncated noisy votes per center
    noisy_n: float
    info: dict = field(default_factory=dict)


def noisy_row_count(exact_count, p: Plan, accountant: Accountant) -> float:
    """Release n_hat = n + DLap(1/eps_count) (step 1 of the module docstring)."""
    return float(accountant.laplace("auto: noisy row count (sets the route and the population size)",
                                    np.array([int(exact_count())], dtype=np.int64), p.count)[0])


def evolve(noisy_n: float, votes, domain: Domain, k: int, p: Plan, accountant: Accountant, rng: np.random.Generator,
           on_generation=None) -> Result:
    """Run the T generations from the released row count ``noisy_n`` (``noisy_row_count``, charged already).
    ``votes(population)`` -> the exact (P,) int64 nearest-candidate counts (one Spark pass; numpy in tests).
    Charges exactly p's vote histograms (module docstring, step 2)."""
    noisy_n = float(noisy_n)
    block = accountant.block(
        f"auto: {p.generations} noisy vote histograms (nearest candidate, L2 sensitivity 1)",
        p.block_epsilon, p.delta,
        f"discrete Gaussian sigma={p.sigma:.6g}, {p.generations} adaptive releases, zCDP composition "
        f"rho={p.rho:.6g} (OpenDP make_composition), to (epsilon, delta) at delta={p.delta:g} by "
        f"OpenDP make_zCDP_to_approxDP (Canonne, Kamath, Steinke 2020, Cor. 13): epsilon={p.mapped_epsilon:.12g}",
        releases={p.votes: p.generations})
    mutants = mutants_per_center(noisy_n, k)
    population = domain.sample_unit(rng, (mutants + 1) * k)
    sizes = []
    centers = weights = None
    for g in range(p.generations):
        exact_votes = np.asarray(votes(population), dtype=np.int64)
        if exact_votes.shape != (population.shape[0],):
            raise ValueError(f"votes returned shape {exact_votes.shape} for {population.shape[0]} candidates")
        noisy_votes = block.gaussian(exact_votes, p.votes).astype(np.float64)
        kept = truncate(noisy_votes, noisy_n)
        centers, weights = solvers.weighted_kmeans(population, kept, k, rng, n_init=SELECT_RESTARTS)
        centers = domain.clip_unit(centers)
        sizes.append(int(population.shape[0]))
        if on_generation is not None:
            on_generation(g, population, kept, centers)
        if g == p.generations - 1:
            break
        mutants = next_mutants(mutants, kept, p.sigma)
        population = np.vstack([centers, mutate(centers, mutants, domain, rng)])
    info = {"generations": p.generations, "sigma": p.sigma, "population_sizes": sizes, "noisy_rows": noisy_n}
    return Result(np.asarray(centers, dtype=np.float64), np.asarray(weights, dtype=np.float64), noisy_n, info)
