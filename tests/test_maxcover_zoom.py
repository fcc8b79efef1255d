"""grid_or_private's grid branch puts half its grid where a released coarse histogram shows the data
(``maxcover.candidates.zoomed_grid``): the cell rule in numpy and Spark, the release (its charge,
sensitivity and noise), the level and the grid built from it (post-processing), and a whole fit on a box
ten times the data's range."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpspark.maxcover import candidates as cand_mod
from dpspark.maxcover import core
from dpspark.maxcover.estimator import CHOICE_LABEL, MaxCover
from dpspark.maxcover.params import CHOICE_SHARE, ZOOM_SHARE
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import NoNoise, SeededNoise
from dpspark.tables import unit_columns

DELTA = 1e-6


def test_the_finest_partition_is_a_power_of_two_per_axis_within_1024_cells():
    assert [cand_mod.zoom_side(d) for d in (1, 2, 3, 4, 10, 11)] == [1024, 32, 8, 4, 2, 1]
    for d in range(1, 12):
        side = cand_mod.zoom_side(d)
        assert side ** d <= cand_mod.ZOOM_CELLS < (2 * side) ** d and side & (side - 1) == 0


def hostile_unit_points() -> np.ndarray:
    side = cand_mod.zoom_side(2)
    edges = -1.0 + 2.0 * np.arange(side + 1) / side
    near = np.clip(np.concatenate([edges, np.nextafter(edges, -2.0), np.nextafter(edges, 2.0)]), -1.0, 1.0)
    rng = np.random.default_rng(7)
    col0 = np.concatenate([near, [-0.0, 0.0, 1.0, -1.0], rng.uniform(-1, 1, 200)])
    col1 = np.concatenate([near[::-1], [0.0, -0.0, -1.0, 1.0], rng.uniform(-1, 1, 200)])
    return np.stack([col0, col1], axis=1)


def test_spark_puts_every_point_in_the_same_cell_as_numpy(spark):
    x = hostile_unit_points()
    side = cand_mod.zoom_side(2)
    df = spark.createDataFrame([tuple(map(float, r)) for r in x], unit_columns(2))
    expected = np.bincount(cand_mod.coarse_index(x, side), minlength=side ** 2)
    got = cand_mod.coarse_histogram(df, unit_columns(2), side)
    assert got.dtype == np.int64 and got.shape == (side ** 2,)
    assert np.array_equal(got, expected) and got.sum() == x.shape[0]
    assert cand_mod.coarse_index(np.array([[-1.0, -1.0], [1.0, 1.0]]), side).tolist() == [0, side ** 2 - 1]


def test_the_threshold_lets_an_empty_cell_pass_at_most_once_in_the_partition():
    for eps in (0.01, 0.1, 1.0):
        for expected in (1.0, cand_mod.SURE_FALSE_CELLS):
            t = cand_mod.empty_cell_threshold(eps, 1024, 1, expected)
            tail = lambda s: math.exp(-eps * s) / (1.0 + math.exp(-eps))  # P[Z >= s], Z ~ DLap(1/eps), s >= 1
            assert t == int(t) and tail(t) <= expected / 1024 and (t == 1 or tail(t - 1) > expected / 1024)


def test_a_block_of_empty_cells_passes_its_threshold_about_once_per_level():
    """A coarser level sums blocks of released cells; its threshold is the normal approximation of the
    sum of the block's noises at the 1 - 1/cells quantile. Seeded: 400 x 256 sums of 4 DLap(10) draws
    (eps 0.1); the pass rate lies within [0.25, 3] x 1/256 (the approximation's tail is lighter than the
    sum's: about 1.6 x measured; 400 x 256 x (1/256) = 400 expected at the nominal rate, so the band is
    far outside sampling error)."""
    eps, cells, block = 0.1, 256, 4
    t = cand_mod.empty_cell_threshold(eps, cells, block)
    noise = SeededNoise(1206)
    passes = 0
    for _ in range(400):
        acc = Accountant(1.0, DELTA, noise)
        released = cand_mod.release_coarse(np.zeros(cells * block, dtype=np.int64), eps, acc)
        passes += int((released.reshape(cells, block).sum(axis=1) >= t).sum())
    assert 0.25 * 400 <= passes <= 3.0 * 400, passes


def test_the_release_is_charged_its_share_with_sensitivity_one():
    acc = Accountant(1.0, DELTA, NoNoise())
    exact = np.arange(1024, dtype=np.int64)
    noisy = cand_mod.release_coarse(exact, 0.1, acc)
    assert np.array_equal(noisy, exact)
    assert [(c.label, c.epsilon, c.delta) for c in acc.charges] == [(cand_mod.ZOOM_LABEL, 0.1, 0.0)]


def test_an_empty_cell_passes_at_the_rate_of_the_stated_noise():
    """Empty cells (exact 0) pass the threshold t exactly when the noise is >= t: P = q^t / (1 + q),
    q = exp(-eps), for the discrete Laplace of scale 1 / eps_zoom. eps 0.1 makes t = 63 and P about
    9.3e-4; 400 seeded releases of 1024 cells (409,600 draws, about 380 expected passes); the band is 5
    standard deviations (two-sided, about 6e-7 to fail by chance)."""
    eps = 0.1
    t = cand_mod.empty_cell_threshold(eps, 1024)
    q = math.exp(-eps)
    expected = q ** t / (1 + q)
    noise = SeededNoise(20261206)
    draws, passes = 400 * 1024, 0
    for _ in range(400):
        acc = Accountant(1.0, DELTA, noise)
        passes += int((cand_mod.release_coarse(np.zeros(1024, dtype=np.int64), eps, acc) >= t).sum())
    sd = math.sqrt(draws * expected * (1 - expected))
    assert abs(passes - draws * expected) <= 5 * sd, (passes, draws * expected)


def blob_histogram(dim: int, cells_with_data: list[tuple], rows_each: int) -> np.ndarray:
    side = cand_mod.zoom_side(dim)
    counts = np.zeros((side,) * dim, dtype=np.int64)
    for c in cells_with_data:
        counts[c] = rows_each
    return counts.reshape(-1, order="F")


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_with_every_cell_occupied_or_none_it_is_exactly_the_public_grid(dim):
    cells = cand_mod.zoom_side(dim) ** dim
    for counts, rows in ((np.full(cells, 10_000), 10_000 * cells), (np.zeros(cells), 5_000.0)):
        pts, info, level = cand_mod.zoomed_grid(counts, rows, dim, 1000, 0.1)
        assert np.array_equal(pts, core.grid_candidates(dim, 1000)) and info["zoom_level"] is None and level is None


def test_data_in_a_corner_zooms_at_the_finest_level_onto_its_cells():
    counts = blob_histogram(2, [(3, 4), (3, 5), (4, 4)], 2_000)
    pts, info, (side, sure) = cand_mod.zoomed_grid(counts, 6_000.0, 2, 1000, 0.1)
    assert info["zoom_level"] == side == 32 and info["occupied_cells"] == 3 and sure.sum() == 3
    # the coverage thresholds span the three cells' bounding box (2 x 2 cells of width 2/32), not the box
    assert info["diameter"] == pytest.approx(math.hypot(2 * 2 / 32, 2 * 2 / 32))
    assert cand_mod.coverage_diameter(2 * math.sqrt(2), info) == pytest.approx(info["diameter"])
    assert cand_mod.coverage_diameter(2 * math.sqrt(2), {"zoom_level": None}) == 2 * math.sqrt(2)
    # candidates outside the sure cells get the stricter weight floor
    outside = cand_mod.outside_cells(pts, side, sure)
    assert outside.sum() == pts.shape[0] - np.isin(cand_mod.coarse_index(pts, 32), [3 + 32 * 4, 3 + 32 * 5, 4 + 32 * 4]).sum()
    public = core.grid_candidates(2, 500)
    assert info["public_points"] == public.shape[0] and pts.shape[0] <= 1000
    assert {tuple(r) for r in public} <= {tuple(r) for r in pts}  # the public half is all there
    cells = cand_mod.coarse_index(pts, 32)
    zoomed = np.isin(cells, [3 + 32 * 4, 3 + 32 * 5, 4 + 32 * 4])
    assert zoomed.sum() >= 400  # the other half in the three cells: about 200x the public density there


def test_the_level_coarsens_until_the_occupied_cells_hold_the_rows():
    """40% of the rows spread thin (30 per finest cell: below the finest threshold of 63 at eps 0.1,
    above the 4x4-block one): the finest level would lose them, so a coarser level is chosen."""
    side = 32
    counts = np.zeros((side, side), dtype=np.int64)
    counts[0:8, 0:8] = 30           # 1,920 rows, thin
    counts[20, 20] = 3_000          # 3,000 rows, dense
    rows = float(counts.sum())
    level, occupied, sure = cand_mod.zoom_level(counts.reshape(-1, order="F"), 2, 0.1, rows)
    assert level < 32 and occupied[0, 0] and occupied.sum() < level ** 2 and not (sure & ~occupied).any()
    assert cand_mod.zoom_level(counts.reshape(-1, order="F"), 2, 0.1, rows * 0.6)[0] == 32  # 0.9 x 0.6 n < 3,000


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_the_grid_fills_the_occupied_cells_only_and_stays_within_its_size(dim):
    rng = np.random.default_rng(dim)
    side = cand_mod.zoom_side(dim)
    for share in (0.003, 0.05, 0.4):
        occupied = rng.uniform(size=(side,) * dim) < share
        if not occupied.any():
            continue
        for size in (500, 4000):
            pts = cand_mod.grid_in_cells(occupied, size)
            assert 0 < pts.shape[0] <= size
            assert occupied.reshape(-1, order="F")[cand_mod.coarse_index(pts, side)].all()
            if share < 0.01:  # few cells: far finer than the public grid of the same size
                assert pts.shape[0] >= size // 4


def test_the_grid_branch_budget_gives_the_zoom_its_share_and_adds_up():
    box = Domain(dim=2, lower=(0.0, 0.0), upper=(1.0, 1.0))
    est = MaxCover(k=4, epsilon=2.0, delta=DELTA, domain=box)
    acc = Accountant(2.0, DELTA, NoNoise())
    params, budget, info = est.resolve_candidates(est._validated_params(), lambda: np.array([30, 70]), acc)
    assert info["noisy_rows"] == 100 and params.candidates == "grid"
    assert [c.label for c in acc.charges] == [CHOICE_LABEL]
    assert budget["zoom"] == (ZOOM_SHARE * 2.0, 0.0) and budget["choice"] == (CHOICE_SHARE * 2.0, 0.0)
    assert math.isclose(math.fsum(e for e, _ in budget.values()), 2.0, rel_tol=1e-12)
    assert math.isclose(budget["coverage"][0], 0.5 * 2.0 * (1 - CHOICE_SHARE - ZOOM_SHARE))


def test_a_fit_on_a_box_ten_times_too_wide_puts_its_candidates_on_the_data(spark, write_delta):
    """Three tight blobs in [0, 1]^2 given the box [-5, 6]^2: the public grid alone would leave about 1%
    of its points on the data; the zoomed half goes to the few occupied cells. Seeded; the charges are
    the run's epsilon to the last bit."""
    rng = np.random.default_rng(11)
    centers = np.array([[0.2, 0.2], [0.8, 0.3], [0.5, 0.9]])
    x = np.concatenate([c + 0.02 * rng.standard_normal((700, 2)) for c in centers])
    path = write_delta(pd.DataFrame(x, columns=["x", "y"]))
    box = Domain(dim=2, lower=(-5.0, -5.0), upper=(6.0, 6.0))
    model = MaxCover(k=3, epsilon=1.0, delta=DELTA, domain=box, seed=5).fit(spark.read.format("delta").load(path))
    assert model.info["candidates"] == "grid"
    zoom = model.info["private_candidates"]["zoom"]
    assert zoom["zoom_level"] == 32 and 1 <= zoom["occupied_cells"] <= 12 and zoom["zoomed_points"] >= 400
    labels = [c["step"] for c in model.charges]
    assert labels[:2] == [CHOICE_LABEL, cand_mod.ZOOM_LABEL]
    assert model.epsilon_spent == 1.0 and math.fsum(c["epsilon"] for c in model.charges) == pytest.approx(1.0, abs=1e-12)
    dist = np.sqrt(((model.centers[:, None, :] - centers[None, :, :]) ** 2).sum(-1))
    assert dist.min(axis=0).max() < 0.1, model.centers  # the public grid's step here is 0.5
