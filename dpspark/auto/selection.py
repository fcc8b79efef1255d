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
"""

from __future__ import annotations

import numpy as np

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
        from pyspark.sql import functions as F

        sols = np.asarray(solutions, dtype=np.float64)
        with step(f"auto pass: exact cost of {sols.shape[0]} candidate solutions", timings):
            pdf = (df.mapInPandas(cost_aggregator(sols, power, cap, columns), "solution INT, cost LONG")
                   .groupBy("solution").agg(F.sum("cost").alias("cost")).toPandas())
        out = np.zeros(sols.shape[0], dtype=np.int64)
        out[pdf["solution"].to_numpy(dtype=np.int64)] = pdf["cost"].to_numpy(dtype=np.int64)
        return out

    return costs


def select_solution(costs, solutions: np.ndarray, domain: Domain, power: int, eps_select: float,
                    accountant: Accountant, label: str = "auto") -> int:
    """Index of the chosen solution; charges eps_select (exponential mechanism, monotone, sensitivity ``cost_cap``)."""
    cap = cost_cap(domain, power)
    exact_costs = costs(solutions, power, cap)
    mech = ExponentialMechanism(eps_select, sensitivity=cap * (1 << COST_BITS), monotone=True)
    return int(accountant.exponential(f"{label}: choice of the best of {len(solutions)} coreset solutions", -exact_costs, mech))
