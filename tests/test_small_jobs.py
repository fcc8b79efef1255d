"""Small jobs without a fixed tax (issue 15, item 3): the input's version and id from ONE snapshot
(no Spark job), a charged run's ledger events in few commits (the deferred ``started``), a new ledger
created with its first balance in one commit, the retry-only ledger read, and the Delta JARs
without the copies of Spark's own. The guarantees are the same as before: the tests check them too."""

from __future__ import annotations

import threading

import pytest

from dpspark import localdelta, session, tables
from dpspark.cli import main
from dpspark.errors import BudgetRefused
from dpspark.privacy.ledger import Ledger
from dpspark.runner import RUNNING_ROW_STEP

from test_pipeline import make_config, points_frame, set_budget


def _jobs(spark, fn):
    """(fn's result, the Spark jobs it ran)."""
    sc = spark.sparkContext
    group = f"small-jobs-{id(fn)}"
    sc.setJobGroup(group, group)
    try:
        result = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def _ledger_versions(spark, path) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).first()["version"]) + 1


def test_one_snapshot_gives_the_latest_version_and_the_table_id_without_a_spark_job(spark, tmp_path, write_delta):
    from delta.tables import DeltaTable

    path = write_delta(points_frame(20))
    spark.createDataFrame(points_frame(5)).write.format("delta").mode("append").save(path)
    found, jobs = _jobs(spark, lambda: tables.delta_snapshot(spark, path))
    table = DeltaTable.forPath(spark, path)
    assert found == (1, table.detail().first()["id"]) and table.history(1).first()["version"] == 1
    assert jobs == 0
    # Every spelling of the path is one table (the key is the id in its metadata).
    assert tables.ledger_key_of(spark, "file://" + path + "/") == tables.ledger_key_of(spark, path) == f"delta-table:{found[1]}"
    # Not a Delta table: None (a Parquet directory, an empty one); reading it as Delta is refused.
    parquet = str(tmp_path / "plain")
    spark.createDataFrame(points_frame(5)).write.parquet(parquet)
    (tmp_path / "empty").mkdir()
    assert tables.delta_snapshot(spark, parquet) is None and tables.delta_snapshot(spark, str(tmp_path / "empty")) is None
    with pytest.raises(tables.SchemaError, match="not a Delta table"):
        tables.load_table(spark, parquet, "delta")
    with pytest.raises(tables.SchemaError, match="is a Delta table"):
        tables.load_table(spark, path, "parquet")


def test_the_input_is_read_at_the_snapshots_version_even_if_the_table_moves_on(spark, tmp_path, write_delta, monkeypatch):
    """The version recorded (and charged for) is the version read: a commit after the snapshot is not read."""
    path = write_delta(points_frame(20))  # 60 rows, version 0
    real = tables.delta_snapshot

    def snapshot_then_a_commit(spark_, p):
        found = real(spark_, p)
        spark.createDataFrame(points_frame(5)).write.format("delta").mode("append").save(path)  # version 1
        return found

    monkeypatch.setattr(tables, "delta_snapshot", snapshot_then_a_commit)
    cfg = type("Input", (), {"path": path, "format": "delta", "version": None, "timestamp": None, "where": None,
                             "features": ("x", "y"), "privacy_unit": None, "table": None})()
    table = tables.load_input(spark, cfg)
    assert table.version == 0 and table.df.count() == 60
    monkeypatch.setattr(tables, "delta_snapshot", real)
    assert tables.load_input(spark, cfg).version == 1
    with pytest.raises(tables.SchemaError, match="latest version"):
        tables.load_input(spark, cfg, version=5)


