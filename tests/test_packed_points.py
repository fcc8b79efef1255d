"""The packed points a run persists (``tables.packed_points``: one array<double> column) read as the
d double columns did, bit for bit, and every Spark pass over them gives the numpy reference's exact
aggregates: the layout changes how a batch reaches Python, never a released value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dpspark.kernels import PACKED_COLUMN, batch_points
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import SeededNoise
from dpspark.privacy.fixedpoint import quantize, sanitize_unit

COLUMNS = ["_u0", "_u1", "_u2"]
# a null, NaN, +-inf, 1e308, -0.0 and an exact boundary: what a hostile record could leave in a batch
HOSTILE = [[0.25, None, -0.5], [float("nan"), 1e308, -1e308], [float("inf"), -float("inf"), -0.0],
           [0.1, 0.2, 0.3], [-1.0, 1.0, 0.999999], [1e-300, -5e-324, 0.5]]


def _columns_table(rows):
    return pa.table({c: pa.array([r[j] for r in rows], pa.float64()) for j, c in enumerate(COLUMNS)})


def _packed_table(rows):
    return pa.table({PACKED_COLUMN: pa.array(rows, pa.list_(pa.float64()))})


def test_a_packed_batch_reads_as_the_columns_bit_for_bit_in_arrow_and_pandas_sliced_or_not():
    cols, packed = _columns_table(HOSTILE), _packed_table(HOSTILE)
    want = batch_points(cols.to_batches()[0], COLUMNS, 3)
    assert want.shape == (6, 3) and np.isnan(want[0, 1]) and want[1, 1] == 1e308
    assert np.signbit(want[2, 2])  # -0.0 kept as read
    got = batch_points(packed.to_batches()[0], [PACKED_COLUMN], 3)
    assert got.tobytes() == want.tobytes()  # NaN payloads and signed zeros included
    assert batch_points(packed.to_pandas(), [PACKED_COLUMN], 3).tobytes() == want.tobytes()
    assert batch_points(cols.to_pandas(), COLUMNS, 3).tobytes() == want.tobytes()
    # slices (a batch that starts inside the buffers) and small batches
    for start in range(6):
        for size in (1, 2, 6 - start):
            a = batch_points(packed.slice(start, size).to_batches()[0], [PACKED_COLUMN], 3)
            assert a.tobytes() == want[start : start + size].tobytes(), (start, size)
    for batch in packed.to_batches(max_chunksize=4):
        assert batch_points(batch, [PACKED_COLUMN], 3).shape == (batch.num_rows, 3)
    empty = pa.RecordBatch.from_pydict({PACKED_COLUMN: pa.array([], pa.list_(pa.float64()))})
    assert batch_points(empty, [PACKED_COLUMN], 3).shape == (0, 3)
    # what the passes compute from it: sanitized and quantized as before
    assert quantize(got).tobytes() == quantize(want).tobytes()
    assert np.array_equal(sanitize_unit(got)[0], [0.25, 0.0, -0.5])


@pytest.mark.parametrize("rows", [
    [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6]],          # 6 values in 2 rows: a reshape would mix them
    [[0.1, 0.2, 0.3], None],                      # a null row
    [[0.1, 0.2]],                                 # too short
])
def test_a_packed_row_without_exactly_d_values_is_refused_never_reshaped(rows):
    batch = pa.RecordBatch.from_pydict({PACKED_COLUMN: pa.array(rows, pa.list_(pa.float64()))})
    with pytest.raises(ValueError, match="exactly dim=3"):
        batch_points(batch, [PACKED_COLUMN], 3)
    with pytest.raises(ValueError, match="exactly dim=3"):
        batch_points(batch.to_pandas(), [PACKED_COLUMN], 3)


def test_columns_that_are_neither_d_names_nor_the_packed_one_are_refused():
    with pytest.raises(ValueError, match="should name 3 columns"):
        batch_points(_columns_table(HOSTILE).to_batches()[0], COLUMNS[:2], 3)


def _unit_frame(spark, x):
    from dpspark import tables

    domain = Domain(dim=x.shape[1], lower=(-1.0,) * x.shape[1], upper=(1.0,) * x.shape[1])
    df = spark.createDataFrame(pd.DataFrame(x, columns=["a", "b", "c"]).astype("float64")).repartition(3)
    unit, _ = tables.prepare_points(df, ("a", "b", "c"), None, domain, "packed-test")
    return unit, tables.packed_points(unit, x.shape[1])


def test_every_python_pass_over_the_packed_points_equals_the_columns_and_the_numpy_reference(spark):
    from dpspark.auto import selection
    from dpspark.steps import tree
    from dpspark.steps.lloyd_kernels import exact_aggregates
    from dpspark.steps.lloyd_pass import spark_aggregate
    from dpspark.steps.tree_kernels import fixed_planes, leaf_aggregates

    rng = np.random.default_rng(52)
    x = np.vstack([rng.normal(0, 0.4, size=(400, 3)), [[5.0, -7.0, 0.0], [1.0, 1.0, 1.0], [-1.0, 0.3, -0.0]]])
    x[::7] = x[3]  # duplicates of one row
    unit, packed = _unit_frame(spark, x)
    assert packed.columns == [PACKED_COLUMN] and packed.count() == len(x)
    columns = ["_u0", "_u1", "_u2"]
    unit_x = np.clip(x, -1.0, 1.0)  # the box is [-1, 1]^3: unit space is the clipped data
    centroids = rng.uniform(-0.8, 0.8, size=(7, 3))

    c_cols, s_cols = spark_aggregate(unit, columns)(centroids)
    c_packed, s_packed = spark_aggregate(packed, [PACKED_COLUMN])(centroids)
    c_ref, s_ref = exact_aggregates(quantize(unit_x), centroids)
    np.testing.assert_array_equal(c_packed, c_ref)
    np.testing.assert_array_equal(s_packed, s_ref)
    np.testing.assert_array_equal(c_cols, c_ref)
    np.testing.assert_array_equal(s_cols, s_ref)

    normals = rng.normal(size=(6, 3))
    w, b = fixed_planes(normals / np.linalg.norm(normals, axis=1, keepdims=True), rng.uniform(-0.3, 0.3, size=6))
    want = leaf_aggregates(quantize(unit_x), w, b)
    for frame, cols in ((packed, [PACKED_COLUMN]), (unit, columns)):
        got = tree.spark_tree_aggregates(frame, cols)(w, b)
        for g, r in zip(got, want):
            np.testing.assert_array_equal(g, r)

    sols = rng.uniform(-1, 1, size=(4, 5, 3))
    want_costs = [int(c) for c in selection.numpy_costs(unit_x)(sols, 2, 0.5)]
    assert list(selection.spark_costs(packed, [PACKED_COLUMN])(sols, 2, 0.5)) == want_costs
    assert list(selection.spark_costs(unit, columns)(sols, 2, 0.5)) == want_costs


def test_dplloyd_and_auto_persist_the_packed_points(spark, monkeypatch):
    """The estimators read the packed layout (what the measured speed-up is), and their fits equal
    the numpy references' as before (tests/test_dplloyd_spark.py, tests/test_auto.py)."""
    from dpspark import tables
    from dpspark.auto.estimator import AutoClustering
    from dpspark.dplloyd.estimator import DPLloyd

    seen = []
    original = tables.packed_points
    monkeypatch.setattr(tables, "packed_points", lambda df, dim: seen.append(dim) or original(df, dim))
    rng = np.random.default_rng(7)
    df = spark.createDataFrame(pd.DataFrame(rng.normal(size=(300, 5)), columns=list("abcde")))
    dom = Domain(dim=5, lower=(-3.0,) * 5, upper=(3.0,) * 5)
    DPLloyd(k=3, epsilon=1.0, domain=dom, features=tuple("abcde"), seed=1).fit(df)
    AutoClustering(k=3, epsilon=1.0, delta=1e-6, domain=dom, features=tuple("abcde"), seed=1).fit(df)
    assert seen == [5, 5]


