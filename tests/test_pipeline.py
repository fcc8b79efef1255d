"""End to end on real Delta tables: reading, schema errors, outputs, idempotent run ids and attempts,
CLI exit codes.

``make_config`` fixes ``seed: 7`` (with ``unsafe_fixed_seed: true``, without which a seed is refused):
those runs are reproducible and therefore NOT PRIVATE, which the outputs must say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from dpspark import tables
from dpspark.cli import main
from dpspark.privacy.domain import Domain

from conftest import ROOT, blobs

PY = sys.executable


def points_frame(n_per=300, seed=1):
    x = blobs(n_per, [(20, 20), (80, 30), (50, 80)], 5.0, seed)
    return pd.DataFrame({"user": np.arange(len(x)), "x": x[:, 0], "y": x[:, 1]})


def make_config(tmp_path, input_path, **overrides):
    cfg = {
        "input": {"path": input_path, "format": "delta", "features": ["x", "y"]},
        "domain": {"lower": [0, 0], "upper": [100, 100]},
        "privacy": {"epsilon": 1.0, "delta": 0.0},
        "algorithm": {"name": "dplloyd", "k": 3, "variant": "average_k", "iterations": 5},
        "output": {"path": str(tmp_path / "out")},
        "seed": 7,
        "unsafe_fixed_seed": True,  # a seed is refused without it: such runs are NOT PRIVATE
        "spark": {"conf": {"spark.ui.enabled": False}},
    }
    for key, value in overrides.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp_path / f"cfg-{len(list(tmp_path.glob('cfg-*')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path), cfg


def read_summary(cfg, run_id=None):
    """summary.json, or the per-run copy summary/<run_id>.json."""
    name = "summary.json" if run_id is None else os.path.join("summary", f"{run_id}.json")
    with open(os.path.join(cfg["output"]["path"], name)) as handle:
        return json.load(handle)


def set_budget(spark, ledger_path, input_path, epsilon=10.0, delta=0.0, guarantee="central"):
    """What the ledger's administrator does before any run can be charged to ``input_path``."""
    from dpspark.privacy.ledger import Ledger

    key = tables.ledger_key_of(spark, input_path)
    Ledger(spark, ledger_path).set_budget(key, epsilon, delta, guarantee=guarantee)
    return key


def test_delta_round_trip_records_the_version_read(spark, tmp_path, write_delta):
    path = write_delta(points_frame())
    df, version = tables.load_table(spark, path, "delta")
    assert version == 0 and df.count() == 900
    spark.createDataFrame(points_frame(10, seed=2)).write.format("delta").mode("append").save(path)
    df, version = tables.load_table(spark, path, "delta")
    assert version == 1 and df.count() == 930
    cfg_path, cfg = make_config(tmp_path, path)
    assert main(["run", "--config", cfg_path, "--run-id", "v1"], spark=spark) == 0
    runs = spark.read.format("delta").load(cfg["output"]["path"] + "/runs").collect()
    # One row for the one attempt (its "running" row was replaced by its end), with the version read.
    assert [(r.run_id, r.attempt, r.status, r.input_version) for r in runs] == [("v1", 1, "succeeded", 1)]
    assert runs[0].input_key == tables.ledger_key_of(spark, path) and runs[0].input_key.startswith("delta-table:")
    assert read_summary(cfg)["input"]["version"] == 1  # as in runs/ and the --json line


