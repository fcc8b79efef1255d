"""Scheduled pipelines (issue 17): a week of daily runs over a growing Delta table, retries,
kills, pre-charge checks, the JSON status line, and docs/scheduling.md's cron line and Airflow
task."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from dpspark import tables
from dpspark.cli import main
from dpspark.errors import RunKilled
from dpspark.privacy.ledger import Ledger

from conftest import ROOT

DOC = ROOT / "docs" / "scheduling.md"


def day_rows(day: int, n: int = 60) -> pd.DataFrame:
    r = np.random.default_rng(100 + day)
    x = np.concatenate([r.normal(c, 4.0, size=(n // 3, 2)) for c in ((20, 20), (80, 30), (50, 80))])
    return pd.DataFrame({"x": x[:, 0], "y": x[:, 1], "day": day})


def daily_config(tmp_path, table, ledger, out, **extra) -> str:
    cfg = {
        "input": {"path": table, "format": "delta", "features": ["x", "y"]},
        "domain": {"lower": [0, 0], "upper": [100, 100]},
        "privacy": {"epsilon": 1.0, "delta": 0.0, "ledger": ledger},
        "algorithm": {"name": "dplloyd", "k": 3, "variant": "average_k", "iterations": 3},
        "output": {"path": out, "report": False},
    }
    for key, value in extra.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp_path / f"daily-{len(list(tmp_path.glob('daily-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def runs_of(spark, out):
    df = spark.read.format("delta").load(out + "/runs").orderBy("run_id", "attempt")
    return [(r.run_id, r.attempt, r.status, r.input_version, r.epsilon_spent) for r in df.collect()]


def centers_of(spark, out, run_id):
    return spark.read.format("delta").load(out + "/centers").where(f"run_id = '{run_id}'").count()


def test_a_week_of_daily_runs(spark, tmp_path, monkeypatch, capsys):
    """Day N appends rows and runs `day-N`; the budget (5 runs of epsilon 1) is the ledger's.

    Day 3 is killed during its fit (SIGTERM as RunKilled), retried after day 4's rows arrived:
    the retry reads day 3's version, is charged again (the killed fit may have logged noisy
    values) and releases once; a third try of day 3 does nothing. Day 5 is refused with exit 3
    and releases nothing; `dpspark ledger show` tells the story."""
    from dpspark.dplloyd.estimator import DPLloyd

    table, ledger_path, out = str(tmp_path / "events"), str(tmp_path / "ledger"), str(tmp_path / "out")
    spark.createDataFrame(day_rows(1)).coalesce(1).write.format("delta").save(table)
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", table, "--epsilon", "5", "--delta", "0"],
                spark=spark) == 0
    cfg = daily_config(tmp_path, table, ledger_path, out)
    key = tables.ledger_key_of(spark, table)
    ledger = Ledger(spark, ledger_path)

    def append(day):
        spark.createDataFrame(day_rows(day)).coalesce(1).write.format("delta").mode("append").save(table)

    assert main(["run", "--config", cfg, "--run-id", "day-1"], spark=spark) == 0
    append(2)
    assert main(["run", "--config", cfg, "--run-id", "day-2"], spark=spark) == 0
    append(3)

    real_fit = DPLloyd.fit

    def killed_fit(self, df, timings=None, operational=None):
        raise RunKilled(signal.SIGTERM)

    monkeypatch.setattr(DPLloyd, "fit", killed_fit)
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "day-3", "--json"], spark=spark) == 143
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["status"] == "killed" and status["exit_code"] == 143 and status["attempt"] == 1
    assert status["epsilon_spent"] == pytest.approx(1.0) and status["input_version"] == 2
    monkeypatch.setattr(DPLloyd, "fit", real_fit)
    # the killed attempt released nothing: summary.json is still the latest success (day-2)
    assert centers_of(spark, out, "day-3") == 0 and json.loads(open(out + "/summary.json").read())["run_id"] == "day-2"
    assert not os.path.exists(out + "/summary/day-3.json") and not os.path.exists(out + "/summary/day-3")

    append(4)  # the table moved on before the retry
    assert main(["run", "--config", cfg, "--run-id", "day-3", "--json"], spark=spark) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["status"] == "succeeded" and status["attempt"] == 2 and status["input_version"] == 2
    assert main(["run", "--config", cfg, "--run-id", "day-3", "--json"], spark=spark) == 0  # a cleared task
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["status"] == "already_succeeded" and status["epsilon_spent"] == 0.0
    assert centers_of(spark, out, "day-3") == 3
    summary = json.loads(open(out + "/summary/day-3.json").read())
    assert summary["attempt"] == 2 and summary["input"]["version"] == 2
    assert json.loads(open(out + "/summary/day-3/2.json").read()) == summary
    assert sorted(os.listdir(out + "/summary/day-3")) == ["2.json"]  # the killed attempt 1 released nothing

    assert main(["run", "--config", cfg, "--run-id", "day-4"], spark=spark) == 0
    append(5)
    assert main(["run", "--config", cfg, "--run-id", "day-5"], spark=spark) == 3
    assert centers_of(spark, out, "day-5") == 0 and json.loads(open(out + "/summary.json").read())["run_id"] == "day-4"
    assert not os.path.exists(out + "/summary/day-5.json") and not os.path.exists(out + "/summary/day-5")

    assert runs_of(spark, out) == [
        ("day-1", 1, "succeeded", 0, 1.0), ("day-2", 1, "succeeded", 1, 1.0),
        ("day-3", 1, "killed", 2, 1.0), ("day-3", 2, "succeeded", 2, 1.0),
        ("day-4", 1, "succeeded", 3, 1.0), ("day-5", 1, "refused", 4, 0.0),
    ]
    totals = ledger.totals(key)
    assert totals.spent_epsilon == pytest.approx(5.0) and totals.ledger_cap_epsilon == 5.0
    events = [(e["run_id"], e["attempt"], e["status"]) for e in ledger.runs(key) if e["run_id"] == "day-3"]
    assert events == [("day-3", 1, "started"), ("day-3", 1, "charged"), ("day-3", 1, "fit_started"), ("day-3", 1, "killed"),
                      ("day-3", 2, "started"), ("day-3", 2, "charged"), ("day-3", 2, "fit_started"), ("day-3", 2, "succeeded")]
    capsys.readouterr()
    assert main(["ledger", "show", "--ledger", ledger_path, "--input", table], spark=spark) == 0
    shown = capsys.readouterr().out
    assert "cap epsilon=5" in shown and "remaining epsilon=0" in shown
    assert "killed     run day-3 attempt 1" in shown and "refused    run day-5 attempt 1" in shown


def one_capped_table(spark, tmp_path, cap: float):
    """A one-day Delta table whose ledger cap is ``cap``: (key, ledger, config path, output path)."""
    table, ledger_path, out = str(tmp_path / "t"), str(tmp_path / "ledger"), str(tmp_path / "out")
    spark.createDataFrame(day_rows(1)).write.format("delta").save(table)
    key = tables.ledger_key_of(spark, table)
    ledger = Ledger(spark, ledger_path)
    ledger.set_budget(key, cap, 0.0)
    return key, ledger, daily_config(tmp_path, table, ledger_path, out), out


def killed_after_its_charge(spark, monkeypatch, cfg: str, run_id: str) -> None:
    """Run ``run_id`` once: charged, then killed (SIGTERM) before its fit, exit 143."""
    real_charge = Ledger.charge

    def charge_then_killed(self, *args, **kwargs):
        real_charge(self, *args, **kwargs)
        raise RunKilled(signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(Ledger, "charge", charge_then_killed)
        assert main(["run", "--config", cfg, "--run-id", run_id], spark=spark) == 143


def test_a_retry_reuses_the_charge_of_an_attempt_that_never_started_its_fit(spark, tmp_path, monkeypatch):
    """Killed right after its charge (before the fit: no private value read, no noise drawn), an
    attempt leaves its charge to the retry; the ledger total stays at one charge."""
    key, ledger, cfg, out = one_capped_table(spark, tmp_path, 3.0)
    killed_after_its_charge(spark, monkeypatch, cfg, "r")
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)
    assert main(["run", "--config", cfg, "--run-id", "r"], spark=spark) == 0
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)  # not charged twice
    runs = spark.read.format("delta").load(out + "/runs").orderBy("attempt").collect()
    assert [(r.attempt, r.status, r.fit_started, r.charge_reused_from) for r in runs] == [
        (1, "killed", False, None), (2, "succeeded", True, 1)]
    assert [e["status"] for e in ledger.runs(key)] == ["started", "charged", "killed", "started", "reused",
                                                       "fit_started", "succeeded"]
    # A second deliberate release is a new charge.
    assert main(["run", "--config", cfg, "--run-id", "r", "--force"], spark=spark) == 0
    # attempts 2 and 3 each released k = 3 centers, and both releases are kept
    assert ledger.totals(key).spent_epsilon == pytest.approx(2.0) and centers_of(spark, out, "r") == 6
    # One taker per charge, even for two retries at the same moment.
    assert ledger.claim_charge(key, "other", 1, 2) is True and ledger.claim_charge(key, "other", 1, 3) is False


def test_runs_table_edits_cannot_buy_a_second_release(spark, tmp_path, monkeypatch):
    """runs/ lives under the user's output path: the reuse decision reads only the ledger. An attempt
    whose fit started (and failed) stays charged even if runs/ is edited to say it never started."""
    from delta.tables import DeltaTable

    from dpspark import tables as tables_mod

    key, ledger, cfg, out = one_capped_table(spark, tmp_path, 3.0)
    real_write = tables_mod.write_centers

    def fail_with_a_private_value(*args, **kwargs):
        raise RuntimeError("CAST_INVALID_INPUT: the value '37.2' of the type STRING cannot be cast")

    monkeypatch.setattr(tables_mod, "write_centers", fail_with_a_private_value)
    assert main(["run", "--config", cfg, "--run-id", "r"], spark=spark) == 1
    monkeypatch.setattr(tables_mod, "write_centers", real_write)
    row = spark.read.format("delta").load(out + "/runs").first()
    assert row.status == "failed" and "37.2" not in row.error and row.error.startswith("RuntimeError")
    DeltaTable.forPath(spark, out + "/runs").update(set={"fit_started": "false"})
    assert main(["run", "--config", cfg, "--run-id", "r"], spark=spark) == 0
    assert ledger.totals(key).spent_epsilon == pytest.approx(2.0)
    assert "reused" not in [e["status"] for e in ledger.runs(key)]


@pytest.mark.parametrize("case", ["output_is_a_file", "missing_candidate_table"])
def test_avoidable_failures_are_found_before_the_charge(spark, tmp_path, case, capsys):
    table, ledger_path = str(tmp_path / "t"), str(tmp_path / "ledger")
    spark.createDataFrame(day_rows(1)).write.format("delta").save(table)
    key = tables.ledger_key_of(spark, table)
    Ledger(spark, ledger_path).set_budget(key, 10.0, 1e-5)
    if case == "output_is_a_file":
        out = tmp_path / "out"
        out.write_text("not a directory")
        cfg = daily_config(tmp_path, table, ledger_path, str(out))
    else:
        cfg = daily_config(tmp_path, table, ledger_path, str(tmp_path / "out"), **{
            "algorithm": {"name": "maxcover", "k": 3, "candidates": "table", "candidate_table": str(tmp_path / "nope")},
            "privacy.delta": 1e-6})
    assert main(["run", "--config", cfg, "--run-id", "x", "--json"], spark=spark) == 1
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status["status"] == "failed" and status["epsilon_spent"] == 0.0
    assert ("is a file" if case == "output_is_a_file" else "nope") in status["error"]
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == 0.0
    assert "charged" not in [e["status"] for e in Ledger(spark, ledger_path).runs()]
    if case == "output_is_a_file":  # validate finds it without Spark
        assert main(["validate", "--config", cfg]) == 2


def test_a_run_whose_python_workers_cannot_start_charges_nothing(spark, tmp_path):
    """Issue 50: a whole `dpspark run --json` process whose executors' Python cannot start
    (PYSPARK_PYTHON=/nonexistent/bin/python), with a ledger whose budget was set before: exit 1,
    nothing charged, nothing in the ledger or runs/, and the message names PYSPARK_PYTHON and that
    Python. Fails without the pre-charge probe of the workers: the run was charged epsilon 1, then
    failed in its fit (RunFailed: Py4JJavaError)."""
    import sys

    table, ledger_path, out = str(tmp_path / "t"), str(tmp_path / "ledger"), str(tmp_path / "out")
    spark.createDataFrame(day_rows(1)).write.format("delta").save(table)
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", table, "--epsilon", "5",
                 "--delta", "0"], spark=spark) == 0  # the administrator's command, in this process's session
    cfg = daily_config(tmp_path, table, ledger_path, out)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DPSPARK_LEDGER", "DPSPARK_REMOTE", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                        "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    env["PYSPARK_PYTHON"] = "/nonexistent/bin/python"
    dpspark = os.path.join(os.path.dirname(sys.executable), "dpspark")
    command = [dpspark] if os.path.exists(dpspark) else [sys.executable, "-m", "dpspark.cli"]
    done = subprocess.run(command + ["run", "--config", cfg, "--run-id", "noworkers", "--json"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert done.returncode == 1, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert (outcome["status"], outcome["exit_code"], outcome["epsilon_spent"], outcome["attempt"]) == ("failed", 1, 0.0, None)
    error = outcome["error"]
    assert "PYSPARK_PYTHON" in error and "/nonexistent/bin/python" in error and "Nothing was charged" in error, error
    assert "PythonWorkersError" in done.stderr
    show = subprocess.run(command + ["ledger", "show", "--ledger", ledger_path, "--json"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert show.returncode == 0, show.stderr[-3000:]
    shown = json.loads(show.stdout.strip().splitlines()[-1])
    assert [(b["spent_epsilon"], b["remaining_epsilon"]) for b in shown["balances"]] == [(0.0, 5.0)]
    assert [e["status"] for e in shown["events"]] == ["set-budget"]  # no started, charged or failed event
    assert not os.path.exists(os.path.join(out, "runs"))  # no attempt was recorded


def test_input_selection_version_timestamp_where_and_catalog_table(spark, tmp_path):
    """input.version / input.timestamp pin what is read, input.where filters before bounding, and
    input.table reads a catalog table; all of them charge the table's ONE budget."""
    table, ledger_path, out = str(tmp_path / "t"), str(tmp_path / "ledger"), str(tmp_path / "out")
    spark.createDataFrame(day_rows(1)).coalesce(1).write.format("delta").save(table)
    time.sleep(1.5)
    between = pd.Timestamp.now(tz="UTC").strftime("%Y-%m-%d %H:%M:%S")
    time.sleep(1.5)
    spark.createDataFrame(day_rows(2)).coalesce(1).write.format("delta").mode("append").save(table)
    key = tables.ledger_key_of(spark, table)
    Ledger(spark, ledger_path).set_budget(key, 10.0, 0.0)
    spark.sql("DROP TABLE IF EXISTS dpspark_test_events")
    spark.sql(f"CREATE TABLE dpspark_test_events USING delta LOCATION '{table}'")
    try:
        cases = {
            "v0": {"input.version": 0},
            "ts": {"input.timestamp": between},
            "where": {"input.where": "day = 2"},
            "catalog": {"input.table": "dpspark_test_events", "input.path": None},
        }
        for run_id, extra in cases.items():
            cfg = daily_config(tmp_path, table, ledger_path, out, **extra)
            assert main(["run", "--config", cfg, "--run-id", run_id], spark=spark) == 0, run_id
        rows = {r.run_id: r for r in spark.read.format("delta").load(out + "/runs").collect()}
        assert rows["v0"].input_version == 0 and rows["ts"].input_version == 0
        assert rows["where"].input_version == 1 and rows["where"].input_where == "day = 2"
        assert rows["catalog"].input_version == 1 and {r.input_key for r in rows.values()} == {key}
        assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(4.0)
        bad = daily_config(tmp_path, table, ledger_path, out, **{"input.where": "no_such_column > 1"})
        assert main(["run", "--config", bad, "--run-id", "bad"], spark=spark) == 2
        assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(4.0)
    finally:
        spark.sql("DROP TABLE IF EXISTS dpspark_test_events")


