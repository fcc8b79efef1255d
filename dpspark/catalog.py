"""A run's output tables under catalog names (``output.table``), for users who query by table name.

``output.table: db.clusters`` (``name``, ``db.name`` or ``catalog.db.name``, validated like
``input.table`` by dpspark.config) registers the two Delta tables a run writes under ``output.path``
as EXTERNAL catalog tables (``CREATE TABLE IF NOT EXISTS ... USING DELTA LOCATION ...``, the same SQL
on a classic and a Spark Connect session):

    db.clusters_centers  ->  {output.path}/centers
    db.clusters_runs     ->  {output.path}/runs

A name only points at a location: dropping it never deletes the data, and registering it again at
the same location (every later run of the job) changes nothing. Before any charge (the runner's
pre-flight) ``check_output_tables`` refuses a name that already exists as anything else (a table at
another location, a view), or whose database does not exist: a ``ConfigError`` naming output.table
(exit 2). ``register_output_tables`` runs once the centers are written, before the run's summaries:
if it fails the attempt fails and its outputs are removed as for any failure after the fit (a name
left pointing at the output location is harmless). The names and locations are public config; no
message here quotes anything read from the data.
"""

from __future__ import annotations

import re

from dpspark.delta_sql import sql_string
from dpspark.errors import ConfigError, DPSparkError
from dpspark.tables import canonical_path

KEY = "output.table"
SUFFIXES = {"centers": "_centers", "runs": "_runs"}  # output table -> suffix of its catalog name

# What the catalog raises for a database (namespace) or a catalog that does not exist.
_NO_DATABASE = ("SCHEMA_NOT_FOUND", "NAMESPACE_NOT_FOUND", "DATABASE_NOT_FOUND", "NoSuchDatabaseException",
                "NoSuchNamespaceException")
_NO_CATALOG = ("CATALOG_NOT_FOUND", "CatalogNotFoundException")


def registered_names(name: str | None) -> dict:
    """{"centers": "<name>_centers", "runs": "<name>_runs"}; {} when ``name`` is None (output.table unset)."""
    if not name:
        return {}
    return {kind: name + suffix for kind, suffix in SUFFIXES.items()}


def listed_outputs(name: str | None) -> dict:
    """summary.json's ``outputs`` entries for the registered names: ``centers_table``, ``runs_table``
    (flat, beside the paths, so the command line lists them like the paths); {} when unset."""
    return {f"{kind}_table": ident for kind, ident in registered_names(name).items()}


