"""Issue 13, defects 1 and 9: every per-record map is total and bounded, and a record's cluster
label depends only on that record.

Defect 1: the domain map (numpy ``Domain.clip_to_unit`` / ``clip_unit`` and Spark
``Domain.unit_columns``) must send ANY double (1e308, 5e-324, NaN, +-inf) to unit coordinates
in [-1, 1], large points of a ball onto its sphere (not NaN, not the origin), numpy and Spark
alike; and the executor kernels must, as a second line of defence, never let a NaN/inf/out-of-range
row reach an aggregate as anything but one bounded record (Lemma 4.1 of maxcover needs
sensitivity 1; dplloyd's sums need |q| <= SCALE per coordinate).

Defect 9: dplloyd's assignment (and ``ClusteringModel.transform``) use the per-entry distance
rule, so a row's label is the same alone, in any batch, in any order.

All tests here are deterministic (fixed inputs or a seeded generator); none is statistical.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpspark.steps.lloyd_kernels import assign, exact_aggregates
from dpspark.maxcover import kernels as mk
from dpspark.privacy.domain import Domain
from dpspark.privacy import fixedpoint
from dpspark.privacy.fixedpoint import SCALE, quantize


def _read_as_kernels_do(x):
    """The kernels' documented rule for unit values (NaN -> 0, +-inf -> +-1, clamp to [-1, 1]), written out here."""
    x = np.array(x, dtype=np.float64)
    return np.clip(np.where(np.isnan(x), 0.0, x), -1.0, 1.0)

TINY = 5e-324  # the smallest positive subnormal double
BIG = 1e308
MAX = float(np.finfo(np.float64).max)

# Rows every map must survive (d = 2): extremes, subnormals, zero, non-finite, mixed.
EXTREME_ROWS = [
    [BIG, 0.0], [-BIG, 0.0], [BIG, BIG], [-BIG, BIG], [MAX, -MAX], [1e200, 0.0], [1e200, 1e200], [-1e200, 3.0],
    [TINY, 0.0], [TINY, TINY], [-TINY, TINY], [0.0, 0.0], [1e-200, -1e-200], [1e-310, 2e-310],
    [0.3, -0.2], [3.0, 4.0], [0.6, 0.8], [-1e5, 2.5],
    [float("nan"), 0.5], [float("nan"), float("nan")], [float("inf"), 0.0], [float("-inf"), float("inf")],
    [float("nan"), float("inf")], [BIG, float("nan")],
]
BALLS = [0.5, 1.0, 2.0, 1e-300, 1e300]
BOX = Domain(2, lower=(0.0, -10.0), upper=(100.0, 10.0))
BOX_ROWS = [[100.0 + 1e-9, -10.0 - 1e-9], [-1e-300, 10.0], [np.nextafter(100.0, 200.0), np.nextafter(-10.0, -20.0)],
            [50.0, 0.0], [0.0, -10.0]]


def _old_ball_map(x, radius):
    """The pre-issue-13 ball map (``x / R`` then divide by max(norm, 1)): the deliberately broken variant."""
    with np.errstate(all="ignore"):
        u = np.asarray(x, dtype=np.float64) / radius
        return u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1.0)


def _ball_map_problems(u, x, radius):
    """Which rows of a ball map break the contract (finite, |u_j| <= 1, ||u|| <= 1, big points on the sphere)."""
    u = np.asarray(u)
    bad = ~np.isfinite(u).all(axis=1) | (np.abs(u) > 1.0).any(axis=1)
    with np.errstate(all="ignore"):
        norm = np.sqrt((np.nan_to_num(u) ** 2).sum(axis=1))
        big = np.isfinite(x).all(axis=1) & (np.abs(x).max(axis=1) > 2.0 * radius)  # surely outside the ball
    bad |= norm > 1.0 + 1e-15
    bad |= big & (np.abs(norm - 1.0) > 1e-15)  # a point outside the ball lands on the sphere
    return np.flatnonzero(bad)


