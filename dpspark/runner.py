"""One run of a job, from a validated config to its outputs: one ATTEMPT of a run id.

    pre-flight, no Spark job over the data: output and ledger locations usable
    -> earlier attempts of this run id (``runs/``): a run id that succeeded is not run again
       (exit 0, nothing charged or released) unless ``force``
    -> a ``running`` row in ``runs/`` (attempt N) and a ``started`` ledger event (timed here, written
       in one commit with the attempt's next ledger events: see dpspark.privacy.ledger)
    -> open the input (schema, Delta version: a retry reads its first attempt's version),
       check every public input (candidate table, ldp rounds) BEFORE the charge
    -> charge the ledger with the run's declared (epsilon, delta), or refuse (exit 3); or reuse
       the charge of an earlier attempt that provably released nothing (below)
    -> fit the family's estimator (reads the data; every noisy release is charged)
    -> write centers/, report.png, runs/ and, last, summary.json and summary/<run_id>.json

Statuses of an attempt in ``runs/``: running, then succeeded, failed, invalid_config (a config key
naming a column the table lacks, or a bad row filter: exit 2), refused, killed (SIGTERM or
SIGINT: the command line turns the signal into ``RunKilled``), or awaiting (ldp ingest mode, nothing
charged). A failure leaves no centers and no summary.json (a stale one from an earlier run is
removed when an attempt starts): rows this attempt wrote are removed, the attempt is recorded with
its status in ``runs/`` and in the ledger, and any charge stays.

Reusing a charge. An attempt that was charged but ended (failed or killed, recorded) BEFORE its fit
started never read a private value (only the table's schema and version) and never drew noise, so
it released nothing: its charge covers nothing yet. The next attempt of the same run id may take
it over instead of charging again, once: the decision reads only the ledger (a ``fit_started``
event is written before every fit; ``runs/`` is under a user-writable path and is not trusted),
and the takeover is an atomic claim in the ledger, so two concurrent retries cannot both reuse
one charge. An attempt whose fit started, or whose end was never recorded (SIGKILL), is charged
for good: its noisy values may have reached a log.

Outputs carry only released values and public parameters. Wall times, pass counts, histogram sizes
and report counts depend on the data: nothing under ``output.path`` holds them (``runs/`` keeps its
column ``non_private_operational`` for old readers, always null), except summary.json and the report
with ``diagnostics: true`` (labelled NON-PRIVATE; refused with a ledger). They go to the OPERATOR
LOG, a location the deployment fixes (``$DPSPARK_OPERATOR_LOG``, never a config key): each attempt
writes ``{DPSPARK_OPERATOR_LOG}/{run_id}/attempt-{N}.json`` (``write_operator_record``: status,
input key, timings, the family's ``operational`` dict, a failure's type and traceback, the
attempt's dpspark log lines); unset, nothing is kept. In a run with a ledger the analyst's log
shows none of them (dpspark.progress), and an error that is not dpspark's own, once the fit has
started, reaches the analyst as ``RunFailed`` naming its type only (dpspark.errors.for_the_analyst).

On a Spark Connect session (``dpspark.session.is_connect``) the attempt is the same, with these
differences, all decided before any charge: ``output.path`` must be a local path (the client
writes summary.json and the report; a remote URI is a ``ConfigError`` naming output.path); with a
ledger the input must be a Delta table (a parquet/csv folder's ledger key is its Hadoop-qualified
path: a ``ConfigError`` naming input.format); no Python-worker warm-up (the server's workers are its
own); a killed attempt interrupts its requests (``interruptAll``) instead of cancelling the
SparkContext's jobs. The ledger is the same Delta table, charged by the same UPDATE.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import secrets
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from dpspark import __version__, tables
from dpspark.errors import (BudgetRefused, ConfigError, DPSparkError, PrivacyAccountingError, RunFailed, RunKilled,
                            for_the_analyst)
from dpspark.privacy.ledger import NOT_PRIVATE_NOTE, Ledger
from dpspark.privacy.randomness import Randomness
from dpspark.progress import OPERATOR_LOG_ENV, accounted, capture, detail, log, log_trouble, operator_log, step
from dpspark.session import is_connect, quiet_spark_logs, reset_py4j_connection

ESTIMATORS = {
    "auto": "dpspark.auto.estimator:AutoClustering",
    "dplloyd": "dpspark.dplloyd.estimator:DPLloyd",
    "maxcover": "dpspark.maxcover.estimator:MaxCover",
    "ldp": "dpspark.ldp.estimator:LocalDP",
}


def estimator_class(name: str):
    module, _, attr = ESTIMATORS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


@dataclass
class RunResult:
    run_id: str
    status: str
    summary: dict
    outputs: dict
    model: object = None
    attempt: int = 1
    exit_code: int = 0
    input_version: int | None = None  # the Delta version read (not in the published summary)


def output_paths(output_path: str) -> dict:
    base = output_path.rstrip("/")
    return {
        "centers": f"{base}/centers",
        "runs": f"{base}/runs",
        "summary": f"{base}/summary.json",
        "report": f"{base}/report.png",
        "report_html": f"{base}/report.html",
    }


def run_summary_path(paths: dict, run_id: str) -> str:
    """The latest successful release of one run id: ``summary/<run_id>.json`` beside summary.json."""
    return paths["summary"][: -len("summary.json")] + f"summary/{run_id}.json"


def attempt_summary_path(paths: dict, run_id: str, attempt: int) -> str:
    """One attempt's release, never overwritten: ``summary/<run_id>/<attempt>.json``."""
    return paths["summary"][: -len("summary.json")] + f"summary/{run_id}/{int(attempt)}.json"


