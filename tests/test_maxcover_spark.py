"""Spark tests of the maxcover family: the passes, the estimator, the CLI.

All noise comes from SeededNoise / fixed ``seed`` configs (testing aids, NOT
private) so every run is reproducible. Data sizes are small (a few thousand
points, k <= 5) to keep the file fast.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from dpspark.config import load_config
from dpspark.errors import ConfigError
from dpspark.maxcover import candidates as cand_mod
from dpspark.maxcover import core
from dpspark.maxcover.candidates import stability_threshold
from dpspark.maxcover.estimator import CHOICE_LABEL, MaxCover
from dpspark.maxcover.params import budget_split
from dpspark.maxcover.passes import PassCounter, SparkCoverage, snap_counts
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import SeededNoise

DELTA = 1e-6
COLUMNS = ["_u0", "_u1"]
BOX = Domain(dim=2, lower=(0.0, 0.0), upper=(100.0, 100.0))
BLOB_CENTERS = np.array([[20.0, 20.0], [80.0, 30.0], [50.0, 80.0], [20.0, 70.0]])


def clustered_unit(rng, n, dim=2, n_clusters=3, spread=0.12):
    centres = rng.uniform(-0.7, 0.7, size=(n_clusters, dim))
    labels = rng.integers(0, n_clusters, size=n)
    return np.clip(centres[labels] + rng.normal(0.0, spread, size=(n, dim)), -1.0, 1.0)


def unit_df(spark, x, partitions):
    pdf = pd.DataFrame(x, columns=[f"_u{j}" for j in range(x.shape[1])])
    return spark.createDataFrame(pdf).repartition(partitions).cache()


def blob_points(n_per=750, seed=3, scale=4.0):
    r = np.random.default_rng(seed)
    return np.concatenate([c + r.normal(0.0, scale, size=(n_per, 2)) for c in BLOB_CENTERS])


def passes_of(provider):
    """Data passes a coverage loop made: one per threshold, but none for a threshold every point of
    which was covered already or whose histogram came from a group's pass."""
    return len(provider.histogram_sizes) - len(provider.skipped) - len(provider.grouped)


def recorded_coverage(provider, n_cand, ts, m, seed):
    """(picks, per threshold its histogram as ``as_histogram`` or None when spilled) of one seeded loop."""
    seen = []

    def recording(i, covered):
        out = provider(i, covered)
        seen.append(None if isinstance(out, core.PerPickScores) else as_histogram(*out, n_cand))
        return out

    picks = core.run_coverage(recording, n_cand, ts, m, Accountant(1.0, DELTA, SeededNoise(seed)), 1.0, DELTA)
    return picks, seen


def as_histogram(signatures, counts, n_cand):
    """{frozenset of candidate ids: count} from a list of tuples or a sparse incidence matrix."""
    inc = core.signatures_to_csr(signatures, n_cand)
    out: dict = {}
    for row, c in enumerate(np.asarray(counts, dtype=np.int64)):
        key = frozenset(inc.indices[inc.indptr[row] : inc.indptr[row + 1]].tolist())
        out[key] = out.get(key, 0) + int(c)
    return out


# ----------------------------------------------------------------------------
# The passes against the numpy reference


@pytest.mark.parametrize("partitions", [1, 3])
def test_signature_histogram_equals_numpy(spark, partitions):
    rng = np.random.default_rng(7)
    x = clustered_unit(rng, 1500)
    cand = rng.uniform(-1, 1, size=(37, 2))
    for p in (1, 2):
        ts = core.thresholds(2 * math.sqrt(2), p, cand.shape[0], 0.5)
        ref = core.NumpySignatureProvider(x, cand, ts, p)
        df = unit_df(spark, x, partitions)
        sc = SparkCoverage(df, COLUMNS, cand, ts, p, max_signatures=10**6)
        earlier = tuple((int(c), int(j)) for c, j in zip(rng.integers(0, 37, 6), rng.integers(0, 3, 6)))
        for i, covered in ((4, ()), (ts.size // 2 + 1, earlier)):
            want = as_histogram(*ref(i, covered), cand.shape[0])
            got = as_histogram(*sc(i, covered), cand.shape[0])
            assert got == want and sum(want.values()) > 0
        assert sc.counter.passes == 2
        df.unpersist()


@pytest.mark.parametrize("p", [1, 2])
def test_spark_coverage_picks_identical_to_numpy_core(spark, p):
    rng = np.random.default_rng(11 + p)
    x = clustered_unit(rng, 2000)
    cand = rng.uniform(-1, 1, size=(60, 2))
    ts = core.thresholds(2 * math.sqrt(2), p, cand.shape[0], 0.7)
    m = core.picks_per_threshold(3, 0.7)
    df = unit_df(spark, x, 3)

    def run(provider):
        acc = Accountant(1.0, DELTA, SeededNoise(2024))
        return core.run_coverage(provider, cand.shape[0], ts, m, acc, 0.5, DELTA)

    counter = PassCounter()
    provider = SparkCoverage(df, COLUMNS, cand, ts, p, 10**6, counter)
    spark_picks = run(provider)
    numpy_picks = run(core.NumpySignatureProvider(x, cand, ts, p))
    assert spark_picks == numpy_picks
    # one pass per threshold, but none once the picks cover every point (the largest thresholds here)
    skipped = provider.skipped
    assert skipped == list(range(ts.size - len(skipped), ts.size))
    assert counter.passes == passes_of(provider) < ts.size
    chosen = cand[core.chosen_candidate_ids(spark_picks)]
    assert np.array_equal(snap_counts(df, COLUMNS, chosen), core.snap_counts(x, chosen, p))
    df.unpersist()


def test_a_threshold_goes_without_a_pass_only_when_the_last_histogram_shows_every_point_covered():
    """The rule of ``SparkCoverage._all_covered``: from the last histogram (threshold i - 1) and that
    threshold's picks, every point must be covered; an empty signature, a row holding no pick, picks
    that do not continue the last pass's, or another threshold keep the pass."""
    from dpspark.maxcover.passes import _packed_to_csr

    cand = np.array([[0.0, 0.0], [0.5, 0.5], [-0.5, -0.5]])
    provider = SparkCoverage(None, COLUMNS, cand, [0.1, 0.2, 0.4], 2, 100)
    incidence = _packed_to_csr(np.packbits(np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0]], dtype=bool), axis=1), 3)
    counts = np.array([5, 2, 1], dtype=np.int64)

    def covered(state, i, picks):
        provider._last_hist = state
        return provider._all_covered(i, picks)

    full = (0, (), incidence, counts, 0)
    assert covered(full, 1, ((0, 0), (1, 0)))  # every row holds candidate 0 or 1
    assert covered(full, 1, ((1, 0), (0, 0), (1, 0)))
    assert not covered(full, 1, ((0, 0),))  # the 2 points of row [0, 1, 0] are left
    assert not covered(full, 1, ((0, 0), (2, 0)))
    assert not covered(full, 2, ((0, 0), (1, 0)))  # the last pass was not threshold 1
    assert not covered(full, 1, ((0, 0), (1, 5)))  # a pick of another threshold
    assert not covered((0, 0, incidence, counts, 3), 1, ((0, 0), (1, 0)))  # 3 points with an empty signature
    assert not covered((0, ((2, 0),), incidence, counts, 0), 1, ((0, 0), (1, 0)))  # not a continuation
    assert covered((0, ((2, 0),), incidence, counts, 0), 1, ((2, 0), (0, 0), (1, 0)))
    assert not covered(None, 1, ((0, 0), (1, 0)))  # no histogram on the driver (first pass, or spilled)


