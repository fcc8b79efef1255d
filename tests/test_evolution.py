"""auto's evolution route (dpspark/steps/evolution.py): its choice, its privacy map and accounting, the
sensitivity of a vote histogram under hostile records, the noise it draws, and a Spark fit equal to the
numpy reference.

Statistical tests are seeded and state their confidence; each also checks a deliberately broken variant."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpspark.auto import AutoClustering
from dpspark.auto.estimator import EVOLUTION_MAX_K, EVOLUTION_MIN_K, choose
from dpspark.dplloyd.core import numpy_aggregate
from dpspark.errors import PrivacyAccountingError
from dpspark.privacy.accountant import Accountant
from dpspark.privacy import zcdp
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import GaussianMechanism, SeededNoise
from dpspark.privacy.randomness import Randomness
from dpspark.auto import estimator, selection
from dpspark.steps import evolution, tree

from conftest import blobs

HOSTILE = [np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324]


def box(dim: int) -> Domain:
    return Domain(dim=dim, lower=(-1.0,) * dim, upper=(1.0,) * dim)


def fit_numpy(est: AutoClustering, x: np.ndarray, seed: int):
    """The evolution route on the numpy reference aggregation (the same integers as the Spark pass): rows with
    a non-finite feature dropped, the rest mapped by the domain's total map, as ``tables.prepare_points``."""
    u = est.domain.clip_to_unit(x[np.all(np.isfinite(x), axis=1)])
    agg = numpy_aggregate(u)
    return est.fit_votes(lambda: u.shape[0], lambda pop: agg(pop)[0], [f"f{j}" for j in range(est.domain.dim)],
                         Randomness(seed=seed), tree_branch=(tree.numpy_tree_aggregates(u), agg, selection.numpy_costs(u)))


def kmeans_cost(x, centers):
    return float(((x[:, None, :] - centers[None]) ** 2).sum(-1).min(1).sum())


# ----------------------------------------------------------------------------
# The choice: public inputs only


def test_auto_chooses_evolution_for_many_clusters_in_mid_dimensions_only():
    assert choose(10, "kmeans", 1e-6, EVOLUTION_MIN_K)[0] == "evolution"
    assert choose(24, "kmeans", 1e-6, EVOLUTION_MAX_K)[0] == "evolution"
    assert choose(10, "kmeans", 1e-6, EVOLUTION_MIN_K - 1)[0] == "tree_lloyd"
    assert choose(10, "kmeans", 1e-6, EVOLUTION_MAX_K + 1)[0] == "tree_lloyd"
    assert choose(10, "kmeans", 0.0, 16)[0] == "tree_lloyd"  # pure DP asked for: the Gaussian route cannot run
    assert choose(10, "kmedian", 1e-6, 16)[0] == "tree_kmedian"
    assert choose(2, "kmeans", 1e-6, 16)[0] == "maxcover"
    est = AutoClustering(k=16, epsilon=0.7, delta=1e-6, domain=box(6), features=tuple("abcdef"))
    route, why = est._validated()
    assert route == "evolution" and "k=16 >= 8" in why and "noisy row count is between 100 k (d < 8) and 100000" in why
    assert est.privacy_plan() == (0.7, 1e-6)


# ----------------------------------------------------------------------------
# The privacy map (stated and asserted, as OpenDP's meas.map(1))


