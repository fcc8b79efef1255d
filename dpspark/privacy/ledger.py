"""The persistent privacy ledger: a Delta table of what each input table has spent.

Rows (one table, column ``kind`` tells them apart):

- ``balance``: one row per input table (by path): the total epsilon and delta
  charged to it by every run so far;
- ``run``: an append-only log of run events: ``charged`` (with the epsilon and
  delta charged), then ``succeeded`` or ``failed``; or ``refused`` (charged 0).

Charging is one Delta MERGE on the balance row whose update and insert clauses
carry the budget condition, so the check and the charge are a single
transaction on one snapshot. Two runs that charge the same input at the same
moment both rewrite the balance row: Delta's optimistic concurrency lets one
commit and fails the other with a concurrent-modification error; the loser
retries on the new snapshot, where the budget condition now sees the winner's
charge. So two runs can never both pass when the budget allows only one.

The charge is written before any data is read and before any result is
released; a run that fails afterwards stays charged and is marked ``failed``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from dpspark.errors import BudgetRefused

log = logging.getLogger("dpspark")

SCHEMA = (
    "entry_id STRING, kind STRING, input_path STRING, run_id STRING, algorithm STRING, "
    "epsilon DOUBLE, delta DOUBLE, status STRING, updated_at TIMESTAMP"
)
REL_TOL = 1e-12
MAX_ATTEMPTS = 40

# The ledger holds a few rows per run. Spark's and Delta's defaults (200 shuffle partitions,
# 50 snapshot partitions) are sized for big tables: under spark-submit, where dpspark leaves
# the session's settings alone, they made one charge cost 10-45 s instead of about 3 s
# (measured on 2 cores). Ledger operations run with these, and put the session's own back.
_LEDGER_CONF = {"spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1"}


@contextlib.contextmanager
def _ledger_conf(spark):
    saved = {key: spark.conf.get(key, None) for key in _LEDGER_CONF}
    for key, value in _LEDGER_CONF.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _small_table(method):
    """Run a Ledger method with the ledger's settings (``_LEDGER_CONF``)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with _ledger_conf(self.spark):
            return method(self, *args, **kwargs)

    return wrapper


def _balance_id(input_path: str) -> str:
    return "balance:" + hashlib.sha256(input_path.encode()).hexdigest()[:32]


