"""Issue 26, items 3 and 4: what the ANALYST sees (stderr, stdout, the --json line, everything under
output.path, the exception a Python caller gets) is a function of charged releases and public inputs
only. Exact operational data (step durations, pass counts, histogram sizes) and a failed fit's error
text go to the operator log, a location only the deployment sets ($DPSPARK_OPERATOR_LOG)."""

from __future__ import annotations

import json
import os
import traceback

import pytest

from dpspark.cli import main
from dpspark.errors import ConfigError, DPSparkError, SchemaError
from dpspark.privacy.ledger import Ledger

from test_pipeline import make_config, points_frame, set_budget

SECRET = "alice.secret@example.com"
NO_SEED = {"seed": None, "unsafe_fixed_seed": False}  # a ledgered run is a private one


def read_operator_record(spark, run_id, attempt):
    from dpspark.runner import read_operator_record as read

    return read(spark, run_id, attempt)


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _all_text(root) -> str:
    """Every file under ``root`` as text (Delta logs, parquet bytes decoded loosely)."""
    chunks = []
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                chunks.append(handle.read().decode("utf-8", "replace"))
    return "\n".join(chunks)


def _maxcover_fallback(tmp_path, path, ledger_path, **more):
    """maxcover with max_signatures=1: every threshold's histogram stays on the executors, so the fit
    logs data-dependent fallback lines and one histogram job per pick."""
    return make_config(tmp_path, path, **{
        "algorithm": {"name": "maxcover", "k": 3, "candidates": "grid", "candidate_count": 16, "max_signatures": 1,
                      "coverage_approx": 0.9},
        "privacy.delta": 1e-6, "privacy.ledger": ledger_path, "output.report": False, **NO_SEED, **more})


def test_a_ledgered_run_shows_the_analyst_no_operational_numbers(spark, tmp_path, write_delta, monkeypatch, capsys):
    path = write_delta(points_frame(40))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=5.0, delta=1e-5)
    oplog = tmp_path / "operator"
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(oplog))
    cfg, c = _maxcover_fallback(tmp_path, path, ledger_path)
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "acc", "--json"], spark=spark) == 0
    captured = capsys.readouterr()
    out = c["output"]["path"]

    # stderr: step lines without their durations; no fallback line, no per-pick job (data-dependent).
    assert "maxcover: fit ..." in captured.err and "maxcover: fit done" in captured.err
    assert "done in" not in captured.err and "max_signatures" not in captured.err
    assert "histogram job" not in captured.err and "running row was written" not in captured.err
    # nothing logged inside the fit (its timestamps would time each pass): only the fit's own two lines
    assert "maxcover pass" not in captured.err and "maxcover: " not in captured.err.replace("maxcover: fit", "")
    # the --json line: the outcome and the charge only
    outcome = _json_line(captured.out)
    assert set(outcome) == {"run_id", "attempt", "status", "exit_code", "epsilon_spent", "delta_spent",
                            "input_version", "outputs", "error", "accounting"}
    assert outcome["status"] == "succeeded" and outcome["error"] is None
    # runs/: the column is still there (old readers) and null
    row = spark.read.format("delta").load(out + "/runs").first()
    assert "non_private_operational" in row.asDict() and row.non_private_operational is None
    # nothing under output.path names an operational value
    everything = _all_text(out)
    for word in ("spark_passes", "histogram_sizes", "fallback_thresholds", "timings", "done in"):
        assert word not in everything, word

    # The operator record has them all.
    record = read_operator_record(spark, "acc", 1)
    assert record == json.loads((oplog / "acc" / "attempt-1.json").read_text())
    assert record["status"] == "succeeded" and record["input_key"] == key and record["error_type"] is None
    assert record["timings"]["maxcover: fit"] > 0 and "privacy ledger: charge" in record["timings"]
    ops = record["operational"]
    assert ops["spark_passes"] >= 2 and ops["fallback_thresholds"] and ops["histogram_sizes"]
    log = "\n".join(record["log"])
    assert "maxcover: fit done in" in log and "max_signatures=1" in log and "histogram job" in log
    assert "maxcover pass" in log
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(1.0)