@pytest.mark.parametrize("epsilon,delta,dim", [(1.0, 1e-6, 10), (0.3, 1e-9, 24), (4.0, 1e-5, 4), (1.0, 1e-6, 100)])
def test_the_plan_spends_exactly_epsilon_and_delta(epsilon, delta, dim):
    p = evolution.plan(epsilon, delta, dim)
    assert p.generations == max(1, int(4 * math.sqrt(dim)))
    assert p.count.privacy_map(1) == (pytest.approx(evolution.COUNT_SHARE * epsilon, rel=1e-12), 0.0)
    # T histograms, each 1/(2 sigma^2)-zCDP at L2 sensitivity 1, compose to T/(2 sigma^2)-zCDP (OpenDP's map):
    assert zcdp.gaussian_releases_rho(p.sigma, p.generations) == pytest.approx(p.generations / (2 * p.sigma ** 2), rel=1e-9)
    assert p.rho == pytest.approx(p.generations / (2 * p.sigma ** 2), rel=1e-12)
    # the block is charged OpenDP's epsilon at that sigma: within the budget, and all of it (sigma is the smallest)
    assert evolution.composed_epsilon(p) == zcdp.gaussian_releases_epsilon(p.sigma, p.generations, delta)
    assert evolution.composed_epsilon(p) <= p.block_epsilon
    assert evolution.composed_epsilon(p) == pytest.approx(p.block_epsilon, rel=1e-5)
    assert zcdp.gaussian_releases_epsilon(p.sigma * (1 - 1e-5), p.generations, delta) > p.block_epsilon
    assert p.count.epsilon + p.block_epsilon == pytest.approx(epsilon, rel=1e-12)
    # the mechanism that draws the noise has at least that sigma (its own stated epsilon is Bun-Steinke's)
    assert p.votes.sigma >= zcdp.smallest_sigma(p.block_epsilon, delta, p.generations)
    assert p.votes.sensitivity == 1.0 and p.votes.delta == delta
    for sigma in (0.5, p.sigma, 20.125804289080413, 1e4):  # the constructor never rounds sigma down
        mech = GaussianMechanism.with_sigma(sigma, delta)
        assert sigma <= mech.sigma <= sigma * (1 + 1e-9)
    with pytest.raises(ValueError, match="sigma"):
        GaussianMechanism.with_sigma(0.0, delta)
    # more generations, more noise per histogram
    assert evolution.plan(epsilon, delta, 4 * dim).sigma > p.sigma


def test_the_conversion_is_cks_corollary_13_and_tighter_than_bun_steinke():
    """OpenDP's zCDP -> (epsilon, delta) map against the formula it implements (minimised numerically here),
    and against the looser rho + 2 sqrt(rho ln(1/delta)): never above it."""
    for sigma, t, delta in [(20.0, 19, 1e-6), (5.0, 8, 1e-9), (60.0, 40, 1e-5)]:
        rho = t / (2 * sigma ** 2)
        eps = zcdp.gaussian_releases_epsilon(sigma, t, delta)
        alphas = np.linspace(1.0001, 400.0, 400000)

        def delta_at(e):
            return np.min(np.exp((alphas - 1) * (alphas * rho - e)) / (alphas - 1) * (1 - 1 / alphas) ** alphas)

        assert delta_at(eps) <= delta * (1 + 1e-3)  # eps meets delta (OpenDP rounds eps up)
        assert delta_at(eps * 0.995) > delta  # and is not loose by more than 0.5%
        assert eps < rho + 2 * math.sqrt(rho * math.log(1 / delta))  # Bun and Steinke, Prop. 1.3
    assert zcdp.gaussian_releases_epsilon(10.0, 5, 1e-6) > zcdp.gaussian_releases_epsilon(11.0, 5, 1e-6)
    assert zcdp.gaussian_releases_epsilon(10.0, 6, 1e-6) > zcdp.gaussian_releases_epsilon(10.0, 5, 1e-6)
    for bad in [dict(sigma=0.0, releases=3, delta=1e-6), dict(sigma=1.0, releases=0, delta=1e-6),
                dict(sigma=1.0, releases=3, delta=0.0), dict(sigma=math.inf, releases=3, delta=1e-6),
                dict(sigma=1.0, releases=True, delta=1e-6)]:
        with pytest.raises(ValueError):
            zcdp.gaussian_releases_epsilon(**bad)
    for eps, delta, t in [(1.0, 1e-6, 19), (0.1, 1e-8, 3), (8.0, 1e-5, 40)]:
        s = zcdp.smallest_sigma(eps, delta, t)
        assert zcdp.gaussian_releases_epsilon(s, t, delta) <= eps < zcdp.gaussian_releases_epsilon(s * (1 - 1e-5), t, delta)