def test_cli_run_writes_every_output_and_exact_privacy(spark, tmp_path, write_delta, monkeypatch):
    from dpspark.runner import read_operator_record

    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))
    path = write_delta(points_frame())
    cfg_path, cfg = make_config(tmp_path, path, **{"algorithm.variant": "allocation_nk", "algorithm.iterations": 6})
    assert main(["run", "--config", cfg_path, "--run-id", "full"], spark=spark) == 0
    out = cfg["output"]["path"]
    summary = read_summary(cfg)
    assert summary["status"] == "succeeded" and summary["k"] == 3 and len(summary["centers"]) == 3
    assert summary["run_id"] == "full" and summary["attempt"] == 1 and summary["guarantee"] == "central"
    assert abs(summary["epsilon_spent"] - 1.0) <= 1e-9 and summary["delta_spent"] == 0.0
    assert abs(sum(c["epsilon"] for c in summary["charges"]) - 1.0) <= 1e-9
    # seed 7: NOT PRIVATE, and every output says so.
    assert summary["private"] is False and "NOT PRIVATE" in summary["privacy_note"]
    assert summary["input"] == {"path": path, "key": tables.ledger_key_of(spark, path), "format": "delta",
                                "where": None, "version": 0}
    assert read_summary(cfg, "full") == summary  # the per-run copy a downstream task reads
    assert summary["outputs"]["run_summary"] == os.path.join(out, "summary", "full.json")
    # Wall times grow with n: NON-PRIVATE operational metadata, kept out of the published outputs
    # (no diagnostics here) and recorded in the operator log ($DPSPARK_OPERATOR_LOG).
    assert "timings" not in summary and "non_private_timings" not in summary
    centers = spark.read.format("delta").load(out + "/centers").orderBy("cluster_id").toPandas()
    assert list(centers.columns) == ["run_id", "attempt", "cluster_id", "x", "y", "noisy_weight", "private"]
    assert len(centers) == 3 and set(centers.run_id) == {"full"} and not centers["private"].any()
    # Real clusters at (20,20), (80,30), (50,80): each found within 10 units at epsilon = 1, n = 900.
    found = centers[["x", "y"]].to_numpy()
    for truth in [(20, 20), (80, 30), (50, 80)]:
        assert np.min(np.linalg.norm(found - np.array(truth), axis=1)) < 10
    runs = spark.read.format("delta").load(out + "/runs").collect()
    assert len(runs) == 1
    run = runs[0]
    assert (run.run_id, run.attempt, run.status) == ("full", 1, "succeeded")
    assert abs(run.epsilon_spent - 1.0) < 1e-9 and run.seed == 7 and run.private is False
    assert "NOT PRIVATE" in run.privacy_note and run.guarantee == "central"
    assert run.charged is False and run.fit_started is True  # no ledger: nothing charged, but the fit ran
    assert run.input_key == summary["input"]["key"] and run.input_version == 0
    assert run.non_private_operational is None  # not in runs/ (under the analyst's output path)
    assert "dplloyd: fit" in read_operator_record(spark, "full", 1)["timings"]
    with open(out + "/report.png", "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    page = open(out + "/report.html", encoding="utf-8").read()
    assert summary["outputs"]["report_html"].endswith("/report.html")
    assert "data:image/png;base64," in page and "NOT PRIVATE" in page  # seed 7: the page says so
    assert page.count("<tr>") >= 1 + 3 + 1 + len(summary["charges"])  # centers, charges rows
    assert "dplloyd: fit" not in page  # no wall times in the published page


def test_same_run_id_is_not_run_twice_unless_forced(spark, tmp_path, write_delta, capsys):
    """A retry of a run id that succeeded releases and charges nothing; --force is a new, charged attempt.

    No seed here (a private run): a forced attempt then draws fresh noise, so "a new release" is visible
    in the centers themselves."""
    from dpspark.privacy.ledger import Ledger

    path = write_delta(points_frame(100))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=10.0)
    cfg_path, cfg = make_config(tmp_path, path, **{"seed": None, "privacy.ledger": ledger_path, "output.report": False})
    out = cfg["output"]["path"]

    def centers_of(run_id, attempt=None):
        df = spark.read.format("delta").load(out + "/centers").where(f"run_id = '{run_id}'")
        if attempt is None:  # the latest attempt's release
            df = df.where(f"attempt = {df.agg({'attempt': 'max'}).first()[0]}")
        else:
            df = df.where(f"attempt = {attempt}")
        return df.orderBy("cluster_id").select("x", "y", "noisy_weight").toPandas().to_numpy()

    def charges():
        return [(e["run_id"], e["attempt"]) for e in Ledger(spark, ledger_path).runs(key) if e["status"] == "charged"]

    assert main(["run", "--config", cfg_path, "--run-id", "again"], spark=spark) == 0
    first, first_summary = centers_of("again"), read_summary(cfg)
    assert first_summary["private"] is True and first_summary["privacy_note"] is None
    from delta.tables import DeltaTable

    centers_version = DeltaTable.forPath(spark, out + "/centers").history(1).first()["version"]
    capsys.readouterr()
    # The retry (an Airflow "clear task"): exit 0, nothing charged, written or released.
    assert main(["run", "--config", cfg_path, "--run-id", "again"], spark=spark) == 0
    assert "already succeeded" in capsys.readouterr().out
    assert DeltaTable.forPath(spark, out + "/centers").history(1).first()["version"] == centers_version
    assert np.array_equal(centers_of("again"), first) and read_summary(cfg) == first_summary
    assert charges() == [("again", 1)]
    runs = spark.read.format("delta").load(out + "/runs")
    assert [(r.attempt, r.status) for r in runs.where("run_id = 'again'").collect()] == [(1, "succeeded")]
    # --force: a deliberate new release, recorded as attempt 2 and charged again.
    assert main(["run", "--config", cfg_path, "--run-id", "again", "--force"], spark=spark) == 0
    forced = centers_of("again")
    assert forced.shape == (3, 3) and not np.array_equal(forced, first)  # fresh noise: a new release
    assert read_summary(cfg)["attempt"] == 2 and read_summary(cfg, "again")["attempt"] == 2
    # the release it replaces is kept: attempt 1's centers and summary are still there, unchanged
    assert np.array_equal(centers_of("again", attempt=1), first)
    assert json.loads((tmp_path / "out" / "summary" / "again" / "1.json").read_text()) == first_summary
    assert json.loads((tmp_path / "out" / "summary" / "again" / "2.json").read_text()) == read_summary(cfg)
    assert charges() == [("again", 1), ("again", 2)]
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(2.0)
    assert main(["run", "--config", cfg_path, "--run-id", "other"], spark=spark) == 0
    centers = spark.read.format("delta").load(out + "/centers")
    assert centers.where("run_id = 'again'").count() == 6 and centers.count() == 9  # one set of centers per attempt
    runs = spark.read.format("delta").load(out + "/runs")
    assert sorted((r.run_id, r.attempt, r.status) for r in runs.collect()) == [
        ("again", 1, "succeeded"), ("again", 2, "succeeded"), ("other", 1, "succeeded")]  # every attempt kept