def test_a_histogram_kept_on_the_executors_for_its_pairs_is_shown_to_the_operator_only(spark, tmp_path, write_delta,
                                                                                     monkeypatch, capsys):
    """maxcover with max_pairs=1: every non-trivial histogram stays on the executors for its pairs (how
    many the data has: NON-PRIVATE). The analyst's stderr, --json line and output.path show none of it;
    the operator record has the line, the thresholds and the pair counts."""
    path = write_delta(points_frame(40))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=5.0, delta=1e-5)
    oplog = tmp_path / "operator"
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(oplog))
    cfg, c = make_config(tmp_path, path, **{
        "algorithm": {"name": "maxcover", "k": 3, "candidates": "grid", "candidate_count": 16, "max_pairs": 1,
                      "coverage_approx": 0.9},
        "privacy.delta": 1e-6, "privacy.ledger": ledger_path, "output.report": False, **NO_SEED})
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "acc2", "--json"], spark=spark) == 0
    captured = capsys.readouterr()
    assert "max_pairs" not in captured.err and "histogram job" not in captured.err and "pairs" not in captured.out
    everything = _all_text(c["output"]["path"])
    for word in ("histogram_pairs", "thresholds_spilled_for_pairs", "stays on the executors"):  # max_pairs itself is public
        assert word not in everything, word
    ops = read_operator_record(spark, "acc2", 1)["operational"]
    assert ops["thresholds_spilled_for_pairs"] and ops["histogram_pairs"]
    assert ops["thresholds_spilled_for_pairs"] == [i + 1 for i, v in enumerate(ops["histogram_pairs"]) if v == -1]
    log = "\n".join(read_operator_record(spark, "acc2", 1)["log"])
    assert "max_pairs=1" in log and "histogram job" in log
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(1.0)


def test_an_unaccounted_run_keeps_its_step_durations_on_stderr(spark, tmp_path, write_delta, monkeypatch, capsys):
    """No ledger: the analyst could repeat the run at will; the log is as it always was (bench_scale
    parses "done in" lines of ledger-less runs)."""
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    monkeypatch.delenv("DPSPARK_OPERATOR_LOG", raising=False)
    path = write_delta(points_frame(20))
    cfg, c = make_config(tmp_path, path, **{"output.report": False})
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "free"], spark=spark) == 0
    err = capsys.readouterr().err
    assert "dplloyd: fit done in" in err and "DPSPARK_OPERATOR_LOG" not in err  # no warning without a ledger


def test_without_an_operator_log_nothing_is_kept_outside_the_output_path(spark, tmp_path, write_delta, monkeypatch,
                                                                          capsys):
    path = write_delta(points_frame(20), name="input")
    ledger_path = str(tmp_path / "ledger")
    set_budget(spark, ledger_path, path)
    monkeypatch.delenv("DPSPARK_OPERATOR_LOG", raising=False)
    monkeypatch.chdir(tmp_path)  # a relative default location would land here
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False, **NO_SEED})
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "quiet"], spark=spark) == 0
    err = capsys.readouterr().err
    assert err.count("$DPSPARK_OPERATOR_LOG is not set") == 1 and "done in" not in err
    assert sorted(os.listdir(tmp_path)) == sorted(["input", "ledger", "out", os.path.basename(cfg)])
    assert sorted(os.listdir(tmp_path / "out")) == ["centers", "runs", "summary", "summary.json"]


def test_the_operator_log_cannot_be_set_from_a_config(tmp_path, monkeypatch):
    from dpspark.config import load_config

    cfg, _ = make_config(tmp_path, str(tmp_path / "t"))
    for override in ("DPSPARK_OPERATOR_LOG=/tmp/x", "operator_log=/tmp/x", "output.operator_log=/tmp/x",
                     "privacy.operator_log=/tmp/x", "spark.conf.spark.executorEnv.DPSPARK_OPERATOR_LOG=/tmp/x"):
        with pytest.raises(ConfigError):
            load_config(cfg, [override])
    keys = json.dumps(sorted(_keys(load_config(cfg, []).to_dict())))
    assert "operator" not in keys and "DPSPARK" not in keys


def _keys(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{prefix}{k}"
            yield from _keys(v, f"{prefix}{k}.")


@pytest.mark.parametrize("ledgered", [True, False])
def test_a_fit_error_quoting_a_record_reaches_the_command_line_by_its_type_only(spark, tmp_path, write_delta,
                                                                              monkeypatch, capsys, ledgered):
    """The quoting attack: a Spark error raised during the fit quotes a cell. stderr, the --json line
    and runs/ name its type; the operator record keeps the text and the traceback."""
    from dpspark.dplloyd.estimator import DPLloyd

    path = write_delta(points_frame(20))
    extra = {"output.report": False, **NO_SEED}
    if ledgered:
        ledger_path = str(tmp_path / "ledger")
        set_budget(spark, ledger_path, path)
        extra["privacy.ledger"] = ledger_path
    else:
        monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    oplog = tmp_path / "operator"
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(oplog))
    cfg, c = make_config(tmp_path, path, **extra)

    def quoting_fit(self, df, timings=None, operational=None):  # after the charge and fit_started
        raise RuntimeError(f"[CAST_INVALID_INPUT] Error parsing '{SECRET}' to interval")

    monkeypatch.setattr(DPLloyd, "fit", quoting_fit)
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "quote", "--json"], spark=spark) == 1
    captured = capsys.readouterr()
    assert SECRET not in captured.err and SECRET not in captured.out
    assert "dpspark: RunFailed: the fit failed (RuntimeError); details are in the attempt's operator record" in captured.err
    outcome = _json_line(captured.out)
    assert outcome["status"] == "failed" and outcome["exit_code"] == 1
    assert outcome["error"].startswith("the fit failed (RuntimeError); details are in the attempt's operator record")
    assert outcome["epsilon_spent"] == (pytest.approx(1.0) if ledgered else 0.0)
    row = spark.read.format("delta").load(c["output"]["path"] + "/runs").first()
    assert row.status == "failed" and row.fit_started and row.error.startswith("RuntimeError")
    assert SECRET not in _all_text(c["output"]["path"])
    record = read_operator_record(spark, "quote", 1)
    assert record["status"] == "failed" and record["error_type"] == "RuntimeError"
    assert SECRET in record["traceback"] and "quoting_fit" in record["traceback"]
    assert any(SECRET in line for line in record["log"])


