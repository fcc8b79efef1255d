"""One attempt of one run id: its states, the records each step writes, and what the analyst sees.

The command line (``dpspark.runner.run``) and the Python API (``dpspark.ml.DPClustering.fit``) are
two faces of ONE lifecycle, this module's ``Attempt``. A face says what to do at each step (open the
input, fit, write outputs); the attempt decides what is recorded, charged and shown, in one place.

States and the only transitions ``Attempt`` takes (any other raises ``LifecycleError``):

    from         to              by                                ledger (when there is one)           runs/ (command line)
    -----------  --------------  --------------------------------  -----------------------------------  ---------------------
    new          started         ``begin(earlier)``: its number    nothing yet                          ``running`` row (thread)
    started      (stays)         ``open_input(key)``               ``started`` (deferred: written with  -
                                                                   the attempt's next event)
    started      charged         ``charge(...)``                   the UPDATE of the balance and        -
                                                                   ``charged`` (deferred); or an
                                                                   earlier unused charge claimed and
                                                                   ``reused`` (deferred)
    started      fitting         ``start_fit()`` without a ledger  -                                    -
    charged      fitting         ``start_fit()``                   [started, charged, fit_started]      running row settled
    fitting      publishing      ``fitted(spent)``: spent == plan  -                                    running row settled
    publishing   succeeded       ``succeed(write)``                ``succeeded`` (after runs/)          ``succeeded``, write()
    started      awaiting        ``Awaiting`` (ldp ingest)         [started, awaiting]                  ``awaiting``
    started      refused         ``BudgetRefused`` from charge,    [started, refused] (the ledger's)    ``refused``
                                 or ``refuse_before_reading``
    started,     invalid_config  a ``ConfigError`` (exit 2)        ``invalid_config``                   ``invalid_config``
    charged,     killed          ``RunKilled``, KeyboardInterrupt  ``killed`` (Spark jobs cancelled)    ``killed``
    fitting or   failed          any other exception               ``failed``                           ``failed``, its error
    publishing                                                                                          text (error_text)

Before ``begin`` (pre-flight: locations, the ledger, earlier attempts) an error records nothing: the
attempt has no number yet. A run id that already succeeded makes no attempt at all (the command
line's no-op, exit 0; ``DPClustering`` refuses the ``runId`` before any charge). An error in the
``publishing`` state removes what the attempt wrote (its ``cleanup``) before its end is recorded.
After ``succeeded`` nothing is recorded again (an error there is only reported).

Every end is recorded in the ledger too, once the input is known (its key names the balance), and
that ledger event is written even when the runs/ row fails: the ledger, not runs/, decides about
charges. An attempt that was charged but ended before ``fitting`` never read a private value: the
next attempt of the same run id takes that charge over instead of paying again, once
(``reusable_charge``, decided from the ledger only, and an atomic claim in it).

What the analyst sees: ``execute`` runs the face's body ACCOUNTED when there is a ledger
(``dpspark.progress.accounted``: no data-dependent value in their log), and hands them the error
``dpspark.errors.for_the_analyst`` makes of a failure (after ``fitting`` only dpspark's own errors
keep their text), raised outside the ``except`` block so that it chains nothing. The exact values
(timings, the family's ``operational`` dict, the traceback, every log line) go to the attempt's
OPERATOR RECORD under ``$DPSPARK_OPERATOR_LOG`` (never a config key).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import threading
import time
import traceback
from datetime import datetime, timezone

import numpy as np

from dpspark import __version__, tables
from dpspark.errors import BudgetRefused, DPSparkError, PrivacyAccountingError, RunFailed, RunKilled, for_the_analyst
from dpspark.privacy.ledger import NOT_PRIVATE_NOTE
from dpspark.progress import OPERATOR_LOG_ENV, accounted, capture, detail, log, log_trouble, operator_log, step
from dpspark.session import is_connect, quiet_spark_logs, reset_py4j_connection

ENDS = ("succeeded", "awaiting", "refused", "failed", "invalid_config", "killed")
FAILURES = ("failed", "invalid_config", "killed")
TRANSITIONS = {
    "new": ("started",),
    "started": ("charged", "fitting", "awaiting", "refused", *FAILURES),
    "charged": ("fitting", *FAILURES),
    "fitting": ("publishing", *FAILURES),
    "publishing": ("succeeded", *FAILURES),
}

RUNNING_ROW_STEP = "write runs table (running, in a thread)"
WAIT_RUNNING_ROW_STEP = "wait for the runs table (running)"


class LifecycleError(RuntimeError):
    """A step out of order: a bug in a face of the lifecycle, never a user's mistake."""


