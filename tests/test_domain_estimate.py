"""``domain: {estimate: private}`` (issue 48): the mechanism of dpspark.privacy.bounds, its privacy map
and sensitivity, a statistical test of its threshold, the wrapper's accounting, and whole runs (CLI with
a ledger and no bounds at all; dpspark.ml without lower/upper)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dpspark import config as config_mod
from dpspark.errors import ConfigError
from dpspark.privacy import bounds
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import GaussianMechanism, LaplaceMechanism, NoNoise, SeededNoise

from conftest import blobs

EXTREMES = [0.0, -0.0, 5e-324, -5e-324, 1e-300, 2.0 ** -32, 2.0 ** -33, 2.0 ** 127, 2.0 ** 128, 1e308, -1e308, 1.7976931348623157e308,
            -1.7976931348623157e308, 3.0, -3.0, 40.7, 1e6]


# ---------------------------------------------------------------------------------------------
# The per-record maps: total, one bin per feature, the same in numpy and Spark


def test_every_finite_value_falls_in_its_octave_bin():
    edges = bounds.octave_edges()
    assert edges.shape == (bounds.OCTAVE_BINS + 1,) and np.all(np.diff(edges) > 0) and np.all(np.isfinite(edges))
    rng = np.random.default_rng(4801)
    x = np.concatenate([EXTREMES, rng.standard_cauchy(2000) * 10.0 ** rng.integers(-30, 30, 2000)])
    idx = bounds.octave_index(x)
    assert idx.min() >= 0 and idx.max() < bounds.OCTAVE_BINS
    inside = (edges[idx] <= x) & ((x < edges[idx + 1]) | (x == edges[-1]))
    assert inside.all(), x[~inside]


def test_dyadic_bins_cover_the_unit_interval():
    u = np.array([-1.0, -0.999, 0.0, 0.5, 1.0 - 1e-16, 1.0])
    idx = bounds.dyadic_index(u, 10)
    assert idx.tolist() == [0, 0, 512, 768, 1023, 1023]


def test_spark_bins_equal_the_numpy_rule(spark):
    from pyspark.sql import functions as F

    rng = np.random.default_rng(4802)
    x = rng.standard_cauchy(500) * 10.0 ** rng.integers(-20, 20, 500)
    x = x[np.abs(np.log2(np.abs(x)) - np.round(np.log2(np.abs(x)))) > 1e-9]  # not on an octave edge (log2 rounding)
    x = np.concatenate([x, [0.0, 5e-324, 1e308, -1e308]])
    box = Domain(1, (-50.0,), (70.0,))
    rows = spark.createDataFrame(pd.DataFrame({"x": x})).select(
        bounds.octave_column(F.col("x")).alias("o"),
        bounds.dyadic_column(box.unit_columns([F.col("x")])[0]).alias("t")).toPandas()
    assert rows["o"].tolist() == bounds.octave_index(x).tolist()
    assert rows["t"].tolist() == bounds.dyadic_index(box.clip_to_unit(x.reshape(-1, 1))[:, 0]).tolist()


def test_the_spark_pass_counts_exactly_what_the_numpy_rules_count(spark):
    """The estimate's passes (one mapInArrow job each: a numpy bincount per partition, summed on the
    driver) give the numpy rules' histograms exactly: hostile values (octave edges included, which
    Spark's own log2 would round), rows with an invalid feature dropped, more partitions than rows
    (empty ones give zeros)."""
    from dpspark import tables
    from dpspark.estimated_domain import dyadic_counts, octave_counts

    rng = np.random.default_rng(4806)
    edges = [2.0 ** e for e in range(-40, 130, 7)] + [-(2.0 ** e) for e in range(-40, 130, 11)]
    col0 = np.concatenate([EXTREMES, edges, rng.standard_cauchy(300) * 10.0 ** rng.integers(-20, 20, 300)])
    col1 = rng.permutation(col0)
    valid = pd.DataFrame({"x": col0, "y": col1})
    hostile = pd.DataFrame({"x": [np.nan, 1.0, np.inf], "y": [2.0, -np.inf, 3.0]})
    df = spark.createDataFrame(pd.concat([valid, hostile], ignore_index=True)).repartition(7)
    raw, _ = tables.prepare_raw(df, ("x", "y"), None, 2, "test")
    x = valid.to_numpy()
    box = Domain(2, (-50.0, -1e6), (70.0, 1e300))
    octaves = octave_counts(raw, 2)
    assert octaves.dtype == np.int64 and octaves.shape == (2, bounds.OCTAVE_BINS)
    assert np.array_equal(octaves, np.stack([np.bincount(bounds.octave_index(x[:, j]), minlength=bounds.OCTAVE_BINS)
                                             for j in range(2)]))
    dyadic = dyadic_counts(raw, box, 10)
    u = box.clip_to_unit(x)
    assert np.array_equal(dyadic, np.stack([np.bincount(bounds.dyadic_index(u[:, j], 10), minlength=1024) for j in range(2)]))
    assert octaves.sum() == dyadic.sum() == 2 * x.shape[0]
    empty = octave_counts(raw.limit(0), 2)
    assert empty.shape == (2, bounds.OCTAVE_BINS) and empty.sum() == 0


# ---------------------------------------------------------------------------------------------
# Sensitivity and privacy map (OpenDP style: the map of the stated input distance)


@pytest.mark.parametrize("seed", range(5))
def test_one_record_moves_each_histogram_vector_by_its_stated_sensitivity(seed):
    """Add/remove one record (any finite value, extremes included): the octave vector moves by d in
    L1 (sqrt(d) in L2), the tree's by d L (sqrt(d L)): exactly what the releases are calibrated to."""
    rng = np.random.default_rng([4803, seed])
    d, levels = 3, bounds.LEVELS
    x = rng.normal(0, 10, (200, d))
    record = rng.choice(EXTREMES, d)
    box = Domain(d, (-20.0,) * d, (20.0,) * d)

    def octaves(data):
        return np.stack([np.bincount(bounds.octave_index(data[:, j]), minlength=bounds.OCTAVE_BINS) for j in range(d)])

    def tree(data):
        u = box.clip_to_unit(data)
        finest = np.stack([np.bincount(bounds.dyadic_index(u[:, j], levels), minlength=1 << levels) for j in range(d)])
        return bounds.tree_levels(finest, levels)

    with_record = np.vstack([x, record])
    for hist, l1 in ((octaves, d), (tree, d * levels)):
        diff = (hist(with_record) - hist(x)).ravel()
        assert np.abs(diff).sum() == l1 and math.isclose(np.sqrt((diff ** 2).sum()), math.sqrt(l1))


