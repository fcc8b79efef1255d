"""Small LOCAL Delta tables read without Spark, by delta-rs (the ``deltalake`` package).

dpspark's bookkeeping tables (``runs/``, the ledger) are small, and reading one of them is often
all a command needs Spark for (a re-run of a run id that already succeeded, ``dpspark ledger
show``) or the first and coldest Delta operation of a new process (seconds of JIT and class
loading before the first job). delta-rs reads them in a fraction of a second, without a JVM.

Reads only: every write, and the ledger's charge (one Delta UPDATE whose WHERE clause is the
budget condition), stay Delta on Spark. Every function answers None when it cannot answer: a
remote path, ``deltalake`` not installed, a table whose protocol needs reader features
(deletion vectors, column mapping), or any error of delta-rs. The caller then asks Spark, so an
answer here is always the one Spark would give, never a guess.
"""

from __future__ import annotations

import os
from datetime import datetime


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


def read_rows(path: str, where: dict | None = None) -> list[dict] | None:
    """The rows of the local Delta table at ``path`` whose column ``c`` is one of ``where[c]`` (every
    column named must exist), as dicts in no particular order, with every column of the table;
    TIMESTAMP values as PySpark returns them (naive, in this process's local time). None when
    delta-rs cannot read it (see the module docstring)."""
    table = open_table(path)
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
        found = ds.dataset(files, format="parquet", schema=schema).to_table(filter=condition, use_threads=False)
    except Exception:
        return None
    return [{k: _naive_local(v) for k, v in row.items()} for row in found.to_pylist()]


def _naive_local(value):
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    return value