class Awaiting(Exception):
    """Raised by a face when an input is not in yet (ldp ingest mode): the attempt ends ``awaiting``,
    nothing charged or released, and the caller gets ``error`` as it is."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _on_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (False for none)."""
    if spark is None:
        return False
    from dpspark.session import is_connect

    return is_connect(spark)


def now():
    """Now as an aware UTC datetime: runs/ stores it as that instant (PySpark and delta-rs alike),
    whatever the writer's time zone (a naive UTC time would be read as the writer's local time)."""
    return datetime.now(timezone.utc)


def end_status(exc: BaseException) -> str:
    """The status an attempt ended by ``exc`` gets in runs/ and the ledger: ``killed`` (a signal),
    ``invalid_config`` (a config mistake found once the table's schema was read: exit 2) or ``failed``."""
    if isinstance(exc, (RunKilled, KeyboardInterrupt)):
        return "killed"
    return "invalid_config" if getattr(exc, "exit_code", None) == 2 else "failed"


def error_text(exc: BaseException, fit_started: bool) -> str:
    """What ``runs/`` and the analyst's log say about a failure. dpspark's own messages name keys
    and public values only; another exception raised once the fit has started may quote a private
    value (e.g. a Spark cast error), so only its type is recorded: the operator log has the rest."""
    if isinstance(exc, (DPSparkError, RunKilled)) or not fit_started:
        return f"{type(exc).__name__}: {exc}"[:4000]
    return f"{type(exc).__name__} during the fit (details in the operator log only: they may quote private values)"


def checked_plan(estimator, config) -> tuple[float, float]:
    """The (epsilon, delta) the family declares it will spend, refused if over the configured budget."""
    plan_eps, plan_delta = estimator.privacy_plan()
    if plan_eps > config.privacy.epsilon * (1 + 1e-12) or plan_delta > config.privacy.delta * (1 + 1e-12):
        raise PrivacyAccountingError(
            f"{config.algorithm.name} would spend epsilon={plan_eps:g}, delta={plan_delta:g}, over the configured "
            f"privacy.epsilon={config.privacy.epsilon:g}, privacy.delta={config.privacy.delta:g}")
    return plan_eps, plan_delta


def next_number(earlier: list[dict]) -> int:
    """One after the latest earlier attempt (each a dict with ``attempt``)."""
    return 1 + max((int(e["attempt"]) for e in earlier if e.get("attempt") is not None), default=0)


def reusable_charge(ledger, input_key: str, run_id: str, plan: tuple, guarantee: str):
    """The attempt whose charge this attempt may take over, or None (see the module docstring).

    Decided from the LEDGER only (``runs/`` lives under a user-writable output path): the latest
    charged attempt of this run id ended (failed, killed or invalid_config, recorded) without a
    ``fit_started`` event, nothing of this run id succeeded, and its charge was for the same
    (epsilon, delta, guarantee). The caller must still win ``Ledger.claim_charge`` (one taker per charge).
    """
    events = [e for e in ledger.runs(input_key) if e["run_id"] == run_id]
    if any(e["status"] == "succeeded" for e in events):
        return None
    charges = [e for e in events if e["status"] == "charged" and e.get("attempt") is not None]
    if not charges:
        return None
    charge = max(charges, key=lambda e: int(e["attempt"]))
    attempt = int(charge["attempt"])
    mine = {e["status"] for e in events if e.get("attempt") == attempt}
    if "fit_started" in mine or not mine & set(FAILURES):
        return None
    same = (math.isclose(charge["epsilon"], plan[0], rel_tol=1e-12)
            and math.isclose(charge["delta"], plan[1], rel_tol=1e-12, abs_tol=1e-300)
            and (charge.get("guarantee") or "central") == guarantee)
    return attempt if same else None