def test_a_new_ledger_is_created_with_its_first_balance_in_one_commit(spark, tmp_path):
    path = str(tmp_path / "ledger")
    totals = Ledger(spark, path).set_budget("file:/data/people", 2.0, 1e-6, input_seen="/data/people", note="q3")
    assert (totals.spent_epsilon, totals.ledger_cap_epsilon, totals.ledger_cap_delta) == (0.0, 2.0, 1e-6)
    assert _ledger_versions(spark, path) == 1
    ledger = Ledger(spark, path)
    assert ledger.totals("file:/data/people").ledger_cap_epsilon == 2.0
    assert [(e["status"], e["cap_epsilon"], e["note"]) for e in ledger.events()] == [("set-budget", 2.0, "q3")]
    # On an existing ledger: one MERGE sets the cap and inserts the event.
    ledger.set_budget("file:/data/people", 3.0, 1e-6)
    assert _ledger_versions(spark, path) == 2
    assert [(b["cap_epsilon"], b["spent_epsilon"]) for b in ledger.balances()] == [(3.0, 0.0)]
    assert [e["cap_epsilon"] for e in ledger.events()] == [2.0, 3.0]


def test_two_administrators_creating_one_ledger_at_once_leave_one_balance(spark, tmp_path):
    path = str(tmp_path / "ledger")
    Ledger(spark, str(tmp_path / "warm")).set_budget("/warm", 1.0, 0.0)
    barrier = threading.Barrier(2)
    errors = []

    def go(cap):
        barrier.wait()
        try:
            Ledger(spark, path).set_budget("/data/people", cap, 0.0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(cap,)) for cap in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ledger = Ledger(spark, path)
    balances = ledger.balances()
    assert len(balances) == 1 and balances[0]["cap_epsilon"] in (1.0, 2.0)
    assert sorted(e["cap_epsilon"] for e in ledger.events()) == [1.0, 2.0]


def test_a_deferred_event_is_written_with_the_next_one_and_kept_if_that_write_fails(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "ledger")
    ledger = Ledger(spark, path)
    ledger.set_budget("/in", 2.0, 0.0)
    before = _ledger_versions(spark, path)
    ledger.mark("/in", "r1", "started", attempt=1, defer=True)
    assert ledger.pending == 1 and Ledger(spark, path).runs() == []  # not written yet
    real, real_append = Ledger._write_rows, localdelta.append_rows

    def disk_full(self, rows, mode="append"):
        raise OSError("disk full")

    monkeypatch.setattr(Ledger, "_write_rows", disk_full)  # Spark's append ...
    monkeypatch.setattr(localdelta, "append_rows", lambda *a, **k: disk_full(None, a))  # ... and delta-rs's
    with pytest.raises(OSError):
        ledger.mark("/in", "r1", "failed", attempt=1)
    monkeypatch.setattr(Ledger, "_write_rows", real)
    monkeypatch.setattr(localdelta, "append_rows", real_append)
    assert ledger.pending == 1  # the deferred event waits for the next write; the failed one is lost
    ledger.charge("/in", "r1", "dplloyd", 1.0, 0.0, attempt=1)
    assert [e["status"] for e in ledger.runs("/in")] == ["started", "charged"]
    assert _ledger_versions(spark, path) == before + 2  # the UPDATE, then one append of both events
    assert ledger.pending == 0


def test_a_charged_run_writes_its_ledger_events_in_three_commits(spark, tmp_path, write_delta, monkeypatch):
    """set-budget: 1 commit on a new ledger; the run: the UPDATE, [started, charged, fit_started]
    (before the fit reads anything), [succeeded]. A first attempt does not read the ledger's event
    log; its operator record times every step."""
    from dpspark.dplloyd.estimator import DPLloyd

    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=3.0)
    assert _ledger_versions(spark, ledger_path) == 1
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False})
    seen = {}
    original = DPLloyd.fit

    def spy(self, df, timings=None, operational=None):  # what the ledger holds when the fit starts
        seen["events"] = [e["status"] for e in Ledger(spark, ledger_path).runs(key)]
        return original(self, df, timings, operational)

    monkeypatch.setattr(DPLloyd, "fit", spy)
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))  # the timings are kept there
    assert main(["run", "--config", cfg, "--run-id", "small"], spark=spark) == 0
    assert seen["events"] == ["started", "charged", "fit_started"]
    assert _ledger_versions(spark, ledger_path) == 4
    ledger = Ledger(spark, ledger_path)
    events = [(e["run_id"], e["attempt"], e["status"], e["epsilon"]) for e in ledger.runs(key)]
    assert events == [("small", 1, "started", 0.0), ("small", 1, "charged", 1.0), ("small", 1, "fit_started", 0.0),
                      ("small", 1, "succeeded", 0.0)]
    times = [e["updated_at"] for e in ledger.runs(key)]
    assert times == sorted(times) and len(set(times)) == 4
    from dpspark.runner import read_operator_record

    steps = read_operator_record(spark, "small", 1)["timings"]
    assert "privacy ledger: earlier attempts" not in steps  # a first attempt: nothing to take over
    for name in (RUNNING_ROW_STEP, "read input table (schema and version)", "privacy ledger: charge",
                 "privacy ledger: fit started", "dplloyd: fit", "write centers table"):
        assert name in steps
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)
    # A refused run: [started, refused] in one append (the UPDATE that did not charge wrote no commit).
    cfg2, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False,
                                             "privacy.epsilon": 2.5, "output.path": str(tmp_path / "out2")})
    assert main(["run", "--config", cfg2, "--run-id", "big"], spark=spark) == 3
    assert _ledger_versions(spark, ledger_path) == 5  # an UPDATE that charges nothing commits nothing
    assert [e["status"] for e in ledger.runs(key) if e["run_id"] == "big"] == ["started", "refused"]


