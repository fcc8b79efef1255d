"""Mistakes caught before the charge, and runs that say what they are (issue 29): a run without a
privacy ledger says it is unaccounted (before, it exited 0 with `private: true` and said nothing);
wrong-length bounds on an assembled vector are refused before the charge."""

from __future__ import annotations

import json

import pytest

from dpspark.cli import main

from test_pipeline import make_config, points_frame, read_summary


def test_validate_warns_that_a_run_without_a_ledger_is_unaccounted(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    cfg, _ = make_config(tmp_path, str(tmp_path / "t"), seed=None, unsafe_fixed_seed=False)
    assert main(["validate", "--config", cfg]) == 0
    assert "privacy.ledger is not set: this run is UNACCOUNTED" in capsys.readouterr().err
    with_ledger, _ = make_config(tmp_path, str(tmp_path / "t"), **{"privacy.ledger": str(tmp_path / "ledger")},
                                 seed=None, unsafe_fixed_seed=False)
    assert main(["validate", "--config", with_ledger]) == 0
    assert "UNACCOUNTED" not in capsys.readouterr().err


def test_validate_says_at_once_that_a_local_input_does_not_exist(tmp_path, monkeypatch, capsys):
    """No Spark: a typo in a local input.path is a warning of validate (exit 0: the config may be
    meant for another machine); an existing one, a remote URI or a Connect deployment say nothing."""
    for name in ("DPSPARK_REMOTE", "SPARK_REMOTE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "there").mkdir()
    said = {}
    for case, path in (("typo", str(tmp_path / "thre")), ("file uri", f"file://{tmp_path}/thre"),
                       ("exists", str(tmp_path / "there")), ("remote", "s3a://lake/points")):
        cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": str(tmp_path / "ledger")})
        assert main(["validate", "--config", cfg]) == 0, case
        said[case] = "does not exist on this machine" in capsys.readouterr().err
    assert said == {"typo": True, "file uri": True, "exists": False, "remote": False}
    monkeypatch.setenv("DPSPARK_REMOTE", "sc://localhost:15002")
    cfg, _ = make_config(tmp_path, str(tmp_path / "thre"), **{"privacy.ledger": str(tmp_path / "ledger")})
    assert main(["validate", "--config", cfg]) == 0
    assert "does not exist" not in capsys.readouterr().err


def test_a_run_without_a_ledger_says_unaccounted_everywhere(spark, tmp_path, write_delta, monkeypatch, capsys):
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    path = write_delta(points_frame(30))
    cfg_path, cfg = make_config(tmp_path, path, **{"output.report": False})
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # what dpspark logs, whatever handlers earlier tests left
    logger = logging.getLogger("dpspark")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    capsys.readouterr()
    try:
        assert main(["run", "--config", cfg_path, "--run-id", "free", "--json"], spark=spark) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    captured = capsys.readouterr()
    assert any("UNACCOUNTED" in line for line in seen)
    assert json.loads(captured.out.strip().splitlines()[-1])["accounting"] == "unaccounted"
    assert read_summary(cfg)["accounting"] == "unaccounted"


def test_wrong_length_bounds_on_an_assembled_vector_are_refused_before_the_charge(spark, tmp_path, write_delta):
    """Issue 29, item 1: VectorAssembler of 3 columns with 2-dimensional bounds charged the ledger and
    released noise (every vector of the wrong size was dropped). Its ML attribute metadata says 3."""
    from pyspark.ml.feature import VectorAssembler
    import pytest

    from dpspark import tables
    from dpspark.ml import DPClustering
    from dpspark.errors import SchemaError
    from dpspark.privacy.ledger import Ledger

    frame = points_frame(30)
    frame["z"] = frame["x"]
    path = write_delta(frame)
    ledger_path = str(tmp_path / "ledger")
    key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger_path).set_budget(key, 5.0, 0.0)
    df = spark.read.format("delta").load(path)
    assembled = VectorAssembler(inputCols=["x", "y", "z"], outputCol="features", handleInvalid="skip").transform(df)
    est = DPClustering(k=2, epsilon=1.0, lower=[0, 0], upper=[100, 100], featuresCol="features", algorithm="dplloyd",
                       ledgerPath=ledger_path, ledgerInput=path)
    with pytest.raises(SchemaError, match=r"'features' holds vectors of 3 values .* domain has 2 dimension"):
        est.fit(assembled)
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == 0.0
    assert tables.check_schema(assembled, ("features",), None, 3) == ["features_0", "features_1", "features_2"]


@pytest.mark.parametrize("ansi", ["true", "false"])
def test_a_null_vector_row_is_dropped_not_a_failure_after_the_charge(spark, ansi):
    """vector_to_array raises on a null vector ("requires a non-null input"): one record with a null
    features vector failed the fit after the charge. It is now dropped like any invalid row."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import StructField, StructType

    from dpspark import tables
    from dpspark.privacy.domain import Domain

    schema = StructType([StructField("features", VectorUDT(), True)])
    df = spark.createDataFrame([(Vectors.dense([10.0, 20.0]),), (None,), (Vectors.dense([30.0, 40.0]),),
                                (Vectors.dense([1.0, 2.0, 3.0]),)], schema)
    saved = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        unit, names = tables.prepare_points(df, ("features",), None, Domain(2, (0.0, 0.0), (100.0, 100.0)), "k" * 64)
        rows = unit.collect()
    finally:
        spark.conf.set("spark.sql.ansi.enabled", saved)
    assert names == ["features_0", "features_1"] and len(rows) == 2  # the null and the wrong-size rows dropped


def test_the_signature_histogram_never_outgrows_the_result_size_limit():
    """A collected histogram over spark.driver.maxResultSize failed the run after its charge exactly
    when the data had enough distinct signatures; max_signatures is lowered from public values."""
    from types import SimpleNamespace

    from dpspark.maxcover.estimator import signatures_within_result_limit

    def session(limit):
        return SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: limit))

    assert signatures_within_result_limit(session("1g"), 2_000_000, 1_000) == 2_000_000  # 2e6 x 157 B < 512 MiB
    lowered = signatures_within_result_limit(session("1g"), 2_000_000, 10_000)  # 1,282 key bytes a row
    assert 0 < lowered < 2_000_000 and (lowered + 2) * (10_000 // 8 + 32) <= (1 << 30) // 2
    assert signatures_within_result_limit(session("0"), 2_000_000, 10_000) == 2_000_000  # unlimited
    assert signatures_within_result_limit(session("1m"), 10, 10**9) == 1  # never below one


def test_set_budget_needs_no_delta_and_a_refusal_says_what_remains(spark, tmp_path, write_delta, capsys):
    """Issue 29, item 6: `set-budget` required --delta (pure-DP budgets have none), and a refused run
    did not say what was left."""
    from dpspark import tables
    from dpspark.privacy.ledger import Ledger

    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", path, "--epsilon", "1.5"], spark=spark) == 0
    key = tables.ledger_key_of(spark, path)
    assert Ledger(spark, ledger_path).totals(key).budget_delta == 0.0
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False},
                         seed=None, unsafe_fixed_seed=False)
    assert main(["run", "--config", cfg, "--run-id", "one"], spark=spark) == 0
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "two"], spark=spark) == 3
    assert "so epsilon=0.5, delta=0 remain" in capsys.readouterr().err


def _dpspark_log_lines():
    """A handler of its own on the dpspark logger (earlier tests may leave theirs on an old stderr)."""
    import logging

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    return seen, handler


def test_a_missing_feature_column_is_a_config_error_everywhere(spark, tmp_path, write_delta, capsys):
    """Issue 29, item 6: a feature column the table lacks was exit 1 and `failed` in runs/, while the
    README promises 2 for config mistakes and --json said invalid_config for a bad filter."""
    from dpspark import tables

    path = write_delta(points_frame(30))
    cfg_path, cfg = make_config(tmp_path, path, **{"input.features": ["x", "nope"], "output.report": False})
    capsys.readouterr()
    assert main(["run", "--config", cfg_path, "--run-id", "typo", "--json"], spark=spark) == 2
    captured = capsys.readouterr()
    status = json.loads(captured.out.strip().splitlines()[-1])
    assert status["status"] == "invalid_config" and status["exit_code"] == 2
    assert "'nope'" in status["error"] and "input.features" in status["error"]
    rows = tables.read_attempts(spark, cfg["output"]["path"] + "/runs", "typo")
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "invalid_config")]
    # the same for a filter naming a column the table lacks (found once the schema is read)
    where_path, where_cfg = make_config(tmp_path, path, **{"input.where": "nope > 1", "output.report": False})
    assert main(["run", "--config", where_path, "--run-id", "badwhere", "--json"], spark=spark) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "invalid_config"
    rows = tables.read_attempts(spark, where_cfg["output"]["path"] + "/runs", "badwhere")
    assert [(r["attempt"], r["status"]) for r in rows] == [(1, "invalid_config")]


def test_a_reused_run_id_with_another_config_says_what_changed(spark, tmp_path, write_delta):
    """Issue 29, item 5: a run id re-used with a changed config said nothing about the change."""
    import logging

    path = write_delta(points_frame(30))
    cfg_path, _ = make_config(tmp_path, path, **{"output.report": False})
    assert main(["run", "--config", cfg_path, "--run-id", "same"], spark=spark) == 0
    changed_path, _ = make_config(tmp_path, path, **{"output.report": False, "privacy.epsilon": 0.25})
    seen, handler = _dpspark_log_lines()
    logger = logging.getLogger("dpspark")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert main(["run", "--config", changed_path, "--run-id", "same"], spark=spark) == 0  # already succeeded
        assert main(["run", "--config", cfg_path, "--run-id", "same"], spark=spark) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    warned = [line for line in seen if "config differs" in line]
    assert len(warned) == 1 and "privacy.epsilon" in warned[0] and "run same" in warned[0], seen


def test_force_keeps_the_centers_of_a_table_written_before_the_attempt_column(spark, tmp_path, write_delta):
    """A centers/ table from an older dpspark (no attempt column) gets the column; its rows stay."""
    import numpy as np

    path = write_delta(points_frame(30))
    cfg_path, cfg = make_config(tmp_path, path, **{"output.report": False})
    out = cfg["output"]["path"]
    old = spark.createDataFrame([("old", 0, 1.0, 2.0, 5.0, True)],
                                "run_id STRING, cluster_id INT, x DOUBLE, y DOUBLE, noisy_weight DOUBLE, private BOOLEAN")
    old.write.format("delta").save(out + "/centers")
    assert main(["run", "--config", cfg_path, "--run-id", "new"], spark=spark) == 0
    assert main(["run", "--config", cfg_path, "--run-id", "new", "--force"], spark=spark) == 0
    rows = spark.read.format("delta").load(out + "/centers").collect()
    assert sorted((r.run_id, r.attempt) for r in rows if r.cluster_id == 0) == [("new", 1), ("new", 2), ("old", None)]
    assert np.isclose([r.x for r in rows if r.run_id == "old"], [1.0]).all()


def test_the_python_summary_has_cluster_sizes_degenerate_and_a_run_id_param(spark, tmp_path, write_delta):
    """Issue 29, item 6: DPClusteringSummary had no clusterSizes, no degenerate, and a fit could not
    be given its run id. With a ledger, a runId that succeeded is refused before any charge."""
    import numpy as np
    from pyspark.ml.feature import VectorAssembler

    from dpspark import tables
    from dpspark.degenerate import describe_collapse
    from dpspark.ml import DPClustering, DPClusteringModel, ParamError
    from dpspark.privacy.ledger import Ledger

    path = write_delta(points_frame(100))
    ledger_path = str(tmp_path / "ledger")
    key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger_path).set_budget(key, 5.0, 0.0)
    df = spark.read.format("delta").load(path)
    est = DPClustering(k=3, epsilon=1.0, lower=[0, 0], upper=[100, 100], algorithm="dplloyd", inputCols=["x", "y"],
                       ledgerPath=ledger_path, ledgerInput=path, runId="daily-1")
    s = est.fit(df).summary
    assert s.runId == "daily-1"
    weights = s.noisyWeights
    assert s.clusterSizes == [int(max(0.0, round(w))) for w in weights] and all(isinstance(c, int) for c in s.clusterSizes)
    assert s.degenerate == describe_collapse(np.array(s._state["centers"]), weights, 3, [100.0, 100.0], "dplloyd", 1.0)
    assert "degenerate" in s.asDict() and s.asDict()["clusterSizes"] == s.clusterSizes
    spent = Ledger(spark, ledger_path).totals(key).spent_epsilon
    with pytest.raises(ParamError, match="'daily-1' already succeeded"):
        est.fit(df)
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == spent  # refused before any charge
    with pytest.raises(ParamError, match="runId"):
        DPClustering(k=3, lower=[0, 0], upper=[100, 100], inputCols=["x", "y"], runId="../etc").fit(df)
    # a collapsed release says so (every weight on one center)
    model = est.copy({est.runId: "daily-2"}).fit(df)
    model._state = {**model._state, "noisyWeights": [300.0, 0.0, 0.0]}
    saved = str(tmp_path / "m")
    model._state["degenerate"] = describe_collapse(np.array(model._state["centers"]), [300.0, 0.0, 0.0], 3,
                                                   [100.0, 100.0], "dplloyd", 1.0)
    model.write().save(saved)
    loaded = DPClusteringModel.load(saved).summary
    assert loaded.degenerate is not None and loaded.degenerate == model.summary.degenerate and loaded.clusterSizes == [300, 0, 0]


def test_a_healthy_run_logs_no_spark_warnings_and_one_line_per_loop(spark, tmp_path, write_delta):
    """Issue 29, item 6: every run logged Spark's start-up WARN lines, two lines per maxcover
    threshold, and dplloyd's routine re-seeds. A whole `dpspark run` process on a small table."""
    import os
    import re
    import subprocess
    import sys

    path = write_delta(points_frame(200))
    cfg_path, _ = make_config(tmp_path, path, seed=None, unsafe_fixed_seed=False, **{
        "algorithm": {"name": "maxcover", "k": 3, "candidates": "grid", "candidate_count": 64},
        "privacy.delta": 1e-6, "output.report": False})
    env = {k: v for k, v in os.environ.items() if k not in ("DPSPARK_LEDGER", "PYSPARK_GATEWAY_PORT",
                                                           "PYSPARK_GATEWAY_SECRET", "DPSPARK_LOG_LEVEL")}
    done = subprocess.run([sys.executable, "-m", "dpspark.cli", "run", "--config", cfg_path], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    spark_lines = [line for line in err.splitlines() if re.search(r"\b(WARN|INFO)\b", line) and "[dpspark]" not in line]
    assert spark_lines == [], spark_lines
    assert "log4j profile" not in err and "setLogLevel" not in err
    assert "threshold 1/" not in err and err.count("coverage loop") == 2  # its "..." and its "done in"


def test_loop_passes_are_debug_lines_and_dplloyd_reseeds_are_not_warnings(spark, tmp_path, write_delta, monkeypatch):
    """A loop's passes are DEBUG lines: shown with $DPSPARK_LOG_LEVEL=DEBUG (the command line's
    configure_logging reads it), never at the default INFO."""
    import logging

    from dpspark.progress import log, step

    path = write_delta(points_frame(100))
    cfg_path, _ = make_config(tmp_path, path, **{"algorithm": {"name": "dplloyd", "k": 3, "variant": "allocation_nk",
                                                              "iterations": 6}, "output.report": False})
    records: list = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = records.append
    level = log.level
    log.addHandler(handler)
    monkeypatch.setenv("DPSPARK_LOG_LEVEL", "DEBUG")
    try:
        assert main(["run", "--config", cfg_path, "--run-id", "loop"], spark=spark) == 0
        with step("a pass of a loop", repeated=True):
            pass
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    shown = [r.getMessage() for r in records if r.levelno >= logging.INFO]
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    assert not [m for m in shown if "Spark aggregation pass" in m or "re-seeded" in m or "a pass of a loop" in m], shown
    assert any("iteration 1/6: Spark aggregation pass" in m for m in debug)
    assert any("a pass of a loop done in" in m for m in debug)


def test_an_assembler_that_fails_on_nulls_is_named_before_a_fit_without_a_ledger(spark):
    """Issue 29, item 2: the README's own VectorAssembler (default handleInvalid='error') failed the fit
    on a null with a JVM trace; now the fit says so before it starts (with a ledger it is refused,
    tests/test_ml_lineage.py), and the README shows handleInvalid='skip', which fits over the null."""
    import logging

    from pyspark.ml.feature import VectorAssembler

    from dpspark.ml import DPClustering
    from dpspark.progress import log

    df = spark.createDataFrame([(float(i % 50), float(i % 7)) for i in range(300)] + [(None, 1.0)], "x double, y double")
    seen, handler = _dpspark_log_lines()
    log.addHandler(handler)
    try:
        default = VectorAssembler(inputCols=["x", "y"], outputCol="features").transform(df)
        with pytest.raises(Exception):
            DPClustering(k=2, lower=[0, 0], upper=[50, 10], algorithm="dplloyd").fit(default)
        warned = [line for line in seen if "handleInvalid='error'" in line]
        assert len(warned) == 1, seen
        seen.clear()
        skip = VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip").transform(df)
        model = DPClustering(k=2, lower=[0, 0], upper=[50, 10], algorithm="dplloyd").fit(skip)
        assert len(model.clusterCenters()) == 2
        assert not [line for line in seen if "handleInvalid" in line], seen
    finally:
        log.removeHandler(handler)