class Attempt:
    """One attempt of ``run_id`` (see the module docstring for its states and records).

    ``runs``: a ``RunsTable`` (the command line's runs/) or None; ``timings``: steps measured before
    (the command line's Spark start). A face then, in pre-flight, ``declare``s the family's plan and
    sets ``ledger`` (a ``dpspark.privacy.ledger.Ledger``; None: unaccounted). ``record`` describes the
    attempt (runs/'s row on the command line), is kept up to date here and goes into the operator record.
    """

    def __init__(self, spark, run_id: str, *, runs=None, timings: dict | None = None):
        self.spark, self.run_id, self.runs = spark, run_id, runs
        self.plan: tuple | None = None
        self.guarantee, self.private = "central", True
        self.ledger = None  # set in pre-flight when the run is accounted
        self.record: dict = {"run_id": run_id, "status": None, "charged": False, "fit_started": False,
                             "charge_reused_from": None}
        self.timings = dict(timings or {})
        self.operational: dict = {}
        self.state = "new"
        self.number: int | None = None
        self.input_key: str | None = None
        self.earlier: list[dict] = []
        self.totals = None  # the ledger's totals read with the charge (they include it)
        self.cleanup = None  # set by a face before it writes outputs: removes them if the attempt fails
        self.error_type = self.traceback = None

    def declare(self, plan: tuple, guarantee: str = "central", private: bool = True) -> None:
        """What the family will spend (``checked_plan``), its guarantee, and whether the randomness is private."""
        self.plan = (float(plan[0]), float(plan[1]))
        self.guarantee, self.private = guarantee, private
        self.record.update(guarantee=guarantee, private=private)

    # -- the transitions ----------------------------------------------------------------------

    def _move(self, to: str) -> None:
        if to not in TRANSITIONS.get(self.state, ()):
            raise LifecycleError(f"run {self.run_id}: an attempt in state {self.state!r} cannot become {to!r}")
        self.state = to
        if to in ENDS:
            self.record.update(status=to, ended_at=now())

    def begin(self, earlier: list[dict], number: int | None = None) -> int:
        """new -> started: this attempt's number (after ``earlier``, the run id's earlier attempts);
        the command line's ``running`` row is written in a thread from here."""
        if self.plan is None:
            raise LifecycleError(f"run {self.run_id}: an attempt begins after its plan is declared")
        self._move("started")
        self.earlier = list(earlier)
        self.number = number if number is not None else next_number(earlier)
        self.record.update(attempt=self.number, status="running")
        if self.runs is not None:
            self.runs.start(dict(self.record), self.timings)
        return self.number

    def open_input(self, input_key: str, **described) -> None:
        """The input is known (no private value read): its ledger key names the balance. The ledger's
        ``started`` event is timed now and written with this attempt's next ledger event."""
        self._require("started")
        self.input_key = input_key
        self.record.update(input_key=input_key, **described)
        if self.ledger is not None:
            self.ledger.mark(input_key, self.run_id, "started", attempt=self.number, guarantee=self.guarantee,
                             note=None if self.private else NOT_PRIVATE_NOTE, defer=True)

    def charge(self, algorithm: str, input_seen: str, budget=None):
        """started -> charged: take over an earlier attempt's unused charge (claimed in the ledger) or
        charge ``plan`` (one UPDATE; ``BudgetRefused`` ends the attempt ``refused``). Returns the
        ledger's totals, which include this charge."""
        self._require("started")
        ledger, key = self.ledger, self.input_key
        if ledger is None or key is None:
            raise LifecycleError(f"run {self.run_id}: a charge needs a ledger and an opened input")
        cap_eps = budget.epsilon if budget is not None else None
        cap_delta = budget.delta if budget is not None else None
        reuse = None
        if self.earlier:  # a first attempt has no earlier charge to take over
            with step("privacy ledger: earlier attempts", self.timings):
                reuse = reusable_charge(ledger, key, self.run_id, self.plan, self.guarantee)
                if reuse is not None and not ledger.claim_charge(key, self.run_id, reuse, self.number):
                    reuse = None  # another attempt took it over first: charge as usual
        with step("privacy ledger: charge", self.timings):
            if reuse is not None:
                ledger.mark(key, self.run_id, "reused", attempt=self.number, guarantee=self.guarantee, defer=True,
                            note=f"reuses the charge of attempt {reuse}, which ended before its fit started")
                self.totals = ledger.totals(key, cap_eps, cap_delta, guarantee=self.guarantee)
                self.record["charge_reused_from"] = reuse
                log.info("attempt %d reuses the charge of attempt %d (it released nothing)", self.number, reuse)
            else:  # ``charged`` is written with ``fit_started`` (or the end), in one commit
                self.totals = ledger.charge(key, self.run_id, algorithm, *self.plan, cap_eps, cap_delta,
                                            guarantee=self.guarantee, attempt=self.number, input_seen=input_seen,
                                            private=self.private, defer=True)
        # The charge is written; from here on the budget stays spent whatever happens.
        self._move("charged")
        self.record.update(charged=True, epsilon_spent=self.plan[0], delta_spent=self.plan[1])
        return self.totals

    def refuse_before_reading(self, input_key: str, algorithm: str, input_seen: str, budget=None, **described) -> None:
        """started -> refused, before the face reads the input, when the ledger ALREADY refuses the
        charge (``Ledger.refuses``: a local ledger's latest version read by delta-rs; a refusal read
        from a snapshot is final). Raises ``BudgetRefused`` as ``charge`` would (the input opened as
        ``open_input(input_key, **described)``, the same events); returns when the charge may pass or
        only the charge can tell, and then nothing was recorded: also when an earlier attempt's charge
        can be taken over (``reusable_charge``, as ``charge`` decides it)."""
        self._require("started")
        if self.ledger is None:
            return
        cap_eps = budget.epsilon if budget is not None else None
        cap_delta = budget.delta if budget is not None else None
        with step("privacy ledger: refusal check", self.timings):
            totals = self.ledger.refuses(input_key, *self.plan, cap_eps, cap_delta, guarantee=self.guarantee)
            if totals is not None and self.earlier and reusable_charge(self.ledger, input_key, self.run_id, self.plan,
                                                                       self.guarantee) is not None:
                totals = None  # ``charge`` takes over the earlier attempt's charge instead
        if totals is None:
            return
        self.open_input(input_key, **described)
        with step("privacy ledger: charge", self.timings):
            self.ledger.refuse(totals, input_key, self.run_id, algorithm, *self.plan, guarantee=self.guarantee,
                               attempt=self.number, input_seen=input_seen, private=self.private)

    def start_fit(self) -> None:
        """-> fitting: the first read of a private value. With a ledger the attempt's events so far
        and ``fit_started`` are written first (its charge can then never be taken over), and the
        runs/ row before that (an attempt whose row failed ends here and its charge stays reusable)."""
        if self.ledger is not None:
            self._require("charged")
            self._settle_runs()
            with step("privacy ledger: fit started", self.timings):
                self.ledger.mark(self.input_key, self.run_id, "fit_started", attempt=self.number,
                                 guarantee=self.guarantee)
        self._move("fitting")
        self.record["fit_started"] = True

    def fitted(self, epsilon_spent: float, delta_spent: float) -> None:
        """fitting -> publishing: the fit's own accountant must have spent exactly the plan. A face
        sets ``cleanup`` before it writes outputs: called if the attempt fails before ``succeed``."""
        self._require("fitting")
        if not (math.isclose(epsilon_spent, self.plan[0], rel_tol=1e-9, abs_tol=1e-12)
                and math.isclose(delta_spent, self.plan[1], rel_tol=1e-9, abs_tol=1e-15)):
            raise PrivacyAccountingError(
                f"{self.record.get('algorithm')} declared epsilon={self.plan[0]!r}, delta={self.plan[1]!r} but "
                f"charged epsilon={epsilon_spent!r}, delta={delta_spent!r}")
        self.record.update(epsilon_spent=epsilon_spent, delta_spent=delta_spent)
        self._settle_runs()
        self._move("publishing")

    def succeed(self, write=None, label: str = "write runs table and summary.json", note: str | None = None) -> None:
        """publishing -> succeeded: the runs/ row, then ``write()`` (the summaries), then the ledger's
        ``succeeded`` (a failure before it still removes what was written and records ``failed``).
        ``note``: public text the ledger keeps with the event (e.g. the domain estimate's share)."""
        self._require("publishing")
        self.record.update(status="succeeded", ended_at=now())
        if self.runs is not None or write is not None:
            with step(label, self.timings):
                if self.runs is not None:
                    self.runs.write(self.record)
                if write is not None:
                    write()
        self._move("succeeded")
        if self.ledger is not None:
            with step("privacy ledger: end", self.timings):
                self.ledger.mark(self.input_key, self.run_id, "succeeded", attempt=self.number,
                                 guarantee=self.guarantee, note=note)

    def _require(self, state: str) -> None:
        if self.state != state:
            raise LifecycleError(f"run {self.run_id}: this step needs state {state!r}, the attempt is {self.state!r}")

    def _settle_runs(self, quiet: bool = False) -> None:
        if self.runs is not None:
            self.runs.settle(self.timings, quiet=quiet)

    # -- the end of a failed attempt --------------------------------------------------------

    @property
    def fit_started(self) -> bool:
        return bool(self.record.get("fit_started"))

    def end(self, exc: BaseException) -> BaseException:
        """Record how ``exc`` ended this attempt (see the table) and return the analyst's error."""
        error = exc.error if isinstance(exc, Awaiting) else exc
        self.error_type = type(error).__name__
        self.traceback = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        if self.state in TRANSITIONS and self.number is not None:
            try:
                self._record_failure(exc, error)
            except Exception:  # recording the failure must not hide the failure
                log_trouble("could not record the end of run %s", self.run_id)
        elif self.state == "new":
            self.record["status"] = end_status(error)  # nothing recorded: the operator record's status only
        failure = for_the_analyst(error, self.fit_started, _on_connect(self.spark))
        if self.state in ENDS:
            failure.attempt_status = self.state  # how the attempt ended: the command line's --json status
        if isinstance(failure, RunFailed) and operator_log_dir() is None:
            log.error("the details of this failure were not kept: $%s is not set (or attach a handler to the "
                      "'dpspark.operator' logger)", OPERATOR_LOG_ENV)
        return failure

    def _record_failure(self, exc: BaseException, error: BaseException) -> None:
        if isinstance(exc, Awaiting) and self.state == "started":
            status = "awaiting"
        elif isinstance(error, BudgetRefused) and self.state == "started":
            status = "refused"
        else:
            status = end_status(error)
        if status in FAILURES:
            text = error_text(error, self.fit_started)
            log.error("run %s attempt %d %s: %s", self.run_id, self.number, status, text)
            operator_log.error("run %s attempt %d %s", self.run_id, self.number, status, exc_info=error)
        if status == "killed":
            reset_py4j_connection(self.spark)  # the interrupted call's answer is still unread
            cancel_jobs(self.spark)  # the running row's write too, if it is still under way
        self._settle_runs(quiet=True)  # the thread's row lands (or fails) before the end is written over it
        if self.state == "publishing" and self.cleanup is not None:
            try:
                self.cleanup()
            except Exception:
                log_trouble("cleanup after a failed run left something behind")
        self._move(status)
        self.record["error"] = error_text(error, self.fit_started) if status in FAILURES else str(error)[:4000]
        try:
            if self.runs is not None:
                self.runs.write(self.record)
        finally:
            # the ledger's end even if runs/ failed; the ledger wrote a refusal itself; an attempt
            # that never opened its input has no ledger events
            if self.ledger is not None and self.input_key is not None and status != "refused":
                self.ledger.mark(self.input_key, self.run_id, status, attempt=self.number, guarantee=self.guarantee)

    # -- the whole attempt ------------------------------------------------------------------

    def execute(self, body, *, ledgered: bool, what: str = "run"):
        """``body(self)`` as this attempt: accounted with a ledger, every dpspark line captured for the
        operator record (written at the end, whatever happens), and an error handed to the caller as
        ``end`` makes it, raised here outside any ``except`` block (it chains nothing)."""
        failure = None
        with accounted(ledgered), capture() as lines, quiet_spark_logs(self.spark, ledgered) as spark_log:
            if ledgered and operator_log_dir() is None:
                log.warning("$%s is not set: this %s's operational data (timings, pass counts, error details) is "
                            "not kept anywhere", OPERATOR_LOG_ENV, what)
            try:
                return body(self)
            except BaseException as exc:
                if isinstance(exc, (RunKilled, KeyboardInterrupt)) and spark_log is not None:
                    spark_log.restore = False  # the process ends; its cancelled tasks' Spark lines stay off
                failure = self.end(exc)
            finally:
                self.keep_operator_record(lines)
        raise failure

    def operator_payload(self, lines: list) -> dict:
        record = self.record
        status = record.get("status")
        if self.error_type and status in (None, "running"):
            status = "failed"  # an error before the attempt recorded its end
        return {
            "run_id": self.run_id, "attempt": self.number, "status": status,
            "algorithm": record.get("algorithm"), "input_path": record.get("input_path"),
            "input_key": record.get("input_key"), "input_version": record.get("input_version"),
            "started_at": record.get("started_at"), "ended_at": record.get("ended_at"),
            "epsilon_spent": record.get("epsilon_spent"), "delta_spent": record.get("delta_spent"),
            "charged": record.get("charged"), "fit_started": record.get("fit_started"),
            "charge_reused_from": record.get("charge_reused_from"), "private": record.get("private"),
            "label": "NON-PRIVATE operational metadata: exact values computed from the data",
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "operational": self.operational,
            "error_type": self.error_type, "traceback": self.traceback,
            "log": list(lines), "dpspark_version": __version__,
        }

    def keep_operator_record(self, lines: list) -> None:
        """Write the attempt's operator record, if it has a number; never fails the run."""
        if self.number is None or operator_log_dir() is None:
            return
        try:
            path = write_operator_record(self.spark, self.run_id, self.number, self.operator_payload(lines))
            operator_log.info("operator record of run %s attempt %s: %s", self.run_id, self.number, path)
        except Exception as exc:
            log.error("could not write the operator record of run %s attempt %s (%s)", self.run_id, self.number,
                      type(exc).__name__)
            operator_log.error("could not write the operator record", exc_info=True)


