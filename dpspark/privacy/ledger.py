"""The persistent privacy ledger: a Delta table that OWNS each input's budget and records what it spent.

Rows (one table; column ``kind`` tells them apart):

- ``balance``: one row per (input key, guarantee): the cap (``cap_epsilon``, ``cap_delta``)
  set by the ledger's administrator, and the totals charged so far (``epsilon``, ``delta``).
  ``guarantee`` is ``central`` (add/remove-one DP of a trusted curator: maxcover, dplloyd) or
  ``local`` (replace-one local DP of the ldp family, whose output also uses the exact number of
  reports). The two are different currencies and are never added together: each has its own cap
  and its own total.
- ``admin``: an append-only log of administrative events (``set-budget``, ``set-public``, who and when);
- ``public``: one row per table the administrator declared PUBLIC (``set_public``, the ``dpspark
  ledger set-public`` command): a table a config may read as public data (maxcover's
  ``algorithm.candidate_table``), whose rows may come out verbatim. A table with a balance row (a
  budget, in either guarantee) is never public, whatever its ``public`` row says (``is_public``);
- ``run``: an append-only log of run events: ``started``, ``charged`` (with the epsilon and
  delta charged), ``fit_started`` (written before the attempt reads any private value), ``reused``
  (a retry that takes over the charge of an attempt that ended before ``fit_started``, see the
  runner), then ``succeeded``, ``failed`` or ``killed``; or ``refused`` (charged 0: ``epsilon`` and
  ``delta`` are 0; ``asked_epsilon``, ``asked_delta`` hold what the run asked for and
  ``remaining_epsilon``, ``remaining_delta`` what its budget had left then, null when the ledger
  held no cap for the input; a refusal written by an older dpspark has them null). A fixed-seed
  run's events carry ``note = 'NOT PRIVATE (fixed seed)'``;
- ``claim``: at most one per charged attempt, inserted atomically (MERGE) by the one retry that
  takes over that attempt's charge, so two concurrent retries can never both reuse it. Its id
  names the input, the run id and the attempt (``_claim_id``): two inputs charged under one run id
  are two charges, each with its own taker. (A claim written before the id named the input,
  ``claim:{run_id}:{attempt}``, still blocks a second taker of ITS input: the MERGE also matches
  that old id together with the row's ``input_path``.)

``updated_at`` is an instant (a Delta TIMESTAMP: microseconds since the epoch, UTC): written from
an aware UTC datetime (``Ledger._now``; a naive time given to the ledger is UTC), which PySpark (classic
and Connect), a Spark SQL literal naming its offset (``_sql_timestamp``) and delta-rs all store as that
instant, whatever the writer's time zones; read back as an aware UTC datetime (by delta-rs, or by Spark
as ``unix_micros``), whatever the reader's (``spark.sql.session.timeZone``, $TZ). ``utc_iso`` shows it
with its zone. A ledger written before times were aware holds the UTC wall-clock time read as the
writer's local time: exact where that was UTC (the usual server and Databricks setting), shifted by
the writer's offset otherwise; the column and its type are unchanged, so such a ledger is read and
appended to as it is. Amounts, caps and times in the ledger are public: they are the analysts'
requests and the administrator's caps, never derived from private records.

The table, its transactions (Spark SQL, or delta-rs for a local ledger) and the check that its
storage lets only one driver commit a version are ``dpspark.privacy.ledger_store``'s.

Input keys are canonical (``dpspark.tables``): a Delta table is keyed by the id in its metadata,
any other table by its canonical path, so every spelling of one table has one balance.
``input_seen`` records the path as a person wrote it.

The cap belongs to the ledger: only ``set_budget`` (the ``dpspark ledger set-budget`` command)
sets or raises it. A run's config can only ask for LESS (``privacy.budget`` lowers the cap for that
run); an input without a cap in the ledger is refused. Whoever may write the ledger's storage
location is the ledger's administrator: runs need write access to charge, so the location must be
one that users cannot rewrite by other means (see README, "Privacy model").

Few commits per run (each is a Delta transaction of its own): the runner DEFERS its ``started``
and ``charged`` events (``mark(..., defer=True)``, ``charge(..., defer=True)``): each is written,
with its own time, in the same append as the attempt's next event, so a charged run costs the
UPDATE and two appends: [started, charged, fit_started] before its fit reads any private value, and
[succeeded] (or [..., failed], [..., killed], [started, refused]). An attempt that dies (SIGKILL)
before that append leaves no ``started`` event, and, between its UPDATE and that append (no work
in between), a charge without its ``charged`` event: that charge is spent for good, like any charge
no retry may take over. A new ledger is created by the first ``set_budget``
with its balance row and its ``set-budget`` event in its first commit.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import math
import random
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from dpspark import localdelta
from dpspark.delta_sql import sql_string, table_name
from dpspark.errors import BudgetRefused
# The storage (re-exported: the scripts and tests that name these read them through this module).
from dpspark.privacy.ledger_store import (_LEDGER_CONF, COLUMNS, MAX_ATTEMPTS, SCHEMA, SINGLE_WRITER_ENV,  # noqa: F401
                                          CommitExclusion, LedgerStore, _collect, _is_conflict, _nulls_first,
                                          _small_table, _sql_double, _sql_timestamp, _with_instants,
                                          commit_exclusion, utc_instant)

log = logging.getLogger("dpspark")

GUARANTEES = ("central", "local")
REL_TOL = 1e-12
NOT_PRIVATE_NOTE = "NOT PRIVATE (fixed seed)"
# Every status an event (kind ``run`` or ``admin``) can have, for ``events(statuses=...)``.
EVENT_STATUSES = ("set-budget", "set-public", "started", "charged", "fit_started", "reused", "succeeded", "failed", "killed",
                  "refused")


def _balance_id(input_key: str, guarantee: str = "central") -> str:
    # NUL cannot appear in a path or a table id, so no key's central id equals another key's local id.
    tag = input_key if guarantee == "central" else f"{input_key}\x00{guarantee}"
    return "balance:" + hashlib.sha256(tag.encode()).hexdigest()[:32]


def _public_id(table_key: str) -> str:
    """The id of the row that declares the table ``table_key`` public (``Ledger.set_public``)."""
    return "public:" + hashlib.sha256(table_key.encode()).hexdigest()[:32]


def _claim_id(input_key: str, run_id: str, charged_attempt: int) -> str:
    """The id of the claim on (input, run id, charged attempt). The input key (any text) is hashed;
    NUL separates the parts (it cannot appear in a key or a run id), so no two triples share an id."""
    tag = f"{input_key}\x00{run_id}\x00{int(charged_attempt)}"
    return f"claim:{run_id}:{int(charged_attempt)}:" + hashlib.sha256(tag.encode()).hexdigest()[:32]


def utc_iso(value: datetime | None, timespec: str = "auto") -> str | None:
    """An event time as ISO 8601 UTC with a ``Z`` (``2024-05-01T12:00:00Z``). A naive datetime is UTC
    (the ledger's convention, see the module docstring); an aware one is converted to UTC."""
    if value is None:
        return None
    return utc_instant(value).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_utc(text: str) -> tuple[datetime, bool]:
    """A public time bound given by a person (``--since``/``--until``): an ISO 8601 date
    (``2024-05-01``) or timestamp (``2024-05-01T12:00``, ``2024-05-01 12:00:00Z``, ``...+02:00``),
    UTC unless it names an offset. Returns (the time as an aware UTC datetime, whether it was a
    date alone); raises ``ValueError`` for anything else."""
    text = str(text).strip()
    value = datetime.fromisoformat(text)  # ValueError for a bad value (Python 3.11: also 'Z' and a date alone)
    date_only = len(text) in (8, 10) and not any(ch in text for ch in "T: ")
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc), date_only


