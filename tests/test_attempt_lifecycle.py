"""The attempt lifecycle (issue 30): dpspark.attempt's states and transitions, walked.

First every transition of ``TRANSITIONS`` is taken by an ``Attempt`` whose ledger and runs/ are
recording fakes (what each step writes, in which commit), every step out of order is refused, and
the reuse of an earlier charge is followed. Then every end an attempt can have (succeeded, awaiting,
refused, failed, invalid_config, and a kill at each state: started, charged, fitting, publishing) is
reached through BOTH faces on Spark, the command line (``dpspark run``) and ``DPClustering.fit``,
and the real ledger, runs/ and outputs are read back.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pandas as pd
import pytest
import yaml

from dpspark import attempt as lifecycle
from dpspark import tables
from dpspark.attempt import ENDS, TRANSITIONS, Attempt, Awaiting, LifecycleError
from dpspark.cli import main
from dpspark.dplloyd.estimator import DPLloyd
from dpspark.errors import BudgetRefused, ConfigError, DPSparkError, PrivacyAccountingError, RunFailed, RunKilled
from dpspark.ml import DPClustering
from dpspark.privacy.ledger import Ledger

PLAN = (1.0, 0.0)
ALL_TRANSITIONS = [(f, t) for f, targets in TRANSITIONS.items() for t in targets]


# ---------------------------------------------------------------------------------------------
# The table, with recording fakes


class FakeLedger:
    """The part of ``dpspark.privacy.ledger.Ledger`` an attempt uses. ``commits``: the statuses of
    each append, in order (deferred events go out with the next one, as in the real ledger)."""

    def __init__(self, refuse: bool = False, history=()):
        self.refuse = refuse
        self.commits: list[list[str]] = []
        self.pending: list[dict] = []
        self.history = [dict(e) for e in history]
        self.claims: list[tuple[int, int]] = []

    def _append(self, rows):
        rows, self.pending = self.pending + rows, []
        self.commits.append([r["status"] for r in rows])
        self.history += rows

    def _event(self, run_id, status, attempt):
        return {"run_id": run_id, "status": status, "attempt": attempt, "epsilon": PLAN[0], "delta": PLAN[1],
                "guarantee": "central"}

    def mark(self, key, run_id, status, *, attempt=None, guarantee=None, note=None, defer=False):
        event = self._event(run_id, status, attempt)
        if defer:
            self.pending.append(event)
        else:
            self._append([event])

    def charge(self, key, run_id, algorithm, epsilon, delta, cap_eps, cap_delta, *, guarantee, attempt,
               input_seen, private, defer):
        assert (epsilon, delta) == PLAN
        if self.refuse:  # the real ledger writes the refusal with the deferred events, then raises
            self._append([self._event(run_id, "refused", attempt)])
            raise BudgetRefused(f"epsilon {epsilon} is over the cap")
        event = self._event(run_id, "charged", attempt)
        if defer:
            self.pending.append(event)
        else:
            self._append([event])
        return "totals"

    def claim_charge(self, key, run_id, charged_attempt, attempt):
        self.claims.append((charged_attempt, attempt))
        return True

    def runs(self, key):
        return list(self.history)

    def totals(self, *args, **kwargs):
        return "totals"

    @property
    def written(self) -> list[str]:
        return [s for commit in self.commits for s in commit]


class FakeRuns:
    """runs/ of the command line: the statuses of the rows written, in order."""

    def __init__(self):
        self.rows: list[str] = []

    def start(self, record, timings):
        self.rows.append(record["status"])

    def settle(self, timings, quiet=False):
        pass

    def write(self, record):
        self.rows.append(record["status"])


@pytest.fixture
def signals(monkeypatch):
    """What a kill does besides recording: Spark jobs cancelled, the py4j connection reset."""
    seen = []
    monkeypatch.setattr(lifecycle, "cancel_jobs", lambda spark: seen.append("cancel_jobs"))
    monkeypatch.setattr(lifecycle, "reset_py4j_connection", lambda spark: seen.append("reset"))
    return seen


def attempt_in(state: str, *, ledgered: bool = True, refuse: bool = False) -> Attempt:
    """An attempt brought to ``state`` along the main path (a ledger unless ``ledgered`` is false)."""
    a = Attempt(None, "r", runs=FakeRuns())
    a.declare(PLAN)
    if ledgered:
        a.ledger = FakeLedger(refuse=refuse)
    path = ["started", "charged", "fitting", "publishing", "succeeded"] if ledgered else \
        ["started", "fitting", "publishing", "succeeded"]
    if state == "new":
        return a
    for reached in path:
        if reached == "started":
            a.begin([])
            a.open_input("key", input_path="t")
        elif reached == "charged":
            a.charge("dplloyd", "t")
        elif reached == "fitting":
            a.start_fit()
        elif reached == "publishing":
            a.cleanup = lambda: a.record.setdefault("cleaned", True)
            a.fitted(*PLAN)
        elif reached == "succeeded":
            a.succeed(lambda: a.record.setdefault("summaries", True))
        if reached == state:
            assert a.state == state
            return a
    raise AssertionError(f"{state} is not on the main path")


def refused(a):
    try:
        a.charge("dplloyd", "t")
    except BudgetRefused as exc:
        return a.end(exc)
    raise AssertionError("the charge was not refused")


# How each transition is taken (the ends by a failure are taken the same way from every state).
STEPS = {
    ("new", "started"): lambda a: a.begin([]),
    ("started", "charged"): lambda a: a.charge("dplloyd", "t"),
    ("started", "fitting"): lambda a: a.start_fit(),  # no ledger: nothing to charge
    ("started", "awaiting"): lambda a: a.end(Awaiting(DPSparkError("round 2 is not in"))),
    ("started", "refused"): refused,
    ("charged", "fitting"): lambda a: a.start_fit(),
    ("fitting", "publishing"): lambda a: a.fitted(*PLAN),
    ("publishing", "succeeded"): lambda a: a.succeed(lambda: a.record.setdefault("summaries", True)),
    "failed": lambda a: a.end(ValueError("a value of the data: 41.7")),
    "invalid_config": lambda a: a.end(ConfigError("algorithm.k", "k=9 is over the rows' public bound")),
    "killed": lambda a: a.end(RunKilled(signal.SIGTERM)),
}

# The ledger events an attempt has written (or deferred) once it is in a state, in order.
LEDGER_SO_FAR = {"new": [], "started": ["started"], "charged": ["started", "charged"],
                 "fitting": ["started", "charged", "fit_started"], "publishing": ["started", "charged", "fit_started"],
                 "succeeded": ["started", "charged", "fit_started", "succeeded"]}


@pytest.mark.parametrize("source,target", ALL_TRANSITIONS, ids=[f"{f}->{t}" for f, t in ALL_TRANSITIONS])
def test_every_transition_of_the_table(source, target, signals):
    """Each (state, next state) of TRANSITIONS: the state reached, the ledger events and their
    commits, the runs/ rows, what a kill cancels, and the cleanup of a failed publication."""
    ledgered = (source, target) != ("started", "fitting")
    a = attempt_in(source, ledgered=ledgered, refuse=target == "refused")
    runs_before = list(a.runs.rows)
    take = STEPS.get((source, target)) or STEPS[target]
    returned = take(a)
    assert a.state == target

    if target in ENDS:
        assert a.record["status"] == target and a.record["ended_at"] is not None
    if target in ("awaiting", "refused", "failed", "invalid_config", "killed"):
        # the end is in runs/ and, once the input is open, in the ledger: after what came before
        assert a.runs.rows == runs_before + [target]
        assert a.ledger.written == LEDGER_SO_FAR[source] + [target]
        assert a.ledger.pending == []
        # the analyst's error: the failure's own text only before the fit started
        if target == "failed":
            assert isinstance(returned, RunFailed if a.fit_started else ValueError)
            assert "41.7" not in a.record["error"] or not a.fit_started
        assert (signals == ["reset", "cancel_jobs"]) == (target == "killed")
        assert a.record.get("cleaned", False) == (source == "publishing")
    elif (source, target) == ("new", "started"):
        assert a.number == 1 and a.runs.rows == ["running"] and a.ledger.written == []
    elif (source, target) == ("started", "charged"):
        # charged is deferred: written with fit_started (or the end), in one commit with started
        assert a.ledger.commits == [] and [e["status"] for e in a.ledger.pending] == ["started", "charged"]
        assert a.record["charged"] is True and a.totals == "totals"
    elif (source, target) == ("started", "fitting"):
        assert a.ledger is None and a.fit_started
    elif (source, target) == ("charged", "fitting"):
        assert a.ledger.commits == [["started", "charged", "fit_started"]] and a.fit_started
    elif (source, target) == ("fitting", "publishing"):
        assert a.ledger.commits == [["started", "charged", "fit_started"]] and a.record["epsilon_spent"] == PLAN[0]
    elif (source, target) == ("publishing", "succeeded"):
        assert a.runs.rows == ["running", "succeeded"] and a.record["summaries"] is True
        assert a.ledger.commits == [["started", "charged", "fit_started"], ["succeeded"]]
        assert "cleaned" not in a.record
    else:  # a transition added to the table must be checked here
        raise AssertionError(f"no check for {source} -> {target}")


# What each step may be called in (with a ledger); every other call is a LifecycleError.
ALLOWED = {"begin": "new", "open_input": "started", "charge": "started", "start_fit": "charged",
           "fitted": "fitting", "succeed": "publishing"}
CALLS = {"begin": lambda a: a.begin([]), "open_input": lambda a: a.open_input("key"),
         "charge": lambda a: a.charge("dplloyd", "t"), "start_fit": lambda a: a.start_fit(),
         "fitted": lambda a: a.fitted(*PLAN), "succeed": lambda a: a.succeed()}


@pytest.mark.parametrize("state", ["new", "started", "charged", "fitting", "publishing", "succeeded", "failed"])
def test_a_step_out_of_order_is_refused_and_writes_nothing(state, signals):
    for name, call in CALLS.items():
        a = attempt_in("fitting" if state == "failed" else state)
        if state == "failed":
            STEPS["failed"](a)
        if ALLOWED[name] == state:
            continue
        commits, runs, pending = list(a.ledger.commits), list(a.runs.rows), len(a.ledger.pending)
        with pytest.raises(LifecycleError):
            call(a)
        assert a.state == state, name
        assert (a.ledger.commits, a.runs.rows, len(a.ledger.pending)) == (commits, runs, pending), name


def test_an_attempt_begins_after_its_plan_and_ends_once(signals):
    a = Attempt(None, "r", runs=FakeRuns())
    with pytest.raises(LifecycleError, match="after its plan"):
        a.begin([])
    # after succeeded nothing is recorded again: an error there is only reported
    a = attempt_in("succeeded")
    commits, rows = list(a.ledger.commits), list(a.runs.rows)
    error = a.end(RunKilled(signal.SIGTERM))
    assert isinstance(error, RunKilled) and a.state == "succeeded"
    assert (a.ledger.commits, a.runs.rows, signals) == (commits, rows, [])
    # before begin (pre-flight) an error records nothing: the attempt has no number yet
    a = attempt_in("new")
    error = a.end(ConfigError("privacy.ledger", "not a Delta location"))
    assert isinstance(error, ConfigError) and a.state == "new" and a.record["status"] == "invalid_config"
    assert (a.ledger.commits, a.runs.rows) == ([], [])


def test_a_fit_that_spent_other_than_its_plan_fails_the_attempt(signals):
    a = attempt_in("fitting")
    with pytest.raises(PrivacyAccountingError, match="declared epsilon=1.0"):
        a.fitted(0.5, 0.0)
    assert a.state == "fitting"
    STEPS["failed"](a)
    assert a.state == "failed" and a.ledger.written == LEDGER_SO_FAR["fitting"] + ["failed"]


def test_an_unused_charge_is_taken_over_once_and_never_after_a_fit_started(signals):
    earlier = [{"run_id": "r", "attempt": 1, "status": s, "epsilon": PLAN[0], "delta": PLAN[1], "guarantee": "central"}
               for s in ("started", "charged", "killed")]
    a = Attempt(None, "r", runs=FakeRuns())
    a.declare(PLAN)
    a.ledger = FakeLedger(history=earlier)
    assert a.begin(earlier) == 2
    a.open_input("key")
    a.charge("dplloyd", "t")
    assert a.ledger.claims == [(1, 2)] and a.record["charge_reused_from"] == 1
    a.start_fit()
    assert a.ledger.commits == [["started", "reused", "fit_started"]]  # no second charge
    # an earlier attempt whose fit started may have released something: its charge is never reused
    fit_started = earlier[:2] + [dict(earlier[0], status="fit_started"), dict(earlier[0], status="killed")]
    assert lifecycle.reusable_charge(FakeLedger(history=fit_started), "key", "r", PLAN, "central") is None
    # nor a charge for another plan
    assert lifecycle.reusable_charge(FakeLedger(history=earlier), "key", "r", (0.5, 0.0), "central") is None


# ---------------------------------------------------------------------------------------------
# Every end through both faces, on Spark


# end -> (the run id's ledger events, charged?)
FACE_ENDS = {
    "succeeded": (["started", "charged", "fit_started", "succeeded"], True),
    "awaiting": (["started", "awaiting"], False),
    "refused": (["started", "refused"], False),
    "failed": (["started", "charged", "fit_started", "failed"], True),
    "invalid_config": (["started", "invalid_config"], False),
    "killed@started": (["started", "killed"], False),
    "killed@charged": (["started", "charged", "killed"], True),
    "killed@fitting": (["started", "charged", "fit_started", "killed"], True),
    "killed@publishing": (["started", "charged", "fit_started", "killed"], True),
}
CAP = 1000.0


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """One Delta table and one ledger for both faces (each case is its own run id on them)."""
    base = tmp_path_factory.mktemp("lifecycle")
    r = np.random.default_rng(3)
    x = np.concatenate([r.normal(c, 3.0, size=(30, 2)) for c in ((20, 20), (80, 30), (50, 80))])
    table = str(base / "t")
    spark.createDataFrame(pd.DataFrame({"x": x[:, 0], "y": x[:, 1]})).coalesce(1).write.format("delta").save(table)
    ledger = Ledger(spark, str(base / "ledger"))
    key = tables.ledger_key_of(spark, table)
    ledger.set_budget(key, CAP, 0.0)
    face = {"table": table, "ledger": ledger, "key": key, "ledger_path": str(base / "ledger")}
    return {"cli": dict(face, out=str(base / "out")), "ml": face}


def _wrap(monkeypatch, cls, name, *, before=None, after=None):
    original = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        if before is not None:
            before()
        value = original(self, *args, **kwargs)
        if after is not None:
            after()
        return value

    monkeypatch.setattr(cls, name, wrapped)


def _kill():
    raise RunKilled(signal.SIGTERM)


def _arrange(end: str, monkeypatch, lake_face, face_name: str):
    """Make the next attempt end as ``end``; returns a function that undoes what the ledger needs."""
    undo = lambda: None  # noqa: E731
    if end == "awaiting":
        def not_in(self, spark):
            raise DPSparkError("round 2 of the reports is not in yet")
        monkeypatch.setattr(DPLloyd, "check_ready", not_in, raising=False)
    elif end == "refused" and face_name == "cli":
        pass  # the run's privacy.budget asks for less than its plan (see the config)
    elif end == "refused":  # DPClustering has no lower request: the cap itself is lowered
        ledger, key = lake_face["ledger"], lake_face["key"]
        ledger.set_budget(key, ledger.totals(key).spent_epsilon + 0.5, 0.0)
        undo = lambda: ledger.set_budget(key, CAP, 0.0)  # noqa: E731
    elif end == "failed":
        def fails(self, df, *args, **kwargs):
            raise ValueError("a value of the data: 41.7")
        monkeypatch.setattr(DPLloyd, "fit", fails)
    elif end == "invalid_config":
        def bad(self, spark, input_key, ledger=None):
            raise ConfigError("algorithm.k", "k=3 is not allowed here")
        monkeypatch.setattr(DPLloyd, "preflight", bad, raising=False)
    elif end == "killed@started":
        _wrap(monkeypatch, Attempt, "open_input", after=_kill)
    elif end == "killed@charged":
        _wrap(monkeypatch, Attempt, "charge", after=_kill)
    elif end == "killed@fitting":
        _wrap(monkeypatch, Attempt, "start_fit", after=_kill)
    elif end == "killed@publishing":
        _wrap(monkeypatch, Attempt, "succeed", before=_kill)  # the command line's outputs are written by then
    return undo


EXPECTED_EXIT = {"succeeded": 0, "awaiting": 1, "refused": 3, "failed": 1, "invalid_config": 2}
EXPECTED_ERROR = {"awaiting": DPSparkError, "refused": BudgetRefused, "failed": RunFailed,
                  "invalid_config": ConfigError}


def _centers_of(spark, out, run_id) -> int:
    if not os.path.isdir(out + "/centers"):
        return 0
    return spark.read.format("delta").load(out + "/centers").where(f"run_id = '{run_id}'").count()


@pytest.mark.parametrize("end", list(FACE_ENDS))
def test_every_end_through_the_command_line(end, spark, lake, monkeypatch, tmp_path, capsys):
    face = lake["cli"]
    ledger, key, out, run_id = face["ledger"], face["key"], face["out"], f"cli-{end.replace('@', '-')}"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "input": {"path": face["table"], "format": "delta", "features": ["x", "y"]},
        "domain": {"lower": [0, 0], "upper": [100, 100]},
        "privacy": {"epsilon": PLAN[0], "delta": PLAN[1], "ledger": face["ledger_path"],
                    **({"budget": {"epsilon": 0.5, "delta": 0.0}} if end == "refused" else {})},
        "algorithm": {"name": "dplloyd", "k": 3, "variant": "average_k", "iterations": 2},
        "output": {"path": out, "report": False}}))
    spent = ledger.totals(key).spent_epsilon
    undo = _arrange(end, monkeypatch, face, "cli")
    try:
        code = main(["run", "--config", str(cfg), "--run-id", run_id, "--json"], spark=spark)
    finally:
        monkeypatch.undo()
        undo()
    events, charged = FACE_ENDS[end]
    status = end.split("@")[0]
    assert code == (143 if status == "killed" else EXPECTED_EXIT[status])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["run_id"], line["status"], line["attempt"]) == (run_id, status, 1)
    assert [e["status"] for e in ledger.runs(key) if e["run_id"] == run_id] == events
    assert ledger.totals(key).spent_epsilon == pytest.approx(spent + (PLAN[0] if charged else 0.0))
    rows = spark.read.format("delta").load(out + "/runs").where(f"run_id = '{run_id}'").collect()
    assert [(r.attempt, r.status, r.charged, r.fit_started) for r in rows] == [
        (1, status, charged, "fit_started" in events)]
    if status == "failed":
        assert "41.7" not in (rows[0].error or "")  # after the fit started: the type only
    # centers and summaries only for a success (a kill while publishing removes what was written)
    assert _centers_of(spark, out, run_id) == (3 if status == "succeeded" else 0)
    assert os.path.exists(f"{out}/summary/{run_id}.json") == (status == "succeeded")


@pytest.mark.parametrize("end", list(FACE_ENDS))
def test_every_end_through_dpclustering_fit(end, spark, lake, monkeypatch):
    face = lake["ml"]
    ledger, key, run_id = face["ledger"], face["key"], f"ml-{end.replace('@', '-')}"
    df = spark.read.format("delta").load(face["table"])
    estimator = DPClustering(k=3, epsilon=PLAN[0], delta=PLAN[1], lower=[0.0, 0.0], upper=[100.0, 100.0],
                             algorithm="dplloyd", variant="average_k", iterations=2, inputCols=["x", "y"],
                             ledgerPath=face["ledger_path"], ledgerInput=face["table"], runId=run_id)
    spent = ledger.totals(key).spent_epsilon
    undo = _arrange(end, monkeypatch, face, "ml")
    status = end.split("@")[0]
    try:
        if status == "succeeded":
            model = estimator.fit(df)
            assert model.summary.runId == run_id and len(model.clusterCenters()) == 3
        else:
            with pytest.raises(RunKilled if status == "killed" else EXPECTED_ERROR[status]) as caught:
                estimator.fit(df)
            if status == "failed":
                assert "41.7" not in str(caught.value) and caught.value.__context__ is None
    finally:
        monkeypatch.undo()
        undo()
    events, charged = FACE_ENDS[end]
    assert [e["status"] for e in ledger.runs(key) if e["run_id"] == run_id] == events
    assert all(e["attempt"] == 1 for e in ledger.runs(key) if e["run_id"] == run_id)
    assert ledger.totals(key).spent_epsilon == pytest.approx(spent + (PLAN[0] if charged else 0.0))