def _now():
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _reusable_charge(ledger, input_key: str, run_id: str, plan: tuple, guarantee: str):
    """The attempt whose charge this attempt may take over, or None (see the module docstring).

    Only asked when ``runs/`` lists earlier attempts of this run id: without one there is nothing to
    take over, and a ``runs/`` edited to hide earlier attempts only makes the run pay again (it never
    reuses less safely). Decided from the LEDGER only (``runs/`` lives under a user-writable output path): the latest
    charged attempt of this run id ended (failed or killed, recorded) without a ``fit_started``
    event, nothing of this run id succeeded, and its charge was for the same (epsilon, delta,
    guarantee). The caller must still win ``Ledger.claim_charge`` (one taker per charge).
    """
    if ledger is None:
        return None
    events = [e for e in ledger.runs(input_key) if e["run_id"] == run_id]
    if any(e["status"] == "succeeded" for e in events):
        return None
    charges = [e for e in events if e["status"] == "charged" and e.get("attempt") is not None]
    if not charges:
        return None
    charge = max(charges, key=lambda e: int(e["attempt"]))
    attempt = int(charge["attempt"])
    mine = {e["status"] for e in events if e.get("attempt") == attempt}
    if "fit_started" in mine or not mine & {"failed", "killed", "invalid_config"}:
        return None
    same = (math.isclose(charge["epsilon"], plan[0], rel_tol=1e-12)
            and math.isclose(charge["delta"], plan[1], rel_tol=1e-12, abs_tol=1e-300)
            and (charge.get("guarantee") or "central") == guarantee)
    return attempt if same else None


def _error_text(exc: BaseException, fit_started: bool) -> str:
    """What ``runs/`` and the analyst's log say about a failure. dpspark's own messages name keys
    and public values only; another exception raised once the fit has started may quote a private
    value (e.g. a Spark cast error), so only its type is recorded: the operator log has the rest."""
    if isinstance(exc, (DPSparkError, RunKilled)) or not fit_started:
        return f"{type(exc).__name__}: {exc}"[:4000]
    return f"{type(exc).__name__} during the fit (details in the operator log only: they may quote private values)"


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
    local = tables.local_path(path)
    if local is not None:
        return os.path.exists(local)
    tables.require_local_small_file(spark, path)  # Spark Connect: local paths only
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return bool(hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(hpath))


def write_operator_record(spark, run_id: str, attempt: int, payload: dict) -> str | None:
    """Write one attempt's operator record (``payload``, made JSON-safe) under ``$DPSPARK_OPERATOR_LOG``;
    returns its path, or None when the variable is unset. An attempt number is taken from ``runs/``,
    which the analyst can edit: a record already at that path is never overwritten (the new one gets a
    unique suffix, ``attempt-N.<time>-<random>.json``)."""
    path = operator_record_path(run_id, attempt)
    if path is None:
        return None
    if _exists(spark, path):
        path = path[: -len(".json")] + f".{_now():%Y%m%dT%H%M%S}-{secrets.token_hex(4)}.json"
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


def _operator_payload(notes: dict, lines: list) -> dict:
    record = notes.get("record") or {}
    status = record.get("status")
    if notes.get("error_type") and status in (None, "running"):
        status = "failed"  # an error before the attempt recorded its end
    return {
        "run_id": notes["run_id"], "attempt": notes["attempt"], "status": status,
        "algorithm": record.get("algorithm"), "input_path": record.get("input_path"),
        "input_key": record.get("input_key"), "input_version": record.get("input_version"),
        "started_at": record.get("started_at"), "ended_at": record.get("ended_at"),
        "epsilon_spent": record.get("epsilon_spent"), "delta_spent": record.get("delta_spent"),
        "charged": record.get("charged"), "fit_started": record.get("fit_started"),
        "charge_reused_from": record.get("charge_reused_from"), "private": record.get("private"),
        "label": "NON-PRIVATE operational metadata: exact values computed from the data",
        "timings": {k: round(v, 3) for k, v in notes["timings"].items()},
        "operational": notes["operational"],
        "error_type": notes.get("error_type"), "traceback": notes.get("traceback"),
        "log": list(lines), "dpspark_version": __version__,
    }