# ----------------------------------------------------------------------------
# Defect 1, numpy side


@pytest.mark.parametrize("radius", BALLS)
def test_ball_map_is_total_bounded_and_puts_far_points_on_the_sphere(radius):
    x = np.array(EXTREME_ROWS)
    u = Domain(2, radius=radius).clip_to_unit(x)
    assert _ball_map_problems(u, x, radius).size == 0
    # the examples of the issue: R = 0.5 with 1e308, and 1e200 with R >= 1
    if radius in (0.5, 1.0, 2.0):
        assert np.array_equal(u[0], [1.0, 0.0]) and np.array_equal(u[1], [-1.0, 0.0])
        assert np.array_equal(u[5], [1.0, 0.0])
        assert np.allclose(u[6], [np.sqrt(0.5)] * 2, rtol=0, atol=1e-15)
    # NaN coordinates read as the centre, +-inf as the far direction: finite, bounded
    assert np.array_equal(u[19], [0.0, 0.0]) and np.allclose(u[20], [1.0, 0.0])
    # a point well inside keeps its exact map x / R
    if radius == 2.0:
        assert np.array_equal(u[14], np.array([0.3, -0.2]) / 2.0)
    # the check catches the old map (NaN for 1e308 with R < 1, the origin for 1e200 with R >= 1)
    if radius in (0.5, 1.0, 2.0):
        assert _ball_map_problems(_old_ball_map(x, radius), x, radius).size > 0


def test_box_map_is_total_and_bounded():
    x = np.array(EXTREME_ROWS + BOX_ROWS)
    u = BOX.clip_to_unit(x)
    assert np.isfinite(u).all() and np.abs(u).max() <= 1.0
    assert np.array_equal(u[-5], [1.0, -1.0]) and np.array_equal(u[-3], [1.0, -1.0]) and np.array_equal(u[-2], [0.0, 0.0])
    assert u[18, 0] == 0.0 and np.isclose(u[18, 1], 0.05) and np.array_equal(u[19], [0.0, 0.0])  # NaN -> unit 0
    assert np.array_equal(u[21], [-1.0, 1.0])  # -inf, +inf -> the bounds
    # a box whose hi - lo overflows still gives bounded values
    huge = Domain(2, lower=(-MAX, -1.0), upper=(MAX, 1.0))
    assert np.abs(huge.clip_to_unit(x)).max() <= 1.0 and np.isfinite(huge.clip_to_unit(x)).all()


@pytest.mark.parametrize("domain", [Domain(2, radius=1.0), BOX])
def test_clip_unit_is_total_and_bounded(domain):
    u = domain.clip_unit(np.array(EXTREME_ROWS))
    assert np.isfinite(u).all() and np.abs(u).max() <= 1.0
    if domain.is_ball:
        assert _ball_map_problems(u, np.array(EXTREME_ROWS), 1.0).size == 0
        assert np.array_equal(domain.clip_unit(np.array([[0.3, 0.4]])), [[0.3, 0.4]])  # inside: unchanged