def test_an_error_before_the_fit_passes_as_today(spark, tmp_path, write_delta, capsys):
    """Before the fit no private value has been read: the message names the column, as always (a
    config mistake: exit 2)."""
    path = write_delta(points_frame(10))
    cfg, _ = make_config(tmp_path, path, **{"input.features": ["x", "nope"], "output.report": False})
    assert main(["run", "--config", cfg, "--run-id", "early", "--json"], spark=spark) == 2
    captured = capsys.readouterr()
    assert "'nope'" in captured.err and "'nope'" in _json_line(captured.out)["error"]


def _secret_in_chain(exc: BaseException) -> bool:
    seen = exc
    while seen is not None:
        if SECRET in str(seen) or SECRET in repr(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@pytest.mark.parametrize("kind", ["spark_error", "dpspark_error_chained_to_one"])
def test_dpclustering_fit_error_holds_no_record_value(spark, tmp_path, write_delta, monkeypatch, capsys, kind):
    from dpspark.dplloyd.estimator import DPLloyd
    from dpspark.ml import DPClustering

    path = write_delta(points_frame(20))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path)
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))

    def quoting_fit(self, df, timings=None, operational=None):
        cause = RuntimeError(f"Error parsing '{SECRET}' to interval")
        if kind == "spark_error":
            raise cause
        try:
            raise cause
        except RuntimeError as inner:
            raise SchemaError("feature column 'x' could not be read") from inner

    monkeypatch.setattr(DPLloyd, "fit", quoting_fit)
    est = DPClustering(k=3, epsilon=1.0, algorithm="dplloyd", lower=[0, 0], upper=[100, 100], inputCols=["x", "y"],
                       ledgerPath=ledger_path, ledgerInput=path)
    capsys.readouterr()
    with pytest.raises(DPSparkError) as raised:
        est.fit(spark.read.format("delta").load(path))
    exc = raised.value
    if kind == "spark_error":
        from dpspark.errors import RunFailed

        assert type(exc) is RunFailed and exc.error_type == "RuntimeError"
        assert str(exc).startswith("the fit failed (RuntimeError); ")
    else:  # dpspark's own message passes, its chain (which quotes the record) does not
        assert type(exc) is SchemaError and "'x'" in str(exc)
    assert exc.__cause__ is None and exc.__context__ is None and not _secret_in_chain(exc)
    shown = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert SECRET not in shown  # what a Python user sees in the traceback
    assert SECRET not in capsys.readouterr().err
    charged = [e for e in Ledger(spark, ledger_path).runs(key) if e["status"] == "charged"]
    assert len(charged) == 1  # the fit started after the charge: it stays charged
    record = read_operator_record(spark, charged[0]["run_id"], 1)
    assert record["status"] == "failed" and SECRET in record["traceback"]


@pytest.mark.parametrize("handlers", ["one_at_warning", "none"])
def test_capture_keeps_info_lines_for_the_operator_and_shows_the_analyst_what_it_showed(capsys, handlers):
    """A Python user's logging left as it was (dpspark logger at WARNING, with a handler of theirs or
    none at all: Python's last resort prints warnings): inside an accounted attempt the collector
    gets every line at INFO, the analyst's handler what it showed before and no duration."""
    import io
    import logging

    from dpspark import progress

    log = progress.log
    stream = io.StringIO()
    saved = (log.handlers[:], log.level, log.propagate)
    log.handlers[:] = [logging.StreamHandler(stream)] if handlers == "one_at_warning" else []
    log.propagate = False
    log.setLevel(logging.WARNING)
    capsys.readouterr()
    try:
        with progress.accounted(), progress.capture() as lines:
            with progress.step("a step"):
                pass
            progress.detail("histogram of %d rows", 1234)
            log.info("public info")
            log.warning("a warning")
        log.info("after the attempt")
        after = (log.level, [h for h in log.handlers if not isinstance(h, logging.StreamHandler)])
    finally:
        log.handlers[:] = saved[0]
        log.setLevel(saved[1])
        log.propagate = saved[2]
    text = "\n".join(lines)
    for line in ("a step ...", "a step done in", "histogram of 1234 rows", "public info", "a warning"):
        assert line in text, line
    assert "after the attempt" not in text
    shown = stream.getvalue() if handlers == "one_at_warning" else capsys.readouterr().err
    assert shown.strip() == "a warning"
    assert after == (logging.WARNING, [])  # the logger is put back


