"""Privacy hardening of the ldp family and of the run key (issue 13: defects 2, 6 and 13).

- Defect 2: in simulate mode identical rows must send INDEPENDENT reports (keys by
  duplicate index or privacy unit), statistically tested on the numpy client with the
  keys the Spark code really produces, and shown to catch the old content-only keying.
- Defect 6: the run key (and its sub-keys) never appear in a query plan; contribution
  bounding keeps its semantics with its own sub-key.
- Defect 13: a batch with no client in the current round does not crash, also through
  Spark on heavily duplicated data.

Every random draw is seeded (run keys are fixed hashes), so these tests are
deterministic; the confidence of each statistical check is stated next to it.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpspark.ldp import client, oracle, protocol
from dpspark.privacy.domain import Domain
from dpspark.privacy.randomness import Randomness, derive_key

from privacy_stats import MARGIN, estimated_loss

DOMAIN = Domain(dim=2, lower=(0.0, 0.0), upper=(100.0, 100.0))
FRACTIONS = (0.5, 0.25, 0.25)
MAX_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


def run_keys(n: int, tag: str) -> list[str]:
    """n distinct, fixed (seeded) run keys in the format of ``Randomness.run_key``."""
    return [hashlib.sha256(f"{tag}:{i}".encode()).hexdigest() for i in range(n)]


def collect_keys(points_df) -> pd.DataFrame:
    """The keyed points on the driver, in a canonical order (by key, or by point and duplicate index)."""
    from dpspark.ldp.spark import DUP, KEY

    pdf = points_df.toPandas()
    order = [KEY] if KEY in pdf.columns else sorted(c for c in pdf.columns if c != DUP) + [DUP]
    return pdf.sort_values(order).reset_index(drop=True)


UNIT2 = ["_u0", "_u1"]


# ----------------------------------------------------------------------------
# Defect 13: a batch with no client in the round


def small_rounds():
    good = protocol.good_centers_round(2, 1.0, protocol.Settings(radii=1, hashes=1, buckets=4, projection_dim=2),
                                       2.0, np.random.default_rng(0))
    assign = protocol.assign_round(np.array([[-0.5, -0.5], [0.5, 0.5]]), 1.0, 2)
    return good, assign


@pytest.mark.parametrize("which", [0, 1])
def test_randomize_batch_with_no_user_returns_empty_reports(which):
    params = small_rounds()[which]
    for empty in (np.zeros((0, 2)), np.zeros(0), []):
        sub, a, y = client.randomize_batch(empty, params, [])
        assert sub.shape == a.shape == y.shape == (0,) and sub.dtype == np.int64
    with pytest.raises(ValueError):  # points without seeds are an error, not silently dropped
        client.randomize_batch(np.zeros((1, 2)), params, [])


def test_client_runner_skips_a_batch_where_no_row_chose_the_round():
    from dpspark.ldp import spark as ldp_spark

    params = small_rounds()[1]
    run_key = run_keys(1, "runner")[0]
    keys = [f"user-{i}" for i in range(40)]
    rounds = client.choose_round_batch(ldp_spark.client_seeds(run_key, keys), FRACTIONS)
    cols = ["_u0", "_u1"]
    none_in_3 = pd.DataFrame({ldp_spark.KEY: [k for k, r in zip(keys, rounds) if r != 3]})
    mixed = pd.DataFrame({ldp_spark.KEY: keys})
    for pdf in (none_in_3, mixed):
        pdf["_u0"], pdf["_u1"] = 0.5, 0.5
    assert len(none_in_3) > 0 and 0 < np.sum(rounds == 3) < len(keys)
    run = ldp_spark.client_runner(params, run_key, FRACTIONS, 3, cols)
    out = list(run(iter([none_in_3, mixed.iloc[:0], mixed])))
    assert len(out) == 1  # only the mixed batch reports
    idx = np.nonzero(rounds == 3)[0]
    seeds = ldp_spark.client_seeds(run_key, [keys[i] for i in idx])
    sub, a, y = client.randomize_batch(np.full((len(idx), 2), 0.5), params, seeds)
    assert np.array_equal(out[0]["a"].to_numpy(), a) and np.array_equal(out[0]["y"].to_numpy(), y)


# ----------------------------------------------------------------------------
# Defect 2 (+ 13) through Spark: the keys of identical rows


def test_identical_rows_get_distinct_keys_whatever_the_partitioning(spark):
    from dpspark.ldp import spark as ldp_spark

    run_key = Randomness(7).run_key
    copies = {(75.0, 75.0): 5, (25.0, 25.0): 3, (10.0, 90.0): 1}
    rows = [p for p, m in copies.items() for _ in range(m)] + [(0.0, 0.0), (-0.0, -0.0), (float("nan"), 1.0)]
    pdf = pd.DataFrame(rows, columns=["x", "y"])
    first = collect_keys(ldp_spark.keyed_points(spark.createDataFrame(pdf), ("x", "y"), None, DOMAIN, run_key)[0])
    shuffled = spark.createDataFrame(pdf.sample(frac=1.0, random_state=3)).repartition(3)
    second = collect_keys(ldp_spark.keyed_points(shuffled, ("x", "y"), None, DOMAIN, run_key)[0])
    # One key per row (the NaN row reports from the domain's center: the number of reports must not
    # depend on values), all distinct, the same (key, point) pairs whatever the order and
    # partitioning (so a retried task re-sends the same reports).
    assert len(first) == len(rows)
    assert sorted(first.columns) == sorted([ldp_spark.DUP, *UNIT2])  # no key string made in the JVM
    keys = ldp_spark.record_keys(first, UNIT2)
    assert len(set(keys)) == len(keys) and {len(k) for k in keys} == {24}
    pd.testing.assert_frame_equal(first, second)
    assert ldp_spark.record_keys(second, UNIT2) == keys
    # Rows with the same point are numbered 0..m-1 (0.0 and -0.0 are the same point).
    content = pd.Series([k[:16] for k in keys])
    index = first[ldp_spark.DUP]
    assert sorted(index.groupby(content).max().add(1).tolist()) == [1, 1, 2, 3, 5]
    assert sorted(index.groupby(content).apply(lambda s: sorted(s) == list(range(len(s)))).tolist()) == [True] * 5
    # The old, content-only keying gives these rows repeated keys: the check above catches it.
    assert not content.is_unique

    # With a privacy unit, two people with identical rows are keyed by their units.
    people = pd.DataFrame({"user": ["a", "b", "b"], "x": [75.0, 75.0, 20.0], "y": [75.0, 75.0, 20.0]})
    keyed = collect_keys(ldp_spark.keyed_points(spark.createDataFrame(people), ("x", "y"), "user", DOMAIN, run_key)[0])
    # keys are the typed encoding of the unit (dpspark.privacy.bounding.unit_key): string tag 5, length, UTF-8
    assert keyed[ldp_spark.KEY].tolist() == [b"\x05" + (1).to_bytes(8, "big") + b"a", b"\x05" + (1).to_bytes(8, "big") + b"b"]


def test_simulate_mode_on_heavily_duplicated_data(spark):
    """Four points, 150 copies each, in batches of 7 rows (most batches hold copies of
    one point only, so, with the old keying, no row of the batch chose the round and
    the client crashed; defect 13). The Spark reports equal the numpy client's on the
    keys Spark produced, and the copies of one point split between the rounds.

    Confidence: with independent clients, the number of a point's 150 copies in round 2
    is Binomial(150, 1/4), which is 0 or 150 with probability < 2e-19 (x 4 points);
    the old keying puts all copies of a point in the same round (0 or 150, always).
    """
    from dpspark.ldp import spark as ldp_spark
    from dpspark.ldp.estimator import LocalDP

    points = [(20.0, 20.0), (22.0, 21.0), (80.0, 75.0), (79.0, 77.0)]
    pdf = pd.DataFrame([p for p in points for _ in range(150)], columns=["x", "y"])
    df = spark.createDataFrame(pdf).coalesce(1)
    run_key = Randomness(5).run_key
    old = spark.conf.get(MAX_BATCH, None)
    spark.conf.set(MAX_BATCH, "7")
    try:
        keyed, _ = ldp_spark.keyed_points(df, ("x", "y"), None, DOMAIN, run_key)
        params = protocol.assign_round(np.array([[-0.6, -0.6], [0.6, 0.5]]), 2.0, 2)
        hist = ldp_spark.simulate_round(keyed, params, run_key, FRACTIONS, 2, 2)
        model = LocalDP(k=2, epsilon=2.0, domain=DOMAIN, features=("x", "y"), seed=5).fit(df)
    finally:
        if old is None:
            spark.conf.unset(MAX_BATCH)
        else:
            spark.conf.set(MAX_BATCH, old)
    assert model.centers.shape == (2, 2) and np.all(np.isfinite(model.centers))

    local = collect_keys(keyed)
    seeds = ldp_spark.client_seeds(run_key, ldp_spark.record_keys(local, UNIT2))
    chosen = np.nonzero(client.choose_round_batch(seeds, FRACTIONS) == 2)[0]
    sub, a, y = client.randomize_batch(local[["_u0", "_u1"]].to_numpy()[chosen], params, [seeds[i] for i in chosen])
    expected = protocol.Histogram.from_reports(sub, a, y)
    got = pd.DataFrame({"sub": hist.sub, "a": hist.a, "y": hist.y, "n": hist.count}).sort_values(["sub", "a", "y"])
    assert got["n"].tolist() == expected.count.tolist()
    assert np.array_equal(got[["sub", "a", "y"]].to_numpy(), np.stack([expected.sub, expected.a, expected.y], 1))
    per_point = local.iloc[chosen].groupby(["_u0", "_u1"]).size()
    assert len(local) == 600 and len(per_point) == 4 and all(0 < c < 150 for c in per_point)


@pytest.mark.parametrize("unit", [None, "user"])
def test_first_pass_gives_every_round_the_reports_of_its_own_pass(spark, unit):
    """Issue 15: round 1's pass also sorts the records into their rounds, and rounds 2 and 3 read
    only their own clients. Every round's histogram is the one a full pass over all the keyed
    points gives (``simulate_round``), bit for bit, with duplicated rows, small Arrow batches
    and keys by content or by privacy unit; each record lands in exactly one round, its own draw."""
    from dpspark.ldp import spark as ldp_spark

    rng = np.random.default_rng(4)
    pts = np.round(rng.uniform(0, 100, size=(300, 2)), 0)  # many repeated points
    pdf = pd.DataFrame({"user": [f"u{i}" for i in range(len(pts))], "x": pts[:, 0], "y": pts[:, 1]})
    df = spark.createDataFrame(pdf).repartition(3)
    run_key = Randomness(12).run_key
    keyed, _ = ldp_spark.keyed_points(df, ("x", "y"), unit, DOMAIN, run_key)
    good, assign = small_rounds()
    assign3 = protocol.assign_round(np.array([[-0.2, 0.1], [0.4, -0.6], [0.9, 0.9]]), 1.0, 3)
    old = spark.conf.get(MAX_BATCH, None)
    spark.conf.set(MAX_BATCH, "16")
    try:
        split = ldp_spark.first_pass(keyed, good, run_key, FRACTIONS, 2).persist()
        got = {1: ldp_spark.round_histogram(split, 1),
               2: ldp_spark.simulate_round(ldp_spark.round_points(split, 2, 2), assign, run_key, FRACTIONS, 2, 2),
               3: ldp_spark.simulate_round(ldp_spark.round_points(split, 3, 2), assign3, run_key, FRACTIONS, 3, 2)}
        full = {r: ldp_spark.simulate_round(keyed, p, run_key, FRACTIONS, r, 2)
                for r, p in ((1, good), (2, assign), (3, assign3))}
        later = {r: collect_keys(ldp_spark.round_points(split, r, 2)) for r in (2, 3)}
        split.unpersist()
    finally:
        if old is None:
            spark.conf.unset(MAX_BATCH)
        else:
            spark.conf.set(MAX_BATCH, old)
    for r in (1, 2, 3):
        a, b = got[r], full[r]
        order_a = np.lexsort((a.y, a.a, a.sub))
        order_b = np.lexsort((b.y, b.a, b.sub))
        for f in ("sub", "a", "y", "count"):
            assert np.array_equal(getattr(a, f)[order_a], getattr(b, f)[order_b]), (r, f)
    everyone = collect_keys(keyed)
    rounds = client.choose_round_batch(
        ldp_spark.client_seeds(run_key, ldp_spark.record_keys(everyone, UNIT2)), FRACTIONS)
    assert got[1].total == int(np.sum(rounds == 1)) > 0
    for r in (2, 3):
        mine = everyone.iloc[np.nonzero(rounds == r)[0]].reset_index(drop=True)
        pd.testing.assert_frame_equal(later[r][everyone.columns], mine[everyone.columns])
        assert len(later[r]) > 0


# ----------------------------------------------------------------------------
# Defect 2: the statistics of two identical rows


def report_cells(points, keys, params, rks) -> np.ndarray:
    """For each run key, each client's whole output as one cell: (round - 1) * g^2 + a * g + y."""
    from dpspark.ldp import spark as ldp_spark

    g = params.oracle.g
    seeds = [s for rk in rks for s in ldp_spark.client_seeds(rk, keys)]
    rounds = client.choose_round_batch(seeds, FRACTIONS)
    pts = np.tile(np.asarray(points, dtype=np.float64), (len(rks), 1))
    sub, a, y = client.randomize_batch(pts, params, seeds)
    assert not sub.any()
    return ((rounds - 1) * g * g + a * g + y).reshape(len(rks), len(keys))


