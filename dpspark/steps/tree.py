"""A private LSH-tree coreset: candidates that work in many dimensions (driver side).

Why: a grid of cells in the full space has 2**d cells at side 1, so for d >= 10 almost
every cell holds one point and nothing survives a private threshold. A tree of random
hyperplane cuts (SimHash prefixes, as in Google's "practical DP clustering") has 2**m
nodes at depth m whatever d is, so its heavy nodes stay heavy in 50 dimensions. The
coreset point of a node is the noisy mean of its points in the FULL space.

The pass (``tree_aggregates``): every point gets its path under ``max_depth`` public
random hyperplanes (``kernels.leaf_codes``, exact integers); the executors add up the
exact count and fixed-point coordinate sums per distinct deepest path; the driver receives
at most 2**max_depth rows (``max_depth`` is public, from d only: memory independent of n)
and derives every shallower node by adding its descendants (exact integers).

The releases (``private_coreset``), under add/remove of one record x, in unit space
(every coordinate in [-1, 1], so one record moves a count by 1 and the L1 norm of a sum
vector by at most d):

1. ``eps_root``: the root count n + DLap(1/eps_root): the noisy row count n_hat (public
   from then on; it sets eps_tree and eps_sums (the caller's ``split``), the depth
   D <= max_depth and the split threshold tau).
2. ``eps_tree``, split evenly over the D levels: at level m the considered nodes are the
   two children of every node kept at level m - 1 (a set fixed by earlier releases);
   their exact counts, absent ones 0, are released with DLap(D / eps_tree) each. x lies
   in exactly one node per level, so the count vector of a level has L1 sensitivity 1:
   eps_tree / D per level, and the D levels compose to eps_tree (adaptive sequential
   composition: each level's mechanism is chosen from released values only). A child is
   kept when its noisy count is >= tau. If no node is kept before level D the walk stops
   and the unused levels are NOT charged: their budget goes to step 3 (the total is still
   fixed in advance: a pure-DP privacy filter, Rogers et al. 2016).
3. ``eps_sums``: the leaves are the nodes kept at some level none of whose children was
   kept (and the nodes kept at level D). They are disjoint, so x is in at most one leaf
   and the (leaves x d) matrix of exact sums has L1 sensitivity d: one release with
   DLap(d / eps_sums) per coordinate (fixed point).

Everything after the releases (leaf means = noisy sum / noisy count clipped into the
domain, weights = max(noisy count, 0)) is post-processing. Total: exactly
eps_root + eps_tree + eps_sums, delta 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpspark.kernels import arrow_out
from dpspark.steps.tree_kernels import fixed_planes, leaf_aggregates, tree_aggregator
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE, quantize
from dpspark.privacy.mechanisms import LaplaceMechanism
from dpspark.progress import step

MAX_TREE_DEPTH = 16  # at most 2**16 deepest nodes collected to the driver
DRIVER_CELLS = 1 << 22  # int64 cells of the deepest-node table: 32 MB
OFFSET_SPREAD = 0.5  # hyperplane offsets uniform in [-OFFSET_SPREAD, OFFSET_SPREAD] (unit space)
TAU_NOISE_SCALES = 3.0  # a child is kept when its noisy count is >= 3 noise scales of its level ...
TAU_SUM_FACTOR = 0.75  # ... and >= 0.75 d / eps_sums (its noisy mean is then within about one unit per coordinate)


def max_depth(dim: int) -> int:
    """The deepest level the pass computes: public, from d only (the driver's table has <= DRIVER_CELLS int64s)."""
    if dim < 1:
        raise ValueError(f"dim={dim!r} should be >= 1")
    return int(max(1, min(MAX_TREE_DEPTH, math.floor(math.log2(DRIVER_CELLS / (dim + 2))))))


def draw_planes(rng: np.random.Generator, depth: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """PUBLIC random hyperplanes: unit normals (Gaussian directions) and offsets, drawn before any data is read."""
    normals = rng.standard_normal((depth, dim))
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-300)
    normals = np.clip(normals, -1.0, 1.0)
    offsets = rng.uniform(-OFFSET_SPREAD, OFFSET_SPREAD, size=depth)
    return normals, offsets


def numpy_tree_aggregates(unit_points: np.ndarray):
    """Reference aggregation on one machine (tests, benchmarks): same integers as the Spark pass."""
    q = quantize(np.asarray(unit_points, dtype=np.float64).reshape(len(unit_points), -1))

    def aggregate(w, b):
        return leaf_aggregates(q, w, b)

    return aggregate


def spark_tree_aggregates(df, columns: list[str], counter=None, timings: dict | None = None):
    """An ``aggregate(w, b)`` callable backed by ONE Spark pass (mapInArrow, then a sum per deepest path)."""

    def aggregate(w, b):
        from pyspark.sql import functions as F

        dim = np.asarray(w).shape[1]
        schema = "code LONG, n LONG, " + ", ".join(f"s{j} LONG" for j in range(dim))
        with step(f"auto pass: LSH tree counts and sums ({w.shape[0]} levels)", timings):
            pdf = (df.mapInArrow(arrow_out(tree_aggregator(w, b, columns)), schema)
                   .groupBy("code").agg(F.sum("n").alias("n"), *[F.sum(f"s{j}").alias(f"s{j}") for j in range(dim)])
                   .toPandas())
        if counter is not None:
            counter.add("tree")
        codes = pdf["code"].to_numpy(dtype=np.int64)
        order = np.argsort(codes, kind="stable")
        return (codes[order], pdf["n"].to_numpy(dtype=np.int64)[order],
                pdf[[f"s{j}" for j in range(dim)]].to_numpy(dtype=np.int64).reshape(-1, dim)[order])

    return aggregate


@dataclass
class Coreset:
    """The released coreset (unit space) and what the walk did (released or public values only)."""

    points: np.ndarray
    weights: np.ndarray
    noisy_n: float
    depth: int
    tau: float
    levels_used: int
    leaf_nodes: list = field(default_factory=list)  # (level, prefix) of every leaf, in the order of ``points``
    info: dict = field(default_factory=dict)


def depth_for(noisy_n: float, k: int, limit: int) -> int:
    """Levels to walk: about log2(n_hat / 2k) (leaves of ~2k points at an even split), within [2, limit]."""
    target = math.log2(max(noisy_n, 1.0) / (2.0 * k)) if noisy_n > 2 * k else 1.0
    return int(min(limit, max(2, math.floor(target))))


def _level_table(codes, counts, sums, top: int, level: int):
    """Exact counts and sums of the level-``level`` nodes (prefixes of the depth-``top`` codes): sorted prefixes."""
    prefix = codes >> (top - level)
    starts = np.flatnonzero(np.concatenate([[True], prefix[1:] != prefix[:-1]])) if prefix.size else np.zeros(0, dtype=np.int64)
    if not prefix.size:
        return prefix, counts, sums
    return prefix[starts], np.add.reduceat(counts, starts), np.add.reduceat(sums, starts, axis=0)


def _lookup(table_prefix: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """values of the wanted prefixes (0 / zero rows for prefixes with no point)."""
    out = np.zeros((wanted.size,) + values.shape[1:], dtype=np.int64)
    if table_prefix.size and wanted.size:
        pos = np.searchsorted(table_prefix, wanted)
        pos_c = np.minimum(pos, table_prefix.size - 1)
        hit = table_prefix[pos_c] == wanted
        out[hit] = values[pos_c[hit]]
    return out


def private_coreset(aggregate, domain: Domain, k: int, eps_root: float, split, accountant: Accountant,
                    rng: np.random.Generator, label: str = "auto") -> Coreset:
    """Walk the tree on noisy counts and release the leaves' noisy means (see the module docstring).

    ``split(noisy_n) -> (eps_tree, eps_sums)`` sets the rest of the budget from the released row
    count (adaptive composition: a function of released values only). Charges exactly
    eps_root + eps_tree + eps_sums (levels not walked go to the sums); returns the coreset.
    """
    dim = domain.dim
    top = max_depth(dim)
    normals, offsets = draw_planes(rng, top, dim)  # public: drawn before the data is read
    w, b = fixed_planes(normals, offsets)
    codes, counts, sums = aggregate(w, b)  # exact, per deepest path, sorted by code

    count_mech = LaplaceMechanism(eps_root, sensitivity=1.0)
    noisy_n = float(accountant.laplace(f"{label}: noisy row count (tree root)", np.array([int(counts.sum())]), count_mech)[0])
    eps_tree, eps_sums = split(noisy_n)
    depth = depth_for(noisy_n, k, top)
    eps_level = eps_tree / depth
    tau = max(TAU_NOISE_SCALES / eps_level, TAU_SUM_FACTOR * dim / eps_sums, 2.0)
    level_mech = LaplaceMechanism(eps_level, sensitivity=1.0)

    frontier = np.zeros(1, dtype=np.int64)  # kept nodes at the current level (prefixes), the root
    frontier_noisy = np.array([noisy_n])
    leaves: list[tuple[int, np.ndarray, np.ndarray]] = []  # (level, prefixes, noisy counts)
    levels_used = 0
    tables: dict[int, tuple] = {}  # level -> its exact (prefixes, counts, sums), each built once

    def table(level: int):
        if level not in tables:
            tables[level] = _level_table(codes, counts, sums, top, level)
        return tables[level]

    for level in range(1, depth + 1):
        prefix, level_counts, _ = table(level)
        children = np.stack([2 * frontier, 2 * frontier + 1], axis=1).reshape(-1)
        exact = _lookup(prefix, level_counts, children)
        noisy = accountant.laplace(f"{label}: tree level {level}/{depth} counts", exact, level_mech).astype(np.float64)
        levels_used += 1
        kept = noisy >= tau
        parent_kept_child = kept.reshape(-1, 2).any(axis=1)
        if (~parent_kept_child).any():
            leaves.append((level - 1, frontier[~parent_kept_child], frontier_noisy[~parent_kept_child]))
        frontier, frontier_noisy = children[kept], noisy[kept]
        if not frontier.size:
            break
    if frontier.size:
        leaves.append((levels_used, frontier, frontier_noisy))

    # One release of every leaf's coordinate sums (leaves are disjoint: L1 sensitivity d).
    parts = []
    for lv, pre, _ in leaves:
        level_prefix, _, level_sums = table(lv)
        parts.append(_lookup(level_prefix, level_sums, pre))
    exact_sums = np.concatenate(parts).reshape(-1, dim)
    leaf_noisy = np.concatenate([nn for _, _, nn in leaves])
    # Tree levels not walked were never charged: their budget goes to the sums, so the coreset
    # always spends exactly eps_root + eps_tree + eps_sums.
    sum_mech = LaplaceMechanism(eps_sums + (depth - levels_used) * eps_level, sensitivity=float(dim), unit=1.0 / SCALE)
    noisy_sums = accountant.laplace(f"{label}: leaf sums", exact_sums, sum_mech).astype(np.float64) / SCALE
    # Post-processing.
    weights = np.maximum(leaf_noisy, 0.0)
    means = domain.clip_unit(noisy_sums / np.maximum(leaf_noisy, 1.0)[:, None])
    info = {"noisy_rows": noisy_n, "depth": depth, "levels_used": levels_used, "split_threshold": tau,
            "leaves": int(weights.size), "max_depth": top}
    nodes = [(int(lv), int(p)) for lv, pre, _ in leaves for p in pre]
    return Coreset(points=means, weights=weights, noisy_n=noisy_n, depth=depth, tau=tau, levels_used=levels_used,
                   leaf_nodes=nodes, info=info)
