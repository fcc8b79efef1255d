"""The privacy ledger: refusal (exit 3), charge before release, failed runs stay charged,
and concurrent runs with a budget for one."""

from __future__ import annotations

import json
import os
import threading

import pytest

from dpspark.cli import main
from dpspark.privacy.ledger import Ledger

from test_pipeline import make_config, points_frame


def statuses(ledger, input_path):
    return [(e["run_id"], e["status"], e["epsilon"]) for e in ledger.runs(input_path)]


def test_second_run_over_budget_is_refused_with_exit_3_and_writes_only_its_refusal(spark, tmp_path, write_delta):
    path = write_delta(points_frame(50))
    ledger_path = str(tmp_path / "ledger")
    common = {"privacy.ledger": ledger_path, "privacy.budget": {"epsilon": 1.5, "delta": 0.0}}
    cfg1, c1 = make_config(tmp_path, path, **common, **{"output.path": str(tmp_path / "out1")})
    cfg2, c2 = make_config(tmp_path, path, **common, **{"output.path": str(tmp_path / "out2")})
    assert main(["run", "--config", cfg1, "--run-id", "first"], spark=spark) == 0
    assert main(["run", "--config", cfg2, "--run-id", "second"], spark=spark) == 3
    out2 = c2["output"]["path"]
    assert not os.path.exists(os.path.join(out2, "summary.json"))
    assert not os.path.exists(os.path.join(out2, "centers")) and not os.path.exists(os.path.join(out2, "report.png"))
    runs = spark.read.format("delta").load(out2 + "/runs").collect()
    assert [(r.run_id, r.status, r.epsilon_spent) for r in runs] == [("second", "refused", 0.0)]
    ledger = Ledger(spark, ledger_path)
    totals = ledger.totals(path)
    assert totals.spent_epsilon == pytest.approx(1.0)
    assert statuses(ledger, path) == [("first", "charged", 1.0), ("first", "succeeded", 0.0), ("second", "refused", 0.0)]
    with open(os.path.join(c1["output"]["path"], "summary.json")) as handle:
        ledger_view = json.load(handle)["ledger"]
    assert ledger_view["spent_epsilon"] == pytest.approx(1.0) and ledger_view["remaining_epsilon"] == pytest.approx(0.5)


def test_charge_is_written_before_the_data_is_read(spark, tmp_path, write_delta, monkeypatch):
    from dpspark.dplloyd.estimator import DPLloyd

    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger_path})
    seen = {}
    original = DPLloyd.fit

    def spy(self, df, timings=None):
        seen["totals"] = Ledger(spark, ledger_path).totals(path).spent_epsilon
        return original(self, df, timings)

    monkeypatch.setattr(DPLloyd, "fit", spy)
    assert main(["run", "--config", cfg], spark=spark) == 0
    assert seen["totals"] == pytest.approx(1.0)  # already charged when the algorithm started


def test_failed_run_stays_charged_and_leaves_no_result(spark, tmp_path, write_delta, monkeypatch):
    from dpspark import tables

    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path})
    original = tables.write_run_record

    def fail_after_centers(spark_, runs_path, record):  # fail late: after centers and report were written
        if record["status"] == "succeeded":
            raise RuntimeError("disk full")
        return original(spark_, runs_path, record)

    monkeypatch.setattr(tables, "write_run_record", fail_after_centers)
    assert main(["run", "--config", cfg, "--run-id", "doomed"], spark=spark) == 1
    out = c["output"]["path"]
    assert not os.path.exists(os.path.join(out, "summary.json"))
    assert not os.path.exists(os.path.join(out, "report.png")) and not os.path.exists(os.path.join(out, "report.html"))
    assert spark.read.format("delta").load(out + "/centers").where("run_id = 'doomed'").count() == 0
    run = spark.read.format("delta").load(out + "/runs").first()
    assert run.status == "failed" and "disk full" in run.error and run.epsilon_spent == pytest.approx(1.0)
    ledger = Ledger(spark, ledger_path)
    assert ledger.totals(path).spent_epsilon == pytest.approx(1.0)
    assert statuses(ledger, path) == [("doomed", "charged", 1.0), ("doomed", "failed", 0.0)]


def test_concurrent_runs_with_a_budget_for_one(spark, tmp_path):
    """Two charges at the same moment against a budget that fits one: exactly one passes."""
    from dpspark.errors import BudgetRefused

    for attempt in range(2):
        ledger = Ledger(spark, str(tmp_path / f"ledger{attempt}"))
        ledger.charge("/data/warmup", "w", "dplloyd", 0.1, 0.0, None, None)  # table exists, JVM warm
        barrier = threading.Barrier(2)
        results = {}

        def go(name):
            barrier.wait()
            try:
                ledger.charge("/data/people", name, "dplloyd", 1.0, 0.0, 1.5, 0.0)
                results[name] = "charged"
            except BudgetRefused:
                results[name] = "refused"

        threads = [threading.Thread(target=go, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == ["charged", "refused"]
        assert ledger.totals("/data/people").spent_epsilon == pytest.approx(1.0)


def test_concurrent_full_runs_only_one_succeeds(spark, tmp_path, write_delta):
    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    configs = [make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "privacy.budget": {"epsilon": 1.0},
                                             "output.path": str(tmp_path / f"out{i}")})[0] for i in range(2)]
    codes = {}
    barrier = threading.Barrier(2)

    def go(i):
        barrier.wait()
        codes[i] = main(["run", "--config", configs[i], "--run-id", f"run{i}"], spark=spark)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes.values()) == [0, 3]
    assert Ledger(spark, ledger_path).totals(path).spent_epsilon == pytest.approx(1.0)


def test_ledger_operations_use_small_table_settings_and_put_the_sessions_back(spark, tmp_path):
    """The ledger runs its few-row queries with 1 shuffle and 1 snapshot partition, then restores
    the session's own settings (set or unset), also when the operation raises."""
    from dpspark.errors import BudgetRefused
    from dpspark.privacy import ledger as ledger_mod

    seen = []
    real_totals = Ledger.totals.__wrapped__

    def spying_totals(self, *args, **kwargs):
        seen.append({key: spark.conf.get(key, None) for key in ledger_mod._LEDGER_CONF})
        return real_totals(self, *args, **kwargs)

    spark.conf.set("spark.sql.shuffle.partitions", "7")
    snapshot_before = spark.conf.get("spark.databricks.delta.snapshotPartitions", None)
    ledger = Ledger(spark, str(tmp_path / "ledger"))
    try:
        Ledger.totals = ledger_mod._small_table(spying_totals)
        ledger.charge("/in", "r1", "dplloyd", 1.0, 0.0, 1.0, 0.0)
        with pytest.raises(BudgetRefused):
            ledger.charge("/in", "r2", "dplloyd", 1.0, 0.0, 1.0, 0.0)
    finally:
        Ledger.totals = ledger_mod._small_table(real_totals)
        after = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", "4")
    assert seen == [{"spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1"}] * 2
    assert after == "7"
    assert spark.conf.get("spark.databricks.delta.snapshotPartitions", None) == snapshot_before