def test_unaccounted_lines_stay_on_the_dpspark_log():
    import io
    import logging

    from dpspark import progress

    log = progress.log
    stream = io.StringIO()
    saved = (log.handlers[:], log.level, log.propagate)
    log.handlers[:] = [logging.StreamHandler(stream)]
    log.setLevel(logging.INFO)
    try:
        with progress.capture() as lines:
            with progress.step("a step"):
                pass
            progress.detail("histogram of %d rows", 1234)
    finally:
        log.handlers[:] = saved[0]
        log.setLevel(saved[1])
        log.propagate = saved[2]
    assert "a step done in" in stream.getvalue() and "histogram of 1234 rows" in stream.getvalue()
    assert len(lines) == 3


FAILING_TASK_RUN = """
import sys
from dpspark.dplloyd.estimator import DPLloyd


def failing_task(self, df, timings=None, operational=None):  # a task on the executors quotes a value
    from pyspark.sql import functions as F

    df.select(F.raise_error(F.concat(F.lit("cannot parse "), F.lit(sys.argv[2])))).collect()


DPLloyd.fit = failing_task
from dpspark.cli import main

sys.exit(main(["run", "--config", sys.argv[1], "--run-id", "task"]))
"""


# quiet_spark_logs made a no-op where the attempt (dpspark.attempt.Attempt.execute) calls it
NOT_QUIET = """
import contextlib, dpspark.attempt as attempt
assert hasattr(attempt, "quiet_spark_logs")
attempt.quiet_spark_logs = lambda spark, on=True: contextlib.nullcontext()
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_spark_task_failure_lines_do_not_reach_an_accounted_runs_stderr(spark, tmp_path, write_delta, quiet):
    """Spark logs a failed task's exception on the driver (WARN TaskSetManager, ERROR Executor), and in
    local mode the executors share the driver's stderr: a task that raises with a record's value would
    print it there. dpspark's own expressions cannot raise on a value; as defence in depth an accounted
    run switches Spark's log off (dpspark.session.quiet_spark_logs) and puts it back afterwards. A whole
    process (the JVM writes to the stderr it was started with); ``quiet=False`` shows the check can fail."""
    import subprocess
    import sys

    from conftest import ROOT

    path = write_delta(points_frame(20))
    ledger_path = str(tmp_path / "ledger")
    set_budget(spark, ledger_path, path)
    cfg, _ = make_config(tmp_path, path, **{"output.report": False, "privacy.ledger": ledger_path, **NO_SEED})
    script = FAILING_TASK_RUN if quiet else FAILING_TASK_RUN.replace(
        "DPLloyd.fit = failing_task", "DPLloyd.fit = failing_task\n" + NOT_QUIET)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DPSPARK_LEDGER", "DPSPARK_ACCOUNTED_SPARK_LOG", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    env.update(DPSPARK_OPERATOR_LOG=str(tmp_path / "operator"), DPSPARK_SMALL_JOB="1")
    done = subprocess.run([sys.executable, "-c", script, cfg, SECRET], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "RunFailed" in done.stderr
    leaked = SECRET in done.stderr or SECRET in done.stdout
    assert leaked != quiet, (leaked, done.stderr[-3000:])


def test_spark_log_stays_off_after_a_killed_attempt_and_comes_back_after_any_other(spark):
    """A killed attempt's process is ending while its cancelled tasks still fail (``ERROR
    TaskContextImpl ...`` lines after the status line): ``quiet_spark_logs`` keeps Spark's log OFF
    when the attempt says so; an attempt that ends otherwise gets the session's level back."""
    from dpspark import session

    root = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger()
    session_level = str(root.getLevel().toString())  # the shared session's, whatever earlier tests left
    try:
        spark.sparkContext.setLogLevel("WARN")
        with session.quiet_spark_logs(spark) as state:
            assert str(root.getLevel().toString()) == "OFF"
        assert str(root.getLevel().toString()) == "WARN"
        with session.quiet_spark_logs(spark) as state:
            state.restore = False
        assert str(root.getLevel().toString()) == "OFF"
    finally:
        spark.sparkContext.setLogLevel(session_level)
