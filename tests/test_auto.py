"""algorithm.name: auto (the default): its choice, its accounting, its Spark passes, and the privacy of
the LSH-tree coreset and of the private selection (dpspark/auto/).

Statistical tests are seeded and state their confidence; each also runs a deliberately broken
variant that must be caught."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from dpspark.auto import AutoClustering, kernels, selection
from dpspark.steps import tree, tree_kernels
from dpspark.auto.estimator import choose
from dpspark.cli import main
from dpspark.dplloyd.core import numpy_aggregate
from dpspark.errors import PrivacyAccountingError
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE, quantize
from dpspark.privacy.mechanisms import LaplaceMechanism, SeededNoise
from dpspark.privacy.randomness import Randomness

from conftest import blobs
from privacy_stats import Z_BOUND, binned_log_ratios, worst_excess
from test_pipeline import read_summary

HOSTILE = [np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324]


def box(dim: int, lo: float = -1.0, hi: float = 1.0) -> Domain:
    return Domain(dim=dim, lower=(lo,) * dim, upper=(hi,) * dim)


def unit_blobs(dim: int, k: int, n_per: int, seed: int, scale: float = 0.08) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    centers = r.uniform(-0.6, 0.6, size=(k, dim))
    return blobs(n_per, centers, scale, seed + 1), centers


def fit_numpy(est: AutoClustering, x: np.ndarray, seed: int, noise=None):
    """The tree route on the numpy reference aggregations (the same integers as the Spark passes).

    Like ``tables.prepare_points``: rows with a missing or non-finite feature are dropped, the rest
    mapped into unit space by the domain's total map."""
    u = est.domain.clip_to_unit(x[np.all(np.isfinite(x), axis=1)])
    names = [f"f{j}" for j in range(est.domain.dim)]
    return est.fit_aggregates(tree.numpy_tree_aggregates(u), numpy_aggregate(u), selection.numpy_costs(u), names,
                              Randomness(seed=seed, noise=noise))


def kmeans_cost(x, centers):
    return float(((x[:, None, :] - centers[None]) ** 2).sum(-1).min(1).sum())


# ----------------------------------------------------------------------------
# The choice: public inputs only


def test_choice_reads_only_public_inputs_and_the_plan_states_the_spend():
    assert choose(2, "kmeans", 1e-6)[0] == "maxcover"
    assert choose(3, "kmedian", 1e-6)[0] == "maxcover"
    assert choose(2, "kmeans", 0.0)[0] == "tree_lloyd"  # delta 0: the pure route
    assert choose(4, "kmeans", 1e-6)[0] == "tree_lloyd"
    assert choose(24, "kmedian", 1e-6)[0] == "tree_kmedian"
    grid = AutoClustering(k=3, epsilon=0.7, delta=1e-6, domain=box(2), features=("a", "b"))
    assert grid.privacy_plan() == (0.7, 1e-6)
    pure = AutoClustering(k=3, epsilon=0.7, delta=1e-6, domain=box(5), features=tuple("abcde"))
    assert pure.privacy_plan() == (0.7, 0.0)  # the configured delta is an upper bound
    for bad, match in (({"k": 0}, "k=0"), ({"epsilon": float("inf")}, "epsilon=inf"), ({"delta": 1.0}, "delta=1.0"),
                       ({"objective": "kcenter"}, "objective='kcenter'")):
        kw = {"k": 3, "epsilon": 1.0, "delta": 1e-6, **bad}
        with pytest.raises(ValueError, match=match):
            AutoClustering(domain=box(5), features=tuple("abcde"), **kw).privacy_plan()


# ----------------------------------------------------------------------------
# Sensitivities, exactly (one hostile record against a random table)


def _levels(codes, counts, sums, top):
    return [tree._level_table(codes, counts, sums, top, level) for level in range(top + 1)]


