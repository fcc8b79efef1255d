"""Local bookkeeping tables read without Spark (dpspark.localdelta, delta-rs): the same answers as
Delta on Spark, and the commands that need nothing else (a no-op re-run, `dpspark ledger show`)
start no JVM. Spark is the reference: each read is compared with the Spark path's on one table."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from dpspark import localdelta, tables
from dpspark.cli import main
from dpspark.privacy.ledger import Ledger

from test_scheduling import daily_config, day_rows


class SparkOnly:
    """Within the block, every read goes through Spark (delta-rs answers None, as when it cannot)."""

    def __enter__(self):
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(localdelta, "read_rows", lambda *a, **k: None)

    def __exit__(self, *exc):
        self.patch.undo()


@pytest.fixture
def spark_only():
    return SparkOnly()


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):
    """A ledger of two inputs (central and local budgets), charges, a refusal, ended attempts; a
    runs/ table with two attempts of one run id and one of another; a finished daily run."""
    base = tmp_path_factory.mktemp("localdelta")
    t1, t2, ledger_path, out = str(base / "t1"), str(base / "t2"), str(base / "ledger"), str(base / "out")
    for i, table in enumerate((t1, t2)):
        spark.createDataFrame(day_rows(i + 1)).write.format("delta").save(table)
    k1, k2 = tables.ledger_key_of(spark, t1), tables.ledger_key_of(spark, t2)
    ledger = Ledger(spark, ledger_path)
    ledger.set_budget(k1, 3.0, 1e-6, input_seen=t1)
    ledger.set_budget(k2, 2.0, 0.0, guarantee="local")
    ledger.mark(k1, "a", "started", attempt=1, guarantee="central", defer=True)
    ledger.charge(k1, "a", "dplloyd", 1.0, 0.0, guarantee="central", attempt=1, input_seen=t1, defer=True)
    ledger.mark(k1, "a", "failed", attempt=1, guarantee="central")
    ledger.charge(k2, "b", "ldp", 1.5, 0.0, guarantee="local", attempt=1)
    with pytest.raises(Exception):
        ledger.charge(k2, "c", "ldp", 1.0, 0.0, guarantee="local", attempt=1)  # refused: 0.5 left
    ledger.mark(k2, "b", "succeeded", attempt=1, guarantee="local")
    runs = str(base / "runs")
    for run_id, attempt, status in (("a", 1, "failed"), ("a", 2, "running"), ("b", 1, "succeeded")):
        record = {name: None for name in tables.RUNS_COLUMNS}
        record.update(run_id=run_id, attempt=attempt, status=status, input_version=3, epsilon_spent=1.0,
                      started_at=ledger._now(), charged=True)
        tables.write_run_record(spark, runs, record, new=True)
    tables.write_run_record(spark, runs, {**record, "status": "failed"})  # b's row replaced
    cfg = daily_config(base, t1, ledger_path, out)
    assert main(["run", "--config", cfg, "--run-id", "day-1"], spark=spark) == 0
    return {"ledger": ledger, "keys": (k1, k2), "runs": runs, "t1": t1, "cfg": cfg, "out": out,
            "ledger_path": ledger_path}


def test_ledger_reads_without_spark_equal_sparks(history, spark_only):
    ledger, (k1, k2) = history["ledger"], history["keys"]
    events = ledger.events()
    middle = events[len(events) // 2]["updated_at"]
    selections = [{}, {"run_id": "a"}, {"statuses": ["charged", "refused"]}, {"since": middle},
                  {"until": middle}, {"since": middle - timedelta(seconds=1), "until": middle + timedelta(seconds=1)},
                  {"last": 2}, {"last": 100}, {"run_id": "nothing"}]
    assert ledger._rows_without_spark(("run",), None) is not None  # this ledger is read by delta-rs
    local = {"balances": [ledger.balances(k) for k in (None, k1, k2)],
             "runs": [ledger.runs(k) for k in (None, k1, k2)],
             "events": [ledger.events(k, **s) for k in (None, k1, k2) for s in selections]}
    with spark_only:
        assert ledger._rows_without_spark(("run",), None) is None
        by_spark = {"balances": [ledger.balances(k) for k in (None, k1, k2)],
                    "runs": [ledger.runs(k) for k in (None, k1, k2)],
                    "events": [ledger.events(k, **s) for k in (None, k1, k2) for s in selections]}
    assert local == by_spark
    assert len(local["events"][0]) >= 8 and {e["status"] for e in local["events"][0]} >= {"refused", "charged", "failed"}
    # ordered by input key, then guarantee (the keys are Delta table ids: their order is random)
    order = [(b["input_key"], b["guarantee"]) for b in local["balances"][0]]
    assert len(order) >= 2 and order == sorted(order)


def test_read_attempts_without_spark_equals_sparks(spark, history, spark_only):
    runs = history["runs"]
    local = {r: tables.read_attempts(spark, runs, r) for r in ("a", "b", "zz")}
    assert local == {r: tables.read_attempts_without_spark(runs, r) for r in ("a", "b", "zz")}
    with spark_only:
        assert tables.read_attempts_without_spark(runs, "a") is None
        by_spark = {r: tables.read_attempts(spark, runs, r) for r in ("a", "b", "zz")}
    assert local == by_spark
    assert [r["attempt"] for r in local["a"]] == [1, 2] and [r["status"] for r in local["b"]] == ["failed"]
    assert tables.read_attempts_without_spark(runs + "-missing", "a") == []  # no runs/ yet


def test_a_table_delta_rs_may_not_read_is_left_to_spark(spark, tmp_path):
    """Deletion vectors need reader features: delta-rs answers None and Spark reads the table."""
    runs = str(tmp_path / "runs")
    record = {name: None for name in tables.RUNS_COLUMNS}
    record.update(run_id="r", attempt=1, status="succeeded")
    tables.write_run_record(spark, runs, record, new=True)
    spark.sql(f"ALTER TABLE delta.`{runs}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    assert localdelta.open_table(runs) is None and tables.read_attempts_without_spark(runs, "r") is None
    assert [r["status"] for r in tables.read_attempts(spark, runs, "r")] == ["succeeded"]
    assert tables.ledger_key_without_spark("s3a://bucket/table") is None  # remote: Spark's answer only


def no_spark(monkeypatch):
    import dpspark.session

    def refuse(*args, **kwargs):
        raise RuntimeError("this command started Spark")

    monkeypatch.setattr(dpspark.session, "build_session", refuse)


def test_a_no_op_rerun_decides_before_spark_starts(history, monkeypatch, capsys):
    no_spark(monkeypatch)
    capsys.readouterr()
    assert main(["run", "--config", history["cfg"], "--run-id", "day-1", "--json"]) == 0
    out = capsys.readouterr()
    line = json.loads(out.out.strip().splitlines()[-1])
    assert line["status"] == "already_succeeded" and line["attempt"] == 1 and line["epsilon_spent"] == 0.0
    assert "already succeeded" in out.err
    # a new run id, or --force, needs Spark (here: refused by the patched session)
    assert main(["run", "--config", history["cfg"], "--run-id", "day-2"]) == 1
    assert "this command started Spark" in capsys.readouterr().err
    assert main(["run", "--config", history["cfg"], "--run-id", "day-1", "--force"]) == 1
    assert "this command started Spark" in capsys.readouterr().err


def test_ledger_show_starts_no_spark_and_prints_what_spark_reads(spark, history, monkeypatch, capsys, spark_only):
    argv = ["ledger", "show", "--ledger", history["ledger_path"], "--input", history["t1"]]
    with spark_only:
        capsys.readouterr()
        assert main(argv, spark=spark) == 0
        by_spark = capsys.readouterr().out
        assert main(argv + ["--json", "--last", "3"], spark=spark) == 0
        by_spark_json = capsys.readouterr().out
    no_spark(monkeypatch)
    assert main(argv) == 0
    assert capsys.readouterr().out == by_spark
    assert main(argv + ["--json", "--last", "3"]) == 0
    assert capsys.readouterr().out == by_spark_json
    assert "day-1" in by_spark and len(json.loads(by_spark_json)["events"]) == 3


def test_a_refusal_read_without_spark_needs_no_update_and_says_what_spark_says(spark, tmp_path, spark_only):
    from dpspark.errors import BudgetRefused

    table = str(tmp_path / "t")
    spark.createDataFrame(day_rows(1)).write.format("delta").save(table)
    key = tables.ledger_key_of(spark, table)

    def updates(path):
        return sum(1 for h in localdelta.open_table(path).history() if h.get("operation") == "UPDATE")

    messages, remaining = [], []
    for mode, path in (("spark", str(tmp_path / "l1")), ("local", str(tmp_path / "l2"))):
        ledger = Ledger(spark, path)
        ledger.set_budget(key, 1.0, 1e-6)
        ledger.charge(key, "ok", "dplloyd", 0.75, 0.0, attempt=1)
        assert updates(path) == 1
        for ask, budget in ((0.5, None), (0.2, 0.9), (0.1, None)):  # over the cap; over a lower request; fits
            try:
                if mode == "spark":
                    with spark_only:
                        ledger.charge(key, f"r{ask}", "dplloyd", ask, 0.0, budget, 0.0 if budget else None, attempt=1)
                else:
                    ledger.charge(key, f"r{ask}", "dplloyd", ask, 0.0, budget, 0.0 if budget else None, attempt=1)
                messages.append((mode, ask, "charged"))
            except BudgetRefused as exc:
                messages.append((mode, ask, str(exc).replace(path, "LEDGER")))
        remaining.append([(e["run_id"], e["remaining_epsilon"]) for e in ledger.events(key, statuses=["refused"])])
        # local: the two refusals ran no UPDATE; the last charge did (2 in all)
        assert updates(path) == 2 if mode == "local" else updates(path) >= 2
    by_mode = {m: [(a, t) for mm, a, t in messages if mm == m] for m in ("spark", "local")}
    assert by_mode["spark"] == by_mode["local"] and by_mode["local"][2] == (0.1, "charged")
    assert "remain" in by_mode["local"][0][1] and remaining[0] == remaining[1] and len(remaining[0]) == 2