def _fenced_block_after(text: str, marker: str) -> str:
    at = text.index(marker)
    match = re.search(r"```[a-z]*\n(.*?)```", text[at:], re.S)
    return match.group(1).strip()


def cron_command() -> str:
    line = _fenced_block_after(DOC.read_text(), "<!-- cron-line")
    fields = line.split(None, 5)
    assert len(fields) == 6 and fields[:5] == ["15", "3", "*", "*", "*"], line
    # cron: an unescaped % ends the command; \% is a literal %.
    assert re.search(r"(?<!\\)%", fields[5]) is None
    return fields[5].replace("\\%", "%")


def test_airflow_task_passes_the_cron_lines_application_and_arguments():
    command = cron_command()
    cron_args = command.split("dpspark run ", 1)[1].split(" >>")[0].split()
    block = _fenced_block_after(DOC.read_text(), "<!-- airflow-task")
    call = next(n for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "SparkSubmitOperator")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kw["application"] == "jobs/cluster.py"
    args = kw["application_args"]
    # Same flags in the same order; the config is the documented example; the same run id per day.
    assert [a for a in args if a.startswith("--")] == [a for a in cron_args if a.startswith("--")] == ["--config", "--run-id", "--json"]
    assert args[args.index("--config") + 1] == "conf/daily.example.yaml" and os.path.isfile(ROOT / "conf/daily.example.yaml")
    assert cron_args[cron_args.index("--config") + 1] == '"$DPSPARK_CONFIG"'
    assert args[args.index("--run-id") + 1].replace("{{ ds }}", "2026-11-30") == "daily-2026-11-30"
    assert cron_args[cron_args.index("--run-id") + 1] == '"daily-$(date' and "+%Y-%m-%d)\"" in cron_args
    # jobs/cluster.py is `dpspark run` with the same arguments.
    assert 'main(["run", *sys.argv[1:]])' in (ROOT / "jobs" / "cluster.py").read_text()
    # the driver gets dpspark's log store, as in the README's spark-submit command (else a ledger's
    # charges are refused: commit_exclusion)
    from dpspark.session import EXCLUSIVE_LOG_STORE, LOG_STORE_JAR

    assert os.path.samefile(ROOT / kw["jars"], LOG_STORE_JAR)
    assert kw["conf"] == {"spark.delta.logStore.file.impl": EXCLUSIVE_LOG_STORE}