@pytest.mark.parametrize("value", HOSTILE)
def test_one_record_moves_one_count_per_level_by_one_and_a_sum_by_at_most_d(value):
    dim = 6
    x, _ = unit_blobs(dim, 3, 200, seed=3)
    hostile = np.full((1, dim), 0.3)
    hostile[0, ::2] = value
    top = tree.max_depth(dim)
    w, b = tree_kernels.fixed_planes(*tree.draw_planes(np.random.default_rng(5), top, dim))
    before = _levels(*tree_kernels.leaf_aggregates(quantize(x), w, b), top)
    after = _levels(*tree_kernels.leaf_aggregates(quantize(np.vstack([x, hostile])), w, b), top)
    for (p0, n0, s0), (p1, n1, s1) in zip(before, after):
        nodes = np.union1d(p0, p1)
        c0, c1 = tree._lookup(p0, n0, nodes), tree._lookup(p1, n1, nodes)
        assert np.abs(c1 - c0).sum() == 1  # one node, by one: L1 sensitivity 1 per level
        moved = np.abs(tree._lookup(p1, s1, nodes) - tree._lookup(p0, s0, nodes)).sum()
        assert moved <= dim * SCALE  # the sums' L1 sensitivity d (fixed point)


def test_the_tree_bits_of_a_record_do_not_depend_on_its_batch():
    dim = 5
    x, _ = unit_blobs(dim, 2, 300, seed=8)
    w, b = tree_kernels.fixed_planes(*tree.draw_planes(np.random.default_rng(1), 12, dim))
    whole = tree_kernels.leaf_codes(quantize(x), w, b)
    pieces = np.concatenate([tree_kernels.leaf_codes(quantize(x[i:i + 7]), w, b) for i in range(0, len(x), 7)])
    assert np.array_equal(whole, pieces)


@pytest.mark.parametrize("value", HOSTILE)
def test_one_record_moves_every_solution_cost_the_same_way_by_at_most_the_cap(value):
    dim, k = 8, 4
    x, centers = unit_blobs(dim, k, 150, seed=11)
    dom = box(dim)
    sols = np.stack([centers, centers[::-1] * 0.5, np.zeros((k, dim)) + 0.9])
    cap = selection.cost_cap(dom, 2)
    hostile = np.full((1, dim), -0.9)
    hostile[0, 1::3] = value
    c0 = kernels.solution_costs(quantize(x), sols, 2, cap)
    c1 = kernels.solution_costs(quantize(np.vstack([x, hostile])), sols, 2, cap)
    diff = c1 - c0
    assert np.all(diff >= 0)  # monotone: adding a record never lowers a cost
    assert np.all(diff <= cap * (1 << kernels.COST_BITS))  # the sensitivity the mechanism is given
    assert cap < dom.unit_diameter ** 2  # the cap really is tighter than the diameter ...
    far = np.full((1, dim), 1.0)  # ... and it binds: a point far from every center counts exactly the cap
    assert kernels.solution_costs(quantize(far), np.zeros((1, k, dim)) - 1.0, 2, cap)[0] == math.floor(cap * (1 << kernels.COST_BITS))


def _rule_costs(fixed_points, solutions, power, cap):
    """The selection's costs by the rule alone, one solution at a time: the per-entry nearest center
    (``_per_entry_nearest``, no screen), its distance by explicit differences, each term in fixed point."""
    from dpspark.kernels import _per_entry_nearest

    x = fixed_points.astype(np.float64) / SCALE
    limit = kernels.term_limit(cap)
    out = []
    for sol in np.asarray(solutions, dtype=np.float64):
        near = sol[_per_entry_nearest(x, sol)]
        d2 = np.zeros(len(x))
        for j in range(x.shape[1]):
            d2 += (x[:, j] - near[:, j]) ** 2
        term = d2 if power == 2 else np.sqrt(d2)
        out.append(sum(min(int(v), limit) for v in np.rint(term * (1 << kernels.COST_BITS))))
    return out