def keep_operator_record(spark, notes: dict, lines: list) -> None:
    """Write the attempt's operator record, if it has an attempt number; never fails the run."""
    if notes["attempt"] is None or operator_log_dir() is None:
        return
    try:
        path = write_operator_record(spark, notes["run_id"], notes["attempt"], _operator_payload(notes, lines))
        operator_log.info("operator record of run %s attempt %s: %s", notes["run_id"], notes["attempt"], path)
    except Exception as exc:
        log.error("could not write the operator record of run %s attempt %s (%s)", notes["run_id"], notes["attempt"],
                  type(exc).__name__)
        operator_log.error("could not write the operator record", exc_info=True)


def run(config, spark, run_id: str | None = None, randomness: Randomness | None = None, force: bool = False,
        timings: dict | None = None) -> RunResult:
    """One attempt of ``run_id`` (see the module docstring). ``timings``: steps measured before the
    call (the command line passes "start Spark session"), kept first in the attempt's timings.

    With a ledger the attempt is ACCOUNTED (dpspark.progress.accounted): the analyst's log shows no
    data-dependent value. Every attempt's dpspark lines are collected for its operator record. An
    error raised once the fit has started reaches the caller as ``for_the_analyst`` makes it."""
    run_id = run_id or new_run_id()
    if not tables.RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    notes = {"run_id": run_id, "attempt": None, "record": None, "timings": dict(timings or {}), "operational": {}}
    ledgered = config.privacy.ledger is not None
    failure = None
    with accounted(ledgered), capture() as lines, quiet_spark_logs(spark, ledgered):
        if ledgered and operator_log_dir() is None:
            log.warning("$%s is not set: this run's operational data (timings, pass counts, error details) is "
                        "not kept anywhere", OPERATOR_LOG_ENV)
        try:
            return _attempt(config, spark, run_id, randomness, force, notes)
        except BaseException as exc:
            error = exc.error if isinstance(exc, _Recorded) else exc
            notes["error_type"] = type(error).__name__
            notes["traceback"] = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            fit_started = bool(notes["record"] and notes["record"].get("fit_started"))
            failure = for_the_analyst(error, fit_started)
            if isinstance(failure, RunFailed) and operator_log_dir() is None:
                log.error("the details of this failure were not kept: $%s is not set (or attach a handler to the "
                          "'dpspark.operator' logger)", OPERATOR_LOG_ENV)
        finally:
            keep_operator_record(spark, notes, lines)
    raise failure  # outside the except block: the analyst's exception chains nothing


