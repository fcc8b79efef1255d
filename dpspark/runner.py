"""One run of a job, from a validated config to its outputs: one ATTEMPT of a run id.

    pre-flight, no Spark job over the data: output and ledger locations usable
    -> earlier attempts of this run id (``runs/``): a run id that succeeded is not run again
       (exit 0, nothing charged or released) unless ``force``
    -> Spark's Python workers start and import dpspark's executor modules (one job over spark.range,
       on every kind of session; locally it also warms the workers): if not, ``PythonWorkersError``
       (exit 1) before anything is recorded or charged
    -> a ``running`` row in ``runs/`` (attempt N) and a ``started`` ledger event (timed here, written
       in one commit with the attempt's next ledger events: see dpspark.privacy.ledger)
    -> open the input (schema, Delta version: a retry reads its first attempt's version),
       check every public input (candidate table, ldp rounds) BEFORE the charge
    -> charge the ledger with the run's declared (epsilon, delta), or refuse (exit 3); or reuse
       the charge of an earlier attempt that provably released nothing (below)
    -> fit the family's estimator (reads the data; every noisy release is charged)
    -> write centers/, report.png, runs/ and, last, summary.json and summary/<run_id>.json

The attempt's states, what each step records in runs/ and the ledger, how a failure ends it
(``failed``, ``invalid_config``, ``refused``, ``killed``, ``awaiting``), and when a retry reuses an
unused charge are dpspark.attempt's (one lifecycle for this module and dpspark.ml); this module is
the command line's face of it: which steps it takes and what it writes under ``output.path``.

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
differences, all decided before any charge: at a remote ``output.path`` (``s3a://``) the server
writes the small files too (``tables.write_bytes``: dpspark's jar on the server, checked in the
pre-flight); with a ledger the input must be a Delta table (a parquet/csv folder's ledger key is
its Hadoop-qualified path: a ``ConfigError`` naming input.format); no Python-worker warm-up (the
server's workers are its own); a killed attempt interrupts its requests (``interruptAll``) instead of cancelling the
SparkContext's jobs. The ledger is the same Delta table, charged by the same UPDATE.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from dpspark import __version__, catalog, tables
# The lifecycle of an attempt, and the operator log's records: dpspark.attempt (re-exported here for
# the scripts and tests that read them through the runner).
from dpspark.attempt import (RUNNING_ROW_STEP, WAIT_RUNNING_ROW_STEP, Attempt, Awaiting,  # noqa: F401
                             Background, RunsTable, cancel_jobs, checked_plan, end_status,
                             now, operator_log_dir, operator_record_path, read_operator_record,
                             write_operator_record)
from dpspark.errors import ConfigError, DPSparkError
# The families by name, and the estimator a run uses: dpspark.families (below both this module and
# dpspark.config, which validates a plan with it).
from dpspark.families import ESTIMATORS, build_estimator, estimator_class  # noqa: F401
from dpspark.privacy.ledger import Ledger
from dpspark.privacy.randomness import Randomness
from dpspark.progress import log, step
from dpspark.session import check_python_workers, is_connect

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


def run(config, spark, run_id: str | None = None, randomness: Randomness | None = None, force: bool = False,
        timings: dict | None = None) -> RunResult:
    """One attempt of ``run_id`` (see the module docstring), through ``dpspark.attempt.Attempt``.
    ``timings``: steps measured before the call (the command line passes "start Spark session"),
    kept first in the attempt's timings.

    With a ledger the attempt is ACCOUNTED (dpspark.progress.accounted): the analyst's log shows no
    data-dependent value. Every attempt's dpspark lines are collected for its operator record. An
    error raised once the fit has started reaches the caller as ``for_the_analyst`` makes it."""
    run_id = run_id or new_run_id()
    if not tables.RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    paths = output_paths(tables.qualify(config.output.path))
    attempt = Attempt(spark, run_id, runs=RunsTable(spark, paths["runs"]), timings=timings)
    return attempt.execute(lambda a: _attempt(a, config, paths, randomness or Randomness(config.seed), force),
                           ledgered=config.privacy.ledger is not None)


def _attempt(a: Attempt, config, paths: dict, randomness: Randomness, force: bool) -> RunResult:
    """The command line's face of the attempt ``a``: what each step of the lifecycle does here."""
    spark, run_id, timings = a.spark, a.run_id, a.timings
    started = now()
    estimator, plan = _declared(config, randomness)
    a.declare(plan, getattr(estimator, "guarantee", "central"), randomness.private)
    private = randomness.private
    privacy_note = None if private else "NOT PRIVATE: fixed seed (testing aid)"

    # Pre-flight: nothing is written, no data is read.
    with step("pre-flight checks", timings):
        tables.check_output_location(spark, config.output.path)
        catalog.check_output_tables(spark, config.output.table, paths)  # output.table: names free or already ours
        if config.privacy.ledger:
            ledger_path = tables.qualify(config.privacy.ledger)
            tables.check_output_location(spark, ledger_path, "privacy.ledger", delta_only=True)
            _check_connect_ledger_input(spark, config)
            a.ledger = Ledger(spark, ledger_path)
            a.ledger.require_existing()  # a run never creates a ledger (a typo would open a second balance)
        earlier = tables.read_attempts(spark, paths["runs"], run_id)

    if earlier:
        _warn_if_config_changed(config, earlier[-1], run_id)
    noop = _already_succeeded(run_id, paths, earlier, force)
    if noop is not None:
        return noop
    pinned = next((e.get("input_version") for e in earlier if e.get("input_version") is not None), None)
    # Spark's Python workers start and import dpspark's executor modules, or the run ends here: before
    # the attempt begins, so nothing is recorded or charged (PythonWorkersError, exit 1).
    with step("check the Python workers", timings):
        _check_python_workers(spark)

    a.record.update({
        "algorithm": config.algorithm.name, "objective": config.algorithm.objective, "k": config.algorithm.k,
        "parameters": _json(config.to_dict()), "epsilon_spent": 0.0, "delta_spent": 0.0,
        "epsilon_configured": config.privacy.epsilon, "delta_configured": config.privacy.delta,
        "charges": "[]", "input_path": config.input.name, "input_key": None, "input_format": config.input.format,
        "input_version": None, "input_where": config.input.where, "dpspark_version": __version__,
        "started_at": started, "ended_at": None, "seed": randomness.seed, "privacy_note": privacy_note,
        "error": None, "non_private_operational": None,  # always null: operational data go to the operator log only
    })
    # summary.json stays the latest SUCCESSFUL release (its run_id and attempt say which) until this
    # attempt succeeds; the --json line and runs/ say how this attempt ended.
    attempt = a.begin(earlier)  # the running row of runs/ is written in a thread from here
    _warm_python_workers(spark)  # in a thread: public rows only (unless _check_python_workers did it)
    preflight = getattr(estimator, "preflight", None)
    ready = getattr(estimator, "check_ready", None)
    params = config.algorithm.params
    waits = getattr(params, "candidates", None) == "table" or getattr(params, "mode", None) == "ingest"
    if a.ledger is not None and not waits and not tables.is_connect(spark):
        # A ledger that already refuses this run refuses it before Spark's first, cold read of the
        # input (seconds): its key and version from the local Delta log, as the read would record
        # them. Not when the run has other inputs to check first (a candidate table, ldp reports).
        known = tables.local_delta_input(config.input)
        if known is not None and (pinned is None or pinned <= known[2]):
            a.refuse_before_reading(known[1], config.algorithm.name, known[0], config.privacy.budget,
                                    input_path=known[0], input_version=known[2] if pinned is None else pinned)
    with step("read input table (schema and version)", timings):
        table = tables.load_input(spark, config.input, version=pinned)
        tables.check_schema(table.df, config.input.features, config.input.privacy_unit, config.domain.dim)
    a.open_input(table.ledger_key, input_path=table.path, input_version=table.version)
    if pinned is not None and config.input.version is None and config.input.timestamp is None:
        log.info("attempt %d of run %s reads version %s of the input, as its first attempt did", attempt, run_id, pinned)

    # Every public input is checked before the charge (a missing candidate table burns nothing).
    if preflight is not None:
        with step("check the public inputs", timings):
            preflight(spark, a.input_key, a.ledger)
    # Families whose inputs arrive over time (ldp ingest mode) say here, before any charge,
    # whether the run can release; if not, nothing is charged or released (exit 1).
    if ready is not None:
        try:
            with step("check that every input is in", timings):
                ready(spark)
        except DPSparkError as exc:
            raise Awaiting(exc) from None
    ledger_totals = a.charge(config.algorithm.name, table.path, config.privacy.budget) if a.ledger else None

    a.start_fit()
    with step(f"{config.algorithm.name}: fit", timings, hide_inside=True):
        model = estimator.fit(table.df, timings=timings, operational=a.operational)
    tables.check_still_the_input(spark, table.path, table.ledger_key)  # Connect re-resolves the path at each action
    a.fitted(model.epsilon_spent, model.delta_spent)
    diagnostics = _diagnostics(spark, model, table.df) if config.diagnostics else None
    a.record.update(charges=_json(model.charges),
                    # the validated config, and what the fit chose from it (auto: its method and why)
                    parameters=_json({**config.to_dict(), "fitted": model.parameters}))
    degenerate = collapse_of(config, model)
    summary = {
        "run_id": run_id, "attempt": attempt, "status": "succeeded", "algorithm": config.algorithm.name,
        "objective": config.algorithm.objective, "k": config.algorithm.k,
        "private": private, "privacy_note": privacy_note, "guarantee": a.guarantee,
        "epsilon_spent": model.epsilon_spent, "delta_spent": model.delta_spent,
        "epsilon_configured": config.privacy.epsilon, "delta_configured": config.privacy.delta,
        "centers": model.centers.tolist(), "noisy_weights": model.noisy_weights.tolist(),
        "feature_names": model.feature_names, "charges": model.charges,
        "charge_reused_from": a.record["charge_reused_from"],
        "parameters": model.parameters,
        # the box (or ball) the release used: the configured one, or the one the run released (domain.estimate)
        "domain": _released_domain(model),
        # The Delta version read: table metadata the analyst also sees in runs/ and --json (docs/privacy.md)
        "input": {"path": table.path, "key": a.input_key, "format": config.input.format, "where": config.input.where,
                  "version": table.version},
        "ledger": _ledger_view(ledger_totals),
        # "ledger": charged to privacy.ledger; "unaccounted": no ledger recorded what this run spent
        "accounting": "ledger" if a.ledger is not None else "unaccounted",
        "randomness": randomness.describe(),
        "degenerate": degenerate,
        "outputs": {**_listed_outputs(paths, run_id, attempt, config.output.report),
                    **catalog.listed_outputs(config.output.table)},
        # when the release was made (UTC; runs/ has the attempt's start and end times too)
        "released_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    if diagnostics is not None:
        summary["non_private_diagnostics"] = {k: v for k, v in diagnostics.items() if k != "data_sample"}
    # From here a failure removes what this attempt wrote.
    a.cleanup = lambda: _cleanup(spark, paths, run_id, attempt, config.output.report)
    # The report is drawn (on the driver, from released values) while the centers are written (in
    # the JVM), unless it draws the step timings (diagnostics), which include that write.
    drawing = None
    if config.output.report and diagnostics is None:
        drawing = Background(_render_report, _report_info(summary, timings, diagnostics, config, table.version))
    with step("write centers table", timings):
        tables.write_centers(spark, paths["centers"], run_id, model.feature_names, model.centers,
                             model.noisy_weights, private=private, attempt=attempt, new=True)
    if config.output.report:
        with step("write report.png", timings):
            png, page = (drawing.result() if drawing is not None
                         else _render_report(_report_info(summary, timings, diagnostics, config, table.version)))
            tables.write_bytes(spark, paths["report"], png)
            tables.write_bytes(spark, paths["report_html"], page)
    if config.output.table:  # centers/ and runs/ exist now: their catalog names, before the summaries list them
        with step("register output.table", timings):
            catalog.register_output_tables(spark, config.output.table, paths)
    if diagnostics is not None:
        summary["non_private_timings"] = _phase_timings(timings, config.algorithm.name)

    def write_summaries():  # this attempt's own copy first (never overwritten), then the run id's and the latest
        tables.write_json(spark, attempt_summary_path(paths, run_id, attempt), summary)
        tables.write_json(spark, run_summary_path(paths, run_id), summary)
        tables.write_json(spark, paths["summary"], summary)

    a.succeed(write_summaries, note=estimate_note(model))  # runs/, the summaries, then the ledger's succeeded
    return RunResult(run_id=run_id, status="succeeded", summary=summary, outputs=paths, model=model, attempt=attempt,
                     input_version=table.version)


def estimate_note(model) -> str | None:
    """The ledger's note on a release whose box the run estimated: that step's share of the charge."""
    est = (model.info or {}).get("domain_estimate")
    if not isinstance(est, dict):
        return None
    return (f"of this charge, epsilon={est['epsilon']:.6g}, delta={est['delta']:.6g} released the domain "
            "(domain.estimate: private)")


def _declared(config, randomness: Randomness):
    """The family's estimator and its checked plan, and the warnings every attempt starts with."""
    estimator = build_estimator(config, randomness)
    plan = checked_plan(estimator, config)
    if not randomness.private:
        log.warning("seed=%s: a testing aid; this run is NOT PRIVATE", randomness.seed)
    if not config.privacy.ledger:
        log.warning("%s", UNACCOUNTED_WARNING)
    return estimator, plan


def _already_succeeded(run_id: str, paths: dict, earlier: list[dict], force: bool) -> RunResult | None:
    """The no-op of a run id that already succeeded (unless ``force``): nothing charged, nothing released."""
    done = [e for e in earlier if e.get("status") == "succeeded"]
    if not done or force:
        return None
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


def succeeded_before(config, run_id: str, force: bool = False) -> RunResult | None:
    """Before Spark starts (the command line): the no-op of a run id whose local ``runs/`` table, read
    without Spark (``tables.read_attempts_without_spark``), shows it succeeded; the same result, log
    lines and checks as ``run``'s no-op, in a fraction of a second instead of a JVM's start. None
    (``run`` then decides as usual) with ``force``, a remote output path, a runs/ table delta-rs
    cannot read, a location check that fails (``run`` reports it) or a run id that did not succeed."""
    if force or not tables.RUN_ID_PATTERN.match(run_id or ""):
        return None
    paths = output_paths(tables.qualify(config.output.path))
    try:
        tables.check_output_location(None, config.output.path)
        if config.privacy.ledger:
            tables.check_output_location(None, tables.qualify(config.privacy.ledger), "privacy.ledger", delta_only=True)
    except Exception:
        return None
    earlier = tables.read_attempts_without_spark(paths["runs"], run_id)
    if not earlier or not any(e.get("status") == "succeeded" for e in earlier):
        return None
    try:
        _declared(config, Randomness(config.seed))  # a plan over the budget is refused as in ``run``
    except Exception:
        return None
    _warn_if_config_changed(config, earlier[-1], run_id)
    return _already_succeeded(run_id, paths, earlier, force)


def _check_connect_ledger_input(spark, config) -> None:
    """With a ledger on Spark Connect, the input must be a Delta table (``ConfigError`` naming
    input.format, before any charge): a parquet/csv folder's ledger key is its Hadoop-qualified path
    (``tables.canonical_path``), which a Connect client cannot compute, and a balance keyed otherwise
    would not be the one a classic session charges for the same folder."""
    if is_connect(spark) and config.input.format != "delta" and not getattr(config.input, "table", None):
        raise ConfigError("input.format", f"{config.input.format!r} input with a privacy ledger on a Spark Connect session: "
                                          "only a Delta table can be charged there (a parquet/csv folder's ledger key "
                                          "is its Hadoop-qualified path, which needs a classic session)")


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
    written last, so they still hold the latest successful release. (dpspark.attempt logs a failure here.)"""
    tables.delete_run_rows(spark, paths["centers"], run_id, attempt)
    for key in ("report", "report_html") if report else ():
        tables.delete_file(spark, paths[key])
    tables.delete_file(spark, attempt_summary_path(paths, run_id, attempt))


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

    d = model.domain  # the configured domain, or the released one (domain.estimate)
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


def _released_domain(model) -> dict:
    """summary.json's ``domain``: the box or ball the release used and where it came from; for a
    private estimate also its share of the budget and the NOISY share of records outside (released)."""
    est = (model.info or {}).get("domain_estimate")
    if not isinstance(est, dict):
        return {**_public_domain(model.domain), "source": "config"}
    return {**_public_domain(model.domain), "source": "private estimate", "epsilon": est["epsilon"],
            "delta": est["delta"], "outer": est["outer"], "noisy_clipped_fraction": est["noisy_clipped_fraction"],
            "fallback_features": est["fallback_features"]}


def _public_domain(domain) -> dict:
    """The domain the release used: configured (public), or released by the run's estimate."""
    d = domain
    return {"radius": d.radius} if d.radius is not None else {"lower": list(d.lower), "upper": list(d.upper)}


WARM_UP_GROUP = "dpspark-warm-up"


def _touch_python_modules(batches):
    """The warm-up job's Python function: the imports of the fit's Arrow UDFs, then nothing."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    for batch in batches:
        yield batch.iloc[:0]


def _check_python_workers(spark) -> None:
    """``dpspark.session.check_python_workers`` before the attempt begins, on every kind of session.
    In local mode its job runs one task per core and is the warm-up (``_warm_python_workers`` then
    starts no second job): one job, whose worker start the fit no longer pays for."""
    slots = _warm_up_slots(spark)
    if check_python_workers(spark, tasks=slots or 1) and slots:
        spark.sparkContext._dpspark_warmed = True


def _warm_up_slots(spark) -> int | None:
    """How many local Python workers the warm-up starts; None: no warm-up (see ``_warm_python_workers``)."""
    if is_connect(spark):
        return None
    sc = spark.sparkContext
    if getattr(sc, "_dpspark_warmed", False) or not str(sc.master).startswith("local"):
        return None
    if str(sc.getConf().get("spark.python.worker.reuse", "true")).lower() == "false":
        return None
    return max(1, min(int(sc.defaultParallelism), os.cpu_count() or 1))


def _warm_python_workers(spark):
    """Start the local Python workers while the driver opens the input and charges the ledger.

    The fit's first pass otherwise pays for starting them (the worker daemon, one process per core,
    their numpy, pandas and pyarrow imports): seconds of a small job. A Spark job over PUBLIC rows
    only (``range``: no private value, no noise) in a daemon thread leaves them ready for the fit
    (``spark.python.worker.reuse``). Only in local mode (a cluster's executors start their own) and
    once per session; a failure is ignored (the fit starts the workers as before). Returns the
    thread, or None when nothing was started. Not on Spark Connect: the server's workers are its own.
    ``_check_python_workers`` usually did it already, before the attempt began."""
    slots = _warm_up_slots(spark)
    if slots is None:
        return None
    sc = spark.sparkContext
    sc._dpspark_warmed = True

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
    if summary.get("domain") is not None:
        info["domain"] = {k: v for k, v in summary["domain"].items() if k in ("lower", "upper", "radius")}
        info["domain_source"] = summary["domain"]
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
