"""A run's bookkeeping commits on LOCAL tables written by delta-rs (dpspark.localdelta): the ledger's
charge and events and the running row of runs/. They must be the transactions Spark's path makes:
the same rows, the same budget decisions, never a charge decided on one version and committed on
another, and tables that Spark reads back unchanged. Spark's own path is the reference."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dpspark import localdelta, tables
from dpspark.errors import BudgetRefused
from dpspark.privacy.ledger import COLUMNS, Ledger, _balance_id

ROOT = Path(__file__).resolve().parent.parent


class SparkWrites:
    """Within the block the ledger and runs/ are read and written by Spark only (delta-rs declines)."""

    def __enter__(self):
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(localdelta, "read_rows", lambda *a, **k: None)
        self.patch.setattr(localdelta, "writable_table", lambda *a, **k: None)
        self.patch.setattr(localdelta, "append_rows", lambda *a, **k: False)
        self.patch.setattr(localdelta, "create_table", lambda *a, **k: False)

    def __exit__(self, *exc):
        self.patch.undo()


def _engines(path: str) -> list[str]:
    """Who wrote each commit of the table, oldest first: 'spark' or 'delta-rs'."""
    history = sorted(localdelta.open_table(path).history(), key=lambda h: h["version"])
    return ["delta-rs" if "delta-rs" in str(h.get("engineInfo") or h.get("clientVersion")) else "spark" for h in history]


def _as_pyspark_reads(value):
    """A value written (an aware UTC time: ``Ledger._now``) as PySpark reads it back: a naive local time."""
    return value.astimezone().replace(tzinfo=None) if isinstance(value, datetime) and value.tzinfo else value


def _spark_rows(spark, path: str, where: str) -> list[dict]:
    return [r.asDict() for r in spark.read.format("delta").load(path).where(where).collect()]


EVENT_FIELDS = ("kind", "input_path", "run_id", "algorithm", "epsilon", "delta", "status", "guarantee", "attempt",
                "input_seen", "note", "asked_epsilon", "asked_delta", "remaining_epsilon", "remaining_delta")


def _script(ledger: Ledger, key: str) -> list:
    """One attempt's ledger traffic as the runner makes it, and two refusals; what each call answered."""
    out = []
    ledger.mark(key, "r1", "started", attempt=1, defer=True)
    out.append(ledger.charge(key, "r1", "dplloyd", 0.5, 1e-7, attempt=1, input_seen="/in", defer=True).as_dict())
    ledger.mark(key, "r1", "fit_started", attempt=1)
    ledger.mark(key, "r1", "succeeded", attempt=1)
    for run_id, ask, budget in (("r2", 0.6, None), ("r3", 0.3, 0.7), ("r4", 0.25, None)):
        try:
            out.append(ledger.charge(key, run_id, "maxcover", ask, 0.0, budget, 0.0 if budget else None,
                                     attempt=1).as_dict())
        except BudgetRefused as exc:
            out.append(str(exc).replace(ledger.path, "LEDGER"))
    return out


def test_a_local_ledger_is_charged_by_delta_rs_with_the_rows_and_decisions_of_spark(spark, tmp_path):
    key = "delta-table:test"
    answers, events, balances = {}, {}, {}
    for mode in ("spark", "delta-rs"):
        path = str(tmp_path / mode)
        ledger = Ledger(spark, path)
        ledger.set_budget(key, 1.0, 1e-6)
        before = Ledger._now(ledger)
        if mode == "spark":
            with SparkWrites():
                answers[mode] = _script(ledger, key)
        else:
            answers[mode] = _script(ledger, key)
        after = Ledger._now(ledger)
        # who committed what: set-budget by Spark; then the UPDATE and the appends by this mode's writer
        engines = _engines(path)
        assert engines[0] == "spark" and set(engines[1:]) == {mode}, engines
        # Spark reads every row back (the reference reader), in the ledger's own convention for times
        rows = _spark_rows(spark, path, "kind IN ('run', 'balance')")
        events[mode] = sorted((tuple(r[f] for f in EVENT_FIELDS) for r in rows if r["kind"] == "run"), key=repr)
        balance = [r for r in rows if r["kind"] == "balance"]
        assert len(balance) == 1 and balance[0]["entry_id"] == _balance_id(key)
        # the charge's instant (PySpark reads a TIMESTAMP as a naive local time; the ledger's times are aware UTC)
        assert before <= balance[0]["updated_at"].astimezone(timezone.utc) <= after
        balances[mode] = {k: balance[0][k] for k in ("epsilon", "delta", "cap_epsilon", "cap_delta")}
        # delta-rs reads the same rows as Spark does
        local = localdelta.read_rows(path, {"kind": ["run", "balance"]})
        assert sorted((tuple(r[c] for c in COLUMNS) for r in local), key=repr) == sorted(
            (tuple(r[c] for c in COLUMNS) for r in rows), key=repr)
    assert answers["spark"] == answers["delta-rs"]
    assert [a if isinstance(a, dict) else "refused" for a in answers["delta-rs"]] == [
        answers["delta-rs"][0], "refused", "refused", answers["delta-rs"][3]]  # 0.6 over the cap, 0.3 over 0.7
    assert events["spark"] == events["delta-rs"] and len(events["spark"]) == 7
    assert balances["spark"] == balances["delta-rs"] == {"epsilon": 0.75, "delta": 1e-7, "cap_epsilon": 1.0,
                                                         "cap_delta": 1e-6}