def _attempt(config, spark, run_id: str, randomness: Randomness | None, force: bool, notes: dict) -> RunResult:
    """The body of ``run``; fills ``notes`` (attempt, record, timings, operational) for the operator record."""
    started = _now()
    timings = notes["timings"]
    paths = output_paths(tables.qualify(config.output.path))
    randomness = randomness or Randomness(config.seed)
    estimator = estimator_class(config.algorithm.name).from_config(config, randomness=randomness)
    plan_eps, plan_delta = estimator.privacy_plan()
    if plan_eps > config.privacy.epsilon * (1 + 1e-12) or plan_delta > config.privacy.delta * (1 + 1e-12):
        raise PrivacyAccountingError(
            f"{config.algorithm.name} would spend epsilon={plan_eps:g}, delta={plan_delta:g}, over the configured "
            f"privacy.epsilon={config.privacy.epsilon:g}, privacy.delta={config.privacy.delta:g}"
        )
    guarantee = getattr(estimator, "guarantee", "central")
    private = randomness.private
    privacy_note = None if private else "NOT PRIVATE: fixed seed (testing aid)"
    if not private:
        log.warning("seed=%s: a testing aid; this run is NOT PRIVATE", randomness.seed)
    if not config.privacy.ledger:
        log.warning("%s", UNACCOUNTED_WARNING)

    # Pre-flight: nothing is written, no data is read.
    with step("pre-flight checks", timings):
        tables.check_output_location(spark, config.output.path)
        ledger = None
        if config.privacy.ledger:
            ledger_path = tables.qualify(config.privacy.ledger)
            tables.check_output_location(spark, ledger_path, "privacy.ledger", delta_only=True)
            _check_connect_ledger_input(spark, config)
            ledger = Ledger(spark, ledger_path)
        earlier = tables.read_attempts(spark, paths["runs"], run_id)

    done = [a for a in earlier if a.get("status") == "succeeded"]
    if earlier:
        _warn_if_config_changed(config, earlier[-1], run_id)
    if done and not force:
        last = done[-1]
        log.info("run %s already succeeded (attempt %s): nothing charged, nothing released; --force makes a new release",
                 run_id, last["attempt"])
        summary = {"run_id": run_id, "status": "already_succeeded", "attempt": last["attempt"],
                   "algorithm": last.get("algorithm"), "epsilon_spent": 0.0, "delta_spent": 0.0,
                   "input": {"path": last.get("input_path"), "version": last.get("input_version")},
                   "outputs": {"summary": attempt_summary_path(paths, run_id, last["attempt"]),
                               "run_summary": run_summary_path(paths, run_id), "centers": paths["centers"]}}
        return RunResult(run_id=run_id, status="already_succeeded", summary=summary, outputs=paths,
                         attempt=int(last["attempt"]), input_version=last.get("input_version"))
    attempt = max((int(a["attempt"]) for a in earlier), default=0) + 1
    pinned = next((a.get("input_version") for a in earlier if a.get("input_version") is not None), None)

    record = {
        "run_id": run_id, "attempt": attempt, "status": "running", "algorithm": config.algorithm.name,
        "objective": config.algorithm.objective, "k": config.algorithm.k,
        "parameters": _json(config.to_dict()), "epsilon_spent": 0.0, "delta_spent": 0.0,
        "epsilon_configured": config.privacy.epsilon, "delta_configured": config.privacy.delta,
        "charges": "[]", "input_path": config.input.name, "input_key": None, "input_format": config.input.format,
        "input_version": None, "input_where": config.input.where, "dpspark_version": __version__,
        "started_at": started, "ended_at": None, "seed": randomness.seed, "private": private,
        "privacy_note": privacy_note, "guarantee": guarantee, "charge_reused_from": None, "error": None,
        "charged": False, "fit_started": False,
        "non_private_operational": None,  # always null: operational data go to the operator log only
    }
    notes.update(attempt=attempt, record=record)
    _warm_python_workers(spark)  # in a thread: public rows only
    # summary.json stays the latest SUCCESSFUL release (its run_id and attempt say which) until this
    # attempt succeeds; the --json line and runs/ say how this attempt ended.
    # The ``running`` row is operational (the ledger, not runs/, decides about charges): it is written
    # in a thread while the input is opened and the ledger charged (a Delta commit, seconds in a cold
    # JVM). Settled (waited for, its error raised) before the fit when there is a ledger, so that an
    # attempt whose runs row failed ends before its fit and a retry may reuse its charge; else before
    # the outputs; and always before this attempt's next write to runs/.
    running_row = _SparkBackground(_write_running_row, spark, paths["runs"], dict(record), timings)
    input_key = None
    wrote_outputs = False
    try:
        with step("read input table (schema and version)", timings):
            table = tables.load_input(spark, config.input, version=pinned)
            tables.check_schema(table.df, config.input.features, config.input.privacy_unit, config.domain.dim)
        input_key = table.ledger_key
        record.update(input_path=table.path, input_key=input_key, input_version=table.version)
        if ledger is not None:
            # Timed now, written in one commit with this attempt's next ledger events (charged and
            # fit_started, or refused, reused, failed, ...): see dpspark.privacy.ledger.
            ledger.mark(input_key, run_id, "started", attempt=attempt, guarantee=guarantee,
                        note=None if private else NOT_PRIVATE_NOTE, defer=True)
        if pinned is not None and config.input.version is None and config.input.timestamp is None:
            log.info("attempt %d of run %s reads version %s of the input, as its first attempt did", attempt, run_id, pinned)

        # Every public input is checked before the charge (a missing candidate table burns nothing).
        preflight = getattr(estimator, "preflight", None)
        if preflight is not None:
            with step("check the public inputs", timings):
                preflight(spark, input_key)
        # Families whose inputs arrive over time (ldp ingest mode) say here, before any charge,
        # whether the run can release; if not, nothing is charged or released (exit 1).
        ready = getattr(estimator, "check_ready", None)
        if ready is not None:
            try:
                with step("check that every input is in", timings):
                    ready(spark)
            except DPSparkError as exc:
                record.update(status="awaiting", ended_at=_now(), error=str(exc)[:4000])
                _settle(running_row, timings, quiet=True)
                _record_end(spark, paths, record, ledger, config, run_id, attempt, guarantee, input_key)
                raise _Recorded(exc) from None

        ledger_totals = None
        if ledger is not None:
            budget = config.privacy.budget
            reuse = None
            if earlier:  # a first attempt has no earlier charge to take over (see _reusable_charge)
                with step("privacy ledger: earlier attempts", timings):
                    reuse = _reusable_charge(ledger, input_key, run_id, (plan_eps, plan_delta), guarantee)
                    if reuse is not None and not ledger.claim_charge(input_key, run_id, reuse, attempt):
                        reuse = None  # another attempt took it over first: charge as usual
            try:
                with step("privacy ledger: charge", timings):
                    if reuse is not None:
                        ledger.mark(input_key, run_id, "reused", attempt=attempt, guarantee=guarantee, defer=True,
                                    note=f"reuses the charge of attempt {reuse}, which ended before its fit started")
                        ledger_totals = ledger.totals(input_key, budget.epsilon if budget else None,
                                                      budget.delta if budget else None, guarantee=guarantee)
                        record["charge_reused_from"] = reuse
                        log.info("attempt %d reuses the charge of attempt %d (it released nothing)", attempt, reuse)
                    else:
                        # ``charged`` is written with ``fit_started`` below (or ``failed``/``killed``), one commit
                        ledger_totals = ledger.charge(
                            input_key, run_id, config.algorithm.name, plan_eps, plan_delta,
                            budget.epsilon if budget else None, budget.delta if budget else None,
                            guarantee=guarantee, attempt=attempt, input_seen=table.path, private=private, defer=True,
                        )
            except BudgetRefused as exc:
                record.update(status="refused", ended_at=_now(), error=str(exc))
                _settle(running_row, timings, quiet=True)
                _record_end(spark, paths, record, None, config, run_id, attempt, guarantee)
                raise _Recorded(exc) from None
            # The charge is written; from here on the budget stays spent whatever happens.
            record.update(epsilon_spent=plan_eps, delta_spent=plan_delta, charged=True)

        if ledger is not None:  # from here on this attempt's charge is spent for good
            _settle(running_row, timings)
            with step("privacy ledger: fit started", timings):
                ledger.mark(input_key, run_id, "fit_started", attempt=attempt, guarantee=guarantee)
        record["fit_started"] = True
        operational = notes["operational"]
        with step(f"{config.algorithm.name}: fit", timings, hide_inside=True):
            model = estimator.fit(table.df, timings=timings, operational=operational)
        if not (math.isclose(model.epsilon_spent, plan_eps, rel_tol=1e-9, abs_tol=1e-12)
                and math.isclose(model.delta_spent, plan_delta, rel_tol=1e-9, abs_tol=1e-15)):
            raise PrivacyAccountingError(
                f"{config.algorithm.name} declared epsilon={plan_eps!r}, delta={plan_delta!r} but charged "
                f"epsilon={model.epsilon_spent!r}, delta={model.delta_spent!r}"
            )
        diagnostics = _diagnostics(spark, model, table.df) if config.diagnostics else None
        record.update(epsilon_spent=model.epsilon_spent, delta_spent=model.delta_spent, charges=_json(model.charges),
                      # the validated config, and what the fit chose from it (auto: its method and why)
                      parameters=_json({**config.to_dict(), "fitted": model.parameters}))
        degenerate = collapse_of(config, model)
        _settle(running_row, timings)
        wrote_outputs = True  # from here a failure deletes what this attempt wrote
        summary = {
            "run_id": run_id, "attempt": attempt, "status": "succeeded", "algorithm": config.algorithm.name,
            "objective": config.algorithm.objective, "k": config.algorithm.k,
            "private": private, "privacy_note": privacy_note, "guarantee": guarantee,
            "epsilon_spent": model.epsilon_spent, "delta_spent": model.delta_spent,
            "epsilon_configured": config.privacy.epsilon, "delta_configured": config.privacy.delta,
            "centers": model.centers.tolist(), "noisy_weights": model.noisy_weights.tolist(),
            "feature_names": model.feature_names, "charges": model.charges,
            "charge_reused_from": record["charge_reused_from"],
            "parameters": model.parameters,
            # The Delta version read: table metadata the analyst also sees in runs/ and --json (docs/privacy.md)
            "input": {"path": table.path, "key": input_key, "format": config.input.format, "where": config.input.where,
                      "version": table.version},
            "ledger": _ledger_view(ledger_totals),
            # "ledger": charged to privacy.ledger; "unaccounted": no ledger recorded what this run spent
            "accounting": "ledger" if ledger is not None else "unaccounted",
            "randomness": randomness.describe(),
            "degenerate": degenerate,
            "outputs": _listed_outputs(paths, run_id, attempt, config.output.report),
        }
        if diagnostics is not None:
            summary["non_private_diagnostics"] = {k: v for k, v in diagnostics.items() if k != "data_sample"}
        # The report is drawn (on the driver, from released values) while the centers are written (in
        # the JVM), unless it draws the step timings (diagnostics), which include that write.
        drawing = None
        if config.output.report and diagnostics is None:
            drawing = _Background(_render_report, _report_info(summary, timings, diagnostics, config, table.version))
        with step("write centers table", timings):
            tables.write_centers(spark, paths["centers"], run_id, model.feature_names, model.centers,
                                 model.noisy_weights, private=private, attempt=attempt)
        if config.output.report:
            with step("write report.png", timings):
                png, page = (drawing.result() if drawing is not None
                             else _render_report(_report_info(summary, timings, diagnostics, config, table.version)))
                tables.write_bytes(spark, paths["report"], png)
                tables.write_bytes(spark, paths["report_html"], page)
        if diagnostics is not None:
            summary["non_private_timings"] = _phase_timings(timings, config.algorithm.name)
        record.update(status="succeeded", ended_at=_now())
        with step("write runs table and summary.json", timings):
            tables.write_run_record(spark, paths["runs"], record)
            # this attempt's own copy first (never overwritten), then the run id's and the latest release
            tables.write_json(spark, attempt_summary_path(paths, run_id, attempt), summary)
            tables.write_json(spark, run_summary_path(paths, run_id), summary)
            tables.write_json(spark, paths["summary"], summary)
    except _Recorded:
        raise  # run() hands the analyst its error
    except BaseException as exc:
        killed = isinstance(exc, RunKilled)
        status = end_status(exc)
        log.error("run %s attempt %d %s: %s", run_id, attempt, status, _error_text(exc, record["fit_started"]))
        operator_log.error("run %s attempt %d %s", run_id, attempt, status, exc_info=exc)
        if killed:
            reset_py4j_connection(spark)
            cancel_jobs(spark)  # the running row's write too, if it is still under way
        _settle(running_row, timings, quiet=True)  # the thread's row lands (or fails) before the end is written over it
        if wrote_outputs:
            _cleanup(spark, paths, run_id, attempt, config.output.report)
        record.update(status=status, ended_at=_now(), error=_error_text(exc, record["fit_started"]))
        try:
            _record_end(spark, paths, record, ledger, config, run_id, attempt, guarantee, input_key)
        except Exception:  # recording the failure must not hide the failure
            log_trouble("could not record the end of run %s", run_id)
        raise
    if ledger is not None:
        with step("privacy ledger: end", timings):  # after the run record: in the log only
            ledger.mark(input_key, run_id, "succeeded", attempt=attempt, guarantee=guarantee)
    return RunResult(run_id=run_id, status="succeeded", summary=summary, outputs=paths, model=model, attempt=attempt,
                     input_version=table.version)