def cancel_jobs(spark) -> None:
    """Stop the Spark work of a killed run: the SparkContext's jobs, or on Spark Connect every request
    of this session under way (``interruptAll``; how many, in the operator record). Never raises."""
    try:
        if is_connect(spark):
            interrupted = spark.interruptAll()
            operator_log.info("interrupted %d Spark Connect operation(s) of this session", len(interrupted or ()))
        else:
            spark.sparkContext.cancelAllJobs()
    except Exception:
        log_trouble("could not cancel the Spark jobs of a killed run")


# ---------------------------------------------------------------------------------------------
# runs/: the command line's table of attempts (operational: the ledger, not runs/, decides charges)


class RunsTable:
    """The attempt's rows in ``runs/``. The ``running`` row is written in a thread while the input is
    opened and the ledger charged (a Delta commit, seconds in a cold JVM); it is settled (waited for,
    its error raised) before the fit when there is a ledger, else before the outputs, and always
    before this attempt's next write to runs/."""

    def __init__(self, spark, path: str):
        self.spark, self.path = spark, path
        self._running = None

    def start(self, record: dict, timings: dict) -> None:
        self._running = SparkBackground(_write_running_row, self.spark, self.path, record, timings)

    def settle(self, timings: dict, quiet: bool = False) -> None:
        """Wait for the running row (once; timed as a step if still under way) and raise its error,
        or, with ``quiet`` (a path that records a failure anyway), log it."""
        background = self._running
        if background is None or background.settled:
            return
        try:
            if background.done():
                background.result()
            else:
                with step(WAIT_RUNNING_ROW_STEP, timings):
                    background.result()
        except BaseException as exc:
            if not quiet or not isinstance(exc, Exception):
                raise
            log.error("the running row of runs/ was not written: %s", exc)

    def write(self, record: dict) -> None:
        tables.write_run_record(self.spark, self.path, record)


