"""The executor side of the maxcover passes: numpy only.

Everything here runs inside ``mapInPandas`` or ``mapInArrow`` on the executors, so this module imports
numpy and ``dpspark.privacy.fixedpoint`` only (never scipy, scikit-learn, OpenDP or
pyspark) and reads nothing from the driver's filesystem: every public value it needs
(candidates, thresholds, picks, grid shifts) is an argument captured in the returned
closure and shipped with the task. ``tests/test_cluster.py`` runs it on executors
whose Python holds only numpy, pandas and pyarrow, and also checks the import rule
without a cluster.

The distance rule (``_sq_dists``, in ``dpspark.kernels`` below every family) is shared with the
driver-side numpy reference in ``dpspark.maxcover.core``, so both agree bit for bit;
``nearest_center`` (the same rule) also labels dplloyd's points (``dpspark.steps.lloyd_kernels.assign``)
and ``ClusteringModel.transform``'s rows. Every batch read goes through ``sanitize_unit``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpspark.kernels import _SCREEN_MIN_DIM, _SCREEN_ROWS, _per_entry_nearest, _sq_dists, nearest_center  # noqa: F401 (shared rule)
from dpspark.kernels import PACKED_COLUMN, arrow_out, batch_points, packed_batch  # noqa: F401 (shared; the passes import arrow_out here)
from dpspark.privacy.fixedpoint import SCALE, sanitize_unit

# Upper bound on the number of float64 cells one chunk of a distance computation may use.
_CHUNK_CELLS = 4_000_000

# Rows per pandas DataFrame a partition yields (keeps Arrow batches moderate).
_YIELD_ROWS = 200_000


# ----------------------------------------------------------------------------
# Distances (the same rule everywhere so that implementations agree)


def _chunk_rows(n_cols: int, dim: int) -> int:
    """Rows per chunk so that the two (rows x n_cols) float64 temporaries of ``_sq_dists`` stay bounded."""
    return max(1, _CHUNK_CELLS // max(1, 2 * n_cols))


def _cost_from_sq(d2: np.ndarray, p: int) -> np.ndarray:
    if p == 2:
        return d2
    if p == 1:
        return np.sqrt(d2)
    return d2 ** (p / 2.0)


# ----------------------------------------------------------------------------
# Bounding-box pruning
#
# Speed without changing a single bit of the result: each Arrow batch is put in
# Z-order (Morton code of its coordinates) and cut into small chunks, so a chunk's
# points are close together; a candidate (or an earlier pick) whose distance to the
# chunk's bounding box already exceeds the threshold is skipped for that chunk.
# The box distance is computed by the same float operations as ``_sq_dists``
# (difference, square, sum over the dimensions in order), which are monotone in
# every |x_j - c_j|, so box cost > t implies point cost > t for every point of the
# chunk: the skipped entries are exactly entries that would have compared false.
# The entries that are computed are computed by ``_sq_dists``, per entry.

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
    return xc[~np.any(cost_within(xc, pick_pts[near], pick_t[near], p), axis=1)]


def _per_entry_within(x: np.ndarray, pts: np.ndarray, t: np.ndarray, p: int) -> np.ndarray:
    return _cost_from_sq(_sq_dists(x, pts), p) <= t[None, :]


# Relative slack around t^(2/p) for p != 2: covers the rounding of that power and of the cost's own
# power (a few ulps), so the screen never decides an entry whose rule could go either way.
_POWER_SLACK = 1e-9


def cost_within(x: np.ndarray, pts: np.ndarray, t, p: int, screen_factor: float | None = None) -> np.ndarray:
    """Bool (rows x pts): ``_cost_from_sq(_sq_dists(x, pts), p) <= t`` (the rule), entry for entry.

    ``t``: one threshold, or one per column of ``pts``. From ``_SCREEN_MIN_DIM`` dimensions a BLAS
    product screens the entries, as in ``_screened_nearest``: with e the rule's squared distance and
    a = |x|^2 - 2 x.c + |c|^2 from the product, |a - e| <= 2 g (|x| + |c|)^2 (g = gamma_{d+3}), so an
    entry with a <= T - m is within and one with a > T + m is not, for the margin m = 4 g (max |x| +
    max |c|)^2 over the block (twice the bound) and T = t on the squared scale (t^(2/p) with a relative slack of
    ``_POWER_SLACK`` when p != 2). A row with any other entry, a value that is not finite or a
    norm below 1e-100 is decided by the rule itself, so the result is the rule's bit for bit.
    ``screen_factor`` replaces 4 g (tests only: 0 shows the margin matters).
    """
    return cost_within_each(x, pts, [t], p, screen_factor)[0]


def cost_within_each(x: np.ndarray, pts: np.ndarray, ts, p: int, screen_factor: float | None = None) -> list[np.ndarray]:
    """``[cost_within(x, pts, t, p) for t in ts]``, bit for bit, from one distance computation.

    The BLAS product (or, below ``_SCREEN_MIN_DIM`` dimensions, the rule's distances) is computed
    once and compared with every threshold; a row the screen leaves undecided for any threshold
    gets the rule's own distances, once, compared with every threshold (the screen is exact where it
    decides, so the rule gives those rows the same answer). Each ``t`` is one threshold or one per
    column of ``pts``.
    """
    x = np.asarray(x, dtype=np.float64)
    pts = np.asarray(pts, dtype=np.float64)
    ts = [np.broadcast_to(np.asarray(t, dtype=np.float64).reshape(-1), (pts.shape[0],)) for t in ts]
    if x.shape[1] < _SCREEN_MIN_DIM or x.shape[0] == 0 or pts.shape[0] == 0:
        cost = _cost_from_sq(_sq_dists(x, pts), p)
        return [cost <= t[None, :] for t in ts]
    dim = x.shape[1]
    u = 2.0 ** -53
    g = (dim + 3) * u / (1.0 - (dim + 3) * u)
    factor = 4.0 * g * (1.0 + 1e-6) if screen_factor is None else screen_factor
    with np.errstate(all="ignore"):
        c_sq = np.einsum("ij,ij->i", pts, pts)
        c_norm = float(np.sqrt(c_sq.max())) if np.all(np.isfinite(c_sq)) else np.inf
        bounds = []
        for t in ts:
            if p == 2:
                bounds.append((t, t))
            else:
                t_sq = t ** (2.0 / p)
                bounds.append((t_sq * (1.0 - _POWER_SLACK), t_sq * (1.0 + _POWER_SLACK)))
        finite_t = all(bool(np.all(np.isfinite(t))) for t in ts)
        outs = [np.empty((x.shape[0], pts.shape[0]), dtype=bool) for _ in ts]
        for start in range(0, x.shape[0], _SCREEN_ROWS):
            xs = x[start : start + _SCREEN_ROWS]
            x_sq = np.einsum("ij,ij->i", xs, xs)
            norms = np.sqrt(x_sq) + c_norm
            bad = ~np.isfinite(norms) | (norms < 1e-100)
            # one margin for the block: the largest row's (a wider margin only leaves more to the rule)
            margin = factor * float(norms[~bad].max()) ** 2 if not bad.all() else np.inf
            approx = xs @ pts.T
            approx *= -2.0
            approx += x_sq[:, None]
            approx += c_sq[None, :]
            undecided = bad | (not finite_t) | (margin == np.inf)
            for (lo, hi), out in zip(bounds, outs):
                inside = approx <= (lo - margin)[None, :]
                not_outside = approx <= (hi + margin)[None, :]
                undecided = undecided | (inside != not_outside).any(axis=1)
                out[start : start + len(xs)] = inside
            if np.any(undecided):
                rows = np.flatnonzero(np.broadcast_to(undecided, (len(xs),)))
                cost = _cost_from_sq(_sq_dists(xs[rows], pts), p)
                for t, out in zip(ts, outs):
                    out[start + rows] = cost <= t[None, :]
    return outs


def _batches_of_points(batches, columns, dim: int | None = None):
    """The (rows x d) float64 points of each non-empty batch (``batch_points``: Arrow or pandas, d double
    columns or the packed one, ``dim`` needed for the latter), through ``sanitize_unit``.

    Second line of defence (``dpspark.privacy.fixedpoint``): NaN -> 0, +-inf -> +-1, clamp into
    [-1, 1]. A NaN row reaching the bounding-box tests would make its whole chunk's box NaN, every
    comparison false, and so remove up to ``_PRUNE_ROWS`` OTHER points from the counts.
    """
    dim = len(columns) if dim is None else dim
    for batch in batches:
        if not len(batch):
            continue
        yield sanitize_unit(batch_points(batch, columns, dim))


def _chunk_size(n_cols: int, dim: int) -> int:
    return max(1, min(_PRUNE_ROWS, _chunk_rows(n_cols, dim)))


def _pack_rows(within: np.ndarray, keep: np.ndarray, n_cand: int) -> np.ndarray:
    """``numpy.packbits`` of the (rows x n_cand) indicator whose columns ``keep`` (distinct ids) are ``within``.

    Bit for bit the packing of the full indicator; when the bounding box kept every candidate,
    ``within`` IS the full indicator and is packed as it is (copying it column by column into a
    zeroed (rows x n_cand) matrix first cost about 1 ms per 512-point chunk at |V| = 1000).
    """
    if keep.shape[0] == n_cand and np.array_equal(keep, np.arange(n_cand)):
        return np.packbits(within, axis=1)
    full = np.zeros((within.shape[0], n_cand), dtype=bool)
    full[:, keep] = within
    return np.packbits(full, axis=1)


def signature_aggregator(candidates, pick_pts, pick_t, t, p: int, columns: list[str], chunk_rows: int | None = None):
    """``mapInPandas`` function: (signature key, exact count) rows of one partition's uncovered points.

    The key is ``numpy.packbits`` of the point's row of the (candidates within t)
    indicator: a canonical, fixed-length bytes value per signature. Points with an
    empty signature are counted under the all-zero key (they add nothing to any
    score; the driver uses their number to size the uncovered set).

    ``t`` may be a sequence of K thresholds (ascending): the key is then the K packed rows, one per
    threshold, end to end (K x ceil(|V| / 8) bytes), each exactly the key ``t`` alone would give,
    from one distance computation (``cost_within_each``); the all-zero key holds the points within
    no threshold. The bounding box prunes with the largest threshold: a candidate farther than it
    from the box is farther than every smaller one.
    """
    candidates = np.ascontiguousarray(candidates, dtype=np.float64)
    n_cand, dim = candidates.shape
    pick_pts = np.ascontiguousarray(pick_pts, dtype=np.float64).reshape(-1, dim)
    pick_t = np.asarray(pick_t, dtype=np.float64).reshape(-1)
    ts = [float(v) for v in np.asarray(t, dtype=np.float64).reshape(-1)]
    if not ts or any(b < a for a, b in zip(ts, ts[1:])):
        raise ValueError(f"thresholds {ts!r} should be one or more, ascending")
    key_bytes = len(ts) * ((n_cand + 7) // 8)
    rows = chunk_rows or _chunk_size(n_cand, dim)

    def run(batches):
        import pandas as pd

        agg: dict[bytes, int] = {}
        empty = 0
        for x in _batches_of_points(batches, columns, dim):
            packed_parts = []
            for xc in _chunks(x, rows):
                xc = _drop_covered(xc, pick_pts, pick_t, p)
                if not xc.shape[0]:
                    continue
                keep = np.flatnonzero(_box_cost(xc.min(axis=0), xc.max(axis=0), candidates, p) <= ts[-1])
                if not keep.size:
                    empty += xc.shape[0]
                    continue
                within = cost_within_each(xc, candidates[keep], ts, p)
                hit = within[-1].any(axis=1)  # within the largest threshold (each smaller one implies it)
                empty += int(xc.shape[0] - hit.sum())
                if not hit.any():
                    continue
                packed = [_pack_rows(w[hit], keep, n_cand) for w in within]
                packed_parts.append(packed[0] if len(packed) == 1 else np.concatenate(packed, axis=1))
            if not packed_parts:
                continue
            packed = np.ascontiguousarray(np.concatenate(packed_parts))
            keys, counts = np.unique(packed.view(np.dtype((np.void, key_bytes))).reshape(-1), return_counts=True)
            for key, c in zip(keys.tolist(), counts.tolist()):
                agg[key] = agg.get(key, 0) + c
        if empty:
            agg[bytes(key_bytes)] = agg.get(bytes(key_bytes), 0) + empty
        items = list(agg.items())
        for start in range(0, len(items), _YIELD_ROWS):
            part = items[start : start + _YIELD_ROWS]
            yield pd.DataFrame({"sig": [kv[0] for kv in part], "n": np.array([kv[1] for kv in part], dtype=np.int64)})

    return run


def uncovered_filter(pick_pts, pick_t, p: int, columns: list[str], chunk_rows: int | None = None, dim: int | None = None):
    """``mapInPandas`` function: the rows (``columns``, as ``sanitize_unit`` reads them) not covered by any pick.

    Covered means dist^p <= t for some (pick point, t): the rule of ``_drop_covered``, entry by
    entry, so a later pass over the kept rows sees exactly the points a pass over all rows would
    keep (``sanitize_unit`` is idempotent). The kept rows come out in the layout they came in: d
    double columns (a pandas frame), or the packed column (``columns == [PACKED_COLUMN]``, ``dim``
    given; an Arrow RecordBatch of lists of ``dim`` values, which ``arrow_out`` passes on).
    """
    packed = list(columns) == [PACKED_COLUMN]
    if packed and dim is None:
        raise ValueError(f"columns={list(columns)}: the packed column needs dim")
    dim = len(columns) if dim is None else int(dim)
    if not packed and dim != len(columns):
        raise ValueError(f"columns={list(columns)} should name dim={dim} columns")
    pick_pts = np.ascontiguousarray(pick_pts, dtype=np.float64).reshape(-1, dim)
    pick_t = np.asarray(pick_t, dtype=np.float64).reshape(-1)
    rows = chunk_rows or _PRUNE_ROWS

    def run(batches):
        import pandas as pd

        for x in _batches_of_points(batches, columns, dim):
            kept = [xc for xc in (_drop_covered(xc, pick_pts, pick_t, p) for xc in _chunks(x, rows)) if xc.shape[0]]
            if kept:
                kept_x = np.concatenate(kept)
                yield packed_batch(kept_x) if packed else pd.DataFrame(kept_x, columns=columns)

    return run


def _signature_rows(column, n_bytes: int) -> np.ndarray:
    """The (rows x n_bytes) uint8 view of an Arrow binary column of fixed-length signature keys (no copy per row)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    if n == 0:
        return np.zeros((0, n_bytes), dtype=np.uint8)
    if column.null_count:
        raise ValueError("a signature key is null")
    off_type = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=off_type)[column.offset : column.offset + n + 1]
    if np.any(np.diff(offsets) != n_bytes):
        raise ValueError(f"signature keys must all be {n_bytes} bytes long")
    data = np.frombuffer(data_buf, dtype=np.uint8)
    return data[int(offsets[0]) : int(offsets[-1])].reshape(n, n_bytes)


