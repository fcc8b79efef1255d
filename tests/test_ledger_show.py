"""``dpspark ledger show`` (issue 29, item 6): a refused run's event says what it asked for and what
its budget had left; times are shown in UTC with their zone (text and ``--json``); ``--run-id``,
``--status``, ``--since``, ``--until`` and ``--last`` select events (balances stay those of
``--input``); a bad filter value is an error naming the flag and the value (exit 2, before Spark)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone

import pytest

from dpspark.cli import main
from dpspark.errors import BudgetRefused
from dpspark.privacy.ledger import COLUMNS, SCHEMA, Ledger, _balance_id

KEY = "file:/data/people"


def show(spark, capsys, ledger_path, *extra):
    capsys.readouterr()
    code = main(["ledger", "show", "--ledger", ledger_path, *extra], spark=spark)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def show_json(spark, capsys, ledger_path, *extra):
    return json.loads(show(spark, capsys, ledger_path, *extra, "--json"))


def event_lines(text):
    return [line for line in text.split("events (", 1)[1].splitlines()[1:] if line.strip()]


def test_a_refused_event_records_and_shows_what_it_asked_for(spark, tmp_path, capsys):
    path = str(tmp_path / "ledger")
    ledger = Ledger(spark, path)
    ledger.set_budget(KEY, 1.5, 1e-6)
    ledger.charge(KEY, "first", "dplloyd", 1.0, 0.0, attempt=1)
    with pytest.raises(BudgetRefused):
        ledger.charge(KEY, "second", "dplloyd", 1.0, 0.0, attempt=1)
    with pytest.raises(BudgetRefused):  # under the cap, over the run's own lower request (0.8): 0.8 - 1.0 left
        ledger.charge(KEY, "third", "dplloyd", 0.25, 1e-7, 0.8, 1e-6, attempt=1)
    with pytest.raises(BudgetRefused):  # no cap at all for this input
        ledger.charge("file:/data/other", "fourth", "maxcover", 2.0, 1e-6, attempt=1)
    refused = {e["run_id"]: e for e in ledger.runs() if e["status"] == "refused"}
    assert {r: (e["epsilon"], e["delta"], e["asked_epsilon"], e["asked_delta"], e["remaining_epsilon"], e["remaining_delta"])
            for r, e in refused.items()} == {
        "second": (0.0, 0.0, 1.0, 0.0, pytest.approx(0.5), 1e-6),  # charged nothing; asked 1 with 0.5 left
        "third": (0.0, 0.0, 0.25, 1e-7, 0.0, 1e-6),
        "fourth": (0.0, 0.0, 2.0, 1e-6, None, None),
    }
    text = show(spark, capsys, path)
    lines = {line.split(" run ")[1].split()[0]: line for line in event_lines(text) if " run " in line}
    assert "refused    run second attempt 1 asked epsilon=1 delta=0; remaining epsilon=0.5 delta=1e-06" in lines["second"]
    assert "asked epsilon=0.25 delta=1e-07; remaining epsilon=0 delta=1e-06" in lines["third"]
    assert "asked epsilon=2 delta=1e-06; no cap in the ledger" in lines["fourth"]
    assert "asked" not in lines["first"] and "charged    run first attempt 1 epsilon=1 delta=0" in lines["first"]
    shown = show_json(spark, capsys, path, "--status", "refused")
    assert [(e["run_id"], e["asked_epsilon"], e["remaining_epsilon"]) for e in shown["events"]] == [
        ("second", 1.0, pytest.approx(0.5)), ("third", 0.25, 0.0), ("fourth", 2.0, None)]


def test_times_are_shown_in_utc_with_their_zone(spark, tmp_path, capsys):
    path = str(tmp_path / "ledger")
    before = datetime.now(timezone.utc).replace(microsecond=0)
    Ledger(spark, path).set_budget(KEY, 1.0, 0.0)
    after = datetime.now(timezone.utc) + timedelta(seconds=1)
    (event,) = show_json(spark, capsys, path)["events"]
    assert event["updated_at"].endswith("Z"), event["updated_at"]
    assert before <= datetime.fromisoformat(event["updated_at"]) <= after  # the real UTC time, not a local one
    (line,) = event_lines(show(spark, capsys, path))
    when = line.split()[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", when), line
    assert before <= datetime.fromisoformat(when) <= after


def test_times_stay_utc_when_the_local_zone_is_not(spark, tmp_path, capsys, monkeypatch):
    """A naive time given to the ledger is UTC, stored and read back as that instant whatever the local
    zone (tests/test_ledger_tz.py: a writer and a reader in different zones)."""
    path = str(tmp_path / "ledger")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        ledger = Ledger(spark, path)
        ledger._append(dict(kind="run", input_path=KEY, run_id="r", status="started", updated_at=datetime(2024, 5, 1, 3, 30)))
        shown = show_json(spark, capsys, path, "--since", "2024-05-01T03:30:00Z", "--until", "2024-04-30T23:30:00-04:00")
        assert [e["updated_at"] for e in shown["events"]] == ["2024-05-01T03:30:00Z"]
        assert show_json(spark, capsys, path, "--since", "2024-05-01T03:30:01Z")["events"] == []
    finally:
        monkeypatch.undo()  # the TZ this process had
        time.tzset()


@pytest.fixture
def timed_ledger(spark, tmp_path):
    """A ledger with a budget (set now) and five run events at known UTC times (2024)."""
    path = str(tmp_path / "ledger")
    ledger = Ledger(spark, path)
    ledger.set_budget(KEY, 2.0, 0.0, note="q2")
    at = lambda *t: datetime(2024, *t)  # noqa: E731  (naive UTC: the ledger's convention)
    ledger._append(
        dict(kind="run", input_path=KEY, run_id="a", status="started", attempt=1, updated_at=at(5, 1, 10, 0)),
        dict(kind="run", input_path=KEY, run_id="a", status="charged", attempt=1, epsilon=1.0, delta=0.0,
             updated_at=at(5, 1, 23, 59, 59)),
        dict(kind="run", input_path=KEY, run_id="b", status="started", attempt=1, updated_at=at(5, 2, 0, 0)),
        dict(kind="run", input_path=KEY, run_id="b", status="refused", attempt=1, asked_epsilon=3.0, asked_delta=0.0,
             remaining_epsilon=1.0, remaining_delta=0.0, updated_at=at(5, 2, 0, 0, 1)),
        dict(kind="run", input_path=KEY, run_id="a", status="succeeded", attempt=1, updated_at=at(5, 3, 8, 0)),
    )
    return path


def picked(spark, capsys, path, *extra):
    return [(e["run_id"], e["status"]) for e in show_json(spark, capsys, path, *extra)["events"]]


def test_filters_select_events(spark, capsys, timed_ledger):
    path = timed_ledger
    everything = picked(spark, capsys, path)
    assert everything == [("a", "started"), ("a", "charged"), ("b", "started"), ("b", "refused"), ("a", "succeeded"),
                          (None, "set-budget")]
    assert picked(spark, capsys, path, "--run-id", "a") == [("a", "started"), ("a", "charged"), ("a", "succeeded")]
    assert picked(spark, capsys, path, "--status", "refused,charged") == [("a", "charged"), ("b", "refused")]
    assert picked(spark, capsys, path, "--status", "refused", "--status", "set-budget") == [
        ("b", "refused"), (None, "set-budget")]
    # --until with a date alone: to the end of that day; --since inclusive; --until inclusive
    assert picked(spark, capsys, path, "--until", "2024-05-01") == [("a", "started"), ("a", "charged")]
    assert picked(spark, capsys, path, "--since", "2024-05-02", "--until", "2024-05-02") == [("b", "started"), ("b", "refused")]
    assert picked(spark, capsys, path, "--since", "2024-05-01T23:59:59Z", "--until", "2024-05-02T00:00:00") == [
        ("a", "charged"), ("b", "started")]
    assert picked(spark, capsys, path, "--since", "2024-05-02T02:00:00+02:00", "--until", "2024-05-02 00:00:01Z") == [
        ("b", "started"), ("b", "refused")]
    assert picked(spark, capsys, path, "--last", "2") == [("a", "succeeded"), (None, "set-budget")]
    assert picked(spark, capsys, path, "--run-id", "b", "--last", "1") == [("b", "refused")]
    assert picked(spark, capsys, path, "--run-id", "nobody") == []
    # the balances are still shown, whatever the events selected
    shown = show_json(spark, capsys, path, "--run-id", "nobody")
    assert [(b["input_key"], b["cap_epsilon"]) for b in shown["balances"]] == [(KEY, 2.0)]
    text = show(spark, capsys, path, "--status", "refused", "--until", "2024-05-02")
    assert "cap epsilon=2" in text
    assert "events (oldest first; only status refused; until 2024-05-02 (the whole day); times UTC):" in text
    assert [line.split()[:2] for line in event_lines(text)] == [["2024-05-02T00:00:01Z", "refused"]]
    assert "asked epsilon=3 delta=0; remaining epsilon=1 delta=0" in text
    empty = show(spark, capsys, path, "--run-id", "nobody")
    assert event_lines(empty) == ["  (none)"]


@pytest.mark.parametrize("extra, named", [
    (["--status", "refused,bogus"], "--status 'bogus'"),
    (["--status", ""], "--status ''"),
    (["--since", "yesterday"], "--since 'yesterday'"),
    (["--until", "2024-13-01"], "--until '2024-13-01'"),
    (["--since", "2024-05-03", "--until", "2024-05-02"], "--since '2024-05-03' is after --until '2024-05-02'"),
    (["--last", "0"], "--last must be a whole number >= 1, got '0'"),
    (["--last", "two"], "got 'two'"),
    (["--run-id", "no such id"], "--run-id 'no such id'"),
])
def test_a_bad_filter_is_an_error_naming_the_flag_before_spark_starts(tmp_path, capsys, monkeypatch, extra, named):
    import dpspark.session

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started for a bad argument")

    monkeypatch.setattr(dpspark.session, "build_session", no_spark)
    capsys.readouterr()
    assert main(["ledger", "show", "--ledger", str(tmp_path / "ledger"), *extra]) == 2
    err = capsys.readouterr().err
    assert named in err and "invalid argument" in err, err


def test_a_ledger_of_an_older_dpspark_is_shown_then_upgraded(spark, tmp_path, capsys):
    """A ledger without the asked/remaining columns: shown as it is (its refusal says nothing it did
    not record); the next charge adds the columns and its refusal records what it asked for."""
    path = str(tmp_path / "ledger")
    new_columns = ("asked_epsilon", "asked_delta", "remaining_epsilon", "remaining_delta")
    old_schema = ", ".join(f for f in SCHEMA.split(", ") if f.split()[0] not in new_columns)
    old_columns = [c for c in COLUMNS if c not in new_columns]
    ledger = Ledger(spark, path)
    rows = [ledger._event(kind="admin", input_path=KEY, status="set-budget", guarantee="central", cap_epsilon=1.0,
                          cap_delta=0.0, actor="admin@host"),
            ledger._event(kind="run", input_path=KEY, run_id="old", status="refused", epsilon=0.0, delta=0.0, attempt=1)]
    balance = ledger._row(entry_id=_balance_id(KEY),
                          kind="balance", input_path=KEY, epsilon=0.0, delta=0.0, status="total",
                          updated_at=datetime(2024, 1, 1), guarantee="central", cap_epsilon=1.0, cap_delta=0.0)
    old_rows = [tuple(r[COLUMNS.index(c)] for c in old_columns) for r in [balance, *rows]]
    spark.createDataFrame(old_rows, old_schema).write.format("delta").save(path)
    text = show(spark, capsys, path)
    assert "refused    run old attempt 1" in text and "asked" not in text
    (old,) = [e for e in show_json(spark, capsys, path)["events"] if e["status"] == "refused"]
    assert old["asked_epsilon"] is None and old["updated_at"].endswith("Z")
    with pytest.raises(BudgetRefused):
        Ledger(spark, path).charge(KEY, "new", "dplloyd", 2.0, 0.0, attempt=1)
    assert set(new_columns) <= set(spark.read.format("delta").load(path).columns)
    text = show(spark, capsys, path, "--status", "refused")
    assert "refused    run new attempt 1 asked epsilon=2 delta=0; remaining epsilon=1 delta=0" in text