def end_status(exc: BaseException) -> str:
    """The status an attempt ended by ``exc`` gets in runs/ and the ledger: ``killed`` (a signal),
    ``invalid_config`` (a config mistake found once the table's schema was read: exit 2, the status
    the ``--json`` line says too) or ``failed``."""
    if isinstance(exc, RunKilled):
        return "killed"
    return "invalid_config" if getattr(exc, "exit_code", None) == 2 else "failed"


class _Recorded(Exception):
    """An error whose end was already recorded (refused, awaiting): ``run`` raises ``error`` as is."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _record_end(spark, paths, record, ledger, config, run_id, attempt, guarantee, input_key=None) -> None:
    """The attempt's end in runs/ and in the ledger. The ledger's event is written even when the runs/
    row fails (runs/ is operational; the ledger's ``failed`` is what lets a retry reuse a charge that
    covered nothing); a runs/ error is raised after the ledger's event was written."""
    try:
        tables.write_run_record(spark, paths["runs"], record)
    finally:
        if ledger is not None and input_key is not None:  # an attempt that never opened its input has no ledger events
            ledger.mark(input_key, run_id, record["status"], attempt=attempt, guarantee=guarantee)


RUNNING_ROW_STEP = "write runs table (running, in a thread)"
WAIT_RUNNING_ROW_STEP = "wait for the runs table (running)"


