"""The ldp family: client randomizer, frequency oracle, protocol, Spark simulate / ingest, CLI.

Every random draw is seeded. Statistical tests state their confidence next to the
assertion; with the fixed seeds they are deterministic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from dpspark.config import validate
from dpspark.errors import ConfigError
from dpspark.ldp import client, oracle, protocol
from dpspark.ldp.oracle import OracleParams
from dpspark.privacy.domain import Domain

from conftest import ROOT, blobs

BLOB_CENTERS = [(20.0, 20.0), (80.0, 30.0), (50.0, 80.0)]
DOMAIN = Domain(dim=2, lower=(0.0, 0.0), upper=(100.0, 100.0))
from privacy_stats import MARGIN, estimated_loss  # noqa: E402


def seeds(n: int, tag: str) -> list[bytes]:
    return [client.user_seed(tag, str(i)) for i in range(n)]


def small_good_centers(epsilon: float, dim: int = 1, buckets: int = 2) -> client.GoodCentersRound:
    settings = protocol.Settings(radii=1, hashes=1, buckets=buckets, projection_dim=dim)
    return protocol.good_centers_round(dim, epsilon, settings, 2.0, np.random.default_rng(0))


# ----------------------------------------------------------------------------
# Client


def test_client_imports_numpy_only():
    code = r"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pyspark', 'py4j', 'pandas', 'sklearn', 'delta') or name.startswith('dpspark.privacy'):
            raise ImportError('blocked: ' + name)
        return None
sys.meta_path.insert(0, Block())
import numpy as np
from dpspark.ldp import client, oracle
params = client.AssignRound(oracle=oracle.OracleParams.create(1.0, 3), centers=np.eye(3)[:, :2])
r = client.randomize([0.1, 0.2], params, bytes(32))
banned = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pandas') or m.startswith('dpspark.privacy')]
print('OK', r.a, r.y, banned)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK") and out.stdout.strip().endswith("[]")


def test_client_is_deterministic_given_its_randomness_and_reads_only_its_inputs():
    params = small_good_centers(2.0, dim=2, buckets=64)
    before = json.dumps(params.to_dict())
    point = np.array([0.3, -0.4])
    seed = client.user_seed("key", "user-1")
    first = client.randomize(point, params, seed)
    np.random.seed(1)  # the global numpy state must not matter
    assert client.randomize(point.copy(), params, seed) == first
    np.random.seed(2)
    assert client.randomize(point, params, seed) == first
    assert json.dumps(params.to_dict()) == before  # the public parameters are not modified
    # A Generator as randomness: the same generator state gives the same report.
    g1, g2 = np.random.default_rng(7), np.random.default_rng(7)
    assert client.randomize(point, params, g1) == client.randomize(point, params, g2)
    # The batch form is the same function row by row.
    pts = np.random.default_rng(3).uniform(-1, 1, size=(50, 2))
    ss = seeds(50, "batch")
    sub, a, y = client.randomize_batch(pts, params, ss)
    for r in range(50):
        rep = client.randomize(pts[r], params, ss[r])
        assert (rep.sub, rep.a, rep.y) == (sub[r], a[r], y[r])
    # Reports are small ints in the public ranges, and different seeds give different reports.
    assert set(sub) <= set(range(params.subs)) and a.max() < params.oracle.pool and y.max() < params.oracle.g
    assert len(set(zip(sub, a, y))) > 25
    # The round a user answers does not depend on its point (only on its randomness).
    assert client.choose_round(seed, (0.5, 0.25, 0.25)) in (1, 2, 3)
    with pytest.raises(TypeError):
        client.randomize(point, params, 12345)


def test_record_keys_of_rows_are_their_point_and_duplicate_index_in_fixed_width_bytes():
    """Without a privacy unit a row's record key is its unit-space point (binary64, big-endian, -0.0
    as 0.0) and its duplicate index (int64, big-endian): fixed width, hence injective, no hash; the
    batch seeds equal ``user_seed`` for string and bytes keys."""
    import struct

    pts = np.array([[0.25, -0.0], [0.25, 0.0], [0.25, 0.0], [-1.0, 1.0], [np.nextafter(0.25, 1), 0.0]])
    dup = np.array([0, 1, 0, 0, 0])
    keys = client.point_record_keys(pts, dup)
    assert keys[0] == struct.pack(">ddq", 0.25, 0.0, 0) == keys[2]  # -0.0 is 0.0: the same point
    assert keys[1] == struct.pack(">ddq", 0.25, 0.0, 1) and keys[4] == struct.pack(">ddq", np.nextafter(0.25, 1), 0.0, 0)
    assert {len(k) for k in keys} == {24} and len(set(keys)) == 4
    assert client.point_record_keys(np.zeros((0, 3)), []) == []
    run_key = "ab" * 32
    mixed = keys + ["user-1", "ünïcode", ""]
    assert client.client_seeds(run_key, mixed) == [client.user_seed(run_key, k) for k in mixed]
    assert client.user_seed(run_key, "x") == client.user_seed(run_key, b"x")  # str keys are UTF-8
    assert client.user_seed(run_key, keys[1]) != client.user_seed(run_key, keys[0])


def test_nearest_index_is_the_coordinatewise_sum_rule_in_blocks():
    """The blocked, in-place nearest_index gives the labels of the plain rule (d2 = d2 + (x_t - c_t)^2
    for t = 0..d-1, first minimum) bit for bit: ties at equal distance, more rows than one block,
    one row at a time (a real client) and the whole batch agree."""
    rng = np.random.default_rng(9)
    c = rng.uniform(-1, 1, size=(37, 5))
    x = np.concatenate([rng.uniform(-1, 1, size=(3000, 5)), c[[3, 3, 7]], (c[[1]] + c[[2]]) / 2])
    c = np.concatenate([c, c[[3]]])  # a duplicate center: the first of the two wins
    d2 = np.zeros((len(x), len(c)))
    for t in range(x.shape[1]):
        d2 = d2 + (x[:, t : t + 1] - c[None, :, t]) ** 2
    ref = np.argmin(d2, axis=1)
    got = client.nearest_index(x, c)
    assert got.dtype == np.int64 and np.array_equal(got, ref)
    assert [int(client.nearest_index(x[i : i + 1], c)[0]) for i in range(0, len(x), 97)] == ref[::97].tolist()
    assert client.nearest_index(np.zeros((0, 5)), c).shape == (0,)


def test_round_parameters_round_trip_exactly_through_json():
    p1 = small_good_centers(1.5, dim=3, buckets=128)
    back = client.round_from_dict(json.loads(json.dumps(p1.to_dict())))
    assert back.to_dict() == p1.to_dict()
    for name in ("widths", "projections", "shifts", "mixers"):
        assert np.array_equal(getattr(back, name), getattr(p1, name))
    p2 = protocol.assign_round(np.array([[0.1, 0.2], [-0.3, 1 / 3]]), 1.0, 2)
    back2 = client.round_from_dict(json.loads(json.dumps(p2.to_dict())))
    assert np.array_equal(back2.centers, p2.centers) and back2.oracle == p2.oracle and back2.round == 2


def _encoded(params, point, n, tag):
    sub, a, y = client.randomize_batch(np.tile(point, (n, 1)), params, seeds(n, tag))
    return (sub * params.oracle.pool + a) * params.oracle.g + y


@pytest.mark.parametrize("kind", ["assign", "good_centers"])
def test_report_distribution_passes_the_statistical_privacy_test(kind):
    eps, n = 1.0, 300_000
    if kind == "assign":
        honest = protocol.assign_round(np.array([[-0.8, -0.8], [0.8, 0.8], [0.0, 0.9]]), eps, 2)
        x, x2 = np.array([-0.7, -0.9]), np.array([0.9, 0.7])
    else:
        honest = small_good_centers(eps, dim=1, buckets=2)
        x, x2 = np.array([-0.95]), np.array([0.95])
    # Honest client: every report value with >= 2000 draws on both sides has an estimated
    # log-ratio <= eps + 0.2. Each log-ratio has sd <= sqrt(2/2000) = 0.032, so 0.2 is > 6 sd
    # (false alarm < 1e-8 per value, Gaussian approximation).
    loss = estimated_loss(_encoded(honest, x, n, "a"), _encoded(honest, x2, n, "b"))
    assert loss <= eps + MARGIN
    assert loss >= eps - MARGIN  # power: the bound is attained (hashes that separate the two items)
    # A deliberately broken client that uses 2 * eps while claiming eps is caught.
    broken = type(honest)(**{**honest.__dict__, "oracle": OracleParams.create(2 * eps, honest.oracle.domain)})
    assert estimated_loss(_encoded(broken, x, n, "c"), _encoded(broken, x2, n, "d")) > eps + MARGIN


# ----------------------------------------------------------------------------
# Frequency oracle


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_oracle_estimates_are_unbiased_within_their_stated_variance(eps):
    rng = np.random.default_rng(int(eps * 10))
    params = OracleParams.create(eps, 40)
    n, reps = 20_000, 150
    freq = np.zeros(params.domain)
    freq[:5] = [8000, 5000, 3000, 2000, 1000]
    freq[5:] = (n - freq[:5].sum()) / (params.domain - 5)
    values = np.repeat(np.arange(params.domain), freq.astype(int))
    values = np.concatenate([values, np.full(n - len(values), params.domain - 1)])
    truth = np.bincount(values, minlength=params.domain).astype(float)
    est = np.empty((reps, params.domain))
    for r in range(reps):
        a, y = oracle.perturb(values, rng.random(n), rng.random(n), params)
        est[r] = oracle.estimate_from_reports(a, y, params)
    var = oracle.variance(truth, n, params)
    # Unbiased: the mean of 150 estimates is within 4.5 standard errors of the truth for all
    # 40 values (two-sided Gaussian tail 7e-6 each, < 3e-4 for all 40 together).
    z = (est.mean(axis=0) - truth) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < 4.5), z
    # The stated variance is right: the sample variance over 150 runs is within +-35% (the
    # relative sd of a sample variance is sqrt(2/149) = 0.12: 3 sd).
    ratio = est.var(axis=0, ddof=1) / var
    assert np.all((ratio > 0.65) & (ratio < 1.35)), ratio


@pytest.mark.parametrize("eps, domain", [(0.5, 7), (1.0, 2048), (2.0, 300), (2.0, 1), (4.0, 40)])
def test_support_counts_many_equals_support_counts_per_group(eps, domain):
    """The stacked (BLAS) support counts of round 1's server are exact: the same integers as one
    ``support_counts`` per group, for g = 2, 3, 7 (matrix products) and 53 (per-group fallback),
    with empty groups, repeated (a, y) pairs and a group holding every report."""
    params = OracleParams.create(eps, domain)
    rng = np.random.default_rng(domain)
    groups = [([], [], [])]
    for size in (1, 50, 3000):
        a = rng.integers(0, params.pool, size)
        y = rng.integers(0, params.g, size)
        groups.append((a, y, rng.integers(1, 10**6, size)))
    groups.append((np.zeros(5, int), np.zeros(5, int), np.full(5, 3)))
    many = oracle.support_counts_many(groups, params)
    assert many.dtype == np.int64 and many.shape == (len(groups), params.domain)
    for s, (a, y, c) in enumerate(groups):
        assert np.array_equal(many[s], oracle.support_counts(a, y, c, params)), s
    assert oracle.support_counts_many([], params).shape == (0, params.domain)


def test_oracle_parameters():
    assert OracleParams.create(1.0, 10).g == 3 and OracleParams.create(4.0, 10).g in (53, 59)
    p = OracleParams.create(2.0, 2048)
    assert p.pool >= 2048 and p.pool < 2048 * p.g
    # The hash family is exactly universal: over all a, h_a(v) = h_a(v') for exactly pool / g of them.
    a = np.arange(p.pool)
    hv = oracle.hash_values(a, np.full(p.pool, 17), p)
    hw = oracle.hash_values(a, np.full(p.pool, 1234), p)
    assert int(np.sum(hv == hw)) * p.g == p.pool


# ----------------------------------------------------------------------------
# Config


def _raw(**algo):
    return {"input": {"path": "x", "features": ["x", "y"]}, "domain": {"lower": [0, 0], "upper": [1, 1]},
            "privacy": {"epsilon": 2.0, "delta": 0.0}, "algorithm": {"name": "ldp", "k": 3, **algo},
            "output": {"path": "o"}}


def test_config_keys_are_validated():
    cfg = validate(_raw())
    assert cfg.algorithm.params.mode == "simulate" and cfg.algorithm.params.fractions == (0.5, 0.25, 0.25)
    assert validate(_raw(objective="kmedian", mode="ingest", protocol_path="p", reports_path="r")).algorithm.params.mode == "ingest"
    for bad, key in ((dict(mode="ingest"), "algorithm.protocol_path"),
                     (dict(mode="ingest", protocol_path="p"), "algorithm.reports_path"),
                     (dict(fractions=[0.5, 0.5, 0.5]), "algorithm.fractions"),
                     (dict(fractions=[0.5, 0.5]), "algorithm.fractions"),
                     (dict(mode="live"), "algorithm.mode"),
                     (dict(buckets=1), "algorithm.buckets"),
                     (dict(iterations=3), "algorithm.iterations")):
        with pytest.raises(ConfigError) as err:
            validate(_raw(**bad))
        assert err.value.key == key


# ----------------------------------------------------------------------------
# Spark: simulate, ingest, CLI


def blob_frame(n_per: int, seed: int = 1) -> pd.DataFrame:
    x = blobs(n_per, BLOB_CENTERS, 5.0, seed)
    return pd.DataFrame({"user": np.arange(len(x)), "x": x[:, 0], "y": x[:, 1]})


def _near_all_blobs(centers, tolerance):
    c = np.asarray(centers)
    return all(np.min(np.linalg.norm(c - np.asarray(b), axis=1)) < tolerance for b in BLOB_CENTERS)


def test_simulate_and_ingest_give_the_same_centers_for_the_same_reports(spark, tmp_path, write_delta):
    from dpspark.cli import main
    from dpspark.ldp import spark as ldp_spark
    from dpspark.ldp.estimator import AwaitingReports, LocalDP
    from dpspark.privacy.ledger import Ledger
    from dpspark.privacy.randomness import Randomness

    pdf = blob_frame(2000, seed=2)
    path = write_delta(pdf)
    df = spark.read.format("delta").load(path)
    common = dict(k=3, epsilon=4.0, domain=DOMAIN, features=("x", "y"), privacy_unit="user", seed=11)
    simulated = LocalDP(**common).fit(df)
    assert simulated.epsilon_spent == 4.0 and simulated.delta_spent == 0.0
    assert len(simulated.charges) == 1 and "LOCAL" in simulated.charges[0]["step"]
    assert simulated.info["candidates"] > 0 and not simulated.info["fallback_candidates"]

    # Real clients: the same users with the same secret seeds, outside Spark (numpy only).
    run_key = Randomness(11).run_key
    # the record key is the unit's typed encoding (dpspark.privacy.bounding.unit_key): int64 tag 2, big-endian
    user_seeds = [client.user_seed(run_key, b"\x02" + int(u).to_bytes(8, "big", signed=True)) for u in pdf["user"]]
    rounds = client.choose_round_batch(user_seeds, (0.5, 0.25, 0.25))
    unit = np.array([client.to_unit(p, {"lower": [0, 0], "upper": [100, 100]}) for p in pdf[["x", "y"]].to_numpy()])
    protocol_path, reports_path = str(tmp_path / "protocol"), str(tmp_path / "reports")
    ingest = LocalDP(**common, mode="ingest", protocol_path=protocol_path, reports_path=reports_path)
    for r in (1, 2, 3):
        if r == 1:  # nothing to release yet: the run stops (exit 1), round 1 is published
            with pytest.raises(AwaitingReports, match="round 1"):
                ingest.fit(df)
        elif r == 2:  # a CLI run made too early: exit 1 BEFORE the charge, nothing charged or written
            from dpspark import tables

            early_cfg = tmp_path / "early.yaml"
            ledger_path = str(tmp_path / "ledger")
            key = tables.ledger_key_of(spark, path)
            Ledger(spark, ledger_path).set_budget(key, 10.0, 0.0, guarantee="local")  # budget there: not why it stops
            early_cfg.write_text(yaml.safe_dump({
                "input": {"path": path, "features": ["x", "y"], "privacy_unit": "user"},
                "domain": {"lower": [0, 0], "upper": [100, 100]},
                "privacy": {"epsilon": 4.0, "delta": 0.0, "ledger": ledger_path},
                "algorithm": {"name": "ldp", "k": 3, "mode": "ingest", "protocol_path": protocol_path,
                              "reports_path": reports_path},
                "output": {"path": str(tmp_path / "out-early"), "report": False}, "seed": 11,
                "unsafe_fixed_seed": True}))
            assert main(["run", "--config", str(early_cfg), "--run-id", "early"], spark=spark) == 1
            ledger = Ledger(spark, ledger_path)
            assert ledger.totals(key, guarantee="local").spent_epsilon == 0.0
            assert [(e["run_id"], e["attempt"], e["status"]) for e in ledger.runs(key)] == [
                ("early", 1, "started"), ("early", 1, "awaiting")]
            runs = spark.read.format("delta").load(str(tmp_path / "out-early" / "runs")).collect()
            assert [(row.status, row.epsilon_spent, row.charged) for row in runs] == [("awaiting", 0.0, False)]
            assert not (tmp_path / "out-early" / "centers").exists()
            assert not (tmp_path / "out-early" / "summary.json").exists()
        else:  # the same walk without releasing anything
            status = ingest.advance(spark)
            assert status["status"] == "awaiting" and status["round"] == r
        params = ldp_spark.read_round_params(spark, protocol_path, r)
        assert params.round == r
        idx = np.nonzero(rounds == r)[0]
        sub, a, y = client.randomize_batch(unit[idx], params, [user_seeds[i] for i in idx])
        reports = pd.DataFrame({"sub": sub.astype(np.int32), "a": a, "y": y.astype(np.int32)})
        if r == 1:  # a malformed report is dropped, not counted
            reports = pd.concat([reports, pd.DataFrame({"sub": [10_000], "a": [0], "y": [0]})])
        spark.createDataFrame(reports).write.format("delta").save(ldp_spark.round_path(reports_path, r))

    # With every round's reports in, the CLI in ingest mode releases the same k centers as the
    # simulation (the ingesting job never reads the private rows) and records epsilon once.
    cfg = {"input": {"path": path, "features": ["x", "y"], "privacy_unit": "user"},
           "domain": {"lower": [0, 0], "upper": [100, 100]}, "privacy": {"epsilon": 4.0, "delta": 0.0},
           "algorithm": {"name": "ldp", "k": 3, "mode": "ingest", "protocol_path": protocol_path,
                         "reports_path": reports_path},
           "output": {"path": str(tmp_path / "out-ingest"), "report": False}, "seed": 11, "unsafe_fixed_seed": True}
    cfg_path = tmp_path / "ingest.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["advance", "--config", str(cfg_path)], spark=spark) == 0  # nothing left to publish, nothing charged
    assert not (tmp_path / "out-ingest").exists()
    assert main(["run", "--config", str(cfg_path)], spark=spark) == 0
    summary = json.loads((tmp_path / "out-ingest" / "summary.json").read_text())
    assert np.array_equal(np.asarray(summary["centers"]), simulated.centers)
    assert np.array_equal(np.asarray(summary["noisy_weights"]), simulated.noisy_weights)
    assert summary["epsilon_spent"] == 4.0 and summary["delta_spent"] == 0.0 and len(summary["charges"]) == 1


@pytest.mark.parametrize("objective", ["kmeans", "kmedian"])
def test_cli_end_to_end(spark, tmp_path, write_delta, objective, monkeypatch):
    """kmeans: charged to a ledger, in the LOCAL currency: a central cap does not admit an ldp run
    (exit 3), a local cap does, and the central total stays 0."""
    from dpspark import tables
    from dpspark.cli import main
    from dpspark.privacy.ledger import Ledger
    from dpspark.runner import read_operator_record

    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))

    path = write_delta(blob_frame(7000, seed=3).drop(columns=["user"]))
    ledger_path = str(tmp_path / "ledger")
    cfg = {"input": {"path": path, "features": ["x", "y"]}, "domain": {"lower": [0, 0], "upper": [100, 100]},
           "privacy": {"epsilon": 4.0, "delta": 0.0, "ledger": ledger_path if objective == "kmeans" else None},
           "algorithm": {"name": "ldp", "k": 3},
           "output": {"path": str(tmp_path / "out"), "report": False}, "seed": 21, "unsafe_fixed_seed": True}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    args = ["run", "--config", str(cfg_path), "--set", f"algorithm.objective={objective}"]
    if objective == "kmeans":
        key = tables.ledger_key_of(spark, path)
        ledger = Ledger(spark, ledger_path)
        ledger.set_budget(key, 100.0, 1e-5)  # central only
        assert main([*args, "--run-id", "no-local-cap"], spark=spark) == 3
        assert not (tmp_path / "out" / "summary.json").exists()
        ledger.set_budget(key, 8.0, 0.0, guarantee="local")
    assert main([*args, "--run-id", "ok"], spark=spark) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["objective"] == objective and len(summary["centers"]) == 3
    assert summary["epsilon_spent"] == 4.0 and summary["delta_spent"] == 0.0 and summary["guarantee"] == "local"
    assert sum(c["epsilon"] for c in summary["charges"]) == 4.0 and "LOCAL" in summary["charges"][0]["step"]
    assert summary["private"] is False  # seed 21
    # n = 21,000 users at epsilon = 4: every blob (sd 5) gets a released center within 10 units.
    assert _near_all_blobs(summary["centers"], 10.0), summary["centers"]
    # Exact report counts per round are NON-PRIVATE operational metadata: the operator log only, not
    # runs/ or the summary.
    run = spark.read.format("delta").load(str(tmp_path / "out" / "runs")).where("run_id = 'ok'").first()
    assert run.guarantee == "local" and run.non_private_operational is None
    assert "reports_per_round" in read_operator_record(spark, "ok", 1)["operational"]
    assert "reports_per_round" not in json.dumps(summary)
    if objective == "kmeans":
        assert ledger.totals(key, guarantee="local").spent_epsilon == 4.0
        assert ledger.totals(key).spent_epsilon == 0.0  # never added to the central total
        charged = [(e["run_id"], e["guarantee"], e["epsilon"]) for e in ledger.runs(key) if e["status"] in ("charged", "refused")]
        assert charged == [("no-local-cap", "local", 0.0), ("ok", "local", 4.0)]