@pytest.mark.parametrize("p", [1, 2])
def test_thresholds_without_a_pass_are_those_after_every_point_is_covered(spark, p):
    """Outliers far from every candidate (a corner, a duplicate of it) stay uncovered until the largest
    thresholds: no pass is dropped while any point is uncovered, the picks are numpy's bit for bit,
    and the thresholds that had no pass are exactly those whose points were all covered before."""
    rng = np.random.default_rng(40 + p)
    x = np.concatenate([clustered_unit(rng, 1500, spread=0.05), [[1.0, 1.0], [1.0, 1.0], [-1.0, 0.98]]])
    cand = rng.uniform(-0.4, 0.4, size=(40, 2))
    ts = core.thresholds(2 * math.sqrt(2), p, cand.shape[0], 0.5)
    m = core.picks_per_threshold(4, 0.5)
    df = unit_df(spark, x, 3)

    def run(provider):
        return core.run_coverage(provider, cand.shape[0], ts, m, Accountant(1.0, DELTA, SeededNoise(77)), 0.5, DELTA)

    counter = PassCounter()
    provider = SparkCoverage(df, COLUMNS, cand, ts, p, 10**6, counter)
    picks = run(provider)
    assert picks == run(core.NumpySignatureProvider(x, cand, ts, p))
    from dpspark.maxcover.kernels import cost_within

    uncovered_before = []  # points no pick of an earlier threshold covers, by the rule itself
    for i in range(ts.size):
        covered = np.zeros(x.shape[0], dtype=bool)
        for c, j in picks:
            if j < i:
                covered |= cost_within(x, cand[[c]], ts[j], p)[:, 0]
        uncovered_before.append(int((~covered).sum()))
    first_all_covered = next(i for i in range(1, ts.size) if uncovered_before[i] == 0)
    assert uncovered_before[first_all_covered - 1] > 0
    assert provider.skipped == list(range(first_all_covered, ts.size))
    assert counter.passes == passes_of(provider)
    provider.close()
    df.unpersist()


def test_the_snap_pass_in_many_dimensions_gives_the_per_entry_labels(spark):
    """From 4 dimensions the snap pass screens with a BLAS product: its counts are the numpy rule's
    (per-entry distances, ties to the lowest index) with duplicated centers, points on a center,
    points equidistant from two centers and the domain's corners."""
    rng = np.random.default_rng(6)
    dim = 6
    centers = rng.uniform(-0.8, 0.8, size=(30, dim))
    centers[7] = centers[3]  # a duplicated center: its points go to index 3
    mid = (centers[0] + centers[1]) / 2.0
    x = np.concatenate([clustered_unit(rng, 3000, dim=dim), centers[:10], np.repeat(mid[None, :], 5, axis=0),
                        np.ones((3, dim)), -np.ones((2, dim))])
    df = unit_df(spark, x, 3)
    cols = [f"_u{j}" for j in range(dim)]
    got = snap_counts(df, cols, centers)
    assert np.array_equal(got, core.snap_counts(x, centers, 2)) and got.sum() == x.shape[0] and got[7] == 0
    df.unpersist()