@pytest.mark.parametrize("dim", [2, 3, 4, 9, 50])
@pytest.mark.parametrize("power", [1, 2])
def test_the_selection_screens_every_solution_at_once_and_keeps_the_rules_costs(dim, power):
    """solution_costs labels every solution's nearest center from one BLAS screen (nearest_center_each):
    each label and each cost is the per-entry rule's, one solution at a time, bit for bit: ties
    (duplicated centers, points halfway), hostile values, a solution of one center, many rows."""
    from dpspark.kernels import _per_entry_nearest, nearest_center, nearest_center_each

    rng = np.random.default_rng(dim * 10 + power)
    k, m = 6, 7
    x, centers = unit_blobs(dim, k, 400, seed=dim)
    sols = np.stack([centers + rng.normal(0, 0.05, centers.shape) for _ in range(m)])
    sols[1, 3] = sols[1, 0]  # a duplicated center: ties go to the lower index
    sols[2] = np.clip(sols[2] * 3.0, -1.0, 1.0)
    halfway = (sols[3, 0] + sols[3, 1]) / 2.0  # a point exactly between two centers of one solution
    hostile = np.full((len(HOSTILE), dim), 0.3)
    hostile[:, 0] = HOSTILE
    q = quantize(np.vstack([x, np.tile(halfway, (5, 1)), hostile, -x[:50]]))
    cap = selection.cost_cap(box(dim), power)
    points = q.astype(np.float64) / SCALE
    labels = nearest_center_each(points, sols)
    assert labels.shape == (len(points), m)
    for i in range(m):
        assert np.array_equal(labels[:, i], _per_entry_nearest(points, sols[i]))
        assert np.array_equal(labels[:, i], nearest_center(points, sols[i]))
    assert list(kernels.solution_costs(q, sols, power, cap)) == _rule_costs(q, sols, power, cap)
    one = sols[:, :1]  # one center per solution
    assert list(kernels.solution_costs(q, one, power, cap)) == _rule_costs(q, one, power, cap)


def test_the_selection_screen_leaves_near_ties_to_the_rule():
    """Rows where the matrix product's argmin is NOT the rule's (two centers 1e-13 apart, points far
    along one axis): the screen leaves them to the per-entry rule, in every solution that has them."""
    from dpspark.kernels import _per_entry_nearest, nearest_center_each

    rng = np.random.default_rng(5)
    dim = 12
    c = rng.uniform(-1, 1, size=(6, dim))
    c[1] = c[0] + rng.normal(0, 1e-13, dim)
    x = rng.uniform(-1, 1, size=(20000, dim))
    x[:, 0] *= 1e3
    product = x @ (-2.0 * c.T) + np.einsum("ij,ij->i", c, c)[None, :] + np.einsum("ij,ij->i", x, x)[:, None]
    assert np.count_nonzero(product.argmin(axis=1) != _per_entry_nearest(x, c)) > 0  # the case needs the rule
    sets = np.stack([c, c[::-1], c * 0.5])
    labels = nearest_center_each(x, sets)
    for i, s in enumerate(sets):
        assert np.array_equal(labels[:, i], _per_entry_nearest(x, s))


def test_the_selection_costs_do_not_depend_on_the_batch():
    dim, k = 12, 5
    x, centers = unit_blobs(dim, k, 300, seed=21)
    sols = np.stack([centers, centers[::-1], centers * 0.5])
    q = quantize(x)
    cap = selection.cost_cap(box(dim), 2)
    whole = kernels.solution_costs(q, sols, 2, cap)
    parts = [kernels.solution_costs(q[i:i + 37], sols, 2, cap) for i in range(0, len(q), 37)]
    assert list(whole) == [sum(int(p[j]) for p in parts) for j in range(len(sols))]


# ----------------------------------------------------------------------------
# Statistical privacy of the tree walk, end to end through private_coreset


STAT_DIM = 5
EPS_ROOT, EPS_TREE, EPS_SUMS = 0.3, 1.0, 20.0
LEVELS = 2  # the walk's depth, fixed for the test: each level gets EPS_TREE / 2 = 0.5, tau = 3 / 0.5 = 6


