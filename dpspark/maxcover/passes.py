"""The Spark passes of the maxcover family: executors aggregate exactly, the driver decides.

Every pass runs ``mapInPandas`` over the clipped unit-space points (columns
``_u0.._u{d-1}`` from ``dpspark.tables.prepare_points``), works on whole Arrow
batches with numpy (chunked so that no temporary exceeds about 4 million float64
cells, whatever the batch size), and emits exact integer partial aggregates. The
driver (or a Spark ``groupBy().sum()`` on LONG columns) adds them as integers:
exact and independent of the partitioning and of the order partitions arrive in.
No noise is drawn here.

Distances use the same elementwise rule as ``dpspark.maxcover.core``
(``_sq_dists``: explicit differences, squared and summed per entry), so whether a
point is covered and its cover signature depend only on that point and public
values (never on which other points share its batch), and the Spark passes agree
bit for bit with the numpy reference.

Passes (each one Spark job over the data):

- :meth:`SparkCoverage.histogram` (one per threshold): the uncovered points'
  cover-signature histogram. A signature is the packed bitset
  (``numpy.packbits``) of the candidates within the threshold, used as a binary
  key; each partition counts its keys in a dict, Spark sums the counts per key
  (``groupBy(sig).sum(n)``) and at most ``max_signatures + 1`` rows are
  collected, so the driver never holds more than the bound.
- :meth:`SparkCoverage.pick_scores` (fallback, one per pick): the exact coverage
  count of every candidate over the still-uncovered points.
- :func:`snap_counts` (one, at the end): the number of points whose nearest chosen
  center is each center (ties to the lowest index).
- :func:`cell_aggregates` (private candidates, one for all scales): per
  randomly shifted grid cell, the exact count and the exact fixed-point sums of
  the offsets of its points from the cell center.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from dpspark.maxcover.core import PerPickScores, _chunk_rows, _cost_from_sq, _sq_dists
from dpspark.privacy.fixedpoint import SCALE
from dpspark.progress import step

log = logging.getLogger("dpspark")

# Rows per pandas DataFrame a partition yields (keeps Arrow batches moderate).
_YIELD_ROWS = 200_000


class PassCounter:
    """Counts Spark passes over the private data (reported as ``spark_passes``)."""

    def __init__(self):
        self.passes = 0
        self.by_kind: dict[str, int] = {}

    def add(self, kind: str) -> None:
        self.passes += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1


# ----------------------------------------------------------------------------
# Executor-side helpers (pure numpy; shipped to the executors in closures)
#
# Speed without changing a single bit of the result: each Arrow batch is put in
# Z-order (Morton code of its coordinates) and cut into small chunks, so a chunk's
# points are close together; a candidate (or an earlier pick) whose distance to the
# chunk's bounding box already exceeds the threshold is skipped for that chunk.
# The box distance is computed by the same float operations as ``_sq_dists``
# (difference, square, sum over the dimensions in order), which are monotone in
# every |x_j - c_j|, so box cost > t implies point cost > t for every point of the
# chunk: the skipped entries are exactly entries that would have compared false.
# The entries that are computed are computed as in ``core._sq_dists``, per entry.

_PRUNE_ROWS = 512  # points per chunk for the bounding-box pruning


def _morton_order(x: np.ndarray) -> np.ndarray:
    """A permutation putting unit-space points in Z-order (only the order of work changes)."""
    n, dim = x.shape
    dd = min(dim, 63)
    bits = max(1, min(16, 63 // dd))
    q = np.clip(((x[:, :dd] + 1.0) * (0.5 * (1 << bits))).astype(np.int64), 0, (1 << bits) - 1)
    code = np.zeros(n, dtype=np.int64)
    for b in range(bits - 1, -1, -1):
        for j in range(dd):
            code = (code << 1) | ((q[:, j] >> b) & 1)
    return np.argsort(code, kind="stable")


def _box_cost(lo: np.ndarray, hi: np.ndarray, pts: np.ndarray, p: int) -> np.ndarray:
    """Lower bound of dist(x, pt)^p over the box [lo, hi], by the float operations of ``_sq_dists``."""
    gap = np.maximum(np.maximum(lo[None, :] - pts, pts - hi[None, :]), 0.0)
    d2 = np.zeros(pts.shape[0], dtype=np.float64)
    for j in range(pts.shape[1]):
        d2 += gap[:, j] * gap[:, j]
    return _cost_from_sq(d2, p)


def _chunks(x: np.ndarray, rows: int):
    """Z-ordered chunks of a batch of points."""
    x = x[_morton_order(x)]
    for start in range(0, x.shape[0], rows):
        yield x[start : start + rows]


def _drop_covered(xc: np.ndarray, pick_pts: np.ndarray, pick_t: np.ndarray, p: int) -> np.ndarray:
    """The rows of ``xc`` not covered by any (pick point, threshold): covered means dist^p <= t."""
    if pick_pts.shape[0] == 0 or xc.shape[0] == 0:
        return xc
    near = np.flatnonzero(_box_cost(xc.min(axis=0), xc.max(axis=0), pick_pts, p) <= pick_t)
    if not near.size:
        return xc
    cost = _cost_from_sq(_sq_dists(xc, pick_pts[near]), p)
    return xc[~np.any(cost <= pick_t[near][None, :], axis=1)]


def _within(xc: np.ndarray, candidates: np.ndarray, t: float, p: int):
    """(ids of the candidates that may be within t of the chunk, bool matrix rows x those ids: cost <= t)."""
    keep = np.flatnonzero(_box_cost(xc.min(axis=0), xc.max(axis=0), candidates, p) <= t)
    if not keep.size:
        return keep, None
    return keep, _cost_from_sq(_sq_dists(xc, candidates[keep]), p) <= t


def _batches_of_points(batches, columns):
    for pdf in batches:
        if len(pdf):
            yield pdf[columns].to_numpy(dtype=np.float64)


def _chunk_size(n_cols: int, dim: int) -> int:
    return max(1, min(_PRUNE_ROWS, _chunk_rows(n_cols, dim)))


def signature_aggregator(candidates, pick_pts, pick_t, t: float, p: int, columns: list[str], chunk_rows: int | None = None):
    """``mapInPandas`` function: (signature key, exact count) rows of one partition's uncovered points.

    The key is ``numpy.packbits`` of the point's row of the (candidates within t)
    indicator: a canonical, fixed-length bytes value per signature. Points with an
    empty signature are left out.
    """
    candidates = np.ascontiguousarray(candidates, dtype=np.float64)
    n_cand, dim = candidates.shape
    pick_pts = np.ascontiguousarray(pick_pts, dtype=np.float64).reshape(-1, dim)
    pick_t = np.asarray(pick_t, dtype=np.float64).reshape(-1)
    n_bytes = (n_cand + 7) // 8
    rows = chunk_rows or _chunk_size(n_cand, dim)

    def run(batches):
        import pandas as pd

        agg: dict[bytes, int] = {}
        for x in _batches_of_points(batches, columns):
            packed_parts = []
            for xc in _chunks(x, rows):
                xc = _drop_covered(xc, pick_pts, pick_t, p)
                if not xc.shape[0]:
                    continue
                keep, within = _within(xc, candidates, t, p)
                if within is None:
                    continue
                hit = within.any(axis=1)
                if not hit.any():
                    continue
                full = np.zeros((int(hit.sum()), n_cand), dtype=bool)
                full[:, keep] = within[hit]
                packed_parts.append(np.packbits(full, axis=1))
            if not packed_parts:
                continue
            packed = np.ascontiguousarray(np.concatenate(packed_parts))
            keys, counts = np.unique(packed.view(np.dtype((np.void, n_bytes))).reshape(-1), return_counts=True)
            for key, c in zip(keys.tolist(), counts.tolist()):
                agg[key] = agg.get(key, 0) + c
        items = list(agg.items())
        for start in range(0, len(items), _YIELD_ROWS):
            part = items[start : start + _YIELD_ROWS]
            yield pd.DataFrame({"sig": [kv[0] for kv in part], "n": np.array([kv[1] for kv in part], dtype=np.int64)})

    return run


def score_aggregator(candidates, pick_pts, pick_t, t: float, p: int, columns: list[str], chunk_rows: int | None = None):
    """``mapInPandas`` function: exact per-candidate coverage counts of one partition's uncovered points."""
    candidates = np.ascontiguousarray(candidates, dtype=np.float64)
    n_cand, dim = candidates.shape
    pick_pts = np.ascontiguousarray(pick_pts, dtype=np.float64).reshape(-1, dim)
    pick_t = np.asarray(pick_t, dtype=np.float64).reshape(-1)
    rows = chunk_rows or _chunk_size(n_cand, dim)

    def run(batches):
        import pandas as pd

        scores = np.zeros(n_cand, dtype=np.int64)
        for x in _batches_of_points(batches, columns):
            for xc in _chunks(x, rows):
                xc = _drop_covered(xc, pick_pts, pick_t, p)
                if not xc.shape[0]:
                    continue
                keep, within = _within(xc, candidates, t, p)
                if within is not None:
                    scores[keep] += within.sum(axis=0, dtype=np.int64)
        yield pd.DataFrame({"cand": np.arange(n_cand, dtype=np.int32), "n": scores})

    return run


