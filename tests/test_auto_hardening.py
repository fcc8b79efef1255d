"""Issue 26, finding 5: auto's exact selection costs cannot wrap int64; a charge-reuse claim names its
input; auto's Lloyd step moves a center only when its noisy count clears a public noise threshold.

Every test here is deterministic (exact integers, NoNoise or the ledger): no confidence to state."""

from __future__ import annotations

import signal

import numpy as np
import pandas as pd
import pytest

from dpspark import tables
from dpspark.auto import kernels, selection
from dpspark.auto import estimator
from dpspark.auto.estimator import AutoClustering
from dpspark.cli import main
from dpspark.steps.lloyd import su_split
from dpspark.errors import RunKilled
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE, quantize
from dpspark.privacy.ledger import SCHEMA, Ledger
from dpspark.privacy.mechanisms import NoNoise

from test_scheduling import daily_config, day_rows

INT64_MAX = (1 << 63) - 1


def box(dim: int) -> Domain:
    return Domain(dim=dim, lower=(-1.0,) * dim, upper=(1.0,) * dim)


# ----------------------------------------------------------------------------
# 1. The selection's exact costs are exact integers, whatever n


# Each point's term is the largest a term may be (2**53 - 1 in fixed point): a far public center and
# a cap just below 2**53 / 2**20. 4,000 such terms add up to about 3.6e19 > 2**63, as would 3.6e11
# rows at d = 50 with the real cap: the sums the old int64 code computed wrap at this size.
BIG_CAP = ((1 << 53) - 1) / (1 << kernels.COST_BITS)
BIG_TERM = (1 << 53) - 1
N_BIG = 4000
FAR_AND_NEAR = np.array([[[1e5]], [[0.0]]])  # (M=2 solutions, k=1, d=1): every term maximal / every term 0


def test_numpy_costs_are_exact_past_int64():
    costs = kernels.solution_costs(quantize(np.zeros((N_BIG, 1))), FAR_AND_NEAR, 2, BIG_CAP)
    assert N_BIG * BIG_TERM > INT64_MAX  # the old int64 sum wrapped here
    assert [int(c) for c in costs] == [N_BIG * BIG_TERM, 0]
    assert kernels.exact_sum(np.full(3 * kernels.TERM_CHUNK + 5, BIG_TERM, dtype=np.int64)) == (3 * kernels.TERM_CHUNK + 5) * BIG_TERM
    with pytest.raises(ValueError, match="cap="):  # a term that a float64 cannot hold exactly is refused
        kernels.solution_costs(quantize(np.zeros((2, 1))), FAR_AND_NEAR, 2, float(1 << 40))


def test_spark_costs_are_exact_past_int64_within_and_across_partitions(spark):
    # Two partitions of 2,000 rows: each partition's total (1.8e19) and the sum over them pass 2**63.
    df = spark.createDataFrame(pd.DataFrame({"u0": np.zeros(N_BIG)})).repartition(2)
    costs = selection.spark_costs(df, ["u0"])(FAR_AND_NEAR, 2, BIG_CAP)
    assert [int(c) for c in costs] == [N_BIG * BIG_TERM, 0]


def test_selection_takes_exact_costs_of_any_size_and_keeps_the_range_property():
    dom = box(2)
    sols = np.zeros((3, 1, 2))
    sens = int(selection.cost_cap(dom, 2) * (1 << kernels.COST_BITS))
    huge = [(1 << 64) + 3 * sens, 1 << 64, (1 << 64) + (1 << 70)]  # past int64, and a gap past 2**62

    def costs(solutions, power, cap):
        return np.array(huge, dtype=object)

    eps = 1.0
    assert selection.select_solution(costs, sols, dom, 2, eps, Accountant(eps, 0.0, NoNoise())) == 1
    assert selection.selection_scores(huge).tolist() == [-3 * sens, 0, -selection.SCORE_GAP_LIMIT]
    with pytest.raises(TypeError, match="integers"):
        selection.selection_scores([1.5, 2.0])
    # The property the privacy argument uses (selection's docstring): when every cost moves up by
    # at most L (adding a record), every clamped score moves inside ONE interval of width L.
    r = np.random.default_rng(3)
    big = selection.SCORE_GAP_LIMIT
    for _ in range(200):
        base = [int(v) for v in r.integers(0, 4 * sens, size=6)] + [big + int(r.integers(-3 * sens, 3 * sens))]
        moved = [c + int(t) for c, t in zip(base, r.integers(0, sens + 1, size=len(base)))]
        change = selection.selection_scores(moved).astype(object) - selection.selection_scores(base).astype(object)
        assert max(change) - min(change) <= sens


# ----------------------------------------------------------------------------
# 2. A charge-reuse claim names its input