def test_a_run_charges_the_count_and_one_block_of_exactly_t_histograms():
    dim, k = 9, 8
    x = blobs(150, np.random.default_rng(1).uniform(-0.6, 0.6, (k, dim)), 0.05, 2)  # 1200 rows >= 100 k
    est = AutoClustering(k=k, epsilon=0.9, delta=1e-7, domain=box(dim), features=tuple(f"f{j}" for j in range(dim)))
    model = fit_numpy(est, x, seed=5)
    # 1200 x 9 coordinates <= DEEP_MAX_WORK: twice PE-means' generations, chosen from the released count
    p = evolution.plan(0.9, 1e-7, dim, generations_override=int(8 * math.sqrt(dim)))
    assert evolution.generations(dim, model.info["auto"]["noisy_rows"]) == p.generations == 24
    assert [c["step"].split(" (")[0] for c in model.charges] == [
        "auto: noisy row count", f"auto: {p.generations} noisy vote histograms"]
    assert sum(c["epsilon"] for c in model.charges) == pytest.approx(0.9, rel=1e-9)
    assert model.epsilon_spent == pytest.approx(0.9, rel=1e-9) and model.delta_spent == 1e-7
    assert model.info["auto"]["route"] == "evolution"
    assert model.info["auto"]["evolution"]["generations"] == p.generations
    assert len(model.info["auto"]["evolution"]["population_sizes"]) == p.generations
    assert max(model.info["auto"]["evolution"]["population_sizes"]) <= evolution.POPULATION_CAP


@pytest.mark.parametrize("rows_per_cluster,max_rows,why", [(40, 1e9, "below 100 k"), (150, 500.0, "above 500")])
def test_outside_its_rows_the_route_runs_the_tree_on_the_rest_and_charges_the_planned_delta(
        monkeypatch, rows_per_cluster, max_rows, why):
    """The branch is a function of the released row count only; either way the run spends (epsilon, delta)."""
    monkeypatch.setattr(estimator, "EVOLUTION_MAX_ROWS", max_rows)
    dim, k = 6, 8
    x = blobs(rows_per_cluster, np.random.default_rng(4).uniform(-0.6, 0.6, (k, dim)), 0.05, 3)
    est = AutoClustering(k=k, epsilon=0.8, delta=1e-6, domain=box(dim), features=tuple(f"f{j}" for j in range(dim)))
    model = fit_numpy(est, x, seed=6)
    steps = [c["step"] for c in model.charges]
    assert steps[0].startswith("auto: noisy row count") and steps[1].startswith("auto: the evolution branch's delta")
    assert model.charges[1]["epsilon"] == 0.0 and model.charges[1]["delta"] == 1e-6
    assert steps[2].startswith("auto: noisy row count (tree root)") and not any("vote histograms" in s for s in steps)
    assert model.epsilon_spent == pytest.approx(0.8, rel=1e-9) and model.delta_spent == 1e-6
    assert model.charges[0]["epsilon"] == pytest.approx(evolution.COUNT_SHARE * 0.8, rel=1e-12)
    assert model.info["auto"]["route"] == "tree_lloyd" and why in model.parameters["why"]
    assert est.privacy_plan() == (0.8, 1e-6)  # stated before the data, whichever branch runs
    # without the tree's aggregations the route is refused before the count is drawn or charged
    u = est.domain.clip_to_unit(x)
    counted = []
    with pytest.raises(ValueError, match="needs tree_branch"):
        est.fit_votes(lambda: counted.append(1) or u.shape[0], lambda pop: numpy_aggregate(u)(pop)[0], list("abcdef"),
                      Randomness(seed=6))
    assert counted == []