def snap_aggregator(centers, columns: list[str], chunk_rows: int):
    """``mapInPandas`` function: exact number of points per nearest center (ties to the lowest index)."""
    centers = np.ascontiguousarray(centers, dtype=np.float64)
    k = centers.shape[0]

    def run(batches):
        import pandas as pd

        counts = np.zeros(k, dtype=np.int64)
        for x in _batches_of_points(batches, columns):
            for start in range(0, x.shape[0], chunk_rows):
                nearest = np.argmin(_sq_dists(x[start : start + chunk_rows], centers), axis=1)
                counts += np.bincount(nearest, minlength=k).astype(np.int64)
        yield pd.DataFrame({"center": np.arange(k, dtype=np.int32), "n": counts})

    return run


def cell_indices(x: np.ndarray, side: float, shift: np.ndarray) -> np.ndarray:
    """Integer cell coordinates of unit-space points in the grid of ``side`` shifted by ``shift``.

    Cell g spans [g*side - 1 - shift, (g+1)*side - 1 - shift) per axis; its center is
    (g + 1/2)*side - 1 - shift. Same formula on the driver and the executors.
    """
    return np.floor((x + 1.0 + shift[None, :]) / side).astype(np.int64)


def cell_centers(g: np.ndarray, side: float, shift: np.ndarray) -> np.ndarray:
    return (g.astype(np.float64) + 0.5) * side - 1.0 - shift[None, :]