def _has_bit(rows: np.ndarray, v: int) -> np.ndarray:
    """Whether candidate v is in each packed signature (``numpy.packbits`` order: big-endian bits)."""
    return (rows[:, v >> 3] & np.uint8(0x80 >> (v & 7))) != 0


def histogram_score_aggregator(n_cand: int, exclude: Sequence[int] = (), require: int | None = None):
    """``mapInArrow`` function over a signature histogram (sig BINARY, n LONG): exact per-candidate scores.

    Sums, over the histogram rows whose signature contains none of ``exclude`` (the candidates
    already picked at this threshold: their points are covered) and, if given, contains
    ``require``, the count times the row's indicator. With ``require`` = the newest pick and
    ``exclude`` = the picks before it, that is exactly what the newest pick newly covers, per
    candidate: subtracted from the scores before that pick it gives the scores after it. The
    same rule as ``core.cover_from_signatures``. One extra row, cand = -1, holds the number of
    points in the rows summed. The products run in float64 (BLAS): every term
    and partial sum is an integer of at most n < 2^53, so the result is exact.
    """
    n_bytes = (int(n_cand) + 7) // 8
    exclude = [int(v) for v in exclude]

    def run(batches):
        import pyarrow as pa

        scores = np.zeros(n_cand, dtype=np.int64)
        total = 0
        for rb in batches:
            if rb.num_rows == 0:
                continue
            rows = _signature_rows(rb.column(0), n_bytes)
            counts = rb.column(1).to_numpy(zero_copy_only=False).astype(np.int64)
            keep = np.ones(rows.shape[0], dtype=bool) if require is None else _has_bit(rows, int(require))
            for v in exclude:
                keep &= ~_has_bit(rows, v)
            if not keep.any():
                continue
            rows, counts = rows[keep], counts[keep]
            total += int(counts.sum())
            for start in range(0, rows.shape[0], 8192):
                bits = np.unpackbits(rows[start : start + 8192], axis=1, count=n_cand).astype(np.float64)
                scores += np.rint(counts[start : start + 8192].astype(np.float64) @ bits).astype(np.int64)
        ids = np.arange(-1, n_cand, dtype=np.int32)  # -1: the number of points in the rows summed
        yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(np.concatenate([[total], scores]))], names=["cand", "n"])

    return run