def test_the_run_record_keeps_steps_timed_before_the_runner(spark, tmp_path, write_delta, monkeypatch):
    from dpspark.config import load_config
    from dpspark.runner import read_operator_record, run

    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))
    path = write_delta(points_frame(20))
    cfg, c = make_config(tmp_path, path, **{"output.report": False})
    result = run(load_config(cfg, []), spark, run_id="timed", timings={"start Spark session": 1.25})
    assert result.status == "succeeded"
    steps = read_operator_record(spark, "timed", 1)["timings"]
    assert list(steps)[0] == "start Spark session" and steps["start Spark session"] == 1.25


def test_delta_jars_leave_out_the_artifacts_spark_ships(tmp_path, monkeypatch):
    jars = tmp_path / "jars"
    jars.mkdir()
    names = ["io.delta_delta-spark_4.2_2.13-4.4.0.jar", "io.delta_delta-storage-4.4.0.jar",
             "org.apache.hadoop_hadoop-client-api-3.4.2.jar", "com.fasterxml.jackson.core_jackson-core-2.13.5.jar",
             "commons-pool_commons-pool-1.6.jar", "io.unitycatalog_unitycatalog-client-0.6.0.jar"]
    for name in names:
        (jars / name).write_bytes(b"")
    monkeypatch.setenv("DPSPARK_IVY_DIR", str(tmp_path))
    monkeypatch.setattr(session, "_spark_artifacts", lambda: {"hadoop-client-api", "jackson-core", "commons-pool",
                                                              "spark-core_2.13", "delta-storage"})
    kept = sorted(p.rsplit("/", 1)[-1] for p in session.cached_delta_jars())
    # Delta's own JARs always; an artifact Spark ships in another version never; anything else kept.
    assert kept == ["io.delta_delta-spark_4.2_2.13-4.4.0.jar", "io.delta_delta-storage-4.4.0.jar",
                    "io.unitycatalog_unitycatalog-client-0.6.0.jar"]
    assert session._artifact("org.apache.hadoop_hadoop-client-api-3.4.2.jar", ivy=True) == "hadoop-client-api"
    assert session._artifact("com.github.luben_zstd-jni-1.5.7-3.jar", ivy=True) == "zstd-jni"
    assert session._artifact("jackson-module-scala_2.13-2.21.2.jar") == "jackson-module-scala_2.13"
    assert session._artifact("io.delta_delta-spark_4.2_2.13-4.4.0.jar", ivy=True) == "delta-spark_4.2_2.13"
    # Not fetched yet (no delta-spark JAR): nothing, so the session fetches them.
    (jars / names[0]).unlink()
    assert session.cached_delta_jars() == []