def _check_guarantee(guarantee: str) -> None:
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee={guarantee!r} should be one of {list(GUARANTEES)}")


def actor() -> str:
    """Who is acting, for the event log: user@host."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class LedgerTotals:
    input_path: str  # the input key
    spent_epsilon: float
    spent_delta: float
    budget_epsilon: float | None  # the cap in force for this run (the ledger's, or the run's lower request)
    budget_delta: float | None
    guarantee: str = "central"
    ledger_cap_epsilon: float | None = None  # the ledger's own cap
    ledger_cap_delta: float | None = None

    def as_dict(self) -> dict:
        return {
            "input_key": self.input_path,
            "guarantee": self.guarantee,
            "spent_epsilon": self.spent_epsilon,
            "spent_delta": self.spent_delta,
            "budget_epsilon": self.budget_epsilon,
            "budget_delta": self.budget_delta,
            "ledger_cap_epsilon": self.ledger_cap_epsilon,
            "ledger_cap_delta": self.ledger_cap_delta,
            "remaining_epsilon": None if self.budget_epsilon is None else _shown(self.budget_epsilon - self.spent_epsilon),
            "remaining_delta": None if self.budget_delta is None else _shown(self.budget_delta - self.spent_delta),
        }


def _shown(remaining: float) -> float:
    """A remaining budget as shown (summary, report, refusals): at least 0, and rounded to 12
    significant digits so that a difference of doubles reads as written (1e-05 - 2e-06 is
    8.000000000000001e-06). Never used to decide a charge: ``_within_budget`` compares the exact totals."""
    return float(f"{max(0.0, remaining):.12g}")


class Ledger(LedgerStore):
    """The privacy ledger at ``path`` (see the module docstring); its storage is ``LedgerStore``'s."""

    def __init__(self, spark, path: str):
        super().__init__(spark, path)
        self._balance_read = None  # (input key, delta-rs snapshot, its balance rows) from ``refuses``

    # -- administration -------------------------------------------------------------

    @_small_table
    def set_budget(self, input_key: str, epsilon: float, delta: float, guarantee: str = "central",
                   input_seen: str | None = None, who: str | None = None, note: str | None = None) -> "LedgerTotals":
        """Set (or raise, or lower) the cap of ``input_key``: the administrator's command, recorded as an event.

        One commit: on a new ledger, the table is created with the balance row and the event; else one
        MERGE updates (or inserts) the balance row and inserts the event (its id is new: never matched)."""
        _check_guarantee(guarantee)
        if not (isinstance(epsilon, (int, float)) and epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon={epsilon!r} should be a finite number > 0")
        if not (isinstance(delta, (int, float)) and 0 <= delta < 1):
            raise ValueError(f"delta={delta!r} should be in [0, 1)")
        self.require_exclusive_commits()
        who = who or actor()
        balance = self._row(
            entry_id=_balance_id(input_key, guarantee), kind="balance", input_path=input_key, epsilon=0.0, delta=0.0,
            status="total", updated_at=self._now(), guarantee=guarantee, cap_epsilon=float(epsilon),
            cap_delta=float(delta), actor=who, input_seen=input_seen)
        event = self._event(kind="admin", input_path=input_key, status="set-budget", guarantee=guarantee,
                            cap_epsilon=float(epsilon), cap_delta=float(delta), actor=who, input_seen=input_seen,
                            note=note)
        created = self._admin_commit([balance, event], {"cap_epsilon": "cap_epsilon", "cap_delta": "cap_delta",
                                                        "updated_at": "updated_at", "actor": "actor"})
        if created:  # this commit made the table: nothing was ever charged
            return LedgerTotals(input_path=input_key, spent_epsilon=0.0, spent_delta=0.0, budget_epsilon=float(epsilon),
                                budget_delta=float(delta), guarantee=guarantee, ledger_cap_epsilon=float(epsilon),
                                ledger_cap_delta=float(delta))
        return self.totals(input_key, guarantee=guarantee)

    @_small_table
    def set_public(self, table_key: str, table_seen: str | None = None, who: str | None = None,
                   note: str | None = None) -> None:
        """Declare the table ``table_key`` PUBLIC: the administrator's command, recorded as an event.

        A config may then read it as public data (its rows can be released verbatim, nothing is
        charged for them). Refused (``ValueError``) for a table with a balance: a table with a budget
        is private. One commit, as ``set_budget``'s (a new ledger is created by it)."""
        if self.has_balance(table_key):
            raise ValueError(f"{table_seen or table_key} has a privacy budget in this ledger (it is private data): "
                             "a table with a budget is never public")
        self.require_exclusive_commits()
        who = who or actor()
        row = self._row(entry_id=_public_id(table_key), kind="public", input_path=table_key, epsilon=0.0, delta=0.0,
                        status="public", updated_at=self._now(), actor=who, input_seen=table_seen, note=note)
        event = self._event(kind="admin", input_path=table_key, status="set-public", actor=who, input_seen=table_seen,
                            note=note)
        self._admin_commit([row, event], {"updated_at": "updated_at", "actor": "actor"})

    @_small_table
    def has_balance(self, key: str) -> bool:
        """Whether ``key`` has a balance row (a budget, in either guarantee) in this ledger."""
        return any(r["kind"] == "balance" for r in self._key_rows(("balance",), key))

    @_small_table
    def is_public(self, table_key: str) -> bool:
        """True when the administrator declared ``table_key`` public (``set_public``) and it has no balance."""
        kinds = {r["kind"] for r in self._key_rows(("public", "balance"), table_key)}
        return "public" in kinds and "balance" not in kinds

    @_small_table
    def public_tables(self) -> list[dict]:
        """The tables declared public (and without a balance): key, path as written, who, when (an
        aware UTC datetime), note."""
        rows = self._rows_without_spark(("public", "balance"), None)
        if rows is None:
            if self.spark is None or not self.exists():
                return []
            rows = _collect(_with_instants(self.spark.read.format("delta").load(self.path)
                                           .where("kind IN ('public', 'balance')")))
        budgeted = {r["input_path"] for r in rows if r["kind"] == "balance"}
        return sorted(({"table_key": r["input_path"], "table_seen": r.get("input_seen"), "actor": r.get("actor"),
                        "updated_at": r.get("updated_at"), "note": r.get("note")}
                       for r in rows if r["kind"] == "public" and r["input_path"] not in budgeted),
                      key=lambda r: r["table_key"])

    # -- charging -----------------------------------------------------------------

    @_small_table
    def charge(self, input_key: str, run_id: str, algorithm: str, epsilon: float, delta: float,
               requested_epsilon: float | None = None, requested_delta: float | None = None, *,
               guarantee: str = "central", attempt: int | None = None, input_seen: str | None = None,
               private: bool = True, defer: bool = False) -> LedgerTotals:
        """Charge (epsilon, delta) to ``input_key``'s ``guarantee`` total, or raise ``BudgetRefused``
        (recording the refusal). The cap is the ledger's; ``requested_*`` (the run's
        ``privacy.budget``) can only lower it for this run. No cap in the ledger: refused.

        Commits: one UPDATE of the balance row whose WHERE clause is the budget condition (the check
        and the charge, one transaction on one snapshot: ``MERGE``'s semantics, half its Spark jobs),
        then one append of the deferred events and ``charged`` (or ``refused``). No ledger table at
        all: refused without an UPDATE (no table, no cap), the append creates the table. A LOCAL
        ledger is charged and appended to by delta-rs, the same transactions without a cold driver's
        seconds (``_charge_without_spark``, ``_append_without_spark``); Spark whenever it cannot.

        ``defer``: a ``charged`` event is deferred like ``mark(..., defer=True)``: written with this
        Ledger's next event (the runner's ``fit_started``, or ``failed``/``killed``), one commit fewer.
        A refusal is always written at once."""
        _check_guarantee(guarantee)
        self.require_exclusive_commits()
        note = None if private else NOT_PRIVATE_NOTE
        charged, totals = False, None
        decided = self._charge_without_spark(input_key, epsilon, delta, requested_epsilon, requested_delta, guarantee)
        if decided is not None:
            charged, totals = decided
        else:
            totals = self._refusal_without_spark(input_key, epsilon, delta, requested_epsilon, requested_delta, guarantee)
        if totals is None and (self._ready or self.exists()):
            cap_eps = "cap_epsilon"
            cap_delta = "coalesce(cap_delta, 0.0D)"
            if requested_epsilon is not None:
                cap_eps = f"least({cap_eps}, {_sql_double(requested_epsilon)})"
                cap_delta = f"least({cap_delta}, {_sql_double(requested_delta or 0.0)})"
            eps, dlt, tol = _sql_double(epsilon), _sql_double(delta), _sql_double(1 + REL_TOL)
            update = (
                f"UPDATE {table_name(self.path)} "
                f"SET epsilon = epsilon + {eps}, delta = delta + {dlt}, updated_at = {_sql_timestamp(self._now())} "
                f"WHERE entry_id = '{_balance_id(input_key, guarantee)}' AND cap_epsilon IS NOT NULL "
                f"AND epsilon + {eps} <= {cap_eps} * {tol} AND delta + {dlt} <= {cap_delta} * {tol}"
            )
            for attempt_no in range(MAX_ATTEMPTS):
                try:
                    self._ensure_table(fresh=attempt_no > 0)  # a retry sees a half-created ledger afresh
                    charged = int(self.spark.sql(update).collect()[0]["num_affected_rows"]) == 1
                    break
                except Exception as exc:
                    if not _is_conflict(exc) or attempt_no == MAX_ATTEMPTS - 1:
                        raise
                    log.info("ledger: concurrent charge on %s, retrying (attempt %d)", input_key, attempt_no + 2)
                    time.sleep(random.uniform(0.05, 0.5))
        if totals is None:
            totals = self.totals(input_key, requested_epsilon, requested_delta, guarantee=guarantee)
        if not charged:
            self.refuse(totals, input_key, run_id, algorithm, epsilon, delta, guarantee=guarantee, attempt=attempt,
                        input_seen=input_seen, private=private)
        charged_event = dict(kind="run", input_path=input_key, run_id=run_id, algorithm=algorithm,
                             epsilon=float(epsilon), delta=float(delta), status="charged", guarantee=guarantee,
                             attempt=attempt, input_seen=input_seen, note=note)
        if defer:
            with self._lock:
                self._pending.append(self._event(**charged_event))
        else:
            self._append(charged_event)
        return totals

    def refuses(self, input_key: str, epsilon: float, delta: float, requested_epsilon: float | None = None,
                requested_delta: float | None = None, *, guarantee: str = "central") -> LedgerTotals | None:
        """The totals of a LOCAL ledger's latest version when it already refuses this charge (no cap,
        or not enough left): what ``charge`` would decide, read by delta-rs without Spark and without
        writing anything. None when the charge may pass or when only Spark can read the ledger (then
        ``charge`` decides). A refusal read from a snapshot is final (``_refusal_without_spark``)."""
        _check_guarantee(guarantee)
        self.require_exclusive_commits()
        from dpspark.session import is_connect
        if self.spark is not None and is_connect(self.spark):
            return None
        table = localdelta.writable_table(self.path)
        if table is None:  # not one delta-rs writes: a read of it may still refuse
            return self._refusal_without_spark(input_key, epsilon, delta, requested_epsilon, requested_delta, guarantee)
        found = localdelta.read_rows(self.path, {"kind": ["balance"], "input_path": [input_key]}, table=table)
        if found is None:
            return None
        self._balance_read = (input_key, table, found)  # the charge's first decision reads this snapshot
        decided = self._decide(found, input_key, epsilon, delta, requested_epsilon, requested_delta, guarantee)
        return decided[1] if decided is not None and decided[0] is False else None

    def _decide(self, found: list[dict], input_key: str, epsilon: float, delta: float, requested_epsilon,
                requested_delta, guarantee: str):
        """The budget condition on the balance rows of one snapshot: (False, totals) refused, (True,
        totals, row) within the budget, None when only Spark's UPDATE should decide (rows dpspark
        never writes: two balance rows, a NULL total)."""
        entry = _balance_id(input_key, guarantee)
        rows = [{**dict.fromkeys(COLUMNS), **r} for r in found if r.get("entry_id") == entry]
        if len(rows) > 1:
            return None  # never written by dpspark: Spark's UPDATE applies its condition to each
        row = rows[0] if rows else None
        if row is not None and (row["epsilon"] is None or row["delta"] is None):
            return None  # never written by dpspark: Spark's UPDATE (its NULL arithmetic) decides
        totals = self._totals_of(row, input_key, requested_epsilon, requested_delta, guarantee)
        if not _within_budget(totals, epsilon, delta, requested_epsilon, requested_delta):
            return False, totals
        return True, totals, row

    def refuse(self, totals: LedgerTotals, input_key: str, run_id: str, algorithm: str, epsilon: float, delta: float,
               *, guarantee: str = "central", attempt: int | None = None, input_seen: str | None = None,
               private: bool = True):
        """Record the refusal of a charge (with the deferred events, one commit) and raise
        ``BudgetRefused`` saying what is left. ``totals``: the budget in force that refused it."""
        note = None if private else NOT_PRIVATE_NOTE
        left = totals.as_dict()  # the budget in force for this run (the cap, or the run's lower request)
        self._append(dict(kind="run", input_path=input_key, run_id=run_id, algorithm=algorithm, epsilon=0.0,
                          delta=0.0, status="refused", guarantee=guarantee, attempt=attempt, input_seen=input_seen,
                          note=note, asked_epsilon=float(epsilon), asked_delta=float(delta),
                          remaining_epsilon=left["remaining_epsilon"], remaining_delta=left["remaining_delta"]))
        if totals.ledger_cap_epsilon is None:
            raise BudgetRefused(
                f"privacy budget refused for input {input_seen or input_key!r} (ledger key {input_key}): the ledger "
                f"{self.path} holds no {guarantee} budget for it; its administrator sets one with "
                f"`dpspark ledger set-budget --ledger {self.path} --input {input_seen or input_key} --epsilon E --delta D`"
                + ("" if guarantee == "central" else " --guarantee local")
            )
        raise BudgetRefused(
            f"privacy budget refused for input {input_seen or input_key!r}: this run needs epsilon={epsilon:g}, "
            f"delta={delta:g} ({guarantee}); already spent epsilon={totals.spent_epsilon:g}, delta={totals.spent_delta:g} "
            f"of the budget epsilon={totals.budget_epsilon:g}, delta={(totals.budget_delta or 0.0):g}, so "
            f"epsilon={max(0.0, totals.budget_epsilon - totals.spent_epsilon):g}, "
            f"delta={max(0.0, (totals.budget_delta or 0.0) - totals.spent_delta):g} remain (ledger {self.path})"
        )

    def _refusal_without_spark(self, input_key: str, epsilon: float, delta: float, requested_epsilon,
                               requested_delta, guarantee: str) -> LedgerTotals | None:
        """The totals of a charge that the ledger's latest version already refuses (no cap, or not
        enough left), read by delta-rs from a local ledger: the refusal then needs no UPDATE. None
        when the budget may allow it or when only Spark can read the ledger: the UPDATE decides (its
        WHERE clause is the same condition, on the same kind of numbers: IEEE doubles). A refusal
        read from a snapshot is safe: spending only grows, and a cap raised a moment later is as if
        the run had come a moment earlier."""
        rows = self._rows_without_spark(("balance",), input_key)
        if rows is None:
            return None
        rows = [r for r in rows if r["entry_id"] == _balance_id(input_key, guarantee)]
        totals = self._totals_of(rows[0] if rows else None, input_key, requested_epsilon, requested_delta, guarantee)
        if _within_budget(totals, epsilon, delta, requested_epsilon, requested_delta):
            return None  # it may pass: the UPDATE decides
        return totals

    def _charge_without_spark(self, input_key: str, epsilon: float, delta: float, requested_epsilon, requested_delta,
                              guarantee: str) -> tuple[bool, LedgerTotals] | None:
        """The charge of a LOCAL ledger by delta-rs (``dpspark.localdelta``), without the seconds of a
        cold driver's first Delta UPDATE: (charged, totals), or None when only Spark can charge it.

        The same transaction as the UPDATE's: the balance row is read from one snapshot, the budget
        condition (``_within_budget``: the UPDATE's WHERE clause, in the same IEEE doubles) decides
        on it, and the new totals (the same additions) are committed as the version right after
        that snapshot or not at all (``localdelta.update_row``). When another run committed first,
        nothing was written and the charge is decided again on the new version, so two runs can
        never both pass when the budget allows only one, whichever writer (delta-rs or Spark) each
        uses. A refusal writes nothing here (its event is appended by ``charge``)."""
        from dpspark.session import is_connect
        if self.spark is not None and is_connect(self.spark):
            return None
        entry = _balance_id(input_key, guarantee)
        earlier, self._balance_read = self._balance_read, None
        for attempt_no in range(MAX_ATTEMPTS):
            if attempt_no == 0 and earlier is not None and earlier[0] == input_key:
                table, found = earlier[1], earlier[2]  # ``refuses``'s snapshot: a stale one fails to commit
            else:
                table = localdelta.writable_table(self.path)
                if table is None:
                    return None
                found = localdelta.read_rows(self.path, {"kind": ["balance"], "input_path": [input_key]}, table=table)
                if found is None:
                    return None
            decided = self._decide(found, input_key, epsilon, delta, requested_epsilon, requested_delta, guarantee)
            if decided is None or decided[0] is False:
                return decided
            row = decided[2]
            spent_epsilon, spent_delta = row["epsilon"] + float(epsilon), row["delta"] + float(delta)
            written = localdelta.update_row(table, self.path, "entry_id", entry,
                                            {"epsilon": spent_epsilon, "delta": spent_delta, "updated_at": self._now()})
            if written is None:
                return None
            if written:
                self._ready = True
                return True, self._totals_of({**row, "epsilon": spent_epsilon, "delta": spent_delta}, input_key,
                                             requested_epsilon, requested_delta, guarantee)
            log.info("ledger: concurrent charge on %s, retrying (attempt %d)", input_key, attempt_no + 2)
            if not (attempt_no == 0 and earlier is not None):  # an older snapshot: read the new one at once
                time.sleep(random.uniform(0.05, 0.5))
        return None  # still contended: Spark's UPDATE decides, with its own retries

    @_small_table
    def mark(self, input_key: str, run_id: str, status: str, *, attempt: int | None = None,
             guarantee: str | None = None, note: str | None = None, defer: bool = False) -> None:
        """Record a run's event (``started``, ``reused``, ``succeeded``, ``failed``, ``killed``); a charge is never given back.

        ``defer``: timed now, but written with this Ledger's next event, in the same commit (the
        runner defers ``started``; see the module docstring)."""
        event = dict(kind="run", input_path=input_key, run_id=run_id, epsilon=0.0, delta=0.0, status=status,
                     attempt=attempt, guarantee=guarantee, note=note)
        if defer:
            with self._lock:
                self._pending.append(self._event(**event))
            return
        self._append(event)

    @property
    def pending(self) -> int:
        """How many deferred events wait for the next append."""
        return len(self._pending)

    @_small_table
    def claim_charge(self, input_key: str, run_id: str, charged_attempt: int, attempt: int) -> bool:
        """Atomically take over the charge of ``charged_attempt`` of ``run_id`` on ``input_key`` for ``attempt``:
        True for exactly one caller. One MERGE (insert if absent): the claim's id names the input
        (``_claim_id``), and a claim of the older form ``claim:{run_id}:{attempt}`` (no input in the id)
        is matched too when its ``input_path`` is this input, so a charge taken over before the id
        named the input cannot be taken over again."""
        claim = self._row(
            entry_id=_claim_id(input_key, run_id, charged_attempt), kind="claim", input_path=input_key, run_id=run_id,
            epsilon=0.0, delta=0.0, status="claimed", updated_at=self._now(), attempt=int(attempt))
        self.require_exclusive_commits()
        legacy_id = sql_string(f"claim:{run_id}:{int(charged_attempt)}")
        taken = f"t.entry_id = s.entry_id OR (t.entry_id = {legacy_id} AND t.input_path = s.input_path)"
        for attempt_no in range(MAX_ATTEMPTS):
            try:
                self._ensure_table(fresh=attempt_no > 0)
                metrics = self._merge([claim], taken)
                return int(metrics["num_inserted_rows"]) == 1
            except Exception as exc:
                if not _is_conflict(exc) or attempt_no == MAX_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.05, 0.5))
        return False

    # -- reading ------------------------------------------------------------------

    @_small_table
    def totals(self, input_key: str, budget_epsilon=None, budget_delta=None, guarantee: str = "central") -> LedgerTotals:
        """Spent totals and caps of ``input_key``. ``budget_*``: a run's lower request (it never raises the cap)."""
        from pyspark.sql import functions as F

        row = None
        if self._ready or self.exists():  # no ledger yet: nothing was ever charged, no cap set
            df = self.spark.read.format("delta").load(self.path)
            cols = ["epsilon", "delta"] + [c for c in ("cap_epsilon", "cap_delta") if c in df.columns]
            # collect, not first(): one Spark job (a limit scans partitions in growing rounds); the id is unique
            rows = df.where(F.col("entry_id") == _balance_id(input_key, guarantee)).select(*cols).collect()
            row = rows[0].asDict() if rows else None
        return self._totals_of(row, input_key, budget_epsilon, budget_delta, guarantee)

    @staticmethod
    def _totals_of(row: dict | None, input_key: str, budget_epsilon, budget_delta, guarantee: str) -> LedgerTotals:
        """``LedgerTotals`` of a balance row (a dict; None: no balance)."""
        cap_eps = row.get("cap_epsilon") if row is not None else None
        cap_delta = (row["cap_delta"] or 0.0) if cap_eps is not None else None
        eff_eps, eff_delta = cap_eps, cap_delta
        if cap_eps is not None and budget_epsilon is not None:
            eff_eps = min(cap_eps, float(budget_epsilon))
            eff_delta = min(cap_delta, float(budget_delta or 0.0))
        return LedgerTotals(
            input_path=input_key,
            spent_epsilon=float(row["epsilon"]) if row else 0.0,
            spent_delta=float(row["delta"]) if row else 0.0,
            budget_epsilon=eff_eps, budget_delta=eff_delta, guarantee=guarantee,
            ledger_cap_epsilon=cap_eps, ledger_cap_delta=cap_delta,
        )

    @_small_table
    def balances(self, input_key: str | None = None) -> list[dict]:
        """Every balance row (input key, guarantee, cap, spent, remaining), as dicts."""
        rows = self._rows_without_spark(("balance",), input_key)
        if rows is not None:
            rows.sort(key=lambda r: (_nulls_first(r["input_path"]), _nulls_first(r["guarantee"])))
        else:
            if not self.exists():
                return []
            df = self.spark.read.format("delta").load(self.path).where("kind = 'balance'")
            if input_key is not None:
                df = df.where(df.input_path == input_key)
            rows = [r.asDict() for r in df.orderBy("input_path", "guarantee").collect()]
        out = []
        for r in rows:
            cap_eps, cap_delta = r.get("cap_epsilon"), r.get("cap_delta")
            out.append({
                "input_key": r["input_path"], "input_seen": r.get("input_seen"), "guarantee": r.get("guarantee") or "central",
                "cap_epsilon": cap_eps, "cap_delta": cap_delta, "spent_epsilon": r["epsilon"], "spent_delta": r["delta"],
                "remaining_epsilon": None if cap_eps is None else _shown(cap_eps - r["epsilon"]),
                "remaining_delta": None if cap_eps is None else _shown((cap_delta or 0.0) - r["delta"]),
            })
        return out

    @_small_table
    def runs(self, input_key: str | None = None):
        """The run events (started, charged, refused, reused, succeeded, failed, killed), oldest first, as dicts."""
        return self._events(("run",), input_key)

    @_small_table
    def events(self, input_key: str | None = None, *, run_id: str | None = None, statuses=None,
               since: datetime | None = None, until: datetime | None = None, last: int | None = None):
        """Run and administrative events, oldest first, as dicts (every column of ``SCHEMA``; null when
        a ledger of an older dpspark lacks it; ``updated_at`` an aware UTC datetime). Filters (public values, all optional): ``run_id``;
        ``statuses`` (some of ``EVENT_STATUSES``); ``since`` (inclusive) and ``until`` (exclusive),
        aware datetimes or naive UTC; ``last``: only the ``last`` newest of the events selected."""
        if statuses is not None:
            unknown = [s for s in statuses if s not in EVENT_STATUSES]
            if unknown:
                raise ValueError(f"statuses={unknown!r}: an event status is one of {list(EVENT_STATUSES)}")
        if last is not None and not (isinstance(last, int) and last >= 1):
            raise ValueError(f"last={last!r} should be a whole number >= 1")
        return self._events(("run", "admin"), input_key, run_id=run_id, statuses=statuses, since=since,
                            until=until, last=last)


def _within_budget(totals: "LedgerTotals", epsilon: float, delta: float, requested_epsilon, requested_delta) -> bool:
    """The charge UPDATE's WHERE clause in Python: a cap is set, and spent + asked stays within the cap
    (or the run's lower request) times 1 + ``REL_TOL``, in IEEE doubles as Spark computes it."""
    if totals.ledger_cap_epsilon is None:
        return False
    tol = 1 + REL_TOL
    cap_eps, cap_delta = totals.ledger_cap_epsilon, totals.ledger_cap_delta
    if requested_epsilon is not None:
        cap_eps, cap_delta = min(cap_eps, float(requested_epsilon)), min(cap_delta, float(requested_delta or 0.0))
    return (totals.spent_epsilon + float(epsilon) <= cap_eps * tol
            and totals.spent_delta + float(delta) <= cap_delta * tol)