def test_maxcovers_passes_over_the_packed_points_equal_those_over_the_columns(spark, monkeypatch):
    """Coverage (with the uncovered set re-persisted packed, and with a threshold on the executors),
    the snap, the grid cells (both methods) and the coarse histogram: the same exact values."""
    from dpspark import tables
    from dpspark.maxcover import candidates as cand_mod
    from dpspark.maxcover import core, passes
    from dpspark.maxcover.passes import PassCounter, SparkCoverage, cell_aggregates, snap_counts

    rng = np.random.default_rng(9)
    centres = rng.uniform(-0.7, 0.7, size=(3, 3))
    x = np.clip(centres[rng.integers(0, 3, size=1500)] + rng.normal(0, 0.12, size=(1500, 3)), -1, 1)
    x[::11] = x[5]
    unit = spark.createDataFrame(pd.DataFrame(x, columns=tables.unit_columns(3))).repartition(3).cache()
    packed = tables.packed_points(unit, 3).cache()
    columns = tables.unit_columns(3)
    cand = rng.uniform(-1, 1, size=(40, 3))
    ts = core.thresholds(2 * np.sqrt(3), 2, cand.shape[0], 0.5)
    m = core.picks_per_threshold(4, 0.5)
    monkeypatch.setattr(passes, "SHRINK_FRACTION", 0.9)  # re-persist the uncovered points early and often

    def coverage(frame, cols, max_signatures):
        provider = SparkCoverage(frame, cols, cand, ts, 2, max_signatures, PassCounter())
        picks = core.run_coverage(provider, cand.shape[0], ts, m, Accountant(1.0, 1e-6, SeededNoise(3)), 1.0, 1e-6)
        out = picks, list(provider.shrinks), list(provider.fallback_thresholds), list(provider.histogram_sizes)
        provider.close()
        return out

    want = coverage(unit, columns, 10**6)
    assert coverage(packed, [PACKED_COLUMN], 10**6) == want and want[1]  # shrinks happened, in the same places
    spill = max(want[3]) // 2  # the largest histograms stay on the executors
    want = coverage(unit, columns, spill)
    assert coverage(packed, [PACKED_COLUMN], spill) == want and want[2]

    np.testing.assert_array_equal(snap_counts(packed, [PACKED_COLUMN], cand[:9]), snap_counts(unit, columns, cand[:9]))
    sides, shifts = [0.5, 0.25], [rng.uniform(0, 0.5, size=3), rng.uniform(0, 0.25, size=3)]
    for method in ("direct", "hash"):
        a = cell_aggregates(packed, [PACKED_COLUMN], sides, shifts, min_count=2, method=method)
        b = cell_aggregates(unit, columns, sides, shifts, min_count=2, method=method)
        assert len(a) == len(b) == 2 and a[0][0].shape[0] > 0
        for la, lb in zip(a, b):
            for u, v in zip(la, lb):
                np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(cand_mod.coarse_histogram(packed, [PACKED_COLUMN], 4, 3),
                                  cand_mod.coarse_histogram(unit, columns, 4))
    packed.unpersist()
    unit.unpersist()