def marginal(point, params) -> np.ndarray:
    """Exact distribution of one client's cell (up to 2^-53): round, then a uniform, then y by OLH."""
    g, p = params.oracle.g, params.oracle.p
    v = client.nearest_index(np.asarray(point).reshape(1, -1), params.centers)[0]
    out = np.zeros(3 * g * g)
    for r in range(3):
        for a in range(g):
            h = oracle.hash_values([a], [v], params.oracle)[0]
            for y in range(g):
                out[r * g * g + a * g + y] = FRACTIONS[r] / g * (p if y == h else (1 - p) / (g - 1))
    return out


def independence_checks(cells_prime, cells, pm_a, pm_b, epsilon) -> dict:
    """Three checks on N trials (one run key each) of two clients A and B.

    ``cells_prime``: both hold x (D'); ``cells``: A holds x' and B holds x (D).
    - chi-square of the joint (A, B) cells of D' against the product of the exact
      marginals (729 cells, 728 degrees of freedom): p-value > 1e-6;
    - the number of trials of D' with equal outputs is Binomial(N, sum_c P[c]^2)
      under independence: both tails > 1e-7;
    - the estimated privacy loss of the event "A and B send the same output" between
      D and D' (the attack of defect 2) is <= epsilon + MARGIN (``privacy_stats``:
      > 6 standard errors, false alarm < 1e-8).
    A correct implementation fails one of them with probability < 2e-6 (Bonferroni).
    """
    n, cells_n = cells_prime.shape[0], len(pm_a)
    joint = np.bincount(cells_prime[:, 0] * cells_n + cells_prime[:, 1], minlength=cells_n**2)
    expected = n * np.outer(pm_a, pm_b).reshape(-1)
    assert expected.min() >= 5  # the chi-square approximation holds
    chi2_p = float(stats.chi2.sf(np.sum((joint - expected) ** 2 / expected), cells_n**2 - 1))
    equal = int(np.sum(cells_prime[:, 0] == cells_prime[:, 1]))
    pi = float(np.dot(pm_a, pm_b))
    binom_tail = min(float(stats.binom.cdf(equal, n, pi)), float(stats.binom.sf(equal - 1, n, pi)))
    loss = estimated_loss(cells_prime[:, 0] == cells_prime[:, 1], cells[:, 0] == cells[:, 1])
    return {"chi2_p": chi2_p, "binom_tail": binom_tail, "loss": loss,
            "ok": chi2_p > 1e-6 and binom_tail > 1e-7 and loss <= epsilon + MARGIN}