@pytest.mark.parametrize("partitions", [1, 3, 17])
def test_exact_aggregates_do_not_depend_on_partitioning(spark, partitions):
    from dpspark.dplloyd.core import numpy_aggregate
    from dpspark.steps.lloyd_pass import spark_aggregate

    x = np.random.default_rng(3).uniform(-1, 1, size=(2000, 3))
    df = spark.createDataFrame(pd.DataFrame(x, columns=["_u0", "_u1", "_u2"])).repartition(partitions)
    centroids = np.random.default_rng(4).uniform(-1, 1, size=(7, 3))
    counts, sums = spark_aggregate(df, ["_u0", "_u1", "_u2"])(centroids)
    ref_counts, ref_sums = numpy_aggregate(x)(centroids)
    assert counts.dtype == np.int64 and sums.dtype == np.int64
    assert np.array_equal(counts, ref_counts) and np.array_equal(sums, ref_sums)


def test_invalid_rows_are_dropped_and_points_clipped(spark, write_delta):
    pdf = pd.DataFrame({"x": [10.0, np.nan, np.inf, 30.0, None, -50.0, 250.0],
                        "y": [10.0, 5.0, 5.0, -np.inf, 5.0, 50.0, 100.0]})
    df, _ = tables.load_table(spark, write_delta(pdf), "delta")
    unit, _ = tables.prepare_points(df, ("x", "y"), None, Domain(2, (0.0, 0.0), (100.0, 100.0)), "k")
    got = np.array(sorted(map(tuple, unit.toPandas().to_numpy())))
    assert np.allclose(got, [(-1.0, 0.0), (-0.8, -0.8), (1.0, 1.0)])  # clipped into the box, never dropped


