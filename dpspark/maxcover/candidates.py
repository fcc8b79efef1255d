"""Candidate sets V of the maxcover family, in the unit space of the domain.

- ``table``: a PUBLIC Delta table of candidate points chosen by the user (the
  paper's discrete setting). Public, so it is collected to the driver; its rows
  are clipped into the domain like the data.
- ``grid`` / ``random``: data-independent (``core.grid_candidates``,
  ``core.random_candidates`` / ``Domain.sample_unit`` for a ball).
- ``private``: a DP candidate generator in the spirit of the paper's section 5
  (see :func:`private_candidates`): noisy heavy cells of randomly shifted grids at
  several scales, candidates at the noisy means of the heavy cells.
- ``tree``: the private LSH tree of ``dpspark.steps.tree`` (see :func:`tree_candidates`):
  random hyperplane cells, which stay populated in any d, candidates at the noisy
  means of its leaves. Pure epsilon-DP (spends no delta).

Privacy of the private generator
--------------------------------
Theorem used (stability-based histogram; Korolova, Kenthapadi, Mishra, Ntoulas,
WWW 2009; Bun, Nissim, Stemmer, PODS 2016, Thm. 3.5 there; Vadhan, "The
Complexity of Differential Privacy", 2017, Prop. 3.5), in its add/remove form
with discrete Laplace noise and extra per-bin releases:

    Let every record fall into exactly one bin of a (possibly infinite) public
    set of bins, c_b the exact count of bin b and f_b the exact sum over the
    records of bin b of a vector g(record) with ||g||_1 <= S, and c >= 1 a public
    integer. Release, for every bin b with c_b >= c independently,
    c~_b = c_b + Z_b with Z_b ~ DLap(1/eps_c) (P(z) ~ exp(-eps_c |z|)), and if
    c~_b >= T also f_b + W_b with W_b a vector of DLap(S/eps_s) in fixed-point
    steps; release nothing about the other bins. If
    P[c + Z >= T] = exp(-eps_c (T - c)) / (1 + exp(-eps_c)) <= delta, this is
    (eps_c + eps_s, delta)-DP under add/remove of one record.

Proof: let D' = D + {x} and b the bin of x; every other bin has the same count
and sums in D and D' and independent noise. If c_b(D) >= c, the pair (c~_b,
f~_b) is (eps_c + eps_s)-DP (two Laplace mechanisms of sensitivity 1 and S) and
the test c~_b >= T is post-processing. If c_b(D) < c - 1, bin b is considered
in neither. If c_b(D) = c - 1, bin b is never reported on D and is reported on
D' (count c) with probability P[c + Z >= T] <= delta; outside that event both
outputs have the same distribution, which gives (0, delta) in both directions.
Bins below c are never listed, so no threshold-passing release can reveal one.
The textbook form is c = 1 (non-empty bins). We use c = MIN_CELL_COUNT = 2: the
cells holding a single record, which in high dimension are nearly all of them,
are dropped by the executors instead of being collected to the driver and
noised; the price is a threshold one higher (T_c = T_1 + c - 1, same delta).

Here one scale is one histogram: the cells of a grid of side s (randomly shifted
by a PUBLIC uniform offset), g(x) = fixed-point offset of x from its cell center
clipped to [-s/2, s/2]^d, so S = d * floor(s/2 * 2^20) fixed-point steps.
Each scale is charged (eps_level, delta_level) through ``Accountant.block`` with
this rule; the scales compose by basic composition: eps_level = eps_cand / L,
delta_level = delta_cand / L for L scales (the last scale takes the rounding
remainder so the charges add up to exactly (eps_cand, delta_cand)). Inside one
scale eps_c = COUNT_SHARE * eps_level and eps_s = the rest.

Everything after the noisy releases (the threshold test, noisy means clipped to
their cell and the domain, the ranking by noisy count, the cap at
``candidate_count``, padding with public random points when fewer than k cells
pass) is post-processing.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from dpspark import tables
from dpspark.steps import tree
from dpspark.errors import SchemaError
from dpspark.kernels import PACKED_COLUMN
from dpspark.maxcover import core, kernels, passes
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE
from dpspark.privacy.mechanisms import LaplaceMechanism

log = logging.getLogger("dpspark")

MIN_CELL_COUNT = 2  # cells with fewer records are dropped on the executors; the threshold rises by MIN_CELL_COUNT - 1
COUNT_SHARE = 0.75  # of each scale's epsilon: the noisy counts (and the threshold); the rest for the offset sums
PRIVATE_LABEL = "maxcover private candidates"
STABILITY_RULE = (
    "stability-based histogram (Korolova et al. 2009; Bun, Nissim, Stemmer 2016 Thm 3.5; Vadhan 2017 Prop 3.5), "
    "add/remove, discrete Laplace: only cells with exact count >= c (c = MIN_CELL_COUNT, filtered on the executors), "
    "noisy count n+DLap(1/eps_c) released iff >= T with exp(-eps_c (T-c))/(1+exp(-eps_c)) <= delta_level, plus DLap noise of scale S/eps_s on the clipped "
    "offset sums of released cells (L1 sensitivity S = d * side/2): (eps_c + eps_s, delta_level)-DP per scale; "
    "scales by basic composition"
)


# ----------------------------------------------------------------------------
# Public candidates


def clip_original(domain: Domain, x: np.ndarray) -> np.ndarray:
    """Clip points into the domain in ORIGINAL units (a row already inside is returned unchanged)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1, domain.dim)
    if domain.is_ball:
        # Rows outside go through the domain's total map (its norm cannot overflow), rows inside stay.
        unit = domain.clip_to_unit(x)
        with np.errstate(over="ignore", invalid="ignore"):
            inside = np.all(np.isfinite(x), axis=1) & np.all(np.abs(x / domain.radius - unit) == 0.0, axis=1)
        return np.where(inside[:, None], x, domain.from_unit(unit))
    return np.clip(x, np.asarray(domain.lower), np.asarray(domain.upper))