def test_a_charge_decided_on_an_older_version_writes_nothing_and_is_decided_again(spark, tmp_path):
    path, key = str(tmp_path / "ledger"), "/in"
    ledger = Ledger(spark, path)
    ledger.set_budget(key, 1.0, 0.0)
    stale = localdelta.writable_table(path)
    with SparkWrites():  # another driver charges through Spark after this snapshot was read
        ledger.charge(key, "spark-run", "dplloyd", 0.75, 0.0, attempt=1)
    version = localdelta.open_table(path).version()
    # a commit decided on the stale snapshot (0 spent) is refused by the log: nothing is written
    assert localdelta.update_row(stale, path, "entry_id", _balance_id(key), {"epsilon": 0.5, "delta": 0.0}) is False
    assert localdelta.open_table(path).version() == version
    # decided again on the latest version: 0.25 left
    with pytest.raises(BudgetRefused, match="remain"):
        ledger.charge(key, "late", "dplloyd", 0.5, 0.0, attempt=1)
    ledger.charge(key, "fits", "dplloyd", 0.25, 0.0, attempt=1)
    assert _engines(path)[-2:] == ["delta-rs", "delta-rs"]  # the refusal's event, the charge
    # and Spark's UPDATE decides on what delta-rs committed: nothing is left
    with SparkWrites(), pytest.raises(BudgetRefused):
        ledger.charge(key, "spark-late", "dplloyd", 0.01, 0.0, attempt=1)
    assert ledger.totals(key).spent_epsilon == 1.0


RACER = """
import json, sys, time
from dpspark.privacy.ledger import Ledger
path, key, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
decided = Ledger(None, path)._charge_without_spark(key, 0.1, 0.0, None, None, "central")
print(json.dumps(None if decided is None else decided[0]))
"""