def test_identical_rows_send_independent_reports(spark):
    """Two people with the same record x, N = 60000 seeded run keys: their outputs are
    independent (joint = product of the exact marginals, equal-output rate as for
    independent clients) and the equal-output event leaks at most epsilon between
    D' = {A: x, B: x} and D = {A: x', B: x}. The keys are those ``keyed_points``
    produces in Spark; the seeds and reports are the production client's.
    The content-only keying of the old code (the keys without their duplicate index)
    sends identical reports and is caught by the same checks.
    """
    from dpspark.ldp import spark as ldp_spark

    x, x2 = (75.0, 75.0), (25.0, 25.0)
    run_key = Randomness(1).run_key  # keys do not depend on it without a privacy unit
    same = collect_keys(ldp_spark.keyed_points(spark.createDataFrame([x, x], ["x", "y"]), ("x", "y"), None, DOMAIN, run_key)[0])
    diff = collect_keys(ldp_spark.keyed_points(spark.createDataFrame([x2, x], ["x", "y"]), ("x", "y"), None, DOMAIN, run_key)[0])
    diff = diff.sort_values("_u0").reset_index(drop=True)  # A (x') first, then B (x)
    u, u2 = same[["_u0", "_u1"]].to_numpy(), diff[["_u0", "_u1"]].to_numpy()
    assert np.allclose(u, 0.5) and np.allclose(u2[0], -0.5) and np.allclose(u2[1], 0.5)

    epsilon = 1.0
    params = protocol.assign_round(np.array([[-0.5, -0.5], [0.5, 0.5]]), epsilon, 2)  # g = 3: 27 cells
    rks = run_keys(60_000, "dup-rows")
    pm = marginal(u[0], params)
    keys_same, keys_diff = ldp_spark.record_keys(same, UNIT2), ldp_spark.record_keys(diff, UNIT2)
    assert keys_same[0] != keys_same[1]

    fixed = independence_checks(report_cells(u, keys_same, params, rks), report_cells(u2, keys_diff, params, rks),
                                pm, pm, epsilon)
    assert fixed["ok"], fixed

    def content_only(keys):  # the point's bytes without the duplicate index (its last 8 bytes)
        return [k[:-8] for k in keys]

    broken = independence_checks(report_cells(u, content_only(keys_same), params, rks),
                                 report_cells(u2, content_only(keys_diff), params, rks), pm, pm, epsilon)
    assert not broken["ok"] and broken["chi2_p"] < 1e-6 and broken["binom_tail"] < 1e-7, broken
    assert broken["loss"] > epsilon + 1.5  # ln(1 / P_D[equal]) = ln(1 / 0.042) = 3.2: e^3.2 against e^1