@pytest.mark.parametrize("first, most, max_signatures", [(1, 1, 10**6), (4, 8, 10**6), (8, 8, 10**6), (3, 3, 40)])
def test_a_groups_pass_gives_every_threshold_the_histogram_of_its_own_pass(spark, monkeypatch, first, most,
                                                                          max_signatures):
    """One pass may read several thresholds (``GROUP_MAX``; the first ``FIRST_GROUP``): every threshold
    gets the histogram its own pass would collect, the picks are numpy's bit for bit, hostile rows
    (NaN, +-inf, 1e308, duplicates) included; a group too large for the driver (``max_signatures``
    40) gives its first threshold the projection of its own histogram (one job over it, no pass),
    which may itself stay on the executors; fewer passes than thresholds when groups form."""
    from dpspark.maxcover import passes

    rng = np.random.default_rng(12)
    x = clustered_unit(rng, 2500, spread=0.08)
    x[:30] = x[30]  # duplicates of one row
    cand = rng.uniform(-0.8, 0.8, size=(48, 2))
    ts = core.thresholds(2 * math.sqrt(2), 2, cand.shape[0], 0.5)
    m = core.picks_per_threshold(4, 0.5)
    hostile = np.array([[np.nan, 0.1], [np.inf, -np.inf], [1e308, -1e308], [1.0, 1.0]])
    df = unit_df(spark, np.vstack([x, hostile]), 3)
    x_clean = np.vstack([x, [[0.0, 0.1], [1.0, -1.0], [1.0, -1.0], [1.0, 1.0]]])  # as the passes read them

    def run(first_group, group_max, limit):
        monkeypatch.setattr(passes, "FIRST_GROUP", first_group)
        monkeypatch.setattr(passes, "GROUP_MAX", group_max)
        counter = PassCounter()
        provider = SparkCoverage(df, COLUMNS, cand, ts, 2, limit, counter)
        steps = []
        real_step = passes.step

        def counting_step(name, *args, **kwargs):
            steps.append((name, kwargs.get("data_dependent", False)))
            return real_step(name, *args, **kwargs)

        monkeypatch.setattr(passes, "step", counting_step)
        picks, seen = recorded_coverage(provider, cand.shape[0], ts, m, 5)
        provider.close()
        # the analyst's log: one step per threshold, whatever ran inside (a pass, a group's, none)
        shown = [name for name, hidden in steps if not hidden]
        assert shown == [provider._pass_name(i) for i in range(ts.size)]
        return picks, seen, provider, counter

    ref_picks, ref_seen, ref_provider, _ = run(1, 1, 10**6)
    assert not ref_provider.grouped and not ref_provider.regrouped
    assert ref_picks == core.run_coverage(core.NumpySignatureProvider(x_clean, cand, ts, 2), cand.shape[0], ts, m,
                                          Accountant(1.0, DELTA, SeededNoise(5)), 1.0, DELTA)
    picks, seen, provider, counter = run(first, most, max_signatures)
    assert picks == ref_picks
    assert [h for h in seen if h is not None] and all(h == r for h, r in zip(seen, ref_seen) if h is not None)
    assert counter.passes == passes_of(provider)
    if most > 1 and max_signatures > 100:
        assert provider.grouped and counter.passes < passes_of(ref_provider)
    if max_signatures == 40:
        assert provider.regrouped and provider.fallback_thresholds  # both ways of not holding a histogram
        assert counter.by_kind["group histogram, first threshold"] == len(provider.regrouped)
    df.unpersist()