def test_twice_the_generations_only_where_the_released_count_shows_a_cheap_pass():
    assert evolution.generations(24) == evolution.generations(24, 1e6) == int(4 * math.sqrt(24)) == 19
    assert evolution.generations(24, evolution.DEEP_MAX_WORK / 24) == int(8 * math.sqrt(24)) == 39
    assert evolution.generations(24, evolution.DEEP_MAX_WORK / 24 + 1) == 19
    assert evolution.generations(6, -50.0) == int(8 * math.sqrt(6))  # a negative noisy count reads as 0 rows
    # either T has a plan spending the same block (the run's total does not depend on which one runs)
    deep, default = (evolution.plan(1.0, 1e-6, 24, generations_override=t) for t in (39, 19))
    assert deep.block_epsilon == default.block_epsilon and deep.sigma > default.sigma


def test_the_fewest_rows_for_votes_depend_on_the_public_d():
    assert estimator.evolution_min_rows(5, 8) == 800.0 and estimator.evolution_min_rows(7, 8) == 800.0
    assert estimator.evolution_min_rows(8, 8) == 80.0 and estimator.evolution_min_rows(24, 64) == 640.0


@pytest.mark.parametrize("dim,route", [(6, "tree_lloyd"), (10, "evolution")])
def test_forty_rows_per_cluster_evolve_from_d_8_on(dim, route):
    """The same 40 rows per cluster: the tree branch in d = 6, the votes in d = 10; (epsilon, delta) either way."""
    k = 8
    x = blobs(40, np.random.default_rng(12).uniform(-0.6, 0.6, (k, dim)), 0.05, 13)
    est = AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=tuple(f"f{j}" for j in range(dim)))
    model = fit_numpy(est, x, seed=14)
    assert model.info["auto"]["route"] == route
    assert any("vote histograms" in c["step"] for c in model.charges) == (route == "evolution")
    assert model.epsilon_spent == pytest.approx(1.0, rel=1e-9) and model.delta_spent == 1e-6
    assert f"{estimator.evolution_min_rows(dim, 1):g} k" in est._validated()[1]


def test_public_inputs_without_an_evolution_plan_take_the_tree_route_before_any_charge():
    """An epsilon so large OpenDP's conversion overflows: auto says so and plans the pure tree route."""
    est = AutoClustering(k=10, epsilon=1e5, delta=1e-6, domain=box(24), features=tuple(f"f{j}" for j in range(24)))
    route, why = est._validated()
    assert route == "tree_lloyd" and "no plan" in why
    assert est.privacy_plan() == (1e5, 0.0)
    assert AutoClustering(k=10, epsilon=1.0, delta=1e-6, domain=box(24), features=("v",))._validated()[0] == "evolution"


def test_the_block_refuses_a_histogram_beyond_t_and_any_other_mechanism():
    p = evolution.plan(1.0, 1e-6, 4)
    acc = Accountant(1.0, 1e-6, SeededNoise(3))
    acc.laplace("count", np.array([10]), p.count)
    block = acc.block("votes", evolution.composed_epsilon(p), p.delta, "zCDP", releases={p.votes: p.generations})
    for _ in range(p.generations):
        block.gaussian(np.zeros(5, dtype=np.int64), p.votes)
    with pytest.raises(PrivacyAccountingError, match="over the"):
        block.gaussian(np.zeros(5, dtype=np.int64), p.votes)
    louder = GaussianMechanism(p.votes.epsilon * 2, p.votes.delta, sensitivity=1.0)
    with pytest.raises(PrivacyAccountingError, match="not proved"):
        acc.block("b2", 0.0, 0.0, "x", releases={p.votes: 1}).gaussian(np.zeros(5, dtype=np.int64), louder)