def offset_limit(side: float) -> int:
    """Largest |fixed-point offset| of a point from its cell center: floor(side/2 * SCALE)."""
    return int(np.floor(side / 2.0 * SCALE))


def cell_aggregator(sides: Sequence[float], shifts: Sequence[np.ndarray], columns: list[str], chunk_rows: int):
    """``mapInPandas`` function: per (scale, non-empty cell) the exact count and fixed-point offset sums.

    A point's offset from its cell center is clipped to [-side/2, side/2] per
    coordinate (it lies there up to rounding) and quantized to fixed point
    (|q| <= offset_limit(side)), so one point changes one cell's sums by at most
    offset_limit(side) per coordinate. Cells are keyed by their int32 coordinates
    as bytes; only non-empty cells appear.
    """
    sides = [float(s) for s in sides]
    shifts = [np.asarray(s, dtype=np.float64) for s in shifts]
    dim = shifts[0].shape[0]

    def run(batches):
        import pandas as pd

        aggs: list[dict[bytes, np.ndarray]] = [dict() for _ in sides]
        for x in _batches_of_points(batches, columns):
            for level, (side, shift) in enumerate(zip(sides, shifts)):
                g = cell_indices(x, side, shift)
                lim = offset_limit(side)
                q = np.rint((x - cell_centers(g, side, shift)) * SCALE).astype(np.int64)
                np.clip(q, -lim, lim, out=q)
                keys = np.ascontiguousarray(g.astype(np.int32)).view(np.dtype((np.void, 4 * dim))).reshape(-1)
                uniq, inverse = np.unique(keys, return_inverse=True)
                inverse = inverse.reshape(-1)
                cnt = np.bincount(inverse, minlength=uniq.shape[0]).astype(np.int64)
                sums = np.zeros((uniq.shape[0], dim), dtype=np.int64)
                np.add.at(sums, inverse, q)
                agg = aggs[level]
                for key, c, s in zip(uniq, cnt, sums):
                    kb = key.tobytes()
                    row = agg.get(kb)
                    if row is None:
                        agg[kb] = np.concatenate([[c], s])
                    else:
                        row[0] += c
                        row[1:] += s
        for level, agg in enumerate(aggs):
            if not agg:
                continue
            keys = list(agg.keys())
            vals = np.array(list(agg.values()), dtype=np.int64).reshape(len(keys), dim + 1)
            out = {"level": np.full(len(keys), level, dtype=np.int32), "cell": keys, "n": vals[:, 0]}
            for j in range(dim):
                out[f"s{j}"] = vals[:, j + 1]
            yield pd.DataFrame(out)

    return run


