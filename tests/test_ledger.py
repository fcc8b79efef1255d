"""The privacy ledger: it owns each input's budget cap (set by its administrator; a run's config can
only ask for less), refusal (exit 3), charge before release, failed runs stay charged, and concurrent
runs with a budget for one. Input keys are canonical (``tables.ledger_key_of``)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from dpspark import tables
from dpspark.cli import main
from dpspark.errors import BudgetRefused
from dpspark.privacy.ledger import Ledger

from test_pipeline import make_config, points_frame, set_budget


def statuses(ledger, input_key):
    return [(e["run_id"], e["attempt"], e["status"], e["epsilon"]) for e in ledger.runs(input_key)]


def test_second_run_over_budget_is_refused_with_exit_3_and_writes_only_its_refusal(spark, tmp_path, write_delta):
    path = write_delta(points_frame(50))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=1.5)
    common = {"privacy.ledger": ledger_path, "output.report": False}
    cfg1, c1 = make_config(tmp_path, path, **common, **{"output.path": str(tmp_path / "out1")})
    # The second run asks for a budget far above the ledger's cap: a config can only LOWER the cap.
    cfg2, c2 = make_config(tmp_path, path, **common, **{"output.path": str(tmp_path / "out2"),
                                                         "privacy.budget": {"epsilon": 1e9, "delta": 0.0}})
    assert main(["run", "--config", cfg1, "--run-id", "first"], spark=spark) == 0
    assert main(["run", "--config", cfg2, "--run-id", "second"], spark=spark) == 3
    out2 = c2["output"]["path"]
    assert sorted(os.listdir(out2)) == ["runs"]  # no centers, summary.json or report
    runs = spark.read.format("delta").load(out2 + "/runs").collect()
    assert [(r.run_id, r.attempt, r.status, r.epsilon_spent, r.charged) for r in runs] == [("second", 1, "refused", 0.0, False)]
    ledger = Ledger(spark, ledger_path)
    totals = ledger.totals(key)
    assert totals.spent_epsilon == pytest.approx(1.0) and totals.ledger_cap_epsilon == 1.5
    assert statuses(ledger, key) == [("first", 1, "started", 0.0), ("first", 1, "charged", 1.0), ("first", 1, "fit_started", 0.0),
                                     ("first", 1, "succeeded", 0.0),
                                     ("second", 1, "started", 0.0), ("second", 1, "refused", 0.0)]
    with open(os.path.join(c1["output"]["path"], "summary.json")) as handle:
        ledger_view = json.load(handle)["ledger"]
    assert ledger_view["spent_epsilon"] == pytest.approx(1.0) and ledger_view["remaining_epsilon"] == pytest.approx(0.5)
    assert ledger_view["input_key"] == key and ledger_view["ledger_cap_epsilon"] == 1.5


def test_the_cap_is_the_ledgers_and_a_config_can_only_lower_it(spark, tmp_path):
    """Direct ledger calls: no cap, no charge; a run's request above the cap changes nothing; one below
    it binds; each guarantee (central, local) has its own cap and total."""
    ledger = Ledger(spark, str(tmp_path / "ledger"))
    with pytest.raises(BudgetRefused, match="no central budget"):
        ledger.charge("file:/data/people", "r0", "dplloyd", 0.1, 0.0)
    ledger.set_budget("file:/data/people", 2.0, 0.0)
    ledger.charge("file:/data/people", "r1", "dplloyd", 1.5, 0.0, 1e9, 0.0)  # asking for more: still the cap 2.0
    with pytest.raises(BudgetRefused):
        ledger.charge("file:/data/people", "r2", "dplloyd", 1.0, 0.0, 1e9, 0.0)  # 2.5 > 2.0
    with pytest.raises(BudgetRefused):
        ledger.charge("file:/data/people", "r3", "dplloyd", 0.2, 0.0, 1.6, 0.0)  # under the cap, over the request
    with pytest.raises(BudgetRefused, match="no local budget"):  # a central cap is not a local one
        ledger.charge("file:/data/people", "r4", "ldp", 0.2, 0.0, guarantee="local")
    ledger.charge("file:/data/people", "r5", "dplloyd", 0.2, 0.0)
    ledger.set_budget("file:/data/people", 1.0, 0.0, guarantee="local")
    ledger.charge("file:/data/people", "r6", "ldp", 1.0, 0.0, guarantee="local")
    central, local = ledger.totals("file:/data/people"), ledger.totals("file:/data/people", guarantee="local")
    assert (central.spent_epsilon, central.ledger_cap_epsilon) == (pytest.approx(1.7), 2.0)
    assert (local.spent_epsilon, local.ledger_cap_epsilon) == (1.0, 1.0)  # never added to the central total
    assert [e["status"] for e in ledger.runs("file:/data/people")] == [
        "refused", "charged", "refused", "refused", "refused", "charged", "charged"]
    admin = [e for e in ledger.events("file:/data/people") if e["kind"] == "admin"]
    assert [(e["status"], e["guarantee"], e["cap_epsilon"]) for e in admin] == [("set-budget", "central", 2.0),
                                                                                ("set-budget", "local", 1.0)]
    assert all(e["actor"] for e in admin)


def test_cli_set_budget_and_show_use_one_key_for_every_spelling(spark, tmp_path, write_delta, capsys):
    path = write_delta(points_frame(10))
    ledger_path = str(tmp_path / "ledger")
    key = tables.ledger_key_of(spark, path)
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", path, "--epsilon", "3", "--delta", "0"],
                spark=spark) == 0
    # Another spelling of the same table (file: URI, trailing slash) is the same balance.
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", "file://" + path + "/", "--epsilon", "4",
                 "--delta", "1e-6"], spark=spark) == 0
    assert main(["ledger", "set-budget", "--ledger", ledger_path, "--input", path, "--epsilon", "0", "--delta", "0"],
                spark=spark) == 2
    capsys.readouterr()
    assert main(["ledger", "show", "--ledger", ledger_path, "--input", path, "--json"], spark=spark) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(b["input_key"], b["guarantee"], b["cap_epsilon"], b["cap_delta"], b["spent_epsilon"]) for b in shown["balances"]] == [
        (key, "central", 4.0, 1e-6, 0.0)]
    assert [e["status"] for e in shown["events"]] == ["set-budget", "set-budget"]
    assert main(["ledger", "show", "--ledger", ledger_path], spark=spark) == 0
    assert "cap epsilon=4" in capsys.readouterr().out


def test_charge_is_written_before_the_data_is_read(spark, tmp_path, write_delta, monkeypatch):
    from dpspark.dplloyd.estimator import DPLloyd

    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path)
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False})
    seen = {}
    original = DPLloyd.fit

    def spy(self, df, timings=None, operational=None):
        seen["totals"] = Ledger(spark, ledger_path).totals(key).spent_epsilon
        return original(self, df, timings, operational)

    monkeypatch.setattr(DPLloyd, "fit", spy)
    assert main(["run", "--config", cfg], spark=spark) == 0
    assert seen["totals"] == pytest.approx(1.0)  # already charged when the algorithm started


def test_failed_run_stays_charged_and_leaves_no_result(spark, tmp_path, write_delta, monkeypatch):
    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path)
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path})
    original = tables.write_run_record

    def fail_after_centers(spark_, runs_path, record, **kwargs):  # fail late: after centers and report were written
        if record["status"] == "succeeded":
            raise RuntimeError("disk full")
        return original(spark_, runs_path, record, **kwargs)

    monkeypatch.setattr(tables, "write_run_record", fail_after_centers)
    assert main(["run", "--config", cfg, "--run-id", "doomed"], spark=spark) == 1
    out = c["output"]["path"]
    assert not os.path.exists(os.path.join(out, "summary.json")) and not os.path.exists(os.path.join(out, "summary"))
    assert not os.path.exists(os.path.join(out, "report.png")) and not os.path.exists(os.path.join(out, "report.html"))
    assert spark.read.format("delta").load(out + "/centers").where("run_id = 'doomed'").count() == 0
    run = spark.read.format("delta").load(out + "/runs").first()
    assert run.status == "failed" and run.epsilon_spent == pytest.approx(1.0)
    # Once the fit has started, a non-dpspark error may quote a private value: runs/ keeps its type only.
    assert run.error.startswith("RuntimeError") and "disk full" not in run.error
    assert run.attempt == 1 and run.charged and run.fit_started
    ledger = Ledger(spark, ledger_path)
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)
    assert statuses(ledger, key) == [("doomed", 1, "started", 0.0), ("doomed", 1, "charged", 1.0),
                                     ("doomed", 1, "fit_started", 0.0), ("doomed", 1, "failed", 0.0)]
    # The retry is attempt 2. Attempt 1's fit started (noise was drawn), so its charge is spent for
    # good: the retry is charged again and never reuses it.
    monkeypatch.setattr(tables, "write_run_record", original)
    assert main(["run", "--config", cfg, "--run-id", "doomed"], spark=spark) == 0
    assert ledger.totals(key).spent_epsilon == pytest.approx(2.0)
    assert statuses(ledger, key)[4:] == [("doomed", 2, "started", 0.0), ("doomed", 2, "charged", 1.0),
                                         ("doomed", 2, "fit_started", 0.0), ("doomed", 2, "succeeded", 0.0)]
    runs = spark.read.format("delta").load(out + "/runs").orderBy("attempt").collect()
    assert [(r.attempt, r.status, r.charge_reused_from) for r in runs] == [(1, "failed", None), (2, "succeeded", None)]


def test_concurrent_runs_with_a_budget_for_one(spark, tmp_path):
    """Two charges at the same moment against a budget that fits one: exactly one passes."""
    from dpspark.errors import BudgetRefused

    for attempt in range(2):
        ledger = Ledger(spark, str(tmp_path / f"ledger{attempt}"))
        ledger.set_budget("/data/warmup", 1.0, 0.0)
        ledger.charge("/data/warmup", "w", "dplloyd", 0.1, 0.0)  # table exists, JVM warm
        ledger.set_budget("/data/people", 1.5, 0.0)  # the administrator's cap: room for one charge of 1.0
        barrier = threading.Barrier(2)
        results = {}

        def go(name):
            barrier.wait()
            try:
                ledger.charge("/data/people", name, "dplloyd", 1.0, 0.0)
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
    key = set_budget(spark, ledger_path, path, epsilon=1.0)
    configs = [make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False,
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
    assert Ledger(spark, ledger_path).totals(key).spent_epsilon == pytest.approx(1.0)


def test_ledger_operations_use_small_table_settings_and_put_the_sessions_back(spark, tmp_path, monkeypatch):
    """The ledger runs its few-row queries with 1 shuffle and 1 snapshot partition, then restores
    the session's own settings (set or unset), also when the operation raises. (Its Spark path: the
    refusal below would otherwise be read by delta-rs, without any Spark query.)"""
    from dpspark import localdelta
    from dpspark.privacy import ledger as ledger_mod

    monkeypatch.setattr(localdelta, "read_rows", lambda *a, **k: None)

    seen = []
    real_totals = Ledger.totals.__wrapped__

    def spying_totals(self, *args, **kwargs):
        seen.append({key: spark.conf.get(key, None) for key in ledger_mod._LEDGER_CONF})
        return real_totals(self, *args, **kwargs)

    shuffle_before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    snapshot_before = spark.conf.get("spark.databricks.delta.snapshotPartitions", None)
    ledger = Ledger(spark, str(tmp_path / "ledger"))
    ledger.set_budget("/in", 1.0, 0.0)  # before the spy: set_budget reads the totals too
    try:
        Ledger.totals = ledger_mod._small_table(spying_totals)
        ledger.charge("/in", "r1", "dplloyd", 1.0, 0.0, 1.0, 0.0)
        with pytest.raises(BudgetRefused):
            ledger.charge("/in", "r2", "dplloyd", 1.0, 0.0, 1.0, 0.0)
    finally:
        Ledger.totals = ledger_mod._small_table(real_totals)
        after = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", shuffle_before)  # the shared session's own value
    assert seen == [{"spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1"}] * 2
    assert after == "7"
    assert spark.conf.get("spark.databricks.delta.snapshotPartitions", None) == snapshot_before


def test_a_ledger_that_already_refuses_refuses_before_spark_reads_the_input(spark, tmp_path, write_delta, monkeypatch):
    """An attempt over a local Delta input whose ledger already refuses its charge is refused before
    Spark's read of the input (``Attempt.refuse_before_reading``), with the records that read would
    give (key, version, path) and the same ledger events; with budget, the read and the charge come
    as before."""
    path = write_delta(points_frame(50))
    spark.createDataFrame(points_frame(5, seed=3)).write.format("delta").mode("append").save(path)  # version 1
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=0.5)  # a run asks for epsilon 1
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False})
    reads = []
    real = tables.load_input
    monkeypatch.setattr(tables, "load_input", lambda *a, **k: reads.append(1) or real(*a, **k))
    ledger = Ledger(spark, ledger_path)
    before = ledger.totals(key)

    assert main(["run", "--config", cfg, "--run-id", "early"], spark=spark) == 3
    assert reads == []  # decided from the ledger and the input's Delta log only
    row = spark.read.format("delta").load(c["output"]["path"] + "/runs").collect()[0]
    assert (row.status, row.charged, row.epsilon_spent) == ("refused", False, 0.0)
    assert (row.input_key, row.input_version, row.input_path) == (key, 1, tables.qualify(path))
    assert statuses(ledger, key) == [("early", 1, "started", 0.0), ("early", 1, "refused", 0.0)]
    refused = [e for e in ledger.events(key) if e["status"] == "refused"][0]
    assert (refused["input_seen"], refused["remaining_epsilon"], refused["asked_epsilon"]) == (tables.qualify(path), 0.5, 1.0)
    assert ledger.totals(key).spent_epsilon == before.spent_epsilon == 0.0

    # Its retry (no earlier charge to take over) is refused the same way; with budget, the run reads,
    # is charged and succeeds.
    assert main(["run", "--config", cfg, "--run-id", "early"], spark=spark) == 3
    assert reads == [] and [s for _, a, s, _ in statuses(ledger, key) if a == 2] == ["started", "refused"]
    set_budget(spark, ledger_path, path, epsilon=5.0)
    assert main(["run", "--config", cfg, "--run-id", "early"], spark=spark) == 0
    assert reads == [1] and ledger.totals(key).spent_epsilon == pytest.approx(1.0)


def test_a_retry_that_can_take_over_its_earlier_charge_is_not_refused_before_the_read(spark, tmp_path, monkeypatch):
    """The budget is all spent by attempt 1's charge, which ended before its fit: the ledger alone
    would refuse attempt 2, but it takes that charge over (``reusable_charge``) and succeeds."""
    from test_scheduling import killed_after_its_charge, one_capped_table

    key, ledger, cfg, out = one_capped_table(spark, tmp_path, 1.0)
    killed_after_its_charge(spark, monkeypatch, cfg, "r")
    assert ledger.refuses(key, 1.0, 0.0) is not None  # nothing left for a new charge
    assert main(["run", "--config", cfg, "--run-id", "r"], spark=spark) == 0
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)
    assert [e["status"] for e in ledger.runs(key)][3:] == ["started", "reused", "fit_started", "succeeded"]


def test_refuses_reads_the_ledger_and_writes_nothing(spark, tmp_path):
    from dpspark import localdelta

    ledger = Ledger(spark, str(tmp_path / "ledger"))
    ledger.set_budget("file:/data/people", 1.0, 1e-6)
    version = localdelta.open_table(ledger.path).version()
    assert ledger.refuses("file:/data/people", 0.5, 0.0) is None  # it fits: the charge decides
    totals = ledger.refuses("file:/data/people", 1.5, 0.0)
    assert totals is not None and totals.ledger_cap_epsilon == 1.0 and totals.spent_epsilon == 0.0
    assert ledger.refuses("file:/data/people", 0.5, 0.0, 0.4, 0.0) is not None  # over the run's lower request
    assert ledger.refuses("file:/data/other", 0.1, 0.0).ledger_cap_epsilon is None  # no cap: refused
    assert localdelta.open_table(ledger.path).version() == version  # nothing written


def test_a_charge_after_refuses_decides_again_when_another_driver_charged_in_between(spark, tmp_path, monkeypatch):
    """``refuses`` keeps its snapshot for the charge's first decision; when another driver charges in
    between, that snapshot is stale: its commit fails and the charge reads again and refuses, so the
    two charges never exceed the cap together."""
    from dpspark import localdelta

    path = str(tmp_path / "ledger")
    mine, theirs = Ledger(spark, path), Ledger(spark, path)
    mine.set_budget("file:/data/people", 1.0, 0.0)
    assert mine.refuses("file:/data/people", 0.6, 0.0) is None  # 0 of 1.0 spent: it fits
    theirs.charge("file:/data/people", "theirs", "dplloyd", 0.6, 0.0)
    version = localdelta.open_table(path).version()
    real_read, reads = localdelta.read_rows, []
    monkeypatch.setattr(localdelta, "read_rows", lambda *a, **k: reads.append(a[1]) or real_read(*a, **k))
    with pytest.raises(BudgetRefused):
        mine.charge("file:/data/people", "mine", "dplloyd", 0.6, 0.0)
    assert len([r for r in reads if r.get("kind") == ["balance"]]) == 1  # the stale snapshot failed: read once more
    assert mine.totals("file:/data/people").spent_epsilon == pytest.approx(0.6)
    assert localdelta.open_table(path).version() > version  # the refusal's events, no second charge
    # Without a competitor the cached snapshot is current and the charge commits on it.
    mine.set_budget("file:/data/people", 2.0, 0.0)
    assert mine.refuses("file:/data/people", 0.6, 0.0) is None
    reads.clear()
    mine.charge("file:/data/people", "mine", "dplloyd", 0.6, 0.0, attempt=2)
    assert [r for r in reads if r.get("kind") == ["balance"]] == []  # decided on refuses's snapshot
    assert mine.totals("file:/data/people").spent_epsilon == pytest.approx(1.2)