def test_sanitize_helpers_are_bounded():
    raw = np.array([[np.nan, np.inf], [-np.inf, 1e308], [0.5, -2.0], [-1.0, 1.0]])
    s = fixedpoint.sanitize_unit(raw)
    assert np.array_equal(s, [[0.0, 1.0], [-1.0, 1.0], [0.5, -1.0], [-1.0, 1.0]])
    assert np.isnan(raw[0, 0])  # a copy: the caller's array is untouched
    q = quantize(raw)
    assert np.array_equal(q, [[0, SCALE], [-SCALE, SCALE], [SCALE // 2, -SCALE], [-SCALE, SCALE]])
    with np.errstate(all="ignore"):
        cast = np.rint(raw * SCALE).astype(np.int64)  # what an unsanitized caller makes of it
    assert np.abs(fixedpoint.sanitize_fixed(cast)).max() <= SCALE
    assert fixedpoint.sanitize_fixed(np.array([np.iinfo(np.int64).min]))[0] == 0


# ----------------------------------------------------------------------------
# Defect 1, Spark side: the same map, bit for bit


def _spark_unit(spark, domains, rows):
    """Map ``rows`` (d = 2, may hold NaN/inf) through each domain's ``unit_columns``, in ONE Spark job."""
    from pyspark.sql import functions as F

    x = np.array(rows, dtype=np.float64)
    # Arrow turns a pandas NaN into null; carry NaN as a flag and rebuild it in Spark.
    pdf = pd.DataFrame({"i": np.arange(len(x)), "a": np.where(np.isnan(x[:, 0]), 0.0, x[:, 0]),
                        "b": np.where(np.isnan(x[:, 1]), 0.0, x[:, 1]), "na": np.isnan(x[:, 0]), "nb": np.isnan(x[:, 1])})
    df = spark.createDataFrame(pdf)
    a = F.when(F.col("na"), F.lit(float("nan"))).otherwise(F.col("a"))
    b = F.when(F.col("nb"), F.lit(float("nan"))).otherwise(F.col("b"))
    cols = [c.alias(f"d{k}_u{j}") for k, domain in enumerate(domains) for j, c in enumerate(domain.unit_columns([a, b]))]
    got = df.select("i", *cols).toPandas().sort_values("i")
    return [got[[f"d{k}_u0", f"d{k}_u1"]].to_numpy(dtype=np.float64) for k in range(len(domains))]


def test_spark_and_numpy_maps_agree_bit_for_bit_on_extreme_values(spark):
    rows = EXTREME_ROWS + BOX_ROWS + [[-0.0, -0.0], [MAX, 0.5], [-MAX, -0.5]]
    x = np.array(rows)
    # the last box: hi - lo overflows, so 2 (x - lo) / (hi - lo) is NaN at x = +-MAX (the clamp's 0)
    domains = [Domain(2, radius=r) for r in BALLS] + [BOX, Domain(2, lower=(0.0, -1.0), upper=(1.0, 0.0)),
                                                      Domain(2, lower=(-MAX, -1.0), upper=(MAX, 1.0))]
    for domain, got in zip(domains, _spark_unit(spark, domains, rows)):
        want = domain.clip_to_unit(x)
        assert np.isfinite(got).all() and np.abs(got).max() <= 1.0, domain
        assert np.array_equal(got, want), (domain, np.flatnonzero((got != want).any(axis=1)))
    # the check can fail: the old Spark map gave NaN for 1e308 with R = 0.5
    old = _old_ball_map(x, 0.5)
    assert not np.array_equal(old, Domain(2, radius=0.5).clip_to_unit(x))


def test_spark_map_keeps_nulls_null(spark):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(0, 1.0, None), (1, None, 2.0), (2, 3.0, 4.0)], "i int, a double, b double")
    ball, box = Domain(2, radius=2.0), BOX
    cols = [c.alias(f"{name}{j}") for name, dom in (("ball", ball), ("box", box))
            for j, c in enumerate(dom.unit_columns([F.col("a"), F.col("b")]))]
    got = df.select("i", *cols).orderBy("i").toPandas()
    assert got.loc[:1, ["ball0", "ball1"]].isna().all().all()  # ball: a null anywhere nulls the whole row
    assert got["box0"].isna().tolist() == [False, True, False] and got["box1"].isna().tolist() == [True, False, False]
    assert got.loc[2].notna().all()


# ----------------------------------------------------------------------------
# Defect 1, second line of defence in the executor kernels

POISON_ROWS = [[np.nan, np.nan], [np.nan, 0.1], [np.inf, 0.0], [-np.inf, np.inf], [1e308, -1e308], [3.0, 0.2]]


def _cluster_points(n=700, seed=5):
    """Unit-space points close together (one chunk of 512 and more), all within t of the first candidates."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0.0, 0.05, size=(n, 2)), -1.0, 1.0)


CANDIDATES = np.array([[0.0, 0.0], [0.05, 0.0], [-0.1, 0.1], [0.9, 0.9], [-1.0, -1.0], [1.0, 0.0], [0.2, -0.2]])
T, P = 0.04, 2


def _frame(x):
    return pd.DataFrame(np.asarray(x, dtype=np.float64), columns=["_u0", "_u1"])


def _run(fn, x):
    return pd.concat(list(fn(iter([_frame(x)]))), ignore_index=True)


def _scores(x, **kw):
    """Per-candidate coverage scores as a spilled threshold computes them: signature pass, then histogram job."""
    import pyarrow as pa

    parts = list(mk.signature_aggregator(CANDIDATES, np.zeros((0, 2)), [], T, P, ["_u0", "_u1"])(iter([_frame(x)])))
    hist: dict = {}
    for part in parts:
        for key, c in zip(part["sig"].tolist(), part["n"].tolist()):
            hist[key] = hist.get(key, 0) + c
    batch = pa.RecordBatch.from_arrays([pa.array(list(hist.keys()), type=pa.binary()),
                                        pa.array(list(hist.values()), type=pa.int64())], names=["sig", "n"])
    out = list(mk.histogram_score_aggregator(CANDIDATES.shape[0], **kw)(iter([batch])))
    return out[0].column(1).to_numpy()


def _signatures(x, pick_pts=np.zeros((0, 2)), pick_t=()):
    out = _run(mk.signature_aggregator(CANDIDATES, pick_pts, list(pick_t), T, P, ["_u0", "_u1"]), x)
    return dict(zip(out["sig"].tolist(), out["n"].tolist())) if len(out) else {}


@pytest.mark.parametrize("poison", POISON_ROWS)
def test_one_bad_row_moves_maxcover_scores_by_its_own_contribution_only(poison):
    """Lemma 4.1: adding one record changes each coverage score by 0 or 1 (its own indicator).

    Before the fix a NaN row made its chunk's bounding box NaN, every box test false, and the
    whole chunk (up to 512 other points) vanished from the scores.
    """
    x = _cluster_points()
    base = _scores(x)
    assert base[0] > 512  # the test is meaningful: a whole chunk is within t of candidate 0
    own = _scores(_read_as_kernels_do([poison]))  # the row's own contribution, as the kernels read it
    assert set(own.tolist()) <= {0, 1}
    for placement in ("first", "last"):
        y = np.vstack([[poison], x]) if placement == "first" else np.vstack([x, [poison]])
        assert np.array_equal(_scores(y) - base, own), (poison, placement)
    # the update job (what pick 1 newly covers, with pick 2 made before it) obeys the same rule
    base_new = _scores(x, require=1, exclude=(2,))
    assert base_new[1] > 0  # meaningful: the pick does newly cover points
    with_new = _scores(np.vstack([[poison], x]), require=1, exclude=(2,))
    assert set((with_new - base_new).tolist()) <= {0, 1}


@pytest.mark.parametrize("poison", POISON_ROWS)
def test_one_bad_row_moves_one_signature_count_by_one(poison):
    x = _cluster_points()
    for pick_pts, pick_t in ((np.zeros((0, 2)), ()), (np.array([[0.9, 0.9]]), (T,))):
        base = _signatures(x, pick_pts, pick_t)
        got = _signatures(np.vstack([[poison], x]), pick_pts, pick_t)
        diff = {k: got.get(k, 0) - base.get(k, 0) for k in set(base) | set(got)}
        moved = {k: v for k, v in diff.items() if v}
        assert sum(abs(v) for v in moved.values()) <= 1 and all(v == 1 for v in moved.values()), (poison, moved)


@pytest.mark.parametrize("poison", POISON_ROWS)
def test_one_bad_row_in_snap_and_cell_aggregators_is_one_bounded_record(poison):
    x = _cluster_points()
    snap = mk.snap_aggregator(CANDIDATES[:3], ["_u0", "_u1"], 100)
    d = _run(snap, np.vstack([x, [poison]]))["n"].to_numpy() - _run(snap, x)["n"].to_numpy()
    assert d.sum() == 1 and d.min() == 0

    sides, shifts = [0.5, 0.125], [np.array([0.1, 0.2]), np.array([0.01, 0.02])]
    cells = mk.cell_aggregator(sides, shifts, ["_u0", "_u1"], 100)

    def table(y):
        out = _run(cells, y)
        return {(r.level, r.g0, r.g1): np.array([r.n, r.s0, r.s1]) for r in out.itertuples()}

    base, got = table(x), table(np.vstack([x, [poison]]))
    for level, side in enumerate(sides):
        keys = {k for k in set(base) | set(got) if k[0] == level}
        diffs = [got.get(k, np.zeros(3, np.int64)) - base.get(k, np.zeros(3, np.int64)) for k in keys]
        diffs = [v for v in diffs if v.any()]
        assert len(diffs) == 1 and diffs[0][0] == 1 and np.abs(diffs[0][1:]).max() <= mk.offset_limit(side)


def test_one_nan_row_cannot_add_int64_min_to_a_dplloyd_sum():
    """dplloyd: a NaN row used to be quantized to INT64_MIN and added ~ -9.2e18 to a cluster sum."""
    from dpspark.steps.lloyd_pass import partition_aggregator

    centroids = np.array([[-0.5, 0.0], [0.5, 0.0], [0.0, 0.7]])
    x = _cluster_points(300)
    for poison in POISON_ROWS:
        # the executor path: unit-space floats in a pandas batch, quantized by the pass
        fn = partition_aggregator(centroids, ["_u0", "_u1"])
        with np.errstate(all="ignore"):
            base = _run(fn, x)
            got = _run(fn, np.vstack([x, [poison]]))
        dc = got["count"].to_numpy() - base["count"].to_numpy()
        ds = got[["s0", "s1"]].to_numpy() - base[["s0", "s1"]].to_numpy()
        assert dc.sum() == 1 and dc.min() == 0, poison
        assert np.abs(ds).max() <= SCALE, (poison, ds)
        # exact_aggregates on raw fixed point (what an unsanitized quantization makes of the row)
        q = quantize(x)
        with np.errstate(all="ignore"):
            bad = np.rint(np.array([poison]) * SCALE).astype(np.int64)
        c0, s0 = exact_aggregates(q, centroids)
        c1, s1 = exact_aggregates(np.vstack([q, bad]), centroids)
        assert (c1 - c0).sum() == 1 and np.abs(s1 - s0).max() <= SCALE


# ----------------------------------------------------------------------------
# Defect 9: a row's label depends only on that row and the centroids


def _near_tie_points(dim, n, seed):
    """Centroids 0/1 and 2/3 mirror each other in coordinate 0; points have x_0 within ~1e-15 of 0,
    so every point is a near tie between the two centroids of its nearest pair."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(-0.8, 0.8, size=(4, dim))
    c[1], c[3] = c[0], c[2]
    c[1, 0], c[3, 0] = -c[0, 0], -c[2, 0]
    x = rng.uniform(-1.0, 1.0, size=(n, dim))
    x[:, 0] = rng.normal(0.0, 1e-15, size=n)
    x[: n // 10, 0] = 0.0  # exact ties: the lowest index wins
    return x, c


@pytest.mark.parametrize("dim", [2, 4, 16, 64])
def test_assign_label_is_the_same_alone_and_in_any_batch(dim):
    """Before the fix (BLAS ``xq @ centroids.T``) some near-tie rows got another label inside a batch than alone."""
    x, c = _near_tie_points(dim, 600, seed=dim)
    alone = np.array([assign(x[i : i + 1], c)[0] for i in range(len(x))])
    exact = alone[: len(x) // 10]
    assert np.all((exact == 0) | (exact == 2)) and (exact == 0).any()  # exact ties go to the lowest index
    rng = np.random.default_rng(100 + dim)
    for size in (7, 128, 600):
        perm = rng.permutation(len(x))
        labels = np.empty(len(x), dtype=np.int64)
        for start in range(0, len(x), size):
            idx = perm[start : start + size]
            labels[idx] = assign(x[idx], c)
        assert np.array_equal(labels, alone), (dim, size, np.flatnonzero(labels != alone)[:5])
    # chunking inside the distance rule does not change a label either
    assert np.array_equal(mk.nearest_center(x, c, chunk_rows=3), alone)


def _per_entry_nearest(x, c):
    """Reference labels written out: sum over j in order of (x_j - c_j)^2, first minimum wins."""
    d2 = np.zeros((x.shape[0], c.shape[0]))
    for j in range(x.shape[1]):
        d2 = d2 + (x[:, j, None] - c[None, :, j]) ** 2
    return np.argmin(d2, axis=1)


@pytest.mark.parametrize("dim, seed", [(4, 1), (64, 2)])
def test_dplloyd_aggregates_of_a_batch_plus_one_row_differ_by_that_row_alone(dim, seed):
    """Sensitivity at the aggregate level: adding row r changes (counts, sums) by exactly aggregates({r}).

    Fixed-point points with x_0 = 0 and centroid pairs mirrored in coordinate 0 up to one ulp:
    every point is a near tie. With the old BLAS assignment, 13 (dim 4) and 16 (dim 64) of the
    300 rows got another cluster alone than inside the batch (this machine's OpenBLAS).
    """
    rng = np.random.default_rng(seed)
    c = rng.uniform(-0.8, 0.8, size=(4, dim))
    c[1], c[3] = c[0], c[2]
    c[1, 0], c[3, 0] = np.nextafter(-c[0, 0], 0.0), np.nextafter(-c[2, 0], 1.0)
    x = rng.uniform(-1.0, 1.0, size=(300, dim))
    x[:, 0] = 0.0
    q = quantize(x)
    base_c, base_s = exact_aggregates(q, c)
    assert np.array_equal(assign(q / SCALE, c), _per_entry_nearest(q / SCALE, c))
    for i in range(len(q)):
        rest = np.delete(q, i, axis=0)
        rc, rs = exact_aggregates(rest, c)
        oc, os_ = exact_aggregates(q[i : i + 1], c)
        assert np.array_equal(base_c - rc, oc) and np.array_equal(base_s - rs, os_), i


def test_transform_labels_by_the_per_entry_rule_and_nulls_invalid_rows(spark):
    from dpspark.model import ClusteringModel

    domain = Domain(2, radius=2.0)
    x, c_unit = _near_tie_points(2, 200, seed=11)
    model = ClusteringModel(algorithm="test", objective="kmeans", centers=domain.from_unit(c_unit), noisy_weights=np.ones(4),
                            epsilon_spent=0.0, delta_spent=0.0, charges=[], domain=domain, features=("a", "b"),
                            feature_names=["a", "b"])
    pts = domain.from_unit(x)
    extra = np.array([[1e308, 0.0], [-1e200, 5.0], [np.nan, 1.0], [np.inf, 0.0]])
    allx = np.vstack([pts, extra])
    rows = [(i, float(a), float(b)) for i, (a, b) in enumerate(allx)] + [(len(allx), None, 1.0)]
    df = spark.createDataFrame(rows, "i long, a double, b double").coalesce(1)
    got = model.transform(df).orderBy("i").toPandas()["prediction"]
    want = _per_entry_nearest(domain.clip_to_unit(allx), domain.clip_to_unit(model.centers))
    n_ok = len(pts) + 2
    assert got.iloc[:n_ok].astype(int).tolist() == want[:n_ok].tolist()
    assert got.iloc[n_ok:].isna().all()  # NaN, inf and null rows: null, as the fit drops them


@pytest.mark.parametrize("dim", [4, 16, 64])
def test_screened_nearest_center_gives_the_per_entry_labels_on_hostile_rows(dim):
    """The BLAS screen of ``nearest_center`` (dim >= 4) changes no label: near ties at 1e-15, exact
    ties, duplicated centers, rows on a center, NaN, +-inf, 1e308, 1e-200 and 0, in one batch,
    against the written-out per-entry reference (that reference decides NaN rows as numpy's
    argmin does: the first NaN)."""
    x, c = _near_tie_points(dim, 3000, seed=40 + dim)
    rng = np.random.default_rng(dim)
    c = np.vstack([c, c[2], rng.uniform(-1, 1, size=(6, dim))])  # a duplicated center: ties by index
    hostile = np.zeros((9, dim))
    hostile[0, 0], hostile[1, 1], hostile[2, 0] = np.nan, np.inf, -np.inf
    hostile[3, :] = 1e308
    hostile[4, :] = 1e-200
    hostile[5] = c[2]  # on a duplicated center
    hostile[6] = (c[0] + c[1]) / 2.0  # on a bisector
    hostile[7, -1] = -1e308  # row 8 stays 0
    x = np.vstack([x, hostile, c + 1e-16])
    with np.errstate(all="ignore"):
        reference = _per_entry_nearest(x, c)
        labels = mk.nearest_center(x, c)
    assert np.array_equal(labels, reference), np.flatnonzero(labels != reference)[:10]


@pytest.mark.parametrize("dim, p", [(4, 2), (16, 2), (64, 2), (16, 1)])
def test_screened_cost_within_is_the_per_entry_rule_at_the_threshold(dim, p):
    """``cost_within`` (the coverage passes' "dist^p <= t", BLAS-screened from dim 4) gives the
    per-entry rule's answer bit for bit: thresholds equal to an entry's own cost, one ulp either
    side, per-column thresholds, and hostile rows (NaN, +-inf, 1e308, 1e-200, 0, on a point). The
    same inputs with no margin (``screen_factor=0``) get some entries wrong: the margin is what
    makes it exact, and this test can see it."""
    rng = np.random.default_rng(dim + p)
    x = rng.uniform(-1.0, 1.0, size=(2000, dim))
    c = rng.uniform(-1.0, 1.0, size=(50, dim))
    x[:200] = c[rng.integers(0, 50, 200)] + rng.normal(0.0, 1e-9, size=(200, dim))
    hostile = np.zeros((7, dim))
    hostile[0, 0], hostile[1, 1], hostile[2, 0] = np.nan, np.inf, -np.inf
    hostile[3, :], hostile[4, :], hostile[5] = 1e308, 1e-200, c[3]
    x = np.vstack([x, hostile])
    with np.errstate(all="ignore"):
        cost = mk._cost_from_sq(mk._sq_dists(x, c), p)
        ties = cost[rng.integers(0, 2000, 40), rng.integers(0, 50, 40)]
        thresholds = [np.nextafter(t, side) for t in ties for side in (-np.inf, np.inf)] + list(ties)
        per_column = [cost[rng.integers(0, 2000, 50), np.arange(50)] for _ in range(5)]
        wrong_without_margin = 0
        for t in thresholds + per_column:
            want = cost <= np.broadcast_to(t, (50,))[None, :]
            got = mk.cost_within(x, c, t, p)
            assert got.dtype == bool and np.array_equal(got, want), (t, np.argwhere(got != want)[:5])
            wrong_without_margin += int((mk.cost_within(x, c, t, p, screen_factor=0.0) != want).sum())
        # several thresholds from one product (a group's pass): each the rule's answer
        scalar = sorted(float(t) for t in thresholds)
        for group in (scalar[:5], scalar[::7], scalar[-3:]):
            got = mk.cost_within_each(x, c, group, p)
            assert len(got) == len(group)
            for t, g in zip(group, got):
                assert np.array_equal(g, cost <= t), t
    assert wrong_without_margin > 0