# ----------------------------------------------------------------------------
# Driver side


def _keys_to_csr(keys: list[bytes], n_candidates: int, chunk: int = 65_536) -> sp.csr_matrix:
    """Incidence matrix of packed-bitset signature keys (chunked unpacking, bounded memory)."""
    n_bytes = (n_candidates + 7) // 8
    if not keys:
        return sp.csr_matrix((0, n_candidates), dtype=np.int8)
    parts = []
    for start in range(0, len(keys), chunk):
        block = np.frombuffer(b"".join(keys[start : start + chunk]), dtype=np.uint8).reshape(-1, n_bytes)
        bits = np.unpackbits(block, axis=1, count=n_candidates).astype(bool)
        parts.append(sp.csr_matrix(bits, dtype=np.int8))
    return sp.vstack(parts, format="csr")


class SparkCoverage:
    """The coverage loop's data access on Spark: a signature provider for ``core.run_coverage``.

    ``df`` holds the unit-space points (persist it: one pass per threshold reads it),
    ``candidates`` the public candidates in unit space, ``thresholds`` on the cost
    scale d^p. Calling it for threshold i runs ONE Spark pass and returns the
    signature histogram as (CSR incidence, int64 counts); if the histogram has more
    than ``max_signatures`` distinct signatures it returns a ``PerPickScores`` so
    that the threshold runs exact per-pick passes instead (logged).
    """

    def __init__(self, df, columns: list[str], candidates, thresholds, p: int, max_signatures: int,
                 counter: PassCounter | None = None, timings: dict | None = None):
        self.df = df
        self.columns = list(columns)
        self.candidates = np.ascontiguousarray(candidates, dtype=np.float64)
        self.thresholds = np.asarray(thresholds, dtype=np.float64).reshape(-1)
        self.p = int(p)
        self.max_signatures = int(max_signatures)
        self.counter = counter or PassCounter()
        self.timings = timings
        self.fallback_thresholds: list[int] = []
        self.histogram_sizes: list[int] = []

    def _picks(self, covered_picks, extra: Sequence[int] = (), extra_t: float | None = None):
        ids = [int(c) for c, _ in covered_picks] + [int(c) for c in extra]
        ts = [float(self.thresholds[int(j)]) for _, j in covered_picks] + [float(extra_t or 0.0)] * len(extra)
        return self.candidates[np.array(ids, dtype=np.int64)].reshape(-1, self.candidates.shape[1]), np.array(ts, dtype=np.float64)

    def histogram(self, i: int, covered_picks) -> tuple[list[bytes], np.ndarray] | None:
        """One pass: {signature key: count} of the uncovered points at threshold i, or None if too large."""
        from pyspark.sql import functions as F

        pick_pts, pick_t = self._picks(covered_picks)
        fn = signature_aggregator(self.candidates, pick_pts, pick_t, float(self.thresholds[i]), self.p, self.columns)
        with step(f"maxcover pass: signature histogram, threshold {i + 1}/{self.thresholds.size}", self.timings):
            pdf = (
                self.df.mapInPandas(fn, "sig BINARY, n LONG")
                .groupBy("sig").agg(F.sum("n").alias("n"))
                .limit(self.max_signatures + 1)
                .toPandas()
            )
            self.counter.add("signature histogram")
        if len(pdf) > self.max_signatures:
            return None
        return [bytes(k) for k in pdf["sig"]], pdf["n"].to_numpy(dtype=np.int64)

    def pick_scores(self, i: int, covered_picks, threshold_picks: Sequence[int]) -> np.ndarray:
        """One pass: exact coverage count per candidate at threshold i, given all picks so far."""
        t = float(self.thresholds[i])
        pick_pts, pick_t = self._picks(covered_picks, threshold_picks, t)
        fn = score_aggregator(self.candidates, pick_pts, pick_t, t, self.p, self.columns)
        with step(f"maxcover pass: exact pick scores, threshold {i + 1}, pick {len(threshold_picks) + 1}", self.timings):
            parts = self.df.mapInPandas(fn, "cand INT, n LONG").toPandas()
            self.counter.add("pick scores (fallback)")
        scores = np.zeros(self.candidates.shape[0], dtype=np.int64)
        if len(parts):
            np.add.at(scores, parts["cand"].to_numpy(dtype=np.int64), parts["n"].to_numpy(dtype=np.int64))
        return scores

    def __call__(self, i: int, covered_picks):
        hist = self.histogram(i, covered_picks)
        if hist is None:
            log.warning(
                "maxcover: threshold %d has more than max_signatures=%d distinct cover signatures; "
                "falling back to exact per-pick passes for this threshold (one pass over the data per pick: slow "
                "at large n in high dimension; a smaller algorithm.candidate_count or a larger "
                "algorithm.max_signatures, with driver memory to match, avoids it)", i + 1, self.max_signatures,
            )
            self.fallback_thresholds.append(i)
            self.histogram_sizes.append(-1)
            frozen = tuple(covered_picks)
            return PerPickScores(lambda threshold_picks: self.pick_scores(i, frozen, threshold_picks))
        keys, counts = hist
        self.histogram_sizes.append(len(keys))
        return _keys_to_csr(keys, self.candidates.shape[0]), counts