def test_records_at_the_float_range_never_give_an_infinite_box():
    """Many records at +-1e308 (a sentinel value): the released box still has a finite width, so the
    released centers map back to finite original units."""
    x = np.concatenate([np.full((3000, 1), 1e308), np.full((3000, 1), -1e308)])
    counts = np.bincount(bounds.octave_index(x[:, 0]), minlength=bounds.OCTAVE_BINS).reshape(1, -1)
    lo, hi, fell_back = bounds.octave_box(counts.astype(float), 10.0)
    assert not fell_back.any() and np.isfinite(hi - lo).all()
    box = Domain(1, tuple(lo), tuple(hi))
    assert np.isfinite(box.from_unit(box.clip_to_unit(x))).all()
    lo2, hi2, _ = _estimate(x, None, NoNoise(), epsilon=1e4)
    assert np.isfinite(hi2 - lo2).all() and np.isfinite(Domain(1, tuple(lo2), tuple(hi2)).from_unit(np.array([[-1.0], [1.0]]))).all()


def test_tree_levels_are_sums_of_the_finest():
    finest = np.arange(2 * 16).reshape(2, 16)
    levels = bounds.tree_levels(finest, 4)
    assert levels.shape == (2, 2 + 4 + 8 + 16)
    assert levels[:, :2].sum(axis=1).tolist() == finest.sum(axis=1).tolist()
    assert levels[0, :2].tolist() == [finest[0, :8].sum(), finest[0, 8:].sum()]


@pytest.mark.parametrize("dim,outer,delta", [(2, True, 1e-7), (2, False, 1e-7), (24, True, 1e-7), (3, True, 0.0)])
def test_the_plan_states_its_privacy_map(dim, outer, delta):
    box = ((0.0,) * dim, (1.0,) * dim) if outer else None
    plan = bounds.EstimatePlan(dim=dim, epsilon=0.1, delta=delta, outer=box)
    releases = plan.releases()
    assert len(releases) == (1 if outer else 2)
    eps = dl = 0.0
    for label, rel, e, d in releases:
        per_feature = 1 if "octave" in label else bounds.LEVELS
        mech = rel.mechanism
        if isinstance(mech, LaplaceMechanism):
            assert mech.sensitivity == dim * per_feature and mech.privacy_map(dim * per_feature) == (e, 0.0)
        else:
            assert isinstance(mech, GaussianMechanism) and delta > 0
            assert math.isclose(mech.sensitivity, math.sqrt(dim * per_feature))
            got = mech.privacy_map(math.sqrt(dim * per_feature))
            assert math.isclose(got[0], e, rel_tol=1e-9) and got[1] == d
        eps += e
        dl += mech.privacy_map(mech.sensitivity)[1]
    assert math.isclose(eps, 0.1) and plan.spends() == pytest.approx((0.1, dl))
    if delta == 0:
        assert plan.spends()[1] == 0.0


