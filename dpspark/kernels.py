"""Kernels shared by every family and the fitted model: numpy only (they run on executors).

The distance rule ``_sq_dists`` and ``nearest_center`` (``nearest_center_each``: several center sets
at once, auto's selection) live here, below the families, so that the
fitted model (``dpspark.model``), maxcover, dplloyd and auto label points by one rule without one
family importing another (DESIGN.md, "Layout"). ``dpspark.maxcover.kernels`` re-exports them.
Also the batch readers every pass shares (``batch_points``, ``arrow_out``; pyarrow imported inside
them, as the executors run them) and the name of the packed column the runs persist.
"""

from __future__ import annotations

import numpy as np

# Distances per chunk of ``nearest_center`` (two float64 temporaries of 512 KiB: cache-sized).
_NEAREST_CELLS = 1 << 16


# The persisted points of a run (``dpspark.tables.packed_points``): ONE array<double> column holding a
# row's d unit-space coordinates. A pass reads it from an Arrow batch as one contiguous buffer (a
# reshape, no per-column copy): measured at 10^6 rows (local[2]), a Python pass that only reads the
# points took 0.67 s against 1.52 s for d = 50 double columns, 0.34 s against 0.50 s for d = 10.
PACKED_COLUMN = "_u"


def batch_points(batch, columns, dim: int) -> np.ndarray:
    """The (rows x dim) float64 points of one batch, as stored (callers sanitize): an Arrow
    ``RecordBatch`` (``mapInArrow``) or a pandas frame (``mapInPandas``, tests), holding either the
    ``dim`` double columns ``columns`` or, when ``columns == [PACKED_COLUMN]``, the one packed column.

    A null value reads as NaN in every layout (``sanitize_unit`` then makes it 0). A packed row must
    hold exactly ``dim`` values (``packed_points`` builds them so): anything else is an error, never
    a reshape that would mix two rows.
    """
    columns = list(columns)
    packed = columns == [PACKED_COLUMN]
    if not packed and len(columns) != dim:
        raise ValueError(f"columns={columns} should name {dim} columns or be [{PACKED_COLUMN!r}]")
    if hasattr(batch, "schema"):  # an Arrow RecordBatch: no pandas frame is built
        if not packed:
            if batch.num_rows == 0:
                return np.zeros((0, dim), dtype=np.float64)
            return np.column_stack([batch.column(c).to_numpy(zero_copy_only=False) for c in columns]).astype(np.float64, copy=False)
        import pyarrow.compute as pc

        col = batch.column(PACKED_COLUMN)
        if len(col) == 0:
            return np.zeros((0, dim), dtype=np.float64)
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if col.null_count or not np.all(lengths == dim):
            raise ValueError(f"a packed row does not hold exactly dim={dim} values")
        flat = col.flatten().to_numpy(zero_copy_only=False)  # slice-aware; a null value -> NaN
        return np.asarray(flat, dtype=np.float64).reshape(-1, dim)
    if not packed:
        return batch[columns].to_numpy(dtype=np.float64).reshape(-1, dim)
    rows = [np.asarray(v if v is not None else [], dtype=np.float64) for v in batch[PACKED_COLUMN]]
    if any(r.shape != (dim,) for r in rows):
        raise ValueError(f"a packed row does not hold exactly dim={dim} values")
    return np.array(rows, dtype=np.float64).reshape(-1, dim)


def packed_batch(x: np.ndarray):
    """(rows x d) float64 points -> an Arrow RecordBatch of the packed column (lists of d values):
    the layout ``packed_points`` persists, for a pass that writes points (the uncovered filter)."""
    import pyarrow as pa

    x = np.ascontiguousarray(x, dtype=np.float64)
    rows, dim = x.shape
    offsets = pa.array(np.arange(0, (rows + 1) * dim, dim, dtype=np.int32))
    return pa.RecordBatch.from_arrays([pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))], [PACKED_COLUMN])