def snap_aggregator(centers, columns: list[str], chunk_rows: int | None = None):
    """``mapInPandas`` function: exact number of points per nearest center (ties to the lowest index).

    ``chunk_rows`` None (the passes' choice): ``nearest_center``'s BLAS-screened path from
    ``_SCREEN_MIN_DIM`` dimensions on, whose labels are the per-entry rule's bit for bit (at 10^6
    points, d = 50, about 200 chosen centers, local[2]: the pass took 7.9 s per entry); an int forces
    the per-entry rule in chunks of that many rows (tests compare the two).
    """
    centers = np.ascontiguousarray(centers, dtype=np.float64)
    k = centers.shape[0]

    def run(batches):
        import pandas as pd

        counts = np.zeros(k, dtype=np.int64)
        for x in _batches_of_points(batches, columns, centers.shape[1]):
            counts += np.bincount(nearest_center(x, centers, chunk_rows), minlength=k).astype(np.int64)
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


def _cell_key_layout(side: float, shift: np.ndarray) -> tuple[int, int] | None:
    """(bits per coordinate, offset) that pack a cell's d coordinates into one int64 key, or None.

    Public (side and shift only). A coordinate is floor((x + 1 + shift_j) / side) with x in [-1, 1]
    (the batches go through ``sanitize_unit``): within [floor(shift_j / side), floor((2 + shift_j) / side)]
    up to the rounding of the division, so [lo, hi] = one more on either side of the extremes over j
    holds every value; coordinate - lo takes ``bits`` bits, at most 62 in all, else None.
    """
    shift = np.asarray(shift, dtype=np.float64)
    if not (side > 0) or not np.all(np.isfinite(shift)) or not np.isfinite(2.0 / side):
        return None
    lo_f, hi_f = np.floor(shift.min() / side) - 1.0, np.floor((2.0 + shift.max()) / side) + 1.0
    if not (abs(lo_f) < 2.0**52 and abs(hi_f) < 2.0**52):
        return None
    lo, hi = int(lo_f), int(hi_f)
    bits = (hi - lo).bit_length()
    return (bits, lo) if bits * shift.shape[0] <= 62 else None