def _split_rows(n_left: int, n_right: int):
    """Rows on the two sides of the FIRST public hyperplane (the one private_coreset draws with seed 0)."""
    top = tree.max_depth(STAT_DIM)
    w, b = tree_kernels.fixed_planes(*tree.draw_planes(np.random.default_rng(0), top, STAT_DIM))
    pool = np.random.default_rng(99).uniform(-1, 1, size=(4000, STAT_DIM))
    bit = (quantize(pool) @ w[0]) > b[0]
    return pool[~bit][:n_left], pool[bit][:n_right]


def _right_kept(n_right: int, runs: int, seed: int, mech_cls=LaplaceMechanism) -> np.ndarray:
    """Per run: is the level-1 node on the right of the first hyperplane released (kept)?"""
    left, right = _split_rows(30, n_right)
    agg = tree.numpy_tree_aggregates(np.vstack([left, right]))
    noise = SeededNoise(seed)
    out = np.empty(runs, dtype=np.int64)
    saved = tree.LaplaceMechanism
    tree.LaplaceMechanism = mech_cls
    try:
        for r in range(runs):
            acc = Accountant(EPS_ROOT + EPS_TREE + EPS_SUMS, 0.0, noise)
            cs = tree.private_coreset(agg, box(STAT_DIM), 1, EPS_ROOT, lambda n: (EPS_TREE, EPS_SUMS), acc,
                                      np.random.default_rng(0))
            out[r] = any(level >= 1 and (prefix >> (level - 1)) == 1 for level, prefix in cs.leaf_nodes)
            acc.finish()  # exactly eps_root + eps_tree + eps_sums, whatever the walk did
    finally:
        tree.LaplaceMechanism = saved
    return out


class _HalfNoiseLevels(LaplaceMechanism):
    """Broken: the tree levels get half the noise they need (the sums and the root are untouched)."""

    def release(self, exact, noise):
        if self.sensitivity == 1.0 and self.epsilon != EPS_ROOT:  # a tree level (eps_tree / D), not the root
            return LaplaceMechanism(self.epsilon * 2, self.sensitivity, self.unit).release(exact, noise)
        return super().release(exact, noise)


def test_tree_level_release_loss_end_to_end_and_half_noise_is_caught(monkeypatch):
    """One record added on the right of the first cut: the loss of the released structure at level 1.

    30 rows on the left and 6 or 7 on the right of the first public hyperplane, k = 1, the
    walk fixed at 2 levels: a level gets eps_level = 0.5 and tau = 3 / 0.5 = 6, and "the right
    node is kept" has probability 0.62 vs 0.77 (loss 0.50 on "not kept", exactly eps_level:
    the bound is tight). 4,000 runs a side: se <= 0.05 per bin; a correct walk exceeds
    eps_level + 7 se with probability < 1e-8. With half the noise at the levels the loss is
    1.0, about 10 se above the bound, and is caught (8,000 runs a side: "not kept" has P 0.1 there).
    """
    monkeypatch.setattr(tree, "depth_for", lambda noisy_n, k, limit: LEVELS)
    eps_level = EPS_TREE / LEVELS
    ratios = binned_log_ratios(_right_kept(6, 4000, 1), _right_kept(7, 4000, 2))
    assert len(ratios) == 2
    assert worst_excess(ratios, eps_level) <= Z_BOUND
    assert max(abs(lr) for lr, _ in ratios.values()) >= 0.3  # power: the loss is really measured (true 0.50)
    broken = binned_log_ratios(_right_kept(6, 8000, 3, _HalfNoiseLevels), _right_kept(7, 8000, 4, _HalfNoiseLevels))
    assert worst_excess(broken, eps_level) > Z_BOUND


# ----------------------------------------------------------------------------
# Accounting: every run spends exactly its plan, whatever the walk did


@pytest.mark.parametrize("n_per,objective", [(2, "kmeans"), (40, "kmeans"), (3000, "kmeans"), (40, "kmedian"),
                                            (3000, "kmedian")])