# ----------------------------------------------------------------------------
# Defect 6: labelled sub-keys, no key in a query plan, contribution bounding


def test_sub_keys_are_labelled_and_independent():
    r = Randomness(3)
    sub = r.subkey("contribution-bounding")
    assert sub == derive_key(r.run_key, "contribution-bounding") and len(sub) == 64
    assert sub != r.run_key and sub != derive_key(Randomness(4).run_key, "contribution-bounding")
    with pytest.raises(ValueError):
        r.subkey("no-such-use")


def plan_text(df) -> str:
    """Everything Spark shows of a DataFrame's plan (explain modes and the query execution)."""
    jvm = df.sparkSession._jvm
    qe = df._jdf.queryExecution()
    shown = [qe.toString()] + [jvm.PythonSQLUtils.explainString(qe, m) for m in ("extended", "formatted", "cost")]
    return "\n".join(shown)


def test_run_key_and_sub_keys_stay_out_of_query_plans(spark):
    from pyspark.sql import functions as F

    from dpspark import tables
    from dpspark.ldp import spark as ldp_spark
    from dpspark.privacy.bounding import bound_contributions

    run_key = Randomness(9).run_key
    secrets = [run_key, derive_key(run_key, "contribution-bounding")]
    pdf = pd.DataFrame({"user": [1, 1, 2, 3], "x": [10.0, 20.0, 30.0, 30.0], "y": [5.0, 6.0, 7.0, 7.0]})
    df = spark.createDataFrame(pdf)
    keyed_unit = ldp_spark.keyed_points(df, ("x", "y"), "user", DOMAIN, run_key)[0]
    keyed_rows = ldp_spark.keyed_points(df, ("x", "y"), None, DOMAIN, run_key)[0]
    params = protocol.assign_round(np.array([[-0.5, -0.5], [0.5, 0.5]]), 1.0, 2)
    frames = {
        "bound_contributions": bound_contributions(df, "user", ["x", "y"], run_key),
        "tables.prepare_points": tables.prepare_points(df, ("x", "y"), "user", DOMAIN, run_key)[0],
        "ldp keyed_points (unit)": keyed_unit,
        "ldp keyed_points (rows)": keyed_rows,
        "ldp clients": keyed_unit.mapInPandas(
            ldp_spark.client_runner(params, run_key, FRACTIONS, 1, tables.unit_columns(2)), ldp_spark.REPORT_SCHEMA),
        "ldp first pass (rows)": ldp_spark.first_pass(keyed_rows, small_rounds()[0], run_key, FRACTIONS, 2),
        "ldp round 2 of the first pass (unit)": ldp_spark.round_points(
            ldp_spark.first_pass(keyed_unit, small_rounds()[0], run_key, FRACTIONS, 2), 2, 2),
    }
    for name, frame in frames.items():
        before = plan_text(frame)
        frame.collect()  # the executed (adaptive, final) plan too
        text = before + plan_text(frame)
        assert not [s for s in secrets if s in text], name
    # The check catches the old way of keying (the key as a SQL literal).
    old = df.withColumn("k", F.sha2(F.concat_ws("|", F.lit(run_key), F.col("user").cast("string")), 256))
    assert run_key in plan_text(old)