def table_candidates(spark, path: str, features: tuple[str, ...], domain: Domain):
    """Read the PUBLIC candidate table; return (unit-space candidates, the same rows clipped in original units).

    Rows with a missing or non-finite feature are skipped; duplicate rows are kept
    once (first occurrence order).
    """
    qualified = tables.qualify(path)
    try:
        df, _ = tables.load_table(spark, qualified, "delta")
        exprs, _ = tables._feature_expressions(df, tuple(features), domain.dim)
    except SchemaError as exc:
        raise SchemaError(f"candidate table (algorithm.candidate_table={path!r}): {exc}") from None
    pdf = df.select(*[e.alias(f"__f{j}") for j, e in enumerate(exprs)]).toPandas()
    x = pdf.to_numpy(dtype=np.float64).reshape(-1, domain.dim)
    x = x[np.all(np.isfinite(x), axis=1)]
    if not x.shape[0]:
        raise SchemaError(f"candidate table algorithm.candidate_table={path!r} has no rows with finite features {list(features)}")
    original = clip_original(domain, x)
    unit = domain.clip_to_unit(original)
    _, first = np.unique(unit, axis=0, return_index=True)
    keep = np.sort(first)
    return unit[keep], original[keep]


def public_candidates(mode: str, domain: Domain, count: int, rng: np.random.Generator) -> np.ndarray:
    """Data-independent candidates in the unit space: ``grid`` (regular, centred cells) or ``random`` (uniform)."""
    if mode == "grid":
        grid = core.grid_candidates(domain.dim, count)
        if domain.is_ball:
            grid = np.unique(domain.clip_unit(grid), axis=0)
        return grid
    if mode == "random":
        return core.random_candidates(domain.dim, count, rng) if not domain.is_ball else domain.sample_unit(rng, count)
    raise ValueError(f"unknown public candidate mode {mode!r}")


# ----------------------------------------------------------------------------
# Private candidates