def test_charges_add_up_to_exactly_epsilon_and_no_delta(n_per, objective):
    dim, k = 7, 3
    x, _ = unit_blobs(dim, k, n_per, seed=n_per)
    est = AutoClustering(k=k, epsilon=0.8, delta=1e-6, domain=box(dim), features=tuple(f"f{j}" for j in range(dim)),
                         objective=objective)
    model = fit_numpy(est, x, seed=4)
    assert math.isclose(sum(c["epsilon"] for c in model.charges), 0.8, rel_tol=1e-12)
    assert model.epsilon_spent == pytest.approx(0.8, rel=1e-12) and model.delta_spent == 0.0
    assert all(c["delta"] == 0.0 for c in model.charges)
    auto = model.info["auto"]
    assert auto["route"] == ("tree_lloyd" if objective == "kmeans" else "tree_kmedian")
    assert model.parameters["chosen"] == auto["route"] and "d=7 > 3" in model.parameters["why"]
    assert (auto["lloyd_steps"] >= 1) == (objective == "kmeans")
    assert model.centers.shape == (k, dim) and np.all(np.abs(model.centers) <= 1.0)
    labels = [c["step"] for c in model.charges]
    assert labels[0].startswith("auto: noisy row count") and any("leaf sums" in s for s in labels)


def test_an_accountant_that_would_overspend_stops_the_walk_before_noise():
    """The coreset cannot spend more than it is given: a split asking for more is refused."""
    x, _ = unit_blobs(5, 2, 50, seed=2)
    acc = Accountant(1.0, 0.0, SeededNoise(1))
    with pytest.raises(PrivacyAccountingError):
        tree.private_coreset(tree.numpy_tree_aggregates(x), box(5), 2, 0.1, lambda n: (0.5, 0.5), acc,
                             np.random.default_rng(0))


# ----------------------------------------------------------------------------
# Utility (seeded): it finds well-separated clusters in many dimensions


def test_finds_blobs_in_twenty_dimensions():
    dim, k = 20, 5
    x, centers = unit_blobs(dim, k, 2000, seed=21, scale=0.05)
    est = AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=tuple(f"f{j}" for j in range(dim)))
    ratios = [kmeans_cost(x, fit_numpy(est, x, seed=s).centers) / kmeans_cost(x, centers) for s in range(1, 8)]
    # Typically 1.5-1.6: tight blobs (per-point cost 0.05) make the Lloyd step's Laplace noise on
    # the sums (d / eps per coordinate, n = 2000 per cluster) the main cost; in about a quarter of
    # the runs the coreset merges two blobs (2.3-2.9).
    assert float(np.median(ratios)) < 2.0, ratios
    # The check can fail: one center at the data mean is far worse.
    assert kmeans_cost(x, x.mean(0, keepdims=True)) / kmeans_cost(x, centers) > 5


# ----------------------------------------------------------------------------
# Spark: the passes agree with the numpy references, and a default run says what it chose


def test_spark_fit_equals_the_numpy_reference_with_hostile_rows_and_any_partitioning(spark):
    dim, k = 6, 3
    x, _ = unit_blobs(dim, k, 400, seed=31)
    x = np.vstack([x, np.array([[np.nan, 1e308, -np.inf, 0.2, 5e-324, -1e308]])])
    feats = tuple(f"f{j}" for j in range(dim))
    est = AutoClustering(k=k, epsilon=2.0, delta=0.0, domain=box(dim), features=feats, seed=9)
    ref = fit_numpy(est, x, seed=9)
    pdf = pd.DataFrame(x, columns=list(feats))
    for parts in (1, 3):
        ops: dict = {}
        model = AutoClustering(k=k, epsilon=2.0, delta=0.0, domain=box(dim), features=feats, seed=9).fit(
            spark.createDataFrame(pdf).repartition(parts), operational=ops)
        assert np.array_equal(model.centers, ref.centers) and np.array_equal(model.noisy_weights, ref.noisy_weights)
        assert ops["spark_passes"] == 1 + ops["passes_by_kind"]["selection"] + ops["passes_by_kind"]["lloyd"]
        assert "spark_passes" not in model.info  # non-private metadata stays off the model