def _write_running_row(spark, runs_path: str, record: dict, timings: dict) -> None:
    """The attempt's ``running`` row, in a thread: timed under its own name and logged in one line
    that is not a step line (it overlaps the steps of the main thread)."""
    start = time.perf_counter()
    tables.write_run_record(spark, runs_path, record, new=True)  # a new attempt's number: no row of it yet
    seconds = time.perf_counter() - start
    timings[RUNNING_ROW_STEP] = seconds
    detail("runs table: the running row was written in a thread in %.2f s", seconds)


class Background:
    """``fn(*args)`` in a daemon thread; ``result()`` waits and returns its value or raises its error
    (once: ``settled`` is then true, and later calls return the value or None)."""

    def __init__(self, fn, *args):
        self._value = self._error = None
        self.settled = False
        self._thread = self._new_thread(target=self._run, args=(fn, args), name="dpspark-background", daemon=True)
        self._thread.start()

    _new_thread = staticmethod(threading.Thread)

    def _run(self, fn, args):
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self):
        self._thread.join()
        self.settled = True
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._value


class SparkBackground(Background):
    """A ``Background`` whose function calls Spark, ``fn(spark, ...)``: an ``InheritableThread``, which
    in pinned-thread mode gives the thread its own py4j connection and the main thread's job
    properties; on Spark Connect it needs the session (the thread gets the session's tags)."""

    def __init__(self, fn, spark, *args):
        self._spark = spark
        super().__init__(fn, spark, *args)

    def _new_thread(self, **kwargs):
        from pyspark import InheritableThread

        target = kwargs.pop("target")
        if is_connect(self._spark):
            return InheritableThread(target, session=self._spark, **kwargs)
        return InheritableThread(target, **kwargs)


