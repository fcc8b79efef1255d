"""dpspark's log: one line per Spark pass and per driver step, and who sees which line.

Two audiences (docs/privacy.md, "Operational metadata is NON-PRIVATE"):

- the ANALYST sees the ``dpspark`` logger (on stderr once ``configure_logging`` ran);
- the OPERATOR (the deployment, run by the administrator) sees the ``dpspark.operator`` logger and,
  when ``$DPSPARK_OPERATOR_LOG`` is set, one JSON record per attempt (``dpspark.runner``) holding
  every dpspark line of that attempt at INFO, collected by ``capture``.

Some lines carry values computed from the data: step durations, maxcover's histogram sizes and
fallbacks, ldp's report counts, a failed fit's traceback. In an ACCOUNTED run or fit (it has a
privacy ledger; the command line, the runner and ``DPClustering.fit`` enter ``accounted(True)``) the
analyst must see only DP outputs and public values, so while it is on:

- ``step`` logs "<step> ..." and "<step> done" on ``dpspark`` and "<step> done in 1.23s" on
  ``dpspark.operator`` only; a ``step(..., data_dependent=True)`` (a step whose occurrence itself depends on
  the data, e.g. maxcover's per-pick histogram jobs) logs on ``dpspark.operator`` only;
- ``detail(...)`` lines go to ``dpspark.operator`` only.

A failure's traceback (which may quote a record) is on ``dpspark.operator`` only, accounted or not
(``log_trouble``, and the runner's and ``DPClustering.fit``'s failure path): the analyst sees the
error's type and a fixed message (dpspark.errors.for_the_analyst).

In an unaccounted run (no ledger: nothing bounds what it shows, and its analyst may repeat it at
will) every line is on ``dpspark`` as it always was ("<step> done in 1.23s": scripts/bench_scale.py
parses these lines of ledger-less runs). ``dpspark.operator`` never propagates to the analyst's
handlers (it has a NullHandler); an administrator may attach a handler of their own to it.

The switch is process-wide (a counter: on while any accounted run or fit is under way), so a
concurrent unaccounted fit in another thread is quiet too, never the other way round.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

log = logging.getLogger("dpspark")
operator_log = logging.getLogger("dpspark.operator")
operator_log.propagate = False
operator_log.setLevel(logging.INFO)
operator_log.addHandler(logging.NullHandler())  # never Python's last-resort handler (stderr)

OPERATOR_LOG_ENV = "DPSPARK_OPERATOR_LOG"  # set by the deployment only: never a config key

_lock = threading.Lock()
_accounted = 0  # number of accounted runs or fits under way
_hidden = 0  # number of fits under way whose inner lines are the operator's (step(..., hide_inside=True))


class _InsideTheFit(logging.Filter):
    """On the ``dpspark`` logger: in an accounted run, while a fit is under way, INFO lines (the
    passes' step lines and every other progress line) go to the operator's log only. Their values
    may be public, but their timestamps give each pass's duration, and which passes run (a
    fallback, a shrunk set) depends on the data. Warnings still reach the analyst."""

    def filter(self, record):
        if _hidden > 0 and _accounted > 0 and record.levelno < logging.WARNING:
            operator_log.handle(record)
            return False
        return True


log.addFilter(_InsideTheFit())


LOG_LEVEL_ENV = "DPSPARK_LOG_LEVEL"  # DEBUG shows every pass's line (one per maxcover threshold, dplloyd iteration)


def default_level() -> int:
    """INFO, or ``$DPSPARK_LOG_LEVEL`` (a logging level name: DEBUG, INFO, WARNING, ERROR)."""
    name = os.environ.get(LOG_LEVEL_ENV, "").strip().upper()
    value = logging.getLevelName(name) if name else logging.INFO
    return value if isinstance(value, int) else logging.INFO


def configure_logging(level: int | None = None, stream=None) -> None:
    """Show dpspark's log lines ("[dpspark] 12:00:01 maxcover: fit done in 3.20s") on ``stream``.

    The command line and ``dpspark.session.get_session()`` call it. From Python with a session of
    your own, call it once to see the step lines (the ``dpspark`` logger has no handler until then,
    so only warnings reach stderr):

        from dpspark.progress import configure_logging
        configure_logging()                  # INFO lines on stderr; configure_logging(logging.WARNING) for fewer

    ``level``: default ``default_level()`` (INFO unless ``$DPSPARK_LOG_LEVEL`` says otherwise; a
    loop's per-pass lines are DEBUG). ``stream``: where the lines go (default ``sys.stderr``). Calling it again changes the level and,
    when given, the stream of dpspark's handler; a handler you added to the ``dpspark`` logger
    yourself is left alone (and then no second one is added).
    """
    ours = [h for h in log.handlers if getattr(h, "_dpspark", False)]
    if ours and stream is not None:
        ours[0].use(stream)
    elif not [h for h in log.handlers if not isinstance(h, (_Collector, _LastResort))]:
        handler = _Handler(stream)
        handler.setFormatter(logging.Formatter("[dpspark] %(asctime)s %(message)s", "%H:%M:%S"))
        handler._dpspark = True
        log.addHandler(handler)
    log.setLevel(default_level() if level is None else level)
    log.propagate = False


class _Handler(logging.StreamHandler):
    """Writes to the given stream, or else to the CURRENT ``sys.stderr`` (not the one at set-up time,
    which a test runner or a notebook may have replaced and closed since)."""

    def __init__(self, stream=None):
        super().__init__(stream)
        self.fixed = stream

    def use(self, stream) -> None:
        self.fixed = stream
        self.stream = stream if stream is not None else sys.stderr  # no flush of a stream that may be closed

    def emit(self, record):
        if self.fixed is None:
            self.stream = sys.stderr
        super().emit(record)


@contextlib.contextmanager
def accounted(on: bool = True):
    """While inside (and ``on``): the analyst's log shows no data-dependent value (module docstring)."""
    global _accounted
    if not on:
        yield
        return
    with _lock:
        _accounted += 1
    try:
        yield
    finally:
        with _lock:
            _accounted -= 1


def is_accounted() -> bool:
    return _accounted > 0


def detail(message: str, *args, level: int = logging.INFO, exc_info=None) -> None:
    """A line with values computed from the data: the operator's log only in an accounted run, else
    the dpspark log (as ``log.log(level, message, *args)``)."""
    (operator_log if is_accounted() else log).log(level, message, *args, exc_info=exc_info)


def log_trouble(message: str, *args) -> None:
    """Log an error met while handling another one (call it in the ``except`` block): its traceback
    chains the error being handled, which may quote a private value, so the analyst's log gets
    ``message`` and the error's type, the operator's log the traceback."""
    exc = sys.exc_info()[1]
    log.error(message + " (%s; details in the operator log)", *args, type(exc).__name__)
    operator_log.error(message, *args, exc_info=True)


@contextlib.contextmanager
def step(name: str, timings: dict | None = None, data_dependent: bool = False, hide_inside: bool = False,
         repeated: bool = False):
    """Log ``name`` and its duration; record the duration in ``timings`` if given.

    In an accounted run the duration goes to the operator's log only, and a ``data_dependent`` step (one
    that runs or not depending on the data) is not on the analyst's log at all. ``hide_inside`` (the
    fit): in an accounted run every INFO line logged while inside goes to the operator's log only
    (``_InsideTheFit``); the step's own two lines stay (the whole fit's time is the analyst's anyway).
    ``repeated``: one pass of a loop (a maxcover threshold, a dplloyd iteration): its lines are DEBUG
    on the analyst's log (the loop logs one line of its own), still timed into ``timings``."""
    global _hidden
    quiet = is_accounted()
    shown = operator_log if quiet and data_dependent else log
    level = logging.DEBUG if repeated and shown is log else logging.INFO
    start = time.perf_counter()
    shown.log(level, "%s ...", name)
    if hide_inside:
        with _lock:
            _hidden += 1
    ended = "done"
    try:
        yield
    except BaseException:
        ended = "stopped"  # not "done": e.g. a charge the ledger refused must not read as charged
        raise
    finally:
        if hide_inside:
            with _lock:
                _hidden -= 1
        seconds = time.perf_counter() - start
        if quiet:
            if shown is log:
                log.log(level, "%s %s", name, ended)
            operator_log.info("%s %s in %.2fs", name, ended, seconds)
        else:
            log.log(level, "%s %s in %.2fs", name, ended, seconds)
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + seconds


# ---------------------------------------------------------------------------------------------
# The operator's copy of an attempt's lines

MAX_CAPTURED_LINES = 20_000


class _Collector(logging.Handler):
    """Keeps the formatted lines (INFO and above, with tracebacks) of ``dpspark`` and ``dpspark.operator``."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.dropped = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))

    def emit(self, record):
        if len(self.lines) < MAX_CAPTURED_LINES:
            self.lines.append(self.format(record))
        else:
            self.dropped += 1


class _AtLeast(logging.Filter):
    """On the analyst's handlers while ``capture`` lowers the dpspark logger to INFO: they still
    receive only the dpspark records they received before (at or above ``level``)."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record):
        return record.levelno >= self.level or not (record.name == "dpspark" or record.name.startswith("dpspark."))


class _LastResort(logging.Handler):
    """Python's last-resort handler (warnings to stderr when no handler is configured), which a
    collector on the dpspark logger would otherwise switch off."""

    def __init__(self, level: int):
        super().__init__(level)

    def emit(self, record):
        fallback = logging.lastResort
        if fallback is not None and record.levelno >= fallback.level:
            fallback.handle(record)


_collectors: list = []
_undo: list = []  # how to put the dpspark logger back once the last collector is gone


def _analyst_handlers() -> list:
    handlers, logger = [], log
    while logger is not None:
        handlers += [h for h in logger.handlers if not isinstance(h, _Collector)]
        if not logger.propagate:
            break
        logger = logger.parent
    return handlers


def _install(collector: _Collector) -> None:
    if not _collectors:
        effective = log.getEffectiveLevel()
        handlers = _analyst_handlers()
        if not handlers:  # what Python does when no handler is found: the last-resort one
            fallback = _LastResort(effective)
            log.addHandler(fallback)
            _undo.append(lambda: log.removeHandler(fallback))
        elif effective > logging.INFO:
            gate = _AtLeast(effective)
            for h in handlers:
                h.addFilter(gate)
                _undo.append(lambda h=h: h.removeFilter(gate))
        if effective > logging.INFO:
            level = log.level
            log.setLevel(logging.INFO)
            _undo.append(lambda: log.setLevel(level))
    _collectors.append(collector)
    log.addHandler(collector)
    operator_log.addHandler(collector)


def _uninstall(collector: _Collector) -> None:
    log.removeHandler(collector)
    operator_log.removeHandler(collector)
    if collector in _collectors:
        _collectors.remove(collector)
    if not _collectors:
        while _undo:
            _undo.pop()()


@contextlib.contextmanager
def capture():
    """Collect every dpspark line (``dpspark`` and ``dpspark.operator``, INFO and above, any thread)
    while inside; yields the list the lines are appended to. When the dpspark logger was above INFO,
    it is lowered to INFO meanwhile, and the analyst's handlers keep their former threshold."""
    collector = _Collector()
    with _lock:
        _install(collector)
    try:
        yield collector.lines
    finally:
        with _lock:
            _uninstall(collector)
        if collector.dropped:
            collector.lines.append(f"... {collector.dropped} more lines not kept (limit {MAX_CAPTURED_LINES})")