# ---------------------------------------------------------------------------------------------
# The rule: exact (no noise), then a statistical test of its thresholds


def _estimate(x, outer, noise, epsilon=0.1, delta=1e-7):
    d = x.shape[1]
    plan = bounds.EstimatePlan(dim=d, epsilon=epsilon, delta=delta, outer=outer)
    for label, rel, _, _ in plan.releases():
        if outer is None:
            counts = np.stack([np.bincount(bounds.octave_index(x[:, j]), minlength=bounds.OCTAVE_BINS) for j in range(d)])
            lo, hi, _ = bounds.octave_box(rel.mechanism.release(counts, noise).astype(float), rel.tau)
            outer = (lo, hi)
        else:
            u = Domain(d, tuple(outer[0]), tuple(outer[1])).clip_to_unit(x)
            finest = np.stack([np.bincount(bounds.dyadic_index(u[:, j]), minlength=1 << bounds.LEVELS) for j in range(d)])
            noisy = rel.mechanism.release(bounds.tree_levels(finest), noise).astype(float)
            return bounds.tree_box(noisy, rel, outer[0], outer[1])


def test_without_noise_the_box_walks_down_to_the_data():
    """No noise and thresholds below one record (epsilon 1e4): the rule itself, exactly."""
    x = blobs(4000, [(3.0, 500.0)], 0.3, 4804)  # the data's range is about 2 x 1000 times smaller than the outer box
    lo, hi, clipped = _estimate(x, ((-1000.0, -1e6), (1000.0, 1e6)), NoNoise(), epsilon=1e4)
    width = x.max(axis=0) - x.min(axis=0)
    assert np.all(lo <= x.min(axis=0)) and np.all(hi >= x.max(axis=0))  # nothing clipped ...
    assert np.all((hi - lo) <= 4.0 * width + 2.0 * 2000.0 / 1024 * np.array([1, 1000]))  # ... and tight to a few bins
    assert np.all(clipped == 0.0)
    lo2, hi2, _ = _estimate(x, None, NoNoise(), epsilon=1e4)  # no outer box at all: octaves first
    assert np.all(lo2 <= x.min(axis=0)) and np.all(hi2 >= x.max(axis=0)) and np.all(hi2 - lo2 <= 8.0 * width + 1.0)


def test_a_tight_outer_box_stays_the_box():
    x = np.random.default_rng(4805).uniform(-1, 1, (20000, 2))
    lo, hi, _ = _estimate(x, ((-1.0, -1.0), (1.0, 1.0)), NoNoise())
    assert lo.tolist() == [-1.0, -1.0] and hi.tolist() == [1.0, 1.0]


def test_noise_alone_rarely_widens_a_bound():
    """Statistical test of the thresholds (seeded, 400 trials, at a 99.9% one-sided confidence): on a
    table with NO records every noisy count is noise; a bound moves off the fallback/outer edge only
    when some tested count clears its threshold, which the union bound caps at BETA (0.05) per
    stage. Observed frequency <= BETA + 3.1 sd of a Binomial(400, BETA) proportion."""
    trials, d = 400, 2
    empty = np.zeros((0, d))
    limit = bounds.BETA + 3.1 * math.sqrt(bounds.BETA * (1 - bounds.BETA) / trials)
    moved_tree = moved_octave = 0
    outer = ((-5.0, -5.0), (5.0, 5.0))
    plan = bounds.EstimatePlan(dim=d, epsilon=0.1, delta=1e-7, outer=None)
    (_, octave_release, _, _), _ = plan.releases()
    for t in range(trials):
        noise = SeededNoise(48060 + t)
        lo, hi, _ = _estimate(empty, outer, noise)
        moved_tree += not (lo.tolist() == [-5.0, -5.0] and hi.tolist() == [5.0, 5.0])
        counts = np.zeros((d, bounds.OCTAVE_BINS), dtype=np.int64)
        lo, hi, fell_back = bounds.octave_box(octave_release.mechanism.release(counts, noise).astype(float),
                                              octave_release.tau)
        moved_octave += not (lo.tolist() == [-1.0, -1.0] and hi.tolist() == [1.0, 1.0] and fell_back.all())
    assert moved_tree / trials <= limit and moved_octave / trials <= limit, (moved_tree, moved_octave, limit)