def test_claims_of_two_inputs_under_one_run_id_are_separate_and_old_claims_still_block(spark, tmp_path):
    ledger = Ledger(spark, str(tmp_path / "ledger"))
    ledger.set_budget("input-a", 5.0, 0.0)
    ledger.set_budget("input-b", 5.0, 0.0)
    assert ledger.claim_charge("input-a", "r", 1, 2) is True
    assert ledger.claim_charge("input-b", "r", 1, 2) is True  # the old id blocked this one
    assert ledger.claim_charge("input-a", "r", 1, 3) is False and ledger.claim_charge("input-b", "r", 1, 3) is False
    # A claim written by an older dpspark (id without the input) still blocks its own input, only it.
    old_claim = tuple({"entry_id": "claim:s:1", "kind": "claim", "input_path": "input-a", "run_id": "s",
                       "epsilon": 0.0, "delta": 0.0, "status": "claimed", "attempt": 2}.get(c.split()[0])
                      for c in SCHEMA.split(", "))
    spark.createDataFrame([old_claim], SCHEMA).write.format("delta").mode("append").save(ledger.path)
    assert ledger.claim_charge("input-a", "s", 1, 3) is False
    assert ledger.claim_charge("input-b", "s", 1, 3) is True


def test_two_inputs_retried_under_one_run_id_both_reuse_their_charge(spark, tmp_path, monkeypatch):
    """Two tables, one ledger, one run id "r" (two pipelines, each with its own output): both attempts are
    killed right after their charge, before their fit. Both retries take over their own input's charge."""
    ledger_path = str(tmp_path / "ledger")
    ledger = Ledger(spark, ledger_path)
    cases = []
    for name in ("a", "b"):
        table = str(tmp_path / f"table_{name}")
        spark.createDataFrame(day_rows(1)).write.format("delta").save(table)
        key = tables.ledger_key_of(spark, table)
        ledger.set_budget(key, 3.0, 0.0)
        cases.append((key, daily_config(tmp_path, table, ledger_path, str(tmp_path / f"out_{name}"))))
    real_charge = Ledger.charge

    def charge_then_killed(self, *args, **kwargs):
        real_charge(self, *args, **kwargs)
        raise RunKilled(signal.SIGTERM)

    monkeypatch.setattr(Ledger, "charge", charge_then_killed)
    for _, cfg in cases:
        assert main(["run", "--config", cfg, "--run-id", "r"], spark=spark) == 143
    monkeypatch.setattr(Ledger, "charge", real_charge)
    for _, cfg in cases:
        assert main(["run", "--config", cfg, "--run-id", "r"], spark=spark) == 0
    for key, _ in cases:
        assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)  # one charge each, not two
        assert [e["status"] for e in ledger.runs(key)] == ["started", "charged", "killed", "started", "reused",
                                                           "fit_started", "succeeded"]


# ----------------------------------------------------------------------------
# 3. auto's Lloyd step: a cluster whose noisy count is below a public threshold keeps its center


def test_lloyd_threshold_is_public_and_set_from_the_noise_sds():
    from dpspark.steps.lloyd import LLOYD_MIN_COUNT_SDS, lloyd_min_count

    eps_t, dim = 0.2, 6
    eps_count, eps_sums = su_split(eps_t, dim)
    sd = np.hypot(np.sqrt(2) / eps_count, np.sqrt(2) * dim / eps_sums)
    assert lloyd_min_count(eps_t, dim) == pytest.approx(LLOYD_MIN_COUNT_SDS * sd)
    assert 25 < lloyd_min_count(eps_t, dim) < 45  # about 34 rows here, far above the old rule's 1
    assert lloyd_min_count(eps_t, dim, "paper") == pytest.approx(LLOYD_MIN_COUNT_SDS * np.sqrt(2) * 7 / eps_t * np.sqrt(2))
    assert lloyd_min_count(1e6, 1) == 1.0  # never below the old rule
    with pytest.raises(ValueError, match="noise_rule='gauss'"):
        lloyd_min_count(eps_t, dim, "gauss")


def test_a_lloyd_step_keeps_the_center_of_a_cluster_below_the_threshold_and_moves_one_above():
    """NoNoise: the noisy counts are the exact ones. Cluster 0 holds 5 points (>= 1, the old rule's bar,
    below the threshold, about 25 here): it keeps its center. Cluster 1 holds 10^6 points: it moves to their mean."""
    dim, k, eps = 3, 2, 0.5
    est = AutoClustering(k=k, epsilon=eps, delta=0.0, domain=box(dim), features=("a", "b", "c"))
    start = np.array([[-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]])
    means = np.array([[0.9, 0.9, 0.9], [0.1, 0.2, 0.3]])
    counts = np.array([5, 1_000_000], dtype=np.int64)
    sums = np.rint(means * counts[:, None] * SCALE).astype(np.int64)
    seen = []

    def aggregate(centers):
        seen.append(np.array(centers))
        return counts, sums

    accountant = Accountant(eps, 0.0, NoNoise())
    centers, weights, steps = est._lloyd(start.copy(), np.ones(k), 1e9, accountant, aggregate, {}, {"lloyd": 0})
    np.testing.assert_allclose(centers[0], start[0])  # kept (the old rule moved it to 0.9, ...)
    np.testing.assert_allclose(centers[1], means[1], atol=1e-6)  # moved
    np.testing.assert_allclose(weights, counts)
    assert len(seen) == steps and accountant.spent_epsilon == pytest.approx(eps)  # post-processing: no extra charge
    assert counts[0] < estimator.lloyd_min_count(eps / steps, dim) < counts[1]