def stability_threshold(eps_count: float, delta: float, min_count: int = 1) -> int:
    """Smallest integer T > c with P[c + Z >= T] = exp(-eps (T-c)) / (1 + exp(-eps)) <= delta, Z ~ DLap(1/eps).

    ``c = min_count``: the smallest exact count a bin must have to be considered at all (see the
    module docstring); the result is the c = 1 threshold plus c - 1.
    """
    if not (eps_count > 0) or not (0 < delta < 1):
        raise ValueError(f"need eps > 0 and delta in (0, 1), got {eps_count!r}, {delta!r}")
    if int(min_count) != min_count or min_count < 1:
        raise ValueError(f"min_count={min_count!r} should be an integer >= 1")
    return _threshold_one(eps_count, delta) + int(min_count) - 1


def _threshold_one(eps_count: float, delta: float) -> int:
    """The textbook (c = 1) threshold: smallest T >= 2 with exp(-eps (T-1)) / (1 + exp(-eps)) <= delta."""
    q = math.exp(-eps_count)
    m = max(1, math.ceil(math.log(1.0 / (delta * (1.0 + q))) / eps_count))
    while m > 1 and math.exp(-eps_count * (m - 1)) / (1.0 + q) <= delta:
        m -= 1
    while math.exp(-eps_count * m) / (1.0 + q) > delta:
        m += 1
    return 1 + m


def scale_sides(scales: int) -> list[float]:
    """Cell sides 1, 1/2, 1/4, ... in the unit space (width 2): halving from the unit-domain width."""
    return [2.0 / 2.0 ** (level + 1) for level in range(scales)]


def split_evenly(total: float, parts: int) -> list[float]:
    """``parts`` shares of ``total`` that add up to it (the last takes the rounding remainder)."""
    shares = [total / parts] * (parts - 1)
    shares.append(total - math.fsum(shares))
    return shares


def private_candidates(df, columns: list[str], domain: Domain, count: int, scales: int, k: int,
                       eps_cand: float, delta_cand: float, accountant: Accountant, rng: np.random.Generator,
                       counter=None, timings=None):
    """The DP candidate generator: one Spark pass, L charged stability histograms. Returns (candidates, info)."""
    dim = domain.dim
    sides = scale_sides(scales)
    shifts = [rng.uniform(0.0, side, size=dim) for side in sides]  # PUBLIC randomness
    cells = passes.cell_aggregates(df, columns, sides, shifts, min_count=MIN_CELL_COUNT, counter=counter, timings=timings)
    eps_levels = split_evenly(eps_cand, scales)
    delta_levels = split_evenly(delta_cand, scales)
    per_level: list[tuple[np.ndarray, np.ndarray]] = []  # (candidate points, noisy counts), heaviest first
    info = []
    for level, (side, shift, (g, n, s)) in enumerate(zip(sides, shifts, cells)):
        eps_l, delta_l = eps_levels[level], delta_levels[level]
        eps_c = eps_l * COUNT_SHARE
        eps_s = eps_l - eps_c
        threshold = stability_threshold(eps_c, delta_l, MIN_CELL_COUNT)
        lim = kernels.offset_limit(side)
        # The stability theorem covers one release of the count vector (sensitivity 1, eps_c) and one of
        # the offset sums of the released cells (L1 sensitivity S = d * lim steps, eps_s): the block
        # refuses anything else.
        count_mech = LaplaceMechanism(epsilon=eps_c, sensitivity=1.0)
        sum_mech = LaplaceMechanism(epsilon=eps_s, sensitivity=dim * lim / SCALE, unit=1.0 / SCALE)
        block = accountant.block(f"{PRIVATE_LABEL}: scale {level + 1}/{scales} (cell side {side:g})", eps_l, delta_l,
                                 STABILITY_RULE, releases={count_mech: 1, sum_mech: 1})
        noisy_n = block.laplace(n, count_mech) if n.size else np.zeros(0, dtype=np.int64)
        keep = np.flatnonzero(noisy_n >= threshold)
        if keep.size:
            noisy_s = block.laplace(s[keep], sum_mech)
            centers = kernels.cell_centers(g[keep], side, shift)
            nn = noisy_n[keep].astype(np.float64)
            offset = np.clip(noisy_s.astype(np.float64) / SCALE / nn[:, None], -side / 2.0, side / 2.0)
            points = domain.clip_unit(centers + offset)
            order = np.argsort(-noisy_n[keep], kind="stable")
            per_level.append((points[order], noisy_n[keep][order]))
        else:
            per_level.append((np.zeros((0, dim)), np.zeros(0, dtype=np.int64)))
        info.append({"scale": level + 1, "side": side, "threshold": int(threshold), "epsilon": eps_l, "delta": delta_l,
                     "released_cells": int(keep.size)})
    # Post-processing: interleave the scales (finest first), heaviest cells first within a scale, cap at count.
    chosen = []
    depth = max((pts.shape[0] for pts, _ in per_level), default=0)
    for r in range(depth):
        for pts, _ in reversed(per_level):
            if r < pts.shape[0]:
                chosen.append(pts[r])
        if len(chosen) >= count:
            break
    cand = np.array(chosen[:count], dtype=np.float64).reshape(-1, dim)
    cand, padded = distinct_padded(cand, domain, k, rng, "the private candidate generator released %d cells")
    return cand, {"scales": info, "padded_public_points": padded}


