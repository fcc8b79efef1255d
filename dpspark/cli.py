"""The ``dpspark`` command (and ``spark-submit jobs/cluster.py``, same arguments).

    dpspark run --config conf/demo.yaml [--set KEY=VALUE ...] [--run-id ID] [--force] [--json]
    dpspark validate --config conf/demo.yaml [--set KEY=VALUE ...]
    dpspark advance --config conf/ldp-ingest.yaml      # ldp ingest mode: publish the next round
    dpspark ledger show --ledger PATH [--input TABLE] [--run-id ID] [--status S,...] [--since T] [--until T] [--last N] [--json]
    dpspark ledger set-budget --ledger PATH --input TABLE --epsilon E --delta D [--guarantee central|local]
    dpspark ledger set-public --ledger PATH --table TABLE [--note TEXT]

Exit codes: 0 success (also: the run id already succeeded, nothing done); 2 invalid config or
arguments (reported before Spark starts, naming the key and what is allowed); 3 refused by the
privacy budget; 1 any other failure; 128 + N when stopped by signal N (143 SIGTERM, 130 SIGINT),
after recording the attempt as ``killed``.

``--json`` prints ONE line of JSON on stdout at the end, for schedulers: run_id, attempt, status,
exit_code, epsilon_spent, delta_spent, input_version, outputs, error, accounting (on success: ledger or unaccounted).

What the analyst sees here (stderr, stdout, ``--json``, the exit code) is a function of released
values and public inputs: a run with a ledger is ACCOUNTED (dpspark.progress: no step durations or
other data-dependent values on stderr), and an error that is not dpspark's own, raised once the fit
has started, is shown by its type only (``RunFailed``; the runner keeps the details for the
operator log, ``$DPSPARK_OPERATOR_LOG``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys

from dpspark.errors import ConfigError, DPSparkError, RunKilled

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_BUDGET = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exit code for usage errors is 2 as well
        self.print_usage(sys.stderr)
        print(f"dpspark: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)


def _version() -> str:
    from dpspark import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpspark", description="Differentially private k-means / k-median clustering on Spark.")
    parser.add_argument("--version", action="version", version=f"dpspark {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, text in (("run", "run a clustering job"), ("validate", "validate a config and exit (no Spark)"),
                       ("advance", "ldp ingest mode: publish every round whose reports are in; release nothing")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="YAML config file")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key (repeatable)")
        if name == "run":
            p.add_argument("--run-id", default=None, help="run id (letters, digits, . _ -); default: time + random. "
                                                          "A run id that already succeeded is not run again")
            p.add_argument("--force", action="store_true", help="run again a run id that already succeeded: a NEW "
                                                                "release, charged again, recorded as a new attempt")
            p.add_argument("--json", action="store_true", help="print one JSON line with the outcome on stdout at the end")
    led = sub.add_parser("ledger", help="the privacy ledger: show balances, set an input's budget (administrators)")
    lsub = led.add_subparsers(dest="ledger_command", required=True, parser_class=_Parser)
    show = lsub.add_parser("show", help="balances, caps and the event log (times in UTC)",
                           description="Balances, caps and the event log (times in UTC). --run-id, --status, --since, "
                                       "--until and --last select events; balances are those of --input (or all).")
    show.add_argument("--ledger", required=True, help="path of the ledger Delta table")
    show.add_argument("--input", default=None, help="only this input table (any spelling of its path)")
    show.add_argument("--run-id", default=None, metavar="ID", help="only the events of this run id")
    show.add_argument("--status", action="append", default=None, metavar="STATUS",
                      help="only events with this status (repeatable, or a comma list): set-budget, set-public, started, charged, "
                           "fit_started, reused, succeeded, failed, killed, refused")
    show.add_argument("--since", default=None, metavar="TIME",
                      help="only events at or after TIME: an ISO 8601 date or timestamp, UTC unless it names an offset "
                           "(2024-05-01, 2024-05-01T12:00:00Z)")
    show.add_argument("--until", default=None, metavar="TIME",
                      help="only events at or before TIME (a date alone: to the end of that day, UTC)")
    show.add_argument("--last", default=None, metavar="N", help="only the N newest of the events selected")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    setb = lsub.add_parser("set-budget", help="set (raise or lower) the budget cap of one input table")
    setb.add_argument("--ledger", required=True, help="path of the ledger Delta table (created if missing)")
    setb.add_argument("--input", required=True, help="the input table's path (any spelling)")
    setb.add_argument("--epsilon", required=True, type=float, help="the cap on the total epsilon (> 0)")
    setb.add_argument("--delta", default=0.0, type=float, help="the cap on the total delta, in [0, 1) (default 0)")
    setb.add_argument("--guarantee", default="central", choices=("central", "local"),
                      help="which total the cap is for: central DP runs (default) or local DP (ldp) runs")
    setb.add_argument("--note", default=None, help="why (recorded with the event)")
    setp = lsub.add_parser("set-public", help="declare a table PUBLIC (e.g. a candidate table a config may name)",
                           description="Declare a Delta table PUBLIC in this ledger: a config charged to the ledger "
                                       "may then read it as public data (algorithm.candidate_table), and its rows may "
                                       "come out verbatim in released centers. Only for tables that hold no personal "
                                       "data; a table with a budget in the ledger is refused.")
    setp.add_argument("--ledger", required=True, help="path of the ledger Delta table (created if missing)")
    setp.add_argument("--table", required=True, help="the public table's path (any spelling)")
    setp.add_argument("--note", default=None, help="why it is public (recorded with the event)")
    return parser


@contextlib.contextmanager
def _signals_stop_the_run():
    """SIGTERM / SIGINT raise ``RunKilled`` once (the runner records the attempt); later ones wait for that."""
    state = {"raised": False}

    def handler(signum, frame):
        if state["raised"]:
            print(f"dpspark: signal {signum} again: still recording the killed attempt", file=sys.stderr)
            return
        state["raised"] = True
        # Usually inside a py4j call: its answer would be read by the next call (the family's
        # finally blocks run before the runner sees the kill), so the connection goes first.
        from dpspark.session import reset_py4j_connection

        reset_py4j_connection()
        raise RunKilled(signum)

    saved = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            saved[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread (e.g. tests calling main from a thread): no handlers
        saved = {}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def main(argv: list[str] | None = None, spark=None) -> int:
    """Entry point. ``spark`` lets tests pass a shared session; otherwise one is built."""
    from dpspark.progress import configure_logging

    configure_logging()
    own_session = spark is None  # built here: this process's to stop
    args = build_parser().parse_args(argv)
    if args.command == "ledger":
        return _ledger_command(args, spark)
    as_json = bool(getattr(args, "json", False))
    try:
        from dpspark.config import load_config
        from dpspark.tables import RUN_ID_PATTERN

        config = load_config(args.config, args.set)
        if getattr(args, "run_id", None) is not None and not RUN_ID_PATTERN.match(args.run_id):
            raise ConfigError("--run-id", f"{args.run_id!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    except ConfigError as exc:
        print(f"dpspark: invalid config: {exc}", file=sys.stderr)
        _print_json(as_json, {**_outcome(getattr(args, "run_id", None)), "status": "invalid_config",
                              "exit_code": EXIT_CONFIG, "error": str(exc)})
        return EXIT_CONFIG
    if args.command == "validate":
        problems = _validate_locations(config)
        print(json.dumps(config.to_dict(), indent=2, default=str))
        for warning in _validate_warnings(config):
            print(f"dpspark: warning: {warning}", file=sys.stderr)
        if problems:
            print(f"dpspark: invalid config: {problems[0]}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"dpspark: the config is valid ({config.algorithm.name}, k={config.algorithm.k}, "
              f"epsilon={config.privacy.epsilon:g}, delta={config.privacy.delta:g}, "
              f"{'charged to ' + config.privacy.ledger if config.privacy.ledger else 'UNACCOUNTED: no ledger'}); "
              "nothing was read, run or charged", file=sys.stderr)
        return EXIT_OK
    if args.command == "advance" and not (config.algorithm.name == "ldp" and getattr(config.algorithm.params, "mode", None) == "ingest"):
        print("dpspark: invalid config: config key 'algorithm.mode': `dpspark advance` needs algorithm.name=ldp with mode=ingest",
              file=sys.stderr)
        return EXIT_CONFIG

    run_id = getattr(args, "run_id", None)
    if args.command == "run" and run_id is None:
        from dpspark.runner import new_run_id

        run_id = new_run_id()
    outcome = {**_outcome(run_id), "accounting": "ledger" if config.privacy.ledger else "unaccounted"}
    before: dict = {}  # steps before the runner's, for the run record
    from dpspark.progress import accounted

    with _signals_stop_the_run(), accounted(config.privacy.ledger is not None):
        try:
            result = None
            if args.command == "run" and spark is None:
                from dpspark.runner import succeeded_before
                from dpspark.session import remote_url

                # a run id that already succeeded: decided from a local runs/ table before any JVM starts
                result = None if remote_url() else succeeded_before(config, run_id, force=bool(args.force))
            if result is None and spark is None:
                from dpspark.progress import step
                from dpspark.session import build_session, uses_object_store

                imports = _import_while_the_jvm_starts(config) if args.command == "run" else None
                with step("start Spark session", before):
                    spark = build_session(config.spark.master, config.spark.app_name, dict(config.spark.conf),
                                          small_job=args.command == "run" and _small_job(config),
                                          object_store=uses_object_store(*_paths(config)))
                if imports is not None:
                    imports.join()
            if args.command == "advance":
                # Publishes round parameters computed from clients' LDP reports (post-processing of
                # what the clients already released); reads no private rows, charges nothing.
                from dpspark.ldp.estimator import LocalDP

                status = LocalDP.from_config(config).advance(spark)
                print(status.get("message") or "ldp ingest: all rounds' reports are in; `dpspark run` releases the centers")
                return EXIT_OK
            if result is None:
                from dpspark.runner import run

                result = run(config, spark, run_id=run_id, force=bool(args.force), timings=before)
        except RunKilled as exc:
            print(f"dpspark: run {run_id} {exc}; recorded as killed", file=sys.stderr)
            _finish_outcome(outcome, spark, config, run_id, "killed", exc.exit_code, str(exc))
            if own_session and spark is not None:
                # Spark logs each killed task ("Lost task ... TaskKilled") a moment after its job was
                # cancelled; stopping the session first keeps the status line the log's last line.
                try:
                    spark.stop()
                except Exception:
                    pass
            _print_json(as_json, outcome)
            return exc.exit_code
        except DPSparkError as exc:
            print(f"dpspark: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = getattr(exc, "attempt_status", None) or (
                "refused" if exc.exit_code == EXIT_BUDGET else ("invalid_config" if exc.exit_code == EXIT_CONFIG else "failed"))
            _finish_outcome(outcome, spark, config, run_id, status, exc.exit_code, str(exc))
            _print_json(as_json, outcome)
            return exc.exit_code
        except Exception as exc:  # any other failure: exit 1 with the reason
            print(f"dpspark: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            _finish_outcome(outcome, spark, config, run_id, "failed", EXIT_FAILURE, f"{type(exc).__name__}: {exc}")
            _print_json(as_json, outcome)
            return EXIT_FAILURE
    if result.status == "already_succeeded":
        print(f"run {run_id}: already succeeded (attempt {result.attempt}); nothing was charged or released. "
              f"Use --force for a new release.", file=sys.stderr if as_json else sys.stdout)
    elif not as_json:
        _print_result(result)
    s = result.summary
    outcome.update(attempt=result.attempt, status=result.status, exit_code=EXIT_OK, epsilon_spent=s.get("epsilon_spent", 0.0),
                   delta_spent=s.get("delta_spent", 0.0), input_version=result.input_version,
                   outputs=s.get("outputs"), accounting="ledger" if config.privacy.ledger else "unaccounted")
    _print_json(as_json, outcome)
    return EXIT_OK


def _import_while_the_jvm_starts(config):
    """A thread that imports what the run needs next (the runner, the family's estimator, the
    report: numpy, pandas, scipy, scikit-learn, matplotlib, seconds of work) while this thread starts
    the JVM, which is mostly waiting. It imports numpy, pyarrow and pandas first, the order of the
    session's own imports, and nothing of pyspark (the session's thread imports that), so the two
    never wait on each other's half-imported modules in a cycle. An import error there is ignored:
    the run imports the same modules again and reports it."""
    import threading

    def work():
        try:
            import numpy  # noqa: F401
            import pyarrow  # noqa: F401
            import pandas  # noqa: F401

            from dpspark.families import estimator_class

            estimator_class(config.algorithm.name)
            if config.output.report:
                import dpspark.report  # noqa: F401
        except BaseException:  # the main thread imports them again and reports any error
            pass

    thread = threading.Thread(target=work, name="dpspark-imports", daemon=True)
    thread.start()
    return thread


def _paths(config) -> list:
    """Every table location a job config names (input, ledger, outputs, a family's own tables)."""
    params = config.algorithm.params
    return [config.input.path, config.privacy.ledger, config.output.path,
            *(getattr(params, key, None) for key in ("candidate_table", "protocol_path", "reports_path"))]


def _small_job(config) -> bool:
    """A run over a small local input table: its JVM starts with the small-job options
    (``dpspark.session.SMALL_JOB_JAVA_OPTIONS``: start-up speed only, nothing else changes)."""
    from dpspark.session import small_input

    if getattr(config.input, "table", None):
        return False
    return small_input(config.input.path)


def _finish_outcome(outcome, spark, config, run_id, status, code, error) -> None:
    """Fill the JSON outcome of a failed attempt from its ``runs/`` row (attempt, charge, version)."""
    outcome.update(status=status, exit_code=code, error=error[:2000])
    if spark is None or run_id is None:
        return
    try:
        from dpspark import tables
        from dpspark.runner import output_paths

        attempts = tables.read_attempts(spark, output_paths(tables.qualify(config.output.path))["runs"], run_id)
        if attempts:
            last = attempts[-1]
            outcome.update(attempt=last.get("attempt"), epsilon_spent=last.get("epsilon_spent") or 0.0,
                           delta_spent=last.get("delta_spent") or 0.0, input_version=last.get("input_version"))
    except Exception:
        pass


def _outcome(run_id) -> dict:
    """The ``--json`` line's keys, the same on every exit path (a scheduler reads them): nothing spent
    until the run says otherwise; ``accounting`` null when the config could not be read."""
    return {"run_id": run_id, "attempt": None, "status": None, "exit_code": None, "epsilon_spent": 0.0,
            "delta_spent": 0.0, "input_version": None, "outputs": None, "error": None, "accounting": None}


def _print_json(enabled: bool, outcome: dict) -> None:
    if enabled:
        print(json.dumps(outcome, default=str), flush=True)


def _validate_locations(config) -> list[str]:
    """The checks ``run`` makes before its charge that need no Spark: local output and ledger locations."""
    import os

    from dpspark import tables

    problems = []
    for key, path in (("output.path", config.output.path), ("privacy.ledger", config.privacy.ledger)):
        local = tables.local_path(path) if path else None
        if local is None:
            continue
        if os.path.exists(local) and not os.path.isdir(local):
            problems.append(f"config key '{key}': {path!r} is a file, not a directory")
    cand = getattr(config.algorithm.params, "candidate_table", None)
    if cand:
        local = tables.local_path(cand)
        if local is not None and not os.path.exists(local):
            problems.append(f"config key 'algorithm.candidate_table': {cand!r} does not exist")
    return problems


def _missing_local_input(config) -> str | None:
    """``input.path`` on this machine's file system (no scheme, or ``file:``) that does not exist, said
    without starting Spark (``dpspark run`` would fail with exit 1 at its first step). A warning, not
    an error: a config is often checked on another machine than the one that runs it. Nothing to say
    for a catalog table, another store, or a Spark Connect deployment (the server's files, not ours)."""
    import os

    from dpspark import tables
    from dpspark.session import remote_url

    path = config.input.path
    local = tables.local_path(path) if path else None
    if local is None or remote_url() is not None or os.path.exists(local):
        return None
    return (f"input.path={path!r} does not exist on this machine ({os.path.abspath(local)}): `dpspark run` here "
            "would fail at its first step (exit 1)")


def _validate_warnings(config) -> list[str]:
    out = []
    b = config.privacy.budget
    if b is not None and (config.privacy.epsilon > b.epsilon or config.privacy.delta > b.delta):
        out.append(f"privacy.epsilon={config.privacy.epsilon:g}, privacy.delta={config.privacy.delta:g} exceed "
                   f"privacy.budget (epsilon={b.epsilon:g}, delta={b.delta:g}): the run will be refused")
    missing = _missing_local_input(config)
    if missing:
        out.append(missing)
    if config.seed is not None:
        out.append(f"seed={config.seed}: the run is NOT PRIVATE (unsafe_fixed_seed)")
    if not config.privacy.ledger:
        from dpspark.runner import UNACCOUNTED_WARNING

        out.append(UNACCOUNTED_WARNING)
    return out


def _ledger_command(args, spark) -> int:
    import math
    from datetime import timedelta

    from dpspark.privacy.ledger import EVENT_STATUSES, parse_utc, utc_iso

    def invalid(message: str) -> int:
        print(f"dpspark: invalid argument: {message}", file=sys.stderr)
        return EXIT_CONFIG

    selection: dict = {}  # ledger show's event filters (public values, checked before Spark starts)
    described: list[str] = []
    if args.ledger_command == "show":
        from dpspark.tables import RUN_ID_PATTERN

        if args.run_id is not None:
            if not RUN_ID_PATTERN.match(args.run_id):
                return invalid(f"--run-id {args.run_id!r} is not a run id: 1-128 letters, digits, '.', '_' or '-', "
                               "starting with a letter or digit")
            selection["run_id"] = args.run_id
            described.append(f"run id {args.run_id}")
        if args.status is not None:
            statuses = [s.strip() for value in args.status for s in value.split(",")]
            for status in statuses:
                if status not in EVENT_STATUSES:
                    return invalid(f"--status {status!r} is not an event status: use one of {', '.join(EVENT_STATUSES)}")
            selection["statuses"] = list(dict.fromkeys(statuses))
            described.append("status " + ",".join(selection["statuses"]))
        for flag in ("since", "until"):
            text = getattr(args, flag)
            if text is None:
                continue
            try:
                when, date_only = parse_utc(text)
                # --until is inclusive: the bound passed on is exclusive (the next day, or the next microsecond)
                bound = when if flag == "since" else when + (timedelta(days=1) if date_only else timedelta(microseconds=1))
            except (ValueError, OverflowError):
                return invalid(f"--{flag} {text!r} is not an ISO 8601 date or timestamp (e.g. 2024-05-01 or "
                               "2024-05-01T12:00:00Z; UTC unless it names an offset)")
            selection[flag] = bound
            described.append(f"{flag} " + (when.date().isoformat() if date_only else utc_iso(when))
                             + (" (the whole day)" if flag == "until" and date_only else ""))
        if "since" in selection and "until" in selection and selection["since"] >= selection["until"]:
            return invalid(f"--since {args.since!r} is after --until {args.until!r}: no event can be in between")
        if args.last is not None:
            try:
                last = int(args.last)
            except ValueError:
                last = 0
            if last < 1:
                return invalid(f"--last must be a whole number >= 1, got {args.last!r}")
            selection["last"] = last
            described.append(f"the {last} newest")
    if args.ledger_command == "set-budget":
        if not (math.isfinite(args.epsilon) and args.epsilon > 0):
            print(f"dpspark: invalid argument: --epsilon must be a finite number > 0, got {args.epsilon}", file=sys.stderr)
            return EXIT_CONFIG
        if not (0 <= args.delta < 1):
            print(f"dpspark: invalid argument: --delta must be in [0, 1), got {args.delta}", file=sys.stderr)
            return EXIT_CONFIG
    try:
        from dpspark import tables
        from dpspark.privacy.ledger import Ledger

        if spark is None and args.ledger_command == "show":
            shown = _show_without_spark(args, selection, described)
            if shown is not None:
                return shown
        if spark is None:
            from dpspark.session import build_session, uses_object_store

            spark = build_session(app_name="dpspark-ledger", small_job=True,  # a few small-table operations
                                  object_store=uses_object_store(args.ledger, getattr(args, "input", None),
                                                                 getattr(args, "table", None)))
        ledger = Ledger(spark, tables.qualify(args.ledger))
        if args.ledger_command == "set-public":
            key = tables.ledger_key_of(spark, args.table, "delta")
            try:
                ledger.set_public(key, table_seen=tables.qualify(args.table), note=args.note)
            except ValueError as exc:
                return invalid(f"--table: {exc}")
            print(f"ledger {ledger.path}: table {tables.qualify(args.table)} (key {key}) declared PUBLIC: configs charged "
                  "to this ledger may read it as public data (e.g. algorithm.candidate_table)")
            return EXIT_OK
        if args.ledger_command == "set-budget":
            key = tables.ledger_key_of(spark, args.input)
            totals = ledger.set_budget(key, args.epsilon, args.delta, guarantee=args.guarantee,
                                       input_seen=tables.qualify(args.input), note=args.note)
            print(f"ledger {ledger.path}: input {tables.qualify(args.input)} (key {key}) {args.guarantee} budget set to "
                  f"epsilon={args.epsilon:g}, delta={args.delta:g}; spent so far epsilon={totals.spent_epsilon:g}, "
                  f"delta={totals.spent_delta:g}")
            return EXIT_OK
        if not ledger.exists():
            print(f"dpspark: no ledger at {ledger.path}", file=sys.stderr)
            return EXIT_FAILURE
        key = tables.ledger_key_of(spark, args.input) if args.input else None
        return _print_ledger(args, ledger, key, selection, described)
    except DPSparkError as exc:
        print(f"dpspark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        print(f"dpspark: ledger {args.ledger_command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _print_ledger(args, ledger, key, selection: dict, described: list) -> int:
    from dpspark.privacy.ledger import utc_iso

    balances, events = ledger.balances(key), ledger.events(key, **selection)
    public = [p for p in ledger.public_tables() if key is None or p["table_key"] == key]
    if args.json:
        events = [{**e, "updated_at": utc_iso(e.get("updated_at"))} for e in events]
        public = [{**p, "updated_at": utc_iso(p.get("updated_at"))} for p in public]
        print(json.dumps({"ledger": ledger.path, "balances": balances, "public_tables": public, "events": events},
                         default=str))
    else:
        print(format_ledger(ledger.path, balances, events, selection="; ".join(described) or None, public=public))
    return EXIT_OK


def _show_without_spark(args, selection: dict, described: list) -> int | None:
    """``dpspark ledger show`` of a local ledger (and a local ``--input``) read by delta-rs, without
    starting Spark (``dpspark.localdelta``); None when only Spark can read them (the caller then does)."""
    from dpspark import tables
    from dpspark.privacy.ledger import Ledger
    from dpspark.session import remote_url

    if remote_url():
        return None
    ledger = Ledger(None, tables.qualify(args.ledger))
    if not ledger.exists_without_spark():
        return None
    key = None
    if args.input:
        key = tables.ledger_key_without_spark(args.input)
        if key is None:
            return None
    return _print_ledger(args, ledger, key, selection, described)


def _g(value) -> str:
    return "-" if value is None else f"{value:.6g}"


def format_ledger(path: str, balances: list[dict], events: list[dict], selection: str | None = None,
                  public: list[dict] | None = None) -> str:
    """``dpspark ledger show``'s text: balances, then the events (times in UTC, ``...Z``); a refused
    run's event says what it asked for and what its budget had left. ``selection``: how the events
    were selected (``--run-id``, ``--status``, ...), said in their heading."""
    from datetime import datetime

    from dpspark.privacy.ledger import utc_iso

    lines = [f"ledger {path}", "", "balances (cap set by `dpspark ledger set-budget`; a run can only ask for less):"]
    if not balances:
        lines.append("  (none)")
    for b in balances:
        lines.append(f"  {b['input_seen'] or b['input_key']}  [{b['guarantee']}]  key {b['input_key']}")
        lines.append(f"      cap epsilon={_g(b['cap_epsilon'])} delta={_g(b['cap_delta'])}   spent epsilon={_g(b['spent_epsilon'])} "
                     f"delta={_g(b['spent_delta'])}   remaining epsilon={_g(b['remaining_epsilon'])} delta={_g(b['remaining_delta'])}")
    if public:
        lines += ["", "public tables (declared by `dpspark ledger set-public`; configs may read them as public data):"]
        for p in public:
            when = p.get("updated_at")
            when = utc_iso(when, "seconds") if isinstance(when, datetime) else str(when)[:19]
            lines.append(f"  {p['table_seen'] or p['table_key']}  key {p['table_key']}  by {p.get('actor')} {when}"
                         + (f"  ({p['note']})" if p.get("note") else ""))
    lines += ["", f"events (oldest first{'; only ' + selection if selection else ''}; times UTC):"]
    if not events:
        lines.append("  (none)")
    for e in events:
        when = e.get("updated_at")
        when = utc_iso(when, "seconds") if isinstance(when, datetime) else str(when)[:19]
        if e["kind"] == "admin" and e["status"] == "set-public":
            lines.append(f"  {when}  {e['status']:<10} by {e.get('actor')}  table {e.get('input_seen') or e['input_path']}"
                         + (f"  ({e['note']})" if e.get("note") else ""))
        elif e["kind"] == "admin":
            lines.append(f"  {when}  {e['status']:<10} {e.get('guarantee') or 'central'} cap epsilon={_g(e.get('cap_epsilon'))} "
                         f"delta={_g(e.get('cap_delta'))} by {e.get('actor')}  input {e.get('input_seen') or e['input_path']}"
                         + (f"  ({e['note']})" if e.get("note") else ""))
        else:
            attempt = f" attempt {e['attempt']}" if e.get("attempt") is not None else ""
            charge = f" epsilon={_g(e['epsilon'])} delta={_g(e['delta'])}" if e["status"] == "charged" else ""
            if e["status"] == "refused" and e.get("asked_epsilon") is not None:
                charge = (f" asked epsilon={_g(e['asked_epsilon'])} delta={_g(e.get('asked_delta'))}; "
                          + ("no cap in the ledger" if e.get("remaining_epsilon") is None else
                             f"remaining epsilon={_g(e['remaining_epsilon'])} delta={_g(e.get('remaining_delta'))}"))
            lines.append(f"  {when}  {e['status']:<10} run {e['run_id']}{attempt}{charge}"
                         + (f" [{e['guarantee']}]" if e.get("guarantee") else "") + (f"  {e['note']}" if e.get("note") else ""))
    return "\n".join(lines)


def _print_result(result) -> None:
    s = result.summary
    print(f"run {s['run_id']} (attempt {s.get('attempt', 1)}): {s['status']} ({s['algorithm']}, {s['objective']}, k={s['k']})")
    print(f"privacy spent: epsilon={s['epsilon_spent']:.6g}, delta={s['delta_spent']:.3g}"
          + (f" [{s['guarantee']} DP]" if s.get("guarantee") == "local" else "")
          + ("   [fixed seed: testing aid, NOT PRIVATE]" if not s.get("private", True) else "")
          + (f"   (reused the charge of attempt {s['charge_reused_from']})" if s.get("charge_reused_from") else ""))
    print("released centers (original units) and noisy weights:")
    names = s["feature_names"]
    print("  " + "  ".join(f"{n:>12s}" for n in names) + "  noisy_weight")
    for center, weight in zip(s["centers"], s["noisy_weights"]):
        print("  " + "  ".join(f"{v:12.5g}" for v in center) + f"  {weight:12.1f}")
    print("outputs:")
    width = max((len(key) for key in s["outputs"]), default=0)
    for key, path in s["outputs"].items():
        print(f"  {key:{width}s} {path}")


if __name__ == "__main__":
    sys.exit(main())
