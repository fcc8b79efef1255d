"""Ledger and runs/ times are instants (issue 54, item 5a): a writer in one time zone and a reader in
another agree on when an event happened, on every write path (Spark SQL's MERGE, UPDATE and appends;
delta-rs's charge and appends) and every read path (``Ledger.events``, ``public_tables``, ``dpspark
ledger show --json``, and a plain Spark SQL read of the table). The zones are the Spark session's
(``spark.sql.session.timeZone``: what a SQL literal and a displayed TIMESTAMP mean) and the Python
process's ($TZ with ``time.tzset``: what PySpark and pyarrow make of a naive datetime); both are
restored after each test (the session is shared)."""
from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import datetime, timedelta, timezone

import pytest

from dpspark import localdelta, tables
from dpspark.attempt import now as attempt_now
from dpspark.cli import main
from dpspark.privacy.ledger import Ledger

KEY = "file:/data/people"
SESSION_TZ = "spark.sql.session.timeZone"
WRITER, READER = "America/Los_Angeles", "Asia/Tokyo"  # 15 to 17 hours apart, and neither is UTC
SLACK = timedelta(seconds=2)


@contextlib.contextmanager
def in_zone(spark, process_zone: str, session_zone: str):
    """The process's local zone ($TZ) and the Spark session's zone set for the block, then put back."""
    saved_tz, saved_session = os.environ.get("TZ"), spark.conf.get(SESSION_TZ)
    os.environ["TZ"] = process_zone
    time.tzset()
    spark.conf.set(SESSION_TZ, session_zone)
    try:
        yield
    finally:
        if saved_tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved_tz
        time.tzset()
        spark.conf.set(SESSION_TZ, saved_session)


@pytest.fixture(autouse=True)
def zones_restored(spark):
    before = (os.environ.get("TZ"), spark.conf.get(SESSION_TZ), time.tzname)
    yield
    assert (os.environ.get("TZ"), spark.conf.get(SESSION_TZ), time.tzname) == before


@contextlib.contextmanager
def spark_only():
    """Within the block the ledger and runs/ are read and written by Spark only (delta-rs declines)."""
    patch = pytest.MonkeyPatch()
    for name, answer in (("read_rows", None), ("writable_table", None), ("append_rows", False),
                         ("create_table", False)):
        patch.setattr(localdelta, name, lambda *a, _answer=answer, **k: _answer)
    try:
        yield
    finally:
        patch.undo()