def test_small_job_jvm_options_only_for_small_local_inputs(tmp_path, monkeypatch):
    table = tmp_path / "t"
    (table / "_delta_log").mkdir(parents=True)
    (table / "part-0.parquet").write_bytes(b"x" * 1000)
    (table / "_delta_log" / "00000000000000000000.json").write_bytes(b"{}")
    assert session.small_input(str(table)) and session.small_input("file://" + str(table))
    assert not session.small_input(str(table), limit=500)  # over the limit
    assert not session.small_input(str(table), max_entries=2)  # too many entries to count
    assert not session.small_input("s3a://bucket/t") and not session.small_input(str(tmp_path / "missing"))
    monkeypatch.delenv("DPSPARK_SMALL_JOB", raising=False)
    monkeypatch.setattr(session, "_defaults_set_java_options", lambda: False)
    assert session._small_job_options(True, {}) == session.SMALL_JOB_JAVA_OPTIONS
    assert session._small_job_options(False, {}) is None
    assert session._small_job_options(True, {"spark.driver.extraJavaOptions": "-Xss4m"}) is None  # the user's own
    monkeypatch.setenv("DPSPARK_SMALL_JOB", "0")
    assert session._small_job_options(True, {}) is None
    monkeypatch.setenv("DPSPARK_SMALL_JOB", "1")
    assert session._small_job_options(False, {}) == session.SMALL_JOB_JAVA_OPTIONS
    monkeypatch.setattr(session, "_defaults_set_java_options", lambda: True)  # spark-defaults.conf sets them
    assert session._small_job_options(True, {}) is None


def test_a_report_that_fails_to_draw_fails_the_run_and_releases_nothing(spark, tmp_path, write_delta, monkeypatch):
    """The report is drawn in a thread while the centers are written: its error still fails the run."""
    import os

    import dpspark.report

    def broken(path, info):
        raise RuntimeError("no font")

    path = write_delta(points_frame(20))
    cfg, c = make_config(tmp_path, path, **{"output.report": True})
    monkeypatch.setattr(dpspark.report, "write_report", broken)
    assert main(["run", "--config", cfg, "--run-id", "drawn"], spark=spark) == 1
    out = c["output"]["path"]
    assert not os.path.exists(os.path.join(out, "summary.json")) and not os.path.exists(os.path.join(out, "report.png"))
    assert spark.read.format("delta").load(out + "/centers").where("run_id = 'drawn'").count() == 0
    assert spark.read.format("delta").load(out + "/runs").first().status == "failed"


def test_the_charge_update_names_its_ledger_whatever_the_path_holds(spark, tmp_path):
    """The UPDATE is SQL: a ledger path with a backquote or a quote still names that ledger, and only it."""
    odd = tmp_path / "led`ger's"
    plain = tmp_path / "led"  # what a broken quoting could fall back to
    ledger, other = Ledger(spark, str(odd)), Ledger(spark, str(plain))
    ledger.set_budget("/in", 1.5, 0.0)
    other.set_budget("/in", 9.0, 0.0)
    ledger.charge("/in", "r1", "dplloyd", 1.0, 0.0)
    with pytest.raises(BudgetRefused):
        ledger.charge("/in", "r2", "dplloyd", 1.0, 0.0)
    assert ledger.totals("/in").spent_epsilon == pytest.approx(1.0) and other.totals("/in").spent_epsilon == 0.0
    assert [e["status"] for e in ledger.runs("/in")] == ["charged", "refused"]


def test_a_signal_inside_a_py4j_call_does_not_shift_the_later_answers(spark):
    """RunKilled raised while a py4j call waits for its answer leaves that answer on the connection;
    the runner closes the connection of a killed attempt so the calls that record it get their own."""
    import signal

    from dpspark.errors import RunKilled
    from dpspark.session import reset_py4j_connection

    client = spark.sparkContext._gateway._gateway_client
    # PySpark 4 runs py4j in pinned-thread mode (one connection per thread): the case the reset is for
    assert hasattr(client, "get_thread_connection"), "py4j is not in pinned-thread mode"
    items = spark._jvm.java.util.ArrayList()  # a JavaObject: its method calls are one command each
    assert items.add("a") is True  # this thread has its connection
    connection = client.get_thread_connection()

    class Interrupted:  # the stream's first readline is interrupted by the signal
        def __init__(self, stream):
            self.stream, self.fired = stream, False

        def readline(self, *args):
            if not self.fired:
                self.fired = True
                raise RunKilled(signal.SIGTERM)
            return self.stream.readline(*args)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    connection.stream = Interrupted(connection.stream)
    try:
        with pytest.raises(RunKilled):
            items.size()  # its answer (1) stays unread
        # what every later call would get: the answer of the call before. The shifted call reads
        # and writes nothing: the old connection's JVM thread may still be running it after the
        # reset, and a write there (an add) would race the checks below.
        assert items.contains("a") == 1
    finally:
        reset_py4j_connection(spark)
    assert items.size() == 1 and items.add("c") is True and items.size() == 2