def test_cron_line_with_sigterm_mid_fit_then_the_retry(spark, tmp_path):
    """The cron line's command, as written, in a real process: SIGTERM during the fit records the
    attempt as killed (exit 143, nothing released); the next run of the line releases once."""
    table, ledger_path, out = str(tmp_path / "t"), str(tmp_path / "ledger"), str(tmp_path / "out")
    rows = pd.concat([day_rows(d, 3000) for d in range(1, 5)])
    spark.createDataFrame(rows).repartition(4).write.format("delta").save(table)
    key = tables.ledger_key_of(spark, table)
    Ledger(spark, ledger_path).set_budget(key, 10.0, 0.0)
    cfg = daily_config(tmp_path, table, ledger_path, out, **{"algorithm.iterations": 30,
                                                             "spark": {"conf": {"spark.ui.enabled": False}}})
    log = tmp_path / "cron.log"
    env = {**os.environ, "DPSPARK_HOME": str(ROOT), "DPSPARK_CONFIG": cfg, "DPSPARK_LOG": str(log)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    command = cron_command()
    run_id = "daily-" + time.strftime("%Y-%m-%d", time.gmtime())

    proc = subprocess.Popen(["bash", "-c", command], env=env)  # exec: proc.pid is dpspark itself
    try:
        deadline = time.time() + 240
        # An accounted run logs no line inside its fit (docs/privacy.md): its start line, then a
        # moment into its 30 iterations.
        while "dplloyd: fit ..." not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, "the fit never started"
            time.sleep(0.3)
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 143, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    status = json.loads(log.read_text().strip().splitlines()[-1])
    assert (status["run_id"], status["status"], status["exit_code"], status["attempt"]) == (run_id, "killed", 143, 1)
    runs = spark.read.format("delta").load(out + "/runs").collect()
    assert [(r.run_id, r.attempt, r.status, r.fit_started) for r in runs] == [(run_id, 1, "killed", True)]
    assert not os.path.exists(out + "/summary.json") and not os.path.exists(out + "/centers")
    events = [(e["attempt"], e["status"]) for e in Ledger(spark, ledger_path).runs(key)]
    assert events == [(1, "started"), (1, "charged"), (1, "fit_started"), (1, "killed")]

    assert subprocess.run(["bash", "-c", command], env=env, timeout=300).returncode == 0, log.read_text()
    status = json.loads(log.read_text().strip().splitlines()[-1])
    assert (status["status"], status["attempt"], status["exit_code"]) == ("succeeded", 2, 0)
    assert centers_of(spark, out, run_id) == 3
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(2.0)