def test_array_and_vector_feature_columns(spark):
    from pyspark.ml.linalg import Vectors

    rows = [([1.0, 2.0],), ([3.0, 4.0],), ([5.0],)]  # the last has the wrong length: dropped
    df = spark.createDataFrame(rows, "v ARRAY<DOUBLE>")
    domain = Domain(2, (0.0, 0.0), (10.0, 10.0))
    unit, names = tables.prepare_points(df, ("v",), None, domain, "k")
    assert names == ["v_0", "v_1"] and unit.count() == 2
    vec = spark.createDataFrame([(Vectors.dense([1.0, 2.0]),), (Vectors.dense([3.0, 4.0]),)], ["v"])
    unit, _ = tables.prepare_points(vec, ("v",), None, domain, "k")
    assert np.allclose(sorted(unit.toPandas()["_u0"]), [-0.8, -0.4])


def test_contribution_bounding_keeps_one_row_per_person(spark):
    # Person 0 owns 1000 rows (x from 0 to 99); persons 1..20 own one row each at x = 99.5, so the
    # smallest kept x is person 0's.
    pdf = pd.DataFrame({"person": [0] * 1000 + list(range(1, 21)),
                        "x": np.r_[np.linspace(0, 99, 1000), np.full(20, 99.5)], "y": 50.0})
    df = spark.createDataFrame(pdf)
    domain = Domain(2, (0.0, 0.0), (100.0, 100.0))
    unit, _ = tables.prepare_points(df, ("x", "y"), "person", domain, "run-key-a")
    kept = unit.toPandas()
    assert len(kept) == 21  # the person with 1000 rows has the influence of a person with one
    again, _ = tables.prepare_points(df, ("x", "y"), "person", domain, "run-key-a")
    assert np.array_equal(np.sort(kept["_u0"]), np.sort(again.toPandas()["_u0"]))  # deterministic per run key
    chosen = set()
    for key in range(12):
        u, _ = tables.prepare_points(df, ("x", "y"), "person", domain, f"run-key-{key}")
        chosen.add(round(float(u.toPandas()["_u0"].min()), 6))
    # different run keys pick different rows of person 0: 12 uniform picks among 1000 rows repeat
    # one at most with probability > 0.99 (deterministic for these run keys)
    assert len(chosen) >= 11


def test_empty_table_releases_noise_only_output(spark, tmp_path):
    path = str(tmp_path / "empty")
    spark.createDataFrame([], "x DOUBLE, y DOUBLE").write.format("delta").save(path)
    cfg_path, cfg = make_config(tmp_path, path)
    assert main(["run", "--config", cfg_path], spark=spark) == 0
    assert len(read_summary(cfg)["centers"]) == 3


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_parquet_and_csv_inputs(spark, tmp_path, fmt):
    path = str(tmp_path / f"in-{fmt}")
    pdf = points_frame(50).assign(name="a")
    if fmt == "csv":  # one cell that is not a number: with inferred types it would turn x into a string column
        pdf["x"] = pdf["x"].astype(str)
        pdf.loc[0, "x"] = "n/a"
    writer = spark.createDataFrame(pdf).coalesce(1).write.mode("overwrite")
    writer.option("header", True).csv(path) if fmt == "csv" else writer.parquet(path)
    # parquet: also diagnostics (no ledger here), which adds the NON-PRIVATE wall times to summary.json
    cfg_path, cfg = make_config(tmp_path, path, **{"input.format": fmt, "diagnostics": fmt == "parquet",
                                                   "output.report": False})
    assert main(["run", "--config", cfg_path], spark=spark) == 0
    summary = read_summary(cfg)
    assert summary["input"]["format"] == fmt
    assert summary["input"]["key"] == "file:" + os.path.realpath(path)
    if fmt == "parquet":
        assert "dplloyd: fit" in summary["non_private_timings"] and "non_private_diagnostics" in summary
    else:
        assert "timings" not in summary and "non_private_timings" not in summary
        # CSV features are cast to double without reading the data; the non-numeric cell is a null and its
        # row is dropped like a missing value; only the feature columns are kept.
        from dpspark import config as config_mod

        table = tables.load_input(spark, config_mod.load_config(cfg_path).input)
        assert table.df.dtypes == [("x", "double"), ("y", "double")]
        assert table.df.count() == 150 and table.df.where("x IS NULL").count() == 1
        unit, _ = tables.prepare_points(table.df, ("x", "y"), None, Domain(2, (0.0, 0.0), (100.0, 100.0)), "k")
        assert unit.count() == 149