def test_the_kill_signal_resets_the_connection_before_any_finally_runs(spark):
    """SIGTERM lands inside a py4j call; the family's ``finally`` (an unpersist) runs py4j calls
    while RunKilled unwinds, before the runner can reset anything. The handler closes the
    thread's connection first, so those calls get their own answers (once, a KeyError 'm' from an
    unpersist turned a kill into a failure: exit 1 instead of 143)."""
    import signal

    from dpspark.cli import _signals_stop_the_run
    from dpspark.errors import RunKilled

    client = spark.sparkContext._gateway._gateway_client
    assert hasattr(client, "get_thread_connection"), "py4j is not in pinned-thread mode"
    items = spark._jvm.java.util.ArrayList()
    assert items.add("a") is True
    seen = {}
    with _signals_stop_the_run():
        handler = signal.getsignal(signal.SIGTERM)
        connection = client.get_thread_connection()

        class Signalled:  # the signal arrives while the call waits for its answer
            def __init__(self, stream):
                self.stream, self.fired = stream, False

            def readline(self, *args):
                if not self.fired:
                    self.fired = True
                    handler(signal.SIGTERM, None)
                return self.stream.readline(*args)

            def __getattr__(self, name):
                return getattr(self.stream, name)

        connection.stream = Signalled(connection.stream)
        with pytest.raises(RunKilled):
            try:
                items.size()  # interrupted: its answer (1) is never read
            finally:
                seen["in_finally"] = items.add("b")  # what an unpersist in a finally would do
    assert seen["in_finally"] is True  # its own answer, not the interrupted call's 1
    assert items.size() == 2


def _running_row_writer(monkeypatch, before_running):
    """tables.write_run_record with ``before_running(record)`` called first for a ``running`` row."""
    real = tables.write_run_record

    def write(spark_, path, record, **kwargs):
        if record["status"] == "running":
            before_running(record)
        return real(spark_, path, record, **kwargs)

    monkeypatch.setattr(tables, "write_run_record", write)


def test_the_running_row_is_written_while_the_input_is_read_and_the_fit_runs(spark, tmp_path, write_delta, monkeypatch):
    """Without a ledger the fit does not wait for the ``running`` row (a cold Delta commit); the
    outputs do, and the attempt's last row is written over it."""
    from dpspark.dplloyd.estimator import DPLloyd

    path = write_delta(points_frame(20))
    cfg, c = make_config(tmp_path, path, **{"output.report": False})
    fit_began, seen = threading.Event(), {}
    _running_row_writer(monkeypatch, lambda record: seen.setdefault("fit_first", fit_began.wait(20)))
    original = DPLloyd.fit

    def spy(self, df, timings=None, operational=None):
        fit_began.set()
        return original(self, df, timings, operational)

    monkeypatch.setattr(DPLloyd, "fit", spy)
    assert main(["run", "--config", cfg, "--run-id", "overlap"], spark=spark) == 0
    assert seen["fit_first"] is True  # the row waited for the fit to begin: they overlapped
    runs = spark.read.format("delta").load(c["output"]["path"] + "/runs").collect()
    assert [(r.attempt, r.status) for r in runs] == [(1, "succeeded")]


