"""Small LOCAL Delta tables read without Spark, by delta-rs (the ``deltalake`` package).

dpspark's bookkeeping tables (``runs/``, the ledger) are small, and reading one of them is often
all a command needs Spark for (a re-run of a run id that already succeeded, ``dpspark ledger
show``) or the first and coldest Delta operation of a new process (seconds of JIT and class
loading before the first job). delta-rs reads them in a fraction of a second, without a JVM.

Every read answers None when it cannot answer: a remote path, ``deltalake`` not installed, a
table whose protocol needs reader features (deletion vectors, column mapping), or any error of
delta-rs. The caller then asks Spark, so an answer here is always the one Spark would give, never
a guess.

Writes (``append_rows``, ``update_row``, ``create_table``) are the bookkeeping commits of a run:
the rows of ``runs/``, the ledger's events and its charge, a new attempt's centers, and the first
commit of a new output path's ``runs/`` and ``centers/``. In a new driver
the first Delta write on Spark costs seconds of class loading and JIT wherever it falls (a cold
charge measured 13 s at 94% of both cores of the project's machine), and a run's records are a
few rows. A write here is ONE Delta commit by delta-rs, under the Delta protocol that Spark's
writers follow too: a commit is the exclusive creation of the log's next version file (delta-rs
renames without replacing on a local disk), so a commit by either writer never overwrites the
other's. A write answers "not written" (False / None) when delta-rs should not write the table
(a remote path, no table yet, writer features, a schema that differs) or fails BEFORE its commit;
the caller then writes with Spark. A commit that landed although delta-rs raised afterwards is
found by its transaction id in the log, so nothing is ever written twice.
"""

from __future__ import annotations

import os
import re
import uuid
from datetime import datetime, timezone


def local_path(path: str) -> str | None:
    """The local file-system path of ``path`` (no scheme, or ``file:``, ``file://``, ``file:///``), else None."""
    if path.startswith("file:"):
        rest = path[len("file:"):]
        if rest.startswith("//"):
            rest = rest[2:]
            host, slash, tail = rest.partition("/")
            if host not in ("", "localhost"):
                return None
            rest = "/" + tail
        return rest or "/"
    if "://" in path:
        return None
    return path


def has_log(path: str) -> bool | None:
    """Whether the local ``path`` holds a Delta log folder; None for a remote path."""
    local = local_path(path)
    if local is None:
        return None
    return os.path.isdir(os.path.join(local, "_delta_log"))


def open_table(path: str):
    """delta-rs's ``DeltaTable`` at the local ``path`` (its latest version), or None (see the module docstring)."""
    local = local_path(path)
    if local is None or not os.path.isdir(os.path.join(local, "_delta_log")):
        return None
    try:
        from deltalake import DeltaTable

        table = DeltaTable(local)
        if table.protocol().min_reader_version != 1:  # reader features: Delta on Spark reads it
            return None
        return table
    except Exception:
        return None


def table_id(path: str) -> str | None:
    """The id in the table's metadata (what ``tables.delta_snapshot`` reads with Spark), or None."""
    table = open_table(path)
    try:
        return None if table is None else str(table.metadata().id)
    except Exception:
        return None


def read_rows(path: str, where: dict | None = None, table=None, utc: bool = False) -> list[dict] | None:
    """The rows of the local Delta table at ``path`` whose column ``c`` is one of ``where[c]`` (every
    column named must exist), as dicts in no particular order, with every column of the table;
    TIMESTAMP values as PySpark returns them (naive, in this process's local time), or with ``utc``
    as aware UTC datetimes (the instant Delta holds, whatever this process's zone: the ledger's
    reads). None when delta-rs cannot read it (see the module docstring). ``table``: read that
    snapshot (an ``open_table`` of ``path``) rather than the latest."""
    table = open_table(path) if table is None else table
    if table is None:
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        if table.metadata().partition_columns:
            return None  # dpspark's bookkeeping tables have none: Spark reads anything else
        # delta-rs gives the snapshot (its files, its schema); pyarrow reads the local Parquet files
        # itself, on this thread. Not delta-rs's own pyarrow dataset: its file system runs scan threads
        # that can outlive the read and abort the process at exit ("terminate called without an
        # active exception", delta-io/delta-rs#2184): seen here as a killed run exiting -6, not 143.
        schema = pa.schema(table.schema().to_arrow())
        files = [uri[len("file://"):] if uri.startswith("file://") else uri for uri in table.file_uris()]
        condition = None
        for column, values in (where or {}).items():
            term = pc.field(column).isin(list(values))
            condition = term if condition is None else condition & term
        if not files:
            return []
        # Filtered after the scan, not in it: a file delta-rs rewrote stores its strings as Arrow
        # string_view, whose statistics pyarrow cannot compare with the snapshot's string type.
        found = ds.dataset(files, format="parquet", schema=schema).to_table(use_threads=False)
        if condition is not None:
            found = found.filter(condition)
    except Exception:
        return None
    convert = _aware_utc if utc else _naive_local
    return [{k: convert(v) for k, v in row.items()} for row in found.to_pylist()]


def _naive_local(value):
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    return value


def _aware_utc(value):
    """A TIMESTAMP value (pyarrow's aware datetime, zone UTC) as a ``datetime.timezone.utc`` datetime."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc)
    return value


# -- writes (see the module docstring) ---------------------------------------------------------

_TXN_KEY = "dpspark_txn"
_SQL_KEY = re.compile(r"^[A-Za-z0-9_:.-]+$")  # a key this module puts into a predicate's string literal


def writable_table(path: str):
    """``open_table(path)`` when delta-rs may also write it: a plain protocol (writer version 2 at
    most, no table features), else None."""
    table = open_table(path)
    try:
        protocol = table.protocol() if table is not None else None
        if protocol is None or protocol.min_writer_version > 2 or protocol.writer_features:
            return None
        return table
    except Exception:
        return None


def _arrow_value(value):
    """A PySpark-style Python value as delta-rs takes it: an aware datetime is stored as its instant
    (the ledger's and runs/'s times are aware UTC); a naive one is local time (PySpark's reading of
    it: a value read back from a table), made aware so that it is stored as the same instant."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone()
    return value