def _write_running_row(spark, runs_path: str, record: dict, timings: dict) -> None:
    """The attempt's ``running`` row (in a thread: see ``run``). Timed into ``timings`` under its own
    name, and logged in one line that is not a step line: it overlaps the steps of the main thread."""
    start = time.perf_counter()
    tables.write_run_record(spark, runs_path, record)
    seconds = time.perf_counter() - start
    timings[RUNNING_ROW_STEP] = seconds
    detail("runs table: the running row was written in a thread in %.2f s", seconds)


def _settle(background, timings: dict, quiet: bool = False) -> None:
    """Wait for ``background`` (once; timed as a step if it is still running) and raise its error,
    or, with ``quiet`` (a path that records a failure anyway), log it."""
    if background.settled:
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


def _check_connect_ledger_input(spark, config) -> None:
    """With a ledger on Spark Connect, the input must be a Delta table (``ConfigError`` naming
    input.format, before any charge): a parquet/csv folder's ledger key is its Hadoop-qualified path
    (``tables.canonical_path``), which a Connect client cannot compute, and a balance keyed otherwise
    would not be the one a classic session charges for the same folder."""
    if is_connect(spark) and config.input.format != "delta" and not getattr(config.input, "table", None):
        raise ConfigError("input.format", f"{config.input.format!r} input with a privacy ledger on a Spark Connect session: "
                                          "only a Delta table can be charged there (a parquet/csv folder's ledger key "
                                          "is its Hadoop-qualified path, which needs a classic session)")