def test_with_noise_most_records_stay_inside_at_epsilon_one_tenth():
    """Seeded: 20 estimates on 40,000 points of 4 blobs in a 10x box: at most 2% of the records
    outside in the median, the box at most 2x the data's range in the median (measured 0.0% and 1.2x)."""
    x = blobs(10000, [(0, 0), (10, 2), (3, 8), (9, 9)], 1.0, 4807)
    lo0, hi0 = x.min(axis=0), x.max(axis=0)
    c, h = (lo0 + hi0) / 2, (hi0 - lo0) / 2
    outside, widths = [], []
    for t in range(20):
        lo, hi, _ = _estimate(x, (c - 10 * h, c + 10 * h), SeededNoise(48070 + t))
        outside.append(((x < lo) | (x > hi)).any(axis=1).mean())
        widths.append(np.max((hi - lo) / (hi0 - lo0)))
    assert np.median(outside) <= 0.02 and np.median(widths) <= 2.0, (np.median(outside), np.median(widths))


# ---------------------------------------------------------------------------------------------
# Config


def _raw(**domain):
    return {"input": {"path": "/data/points", "features": ["x", "y"]}, "domain": domain,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "algorithm": {"name": "auto", "k": 3},
            "output": {"path": "/tmp/out"}}


def test_config_accepts_an_estimate_with_or_without_an_outer_box():
    cfg = config_mod.validate(_raw(estimate="private"))
    assert cfg.domain.estimate == "private" and cfg.domain.lower is None and cfg.domain.dim == 2
    assert cfg.domain.epsilon_share == bounds.DEFAULT_EPSILON_SHARE
    cfg = config_mod.validate(_raw(estimate="private", lower=[-100, -100], upper=[100, 100], epsilon_share=0.3))
    assert cfg.domain.lower == (-100.0, -100.0) and cfg.domain.epsilon_share == 0.3


@pytest.mark.parametrize("domain,key", [
    ({"estimate": "yes"}, "domain.estimate"),
    ({"estimate": "private", "radius": 3.0}, "domain.radius"),
    ({"lower": [0, 0], "upper": [1, 1], "epsilon_share": 0.2}, "domain.epsilon_share"),
    ({"estimate": "private", "epsilon_share": 0.9}, "domain.epsilon_share"),
    ({"estimate": "private", "epsilon_share": 0}, "domain.epsilon_share"),
    ({}, "domain"),
])
def test_config_refuses_a_bad_estimate(domain, key):
    with pytest.raises(ConfigError) as err:
        config_mod.validate(_raw(**domain))
    assert err.value.key == key


def test_config_refuses_an_estimate_for_ldp_and_needs_dim_for_one_array_column():
    raw = _raw(estimate="private")
    raw["algorithm"] = {"name": "ldp", "k": 3}
    with pytest.raises(ConfigError) as err:
        config_mod.validate(raw)
    assert err.value.key == "domain.estimate"
    raw = _raw(estimate="private")
    raw["input"]["features"] = ["v"]
    with pytest.raises(ConfigError) as err:
        config_mod.validate(raw)
    assert err.value.key == "domain.dim"
    raw["domain"]["dim"] = 4
    assert config_mod.validate(raw).domain.dim == 4


def test_the_run_plan_includes_the_estimate():
    from dpspark.runner import build_estimator

    for family, delta, expect_delta in (("auto", 1e-6, None), ("dplloyd", 0.0, 0.0), ("maxcover", 1e-6, 1e-6)):
        raw = _raw(estimate="private", lower=[-50, -50], upper=[50, 50])
        raw["algorithm"] = {"name": family, "k": 3}
        raw["privacy"]["delta"] = delta
        est = build_estimator(config_mod.validate(raw))
        eps, dl = est.privacy_plan()
        assert math.isclose(eps, 1.0) and dl <= delta * (1 + 1e-12)
        if expect_delta is not None:
            assert math.isclose(dl, expect_delta)


# ---------------------------------------------------------------------------------------------
# Whole runs


def _points(seed=4808):
    x = blobs(3000, [(2000, 40), (5000, 90), (8000, 10)], 150.0, seed)
    x[:, 1] = x[:, 1] / 30.0 + 40.0  # another scale and offset per feature: bounds nobody would guess
    return pd.DataFrame({"x": x[:, 0], "y": x[:, 1]})