def distinct_padded(cand: np.ndarray, domain: Domain, k: int, rng: np.random.Generator, released: str):
    """Post-processing shared by the charged generators: ``cand`` (released points, in order) without
    repeats (first one kept), padded with public random points to k. Returns (candidates, padded).
    ``released`` is the log line's "what was released" with one %d for how many (a released number)."""
    if cand.shape[0]:
        _, first = np.unique(cand, axis=0, return_index=True)
        cand = cand[np.sort(first)]
    padded = max(k - cand.shape[0], 0)
    if padded:
        log.warning("maxcover: " + released + " (< k=%d); adding %d public random points", cand.shape[0], k, padded)
        cand = np.vstack([cand, domain.sample_unit(rng, padded)])
    return cand, padded


# ----------------------------------------------------------------------------
# candidates: tree

TREE_LABEL = "maxcover tree candidates"
TREE_ROOT_SHARE = 0.08  # of eps_cand: the noisy row count (tree root) ...
TREE_LEVELS_SHARE = 0.37  # ... the tree levels' noisy counts; the leaf sums get the rest (0.55)


def tree_split(eps_cand: float) -> tuple[float, float, float]:
    """(eps_root, eps_tree, eps_sums) of the tree candidates: public (eps_cand only), adding up to eps_cand."""
    eps_root = TREE_ROOT_SHARE * eps_cand
    eps_tree = TREE_LEVELS_SHARE * eps_cand
    return eps_root, eps_tree, eps_cand - eps_root - eps_tree


def tree_candidates(aggregate, domain: Domain, count: int, k: int, eps_cand: float, accountant: Accountant,
                    rng: np.random.Generator):
    """``candidates: tree``: the noisy means of the leaves of the private LSH tree. Returns (candidates, info).

    Privacy: exactly ``dpspark.steps.tree.private_coreset`` (its module docstring has the argument:
    a noisy root count, one noisy count vector per level of L1 sensitivity 1 composed over the
    levels walked, the unwalked levels' budget moved to one release of the disjoint leaves' sums
    of L1 sensitivity d), with eps_root + eps_tree + eps_sums = eps_cand (``tree_split``, public)
    and no delta: (eps_cand, 0)-DP under add/remove of one record, charged through the run's
    accountant, whatever the walk does. It composes with the coverage loop and the final counts
    by basic composition, as the grid generator does. ``aggregate(w, b)``: the exact per-deepest-path
    counts and sums (``dpspark.steps.tree.spark_tree_aggregates``: one Spark pass; numpy in tests).

    Post-processing: the leaves' noisy means (clipped into the domain), the ``count`` with the
    highest noisy counts first, duplicates dropped, padded with public random points to k.
    """
    eps_root, eps_tree, eps_sums = tree_split(eps_cand)
    coreset = tree.private_coreset(aggregate, domain, k, eps_root, lambda noisy_n: (eps_tree, eps_sums), accountant,
                                   rng, label=TREE_LABEL)
    order = np.argsort(-coreset.weights, kind="stable")[: int(count)]
    cand, padded = distinct_padded(coreset.points[order].reshape(-1, domain.dim), domain, k, rng,
                                   "the private tree released %d leaves")
    info = {"tree": dict(coreset.info), "padded_public_points": padded,
            "leaf_nodes": [coreset.leaf_nodes[i] for i in order]}
    return cand, info


