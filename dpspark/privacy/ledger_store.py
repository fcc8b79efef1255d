"""The Delta storage behind the privacy ledger (``dpspark.privacy.ledger``, which holds the
balance, its rules and the event log's meaning): the table's schema, its creation and upgrade, the
Spark SQL ``MERGE`` and appends, the delta-rs reads and appends of a local ledger, the retries on
Delta's write conflicts, and whether the storage lets two drivers commit one version.

Charging is one Delta UPDATE of the balance row, whose WHERE clause carries the budget condition
(the cap read from the same row, and the run's lower request), so the check and the charge are a
single transaction on one snapshot. Two runs that charge the same input at the same moment both
rewrite the balance row: Delta's optimistic concurrency lets one commit and fails the other with
a concurrent-modification error; the loser retries on the new snapshot, where the budget condition
now sees the winner's charge. So two runs can never both pass when the budget allows only one.

On a LOCAL ledger the charge, the event appends and the reads are delta-rs's (``dpspark.localdelta``):
the same transactions under the same Delta protocol (a commit is the exclusive creation of the
log's next version, by either writer), in milliseconds where a new driver's first Delta UPDATE
takes seconds; everything else, and every ledger delta-rs cannot read or write, is Spark's.
Otherwise every operation is Spark SQL or a DataFrame read or write on the ledger's path (``CREATE TABLE IF
NOT EXISTS``, ``ALTER TABLE ADD COLUMNS``, ``MERGE INTO`` from a temporary view, ``UPDATE``, appends),
never delta-spark's Python ``DeltaTable`` (which needs the JVM of a classic session): one code path
for a classic session and a Spark Connect one, with the same transactions, so the cap check and the
charge stay one atomic Delta commit on either.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from dpspark import localdelta
from dpspark.delta_sql import not_a_table, table_name
from dpspark.errors import BudgetRefused

SCHEMA = (
    "entry_id STRING, kind STRING, input_path STRING, run_id STRING, algorithm STRING, "
    "epsilon DOUBLE, delta DOUBLE, status STRING, updated_at TIMESTAMP, guarantee STRING, "
    "cap_epsilon DOUBLE, cap_delta DOUBLE, attempt INT, actor STRING, input_seen STRING, note STRING, "
    "asked_epsilon DOUBLE, asked_delta DOUBLE, remaining_epsilon DOUBLE, remaining_delta DOUBLE"
)
COLUMNS = tuple(f.split()[0] for f in SCHEMA.split(", "))
MAX_ATTEMPTS = 40

# The ledger holds a few rows per run. Spark's and Delta's defaults (200 shuffle partitions,
# 50 snapshot partitions) are sized for big tables: under spark-submit, where dpspark leaves
# the session's settings alone, they made one charge cost 10-45 s instead of about 3 s
# (measured on 2 cores). Ledger operations run with these, and put the session's own back.
_LEDGER_CONF = {"spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1"}


@contextlib.contextmanager
def _ledger_conf(spark):
    if spark is None:  # reading a local ledger without Spark (``Ledger._rows_without_spark``)
        yield
        return
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


def _sql_double(value) -> str:
    """A finite float as a Spark SQL DOUBLE literal (``1e-06D``): exact, whatever its magnitude."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return repr(value) + "D"


def _sql_timestamp(when: datetime) -> str:
    """A time as a Spark SQL TIMESTAMP literal that names its offset (``TIMESTAMP '2024-05-01
    12:00:00.123456+00:00'``): the same instant whatever the session's ``spark.sql.session.timeZone``
    (a literal without an offset is read in that zone). A naive ``when`` is UTC."""
    return f"TIMESTAMP '{utc_instant(when).isoformat(sep=' ')}'"


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def utc_instant(value: datetime) -> datetime:
    """``value`` as the ledger writes and returns times: an aware UTC datetime. A naive one is UTC
    (the convention of the callers that give a time, and of ledgers written before times were aware)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _micros(value: datetime) -> int:
    """Microseconds since the epoch of ``value`` (naive: UTC): Spark's ``unix_micros`` of that instant."""
    delta = utc_instant(value) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _instant(micros) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=int(micros))