def _pack_cells(g: np.ndarray, layout: tuple[int, int]) -> np.ndarray:
    """One int64 key per row of cell coordinates g (rows x d): g_j - lo in bits [bits j, bits (j + 1))."""
    bits, lo = layout
    v = g.astype(np.int64) - np.int64(lo)
    if v.size and (v.min() < 0 or v.max() >= (1 << bits)):
        raise AssertionError("a cell coordinate is outside the range its key packs")  # cannot happen: see _cell_key_layout
    key = np.zeros(g.shape[0], dtype=np.int64)
    for j in range(g.shape[1]):
        key |= v[:, j] << np.int64(bits * j)
    return key


def _unpack_cells(key: np.ndarray, layout: tuple[int, int], dim: int) -> np.ndarray:
    """The (rows x d) int64 cell coordinates of packed keys (inverse of ``_pack_cells``)."""
    bits, lo = layout
    mask = np.int64((1 << bits) - 1)
    out = np.empty((key.shape[0], dim), dtype=np.int64)
    for j in range(dim):
        out[:, j] = ((key >> np.int64(bits * j)) & mask) + np.int64(lo)
    return out


def _group_sums(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of the consecutive row groups of int64 ``a`` that begin at ``starts`` (sorted, starts[0] = 0).

    Prefix sums, differenced at the group ends: int64 arithmetic wraps modulo 2**64, so each
    difference is the group's exact sum whenever that sum fits in int64 (a prefix may wrap on the
    way). ``numpy.add.reduceat`` gives the same integers but costs about a microsecond per group
    of 50 columns, and most groups at the fine scales are single points.
    """
    if starts.shape[0] == a.shape[0]:
        return a.copy()
    ends = np.append(starts[1:], a.shape[0]) - 1
    c = np.cumsum(a, axis=0)
    out = c[ends]
    out[1:] -= c[ends[:-1]]
    return out


def _merge_keyed(keys: np.ndarray, *columns: np.ndarray):
    """Add up the rows of int64 ``columns`` (1-d or 2-d) with equal int64 keys, exactly
    (``_group_sums``): (unique keys sorted, each column's group sums)."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    if not k.size:
        return (k, *(c[order] for c in columns))
    starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    return (k[starts], *(_group_sums(c[order], starts) for c in columns))


_CELL_MERGE_ROWS = 1 << 20  # pending (cell, count, sums) rows of one scale before they are merged

_HASH_SEED = np.uint64(0x243F6A8885A308D3)
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)