# ----------------------------------------------------------------------------
# candidates: the grid where the data is (grid_or_private's grid branch)
#
# A public grid spread over the whole box wastes its points on empty space when the box is loose
# (a box 10x the data's range leaves about 1/100 of a 2-d grid on the data). The grid branch therefore
# first releases a coarse histogram of the box and puts part of its points where it shows the data.
#
# Privacy: the cells are a public partition of the box (every record, clipped into the box, falls in
# exactly one: NaN/inf rows are dropped before, as for every step), so the vector of ALL cell counts
# (empty cells included, filled on the driver) has L1 sensitivity 1 under add/remove of one record; it
# is released once with discrete Laplace of scale 1 / eps_zoom: pure eps_zoom-DP, charged through the
# run's accountant. Everything after (the coarser levels summed from the released cells, their
# thresholds, the level chosen, the grid on its occupied cells) is post-processing of the noisy counts,
# the released row count and public inputs (d, the grid's size, eps_zoom).

ZOOM_LABEL = "maxcover: noisy coarse histogram (where the grid goes)"
ZOOM_CELLS = 1024  # the finest partition: the largest power of two per axis with side^d <= this
# The level: the finest (side 32, 16, ... in 2-d) whose occupied cells hold at least this share of the
# released row count. Half the grid's points stay a public grid over the whole box (a cluster too small
# to show in the histogram keeps candidates near it); the other half fills the chosen level's occupied
# cells. Measured (numpy reference, epsilon 1, median of 5, cost / non-private; tight / 1.5x / 10x box):
# s1 1.035 / 1.23 / 26 -> 1.025 / 1.09 / 1.44; a3 1.08 / 2.12 / 18 -> 0.98 / 1.10 / 1.56; unbalance
# 1.92 / 5.9 / 127 -> 1.16 / 2.08 / 8.7 (a quarter public: 10x better, tight worse; capture 0.98: the
# same at 10x, unbalance tight worse).
ZOOM_CAPTURE = 0.9
ZOOM_PUBLIC_SHARE = 0.5
# The bounding box of the occupied cells (the coverage thresholds' diameter) counts only cells that an
# empty cell reaches with probability 5% in the whole level: one false cell would stretch it to the box.
SURE_FALSE_CELLS = 0.05


def zoom_side(dim: int) -> int:
    """Cells per axis of the finest partition, a power of two (public: d only): 1024 in 1-d, 32 in 2-d,
    8 in 3-d."""
    side = 1
    while (2 * side) ** int(dim) <= ZOOM_CELLS:
        side *= 2
    return side


def coarse_index(unit: np.ndarray, side: int) -> np.ndarray:
    """numpy: each unit-space point's cell, sum_j c_j side^j with c_j = min(floor((u_j + 1) side / 2),
    side - 1) clamped at 0 (the rule ``coarse_column`` computes in Spark, the same double arithmetic)."""
    unit = np.asarray(unit, dtype=np.float64).reshape(len(unit), -1)
    c = np.clip(np.floor((unit + 1.0) * (side / 2.0)), 0, side - 1).astype(np.int64)
    return (c * (side ** np.arange(unit.shape[1], dtype=np.int64))).sum(axis=1)


def unit_values(columns: list[str], dim: int):
    """Spark: the d unit-space values of a row, from the d columns or the packed column's elements."""
    from pyspark.sql import functions as F

    if list(columns) == [PACKED_COLUMN]:
        return [F.col(PACKED_COLUMN).getItem(j) for j in range(dim)]
    if len(columns) != dim:
        raise ValueError(f"columns={list(columns)} should name dim={dim} columns")
    return [F.col(c) for c in columns]