@pytest.mark.parametrize("case", ["missing table", "missing column", "text column", "missing unit"])
def test_schema_errors_exit_with_their_code_and_release_nothing(spark, tmp_path, write_delta, case, capsys):
    """A missing table is exit 1 (``failed``); a column the config names that the table lacks or holds
    as text is a config mistake: exit 2, ``invalid_config`` in runs/ (issue 29, item 6)."""
    pdf = points_frame(20).assign(name="a")
    path = write_delta(pdf)
    overrides = {
        "missing table": {"input.path": str(tmp_path / "nope")},
        "missing column": {"input.features": ["x", "z"]},
        "text column": {"input.features": ["x", "name"]},
        "missing unit": {"input.privacy_unit": "person_id"},
    }[case]
    cfg_path, cfg = make_config(tmp_path, path, **overrides)
    code, status = (1, "failed") if case == "missing table" else (2, "invalid_config")
    assert main(["run", "--config", cfg_path, "--run-id", "bad"], spark=spark) == code
    err = capsys.readouterr().err
    words = {"missing table": "not found", "missing column": "'z'", "text column": "'name'", "missing unit": "'person_id'"}[case]
    assert words in err
    # The attempt is recorded (a "running" row written at its start, then its end), nothing is released.
    out = cfg["output"]["path"]
    runs = spark.read.format("delta").load(out + "/runs").collect()
    assert [(r.run_id, r.attempt, r.status, r.charged, r.fit_started) for r in runs] == [("bad", 1, status, False, False)]
    assert words in runs[0].error
    assert sorted(os.listdir(out)) == ["runs"]  # no centers, summary.json, summary/ or report


def test_transform_adds_predictions(spark, tmp_path, write_delta):
    from dpspark.dplloyd.estimator import DPLloyd

    df = spark.createDataFrame(points_frame(100))
    model = DPLloyd(k=3, epsilon=2.0, domain=Domain(2, (0.0, 0.0), (100.0, 100.0)), features=("x", "y"),
                    variant="average_k", iterations=5, seed=3).fit(df)
    assert model.centers.shape == (3, 2) and abs(model.epsilon_spent - 2.0) < 1e-9
    labelled = model.transform(df).toPandas()
    assert set(labelled["prediction"]) <= {0, 1, 2}
    # rows of one true blob share a label
    assert labelled.iloc[:100]["prediction"].nunique() == 1