def test_concurrent_delta_rs_charges_never_pass_more_than_the_budget_allows(spark, tmp_path):
    """Six processes charge 0.1 at the same moment against a cap of 0.3: exactly three pass, and the
    balance holds exactly their three charges (a lost update would show fewer, an overspend more)."""
    path, key = str(tmp_path / "ledger"), "/in"
    Ledger(spark, path).set_budget(key, 0.3, 0.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.time() + 4.0
    racers = [subprocess.Popen([sys.executable, "-c", RACER, path, key, repr(start)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env) for _ in range(6)]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(outcomes) == [False, False, False, True, True, True], outcomes
    balance = [r for r in localdelta.read_rows(path, {"kind": ["balance"]})]
    assert len(balance) == 1 and balance[0]["epsilon"] == 0.1 + 0.1 + 0.1
    assert Ledger(spark, path).totals(key).spent_epsilon == balance[0]["epsilon"]  # Spark reads the same


def test_runs_rows_appended_by_delta_rs_read_back_the_same_by_spark_across_its_checkpoint(spark, tmp_path):
    runs = str(tmp_path / "runs")
    ledger = Ledger(spark, str(tmp_path / "unused"))
    written = []
    for attempt in range(1, 5):
        record = {name: None for name in tables.RUNS_COLUMNS}
        record.update(run_id="day-1", attempt=attempt, status="running", input_version=7, epsilon_spent=0.5,
                      started_at=ledger._now(), charged=True, seed=2**62 + attempt, parameters=json.dumps({"k": 3}))
        tables.write_run_record(spark, runs, record, new=True)
        written.append(record)
        if attempt == 2:
            localdelta.open_table(runs).create_checkpoint()  # delta-rs's checkpoint, then Spark reads past it
    assert _engines(runs) == ["delta-rs"] * 4  # the first row creates runs/, with Spark's schema
    from pyspark.sql.types import _parse_datatype_string
    assert spark.read.format("delta").load(runs).schema == _parse_datatype_string(tables.RUNS_SCHEMA)
    by_spark = sorted((r.asDict() for r in spark.read.format("delta").load(runs).collect()), key=lambda r: r["attempt"])
    assert by_spark == [{c: _as_pyspark_reads(w[c]) for c in tables.RUNS_COLUMNS} for w in written]
    with SparkWrites():
        by_spark_attempts = tables.read_attempts(spark, runs, "day-1")
    assert by_spark_attempts == tables.read_attempts_without_spark(runs, "day-1")
    # the final row of an attempt replaces its running row (replaceWhere) in one delta-rs commit, as on Spark
    tables.write_run_record(spark, runs, {**written[-1], "status": "succeeded", "ended_at": ledger._now()})
    tables.write_run_record(spark, runs, {**written[0], "status": "failed", "error": "it's 'quoted'"})
    assert _engines(runs)[-2:] == ["delta-rs", "delta-rs"]
    with SparkWrites():
        by_spark_attempts = tables.read_attempts(spark, runs, "day-1")
    assert [(r["attempt"], r["status"]) for r in by_spark_attempts] == [
        (1, "failed"), (2, "running"), (3, "running"), (4, "succeeded")]
    assert by_spark_attempts[0]["error"] == "it's 'quoted'" and by_spark_attempts[3]["ended_at"] is not None


def test_delta_rs_leaves_to_spark_every_table_it_should_not_write(spark, tmp_path):
    rows = [{"a": 1, "b": "x"}]
    assert localdelta.append_rows(str(tmp_path / "none"), rows, ("a", "b")) is False  # no table yet
    assert localdelta.append_rows("s3a://lake/t", rows, ("a", "b")) is False  # not local
    other = str(tmp_path / "other")
    spark.createDataFrame([(1, "x", 2.0)], "a INT, b STRING, c DOUBLE").write.format("delta").save(other)
    version = localdelta.open_table(other).version()
    assert localdelta.append_rows(other, rows, ("a", "b")) is False  # not exactly these columns
    featured = str(tmp_path / "featured")
    spark.sql(f"CREATE TABLE delta.`{featured}` (a INT, b STRING) USING delta "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    assert localdelta.writable_table(featured) is None  # a writer feature delta-rs's path does not take
    assert localdelta.append_rows(featured, rows, ("a", "b")) is False
    assert localdelta.open_table(other).version() == version
    # a key that could not be quoted as written is not put into a predicate
    table = localdelta.writable_table(other)
    assert localdelta.update_row(table, other, "b", "x' OR '1' = '1", {"c": 0.0}) is None
    assert localdelta.open_table(other).version() == version


def test_centers_appended_by_delta_rs_are_the_rows_spark_writes(spark, tmp_path):
    import numpy as np

    paths = {mode: str(tmp_path / mode) for mode in ("spark", "delta-rs")}
    for mode, path in paths.items():
        for attempt in (1, 2):
            centers, weights = np.array([[0.25, -1.0], [1e-300, 0.5]]) * attempt, np.array([3.5, 0.0])
            if mode == "spark":
                with SparkWrites():
                    tables.write_centers(spark, path, "day-1", ["x", "y"], centers, weights, attempt=attempt, new=True)
            else:
                tables.write_centers(spark, path, "day-1", ["x", "y"], centers, weights, attempt=attempt, new=True)
    assert _engines(paths["spark"]) == ["spark", "spark"] and _engines(paths["delta-rs"]) == ["delta-rs", "delta-rs"]
    read = {mode: sorted((tuple(r) for r in spark.read.format("delta").load(path).collect()), key=repr)
            for mode, path in paths.items()}
    assert read["spark"] == read["delta-rs"] and len(read["spark"]) == 4
    assert spark.read.format("delta").load(paths["delta-rs"]).schema == spark.read.format("delta").load(paths["spark"]).schema


def test_a_new_centers_table_is_created_by_delta_rs_as_spark_would_create_it(spark, tmp_path):
    """The first attempt's centers create ``centers/`` by delta-rs: the schema Spark reads is the one
    Spark's own first write gives (every column nullable), the rows read back the same, and later
    attempts append to it. A feature name that is not a plain identifier is left to Spark."""
    from pyspark.sql import types as T

    centers = [[0.25, -1.5], [3.0, 1e-300]]
    by_rs, by_spark = str(tmp_path / "rs" / "centers"), str(tmp_path / "spark" / "centers")
    tables.write_centers(spark, by_rs, "day-1", ["x", "y_1"], centers, [10.5, 2.0], attempt=1, new=True)
    with SparkWrites():
        tables.write_centers(spark, by_spark, "day-1", ["x", "y_1"], centers, [10.5, 2.0], attempt=1, new=True)
    assert _engines(by_rs) == ["delta-rs"] and _engines(by_spark) == ["spark"]
    schema = spark.read.format("delta").load(by_rs).schema
    assert schema == spark.read.format("delta").load(by_spark).schema
    assert all(f.nullable for f in schema.fields) and schema["attempt"].dataType == T.IntegerType()

    def rows(path):
        return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())

    assert rows(by_rs) == rows(by_spark) == [("day-1", 1, 0, 0.25, -1.5, 10.5, True), ("day-1", 1, 1, 3.0, 1e-300, 2.0, True)]
    tables.write_centers(spark, by_rs, "day-1", ["x", "y_1"], centers[:1], [4.0], attempt=2, new=True)
    assert _engines(by_rs) == ["delta-rs", "delta-rs"] and len(rows(by_rs)) == 3
    odd = str(tmp_path / "odd" / "centers")
    tables.write_centers(spark, odd, "day-1", ["x-1"], [[1.0]], [1.0], attempt=1, new=True)
    assert _engines(odd) == ["spark"] and spark.read.format("delta").load(odd).columns[3] == "x-1"