def as_utc(value: datetime) -> datetime:
    """A time read back, as an aware UTC datetime (a naive one taken as UTC, the ledger's convention)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def stored_instants(spark, path: str, where: str = "true") -> list[datetime]:
    """Every row's ``updated_at`` as the instant Delta holds (microseconds since the epoch, UTC): no
    zone of the reader enters."""
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    rows = spark.read.format("delta").load(path).where(where).selectExpr("unix_micros(updated_at) AS us").collect()
    return [epoch + timedelta(microseconds=r["us"]) for r in rows]


def within(values, before: datetime, after: datetime) -> bool:
    return all(before - SLACK <= as_utc(v) <= after + SLACK for v in values)


def write_ledger(spark, path: str) -> None:
    """A budget (new ledger: one write; then a MERGE), a public table (MERGE), a charge (UPDATE of the
    balance row, or delta-rs's update) and run events (appends)."""
    ledger = Ledger(spark, path)
    ledger.set_budget(KEY, 2.0, 0.0)
    ledger.set_budget(KEY, 3.0, 0.0)
    ledger.set_public("file:/data/public")
    ledger.mark(KEY, "r1", "started", attempt=1, defer=True)
    ledger.charge(KEY, "r1", "dplloyd", 1.0, 0.0, attempt=1)
    ledger.mark(KEY, "r1", "succeeded", attempt=1)


@pytest.mark.parametrize("engine, writer_zones", [
    # (process zone, session zone): each one alone off UTC (both off UTC: the same two mistakes at once)
    ("spark", ("UTC", WRITER)),  # a UTC machine whose Spark session shows times in another zone
    ("spark", (WRITER, "UTC")),  # a laptop in its own zone, a session set to UTC
    ("delta-rs", (WRITER, WRITER)),
])
def test_a_writer_and_a_reader_in_different_zones_agree_on_the_instant(spark, tmp_path, capsys, engine, writer_zones):
    path = str(tmp_path / "ledger")
    with in_zone(spark, *writer_zones):
        before = datetime.now(timezone.utc)
        if engine == "spark":
            with spark_only():
                write_ledger(spark, path)
        else:
            write_ledger(spark, path)
        after = datetime.now(timezone.utc)
    engines = {"delta-rs" if "delta-rs" in str(h.get("engineInfo") or h.get("clientVersion")) else "spark"
               for h in localdelta.open_table(path).history()}
    assert "delta-rs" in engines if engine == "delta-rs" else engines == {"spark"}
    with in_zone(spark, READER, READER):
        # what Delta holds: every row, the balance row the charge updated included
        instants = stored_instants(spark, path)
        assert len(instants) == 8 and within(instants, before, after), (instants, before, after)
        for reader in ("delta-rs", "spark"):
            with spark_only() if reader == "spark" else contextlib.nullcontext():
                ledger = Ledger(spark, path)
                events, public = ledger.events(), ledger.public_tables()
                assert [e["status"] for e in events] == ["set-budget", "set-budget", "set-public", "started", "charged",
                                                         "succeeded"]
                times = [e["updated_at"] for e in events] + [p["updated_at"] for p in public]
                assert within(times, before, after), (reader, times, before, after)
                # the selections by time are on the same instants
                assert len(ledger.events(since=before - SLACK, until=after + SLACK)) == 6
                assert ledger.events(since=after + SLACK) == [] and ledger.events(until=before - SLACK) == []
        capsys.readouterr()
        assert main(["ledger", "show", "--ledger", path, "--json"], spark=spark) == 0
        shown = json.loads(capsys.readouterr().out)
        assert within([datetime.fromisoformat(e["updated_at"]) for e in shown["events"]], before, after), shown


def test_times_given_in_one_zone_are_selected_in_another(spark, tmp_path, capsys):
    """An event written with a given time (naive: UTC, the ledger's convention; or aware) is that
    instant for a reader anywhere, and ``--since``/``--until`` select it there."""
    path = str(tmp_path / "ledger")
    with in_zone(spark, WRITER, WRITER):
        ledger = Ledger(spark, path)
        ledger.set_budget(KEY, 1.0, 0.0)
        ledger._append(dict(kind="run", input_path=KEY, run_id="naive", status="started",
                            updated_at=datetime(2024, 5, 1, 3, 30)),
                       dict(kind="run", input_path=KEY, run_id="aware", status="started",
                            updated_at=datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=9)))))
    with in_zone(spark, READER, READER):
        capsys.readouterr()
        assert main(["ledger", "show", "--ledger", path, "--json", "--until", "2024-05-01T03:30:00Z"], spark=spark) == 0
        shown = json.loads(capsys.readouterr().out)["events"]
        assert sorted((e["run_id"], e["updated_at"]) for e in shown) == [("aware", "2024-05-01T03:30:00Z"),
                                                                         ("naive", "2024-05-01T03:30:00Z")]
        at = datetime(2024, 5, 1, 3, 30, tzinfo=timezone.utc)
        assert stored_instants(spark, path, "run_id IS NOT NULL") == [at, at]


@pytest.mark.parametrize("engine", ["spark", "delta-rs"])
def test_runs_rows_hold_the_instant_of_the_attempt(spark, tmp_path, engine):
    """runs/'s ``started_at`` and ``ended_at`` (``dpspark.attempt.now``) are the same instants for a
    reader in another zone."""
    runs = str(tmp_path / "runs")
    with in_zone(spark, WRITER, WRITER):
        before = datetime.now(timezone.utc)
        record = {name: None for name in tables.RUNS_COLUMNS}
        record.update(run_id="day-1", attempt=1, status="running", started_at=attempt_now())
        with spark_only() if engine == "spark" else contextlib.nullcontext():
            tables.write_run_record(spark, runs, record, new=True)
            tables.write_run_record(spark, runs, {**record, "status": "succeeded", "ended_at": attempt_now()})
        after = datetime.now(timezone.utc)
    with in_zone(spark, READER, READER):
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        (row,) = spark.read.format("delta").load(runs).selectExpr(
            "unix_micros(started_at) AS s", "unix_micros(ended_at) AS e").collect()
        got = [epoch + timedelta(microseconds=row["s"]), epoch + timedelta(microseconds=row["e"])]
        assert within(got, before, after), (got, before, after)