def test_a_run_without_algorithm_name_is_auto_and_its_record_says_what_it_chose(spark, tmp_path, write_delta):
    dim = 5
    x, _ = unit_blobs(dim, 3, 300, seed=41)
    path = write_delta(pd.DataFrame(x * 50 + 50, columns=[f"f{j}" for j in range(dim)]))
    cfg = {"input": {"path": path, "format": "delta", "features": [f"f{j}" for j in range(dim)]},
           "domain": {"lower": [0] * dim, "upper": [100] * dim},
           "privacy": {"epsilon": 1.0, "delta": 1e-6},
           "algorithm": {"k": 3}, "output": {"path": str(tmp_path / "out")},
           "seed": 3, "unsafe_fixed_seed": True}
    cfg_path = tmp_path / "auto.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(cfg_path), "--run-id", "a1"], spark=spark) == 0
    summary = read_summary(cfg)
    assert summary["algorithm"] == "auto" and summary["parameters"]["chosen"] == "tree_lloyd"
    assert "d=5 > 3" in summary["parameters"]["why"]
    assert summary["epsilon_spent"] == pytest.approx(1.0) and summary["delta_spent"] == 0.0  # delta: an upper bound
    runs = spark.read.format("delta").load(cfg["output"]["path"] + "/runs").collect()
    assert [(r.status, r.delta_spent) for r in runs] == [("succeeded", 0.0)] and json.loads(runs[0].parameters)["fitted"]["chosen"] == "tree_lloyd"


# ----------------------------------------------------------------------------
# Statistical privacy of the private selection, end to end through select_solution


def _picked_first(with_record: bool, runs: int, seed: int, eps: float, mech_cls=None) -> np.ndarray:
    """Per run: did the selection pick solution 0? Both solutions fit the table about equally (11
    rows at each one's center, each row beyond the cap from the other); the added record sits
    on solution 1's center, so it raises cost 0 by the cap and cost 1 by about 0."""
    dim, dom = 4, box(4)
    sol0 = np.full((1, 1, dim), -0.8)
    sol1 = np.full((1, 1, dim), 0.1)
    r = np.random.default_rng(5)
    table = np.vstack([r.normal(0.1, 0.02, size=(11, dim)), r.normal(-0.8, 0.02, size=(11, dim))])
    if with_record:
        table = np.vstack([table, np.full((1, dim), 0.1)])
    costs = selection.numpy_costs(np.clip(table, -1, 1))
    sols = np.concatenate([sol0, sol1])
    noise = SeededNoise(seed)
    saved = selection.ExponentialMechanism
    if mech_cls is not None:
        selection.ExponentialMechanism = mech_cls
    try:
        out = np.empty(runs, dtype=np.int64)
        for i in range(runs):
            out[i] = selection.select_solution(costs, sols, dom, 2, eps, Accountant(eps, 0.0, noise)) == 0
    finally:
        selection.ExponentialMechanism = saved
    return out


def test_selection_release_loss_end_to_end_and_an_understated_sensitivity_is_caught():
    """eps_select = 1: the added record lowers P[pick solution 0] from about 0.5 to 1 / (1 + e) =
    0.27 (loss 0.62 <= 1, with monotone scores). 20,000 runs a side: se <= 0.02 per bin; a
    correct selection exceeds eps + 7 se with probability < 1e-8. With the sensitivity
    understated 3x the loss is about ln(0.5 / 0.047) = 2.4 and is caught."""
    from dpspark.privacy.mechanisms import ExponentialMechanism

    class Understated(ExponentialMechanism):
        def __init__(self, epsilon, sensitivity=1.0, monotone=True):
            super().__init__(epsilon, sensitivity / 3, monotone)

    eps = 1.0
    ratios = binned_log_ratios(_picked_first(False, 20000, 1, eps), _picked_first(True, 20000, 2, eps))
    assert len(ratios) == 2
    assert worst_excess(ratios, eps) <= Z_BOUND
    assert max(abs(lr) for lr, _ in ratios.values()) >= 0.4  # power: the loss is really measured
    broken = binned_log_ratios(_picked_first(False, 20000, 3, eps, Understated), _picked_first(True, 20000, 4, eps, Understated))
    assert worst_excess(broken, eps) > Z_BOUND