def _is_conflict(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return any(word in text for word in (
        "Concurrent", "ProtocolChanged", "MetadataChanged", "DELTA_CONCURRENT", "already exists",
        "DELTA_TABLE_ALREADY_EXISTS", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED",
        # another run is creating the ledger right now: its first commit is not there yet
        # (seen as either error; DELTA_TABLE_NOT_FOUND in a fresh-clone run, two CLI runs at once)
        "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "DELTA_TABLE_NOT_FOUND",
    ))


@dataclass(frozen=True)
class LedgerTotals:
    input_path: str
    spent_epsilon: float
    spent_delta: float
    budget_epsilon: float | None
    budget_delta: float | None

    def as_dict(self) -> dict:
        return {
            "input_path": self.input_path,
            "spent_epsilon": self.spent_epsilon,
            "spent_delta": self.spent_delta,
            "budget_epsilon": self.budget_epsilon,
            "budget_delta": self.budget_delta,
            "remaining_epsilon": None if self.budget_epsilon is None else max(0.0, self.budget_epsilon - self.spent_epsilon),
            "remaining_delta": None if self.budget_delta is None else max(0.0, self.budget_delta - self.spent_delta),
        }


class Ledger:
    def __init__(self, spark, path: str):
        self.spark = spark
        self.path = path

    # -- table --------------------------------------------------------------------

    def _ensure_table(self):
        from delta.tables import DeltaTable

        for attempt in range(MAX_ATTEMPTS):
            try:
                if not DeltaTable.isDeltaTable(self.spark, self.path):
                    DeltaTable.createIfNotExists(self.spark).location(self.path).addColumns(self.spark.createDataFrame([], SCHEMA).schema).execute()
                return DeltaTable.forPath(self.spark, self.path)
            except Exception as exc:  # concurrent creation by another run
                if not _is_conflict(exc) or attempt == MAX_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.05, 0.3))
        raise RuntimeError("unreachable")

    def _now(self):
        return datetime.now(timezone.utc).replace(tzinfo=None)

    # -- charging -----------------------------------------------------------------

    @_small_table
    def charge(self, input_path: str, run_id: str, algorithm: str, epsilon: float, delta: float,
               budget_epsilon: float | None, budget_delta: float | None) -> LedgerTotals:
        """Charge (epsilon, delta) to ``input_path``, or raise ``BudgetRefused`` (recording the refusal)."""
        from pyspark.sql import functions as F

        source = self.spark.createDataFrame(
            [(_balance_id(input_path), "balance", input_path, None, None, float(epsilon), float(delta), "total", self._now())],
            SCHEMA,
        ).alias("s")
        if budget_epsilon is None:
            fits_update = F.lit(True)
            fits_insert = F.lit(True)
        else:
            b_eps = budget_epsilon * (1 + REL_TOL)
            b_delta = (budget_delta or 0.0) * (1 + REL_TOL)
            fits_update = (F.col("t.epsilon") + F.col("s.epsilon") <= F.lit(b_eps)) & (F.col("t.delta") + F.col("s.delta") <= F.lit(b_delta))
            fits_insert = (F.col("s.epsilon") <= F.lit(b_eps)) & (F.col("s.delta") <= F.lit(b_delta))
        charged = False
        for attempt in range(MAX_ATTEMPTS):
            try:
                table = self._ensure_table()  # again on a retry: a half-created ledger is seen afresh
                metrics = (
                    table.alias("t")
                    .merge(source, "t.entry_id = s.entry_id")
                    .whenMatchedUpdate(condition=fits_update, set={
                        "epsilon": "t.epsilon + s.epsilon",
                        "delta": "t.delta + s.delta",
                        "updated_at": "s.updated_at",
                    })
                    .whenNotMatchedInsertAll(condition=fits_insert)
                    .execute()
                    .first()
                )
                changed = int(metrics["num_updated_rows"]) + int(metrics["num_inserted_rows"])
                charged = changed == 1
                break
            except Exception as exc:
                if not _is_conflict(exc) or attempt == MAX_ATTEMPTS - 1:
                    raise
                log.info("ledger: concurrent charge on %s, retrying (attempt %d)", input_path, attempt + 2)
                time.sleep(random.uniform(0.05, 0.5))
        totals = self.totals(input_path, budget_epsilon, budget_delta)
        if not charged:
            self._append_event(input_path, run_id, algorithm, 0.0, 0.0, "refused")
            raise BudgetRefused(
                f"privacy budget refused for input {input_path!r}: this run needs epsilon={epsilon:g}, delta={delta:g}; "
                f"already spent epsilon={totals.spent_epsilon:g}, delta={totals.spent_delta:g} of the budget "
                f"epsilon={budget_epsilon:g}, delta={(budget_delta or 0.0):g} (ledger {self.path})"
            )
        self._append_event(input_path, run_id, algorithm, epsilon, delta, "charged")
        return totals

    @_small_table
    def mark(self, input_path: str, run_id: str, status: str) -> None:
        """Record a run's new status (``succeeded`` or ``failed``); its charge is never given back."""
        self._append_event(input_path, run_id, None, 0.0, 0.0, status)

    def _append_event(self, input_path, run_id, algorithm, epsilon, delta, status) -> None:
        """Append one run event. Blind appends never conflict with other transactions."""
        row = (f"run:{run_id}:{status}:{uuid.uuid4().hex[:12]}", "run", input_path, run_id, algorithm,
               float(epsilon), float(delta), status, self._now())
        self.spark.createDataFrame([row], SCHEMA).coalesce(1).write.format("delta").mode("append").save(self.path)

    # -- reading ------------------------------------------------------------------

    @_small_table
    def totals(self, input_path: str, budget_epsilon=None, budget_delta=None) -> LedgerTotals:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        row = None
        if DeltaTable.isDeltaTable(self.spark, self.path):  # no ledger yet: nothing was ever charged
            row = (
                self.spark.read.format("delta").load(self.path)
                .where(F.col("entry_id") == _balance_id(input_path))
                .select("epsilon", "delta").first()
            )
        return LedgerTotals(
            input_path=input_path,
            spent_epsilon=float(row["epsilon"]) if row else 0.0,
            spent_delta=float(row["delta"]) if row else 0.0,
            budget_epsilon=budget_epsilon,
            budget_delta=budget_delta if budget_epsilon is not None else None,
        )

    @_small_table
    def runs(self, input_path: str | None = None):
        """The run events (charged, refused, succeeded, failed), oldest first, as dicts."""
        df = self.spark.read.format("delta").load(self.path).where("kind = 'run'")
        if input_path is not None:
            df = df.where(df.input_path == input_path)
        return [r.asDict() for r in df.orderBy("updated_at").collect()]
