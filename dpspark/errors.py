"""The project's exceptions, one per exit code of the command line.

- ``ConfigError``: invalid config or arguments (exit 2), raised before Spark starts.
- ``BudgetRefused``: the privacy ledger refuses the run (exit 3).
- ``SchemaError`` and every other ``DPSparkError``: any other failure (exit 1).
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


class SchemaError(DPSparkError):
    """The input table is missing, or a feature column is missing or not numeric."""

    exit_code = 1


class PrivacyAccountingError(DPSparkError):
    """An algorithm tried to spend more than its budget, or less than it declared.

    This is a bug in an algorithm, never a user error: the run fails loudly.
    """

    exit_code = 1


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