def cancel_jobs(spark) -> None:
    """Stop the Spark work of a killed run: the SparkContext's jobs, or on Spark Connect every request
    of this session under way (``interruptAll``). Never raises."""
    try:
        if is_connect(spark):
            spark.interruptAll()
        else:
            spark.sparkContext.cancelAllJobs()
    except Exception:
        log_trouble("could not cancel the Spark jobs of a killed run")


def _listed_outputs(paths: dict, run_id: str, attempt: int, report: bool) -> dict:
    out = {k: v for k, v in paths.items() if report or not k.startswith("report")}
    out["run_summary"] = run_summary_path(paths, run_id)
    out["attempt_summary"] = attempt_summary_path(paths, run_id, attempt)
    return out


RUNNER_STEPS = ("read input table (schema and version)", "privacy ledger: charge", "write centers table",
                "write report.png", "write runs table and summary.json")


def _phase_timings(timings: dict, algorithm: str) -> dict:
    """Wall times of the run's fixed phases (NON-PRIVATE operational metadata: they grow with n)."""
    names = (*RUNNER_STEPS[:2], f"{algorithm}: fit", *RUNNER_STEPS[2:])
    return {name: round(timings[name], 3) for name in names if name in timings}


UNACCOUNTED_WARNING = ("privacy.ledger is not set: this run is UNACCOUNTED (no ledger records or caps what it "
                       "spends, so nothing stops repeated runs from adding up); set privacy.ledger or $DPSPARK_LEDGER")


def _ledger_view(totals):
    if totals is None:
        return None
    # ``totals`` was read right after this run's charge, so it includes it.
    return totals.as_dict()


def _json(value) -> str:
    return json.dumps(value, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o))


def _cleanup(spark, paths, run_id, attempt, report):
    """After a failure while writing the outputs: remove what THIS attempt wrote (its centers rows,
    its summary, the report it drew over the last one). summary.json and summary/<run_id>.json are
    written last, so they still hold the latest successful release."""
    try:
        tables.delete_run_rows(spark, paths["centers"], run_id, attempt)
        for key in ("report", "report_html") if report else ():
            tables.delete_file(spark, paths[key])
        tables.delete_file(spark, attempt_summary_path(paths, run_id, attempt))
    except Exception:
        log_trouble("cleanup after a failed run left something behind")


CONFIG_CHANGE_KEYS_SHOWN = 8


def _warn_if_config_changed(config, earlier: dict, run_id: str) -> None:
    """Log which config keys differ from the latest earlier attempt of ``run_id`` (its ``parameters``
    in runs/): a run id names one release, so a changed config is usually a mistake worth seeing."""
    try:
        before = json.loads(earlier.get("parameters") or "{}")
    except (TypeError, ValueError):
        return
    before.pop("fitted", None)
    now = json.loads(_json(config.to_dict()))

    def flat(d, prefix=""):
        out = {}
        for key, value in (d or {}).items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    a, b = flat(before), flat(now)
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if changed:
        shown = ", ".join(changed[:CONFIG_CHANGE_KEYS_SHOWN]) + (" ..." if len(changed) > CONFIG_CHANGE_KEYS_SHOWN else "")
        log.warning("run %s: the config differs from its attempt %s's in %s (a run id names one release: use a "
                    "new run id for a different job)", run_id, earlier.get("attempt"), shown)


def collapse_of(config, model):
    """Post-processing of the RELEASED centers and weights: did they collapse? (logged and reported;
    the CLI's summary and dpspark.ml's summary both carry it as ``degenerate``)."""
    from dpspark.degenerate import describe_collapse

    d = config.domain
    width = [2.0 * d.radius] * d.dim if d.radius is not None else [hi - lo for lo, hi in zip(d.lower, d.upper)]
    try:
        found = describe_collapse(model.centers, model.noisy_weights, config.algorithm.k, width,
                                  config.algorithm.name, config.privacy.epsilon)
    except ValueError as exc:  # never fail a release over its description
        log.warning("could not check the released centers for a collapse: %s", exc)
        return None
    if found is not None:
        log.warning("degenerate result: %s Likely cause: %s", found["message"], found["likely_cause"])
    return found


def _public_domain(config) -> dict:
    d = config.domain
    return {"radius": d.radius} if d.radius is not None else {"lower": list(d.lower), "upper": list(d.upper)}


WARM_UP_GROUP = "dpspark-warm-up"