def test_contribution_bounding_semantics(spark):
    """900 people with the same three rows each: one row kept per person, deterministic
    per run key and independent of partitioning, each row kept by about a third of the
    people. Confidence: chi-square with 2 degrees of freedom, p-value > 1e-6. A keying
    without the person (the defect class of defect 2) makes everybody keep the same
    row, and the same check catches it.
    """
    from dpspark.privacy import bounding

    rows = [(10.0, 10.0), (50.0, 50.0), (90.0, 20.0)]
    pdf = pd.DataFrame([(u, *r) for u in range(900) for r in rows], columns=["user", "x", "y"])
    run_key = Randomness(12).run_key
    cols = ["user", "x", "y"]

    def kept(frame, key):
        out = bounding.bound_contributions(frame, "user", cols, key).toPandas()
        return out.sort_values("user").reset_index(drop=True)

    first = kept(spark.createDataFrame(pdf), run_key)
    again = kept(spark.createDataFrame(pdf.sample(frac=1.0, random_state=5)).repartition(3), run_key)
    other = kept(spark.createDataFrame(pdf), Randomness(13).run_key)
    assert first["user"].tolist() == list(range(900))
    pd.testing.assert_frame_equal(first, again)
    assert not first.equals(other)

    def uniform_p(choice_counts) -> float:
        return float(stats.chisquare(choice_counts, np.full(3, sum(choice_counts) / 3)).pvalue)

    counts = first.groupby("x").size().reindex([r[0] for r in rows], fill_value=0).to_numpy()
    assert uniform_p(counts) > 1e-6, counts

    # Broken: the same keyed hash without the person (everyone has the same keys).
    keys = bounding.row_keys(derive_key(run_key, bounding.LABEL))
    contents = pd.Series([hashlib.sha256(repr(r).encode()).hexdigest() for r in rows])
    no_person = keys(pd.Series([""] * 3), contents)
    broken = np.zeros(3, dtype=int)
    broken[int(np.argmin(no_person.to_numpy()))] = 900
    assert uniform_p(broken) < 1e-6