def snap_counts(df, columns: list[str], centers, counter: PassCounter | None = None, timings: dict | None = None) -> np.ndarray:
    """One pass: exact int64 number of points whose nearest center (unit space) is each center."""
    centers = np.ascontiguousarray(centers, dtype=np.float64)
    k, dim = centers.shape
    fn = snap_aggregator(centers, columns, _chunk_rows(k, dim))
    with step("maxcover pass: snap points to the chosen centers", timings):
        parts = df.mapInPandas(fn, "center INT, n LONG").toPandas()
        if counter is not None:
            counter.add("snap")
    counts = np.zeros(k, dtype=np.int64)
    if len(parts):
        np.add.at(counts, parts["center"].to_numpy(dtype=np.int64), parts["n"].to_numpy(dtype=np.int64))
    return counts


def cell_aggregates(df, columns: list[str], sides: Sequence[float], shifts: Sequence[np.ndarray], min_count: int = 1,
                    counter: PassCounter | None = None, timings: dict | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One pass for all scales: per scale (cell coordinates int64 (c, d), exact counts (c,), exact fixed-point sums (c, d)).

    Only cells with an exact count >= ``min_count`` (public) appear; the filter runs on the
    executors, so the driver only receives those. Rows are sorted by cell coordinates, so the order
    (and with a seeded noise source the draws) does not depend on the partitioning.
    """
    from pyspark.sql import functions as F

    dim = len(columns)
    fn = cell_aggregator(sides, shifts, columns, 1 << 16)
    schema = "level INT, cell BINARY, n LONG, " + ", ".join(f"s{j} LONG" for j in range(dim))
    with step(f"maxcover pass: grid cell counts at {len(sides)} scales", timings):
        pdf = (
            df.mapInPandas(fn, schema)
            .groupBy("level", "cell")
            .agg(F.sum("n").alias("n"), *[F.sum(f"s{j}").alias(f"s{j}") for j in range(dim)])
            .where(F.col("n") >= F.lit(int(min_count)))
            .toPandas()
        )
        if counter is not None:
            counter.add("candidate cells")
    out = []
    levels = pdf["level"].to_numpy(dtype=np.int64) if len(pdf) else np.zeros(0, dtype=np.int64)
    for level in range(len(sides)):
        sel = np.flatnonzero(levels == level)
        if not sel.size:
            out.append((np.zeros((0, dim), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.int64)))
            continue
        cells_raw = pdf["cell"].to_numpy()[sel]
        g = np.frombuffer(b"".join(bytes(c) for c in cells_raw), dtype=np.int32).reshape(-1, dim).astype(np.int64)
        n = pdf["n"].to_numpy(dtype=np.int64)[sel]
        s = pdf[[f"s{j}" for j in range(dim)]].to_numpy(dtype=np.int64)[sel]
        order = np.lexsort(g.T[::-1])
        out.append((g[order], n[order], s[order]))
    return out
