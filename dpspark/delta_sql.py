"""Spark SQL spellings for Delta tables named by path, shared by the table readers
(``dpspark.tables``) and the privacy ledger (``dpspark.privacy.ledger``), which do not import each
other: the quoted table name, a string literal, and what reading a path with no table raises."""

from __future__ import annotations


def table_name(path: str) -> str:
    """``delta.`path``` with any backquote in the path doubled (Spark SQL's quoting rule)."""
    return "delta.`" + path.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (backslashes and single quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# What reading a path that holds no Delta table raises (as opposed to an error of the storage or of
# Delta itself, which must propagate), on a classic or a Spark Connect session.
NOT_A_TABLE = ("DELTA_MISSING_DELTA_TABLE", "is not a Delta table", "PATH_NOT_FOUND", "Path does not exist",
               "DELTA_TABLE_NOT_FOUND", "DELTA_FILE_NOT_FOUND", "DELTA_PATH_DOES_NOT_EXIST")


def not_a_table(exc: Exception) -> bool:
    return any(word in str(exc) for word in NOT_A_TABLE)
