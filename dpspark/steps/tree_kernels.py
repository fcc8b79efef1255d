"""Executor kernel of the LSH tree (numpy only; the executors run it), shared by auto's tree route
and maxcover's tree candidates (``dpspark.steps.tree``).

A point's path in the tree is its bit string under ``depth`` PUBLIC random
hyperplanes: bit m is 1 when <w_m, x> > b_m. Everything is exact integer
arithmetic on the fixed-point point (``fixedpoint.quantize``: NaN -> 0, clamped
to [-1, 1]), so the bits of a record depend only on that record and the public
hyperplanes (never on which other records share its batch, never on BLAS
blocking), and the Spark pass agrees bit for bit with the numpy reference.

Integer bounds: |q_j| <= 2**20 and |W_mj| <= 2**20 (unit normals), so one product
is at most 2**40 and a dot product at most d * 2**40 < 2**63 for d < 2**23.
"""

from __future__ import annotations

import numpy as np

from dpspark.kernels import batch_points
from dpspark.privacy.fixedpoint import SCALE, quantize

PLANE_BITS = 20  # hyperplane normals in fixed point (the same resolution as the points)
MAX_DIM = 1 << 22  # the dot products stay far below 2**63


def fixed_planes(normals: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Public hyperplanes (unit normals (depth, d), offsets (depth,)) -> exact integers for the kernel."""
    normals = np.asarray(normals, dtype=np.float64)
    if normals.ndim != 2 or normals.shape[1] > MAX_DIM or not np.all(np.abs(normals) <= 1.0):
        raise ValueError("hyperplane normals must be a (depth, d) array with entries in [-1, 1]")
    w = np.rint(normals * (1 << PLANE_BITS)).astype(np.int64)
    b = np.rint(np.asarray(offsets, dtype=np.float64) * float(SCALE) * float(1 << PLANE_BITS)).astype(np.int64)
    return w, b


def leaf_codes(fixed_points: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The depth-bit path of every fixed-point point as one int64 (first hyperplane = most significant bit)."""
    depth = w.shape[0]
    codes = np.zeros(fixed_points.shape[0], dtype=np.int64)
    for m in range(depth):
        bit = (fixed_points @ w[m]) > b[m]  # int64 matmul: exact
        codes = (codes << 1) | bit.astype(np.int64)
    return codes


def leaf_aggregates(fixed_points: np.ndarray, w: np.ndarray, b: np.ndarray):
    """(codes (c,), exact counts (c,), exact fixed-point sums (c, d)) per distinct deepest path, sorted by code."""
    dim = w.shape[1]
    if fixed_points.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.int64)
    return _reduce(leaf_codes(fixed_points, w, b), np.ones(fixed_points.shape[0], dtype=np.int64), fixed_points)


def _reduce(codes: np.ndarray, counts: np.ndarray, sums: np.ndarray):
    """Add up rows with equal codes: int64 sums after a stable sort (exact, no float accumulation)."""
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
    return (codes[starts], np.add.reduceat(counts[order], starts),
            np.add.reduceat(np.asarray(sums, dtype=np.int64)[order], starts, axis=0))


def tree_aggregator(w: np.ndarray, b: np.ndarray, columns: list[str]):
    """The tree pass's function of a partition's batches (Arrow or pandas, ``batch_points``): exact
    per-partition aggregates per deepest path, as one pandas frame (``arrow_out`` makes it Arrow)."""
    w = np.asarray(w, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    dim = w.shape[1]

    def aggregate(batches):
        import pandas as pd

        parts = []
        for batch in batches:
            if len(batch) == 0:
                continue
            q = quantize(batch_points(batch, columns, dim))  # bounded fixed point, NaN -> 0
            parts.append(leaf_aggregates(q, w, b))
        if not parts:
            return
        uniq, counts, sums = _reduce(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                     np.concatenate([p[2] for p in parts]))
        out = {"code": uniq, "n": counts}
        for j in range(dim):
            out[f"s{j}"] = sums[:, j]
        yield pd.DataFrame(out)

    return aggregate