def test_a_run_with_no_bounds_at_all_is_charged_and_reports_its_estimate(spark, tmp_path, write_delta):
    import yaml

    from dpspark import tables
    from dpspark.cli import main
    from dpspark.privacy.ledger import Ledger

    pdf = _points()
    path = write_delta(pdf)
    ledger = str(tmp_path / "ledger")
    key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger).set_budget(key, 5.0, 1e-5)
    cfg = {"input": {"path": path, "features": ["x", "y"]}, "domain": {"estimate": "private"},
           "privacy": {"epsilon": 1.0, "delta": 1e-6, "ledger": ledger}, "algorithm": {"name": "auto", "k": 3},
           "output": {"path": str(tmp_path / "out")}, "spark": {"conf": {"spark.ui.enabled": False}}}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(cfg_path), "--run-id", "est1"], spark=spark) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = [c["step"] for c in summary["charges"]]
    assert steps[:2] == ["domain estimate: octave histograms", "domain estimate: dyadic histograms"]
    est_eps = sum(c["epsilon"] for c in summary["charges"] if c["step"].startswith("domain estimate"))
    assert math.isclose(est_eps, bounds.DEFAULT_EPSILON_SHARE, rel_tol=1e-9)
    assert math.isclose(sum(c["epsilon"] for c in summary["charges"]), summary["epsilon_spent"], rel_tol=1e-9)
    assert math.isclose(summary["epsilon_spent"], 1.0, rel_tol=1e-9) and summary["delta_spent"] <= 1e-6
    dom = summary["domain"]
    assert dom["source"] == "private estimate" and len(dom["lower"]) == 2
    assert all(0.0 <= c <= 1.0 for c in dom["noisy_clipped_fraction"])
    centers = np.array(summary["centers"])
    assert np.all(centers >= np.array(dom["lower"]) - 1e-9) and np.all(centers <= np.array(dom["upper"]) + 1e-9)
    totals = Ledger(spark, ledger).totals(key)
    assert math.isclose(totals.spent_epsilon, 1.0, rel_tol=1e-9)
    events = Ledger(spark, ledger).events(key)
    assert any("released the domain" in (e.get("note") or "") for e in events if e.get("status") == "succeeded")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Domain released by this run's private estimate" in page and "domain estimate: dyadic histograms" in page


def test_a_seeded_run_with_no_bounds_releases_a_box_near_the_data(spark, tmp_path, write_delta):
    """The same run with a fixed seed (NOT private, no ledger): a reproducible check of where the box
    lands. (The ledgered run above draws secure noise, so it asserts only what holds for every draw.)"""
    import yaml

    from dpspark.cli import main

    path = write_delta(_points())
    cfg = {"input": {"path": path, "features": ["x", "y"]}, "domain": {"estimate": "private"},
           "privacy": {"epsilon": 1.0, "delta": 1e-6}, "algorithm": {"name": "auto", "k": 3},
           "output": {"path": str(tmp_path / "out")}, "seed": 4810, "unsafe_fixed_seed": True,
           "spark": {"conf": {"spark.ui.enabled": False}}}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(cfg_path), "--run-id", "est2"], spark=spark) == 0
    dom = json.loads((tmp_path / "out" / "summary.json").read_text())["domain"]
    # the released box is near the data, not the float range (loose by design, never 1e300)
    assert dom["lower"][0] > 0 and dom["upper"][0] < 20000 and 0 < dom["lower"][1] < 50 and dom["upper"][1] < 300, dom


def test_dpclustering_needs_no_bounds_with_estimate_domain(spark):
    from dpspark.ml import DPClustering

    df = spark.createDataFrame(_points(4809))
    est = DPClustering(k=3, epsilon=1.0, delta=1e-6, inputCols=["x", "y"], estimateDomain="private",
                       domainEpsilonShare=0.3, seed=11, unsafeFixedSeed=True)
    model = est.fit(df)
    charges = model.summary.charges
    assert charges[0]["step"] == "domain estimate: octave histograms"
    assert math.isclose(sum(c["epsilon"] for c in charges[:2]), 0.3, rel_tol=1e-9)
    assert math.isclose(model.summary.epsilonSpent, 1.0, rel_tol=1e-9)
    assert "private estimate" in model.summary.parameters["domain"]
    assert model.transform(df).select("prediction").distinct().count() >= 2
    with pytest.raises(ValueError, match="estimateDomain"):
        DPClustering(k=3, inputCols=["x", "y"]).toConfig()