def test_a_plan_that_would_overspend_is_refused_before_any_noise():
    p = evolution.plan(1.0, 1e-6, 4)
    acc = Accountant(0.5, 1e-6, SeededNoise(1))
    votes_asked = []
    noisy_n = evolution.noisy_row_count(lambda: 10, p, acc)  # 0.02 of 1.0: within 0.5
    with pytest.raises(PrivacyAccountingError):
        evolution.evolve(noisy_n, lambda pop: votes_asked.append(pop) or np.zeros(len(pop), dtype=np.int64), box(4), 8,
                         p, acc, np.random.default_rng(0))
    assert votes_asked == [] and len(acc.charges) == 1  # refused before any pass or any noise


# ----------------------------------------------------------------------------
# Sensitivity: one record, whatever it holds, adds 1 to exactly one vote


@pytest.mark.parametrize("value", HOSTILE + [0.0, 1.0, -1.0, 7.5])
def test_one_hostile_record_moves_exactly_one_vote_by_one(value):
    dim = 6
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (300, dim))
    population = box(dim).sample_unit(rng, 200)
    record = np.full((1, dim), 0.3)
    record[0, int(abs(hash(str(value))) % dim)] = value
    dom = box(dim)
    before = numpy_aggregate(dom.clip_to_unit(x))(population)[0]
    # a non-finite record is dropped by prepare_points (it is absent: L2 distance 0); a finite one is clipped in
    finite = np.all(np.isfinite(record))
    after = numpy_aggregate(dom.clip_to_unit(np.vstack([x, record]) if finite else x))(population)[0]
    diff = after - before
    assert int(np.abs(diff).sum()) == (1 if finite else 0) and diff.min() >= 0
    # a duplicate of an existing row also moves exactly one vote
    dup = numpy_aggregate(dom.clip_to_unit(np.vstack([x, x[:1]])))(population)[0] - before
    assert int(dup.sum()) == 1 and int(np.count_nonzero(dup)) == 1


# ----------------------------------------------------------------------------
# The noise: discrete Gaussian with the planned sigma (seeded; 99.9% two-sided bounds)


def test_released_votes_carry_gaussian_noise_of_the_planned_sigma():
    p = evolution.plan(1.0, 1e-6, 16)
    acc = Accountant(1.0, 1e-6, SeededNoise(2024))
    acc.laplace("count", np.array([0]), p.count)
    block = acc.block("votes", evolution.composed_epsilon(p), p.delta, "zCDP", releases={p.votes: p.generations})
    exact = np.arange(20000, dtype=np.int64) % 7
    noise = np.concatenate([block.gaussian(exact, p.votes) - exact for _ in range(p.generations)]).astype(float)
    m = noise.size
    # mean: |mean| < 3.29 sd/sqrt(m); variance: chi-square approximation, |s^2/sigma^2 - 1| < 3.29 sqrt(2/m)
    assert abs(noise.mean()) < 3.29 * p.sigma / math.sqrt(m)
    assert abs(noise.var() / p.sigma ** 2 - 1) < 3.29 * math.sqrt(2 / m)
    # the check can fail: half the noise would be caught
    assert abs((noise / 2).var() / p.sigma ** 2 - 1) > 3.29 * math.sqrt(2 / m)


# ----------------------------------------------------------------------------
# Post-processing rules


