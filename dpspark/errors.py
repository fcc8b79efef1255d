"""The project's exceptions, one per exit code of the command line.

- ``ConfigError``: invalid config or arguments (exit 2), raised before Spark starts.
- ``BudgetRefused``: the privacy ledger refuses the run (exit 3).
- ``ColumnError``: the config names a column the input table lacks, or one of the wrong type or
  size (exit 2, like any config mistake; also a ``SchemaError`` for callers that catch that).
- ``SchemaError`` and every other ``DPSparkError``: any other failure (exit 1), e.g. a missing table.
- ``PythonWorkersError``: Spark's Python workers cannot start or lack dpspark's executor modules
  (exit 1, found before any charge by ``dpspark.session.check_python_workers``).
- ``LineageError``: a DataFrame handed to ``dpspark.ml`` reads something other than its ledgerInput
  (exit 1; raised by ``dpspark.lineage`` and ``dpspark.connect_plan``).
- ``RunFailed``: an error that is not dpspark's own, raised once a fit had started (exit 1): it
  names the error's type only (see ``for_the_analyst``).
"""


class DPSparkError(Exception):
    """Base class of every error dpspark raises on purpose."""

    exit_code = 1


class ConfigError(DPSparkError):
    """A config key or command-line argument is invalid. Names the key."""

    exit_code = 2

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"config key '{key}': {message}")


class BudgetRefused(DPSparkError):
    """The privacy ledger would be overspent by this run."""

    exit_code = 3


class LineageError(DPSparkError, ValueError):
    """The DataFrame reads something other than ledgerInput (or its plan cannot be checked)."""


class SchemaError(DPSparkError):
    """The input table (or its requested version) is missing or cannot be read as configured."""

    exit_code = 1


class ColumnError(ConfigError, SchemaError):
    """A config key names a column the input lacks, or one of the wrong type or size (exit 2).

    Found once the table's schema is read (after Spark starts, before any charge). The message
    names the key, the column and what the table has; it is kept as written (no prefix)."""

    exit_code = 2

    def __init__(self, key: str, message: str):
        self.key = key
        DPSparkError.__init__(self, message)


class PythonWorkersError(DPSparkError):
    """Spark's Python workers (the executors' Python: ``PYSPARK_PYTHON``, ``spark.pyspark.python``, or
    a Spark Connect server's own environment) cannot start, or cannot import what dpspark's passes
    need (numpy, pandas, pyarrow, dpspark's executor modules). Found by one job over ``spark.range``
    before any charge (``dpspark.session.check_python_workers``); the message names the Python and
    what to fix, never a data value (there is none in that job).

    Exit 1, not 2: exit 2 is a mistake in the config or the arguments, which the analyst fixes; this
    is the deployment's environment (the administrator's), as a table that cannot be read is, and a
    scheduler's retry costs nothing (nothing was charged) and succeeds once the environment is fixed.
    ``executable``: the workers' Python when known; ``module``: the first module they lack, if any."""

    exit_code = 1

    def __init__(self, message: str, executable: str | None = None, module: str | None = None):
        self.executable, self.module = executable, module
        super().__init__(message)


class PrivacyAccountingError(DPSparkError):
    """An algorithm tried to spend more than its budget, or less than it declared.

    This is a bug in an algorithm, never a user error: the run fails loudly.
    """

    exit_code = 1


class RunFailed(DPSparkError):
    """A run or fit failed, after its fit started, with an error that is not dpspark's own.

    Such an error (a Spark cast error, a Python worker's traceback) may quote a private value, so
    the analyst gets its TYPE and a fixed message only; the error itself, with its traceback, goes
    to the operator log (``$DPSPARK_OPERATOR_LOG``, see dpspark.progress). ``error_type``: the
    original exception's class name.
    """

    exit_code = 1

    def __init__(self, error_type: str, connect: bool = False):
        import os

        self.error_type = str(error_type)
        if os.environ.get("DPSPARK_OPERATOR_LOG"):
            where = "details are in the attempt's operator record ($DPSPARK_OPERATOR_LOG, the administrator's)"
        else:
            where = ("the details were not kept: $DPSPARK_OPERATOR_LOG is not set (the administrator sets it, "
                     "where the analyst cannot read it)")
        if connect:
            where += "; on Spark Connect, a failed Spark job's cause is also in the Connect server's log"
        super().__init__(f"the fit failed ({self.error_type}); {where}")


def for_the_analyst(exc: BaseException, fit_started: bool, connect: bool = False) -> BaseException:
    """The exception to hand to the analyst (the Python caller, the command line) for ``exc``.

    Before the fit starts no private value has been read: ``exc`` as it is. After: dpspark's own
    errors (``DPSparkError``, whose messages name keys and public values only) and the exceptions
    that carry no text of the data (``RunKilled``, ``KeyboardInterrupt``, ...: not an
    ``Exception``) are kept, with their chain (``__cause__``, ``__context__``) dropped, since a
    chained error may quote a value; any other error becomes ``RunFailed(type)``. Format the
    operator's traceback of ``exc`` BEFORE calling this (the chain is dropped here). Raise the result
    OUTSIDE the ``except`` block that caught ``exc`` (``raise ... from None`` inside it would still
    keep ``exc`` as ``__context__``).
    """
    if not fit_started:
        return exc
    if isinstance(exc, DPSparkError) or not isinstance(exc, Exception):
        exc.__cause__ = None
        exc.__context__ = None
        exc.__suppress_context__ = True
        return exc
    return RunFailed(type(exc).__name__, connect)


class RunKilled(BaseException):
    """The run was stopped by a signal (SIGTERM from a scheduler's timeout, SIGINT from Ctrl-C).

    A ``BaseException`` so that no ``except Exception`` on the way swallows it; the runner records
    the attempt as ``killed`` and the command line exits with 128 + the signal number.
    """

    def __init__(self, signum: int):
        import signal

        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = str(self.signum)
        super().__init__(f"stopped by {name}")
