"""``output.table``: a run's outputs under catalog names (dpspark/catalog.py).

``output.table: db.clusters`` registers ``{output.path}/centers`` as ``db.clusters_centers`` and
``{output.path}/runs`` as ``db.clusters_runs`` (external Delta tables), once a run's centers are
written and before its summaries list them. Checked here: the name is validated like ``input.table``
before Spark starts; a run registers both names and ``spark.table`` reads its rows; a second run finds
them registered and adds its own; a name taken by another location or a view, or a database that
does not exist, refuses the run before anything is recorded or charged; a registration that fails
after the fit removes the attempt's outputs like any failure there.

The shared session's catalog is Spark's in-memory one: the database is created at a temporary
LOCATION (nothing under the project's spark-warehouse/) and dropped at the end, with every table in
it (external: dropping them deletes no output)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from dpspark import catalog, runner, tables
from dpspark.cli import main
from dpspark.config import load_config, validate
from dpspark.errors import ConfigError, DPSparkError
from dpspark.privacy.ledger import Ledger

from test_pipeline import make_config, points_frame, read_summary, set_budget

DB = "dpspark_test_out"


@pytest.fixture(scope="module")
def db(spark, tmp_path_factory):
    location = tmp_path_factory.mktemp("catalog") / f"{DB}.db"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DB} LOCATION '{location}'")
    yield DB
    spark.sql(f"DROP DATABASE IF EXISTS {DB} CASCADE")


def _config_dict(**output):
    return {"input": {"path": "data/points", "features": ["x", "y"]}, "domain": {"lower": [0, 0], "upper": [1, 1]},
            "privacy": {"epsilon": 1.0}, "algorithm": {"name": "dplloyd", "k": 3},
            "output": {"path": "out/x", **output}}


def _table_rows(spark, name, *columns):
    return sorted(tuple(r) for r in spark.table(name).select(*columns).collect())


def _path_rows(spark, path, *columns):
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).select(*columns).collect())


def test_output_table_is_validated_like_input_table(tmp_path, capsys):
    assert validate(_config_dict()).output.table is None  # default: nothing registered
    for name in ("clusters", "db.clusters", "main.db.clusters", "_x.y_2"):
        assert validate(_config_dict(table=name)).output.table == name
        assert validate({**_config_dict(), "input": {"table": name, "features": ["x", "y"]}}).input.table == name
    for bad in ("1clusters", "db.", ".x", "a.b.c.d", "db.clu-sters", "db.`x`", "db.x; DROP TABLE y", "db x", 5, ["a"]):
        with pytest.raises(ConfigError) as found:
            validate(_config_dict(table=bad))
        assert found.value.key == "output.table", bad
        with pytest.raises(ConfigError) as same:  # the same rule as input.table's
            validate({**_config_dict(), "input": {"table": bad, "features": ["x", "y"]}})
        assert same.value.key == "input.table", bad
    # --set takes the name as written (a text key); null unsets it
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_config_dict(table="db.old")))
    assert load_config(str(cfg), ["output.table=db.clusters"]).output.table == "db.clusters"
    assert load_config(str(cfg), ["output.table=null"]).output.table is None
    # the command line: exit 2 naming the key, before Spark starts (no session is given, none is built)
    assert main(["run", "--config", str(cfg), "--set", "output.table=db.bad-name"]) == 2
    assert "'output.table'" in capsys.readouterr().err
    assert catalog.registered_names("db.clusters") == {"centers": "db.clusters_centers", "runs": "db.clusters_runs"}
    assert catalog.registered_names(None) == {} and catalog.listed_outputs(None) == {}
    assert catalog.quoted("cat.db.x_runs") == "`cat`.`db`.`x_runs`"


def test_a_run_registers_both_names_and_the_next_run_adds_to_them(spark, db, tmp_path, write_delta, capsys):
    path = write_delta(points_frame(100))
    name = f"{db}.clusters"
    cfg_path, cfg = make_config(tmp_path, path, **{"output.table": name, "output.report": False})
    out = cfg["output"]["path"]
    assert main(["run", "--config", cfg_path, "--run-id", "day1", "--json"], spark=spark) == 0
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = read_summary(cfg)
    listed = {"centers_table": f"{name}_centers", "runs_table": f"{name}_runs"}
    assert {k: summary["outputs"][k] for k in listed} == listed == {k: outcome["outputs"][k] for k in listed}
    assert summary["outputs"]["centers"] == out + "/centers"  # the paths are still listed
    columns = ("run_id", "attempt", "cluster_id", "x", "y", "noisy_weight")
    assert _table_rows(spark, f"{name}_centers", *columns) == _path_rows(spark, out + "/centers", *columns)
    assert len(_table_rows(spark, f"{name}_centers", *columns)) == 3
    assert _table_rows(spark, f"{name}_runs", "run_id", "attempt", "status") == [("day1", 1, "succeeded")]
    for kind in ("centers", "runs"):
        assert spark.catalog.getTable(f"{name}_{kind}").tableType == "EXTERNAL"
    # A second run (a new run id) with the same output.table: the names are there already, it adds its rows.
    assert main(["run", "--config", cfg_path, "--run-id", "day2"], spark=spark) == 0
    assert read_summary(cfg)["outputs"]["runs_table"] == f"{name}_runs"
    assert sorted({r[0] for r in _table_rows(spark, f"{name}_centers", "run_id")}) == ["day1", "day2"]
    assert _table_rows(spark, f"{name}_runs", "run_id", "attempt", "status") == [
        ("day1", 1, "succeeded"), ("day2", 1, "succeeded")]
    # The same location under another spelling (a symlink, file:, a trailing slash) is this run's own.
    os.symlink(tmp_path / "out", tmp_path / "link")
    for spelling in (str(tmp_path / "link"), "file:" + out + "/"):
        catalog.check_output_tables(spark, name, runner.output_paths(tables.qualify(spelling)))
    # Another output.path under the same names: refused.
    with pytest.raises(ConfigError, match="output.table.*clusters_centers.*already a catalog table"):
        catalog.check_output_tables(spark, name, runner.output_paths(str(tmp_path / "elsewhere")))
    # A registration that fails (here: no such database) names output.table and the error's class only.
    with pytest.raises(DPSparkError) as failed:
        catalog.register_output_tables(spark, "dpspark_test_no_such_db.clusters", runner.output_paths(out))
    assert str(failed.value) == (f"output.table: could not register 'dpspark_test_no_such_db.clusters_centers' for "
                                 f"'{out}/centers' (AnalysisException [SCHEMA_NOT_FOUND])")
    # The names are pointers: dropping them leaves the outputs.
    for kind in ("centers", "runs"):
        spark.sql(f"DROP TABLE {name}_{kind}")
    assert len(_path_rows(spark, out + "/centers", "run_id")) == 6
    assert len(_path_rows(spark, out + "/runs", "run_id")) == 2


def test_a_taken_name_refuses_the_run_before_anything_is_charged(spark, db, tmp_path, write_delta, capsys):
    path = write_delta(points_frame(100))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=5.0)
    other = str(tmp_path / "other")
    spark.createDataFrame([(1,)], "a INT").write.format("delta").save(other)
    spark.sql(f"CREATE TABLE {db}.taken_runs USING DELTA LOCATION '{other}'")  # only one of the two names
    spark.sql(f"CREATE VIEW {db}.viewed_centers AS SELECT 1 AS a")
    cases = {f"{db}.taken": f"'{db}.taken_runs' is already a catalog table at",
             f"{db}.viewed": f"'{db}.viewed_centers' already exists in the catalog as a view",
             "dpspark_test_no_such_db.clusters": "the database 'dpspark_test_no_such_db' does not exist"}
    for name, message in cases.items():
        cfg_path, cfg = make_config(tmp_path, path, **{"seed": None, "privacy.ledger": ledger_path,
                                                       "output.report": False, "output.table": name})
        capsys.readouterr()
        assert main(["run", "--config", cfg_path, "--run-id", "taken", "--json"], spark=spark) == 2, name
        captured = capsys.readouterr()
        outcome = json.loads(captured.out.strip().splitlines()[-1])
        assert outcome["status"] == "invalid_config" and outcome["epsilon_spent"] == 0.0 and outcome["attempt"] is None
        assert outcome["error"].startswith("config key 'output.table': ") and message in outcome["error"], outcome["error"]
        # nothing charged, nothing recorded, nothing written, nothing registered
        ledger = Ledger(spark, ledger_path)
        assert ledger.totals(key).spent_epsilon == 0.0 and list(ledger.runs(key)) == []
        assert not os.path.exists(cfg["output"]["path"]), name
    assert not spark.catalog.tableExists(f"{db}.taken_centers") and not spark.catalog.tableExists(f"{db}.viewed_runs")
    # Once the name is free, the same config runs (and is charged once).
    spark.sql(f"DROP TABLE {db}.taken_runs")
    cfg_path, cfg = make_config(tmp_path, path, **{"seed": None, "privacy.ledger": ledger_path,
                                                   "output.report": False, "output.table": f"{db}.taken"})
    assert main(["run", "--config", cfg_path, "--run-id", "taken"], spark=spark) == 0
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(1.0)
    assert _table_rows(spark, f"{db}.taken_runs", "run_id", "status") == [("taken", "succeeded")]
    assert spark.read.format("delta").load(other).count() == 1  # the other table was not touched
    for table in ("taken_centers", "taken_runs"):
        spark.sql(f"DROP TABLE {db}.{table}")
    spark.sql(f"DROP VIEW {db}.viewed_centers")


def test_a_registration_that_fails_removes_the_attempts_outputs(spark, db, tmp_path, write_delta, monkeypatch, capsys):
    """After the fit (charged), a failed registration fails the attempt: its centers rows are removed,
    no summary is written, runs/ says failed, and the error names output.table (no data in it)."""
    path = write_delta(points_frame(100))
    name = f"{db}.broken"

    def fail(spark_, table, paths):
        raise DPSparkError(f"output.table: could not register {table + '_centers'!r} for {paths['centers']!r} "
                           "(AnalysisException)")

    monkeypatch.setattr(catalog, "register_output_tables", fail)
    cfg_path, cfg = make_config(tmp_path, path, **{"output.table": name, "output.report": False})
    out = cfg["output"]["path"]
    assert main(["run", "--config", cfg_path, "--run-id", "broken", "--json"], spark=spark) == 1
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert outcome["status"] == "failed" and "output.table: could not register" in outcome["error"]
    assert not os.path.exists(os.path.join(out, "summary.json"))
    assert not os.path.exists(os.path.join(out, "summary", "broken", "1.json"))
    assert _path_rows(spark, out + "/centers", "run_id") == []  # this attempt's rows removed
    assert _path_rows(spark, out + "/runs", "run_id", "status") == [("broken", "failed")]
    assert not spark.catalog.tableExists(f"{name}_centers")