def cell_hashes(g: np.ndarray, bits: int = 64) -> np.ndarray:
    """A 64-bit hash (as int64) of each row of integer cell coordinates g (rows x d); ``bits`` < 64 keeps
    only its low bits (tests force collisions with it).

    Deterministic and public (no key, no salt): the same cell gives the same hash on every
    executor. Two different cells MAY share a hash; the hash-first aggregation
    (``cell_aggregates(method="hash")``) stays exact whatever the collisions, because the hash
    only selects which cells are aggregated again by their full coordinates (a collision
    carries a cell it need not carry, never drops one).
    """
    h = np.full(g.shape[0], _HASH_SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(g.shape[1]):
            h ^= g[:, j].astype(np.int64).view(np.uint64)
            h *= _HASH_MULT
            h ^= h >> np.uint64(31)
        # splitmix64's finalizer: every input bit reaches every output bit
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    if bits < 64:
        h &= np.uint64((1 << bits) - 1)
    return h.view(np.int64)


def _merge_hashed(h: np.ndarray, g: np.ndarray, counts: np.ndarray, sums: np.ndarray):
    """Add up rows of equal cells, found by their hashes h: (hashes, cells g, counts, sums), one row per cell.

    Sorting int64 hashes is much faster than sorting d-coordinate keys. Rows with equal hashes are
    checked to hold equal coordinates; if two different cells share a hash in this input, the rows
    are merged by their full coordinates instead (``numpy.unique`` on the bytes), so the result is
    exact either way.
    """
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same = hs[1:] == hs[:-1]
    if not same.any():  # every row its own cell (most rows at the fine scales): nothing to add up
        return h, g, counts, sums
    gs, cs, ss = g[order], counts[order], sums[order]
    if np.any(gs[1:][same] != gs[:-1][same]):
        gs = np.ascontiguousarray(gs)
        key_type = np.dtype((np.void, gs.itemsize * gs.shape[1]))
        _, first, inverse = np.unique(gs.view(key_type).reshape(-1), return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        by_cell = np.argsort(inverse, kind="stable")
        starts = np.concatenate([[0], np.flatnonzero(np.diff(inverse[by_cell])) + 1])
        return hs[first], gs[first], _group_sums(cs[by_cell], starts), _group_sums(ss[by_cell], starts)
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    return hs[starts], gs[starts], _group_sums(cs, starts), _group_sums(ss, starts)


def _in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """values[i] in sorted_set, for a sorted int64 array (binary search, no hashing)."""
    if not sorted_set.size:
        return np.zeros(values.shape[0], dtype=bool)
    idx = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return sorted_set[idx] == values


def cell_hash_counter(sides: Sequence[float], shifts: Sequence[np.ndarray], columns: list[str], hash_bits: int = 64):
    """``mapInPandas`` function, first stage of the hash-first cell pass: per (scale, cell hash) the count.

    Rows (level INT, h LONG, n LONG), merged within the partition: 20 bytes per non-empty
    cell instead of the 12 d + 12 of :func:`cell_aggregator`'s rows. Its result only chooses
    which cells the second stage aggregates (those whose hash has a count >= the public
    ``min_count``); nothing of it is released.
    """
    sides = [float(s) for s in sides]
    shifts = [np.asarray(s, dtype=np.float64) for s in shifts]

    dim = shifts[0].shape[0] if shifts else len(columns)

    def run(batches):
        import pandas as pd

        pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in sides]
        rows = [0 for _ in sides]

        def compact(level):
            parts = pending[level]
            if len(parts) > 1:
                pending[level] = [_merge_keyed(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))]
            rows[level] = pending[level][0][0].shape[0] if pending[level] else 0

        for x in _batches_of_points(batches, columns, dim):
            for level, (side, shift) in enumerate(zip(sides, shifts)):
                h = cell_hashes(cell_indices(x, side, shift), hash_bits)
                pending[level].append(_merge_keyed(h, np.ones(h.shape[0], dtype=np.int64)))
                rows[level] += pending[level][-1][0].shape[0]
                if rows[level] > _CELL_MERGE_ROWS:
                    compact(level)
        for level in range(len(sides)):
            compact(level)
            if not pending[level]:
                continue
            keys, counts = pending[level][0]
            for start in range(0, counts.shape[0], _YIELD_ROWS):
                sl = slice(start, start + _YIELD_ROWS)
                yield pd.DataFrame({"level": np.full(counts[sl].shape[0], level, dtype=np.int32),
                                    "h": keys[sl], "n": counts[sl]})

    return run


