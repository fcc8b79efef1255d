"""Private choice of the best of M candidate solutions (one Spark pass, one exponential mechanism).

Several solutions of the released coreset (weighted k-means restarts) often sit in different
local optima; their cost on the coreset is too noisy to tell them apart, their exact cost on
the data is not. This step releases only WHICH one is best, privately:

    score_i = -cost_i(D),  cost_i(D) = sum over x in D of min(min_c ||x - c||^p, cap),
    cap = (CAP_RADIUS * Delta)^p

in fixed point (``kernels.solution_costs``), Delta = the unit-space diameter of the domain, so
one term lies in [0, cap] whatever the record holds. (A point farther than CAP_RADIUS * Delta
from every center counts as that far: the cap trades a little fidelity on outliers for a
sensitivity several times smaller than Delta^p.) Under add/remove of one record every score
moves by at most cap and ALL in the same direction (adding a record never lowers a cost),
so the exponential mechanism with sensitivity cap needs no factor 2 (monotone scores;
McSherry and Talwar 2007, the "monotone" case): pure eps_select-DP. The solutions are
computed from released values only (the coreset) and are public inputs of this step.

Exact arithmetic whatever n (``kernels``): the costs are Python integers, never int64 sums
that could wrap (at d = 50 an int64 total would wrap after about 3.6e11 rows and silently give
the mechanism wrong scores). The mechanism's sampler takes int64 scores, so it is given

    score_i = -min(cost_i - min_j cost_j, SCORE_GAP_LIMIT),  SCORE_GAP_LIMIT = 2**62 (public),

which lies in [-2**62, 0]. Same guarantee, argued: for neighbours D' = D + x every cost moves
up by t_i in [0, L] (L = the sensitivity in fixed point) and the smallest cost by some delta
in [0, L], so every gap cost_i - min_j cost_j moves by t_i - delta, inside the ONE interval
[-delta, L - delta] of width L; clamping at a public constant keeps each move between 0 and
the unclamped move, so inside that interval too. That is all the monotone analysis uses: a
probability is exp(-w g_i) / sum_j exp(-w g_j), its numerator moves by a factor in
[exp(-w (L - delta)), exp(w delta)] and its denominator by the inverse range, so the ratio stays
in [exp(-w L), exp(w L)] with w = eps_select / L: pure eps_select-DP, as before. Subtracting
the smallest cost alone changes no probability (Gumbel-max is invariant to one shift of all
scores), so while every gap is below 2**62 the choice is distributed exactly as on the raw costs.
"""

from __future__ import annotations

import numpy as np

from dpspark.kernels import arrow_out
from dpspark.auto.kernels import COST_BITS, cost_aggregator, solution_costs
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import quantize
from dpspark.privacy.mechanisms import ExponentialMechanism
from dpspark.progress import step


CAP_RADIUS = 0.35  # a point's distance counts up to this fraction of the unit-space diameter


def cost_cap(domain: Domain, power: int) -> float:
    """The cap of one point's term (its sensitivity): (CAP_RADIUS * Delta)^p, public."""
    return (CAP_RADIUS * float(domain.unit_diameter)) ** power


def numpy_costs(unit_points: np.ndarray):
    """Reference cost aggregation on one machine (tests, benchmarks)."""
    q = quantize(np.asarray(unit_points, dtype=np.float64).reshape(len(unit_points), -1))

    def costs(solutions, power, cap):
        return solution_costs(q, solutions, power, cap)

    return costs


def spark_costs(df, columns: list[str], timings: dict | None = None):
    """A ``costs(solutions, power, cap)`` callable backed by ONE Spark pass."""

    def costs(solutions, power, cap):
        sols = np.asarray(solutions, dtype=np.float64)
        with step(f"auto pass: exact cost of {sols.shape[0]} candidate solutions", timings):
            # One row per (partition, solution), its exact total as decimal text: the driver adds them
            # as Python ints (a Spark sum of LONGs would wrap silently past 2**63).
            pdf = df.mapInArrow(arrow_out(cost_aggregator(sols, power, cap, columns)), "solution INT, cost STRING").toPandas()
        out = np.zeros(sols.shape[0], dtype=object)  # (M,) exact Python ints
        for i, cost in zip(pdf["solution"].to_numpy(dtype=np.int64), pdf["cost"]):
            out[int(i)] += int(cost)
        return out

    return costs


SCORE_GAP_LIMIT = 1 << 62  # public: a score is -min(cost - smallest cost, this), an int64 (module docstring)


def selection_scores(exact_costs) -> np.ndarray:
    """int64 scores of the mechanism from exact integer costs of any size (module docstring for why it is the same DP)."""
    exact = list(exact_costs)
    if not exact or not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in exact):
        raise TypeError("exact costs must be a non-empty sequence of integers (fixed point)")
    smallest = min(int(c) for c in exact)
    return np.array([-min(int(c) - smallest, SCORE_GAP_LIMIT) for c in exact], dtype=np.int64)


def select_solution(costs, solutions: np.ndarray, domain: Domain, power: int, eps_select: float,
                    accountant: Accountant, label: str = "auto") -> int:
    """Index of the chosen solution; charges eps_select (exponential mechanism, monotone, sensitivity ``cost_cap``)."""
    cap = cost_cap(domain, power)
    exact_costs = costs(solutions, power, cap)
    mech = ExponentialMechanism(eps_select, sensitivity=cap * (1 << COST_BITS), monotone=True)
    return int(accountant.exponential(f"{label}: choice of the best of {len(solutions)} coreset solutions",
                                      selection_scores(exact_costs), mech))