def _touch_python_modules(batches):
    """The warm-up job's Python function: the imports of the fit's Arrow UDFs, then nothing."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    for batch in batches:
        yield batch.iloc[:0]


def _warm_python_workers(spark):
    """Start the local Python workers while the driver opens the input and charges the ledger.

    The fit's first pass otherwise pays for starting them (the worker daemon, one process per core,
    their numpy, pandas and pyarrow imports): seconds of a small job. A Spark job over PUBLIC rows
    only (``range``: no private value, no noise) in a daemon thread leaves them ready for the fit
    (``spark.python.worker.reuse``). Only in local mode (a cluster's executors start their own) and
    once per session; a failure is ignored (the fit starts the workers as before). Returns the
    thread, or None when nothing was started. Not on Spark Connect: the server's workers are its own."""
    if is_connect(spark):
        return None
    sc = spark.sparkContext
    if getattr(sc, "_dpspark_warmed", False) or not str(sc.master).startswith("local"):
        return None
    if str(sc.getConf().get("spark.python.worker.reuse", "true")).lower() == "false":
        return None
    sc._dpspark_warmed = True
    slots = max(1, min(int(sc.defaultParallelism), os.cpu_count() or 1))

    def work():
        try:
            sc.setJobGroup(WARM_UP_GROUP, "dpspark: start the Python workers (public rows only)")
            spark.range(0, slots, 1, slots).mapInPandas(_touch_python_modules, "id LONG").collect()
        except Exception:
            pass

    from pyspark import InheritableThread

    thread = InheritableThread(work, name="dpspark-warm-workers", daemon=True)
    thread.start()
    return thread


class _Background:
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


class _SparkBackground(_Background):
    """A ``_Background`` whose function calls Spark, ``fn(spark, ...)``: an ``InheritableThread``, which
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


def _report_info(summary, timings, diagnostics, config=None, input_version=None) -> dict:
    """What report.png and report.html draw: released values and public parameters (and, with
    diagnostics, the non-private ones, labelled so)."""
    info = {
        "run_id": summary["run_id"], "algorithm": summary["algorithm"], "objective": summary["objective"],
        "k": summary["k"], "epsilon_spent": summary["epsilon_spent"], "delta_spent": summary["delta_spent"],
        "epsilon_configured": summary["epsilon_configured"], "delta_configured": summary["delta_configured"],
        "centers": summary["centers"], "noisy_weights": summary["noisy_weights"],
        "feature_names": summary["feature_names"], "charges": summary["charges"], "ledger": summary["ledger"],
        "parameters": summary["parameters"],
        # Wall times grow with n: drawn only beside the other non-private diagnostics.
        "timings": _phase_timings(timings, summary["algorithm"]) if diagnostics is not None else {},
        "seed_note": summary["privacy_note"], "diagnostics": diagnostics,
        "degenerate": summary.get("degenerate"),
        "input": {**summary["input"], "version": input_version},
    }
    if config is not None:
        info["domain"] = _public_domain(config)
    return info


def _render_report(info: dict) -> tuple[bytes, bytes]:
    """(report.png, report.html) as bytes; matplotlib's object API only (no pyplot): any thread."""
    from dpspark.report import build_html, write_report

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "report.png")
        write_report(local, info)
        with open(local, "rb") as handle:
            png = handle.read()
    return png, build_html(info, png).encode("utf-8")


def _diagnostics(spark, model, df) -> dict:
    """NON-PRIVATE diagnostics (switched on by ``diagnostics: true``): true cost and a data sample."""
    log.warning("diagnostics: true -- computing NON-PRIVATE diagnostics from the data")
    unit_df, _ = tables.prepare_points(df, model.features, None, model.domain, "diagnostics")
    cols = tables.unit_columns(model.domain.dim)
    centers = model.domain.clip_to_unit(model.centers)
    power = 2 if model.objective == "kmeans" else 1

    def cost(batches):
        import pandas as pd

        total, n = 0.0, 0
        for pdf in batches:
            x = pdf[cols].to_numpy(dtype=np.float64)
            d2 = ((x[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2).min(axis=1)
            total += float((d2 if power == 2 else np.sqrt(d2)).sum())
            n += len(x)
        yield pd.DataFrame({"cost": [total], "n": [n]})

    parts = unit_df.mapInPandas(cost, "cost DOUBLE, n LONG").toPandas()
    n = int(parts["n"].sum())
    sample = unit_df.sample(fraction=min(1.0, 2000.0 / max(n, 1)), seed=0).limit(2000).toPandas()
    return {
        "label": "NON-PRIVATE diagnostics computed from the private data",
        "true_cost_unit_space": float(parts["cost"].sum()),
        "n": n,
        "nicv": float(parts["cost"].sum()) / max(n, 1) if power == 2 else None,
        "data_sample": model.domain.from_unit(sample[cols].to_numpy()) if len(sample) else np.zeros((0, model.domain.dim)),
    }