def _with_instants(df):
    """``df`` with ``updated_at`` as microseconds since the epoch (``unix_micros``), which ``_collect``
    turns into aware UTC datetimes: the instant Delta holds, on a classic or a Connect session,
    whatever the session's and this process's time zones (PySpark would give a naive local time)."""
    from pyspark.sql import functions as F

    if "updated_at" not in df.columns:
        return df
    return df.select(*[F.expr("unix_micros(updated_at)").alias(c) if c == "updated_at" else F.col(c)
                       for c in df.columns])


def _collect(df) -> list[dict]:
    """The rows of a ``_with_instants`` frame as dicts, ``updated_at`` an aware UTC datetime."""
    rows = [r.asDict() for r in df.collect()]
    for row in rows:
        if "updated_at" in row:
            row["updated_at"] = _instant(row["updated_at"])
    return rows


def _is_conflict(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return any(word in text for word in (
        "Concurrent", "ProtocolChanged", "MetadataChanged", "DELTA_CONCURRENT", "already exists",
        "DELTA_TABLE_ALREADY_EXISTS", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED",
        # another run is creating the ledger right now: its first commit is not there yet
        # (seen as either error; DELTA_TABLE_NOT_FOUND in a fresh-clone run, two CLI runs at once)
        "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "DELTA_TABLE_NOT_FOUND",
        # set_budget creates a new ledger with mode "error": another run created it first
        "DELTA_PATH_EXISTS",
    ))


# Whether two drivers can both commit the same ledger version (one charge then silently lost).
# Delta's optimistic concurrency needs the storage to refuse a second writer of a commit file. Its
# stores for HDFS, ADLS Gen2 (abfs) and GCS do (Delta's storage documentation); its S3 store does
# not between drivers (exists-then-PUT), nor its local-disk store (exists-then-rename, and a local
# rename replaces its target). dpspark's ExclusiveCreateLogStore does on s3a:// (conditional PUT)
# and local disks (hard link); Delta's DynamoDB store does on S3.
SINGLE_WRITER_ENV = "DPSPARK_LEDGER_SINGLE_WRITER"
_DELTA_EXCLUSIVE_STORES = {"hdfs": "io.delta.storage.HDFSLogStore", "abfs": "io.delta.storage.AzureLogStore",
                           "abfss": "io.delta.storage.AzureLogStore", "gs": "io.delta.storage.GCSLogStore"}
_EXCLUSIVE_STORES = ("io.dpspark.delta.ExclusiveCreateLogStore", "io.delta.storage.S3DynamoDBLogStore")


@dataclass(frozen=True)
class CommitExclusion:
    """What the ledger's storage and the session's Delta log store give: ``exclusive`` (two drivers can
    never both commit one version; otherwise every charge, budget and claim is refused), and
    ``reason``, which says why (and, when not exclusive, which settings make it so)."""
    exclusive: bool
    reason: str


def _scheme(path: str) -> str:
    """The URI scheme as Delta sees it (case kept: Delta picks a log store by the exact scheme, so an
    unusual spelling such as ``S3A://`` is an unknown scheme here too); no scheme: a local path."""
    head = path.split(":", 1)[0] if ":" in path else ""
    return head if len(head) > 1 and head.isalnum() else "file"


def _session_setting(spark, key: str):
    """A static setting as Delta reads it: the SparkContext's conf (classic), or the server's (Connect)."""
    from dpspark.session import is_connect

    try:
        if is_connect(spark):
            return spark.conf.get(key, None)
        return spark.sparkContext.getConf().get(key, None)
    except Exception:
        return None


def commit_exclusion(spark, path: str) -> CommitExclusion:
    """Does a ledger at ``path`` get exclusive Delta commits between drivers in this session (see above)?"""
    from dpspark.session import EXCLUSIVE_LOG_STORE, LOG_STORE_JAR

    scheme = _scheme(path)
    if (os.environ.get(SINGLE_WRITER_ENV) or "").strip().lower() in ("1", "true", "yes"):
        return CommitExclusion(True, f"${SINGLE_WRITER_ENV} states that one driver writes the ledger")
    store = _session_setting(spark, "spark.delta.logStore.class") or _session_setting(
        spark, f"spark.delta.logStore.{scheme}.impl")
    if store in _EXCLUSIVE_STORES or (scheme in _DELTA_EXCLUSIVE_STORES and store in (None, _DELTA_EXCLUSIVE_STORES[scheme])):
        return CommitExclusion(True, f"{scheme} with {store or _DELTA_EXCLUSIVE_STORES[scheme]}")
    how = (f"start the session with --jars {LOG_STORE_JAR} --conf spark.delta.logStore.{scheme}.impl={EXCLUSIVE_LOG_STORE} "
           f"(dpspark's own sessions do)" if scheme in ("s3a", "file") else
           "keep the ledger on s3a:// (with dpspark's log store), a local disk, hdfs://, abfss:// or gs://")
    reason = (f"the ledger {path} is on {scheme}:, where this session's Delta log store "
              f"({store or 'Delta default'}) does not stop two drivers from committing the same version: two runs "
              f"charging at once could both pass and one charge be lost. To make it safe, {how}; if exactly one "
              f"driver ever writes this ledger, the deployment may state so with ${SINGLE_WRITER_ENV}=1")
    return CommitExclusion(False, reason)




class LedgerStore:
    """The ledger table at ``path`` as storage: rows in and out, in Delta transactions (Spark SQL, or
    delta-rs for a local ledger). ``Ledger`` adds what the rows mean."""

    def __init__(self, spark, path: str):
        self.spark = spark
        self.path = path
        self._ready = False  # the table exists with every column (checked once per instance)
        self._pending: list[tuple] = []  # deferred event rows, written with the next append
        self._lock = threading.Lock()
        self._exclusion_checked = False

    def require_exclusive_commits(self) -> None:
        """Before the first charge, budget or claim: ``BudgetRefused`` (exit 3) when the ledger's
        storage lets two drivers commit the same version (``commit_exclusion``), naming the settings
        that make it safe. A local disk too: Delta's own store for it checks, then renames, and a
        local rename replaces its target, so two spark-submit drivers (or Connect servers) without
        dpspark's store could both commit one version of a ledger on a shared disk."""
        if self._exclusion_checked:
            return
        exclusion = commit_exclusion(self.spark, self.path)
        if not exclusion.exclusive:
            raise BudgetRefused(f"privacy budget refused: {exclusion.reason}")
        self._exclusion_checked = True

    # -- table --------------------------------------------------------------------

    def _columns(self) -> list[str] | None:
        """The ledger table's columns, or None when its path holds no Delta table: the schema of a read
        (the latest snapshot's metadata; no Spark job, no row read), on either kind of session."""
        try:
            return list(self.spark.read.format("delta").load(self.path).columns)
        except Exception as exc:
            if not_a_table(exc):
                return None
            raise

    def exists(self) -> bool:
        return self._columns() is not None

    def require_existing(self, key: str = "privacy.ledger") -> None:
        """``BudgetRefused`` (exit 3) unless a ledger is at this path: a run never creates one (a typo
        in the path would otherwise open a second, empty ledger, and a balance set there would be a
        second budget for the same people). Only the administrator's ``set-budget`` creates a ledger.
        A local ledger is looked up by delta-rs (no Spark job), any other by its schema."""
        if self.exists_without_spark() or self.exists():
            return
        raise BudgetRefused(
            f"privacy budget refused: no ledger at {self.path} ({key}): nothing was created or charged. Check the "
            "path: the ledger is the one the administrator created with `dpspark ledger set-budget --ledger PATH "
            "--input TABLE ...` (a deployment fixes it with $DPSPARK_LEDGER)")

    def _ensure_table(self, create: bool = True, fresh: bool = False) -> bool | None:
        """True once the ledger table exists with every column (created empty if missing and ``create``);
        None when it is missing and not ``create``. The check runs once per Ledger instance, and again
        when ``fresh`` (a retry after a conflict)."""
        if self._ready and not fresh:
            return True
        for attempt in range(MAX_ATTEMPTS):
            try:
                have = self._columns()
                if have is None:
                    if not create:
                        return None
                    self.spark.sql(f"CREATE TABLE IF NOT EXISTS {table_name(self.path)} ({SCHEMA}) USING delta")
                    have = self._columns() or []
                self._upgrade(have)
                self._ready = True
                return True
            except Exception as exc:  # concurrent creation by another run
                if not _is_conflict(exc) or attempt == MAX_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.05, 0.3))
        raise RuntimeError("unreachable")

    def _upgrade(self, have) -> None:
        """A ledger written by an older dpspark lacks the newer columns (``have`` are its columns): add
        them (nullable)."""
        missing = [f for f in SCHEMA.split(", ") if f.split()[0] not in set(have)]
        if missing:
            self.spark.sql(f"ALTER TABLE {table_name(self.path)} ADD COLUMNS ({', '.join(missing)})")

    def _merge(self, rows: list[tuple], on: str, matched_update: dict | None = None):
        """``MERGE INTO`` the ledger from ``rows`` (a temporary view of them, as source ``s``; the ledger
        is ``t``): ``matched_update`` (column -> source column) when ``on`` matches, insert all when
        it does not. ONE Delta commit. Returns the metrics row (``num_inserted_rows``, ...)."""
        view = f"dpspark_ledger_source_{uuid.uuid4().hex}"
        self.spark.createDataFrame(rows, SCHEMA).createOrReplaceTempView(view)
        update = ""
        if matched_update:
            update = "WHEN MATCHED THEN UPDATE SET " + ", ".join(f"t.{k} = s.{v}" for k, v in matched_update.items()) + " "
        try:
            return self.spark.sql(f"MERGE INTO {table_name(self.path)} t USING {view} s ON {on} "
                                  f"{update}WHEN NOT MATCHED THEN INSERT *").collect()[0]
        finally:
            self.spark.catalog.dropTempView(view)

    def _now(self):
        """Now, as the ledger stores times: an aware UTC datetime (an instant: PySpark, Spark SQL's
        literal (``_sql_timestamp``) and delta-rs all store it as that instant, whatever the writer's
        time zones)."""
        return datetime.now(timezone.utc)

    def _row(self, **values) -> tuple:
        if values.get("updated_at") is not None:
            values["updated_at"] = utc_instant(values["updated_at"])  # a naive time given is UTC
        return tuple(values.get(c) for c in COLUMNS)

    def _event(self, **values) -> tuple:
        """One event row (``run`` or ``admin``), timed now unless ``updated_at`` is given."""
        values.setdefault("updated_at", self._now())
        values["entry_id"] = f"{values['kind']}:{values.get('run_id') or ''}:{values['status']}:{uuid.uuid4().hex[:12]}"
        return self._row(**values)

    def _write_rows(self, rows: list[tuple], mode: str = "append") -> None:
        """Write ``rows`` to the ledger's path, ``mode`` "append" or "error" (create the table, fail if
        it exists: Spark Connect's writer knows no "errorifexists", its classic synonym)."""
        self.spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("delta").mode(mode).save(self.path)

    def _admin_commit(self, rows: list[tuple], matched_update: dict) -> bool:
        """ONE commit of an administrative change: ``rows`` (a row keyed by its ``entry_id``, updated with
        ``matched_update`` when it exists, and a new event). On a new ledger the table is created by this
        commit (mode "error": if another run created it meanwhile, the write fails as a conflict and the
        retry MERGEs into theirs). Returns whether this commit created the ledger."""
        for attempt in range(MAX_ATTEMPTS):
            try:
                if (attempt > 0 or not self._ready) and not self.exists():
                    self._write_rows(rows, mode="error")
                    self._ready = True
                    return True
                self._ensure_table(fresh=attempt > 0)
                self._merge(rows, "t.entry_id = s.entry_id", matched_update)
                return False
            except Exception as exc:
                if not _is_conflict(exc) or attempt == MAX_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.05, 0.5))
        raise RuntimeError("unreachable")

    def _key_rows(self, kinds: tuple, key: str) -> list[dict]:
        """The rows of these kinds for ``key`` (delta-rs on a local ledger, else Spark); [] without a ledger."""
        rows = self._rows_without_spark(kinds, key)
        if rows is not None:
            return rows
        if self.spark is None or not self.exists():
            return []
        from pyspark.sql import functions as F

        df = self.spark.read.format("delta").load(self.path)
        return [r.asDict() for r in df.where(F.col("kind").isin(list(kinds)) & (F.col("input_path") == key))
                .select("kind", "input_path").collect()]

    def _append(self, *events: dict) -> None:
        """Append the deferred events and ``events`` in ONE commit. Blind appends never conflict with
        other transactions; only a ledger created at the same moment by another run makes this
        retry. If the write fails, the deferred events wait for the next one."""
        with self._lock:
            pending, self._pending = self._pending, []
        rows = pending + [self._event(**values) for values in events]
        try:
            if self._append_without_spark(rows):
                return
            for attempt_no in range(MAX_ATTEMPTS):
                try:
                    if not self._ready and self.exists():
                        self._ensure_table()  # a ledger of an older dpspark gets the newer columns first
                    self._write_rows(rows)  # no ledger yet: this append creates it, with every column
                    self._ready = True
                    break
                except Exception as exc:
                    if not _is_conflict(exc) or attempt_no == MAX_ATTEMPTS - 1:
                        raise
                    self._ready = False
                    time.sleep(random.uniform(0.05, 0.3))
        except BaseException:
            with self._lock:
                self._pending = pending + self._pending
            raise

    def _append_without_spark(self, rows: list[tuple]) -> bool:
        """``rows`` appended to a LOCAL ledger by delta-rs in one commit (``localdelta.append_rows``: a
        ledger with every column, a plain protocol); False when nothing was written: Spark appends."""
        from dpspark.session import is_connect
        if self.spark is not None and is_connect(self.spark):
            return False
        if localdelta.append_rows(self.path, [dict(zip(COLUMNS, r)) for r in rows], COLUMNS):
            self._ready = True
            return True
        return False

    def _rows_without_spark(self, kinds: tuple, input_key: str | None) -> list[dict] | None:
        """Rows of these kinds (and input) of a LOCAL ledger, read by delta-rs without Spark
        (``dpspark.localdelta``), every column of ``SCHEMA`` (null when an older ledger lacks it);
        None when only Spark can read it. A read only: charges and events are written by Spark."""
        from dpspark.session import is_connect
        if self.spark is not None and is_connect(self.spark):
            return None  # Spark Connect: the ledger's path is the server's, which this machine may not see
        where = {"kind": list(kinds)}
        if input_key is not None:
            where["input_path"] = [input_key]
        rows = localdelta.read_rows(self.path, where, utc=True)
        return None if rows is None else [{**dict.fromkeys(COLUMNS), **r} for r in rows]

    def exists_without_spark(self) -> bool:
        """True when this is a local ledger that delta-rs can read (see ``_rows_without_spark``)."""
        return localdelta.open_table(self.path) is not None

    def _events(self, kinds: tuple, input_key: str | None, *, run_id=None, statuses=None, since=None, until=None,
                last=None):
        rows = self._rows_without_spark(kinds, input_key)
        if rows is not None:  # the same selection as the Spark query below, on the rows delta-rs read
            rows = [r for r in rows if (run_id is None or r["run_id"] == run_id)
                    and (statuses is None or r["status"] in statuses)
                    and (since is None or (r["updated_at"] is not None and r["updated_at"] >= utc_instant(since)))
                    and (until is None or (r["updated_at"] is not None and r["updated_at"] < utc_instant(until)))]
            rows.sort(key=lambda r: (_nulls_first(r["updated_at"]), _nulls_first(r["entry_id"])))
            return rows[-last:] if last is not None else rows
        return self._events_with_spark(kinds, input_key, run_id=run_id, statuses=statuses, since=since, until=until,
                                       last=last)

    def _events_with_spark(self, kinds: tuple, input_key: str | None, *, run_id=None, statuses=None, since=None,
                           until=None, last=None):
        from pyspark.sql import functions as F

        if not self.exists():
            return []
        df = self.spark.read.format("delta").load(self.path).where(F.col("kind").isin(list(kinds)))
        if input_key is not None:
            df = df.where(df.input_path == input_key)
        if run_id is not None:
            df = df.where(F.col("run_id") == run_id)
        if statuses is not None:
            df = df.where(F.col("status").isin(list(statuses)))
        # updated_at is an instant: compared as microseconds since the epoch, so that neither the
        # session's time zone nor this process's enters (a naive bound is UTC)
        if since is not None:
            df = df.where(F.expr("unix_micros(updated_at)") >= F.lit(_micros(since)))
        if until is not None:
            df = df.where(F.expr("unix_micros(updated_at)") < F.lit(_micros(until)))
        df = _with_instants(df)
        if last is not None:
            rows = _collect(df.orderBy(F.col("updated_at").desc(), F.col("entry_id").desc()).limit(last))[::-1]
        else:
            rows = _collect(df.orderBy("updated_at", "entry_id"))
        return [{**dict.fromkeys(COLUMNS), **r} for r in rows]


def _nulls_first(value) -> tuple:
    """A sort key that orders None first, as Spark's ascending ``orderBy`` does."""
    return (value is not None, value if value is not None else 0)