def coarse_column(columns: list[str], side: int, dim: int | None = None):
    """Spark: the cell of the unit-space columns (see ``coarse_index``); ``dim`` for the packed column."""
    from pyspark.sql import functions as F

    dim = len(columns) if dim is None else int(dim)
    cell = F.lit(0).cast("long")
    for j, value in enumerate(unit_values(columns, dim)):
        c = F.least(F.greatest(F.floor((value + F.lit(1.0)) * F.lit(side / 2.0)), F.lit(0)), F.lit(side - 1))
        cell = cell + c.cast("long") * F.lit(side ** j).cast("long")
    return cell


def coarse_histogram(df, columns: list[str], side: int, dim: int | None = None) -> np.ndarray:
    """One Spark job: the exact count of every cell, (side^d,) int64, empty cells 0 (NOT private)."""
    dim = len(columns) if dim is None else int(dim)
    rows = df.groupBy(coarse_column(columns, side, dim).alias("cell")).count().collect()
    exact_counts = np.zeros(side ** dim, dtype=np.int64)
    for r in rows:
        exact_counts[int(r["cell"])] = int(r["count"])
    return exact_counts


def release_coarse(exact_counts: np.ndarray, eps_zoom: float, accountant: Accountant) -> np.ndarray:
    """The one release of the histogram (all cells), charged eps_zoom (module comment above)."""
    mech = LaplaceMechanism(epsilon=eps_zoom, sensitivity=1.0)
    return accountant.laplace(ZOOM_LABEL, np.asarray(exact_counts, dtype=np.int64), mech)


def empty_cell_threshold(eps_zoom: float, cells: int, block: int = 1, expected: float = 1.0) -> float:
    """The count an empty cell's noisy value reaches with probability about expected / cells (public),
    for a cell summing ``block`` released cells. block 1: the smallest integer t >= 1 with
    cells P[Z >= t] <= expected, P[Z >= t] = exp(-eps t) / (1 + exp(-eps)), Z ~ DLap(1/eps). block > 1:
    the normal approximation of the sum of block such Z (variance block * 2q / (1 - q)^2, q = exp(-eps))."""
    q = math.exp(-float(eps_zoom))
    if block == 1:
        return float(core.noise_floor(eps_zoom, int(cells), expected))
    from statistics import NormalDist

    sd = math.sqrt(block * 2.0 * q / (1.0 - q) ** 2)
    return sd * NormalDist().inv_cdf(1.0 - expected / cells)


def zoom_level(noisy_counts: np.ndarray, dim: int, eps_zoom: float, noisy_rows: float):
    """Post-processing: (side, occupied, sure) of the finest level whose occupied cells (noisy sum >=
    ``empty_cell_threshold``, masks of shape (side,) * d) hold at least ZOOM_CAPTURE of ``noisy_rows``
    and leave at least one cell empty; ``sure``: its cells above the stricter threshold an empty cell
    passes with probability SURE_FALSE_CELLS in the whole level (``occupied`` if none). None when no
    level qualifies (the plain public grid then)."""
    finest = zoom_side(dim)
    noisy_counts = np.asarray(noisy_counts, dtype=np.float64).reshape(-1)
    if noisy_counts.size != finest ** dim:
        raise ValueError(f"the coarse histogram has {noisy_counts.size} cells, expected {finest ** dim}")
    fine = noisy_counts.reshape((finest,) * dim, order="F")  # axis j is c_j (index sum_j c_j side^j)
    side = finest
    while side >= 2:
        f = finest // side
        level = fine.reshape(sum(([side, f] for _ in range(dim)), [])).sum(axis=tuple(range(1, 2 * dim, 2)))
        occupied = level >= empty_cell_threshold(eps_zoom, side ** dim, f ** dim)
        captured = float(level[occupied].sum())
        if occupied.any() and not occupied.all() and captured >= ZOOM_CAPTURE * max(float(noisy_rows), 1.0):
            sure = level >= empty_cell_threshold(eps_zoom, side ** dim, f ** dim, SURE_FALSE_CELLS)
            return side, occupied, (sure if sure.any() else occupied)
        side //= 2
    return None