def cell_aggregator(sides: Sequence[float], shifts: Sequence[np.ndarray], columns: list[str], chunk_rows: int,
                    only_hashes: Sequence[np.ndarray] | None = None, hash_bits: int = 64):
    """``mapInPandas`` function: per (scale, non-empty cell) the exact count and fixed-point offset sums.

    A point's offset from its cell center is clipped to [-side/2, side/2] per
    coordinate (it lies there up to rounding) and quantized to fixed point
    (|q| <= offset_limit(side)), so one point changes one cell's sums by at most
    offset_limit(side) per coordinate. Rows are (level, g0..g{d-1} int32 cell
    coordinates, n, s0..s{d-1}); only non-empty cells appear. All vectorized: each
    batch's cells are merged with numpy, never point by point: by one int64 key where the
    scale's coordinates pack into one (``_cell_key_layout``, exact), else by their hashes
    checked against the coordinates (``_merge_hashed``, exact).

    ``only_hashes`` (the hash-first pass's second stage): per scale a sorted int64 array; only
    the points whose cell's :func:`cell_hashes` value (with ``hash_bits``) is in it are
    aggregated (a cell is kept or dropped whole, so every emitted cell's count and sums are its
    exact ones).
    """
    sides = [float(s) for s in sides]
    shifts = [np.asarray(s, dtype=np.float64) for s in shifts]
    dim = shifts[0].shape[0]
    layouts = [_cell_key_layout(side, shift) for side, shift in zip(sides, shifts)]  # int64 keys where they fit
    if only_hashes is not None:
        only_hashes = [np.asarray(h, dtype=np.int64) for h in only_hashes]

    def merge(level, parts):
        def cat(i):
            return parts[0][i] if len(parts) == 1 else np.concatenate([p[i] for p in parts])

        if layouts[level] is not None:
            keys, counts, sums = _merge_keyed(cat(0), cat(2), cat(3))
            return keys, None, counts, sums
        return _merge_hashed(cat(0), cat(1), cat(2), cat(3))

    def run(batches):
        import pandas as pd

        pending: list[list[tuple]] = [[] for _ in sides]
        rows = [0 for _ in sides]

        def compact(level):
            if len(pending[level]) > 1:
                pending[level] = [merge(level, pending[level])]
            rows[level] = pending[level][0][0].shape[0] if pending[level] else 0

        for x in _batches_of_points(batches, columns, dim):
            for level, (side, shift) in enumerate(zip(sides, shifts)):
                if only_hashes is not None and not only_hashes[level].size:
                    continue
                g = cell_indices(x, side, shift)
                xl = x
                h = None
                if only_hashes is not None or layouts[level] is None:
                    h = cell_hashes(g, hash_bits)
                if only_hashes is not None:
                    sel = _in_sorted(h, only_hashes[level])
                    if not sel.any():
                        continue
                    g, xl, h = g[sel], x[sel], h[sel]
                lim = offset_limit(side)
                q = np.rint((xl - cell_centers(g, side, shift)) * SCALE).astype(np.int64)
                np.clip(q, -lim, lim, out=q)
                ones = np.ones(g.shape[0], dtype=np.int64)
                if layouts[level] is not None:
                    pending[level].append(merge(level, [(_pack_cells(g, layouts[level]), None, ones, q)]))
                else:
                    pending[level].append(merge(level, [(h, g.astype(np.int32), ones, q)]))
                rows[level] += pending[level][-1][0].shape[0]
                if rows[level] > _CELL_MERGE_ROWS:
                    compact(level)
        for level in range(len(sides)):
            compact(level)
            if not pending[level]:
                continue
            keys, g, counts, sums = pending[level][0]
            if layouts[level] is not None:
                g = _unpack_cells(keys, layouts[level], dim).astype(np.int32)
            for start in range(0, counts.shape[0], _YIELD_ROWS):
                sl = slice(start, start + _YIELD_ROWS)
                out = {"level": np.full(counts[sl].shape[0], level, dtype=np.int32)}
                for j in range(dim):
                    out[f"g{j}"] = np.ascontiguousarray(g[sl, j])
                out["n"] = counts[sl]
                for j in range(dim):
                    out[f"s{j}"] = np.ascontiguousarray(sums[sl, j])
                yield pd.DataFrame(out)

    return run