def arrow_out(fn):
    """A ``mapInArrow`` kernel from a function of batches (Arrow or pandas, read by ``batch_points``)
    that yields pandas frames (each becomes a RecordBatch) or RecordBatches (passed on)."""

    def run(batches):
        import pyarrow as pa

        for out in fn(batches):
            yield out if isinstance(out, pa.RecordBatch) else pa.RecordBatch.from_pandas(out, preserve_index=False)

    return run


def _sq_dists(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances by explicit differences, summed over the dimensions in order.

    Entry (i, v) is 0.0 + (x_i0 - c_v0)^2 + (x_i1 - c_v1)^2 + ... in float64, in that
    order: no cancellation, and each entry is computed by the same float operations
    whatever the chunk or the other rows and columns, so chunked and dense results,
    and the Spark passes, agree bit for bit. The operations are monotone in every
    |x_ij - c_vj|, which lets callers prune with bounding boxes exactly. Memory: two
    (rows x columns) temporaries, never a (rows x columns x d) one.
    """
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    out = np.zeros((x.shape[0], c.shape[0]), dtype=np.float64)
    diff = np.empty_like(out)
    for j in range(x.shape[1]):
        np.subtract(x[:, j, None], c[None, :, j], out=diff)
        np.multiply(diff, diff, out=diff)
        out += diff
    return out


def nearest_center(x: np.ndarray, centers: np.ndarray, chunk_rows: int | None = None) -> np.ndarray:
    """Index (int64) of the nearest center of every row by ``_sq_dists``, ties to the lowest index.

    A row's label depends only on that row and the centers: it is the argmin of the per-entry
    distances (no matrix product whose rounding could depend on the batch's shape or on
    threading), so it is the same alone, in any batch, in any order. Fast path
    (``_screened_nearest``): a BLAS product screens the centers, and only rows with more than
    one center within the product's rounding bound of their minimum get the per-entry
    distances; the labels are the same bit for bit. Chunked: by default about
    ``_NEAREST_CELLS`` distances at a time; the labels do not depend on it.
    """
    x = np.asarray(x, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    if chunk_rows is None and centers.shape[0] > 1 and x.shape[1] >= _SCREEN_MIN_DIM:
        return _screened_nearest(x, centers)
    return _per_entry_nearest(x, centers, chunk_rows)


def _per_entry_nearest(x: np.ndarray, centers: np.ndarray, chunk_rows: int | None = None) -> np.ndarray:
    step = chunk_rows or max(1, _NEAREST_CELLS // max(1, centers.shape[0]))
    out = np.empty(x.shape[0], dtype=np.int64)
    for start in range(0, x.shape[0], step):
        out[start : start + step] = np.argmin(_sq_dists(x[start : start + step], centers), axis=1)
    return out


# The screen pays off from a few dimensions on (at d = 2 the per-entry rule is as fast).
_SCREEN_MIN_DIM = 4
_SCREEN_ROWS = 1 << 14  # rows per BLAS block (a (rows x k) float64 temporary)


def _screened_nearest(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """``_per_entry_nearest``'s labels, with a BLAS screen.

    Let e_v be the per-entry distance of ``_sq_dists`` (the rule), a_v = |x|^2 - 2 x.c_v + |c_v|^2
    from a matrix product, t_v the real distance. For any summation order (BLAS blocking,
    threads, FMA), |a_v - t_v| <= g (|x| + |c_v|)^2 and |e_v - t_v| <= g (|x| + |c_v|)^2 with
    g = gamma_{d+3} = (d+3)u / (1 - (d+3)u), u = 2^-53 (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., sec. 3.1). Then every center whose e_v is the minimum
    (ties included) has a_v <= min_w a_w + 4 g (|x| + max |c|)^2. A row with only one center
    inside that margin (the margin is doubled, and the norms rounded up) has it as its label;
    every other row, and any row with a value that is not finite, is decided by the rule
    itself. The product's rounding can only move a row from the first kind to the second.
    """
    k, dim = centers.shape
    out = np.empty(x.shape[0], dtype=np.int64)
    c_sq = np.einsum("ij,ij->i", centers, centers)
    c_norm = float(np.sqrt(c_sq.max())) if np.all(np.isfinite(c_sq)) else np.inf
    u = 2.0 ** -53
    g = (dim + 3) * u / (1.0 - (dim + 3) * u)
    factor = 8.0 * g * (1.0 + 1e-6)
    for start in range(0, x.shape[0], _SCREEN_ROWS):
        xs = x[start : start + _SCREEN_ROWS]
        with np.errstate(all="ignore"):
            x_sq = np.einsum("ij,ij->i", xs, xs)
            approx = x_sq[:, None] - 2.0 * (xs @ centers.T) + c_sq[None, :]
            best = approx.min(axis=1)
            margin = factor * (np.sqrt(x_sq) + c_norm) ** 2
            near = approx <= (best + margin)[:, None]
        labels = np.argmax(near, axis=1)
        # below 1e-100 an underflowed product could exceed the margin: the rule decides those rows
        undecided = ((near.sum(axis=1) != 1) | ~np.isfinite(best) | ~np.isfinite(margin)
                     | (np.sqrt(x_sq) + c_norm < 1e-100))
        if undecided.any():
            rows = np.flatnonzero(undecided)
            labels[rows] = _per_entry_nearest(xs[rows], centers)
        out[start : start + len(xs)] = labels
    return out


def nearest_center_each(x: np.ndarray, center_sets: np.ndarray) -> np.ndarray:
    """(rows x M) int64: column m is ``nearest_center(x, center_sets[m])``, bit for bit.

    ``center_sets`` is (M, k, d): M sets of k centers (auto's candidate solutions). From
    ``_SCREEN_MIN_DIM`` dimensions on, ONE BLAS product per block screens every set at once
    (``_screened_nearest``'s argument, per set: its own center norm in the margin), and each
    (row, set) the screen leaves undecided gets the per-entry rule over that set; below, or with
    one center a set, each set goes through ``nearest_center``. So each label is the rule's, as
    for one set: it depends only on that row and the public centers.
    """
    x = np.asarray(x, dtype=np.float64)
    sets = np.asarray(center_sets, dtype=np.float64)
    m, k, dim = sets.shape
    if k < 2 or dim < _SCREEN_MIN_DIM:
        return np.stack([nearest_center(x, sets[i]) for i in range(m)], axis=1).reshape(x.shape[0], m)
    flat = sets.reshape(m * k, dim)
    c_sq = np.einsum("ij,ij->i", flat, flat).reshape(m, k)
    with np.errstate(all="ignore"):
        c_norm = np.where(np.all(np.isfinite(c_sq), axis=1), np.sqrt(c_sq.max(axis=1)), np.inf)  # per set
    u = 2.0 ** -53
    g = (dim + 3) * u / (1.0 - (dim + 3) * u)
    factor = 8.0 * g * (1.0 + 1e-6)
    out = np.empty((x.shape[0], m), dtype=np.int64)
    block = max(1, (_SCREEN_ROWS * 32) // (m * k))  # rows per block: a (rows x M x k) temporary of about 2^19 entries
    minus_two = -2.0 * flat.T  # exact (a power of two): the product is -2 x.c
    for start in range(0, x.shape[0], block):
        xs = x[start : start + block]
        with np.errstate(all="ignore"):
            x_sq = np.einsum("ij,ij->i", xs, xs)
            approx = (xs @ minus_two).reshape(len(xs), m, k)
            approx += c_sq[None, :, :]
            approx += x_sq[:, None, None]
            labels = np.argmin(approx, axis=2)  # the unique center within the margin, where there is one
            best = np.take_along_axis(approx, labels[:, :, None], axis=2)[:, :, 0]
            norms = np.sqrt(x_sq)[:, None] + c_norm[None, :]
            margin = factor * norms ** 2
            near = np.count_nonzero(approx <= (best + margin)[:, :, None], axis=2)
        undecided = (near != 1) | ~np.isfinite(best) | ~np.isfinite(margin) | (norms < 1e-100)
        for i in np.flatnonzero(undecided.any(axis=0)):
            rows = np.flatnonzero(undecided[:, i])
            labels[rows, i] = _per_entry_nearest(xs[rows], sets[i])
        out[start : start + len(xs)] = labels
    return out