def test_truncation_keeps_the_largest_votes_up_to_the_released_total():
    v = np.array([50.0, -3.0, 20.0, 5.0, 30.0, 1.0])
    assert evolution.truncate(v, 80).tolist() == [50.0, 0.0, 0.0, 0.0, 30.0, 0.0]
    assert evolution.truncate(v, 81).tolist() == [50.0, 0.0, 20.0, 0.0, 30.0, 0.0]
    assert evolution.truncate(v, 10 ** 6).tolist() == [50.0, 0.0, 20.0, 5.0, 30.0, 1.0]  # never reached: negatives 0
    assert evolution.truncate(v, -5).tolist() == [50.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # many negative votes after the crossing (a large population, mostly noise): the running total falls again,
    # and the crossing is still found (a bisection on it kept every positive vote here)
    w = np.array([10.0, 1.0, 10.0, 1.0] + [-5.0] * 6)  # running total 10, 20, 21, 22, 17, 12, 7, 2, -3, -8
    assert evolution.truncate(w, 15).tolist() == [10.0, 0.0, 10.0, 0.0] + [0.0] * 6
    assert int(np.searchsorted(np.cumsum(np.sort(w)[::-1]), 15)) == w.size  # what the bisection found


def test_population_size_is_capped_and_mutants_stay_in_the_domain():
    assert evolution.mutants_per_center(1e9, 8) == evolution.POPULATION_CAP // 8 - 1
    assert evolution.mutants_per_center(-50.0, 8) == evolution.L_MIN
    assert evolution.mutants_per_center(4000, 10) == 80
    assert evolution.next_mutants(40, np.zeros(100), 10.0) == 20
    assert evolution.next_mutants(40, np.full(100, 50.0), 10.0) == 40
    rng = np.random.default_rng(0)
    for dom in (box(5), Domain(dim=5, radius=3.0)):
        out = evolution.mutate(dom.sample_unit(rng, 10), 50, dom, rng)
        assert out.shape == (500, 5) and np.all(np.isfinite(out)) and np.allclose(out, dom.clip_unit(out), rtol=0, atol=1e-12)
        assert (np.linalg.norm(out, axis=1).max() <= 1 + 1e-12) if dom.is_ball else np.abs(out).max() <= 1.0


# ----------------------------------------------------------------------------
# Utility (seeded) and Spark


def test_finds_many_blobs_in_ten_dimensions():
    dim, k = 10, 16
    centers = np.random.default_rng(7).uniform(-0.7, 0.7, (k, dim))
    x = blobs(500, centers, 0.05, 8)
    est = AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=tuple(f"f{j}" for j in range(dim)))
    ratios = [kmeans_cost(x, fit_numpy(est, x, seed=s).centers) / kmeans_cost(x, centers) for s in (1, 2, 3)]
    assert float(np.median(ratios)) < 2.0, ratios
    assert kmeans_cost(x, centers[:8]) / kmeans_cost(x, centers) > 5  # half the blobs missed is caught


def test_spark_fit_equals_the_numpy_reference_with_hostile_rows_and_any_partitioning(spark):
    dim, k = 5, 8
    centers = np.random.default_rng(31).uniform(-0.6, 0.6, (k, dim))
    x = np.vstack([blobs(150, centers, 0.05, 32), np.array([[np.nan, 1e308, -np.inf, 0.2, 5e-324],
                                                           [1e308, -1e308, 5e-324, 0.0, 3.0]])])
    feats = tuple(f"f{j}" for j in range(dim))
    ref = fit_numpy(AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=feats, seed=9), x, seed=9)
    pdf = pd.DataFrame(x, columns=list(feats))
    for parts in (1, 3):
        ops: dict = {}
        model = AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=feats, seed=9).fit(
            spark.createDataFrame(pdf).repartition(parts), operational=ops)
        assert model.info["auto"]["route"] == "evolution"
        assert np.array_equal(model.centers, ref.centers) and np.array_equal(model.noisy_weights, ref.noisy_weights)
        assert ops["spark_passes"] == 1 + evolution.generations(dim, model.info["auto"]["noisy_rows"])
        assert model.epsilon_spent == pytest.approx(1.0, rel=1e-9) and model.delta_spent == 1e-6
    # too few rows for the votes: the tree branch, on Spark as on numpy
    small = x[: 40 * k]
    ref = fit_numpy(AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=feats, seed=9), small, seed=9)
    model = AutoClustering(k=k, epsilon=1.0, delta=1e-6, domain=box(dim), features=feats, seed=9).fit(
        spark.createDataFrame(pd.DataFrame(small, columns=list(feats))).repartition(2))
    assert model.info["auto"]["route"] == ref.info["auto"]["route"] == "tree_lloyd"
    assert np.array_equal(model.centers, ref.centers) and model.delta_spent == 1e-6