def test_with_a_ledger_the_fit_starts_only_after_the_running_row(spark, tmp_path, write_delta, monkeypatch):
    """With a ledger the row overlaps the charge, and is settled before ``fit_started``: the row is
    held back until the charge is written, and is still in ``runs/`` before ``fit_started``."""
    import time

    path = write_delta(points_frame(20))
    ledger_path = str(tmp_path / "ledger")
    set_budget(spark, ledger_path, path, epsilon=3.0)
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False})
    charged, written, seen = threading.Event(), threading.Event(), {}
    real = tables.write_run_record

    def write(spark_, path_, record, **kwargs):
        if record["status"] == "running":
            charged.wait(30)
            time.sleep(2.0)
        real(spark_, path_, record, **kwargs)
        if record["status"] == "running":
            written.set()

    real_charge, real_mark = Ledger.charge, Ledger.mark

    def charge(self, *args, **kwargs):
        result = real_charge(self, *args, **kwargs)
        charged.set()
        return result

    def mark(self, key, run_id, status, **kwargs):
        if status == "fit_started":
            seen["row_written"] = written.is_set()
        return real_mark(self, key, run_id, status, **kwargs)

    monkeypatch.setattr(tables, "write_run_record", write)
    monkeypatch.setattr(Ledger, "charge", charge)
    monkeypatch.setattr(Ledger, "mark", mark)
    assert main(["run", "--config", cfg, "--run-id", "settled"], spark=spark) == 0
    assert seen["row_written"] is True
    runs = spark.read.format("delta").load(c["output"]["path"] + "/runs").collect()
    assert [(r.attempt, r.status) for r in runs] == [(1, "succeeded")]


def test_a_running_row_that_fails_ends_the_attempt_before_its_fit_and_the_retry_reuses_the_charge(
        spark, tmp_path, write_delta, monkeypatch):
    from dpspark.dplloyd.estimator import DPLloyd

    path = write_delta(points_frame(20))
    ledger_path = str(tmp_path / "ledger")
    key = set_budget(spark, ledger_path, path, epsilon=3.0)
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path, "output.report": False})
    calls = []
    original = DPLloyd.fit

    def spy(self, df, timings=None, operational=None):
        calls.append(1)
        return original(self, df, timings, operational)

    def disk_full(record):
        raise OSError("No space left on device")

    monkeypatch.setattr(DPLloyd, "fit", spy)
    _running_row_writer(monkeypatch, disk_full)
    assert main(["run", "--config", cfg, "--run-id", "full"], spark=spark) == 1
    ledger = Ledger(spark, ledger_path)
    assert calls == [] and [e["status"] for e in ledger.runs(key)] == ["started", "charged", "failed"]
    out = c["output"]["path"]
    import os

    assert not os.path.exists(os.path.join(out, "summary.json")) and not os.path.exists(os.path.join(out, "centers"))
    monkeypatch.undo()
    assert main(["run", "--config", cfg, "--run-id", "full"], spark=spark) == 0
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)  # the failed attempt released nothing
    assert [e["status"] for e in ledger.runs(key)][3:] == ["started", "reused", "fit_started", "succeeded"]


def test_without_a_ledger_a_failed_running_row_releases_nothing(spark, tmp_path, write_delta, monkeypatch):
    import os

    path = write_delta(points_frame(20))
    cfg, c = make_config(tmp_path, path, **{"output.report": True})

    def disk_full(record):
        raise OSError("No space left on device")

    _running_row_writer(monkeypatch, disk_full)
    assert main(["run", "--config", cfg, "--run-id", "norow"], spark=spark) == 1
    out = c["output"]["path"]
    assert not any(os.path.exists(os.path.join(out, name)) for name in ("summary.json", "report.png", "centers"))
    runs = spark.read.format("delta").load(out + "/runs").collect()
    assert [(r.status, r.fit_started) for r in runs] == [("failed", True)] and runs[0].error.startswith("OSError")


def test_the_python_workers_are_started_once_per_local_session_by_a_job_over_public_rows(spark, monkeypatch):
    from dpspark import runner

    sc = spark.sparkContext
    monkeypatch.setattr(sc, "_dpspark_warmed", False, raising=False)
    before = len(sc.statusTracker().getJobIdsForGroup(runner.WARM_UP_GROUP))
    thread = runner._warm_python_workers(spark)
    thread.join(120)
    assert len(sc.statusTracker().getJobIdsForGroup(runner.WARM_UP_GROUP)) == before + 1
    assert runner._warm_python_workers(spark) is None  # once per session
    monkeypatch.setattr(sc, "_dpspark_warmed", False)
    monkeypatch.setattr(sc, "master", "spark://10.0.0.1:7077")
    assert runner._warm_python_workers(spark) is None  # a cluster's executors start their own