def quoted(name: str) -> str:
    """``a.b.c`` as ```a`.`b`.`c``` (a backquote in a part doubled: Spark SQL's quoting rule)."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in name.split("."))


def check_output_tables(spark, name: str | None, paths: dict) -> None:
    """Pre-flight (no data read, nothing written): every name ``output.table`` registers is free or
    already points at this run's own table (``paths["centers"]``, ``paths["runs"]``), and its database
    exists. Else a ``ConfigError`` naming output.table, before anything is recorded or charged."""
    for kind, ident in registered_names(name).items():
        found = _registered(spark, ident)
        if found is None:
            continue
        location, what = found
        if location is None:
            raise ConfigError(KEY, f"{ident!r} already exists in the catalog as {what}, not a Delta table at this run's "
                                   f"{kind} location {paths[kind]!r}: choose another {KEY} or drop {ident}")
        if not _same_location(spark, location, paths[kind]):
            raise ConfigError(KEY, f"{ident!r} is already a catalog table at {location!r}, not at this run's {kind} "
                                   f"table {paths[kind]!r} (output.path): choose another {KEY}, or drop {ident} "
                                   f"(an external table: dropping it deletes no data) to move the name here")


def register_output_tables(spark, name: str | None, paths: dict) -> dict:
    """After the centers are written (``paths``' centers/ and runs/ Delta tables exist): register each
    name (``CREATE TABLE IF NOT EXISTS <name> USING DELTA LOCATION <path>``) and check it points at the
    path (another writer may have taken the name since the pre-flight). Returns the names registered.
    A failure is a ``DPSparkError`` naming output.table and the error's class only (the catalog's full
    message is chained to it, for the operator record)."""
    names = registered_names(name)
    for kind, ident in names.items():
        try:
            spark.sql(f"CREATE TABLE IF NOT EXISTS {quoted(ident)} USING DELTA LOCATION {sql_string(paths[kind])}")
            found = _registered(spark, ident)
        except ConfigError as exc:  # the database went away since the pre-flight: a failure of the run (exit 1)
            raise DPSparkError(str(exc)) from None
        except Exception as exc:
            raise DPSparkError(f"{KEY}: could not register {ident!r} for {paths[kind]!r} "
                               f"({_error_class(exc)})") from exc
        if found is None or found[0] is None or not _same_location(spark, found[0], paths[kind]):
            where = "nothing" if found is None else (found[1] if found[0] is None else repr(found[0]))
            raise DPSparkError(f"{KEY}: {ident!r} does not point at {paths[kind]!r} after its registration (it names "
                               f"{where}: another writer took the name?); choose another {KEY} or drop {ident}")
    return names


def _registered(spark, ident: str) -> tuple[str | None, str] | None:
    """What the catalog holds under ``ident``: None (nothing), (location, "a table") for a table, or
    (None, what) for a view or a table without a location. Read from the catalog's metadata (``SHOW
    TABLE EXTENDED``), not the Delta log: a name whose location was deleted is still found."""
    *namespace, table = ident.split(".")
    where = f"IN {quoted('.'.join(namespace))} " if namespace else ""
    try:
        rows = spark.sql(f"SHOW TABLE EXTENDED {where}LIKE {sql_string(table)}").collect()
    except Exception as exc:
        text = str(exc)
        if any(word in text for word in _NO_CATALOG):
            raise ConfigError(KEY, f"{ident!r}: the catalog {namespace[0]!r} does not exist") from None
        if namespace and any(word in text for word in _NO_DATABASE):
            raise ConfigError(KEY, f"{ident!r}: the database {'.'.join(namespace)!r} does not exist; create it first "
                                   f"(CREATE DATABASE {quoted('.'.join(namespace))})") from None
        raise
    for row in (r.asDict() for r in rows):
        if str(row.get("tableName")).lower() != table.lower():
            continue
        info = _information(row.get("information"))
        if row.get("isTemporary") or info.get("type", "").upper() == "VIEW":
            return None, "a view" + (" (temporary)" if row.get("isTemporary") else "")
        location = info.get("location")
        if location:
            return location, "a table"
        return _detail_location(spark, ident)
    return None


def _information(text) -> dict:
    """``SHOW TABLE EXTENDED``'s ``information`` (``Key: value`` lines) as {lower-case key: value}."""
    out = {}
    for line in str(text or "").splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and not key.startswith(" "):
            out.setdefault(key.strip().lower(), value.strip())
    return out


def _detail_location(spark, ident: str) -> tuple[str | None, str]:
    """A table whose catalog entry names no location (another catalog's): ``DESCRIBE DETAIL`` asks Delta."""
    try:
        row = spark.sql(f"DESCRIBE DETAIL {quoted(ident)}").select("format", "location").first()
    except Exception:
        return None, "a table dpspark cannot locate"
    if row is None or not row["location"]:
        return None, "a table without a location"
    if str(row["format"]).lower() != "delta":
        return None, f"a {row['format']} table"
    return str(row["location"]), "a table"


def _same_location(spark, a: str, b: str) -> bool:
    return canonical_path(spark, a) == canonical_path(spark, b)


def _error_class(exc: Exception) -> str:
    """An exception's type and, if its message starts with one, Spark's error class (``[SCHEMA_NOT_FOUND]``)."""
    found = re.match(r"\s*\[([A-Z][A-Z0-9_.]*)\]", str(exc))
    return type(exc).__name__ + (f" [{found.group(1)}]" if found else "")