def test_bad_config_exits_2_before_spark_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"input": {"path": "x", "features": ["a", "b"]}, "domain": {"lower": [0, 0], "upper": [1, 1]},
                                   "privacy": {"epsilon": -1}, "algorithm": {"name": "dplloyd", "k": 2}, "output": {"path": "o"}}))
    start = time.time()
    proc = subprocess.run([PY, "-m", "dpspark.cli", "run", "--config", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "privacy.epsilon" in proc.stderr and "> 0" in proc.stderr
    assert "Spark" not in proc.stderr and time.time() - start < 20
    proc = subprocess.run([PY, "-m", "dpspark.cli", "run", "--config", "conf/demo.yaml", "--set", "algorithm.k=zero"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "algorithm.k" in proc.stderr
    proc = subprocess.run([PY, "-m", "dpspark.cli", "advance", "--config", "conf/demo.yaml"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "algorithm.mode" in proc.stderr
    proc = subprocess.run([PY, "-m", "dpspark.cli", "run"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--config" in proc.stderr
    proc = subprocess.run([PY, "-m", "dpspark.cli", "run", "--config", "conf/demo.yaml", "--run-id", "bad id!"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--run-id" in proc.stderr


def test_unsafe_config_combinations_exit_2_before_spark_starts(tmp_path, capsys):
    """No session is passed and none may be built: each config is refused before Spark (exit 2)."""
    cases = [
        ({"unsafe_fixed_seed": False}, "seed"),  # a seed makes the run NOT PRIVATE: it must be asked for
        ({"diagnostics": True, "privacy.ledger": str(tmp_path / "ledger")}, "diagnostics"),
        ({"algorithm.name": "maxcover", "privacy.delta": 1e-6, "algorithm.variant": None, "algorithm.iterations": None,
          "algorithm.candidates": "table", "algorithm.candidate_table": str(tmp_path / "in") + "/"},
         "algorithm.candidate_table"),  # the input itself, spelt with a trailing slash
    ]
    for overrides, key in cases:
        cfg_path, _ = make_config(tmp_path, str(tmp_path / "in"), **overrides)
        assert main(["run", "--config", cfg_path]) == 2, overrides
        assert f"'{key}'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "ledger").exists()


def test_spark_submit_entry_point(tmp_path, spark, write_delta):
    """jobs/cluster.py under spark-submit: same arguments, exit code passed through, master from spark-submit.
    With a ledger on the local disk the driver needs dpspark's log store (the README's two flags):
    without them the charge is refused (exit 3, naming the setting) and nothing is charged or released."""
    from dpspark.privacy.ledger import Ledger
    from dpspark.session import EXCLUSIVE_LOG_STORE, LOG_STORE_JAR, cached_delta_jars

    path = write_delta(points_frame(50))
    ledger_path = str(tmp_path / "ledger")
    set_budget(spark, ledger_path, path)
    # spark-submit's session has Spark's defaults (dpspark's local ones are for its own local sessions):
    # 200 shuffle partitions and 50 per Delta snapshot, hundreds of empty tasks for 150 rows on one core.
    small = {"spark.ui.enabled": False, "spark.sql.shuffle.partitions": 2, "spark.databricks.delta.snapshotPartitions": 1}
    cfg_path, cfg = make_config(tmp_path, path, spark={"conf": small}, **{"privacy.ledger": ledger_path})
    submit = os.path.join(os.path.dirname(PY), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=PY, PYSPARK_DRIVER_PYTHON=PY)
    env.pop("DPSPARK_LEDGER_SINGLE_WRITER", None)
    cmd = [submit, "--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    job = ["jobs/cluster.py", "--config", cfg_path, "--run-id", "submitted"]
    refused = subprocess.run(cmd + ["--jars", ",".join(cached_delta_jars())] + job, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert f"spark.delta.logStore.file.impl={EXCLUSIVE_LOG_STORE}" in refused.stdout + refused.stderr
    assert not os.path.exists(os.path.join(cfg["output"]["path"], "summary.json"))
    assert not os.path.exists(os.path.join(cfg["output"]["path"], "centers"))
    key = tables.ledger_key_of(spark, path)
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == 0.0
    # (--jars: the store's class extends Delta's, so it must be in the class loader of Delta's JARs)
    store = ["--jars", ",".join(cached_delta_jars() + [LOG_STORE_JAR]),
             "--conf", f"spark.delta.logStore.file.impl={EXCLUSIVE_LOG_STORE}"]
    proc = subprocess.run(cmd + store + job, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_summary(cfg)["run_id"] == "submitted"
    assert "released centers" in proc.stdout
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == 1.0