def test_client_to_unit_is_the_domains_total_map():
    """The device-side map equals Domain.clip_to_unit bit for bit on extreme values (1e308 in a ball
    of radius 0.5 was NaN, 1e200 with R >= 1 was the origin), and is always finite in [-1, 1]."""
    from dpspark.privacy.domain import Domain

    r = np.random.default_rng(0)
    vals = [0.0, 1e308, -1e308, 5e-324, 1e200, np.nan, np.inf, -np.inf, 0.3, -0.7, 3.0]
    for radius in (0.5, 1.0, 2.0, 1e-300, 1e300):
        domain = Domain(3, radius=radius)
        for _ in range(300):
            p = r.choice(vals, size=3)
            u = client.to_unit(p, {"radius": radius})
            assert np.array_equal(u, domain.clip_to_unit(p)[0]), (radius, p)
            assert np.all(np.isfinite(u)) and np.linalg.norm(u) <= 1.0 + 1e-12
    assert np.allclose(client.to_unit([1e200, 0.0, 0.0], {"radius": 2.0}), [1.0, 0.0, 0.0])
    box = Domain(3, lower=(-1e308, 0.0, -5.0), upper=(1e308, 1.0, 5.0))
    for _ in range(300):
        p = r.choice(vals, size=3)
        u = client.to_unit(p, {"lower": box.lower, "upper": box.upper})
        assert np.array_equal(u, box.clip_to_unit(p)[0]) and np.all(np.abs(u) <= 1.0)