def test_shrinking_the_persisted_set_changes_no_histogram(spark, monkeypatch):
    """Later thresholds read a re-persisted set of the uncovered points only: the histograms and the
    picks are those of passes over all points, and the data is still read once per threshold."""
    from dpspark.maxcover import passes

    rng = np.random.default_rng(8)
    x = clustered_unit(rng, 3000, dim=3)
    cand = rng.uniform(-1, 1, size=(50, 3))
    ts = core.thresholds(2 * math.sqrt(3), 2, cand.shape[0], 0.5)
    m = core.picks_per_threshold(4, 0.5)
    df = unit_df(spark, x, 3)
    columns = ["_u0", "_u1", "_u2"]

    def run(fraction, max_signatures=10**6):
        monkeypatch.setattr(passes, "SHRINK_FRACTION", fraction)
        counter = PassCounter()
        provider = SparkCoverage(df, columns, cand, ts, 2, max_signatures, counter)
        picks, seen = recorded_coverage(provider, cand.shape[0], ts, m, 7)
        shrinks, owned = list(provider.shrinks), len(provider._owned)
        provider.close()
        assert not provider._owned and provider._spilled is None
        run.expected = passes_of(provider)
        return picks, seen, shrinks, owned, counter

    ref_picks, ref_seen, ref_shrinks, _, ref_counter = run(-1.0)  # never shrinks
    ref_expected = run.expected
    picks, seen, shrinks, owned, counter = run(0.5)
    assert not ref_shrinks and shrinks  # the default does shrink on this data
    assert owned == 1  # only the newest smaller set stays persisted during the loop
    assert picks == ref_picks and seen == ref_seen
    assert ref_counter.passes == ref_expected and counter.passes == run.expected
    # spilled thresholds learn the uncovered count from their first job: same picks again
    sizes = sorted(len(h) for h in ref_seen)
    spilled_picks, _, spilled_shrinks, _, spilled_counter = run(0.5, max_signatures=sizes[len(sizes) * 3 // 4])
    assert spilled_picks == ref_picks and spilled_shrinks and spilled_counter.histogram_jobs > 0
    df.unpersist()


def test_spilled_histograms_give_the_same_picks_without_extra_data_passes(spark):
    """A threshold whose histogram exceeds max_signatures keeps it on the executors: the picks are
    those of the collected histograms, the data is still read once per threshold, and each pick of
    such a threshold is one job over the histogram."""
    rng = np.random.default_rng(5)
    x = clustered_unit(rng, 1200, n_clusters=2)
    cand = rng.uniform(-1, 1, size=(14, 2))
    ts = core.thresholds(2 * math.sqrt(2), 2, cand.shape[0], 0.7)
    m = core.picks_per_threshold(3, 0.7)
    df = unit_df(spark, x, 2)

    def run(max_signatures):
        counter = PassCounter()
        provider = SparkCoverage(df, COLUMNS, cand, ts, 2, max_signatures, counter)
        acc = Accountant(2.0, DELTA, SeededNoise(99))
        picks = core.run_coverage(provider, cand.shape[0], ts, m, acc, 2.0, DELTA)
        provider.close()
        return picks, provider, counter

    ref_picks, ref_provider, ref_counter = run(10**6)
    sizes = list(ref_provider.histogram_sizes)
    bound = sorted(sizes)[len(sizes) // 2]  # some thresholds spill, some do not
    picks, provider, counter = run(bound)
    assert picks == ref_picks
    spilled = provider.fallback_thresholds
    assert spilled and len(spilled) < ts.size
    assert spilled == [i for i, s in enumerate(sizes) if s > bound]
    # the data: once per threshold, either way, but for thresholds after every point was covered
    assert counter.passes == passes_of(provider)
    assert ref_counter.passes == passes_of(ref_provider)
    # each pick of a spilled threshold: one job over its histogram; a group too large for the driver:
    # one job to take its first threshold's histogram from the group's
    assert counter.histogram_jobs == len(spilled) * min(m, cand.shape[0]) + len(provider.regrouped)
    assert ref_counter.histogram_jobs == 0
    # max_signatures tiny: (nearly) every threshold spills, still the same picks, still r passes.
    picks_all, provider_all, counter_all = run(1)
    assert picks_all == ref_picks
    assert len(provider_all.fallback_thresholds) == sum(s > 1 for s in sizes)
    assert counter_all.passes == passes_of(provider_all)
    assert provider_all._spilled is None  # close() released the last persisted histogram
    df.unpersist()


@pytest.mark.parametrize("first, most", [(1, 1), (4, 8)])
def test_histograms_with_more_pairs_than_max_pairs_stay_on_the_executors(spark, monkeypatch, first, most):
    """``max_pairs`` bounds the (signature, candidate) pairs the driver's incidence holds, as
    ``max_signatures`` bounds its rows: a threshold whose histogram has more pairs keeps it on the
    executors (one job per pick over it, no pass), every collected histogram has at most that many
    pairs (a group's later thresholds included), the pair counts recorded are the histograms' own,
    and the picks are those of the uncapped run, hostile rows included."""
    from dpspark.maxcover import passes

    rng = np.random.default_rng(21)
    x = clustered_unit(rng, 2000, spread=0.1)
    x[:20] = x[20]
    cand = rng.uniform(-0.9, 0.9, size=(40, 2))
    ts = core.thresholds(2 * math.sqrt(2), 2, cand.shape[0], 0.5, n_upper=20_000)  # many thresholds with points
    m = core.picks_per_threshold(4, 0.5)
    df = unit_df(spark, np.vstack([x, [[np.nan, 0.2], [np.inf, 1e308]]]), 3)

    def run(max_pairs, first_group, group_max):
        monkeypatch.setattr(passes, "FIRST_GROUP", first_group)
        monkeypatch.setattr(passes, "GROUP_MAX", group_max)
        counter = PassCounter()
        provider = SparkCoverage(df, COLUMNS, cand, ts, 2, 10**6, counter, max_pairs=max_pairs)
        picks, seen = recorded_coverage(provider, cand.shape[0], ts, m, 3)
        provider.close()
        return picks, seen, provider, counter

    ref_picks, ref_seen, ref, _ = run(10**9, 1, 1)
    pairs = [sum(len(key) for key in h) for h in ref_seen]
    assert ref.histogram_pairs == pairs and not ref.pair_spills
    bound = sorted(p for p in pairs if p)[len([p for p in pairs if p]) // 2]  # some thresholds over it, some not
    picks, seen, provider, counter = run(bound, first, most)
    assert picks == ref_picks
    over = [i for i, p in enumerate(pairs) if p > bound]
    assert over and provider.pair_spills == over and provider.fallback_thresholds == over
    assert all(h is None for i, h in enumerate(seen) if i in over)
    kept = [(h, r) for h, r in zip(seen, ref_seen) if h is not None]
    assert kept and all(h == r and sum(len(key) for key in h) <= bound for h, r in kept)
    assert [p for p in provider.histogram_pairs if p >= 0] == [sum(len(key) for key in h) for h, _ in kept]
    assert counter.passes == passes_of(provider)
    assert counter.histogram_jobs == len(over) * min(m, cand.shape[0]) + counter.by_kind.get(
        "group histogram, first threshold", 0)
    if most > 1:
        assert provider.grouped  # groups still form under the bound
    df.unpersist()


# ----------------------------------------------------------------------------
# Privacy bookkeeping


def test_stability_threshold_meets_delta():
    for eps in (0.01, 0.1, 1.0, 3.0):
        for delta in (1e-9, 1e-6, 1e-3):
            t = stability_threshold(eps, delta)
            tail = lambda m: math.exp(-eps * m) / (1 + math.exp(-eps))  # noqa: E731  P[Z >= m], Z ~ DLap(1/eps)
            assert tail(t - 1) <= delta
            assert t == 2 or tail(t - 2) > delta  # smallest such T
            for c in (2, 5):
                tc = stability_threshold(eps, delta, min_count=c)
                assert tc == t + c - 1
                assert tail(tc - c) <= delta and tail(tc - c - 1) > delta or tc == c + 1  # P[c + Z >= T_c] <= delta
    with pytest.raises(ValueError, match="min_count=0"):
        stability_threshold(1.0, 1e-6, min_count=0)


def test_cell_aggregates_drop_cells_below_min_count_on_executors(spark):
    from dpspark.maxcover import passes

    r = np.random.default_rng(5)
    pts = np.vstack([r.uniform(-1, 1, size=(300, 2)), np.full((40, 2), 0.3)])  # scattered + one heavy cell
    df = spark.createDataFrame(pd.DataFrame(pts, columns=["u0", "u1"])).repartition(3)
    sides, shifts = [0.5, 0.05], [np.zeros(2), np.full(2, 0.01)]
    full = passes.cell_aggregates(df, ["u0", "u1"], sides, shifts)
    kept = passes.cell_aggregates(df, ["u0", "u1"], sides, shifts, min_count=2)
    assert (full[1][1] == 1).sum() > 100  # the fine scale is mostly singletons
    assert len(kept[1][1]) < len(full[1][1]) - 100
    for (g, n, s), (gk, nk, sk) in zip(full, kept):
        sel = n >= 2
        np.testing.assert_array_equal(gk, g[sel])
        np.testing.assert_array_equal(nk, n[sel])
        np.testing.assert_array_equal(sk, s[sel])
        assert n.sum() == 340


@pytest.mark.parametrize("dim", [2, 5, 12])
def test_hash_first_cell_aggregates_equal_the_direct_pass_bit_for_bit(spark, dim):
    """The hash-first candidate pass releases exactly what the direct pass (the plain rule) does.

    Hostile rows go through the same prepare_points a fit uses (NaN, +-1e308, +-inf, exact
    duplicates, a point on the box's edge); hash_bits=3 forces collisions between thousands of
    cells, which must still be aggregated and filtered by their own coordinates and counts. d = 2:
    the direct pass; d = 5: hash-first, cells merged by packed keys; d = 12: the fine scales' cells
    do not pack into 62 bits, so the executors merge them by hash (checked against coordinates).
    """
    from dpspark import tables
    from dpspark.maxcover import kernels, passes
    from dpspark.maxcover.candidates import scale_sides

    r = np.random.default_rng(11 + dim)
    x = np.clip(r.normal(0.0, 3.0, size=(1200, dim)), -10, 10)
    x[:60] = x[60:120]  # duplicates: cells of two or more points at every scale
    x[120:180] = 2.5  # one heavy cell
    hostile = np.array([[np.nan] * dim, [1e308] * dim, [-np.inf] * dim, [10.0] * dim, [-10.0] * dim])
    x = np.vstack([x, hostile, hostile])
    dom = Domain(dim=dim, lower=(-10.0,) * dim, upper=(10.0,) * dim)
    names = [f"x{j}" for j in range(dim)]
    raw = spark.createDataFrame(pd.DataFrame(x, columns=names)).repartition(3)
    df, _ = tables.prepare_points(raw, tuple(names), None, dom, "k")
    cols = tables.unit_columns(dim)
    sides = scale_sides(5)
    rng = np.random.default_rng(dim)
    shifts = [rng.uniform(0.0, s, size=dim) for s in sides]
    assert (kernels._cell_key_layout(sides[-1], shifts[-1]) is None) == (dim == 12)

    direct_all = passes.cell_aggregates(df, cols, sides, shifts, min_count=1, method="direct")
    kept_rows = x.shape[0] - 4  # prepare_points drops the NaN and -inf rows; 1e308 is clipped onto the box
    assert df.count() == kept_rows and all(int(n.sum()) == kept_rows for _, n, _ in direct_all)
    for min_count in (1, 2, 3):
        counter = PassCounter()
        direct = passes.cell_aggregates(df, cols, sides, shifts, min_count=min_count, method="direct")
        hashed = passes.cell_aggregates(df, cols, sides, shifts, min_count=min_count, method="hash", counter=counter)
        colliding = passes.cell_aggregates(df, cols, sides, shifts, min_count=min_count, method="hash", hash_bits=3)
        assert counter.by_kind == {"candidate cell hashes": 1, "candidate cells": 1}
        for level, ((g, n, s), (gh, nh, sh), (gc, nc, sc), (ga, na, sa)) in enumerate(
                zip(direct, hashed, colliding, direct_all)):
            sel = na >= min_count  # the plain rule: every cell with an exact count >= min_count, nothing else
            for got in ((g, n, s), (gh, nh, sh), (gc, nc, sc)):
                np.testing.assert_array_equal(got[0], ga[sel])
                np.testing.assert_array_equal(got[1], na[sel])
                np.testing.assert_array_equal(got[2], sa[sel])
                assert got[0].dtype == got[1].dtype == got[2].dtype == np.int64
        if min_count == 2:
            assert sum(int((n == 1).sum()) for _, n, _ in direct_all) > 100  # singletons were dropped
            assert sum(len(n) for _, n, _ in direct) > 0
    auto = PassCounter()
    passes.cell_aggregates(df, cols, sides, shifts, min_count=2, counter=auto)
    assert auto.passes == (2 if dim >= passes.HASH_FIRST_MIN_DIM else 1)
    with pytest.raises(ValueError, match="method='grid'"):
        passes.cell_aggregates(df, cols, sides, shifts, method="grid")


def test_hash_first_pass_skips_its_second_stage_when_no_cell_repeats(spark):
    from dpspark.maxcover import passes

    x = np.random.default_rng(4).uniform(-1, 1, size=(300, 6))  # 6-d, fine cells: every point alone
    df = spark.createDataFrame(pd.DataFrame(x, columns=[f"_u{j}" for j in range(6)])).repartition(2)
    counter = PassCounter()
    out = passes.cell_aggregates(df, [f"_u{j}" for j in range(6)], [0.01], [np.zeros(6)], min_count=2, counter=counter)
    assert counter.by_kind == {"candidate cell hashes": 1}
    assert len(out) == 1 and out[0][0].shape == (0, 6) and out[0][1].shape == (0,) and out[0][2].shape == (0, 6)


@pytest.fixture(scope="module")
def blob_df(spark):
    pdf = pd.DataFrame(blob_points(), columns=["x", "y"])
    df = spark.createDataFrame(pdf).repartition(3).cache()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def candidate_table(spark, tmp_path_factory):
    r = np.random.default_rng(8)
    rows = np.round(r.uniform(0, 100, size=(60, 2)), 3)
    rows = np.vstack([rows, BLOB_CENTERS + 1.5])  # a few good candidates, still a public table
    path = str(tmp_path_factory.mktemp("cand") / "candidates")
    spark.createDataFrame(pd.DataFrame(rows, columns=["x", "y"])).repartition(2).write.format("delta").save(path)
    return path, rows


@pytest.mark.parametrize("mode", ["grid", "random", "private", "table", "tree", "grid_or_private"])
def test_total_charge_equals_epsilon_and_delta(blob_df, candidate_table, mode):
    extra = {"candidate_table": candidate_table[0]} if mode == "table" else {}
    est = MaxCover(k=4, epsilon=3.0, delta=DELTA, domain=BOX, objective="kmedian", candidates=mode,
                   candidate_count=64, coverage_approx=0.8, seed=17, **extra)
    assert est.privacy_plan() == (3.0, DELTA)
    operational = {}
    model = est.fit(blob_df, operational=operational)
    eps = math.fsum(c["epsilon"] for c in model.charges)
    delta = math.fsum(c["delta"] for c in model.charges)
    assert abs(eps - 3.0) <= 1e-9 and abs(delta - DELTA) <= 1e-9 * DELTA
    assert abs(model.epsilon_spent - 3.0) <= 1e-9 and abs(model.delta_spent - DELTA) <= 1e-15
    steps = [c["step"] for c in model.charges]
    assert steps.count(core.COVERAGE_LABEL) == 1 and steps.count(core.SNAP_LABEL) == 1
    cov = next(c for c in model.charges if c["step"] == core.COVERAGE_LABEL)
    if mode == "private":
        assert len(steps) == 2 + 5  # five scales
        assert math.isclose(cov["epsilon"], 0.3 * 3.0) and math.isclose(cov["delta"], DELTA / 2)
    elif mode == "tree":  # root count, the levels walked, the leaf sums: (0.4 * 3, 0); the coverage gets all of delta
        tree_charges = [c for c in model.charges if c["step"].startswith(cand_mod.TREE_LABEL)]
        assert len(tree_charges) >= 3 and len(steps) == 2 + len(tree_charges)
        assert math.isclose(math.fsum(c["epsilon"] for c in tree_charges), 0.4 * 3.0) and all(c["delta"] == 0 for c in tree_charges)
        assert math.isclose(cov["epsilon"], 0.3 * 3.0) and cov["delta"] == DELTA
    elif mode == "grid_or_private":  # the row count (0.02 * 3) chose the grid (n eps / k far below 5000),
        # whose coarse histogram (0.1 * 3) places half of it
        choice = next(c for c in model.charges if c["step"] == CHOICE_LABEL)
        zoom = next(c for c in model.charges if c["step"] == cand_mod.ZOOM_LABEL)
        assert len(steps) == 4 and math.isclose(choice["epsilon"], 0.06) and choice["delta"] == 0
        assert math.isclose(zoom["epsilon"], 0.3) and zoom["delta"] == 0
        assert model.info["candidate_choice"]["chosen"] == "grid" and model.parameters["candidates"] == "grid"
        assert math.isclose(cov["epsilon"], 0.5 * (3.0 - 0.06 - 0.3)) and cov["delta"] == DELTA
        assert operational["passes_by_kind"]["count"] == 1
    else:
        assert len(steps) == 2
        assert math.isclose(cov["epsilon"], 1.5) and cov["delta"] == DELTA
    info = model.info
    r = info["thresholds"]
    assert r == core.thresholds(BOX.unit_diameter, 1, info["candidate_count"], 0.8).size
    # Pass counts depend on the data: NON-PRIVATE operational metadata, never on the model.
    assert "spark_passes" not in info and "histogram_sizes" not in info
    assert operational["spark_passes"] <= r + 1 + (1 if mode in ("private", "tree", "grid_or_private") else 0)
    if mode == "tree":
        assert operational["passes_by_kind"]["tree"] == 1
    assert model.centers.shape == (4, 2)
    # The clusters are found: every blob center has a released center nearby (64 random
    # candidates in a 100 x 100 box are about 12 units apart, so that mode gets more slack).
    d = np.sqrt(((BLOB_CENTERS[:, None, :] - model.centers[None, :, :]) ** 2).sum(axis=2)).min(axis=1)
    assert np.all(d < (16.0 if mode == "random" else 8.0)), (mode, model.centers)


def test_discrete_setting_returns_candidate_rows_only(blob_df, candidate_table):
    path, rows = candidate_table
    model = MaxCover(k=4, epsilon=2.0, delta=DELTA, domain=BOX, objective="kmedian", candidates="table",
                     candidate_table=path, solver="local_search", seed=5).fit(blob_df)
    assert model.parameters["solver"] == "local_search"
    table_rows = {tuple(r) for r in rows.tolist()}
    for c in model.centers.tolist():
        assert tuple(c) in table_rows


# ----------------------------------------------------------------------------
# Config


def _config(tmp_path, data_path, **algorithm):
    cfg = {
        "input": {"path": data_path, "format": "delta", "features": ["x", "y"]},
        "domain": {"lower": [0.0, 0.0], "upper": [100.0, 100.0]},
        "privacy": {"epsilon": 2.0, "delta": 1e-6},
        "algorithm": {"name": "maxcover", "objective": "kmeans", "k": 4, **algorithm},
        "output": {"path": str(tmp_path / "out"), "report": False},
        "seed": 7,
        "unsafe_fixed_seed": True,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_config_validation(tmp_path):
    cfg = _config(tmp_path, "data/none")
    params = load_config(cfg).algorithm.params  # d = 2: the count chooses, the chosen mode's split (not configurable)
    assert (params.candidates, params.solver, params.eps_candidates, params.eps_coverage, params.eps_counts) == ("grid_or_private", "weighted_kmeans", 0.0, 0.0, 0.0)
    params = load_config(cfg, ["algorithm.candidates=private"]).algorithm.params
    assert (params.candidates, params.solver, params.eps_candidates, params.eps_coverage, params.eps_counts) == ("private", "weighted_kmeans", 0.4, 0.3, 0.3)
    params = load_config(cfg, ["algorithm.objective=kmedian", "algorithm.candidates=grid"]).algorithm.params
    assert (params.solver, params.eps_candidates, params.eps_coverage, params.delta_candidates) == ("weiszfeld", 0.0, 0.5, 0.0)
    params = load_config(cfg, ["algorithm.objective=kmedian", "algorithm.candidates=table", "algorithm.candidate_table=t"]).algorithm.params
    assert params.solver == "local_search"
    params = load_config(cfg, ["algorithm.candidates=private", "algorithm.eps_split=0.1,0.6,0.3"]).algorithm.params
    assert (params.eps_candidates, params.eps_coverage, params.eps_counts) == (0.1, 0.6, 0.3)
    params = load_config(cfg, ["algorithm.candidates=tree"]).algorithm.params  # charged epsilon, no delta
    assert (params.eps_candidates, params.eps_coverage, params.eps_counts, params.delta_candidates) == (0.4, 0.3, 0.3, 0.0)
    # k-means on tree candidates: the last Lloyd step takes 0.5 of epsilon, the split divides the rest
    assert params.lloyd_share == 0.5
    assert budget_split(2.0, 1e-6, params) == {"candidates": (0.4, 0.0), "coverage": (1.0 - 0.4 - 0.3, 1e-6), "counts": (0.3, 0.0),
                                               "lloyd": (1.0, 0.0)}
    with pytest.raises(ConfigError, match="candidates=tree spends no delta") as err:
        load_config(cfg, ["algorithm.candidates=tree", "algorithm.delta_candidates=0.3"])
    assert err.value.key == "algorithm.delta_candidates"
    bad = {
        "privacy.delta=0": "privacy.delta",
        "algorithm.candidates=table": "algorithm.candidate_table",
        "algorithm.eps_split=0.2,0.2,0.2": "algorithm.eps_split",
        "algorithm.eps_coverage=0.5": "algorithm.eps_candidates",
        "algorithm.solver=weiszfeld": "algorithm.solver",
        "algorithm.coverage_approx=1.5": "algorithm.coverage_approx",
        "algorithm.bogus=1": "algorithm.bogus",
        "privacy.epsilon=1000": "algorithm.eps_coverage",
    }
    for override, key in bad.items():
        with pytest.raises(ConfigError) as err:
            load_config(cfg, ["algorithm.candidates=private", override])
        assert err.value.key == key, override


# ----------------------------------------------------------------------------
# End to end through the command line


@pytest.mark.parametrize("objective,overrides", [
    ("kmeans", []),
    ("kmedian", ["algorithm.candidates=grid", "algorithm.candidate_count=64", "algorithm.coverage_approx=0.8"]),
])
def test_cli_end_to_end(spark, write_delta, tmp_path, objective, overrides, monkeypatch):
    from dpspark.cli import main
    from dpspark.runner import read_operator_record

    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))

    data = write_delta(pd.DataFrame(blob_points(seed=11), columns=["x", "y"]), partitions=3)
    cfg = _config(tmp_path, data)
    rc = main(["run", "--config", cfg, "--set", f"algorithm.objective={objective}", *sum((["--set", o] for o in overrides), []),
               "--run-id", f"mc-{objective}"], spark=spark)
    assert rc == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["algorithm"] == "maxcover" and summary["objective"] == objective
    assert len(summary["centers"]) == 4 and all(len(c) == 2 for c in summary["centers"])
    assert math.isclose(summary["epsilon_spent"], 2.0, rel_tol=1e-9) and math.isclose(summary["delta_spent"], 1e-6, rel_tol=1e-9)
    # Pass counts and wall times depend on the data: in the operator log ($DPSPARK_OPERATOR_LOG) only.
    assert "timings" not in summary and "spark_passes" not in json.dumps(summary)
    run = spark.read.format("delta").load(str(tmp_path / "out" / "runs")).first()
    assert run.non_private_operational is None
    record = read_operator_record(spark, f"mc-{objective}", 1)
    assert "spark_passes" in record["operational"] and "maxcover: fit" in record["timings"]
    assert os.path.isdir(tmp_path / "out" / "centers")


def test_cli_refuses_zero_delta_before_spark(tmp_path):
    from dpspark.cli import main

    cfg = _config(tmp_path, "data/none")
    assert main(["run", "--config", cfg, "--set", "privacy.delta=0"]) == 2
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------
# The private candidate generator


def test_private_candidates_release_only_heavy_cells(spark):
    from dpspark.maxcover.candidates import PRIVATE_LABEL, private_candidates

    r = np.random.default_rng(4)
    x = np.vstack([0.3 + r.normal(0, 0.01, size=(400, 2)), r.uniform(-1, 1, size=(40, 2))])  # one heavy spot, sparse noise
    df = unit_df(spark, np.clip(x, -1, 1), 2)
    dom = Domain(dim=2, lower=(-1.0, -1.0), upper=(1.0, 1.0))

    acc = Accountant(2.0, DELTA, SeededNoise(3))
    cand, info = private_candidates(df, COLUMNS, dom, 50, 4, 2, 2.0, DELTA, acc, np.random.default_rng(0))
    assert info["padded_public_points"] == 0
    assert all(30 <= s["threshold"] <= 60 for s in info["scales"])  # above the sparse cells, below the spot
    # Every released candidate is a noisy mean of a heavy cell: near the heavy spot.
    assert cand.shape[0] >= 1 and np.all(np.abs(cand - 0.3).max(axis=1) < 0.1), cand
    charges = [c for c in acc.summary() if c["step"].startswith(PRIVATE_LABEL)]
    assert len(charges) == 4
    assert math.isclose(math.fsum(c["epsilon"] for c in charges), 2.0, rel_tol=1e-12)
    assert math.isclose(math.fsum(c["delta"] for c in charges), DELTA, rel_tol=1e-12)

    # A small budget: the threshold exceeds every count, nothing is released, public points pad to k.
    acc = Accountant(0.05, DELTA, SeededNoise(3))
    cand, info = private_candidates(df, COLUMNS, dom, 50, 4, 3, 0.05, DELTA, acc, np.random.default_rng(0))
    assert all(s["released_cells"] == 0 for s in info["scales"])
    assert info["padded_public_points"] == 3 and cand.shape == (3, 2)
    df.unpersist()


def test_spilled_histogram_scores_equal_brute_force(spark):
    """Every pick's scores from the spilled histogram (first: all rows; later: minus what the previous
    pick newly covered) equal the scores recomputed from scratch, and the brute-force counts on the
    points, with and without earlier thresholds' picks."""
    rng = np.random.default_rng(21)
    x = clustered_unit(rng, 1500, dim=3)
    cand = rng.uniform(-1, 1, size=(40, 3))
    df = unit_df(spark, x, 3)
    columns = ["_u0", "_u1", "_u2"]
    updated_nonzero = []
    for p in (1, 2):
        ts = core.thresholds(2 * math.sqrt(3), p, cand.shape[0], 0.5)
        costs = core.cost_matrix(x, cand, p)
        for i, covered in ((3, ()), (ts.size // 2, ((5, 1), (17, 2)))):
            uncovered = np.ones(x.shape[0], dtype=bool)
            for c, j in covered:
                uncovered &= costs[:, c] > ts[j]
            within = costs <= ts[i]
            incremental = SparkCoverage(df, columns, cand, ts, p, 1)
            assert isinstance(incremental(i, covered), core.PerPickScores)
            picks = []
            scores = []
            for _ in range(4):
                got = incremental.spilled_scores(i, tuple(picks))
                fresh = SparkCoverage(df, columns, cand, ts, p, 1)
                fresh(i, covered)
                want = fresh.spilled_scores(i, tuple(picks))
                fresh.close()
                alive = uncovered & ~np.any(within[:, picks], axis=1) if picks else uncovered
                brute = within[alive].sum(axis=0, dtype=np.int64)
                assert np.array_equal(got, want) and np.array_equal(got, brute)
                assert got.dtype == np.int64 and (not picks or np.all(got[picks] == 0))
                scores.append(got)
                picks.append(int(np.argmax(np.where(np.isin(np.arange(40), picks), -1, got))))
            kinds = {k: v for k, v in incremental.counter.by_kind.items() if k.startswith("spilled")}
            assert kinds == {"spilled histogram (scores)": 1, "spilled histogram (update)": 3}
            assert incremental.counter.passes == 1
            incremental.close()
            assert scores[0].sum() > scores[-1].sum()  # the picks did cover points
            updated_nonzero.append(scores[-1].sum() > 0)
    assert any(updated_nonzero)  # some updates left non-trivial scores (not just all zeros)
    df.unpersist()



# ----------------------------------------------------------------------------
# The driver's decoding of a collected histogram (issue 15, performance)


@pytest.mark.parametrize("n_cand", [1, 7, 8, 9, 37, 1000])
def test_packed_signatures_decode_to_the_reference_incidence(n_cand):
    """``_packed_to_csr`` (non-zero bytes only) gives the matrix of the bit-by-bit reference ``_keys_to_csr``,
    across its chunk boundaries, with empty rows, and ignoring set padding bits as ``unpackbits(count=|V|)`` does."""
    from dpspark.maxcover.passes import _keys_to_csr, _packed_to_csr, signature_pairs

    rng = np.random.default_rng(n_cand)
    bits = rng.random((301, n_cand)) < rng.choice([0.0, 0.01, 0.3], size=(301, 1))
    packed = np.packbits(bits, axis=1)
    if n_cand % 8:
        packed[::3, -1] |= np.uint8(0xFF >> (n_cand % 8))  # padding bits: not candidates
    want = _keys_to_csr([row.tobytes() for row in packed], n_cand)
    for chunk in (1, 7, 65_536):  # the pairs per row: the candidates it holds, padding not counted
        assert np.array_equal(signature_pairs(packed, n_cand, chunk=chunk), bits.sum(axis=1))
    with pytest.raises(ValueError):  # pair counts that do not match the rows are refused
        _packed_to_csr(packed, n_cand, lengths=bits.sum(axis=1) + 1)
    for chunk in (1, 7, 65_536):
        got = _packed_to_csr(packed, n_cand, chunk=chunk)
        assert got.shape == want.shape and got.dtype == np.int8 and got.has_sorted_indices
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.toarray(), bits.astype(np.int8))
    assert _packed_to_csr(np.zeros((0, (n_cand + 7) // 8), dtype=np.uint8), n_cand).shape == (0, n_cand)
    with pytest.raises(ValueError):
        _packed_to_csr(np.zeros((2, (n_cand + 7) // 8 + 1), dtype=np.uint8), n_cand)


def test_collected_arrow_histogram_reads_every_chunk():
    """A collected (sig, n) Arrow table of several record batches: its rows and counts in order, no Python bytes per key."""
    import pyarrow as pa

    from dpspark.maxcover.passes import _collected_signatures

    rng = np.random.default_rng(5)
    packed = rng.integers(0, 256, size=(50, 5), dtype=np.uint8)
    counts = rng.integers(1, 1000, size=50)
    batches = [pa.RecordBatch.from_arrays([pa.array([r.tobytes() for r in packed[a:b]], type=pa.binary()),
                                           pa.array(counts[a:b], type=pa.int64())], names=["sig", "n"])
               for a, b in ((0, 20), (20, 20), (20, 50))]
    rows, n = _collected_signatures(pa.Table.from_batches(batches), 5)
    assert np.array_equal(rows, packed) and np.array_equal(n, counts) and n.dtype == np.int64
    empty = pa.Table.from_batches([], schema=batches[0].schema)
    rows, n = _collected_signatures(empty, 5)
    assert rows.shape == (0, 5) and n.shape == (0,) and n.dtype == np.int64