# ---------------------------------------------------------------------------------------------
# The operator log: one JSON record per attempt, at a location the deployment fixes


def operator_log_dir() -> str | None:
    """``$DPSPARK_OPERATOR_LOG`` (qualified), or None: set by the deployment, never by a config."""
    base = os.environ.get(OPERATOR_LOG_ENV) or None
    return tables.qualify(base).rstrip("/") if base else None


def operator_record_path(run_id: str, attempt: int, base: str | None = None) -> str | None:
    base = base or operator_log_dir()
    return None if base is None else f"{base.rstrip('/')}/{run_id}/attempt-{int(attempt)}.json"


def _exists(spark, path: str) -> bool:
    return tables.small_file_kind(spark, path) != "missing"


def write_operator_record(spark, run_id: str, attempt: int, payload: dict) -> str | None:
    """Write one attempt's operator record (``payload``, made JSON-safe) under ``$DPSPARK_OPERATOR_LOG``;
    returns its path, or None when the variable is unset. An attempt number is taken from ``runs/``,
    which the analyst can edit: a record already at that path is never overwritten (the new one gets a
    unique suffix, ``attempt-N.<time>-<random>.json``)."""
    path = operator_record_path(run_id, attempt)
    if path is None:
        return None
    if _exists(spark, path):
        path = path[: -len(".json")] + f".{now():%Y%m%dT%H%M%S}-{secrets.token_hex(4)}.json"
    tables.write_json(spark, path, json.loads(json.dumps(payload, default=_plain)))
    return path


def _plain(value):
    """JSON for the operator record: numpy values as numbers and lists, times in ISO 8601, else text."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def read_operator_record(spark, run_id: str, attempt: int = 1, base: str | None = None) -> dict:
    """The operator record of one attempt (``base``: default ``$DPSPARK_OPERATOR_LOG``), as a dict."""
    path = operator_record_path(run_id, attempt, base)
    if path is None:
        raise ValueError(f"no operator log: ${OPERATOR_LOG_ENV} is not set and no base was given")
    local = tables.local_path(path)
    if local is not None:
        with open(local, encoding="utf-8") as handle:
            return json.load(handle)
    return json.loads(spark.read.text(path, wholetext=True).first()[0])