def grid_in_cells(occupied: np.ndarray, size: int) -> np.ndarray:
    """The finest regular grid over the box (q points per axis at -1 + (2i + 1)/q, as
    ``core.grid_candidates``) whose points inside the ``occupied`` cells (a boolean array of shape
    (side,) * d, axis j the cell's c_j) number at most ``size``, and those points (public inputs only)."""
    dim, side = occupied.ndim, occupied.shape[0]

    def per_axis(q: int) -> np.ndarray:
        axis = -1.0 + (2.0 * np.arange(q) + 1.0) / q
        return np.bincount(np.clip(np.floor((axis + 1.0) * (side / 2.0)), 0, side - 1).astype(np.int64), minlength=side)

    def kept(q: int) -> int:
        total = occupied.astype(np.int64)
        for j in range(dim):
            shape = [1] * dim
            shape[j] = side
            total = total * per_axis(q).reshape(shape)
        return int(total.sum())

    q = max(2, int(math.ceil(side * (size / max(int(occupied.sum()), 1)) ** (1.0 / dim))) + 2)
    while q > 2 and kept(q) > size:
        q -= 1
    axis = -1.0 + (2.0 * np.arange(q) + 1.0) / q
    grid = np.stack(np.meshgrid(*([axis] * dim), indexing="ij"), axis=-1).reshape(-1, dim)
    return grid[occupied.reshape(-1, order="F")[coarse_index(grid, side)]]


def zoomed_grid(noisy_counts: np.ndarray, noisy_rows: float, dim: int, size: int, eps_zoom: float):
    """Post-processing: grid_or_private's grid, (points, info, level) with level None or (side, sure): the
    level's cells above the stricter threshold (``zoom_level``), where candidates keep the mild floor.
    With no zoom level (``zoom_level``) exactly ``core.grid_candidates(dim, size)``; else a public grid
    of ZOOM_PUBLIC_SHARE of ``size`` over the whole box and the rest on the level's occupied cells
    (``grid_in_cells``), duplicates dropped."""
    chosen = zoom_level(noisy_counts, dim, eps_zoom, noisy_rows)
    if chosen is None:
        return core.grid_candidates(dim, size), {"zoom_level": None}, None
    side, occupied, sure = chosen
    public = core.grid_candidates(dim, max(int(size * ZOOM_PUBLIC_SHARE), 2 ** dim))
    zoomed = grid_in_cells(occupied, max(size - public.shape[0], 1))
    points = np.unique(np.concatenate([public, zoomed]), axis=0)
    cells = np.argwhere(sure)  # column j is c_j; one false cell would stretch the box to the whole box
    extent = (cells.max(axis=0) + 1 - cells.min(axis=0)) * (2.0 / side)
    return points, {"zoom_level": int(side), "occupied_cells": int(occupied.sum()), "cells": int(side ** dim),
                    "public_points": int(public.shape[0]), "zoomed_points": int(zoomed.shape[0]),
                    "diameter": float(np.sqrt(np.sum(extent ** 2)))}, (side, sure)


def outside_cells(points: np.ndarray, side: int, occupied: np.ndarray) -> np.ndarray:
    """Post-processing: which unit-space ``points`` lie outside the ``occupied`` cells (shape (side,) * d;
    the zoom level's sure cells): candidates where the released histogram did not clearly see data,
    whose released weights get the stricter floor (``core.significant_weights``): a false cell (about
    one in a 32 x 32 release) would otherwise hand a noisy weight to the candidates placed in it."""
    return ~occupied.reshape(-1, order="F")[coarse_index(points, side)]


def coverage_diameter(unit_diameter: float, zoom_info: dict | None) -> float:
    """The diameter the coverage loop's thresholds span (post-processing): the box's, or with a zoom
    level the smaller diameter of the bounding box of its sure cells (``zoomed_grid``'s "diameter": a
    box ten times too wide would otherwise spend its finest threshold on balls wider than the data).
    Measured (numpy reference, 10x box, median of 5): s1 1.58 -> 1.27, unbalance 9.4 -> 5.0."""
    if not zoom_info or zoom_info.get("zoom_level") is None:
        return float(unit_diameter)
    return float(min(unit_diameter, zoom_info["diameter"]))