def _landed(table_path: str, after_version: int, txn: str) -> bool:
    """Whether a commit after ``after_version`` of the table carries the transaction id ``txn``."""
    log = os.path.join(table_path, "_delta_log")
    version = after_version + 1
    while True:
        name = os.path.join(log, f"{version:020d}.json")
        try:
            with open(name, encoding="utf-8") as f:
                first = f.read()
        except FileNotFoundError:
            return False
        if txn in first:
            return True
        version += 1


def append_rows(path: str, rows: list[dict], columns: tuple, replace_where: str | None = None) -> bool:
    """Append ``rows`` (dicts over ``columns``, PySpark-style values) to the LOCAL Delta table at
    ``path`` in one commit by delta-rs; True once committed. False when nothing was written and the
    caller should write with Spark: no table yet, a remote path, writer features, a table whose
    columns are not exactly ``columns``, or an error of delta-rs before its commit (a conflict
    included). ``replace_where``: the same commit first removes the rows it matches (Spark's
    ``replaceWhere``; every row written must match it)."""
    table = writable_table(path)
    if table is None or not rows:
        return False
    try:
        import pyarrow as pa
        from deltalake import CommitProperties, write_deltalake

        schema = pa.schema(table.schema().to_arrow())
        if tuple(schema.names) != tuple(columns):
            return False  # an older table (Spark adds the columns) or another table
        data = pa.Table.from_pylist([{c: _arrow_value(r.get(c)) for c in columns} for r in rows], schema=schema)
    except Exception:
        return False
    version, txn = table.version(), uuid.uuid4().hex
    try:
        properties = CommitProperties(custom_metadata={_TXN_KEY: txn})
        if replace_where is None:
            write_deltalake(table, data, mode="append", commit_properties=properties)
        else:
            write_deltalake(table, data, mode="overwrite", predicate=replace_where, commit_properties=properties)
        return True
    except Exception:
        return _landed(local_path(path), version, txn)


def _arrow_type(ddl_type: str):
    import pyarrow as pa

    return {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
            "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us", tz="UTC")}[ddl_type.upper()]


_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def create_table(path: str, rows: list[dict], ddl) -> bool:
    """A NEW local Delta table at ``path`` holding ``rows``, its schema the Spark DDL ``ddl`` (``name TYPE,
    ...``, or a list of (name, TYPE) pairs: STRING, INT, BIGINT, DOUBLE, BOOLEAN, TIMESTAMP; every
    column nullable, as Spark's Delta writer makes them), created by delta-rs as version 0 with a
    plain protocol (reader 1, writer 2). False when nothing was written: a remote path, a table (or
    anything) already there, a type outside that list, a column name that is not a plain identifier
    (Spark decides what else Delta allows), or an error before the commit; the caller then writes
    with Spark."""
    local = local_path(path)
    if local is None or os.path.exists(local):
        return False
    try:
        import pyarrow as pa
        from deltalake import CommitProperties, write_deltalake

        pairs = [tuple(column.split()) for column in ddl.split(", ")] if isinstance(ddl, str) else list(ddl)
        if not all(_PLAIN_NAME.match(name) for name, _ in pairs) or len({n.lower() for n, _ in pairs}) != len(pairs):
            return False
        schema = pa.schema([pa.field(name, _arrow_type(kind)) for name, kind in pairs])
        data = pa.Table.from_pylist([{c: _arrow_value(r.get(c)) for c in schema.names} for r in rows], schema=schema)
    except Exception:
        return False
    txn = uuid.uuid4().hex
    try:
        write_deltalake(local, data, mode="error", commit_properties=CommitProperties(custom_metadata={_TXN_KEY: txn}))
        return True
    except Exception:
        return _landed(local, -1, txn)


def update_row(table, path: str, key_column: str, key: str, values: dict) -> bool | None:
    """Set ``values`` in the one row of ``table`` (a ``writable_table`` of the LOCAL ``path``, at the
    snapshot the caller decided on) whose ``key_column`` is ``key``: one commit by delta-rs, as the
    version right after that snapshot or not at all, so the decision and the write see the same
    table (nothing committed in between). True: committed. False: another writer committed first;
    nothing was written (read again and decide again). None: delta-rs could not write it; nothing
    was written (the caller writes with Spark)."""
    if not (_SQL_KEY.match(key) and _SQL_KEY.match(key_column)):
        return None
    try:
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError
    except Exception:
        return None
    version, txn = table.version(), uuid.uuid4().hex
    try:
        metrics = table.update(new_values={c: _arrow_value(v) for c, v in values.items()},
                               predicate=f"{key_column} = '{key}'",
                               commit_properties=CommitProperties(max_commit_retries=0, custom_metadata={_TXN_KEY: txn}))
    except CommitFailedError:
        return True if _landed(local_path(path), version, txn) else False
    except Exception:
        return True if _landed(local_path(path), version, txn) else None
    updated = int(metrics.get("num_updated_rows", -1))
    if updated != 1:  # the caller saw exactly one such row in this very snapshot: fail closed
        raise RuntimeError(f"delta-rs updated {updated} rows of {path} where {key_column} = {key!r}, not 1")
    return True
