"""Read the private input table and write the outputs of a run.

Reading (``load_table``, then ``prepare_points``), in this order, all per record on the executors:
1. load the table (Delta: the current version, recorded and then read exactly);
2. check the schema: every feature column exists and is numeric (or one
   array / ML vector column), the privacy unit column exists;
3. contribution bounding by ``input.privacy_unit`` (one row per person);
4. drop rows with a null, NaN or infinite feature (a per-record step with no
   privacy cost; how many were dropped is private and is never printed);
5. clip into the PUBLIC domain and map to unit space (columns ``_u0.._u{d-1}``).

Writing: ``centers/`` and ``runs/`` Delta tables, written idempotently per run id
(the same run id twice leaves one set of rows), and small files
(``summary.json``, ``report.png``) written atomically.

On a Spark Connect session (``dpspark.session.is_connect``) the client has no JVM: tables are read,
written and inspected through DataFrames and SQL (``DESCRIBE DETAIL``, ``DESCRIBE HISTORY``,
``DELETE``) on the server, which resolves every table path (a relative path is made absolute by
the client, ``qualify``). The small files go where ``output.path`` is: at a local path the client
writes them itself (the client and the server then see the same place: one host, or a shared
mount); at a remote URI (``s3a://...``) the server's JVM writes them, through small Java functions
in dpspark's jar (``_on_server``; no disk shared with the client). A non-Delta
table's ledger key is Hadoop's qualified path, which only a classic session can compute:
``ledger_key_of`` refuses one on Spark Connect.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass

from dpspark import localdelta
from dpspark.delta_sql import not_a_table, sql_string, table_name
from dpspark.errors import ColumnError, DPSparkError, SchemaError
from dpspark.localdelta import local_path
from dpspark.privacy.bounding import bound_contributions
from dpspark.privacy.domain import Domain
from dpspark.session import is_connect

UNIT_PREFIX = "_u"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def qualify(path: str) -> str:
    """An absolute form of a path: local paths (also ``file:...``) become absolute file-system paths
    (``data/x``, ``./data/x`` and ``file:/abs/data/x`` are the same table); other URIs unchanged."""
    local = local_path(path)
    if local is not None:
        return os.path.abspath(local)
    return path


def canonical_path(spark, path: str) -> str:
    """One spelling per location, for ledger keys: ``file:`` + the real path (symlinks resolved, no
    trailing slash, no ``//``) locally; for other schemes Hadoop's normalised, qualified URI (lower-case
    scheme, duplicate and trailing slashes removed). Without a session, or on Spark Connect (no Hadoop
    on the client), a remote URI only gets its scheme lower-cased: never a ledger key there
    (``ledger_key_of`` refuses a non-Delta table on Spark Connect)."""
    local = local_path(path)
    if local is not None:
        return "file:" + os.path.realpath(os.path.abspath(local))
    scheme, sep, rest = path.partition("://")
    text = scheme.lower() + sep + rest
    if spark is None or is_connect(spark):
        return text
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(text)
    try:
        fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        return str(fs.makeQualified(hpath).toString()).rstrip("/") or "/"
    except Exception:  # no file system for the scheme here: Hadoop's normalisation only
        return str(hpath.toString()).rstrip("/") or "/"


def unit_columns(dim: int) -> list[str]:
    return [f"{UNIT_PREFIX}{j}" for j in range(dim)]


# ----------------------------------------------------------------------------
# Reading


# What DESCRIBE DETAIL of a path string raises when nothing is there (as opposed to an error of
# the storage, which must propagate).
_NOT_FOUND = ("DELTA_FILE_NOT_FOUND", "PATH_NOT_FOUND", "DELTA_PATH_DOES_NOT_EXIST")


def _first_line(exc: Exception) -> str:
    """An exception's first line (a Spark Connect error carries the server's JVM stack trace after it)."""
    return (str(exc).splitlines() or [""])[0]


def _exists(spark, path: str) -> bool:
    """Is there a file or folder at ``path``? On Spark Connect the server is asked (it resolves the
    tables it reads): ``DESCRIBE DETAIL`` of the path, whatever it holds."""
    if is_connect(spark):
        try:
            spark.sql(f"DESCRIBE DETAIL {sql_string(path)}").select("location").collect()
            return True
        except Exception as exc:
            if any(word in str(exc) for word in _NOT_FOUND):
                return False
            raise
    local = local_path(path)
    if local is not None:
        return os.path.exists(local)
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return fs.exists(hpath)


def load_table(spark, path: str, fmt: str):
    """Load a table; return (DataFrame, Delta version or None). Missing table -> SchemaError.

    CSV is read with every column as a string (no type inference from the data); ``load_input``
    casts the feature columns to double.
    """
    table = _open(spark, qualify(path), fmt, None, None)
    return table.df, table.version


@dataclass(frozen=True)
class InputTable:
    """The private input as one run reads it. ``ledger_key`` is the one budget the table has, whatever
    the spelling of its path: ``delta-table:<id>`` for Delta (the id in the table's metadata, so a moved
    or re-registered table keeps its balance), else the canonical path. ``path`` is what a person wrote
    (qualified), for the record."""

    df: object
    path: str
    ledger_key: str
    version: int | None
    where: str | None = None


def delta_snapshot(spark, path: str) -> tuple[int, str] | None:
    """(latest version, table id) of the Delta table at ``path``, both from ONE fresh snapshot of its
    log, or None when ``path`` holds no Delta table. No Spark job: the version, the id and the schema
    come from the last commit's checksum file or log replay on the driver (``DESCRIBE DETAIL`` would
    compute the whole table state, ``DESCRIBE HISTORY`` reads every commit file: five Spark jobs
    together, several seconds for a small job). On Spark Connect (no JVM on the client): the SQL
    of ``_delta_snapshot_sql``."""
    if is_connect(spark):
        return _delta_snapshot_sql(spark, path)
    try:
        jvm = spark._jvm
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog
        pair = delta_log.forTableWithSnapshot(spark._jsparkSession, path)  # update()d: the latest commit
    except Exception as exc:
        if _delta_api_missing(exc):
            return _delta_snapshot_public_api(spark, path)
        raise
    snapshot = pair._2()
    version = int(snapshot.version())
    if version < 0:  # no commit in path/_delta_log: not a Delta table (as DeltaTable.isDeltaTable)
        return None
    return version, str(snapshot.metadata().id())


def _delta_api_missing(exc: Exception) -> bool:
    """The JVM entry point is not there (Spark Connect, another Delta version), as opposed to a Java
    exception raised by Delta itself (a corrupt log, no permission), which must propagate."""
    from py4j.protocol import Py4JError, Py4JJavaError

    if isinstance(exc, Py4JJavaError):
        return False
    return isinstance(exc, (AttributeError, TypeError, Py4JError))


def _delta_snapshot_public_api(spark, path: str) -> tuple[int, str] | None:
    """``delta_snapshot`` through delta-spark's public Python API (slower: DESCRIBE DETAIL and HISTORY)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    table = DeltaTable.forPath(spark, path)
    table_id = table.detail().select("id").first()["id"]
    return int(table.history(1).select("version").first()["version"]), str(table_id)


def _delta_detail(spark, path: str) -> tuple[str, str] | None:
    """(table id, location) of the Delta table at ``path`` from ``DESCRIBE DETAIL`` (one SQL command,
    any session kind), or None when ``path`` holds no Delta table."""
    try:
        row = spark.sql(f"DESCRIBE DETAIL {table_name(path)}").select("id", "location").first()
    except Exception as exc:
        if not_a_table(exc):
            return None
        raise
    if row is None or row["id"] is None:
        return None
    return str(row["id"]), str(row["location"])


SNAPSHOT_TRIES = 5


def _delta_snapshot_sql(spark, path: str) -> tuple[int, str] | None:
    """``delta_snapshot`` in SQL: the table id (``DESCRIBE DETAIL``), the latest version (``DESCRIBE
    HISTORY ... LIMIT 1``), and the id again: the version belongs to that id unless the table was
    replaced in between (a ``REPLACE TABLE ... AS SELECT`` gives it a new id), and then it is read
    again. Two SQL commands more than the JVM's one snapshot, a second or so."""
    for _ in range(SNAPSHOT_TRIES):
        first = _delta_detail(spark, path)
        if first is None:
            return None
        row = spark.sql(f"DESCRIBE HISTORY {table_name(path)} LIMIT 1").select("version").first()
        again = _delta_detail(spark, path)
        if row is not None and again is not None and again[0] == first[0]:
            return int(row["version"]), first[0]
    raise SchemaError(f"the Delta table {path!r} was replaced {SNAPSHOT_TRIES} times while its version was read")


def _open(spark, path: str, fmt: str, version: int | None, timestamp: str | None) -> InputTable:
    if not _exists(spark, path):
        raise SchemaError(f"input table not found: input.path={path!r} does not exist")
    found = delta_snapshot(spark, path)
    if fmt == "delta":
        if found is None:
            raise SchemaError(f"input.path={path!r} is not a Delta table (set input.format to parquet or csv?)")
        latest, table_id = found
        if timestamp is not None:
            from pyspark.sql import functions as F

            history = spark.sql(f"DESCRIBE HISTORY {table_name(path)}")  # DeltaTable.history(), any session kind
            found_version = (history.where(F.col("timestamp") <= F.to_timestamp(F.lit(timestamp)))
                             .agg(F.max("version")).first()[0])
            if found_version is None:
                raise SchemaError(f"input.timestamp={timestamp!r}: the table {path!r} has no version at or before that time")
            version = int(found_version)
        elif version is None:
            version = latest
        elif version > latest:
            raise SchemaError(f"input.version={version} does not exist: the latest version of {path!r} is {latest}")
        # Read exactly the version recorded (a commit after the snapshot is not read).
        df = spark.read.format("delta").option("versionAsOf", int(version)).load(path)
        return InputTable(df=df, path=path, ledger_key=f"delta-table:{table_id}", version=int(version))
    if version is not None or timestamp is not None:
        raise SchemaError(f"input.version and input.timestamp need a Delta table; {path!r} is read as {fmt}")
    if found is not None:  # one table, one key: a Delta table is read as Delta
        raise SchemaError(f"input.path={path!r} is a Delta table: set input.format to delta (reading its files as "
                          f"{fmt} would also read removed rows and charge another balance)")
    try:
        if fmt == "parquet":
            # pandas writes nanosecond timestamps, which Spark refuses even in a column that is not
            # read (PARQUET_TYPE_ILLEGAL while inferring the schema); read them as longs instead:
            # dpspark never reads a column that is not a feature or the privacy unit.
            spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
            df = spark.read.parquet(path)
        else:
            df = spark.read.option("header", True).option("inferSchema", False).option("enforceSchema", False).csv(path)
        df.columns  # a Spark Connect read is analysed lazily: here, inside this try
    except Exception as exc:
        reason = _first_line(exc) if is_connect(spark) else exc
        raise SchemaError(f"cannot read input.path={path!r} as {fmt}: {reason}") from None
    return InputTable(df=df, path=path, ledger_key=canonical_path(spark, path), version=None)


def check_still_the_input(spark, path: str, ledger_key: str) -> None:
    """After a fit, before anything is released: the Delta table at ``path`` is still the table the
    run was charged for (``ledger_key``, its id). A Spark Connect server resolves a DataFrame's path
    again at each action, so a table replaced at that path between the check and the fit (a new id)
    was read instead of the charged one: nothing is released then (``SchemaError``). A Delta version
    is immutable, so the same id read at the same pinned version is the same rows. Other keys (a
    parquet/csv folder's path) are not checked."""
    if not ledger_key.startswith("delta-table:"):
        return
    found = delta_snapshot(spark, path)
    if found is None or f"delta-table:{found[1]}" != ledger_key:
        raise SchemaError(f"the input table at {path!r} was replaced while the run read it (its Delta table id "
                          "changed): what was read is not the table that was charged, so nothing is released")


def ledger_key_of(spark, path: str, fmt: str | None = None) -> str:
    """The ledger key of the table at ``path`` (see ``InputTable``). ``fmt`` None: Delta if it is one.

    A non-Delta table's key is its Hadoop-qualified path, which a Spark Connect client cannot compute
    (and a path the client resolves may not be the one the server reads): refused there."""
    path = qualify(path)
    if not _exists(spark, path):
        if fmt == "delta":
            raise SchemaError(f"input table not found: input.path={path!r} does not exist")
        raise SchemaError(f"table not found: {path!r} does not exist")
    found = delta_snapshot(spark, path)
    if fmt is None:
        fmt = "delta" if found is not None else "parquet"
    if fmt != "delta":
        if is_connect(spark):
            raise SchemaError(f"{path!r} is read as {fmt}: on a Spark Connect session only a Delta table has a ledger "
                              f"key (a {fmt} folder's is its Hadoop-qualified path, which needs a classic session)")
        return canonical_path(spark, path)
    if found is None:
        raise SchemaError(f"input.path={path!r} is not a Delta table (set input.format to parquet or csv?)")
    return f"delta-table:{found[1]}"


def load_input(spark, input_cfg, version: int | None = None) -> InputTable:
    """Open the input a config names (``input.path`` or ``input.table``, time travel, ``input.where``).

    Only the feature columns and the privacy unit are kept (other columns are never read). CSV
    features are cast to double without looking at the data: a cell that is not a number becomes
    null and its row is dropped later, like a missing value. ``version`` pins a Delta version (a
    retry reads what its first attempt read) unless the config gives one.
    """
    from pyspark.sql import functions as F

    path, fmt = input_cfg.path, input_cfg.format
    if getattr(input_cfg, "table", None):
        path, fmt = _catalog_location(spark, input_cfg.table), "delta"
    pinned = input_cfg.version if input_cfg.version is not None else (version if input_cfg.timestamp is None else None)
    table = _open(spark, qualify(path), fmt, pinned, input_cfg.timestamp)
    df = table.df
    wanted = list(input_cfg.features) + ([input_cfg.privacy_unit] if input_cfg.privacy_unit else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        what = "privacy unit column" if missing[0] == input_cfg.privacy_unit else "feature column"
        key = "input.privacy_unit" if missing[0] == input_cfg.privacy_unit else "input.features"
        raise ColumnError(key, f"{what} {missing[0]!r} ({key}) not found; the table has columns {sorted(df.columns)}")
    if input_cfg.where:
        df = _filtered(spark, df, input_cfg.where)
    if fmt == "csv":
        cols = [F.col(f"`{c}`").try_cast("double").alias(c) for c in input_cfg.features]
        if input_cfg.privacy_unit:
            cols.append(F.col(f"`{input_cfg.privacy_unit}`"))
        df = df.select(*cols)
    else:
        df = df.select(*[F.col(f"`{c}`") for c in wanted])
    return InputTable(df=df, path=table.path, ledger_key=table.ledger_key, version=table.version, where=input_cfg.where)


def _filtered(spark, df, text: str):
    """``df.where(...)`` for ``input.where``: parsed into a grammar that cannot fail on any row, built
    as a Column and checked on its analysed plan (Spark Connect: ANSI pinned off on the session and
    the columns checked from the schema), before any charge (``dpspark.rowfilter``)."""
    from dpspark import rowfilter

    return rowfilter.apply(spark, df, text)


def _catalog_location(spark, name: str) -> str:
    """The location of the catalog table ``name`` (a Delta table)."""
    try:
        row = spark.sql(f"DESCRIBE DETAIL {name}").select("format", "location").first()
    except Exception as exc:
        raise SchemaError(f"input.table={name!r}: no such Delta table in the catalog ({str(exc).splitlines()[0]})") from None
    if row is None or str(row["format"]).lower() != "delta":
        raise SchemaError(f"input.table={name!r} is not a Delta table")
    return str(row["location"])


def _feature_expressions(df, features: tuple[str, ...], dim: int):
    """Per-dimension double Columns for the features, and their output names. Checks the schema."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = {f.name: f for f in df.schema.fields}
    for name in features:
        if name not in fields:
            raise ColumnError("input.features", f"feature column {name!r} (input.features) not found; the table has columns {sorted(fields)}")
    if len(features) == dim and all(isinstance(fields[n].dataType, T.NumericType) for n in features):
        return [F.col(n).cast("double") for n in features], list(features)
    if len(features) == 1:
        name = features[0]
        dtype = fields[name].dataType
        if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
            col = F.col(name)
        elif type(dtype).__name__ == "VectorUDT":
            from pyspark.ml.functions import vector_to_array

            size = _vector_size(fields[name].metadata)
            if size is not None and size != dim:
                raise ColumnError("input.features", f"feature column {name!r} holds vectors of {size} values (its ML attribute metadata, "
                                  f"e.g. from VectorAssembler), but the domain has {dim} dimension(s): every row would be "
                                  f"dropped as the wrong size; give {size} bounds (lower/upper, or dim with radius)")
            # vector_to_array raises on a null vector: only non-null rows reach it (a null row is dropped)
            col = F.when(F.col(name).isNotNull(), vector_to_array(F.col(name)))
        else:
            raise ColumnError("input.features", f"feature column {name!r} has type {dtype.simpleString()}: it must be numeric, or an array/vector of {dim} numbers")
        exprs = [F.when(F.size(col) == dim, F.get(col, j)).cast("double") for j in range(dim)]
        return exprs, [f"{name}_{j}" for j in range(dim)]
    bad = [n for n in features if not isinstance(fields[n].dataType, T.NumericType)]
    raise ColumnError("input.features", f"feature column {bad[0]!r} has type {fields[bad[0]].dataType.simpleString()}; feature columns must be numeric")


def _vector_size(metadata) -> int | None:
    """The size of a vector column from its ML attribute metadata (public schema information that
    VectorAssembler and other pyspark.ml stages write), or None when it has none. A vector column
    without it is read as is: a row whose vector has another size than the domain is dropped."""
    attrs = (metadata or {}).get("ml_attr") or {}
    if isinstance(attrs.get("num_attrs"), int):
        return int(attrs["num_attrs"])
    groups = attrs.get("attrs")
    if isinstance(groups, dict):
        total = sum(len(v) for v in groups.values() if isinstance(v, list))
        return total or None
    return None


def check_schema(df, features: tuple[str, ...], privacy_unit: str | None, dim: int) -> list[str]:
    """Raise ``ColumnError`` (exit 2) unless the features and the privacy unit fit; return the feature names."""
    _, names = _feature_expressions(df, features, dim)
    if privacy_unit is not None and privacy_unit not in df.columns:
        raise ColumnError("input.privacy_unit", f"privacy unit column {privacy_unit!r} (input.privacy_unit) not found; the table has columns {sorted(df.columns)}")
    if privacy_unit is not None:
        from dpspark.privacy.bounding import check_privacy_unit

        check_privacy_unit(df, privacy_unit)  # a type with no injective key is refused before the charge
    return names


def prepare_points(df, features: tuple[str, ...], privacy_unit: str | None, domain: Domain, run_key: str):
    """Bound contributions, drop invalid rows, clip into the domain and map to unit space.

    Returns (DataFrame with the double columns ``_u0.._u{d-1}``, feature names). Lazy:
    nothing is computed until an algorithm's pass runs.
    """
    from pyspark.sql import functions as F

    raw, names = prepare_raw(df, features, privacy_unit, domain.dim, run_key)
    cols = [F.col(f"__f{j}") for j in range(domain.dim)]
    unit = raw.select(*[e.alias(n) for e, n in zip(domain.unit_columns(cols), unit_columns(domain.dim))])
    return unit, names


def packed_points(unit_df, dim: int):
    """The unit-space points of ``prepare_points`` as ONE array<double> column (``kernels.PACKED_COLUMN``)
    of the d values in order: what a run persists for its Python passes (``kernels.batch_points``
    reads a batch of it as one buffer). The same doubles, so every pass's result is unchanged. Lazy."""
    from pyspark.sql import functions as F

    from dpspark.kernels import PACKED_COLUMN

    return unit_df.select(F.array(*[F.col(c) for c in unit_columns(dim)]).alias(PACKED_COLUMN))


def prepare_raw(df, features: tuple[str, ...], privacy_unit: str | None, dim: int, run_key: str):
    """Bound contributions and drop invalid rows (a null, NaN or infinite feature): (DataFrame with
    the finite double columns ``__f0..__f{d-1}`` in original units, feature names). Lazy."""
    from pyspark.sql import functions as F

    names = check_schema(df, features, privacy_unit, dim)
    exprs, _ = _feature_expressions(df, features, dim)
    if privacy_unit is not None:
        raw = df.select(F.col(privacy_unit), *[e.alias(f"__f{j}") for j, e in enumerate(exprs)])
        raw = bound_contributions(raw, privacy_unit, [f"__f{j}" for j in range(dim)], run_key)
    else:
        raw = df.select(*[e.alias(f"__f{j}") for j, e in enumerate(exprs)])
    cols = [F.col(f"__f{j}") for j in range(dim)]
    valid = None
    for c in cols:
        ok = c.isNotNull() & ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))
        valid = ok if valid is None else valid & ok
    return raw.where(valid), names


# ----------------------------------------------------------------------------
# Writing


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def _local(path: str) -> str:
    return path[len("file:"):] if path.startswith("file:") else path


# The server-side small-file functions (dpspark/java/io/dpspark/io/SmallFiles.java, in the jar a
# Connect server loads for the ledger): name -> (Java class, return type).
SERVER_FILE_FUNCTIONS = {
    "write": ("dpspark_small_file_write", "io.dpspark.io.SmallFiles$Write", "string"),
    "delete": ("dpspark_small_file_delete", "io.dpspark.io.SmallFiles$Delete", "boolean"),
    "kind": ("dpspark_small_file_kind", "io.dpspark.io.SmallFiles$Kind", "string"),
}
SERVER_JAR_HINT = ("start the Spark Connect server with --jars dpspark/jars/dpspark-logstore.jar (docs/cluster.md): "
                   "dpspark's small-file functions run there")


def _on_server(spark, op: str, path: str, data: bytes | None = None):
    """A small-file call at a remote URI from a Spark Connect client, done by the SERVER's JVM: the
    function of ``SERVER_FILE_FUNCTIONS[op]``, registered once per session, evaluated on a one-row
    local relation (``path``, and for "write" the bytes the client holds: released values, public
    parameters, the operator's record). The server's Hadoop settings give the store's access, as for
    its own table writes. ``DPSparkError`` naming the fix when the server lacks dpspark's jar."""
    from pyspark.sql import functions as F

    name, java_class, returns = SERVER_FILE_FUNCTIONS[op]
    verb = {"write": "write", "delete": "remove", "kind": "inspect"}[op]
    registered = spark.__dict__.setdefault("_dpspark_file_functions", set())
    if name not in registered:
        try:
            spark.udf.registerJavaFunction(name, java_class, returns)
        except Exception as exc:
            raise DPSparkError(f"cannot {verb} {path!r} from this Spark Connect client: the server cannot load "
                               f"{java_class} ({_first_line(exc)[:200]}); {SERVER_JAR_HINT}") from None
        registered.add(name)
    if op == "write":
        row = spark.createDataFrame([(path, bytearray(data))], "path STRING, data BINARY")
        call = F.call_function(name, F.col("path"), F.col("data"))
    else:
        row = spark.createDataFrame([(path,)], "path STRING")
        call = F.call_function(name, F.col("path"))
    try:
        return row.select(call.alias("result")).first()["result"]
    except Exception as exc:
        raise DPSparkError(f"cannot {verb} {path!r} through the Spark Connect server: {_first_line(exc)[:500]}") from None


def small_file_kind(spark, path: str) -> str:
    """"missing", "file" or "directory" at ``path``: locally, through Hadoop's FileSystem on a classic
    session, or asked of the server on Spark Connect (``_on_server``)."""
    if _is_local(path):
        local = _local(path)
        return "directory" if os.path.isdir(local) else "file" if os.path.exists(local) else "missing"
    if is_connect(spark):
        return _on_server(spark, "kind", path)
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hpath):
        return "missing"
    return "directory" if fs.getFileStatus(hpath).isDirectory() else "file"


def write_bytes(spark, path: str, data: bytes) -> None:
    """Write a small file in one step: locally a temp file + rename; at a remote URI through Hadoop's
    FileSystem (a classic session's driver) or the server's (Spark Connect: ``_on_server``)."""
    if _is_local(path):
        path = _local(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return
    if is_connect(spark):
        _on_server(spark, "write", path, data)
        return
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    target = jvm.org.apache.hadoop.fs.Path(path)
    fs = target.getFileSystem(conf)
    tmp = jvm.org.apache.hadoop.fs.Path(path + ".tmp")
    out = fs.create(tmp, True)
    out.write(bytearray(data))
    out.close()
    fs.delete(target, False)
    fs.rename(tmp, target)


def delete_file(spark, path: str) -> None:
    if _is_local(path):
        try:
            os.remove(_local(path))
        except FileNotFoundError:
            pass
        return
    if is_connect(spark):
        _on_server(spark, "delete", path)
        return
    jvm = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(target, False)


def write_json(spark, path: str, payload: dict) -> None:
    write_bytes(spark, path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())


def _delta_exists(spark, path: str) -> bool:
    if is_connect(spark):  # one SQL command: no Delta table there (or nothing at all) is None
        return _delta_detail(spark, path) is not None
    from delta.tables import DeltaTable

    return _exists(spark, path) and DeltaTable.isDeltaTable(spark, path)


def replace_run_rows(spark, df, path: str, run_id: str, attempt: int | None = None, new: bool = False) -> None:
    """Write ``df`` (rows of one run, or of one attempt of it) so that the table holds exactly these
    rows for ``run_id`` (and ``attempt``). ``new``: the table holds none yet (a new attempt's number,
    one past every attempt of ``run_id`` in runs/): a plain append, one Delta commit without the scan
    and rewrite of ``replaceWhere`` (its two slowest Spark jobs)."""
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    writer = df.write.format("delta").option("mergeSchema", "true")
    if not new and _delta_exists(spark, path):
        where = f"run_id = '{run_id}'" + ("" if attempt is None else f" AND attempt = {int(attempt)}")
        writer.mode("overwrite").option("replaceWhere", where).save(path)
    else:
        writer.mode("append").save(path)


def delete_run_rows(spark, path: str, run_id: str, attempt: int | None = None) -> None:
    """Delete the rows of ``run_id`` (only those of ``attempt`` when given) from the Delta table at ``path``:
    one SQL ``DELETE`` (what ``DeltaTable.delete`` runs), on either kind of session."""
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    if _delta_exists(spark, path):
        where = f"run_id = '{run_id}'" + ("" if attempt is None else f" AND attempt = {int(attempt)}")
        spark.sql(f"DELETE FROM {table_name(path)} WHERE {where}")


CENTERS_FIXED = ("run_id", "attempt", "cluster_id", "noisy_weight", "private")


def write_centers(spark, path: str, run_id: str, feature_names: list[str], centers, noisy_weights,
                  private: bool = True, attempt: int = 1, new: bool = False) -> None:
    """The released centers of one attempt of a run: run_id, attempt, cluster_id, one column per
    feature, noisy_weight, and ``private`` (false for a fixed-seed run: NOT PRIVATE). Every attempt
    keeps its rows (a ``--force`` release adds its own beside the earlier one's); a table written
    before the ``attempt`` column existed gets it (null in its old rows). ``new``: no rows of this
    attempt can be there (``replace_run_rows``); appended by delta-rs to a LOCAL table with exactly
    these columns (``localdelta.append_rows``) or written as a new LOCAL table's first commit
    (``localdelta.create_table``: Spark's column types, all nullable as Spark's Delta writer makes
    them), else by Spark."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField("run_id", T.StringType(), False), T.StructField("attempt", T.IntegerType(), False),
         T.StructField("cluster_id", T.IntegerType(), False)]
        + [T.StructField(n, T.DoubleType(), False) for n in feature_names]
        + [T.StructField("noisy_weight", T.DoubleType(), False), T.StructField("private", T.BooleanType(), False)]
    )
    rows = [
        (run_id, int(attempt), j, *[float(v) for v in center], float(w), bool(private))
        for j, (center, w) in enumerate(zip(centers, noisy_weights))
    ]
    if new and RUN_ID_PATTERN.match(run_id) and not is_connect(spark):  # a LOCAL table: by delta-rs if it can
        columns = tuple(schema.fieldNames())
        found = [dict(zip(columns, r)) for r in rows]
        if localdelta.append_rows(path, found, columns):
            return
        ddl = [(f.name, f.dataType.simpleString().upper()) for f in schema.fields]
        if localdelta.create_table(path, found, ddl):
            return  # a new output path's centers/, created by its first attempt's rows
    frame = spark.createDataFrame(rows, schema).coalesce(1)
    if _delta_exists(spark, path) and "attempt" not in spark.read.format("delta").load(path).columns:
        # an old table: add the column first (a replaceWhere cannot name a column the table lacks)
        frame.limit(0).write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    replace_run_rows(spark, frame, path, run_id, attempt, new=new)


# ``non_private_operational`` is kept for old readers and old tables (appending needs no schema
# change) but is always null: operational data go to the operator log only (dpspark.runner).
RUNS_SCHEMA = (
    "run_id STRING, attempt INT, status STRING, algorithm STRING, objective STRING, k INT, parameters STRING, "
    "epsilon_spent DOUBLE, delta_spent DOUBLE, epsilon_configured DOUBLE, delta_configured DOUBLE, "
    "charges STRING, input_path STRING, input_key STRING, input_format STRING, input_version BIGINT, "
    "input_where STRING, dpspark_version STRING, started_at TIMESTAMP, ended_at TIMESTAMP, seed BIGINT, "
    "private BOOLEAN, privacy_note STRING, guarantee STRING, charged BOOLEAN, fit_started BOOLEAN, "
    "charge_reused_from INT, error STRING, "
    "non_private_operational STRING"
)
RUNS_COLUMNS = tuple(f.split()[0] for f in RUNS_SCHEMA.split(", "))
RETIRED_RUNS_COLUMNS = ("non_private_operational",)  # always written as null


def write_run_record(spark, path: str, record: dict, new: bool = False) -> None:
    """Upsert one row of the ``runs/`` table, keyed by (run id, attempt): every attempt keeps its row.
    ``new``: the attempt's first row (its ``running`` row), appended (``replace_run_rows``). A LOCAL
    table that exists is written by delta-rs (``localdelta.append_rows``: one commit, the same rows,
    without a cold driver's seconds for its first Delta writes), any other by Spark."""
    row = tuple(None if name in RETIRED_RUNS_COLUMNS else record.get(name) for name in RUNS_COLUMNS)
    run_id, attempt = str(record.get("run_id")), record.get("attempt")
    if RUN_ID_PATTERN.match(run_id) and (new or isinstance(attempt, int)) and not is_connect(spark):
        where = None if new else f"run_id = '{run_id}' AND attempt = {int(attempt)}"
        if localdelta.append_rows(path, [dict(zip(RUNS_COLUMNS, row))], RUNS_COLUMNS, replace_where=where):
            return
        if new and localdelta.create_table(path, [dict(zip(RUNS_COLUMNS, row))], RUNS_SCHEMA):
            return  # a new output path's runs/, created by this row
    df = spark.createDataFrame([row], RUNS_SCHEMA).coalesce(1)
    replace_run_rows(spark, df, path, record["run_id"], record.get("attempt"), new=new)


def read_attempts(spark, path: str, run_id: str) -> list[dict]:
    """The earlier attempts of ``run_id`` in ``runs/`` (oldest first), as dicts; [] if none.

    A local table is read without Spark (``read_attempts_without_spark``) when it can be; else, or
    when that read fails, with ``spark``."""
    from pyspark.sql import functions as F

    rows = None if is_connect(spark) else read_attempts_without_spark(path, run_id)
    if rows is not None:
        return rows
    if not _delta_exists(spark, path):
        return []
    df = spark.read.format("delta").load(path).where(F.col("run_id") == F.lit(run_id))
    order = "attempt" if "attempt" in df.columns else "started_at"
    return _numbered([r.asDict() for r in df.orderBy(F.col(order).asc_nulls_first()).collect()])


def read_attempts_without_spark(path: str, run_id: str) -> list[dict] | None:
    """``read_attempts`` of a LOCAL ``runs/`` table, read by delta-rs (``dpspark.localdelta``): no JVM,
    no Spark job, a fraction of a second where Spark's first Delta read in a new process takes
    seconds; the same rows and values as Spark's read. None when it cannot answer (a remote path, a
    folder that is not a Delta table, a table delta-rs cannot read): the caller reads with Spark."""
    local = local_path(path)
    if local is None:
        return None
    if not os.path.exists(local):
        return []  # no runs/ yet: no earlier attempts
    rows = localdelta.read_rows(path, {"run_id": [run_id]})
    if rows is None:
        return None
    order = "attempt" if rows and "attempt" in rows[0] else "started_at"
    rows.sort(key=lambda r: (r.get(order) is not None, r.get(order) if r.get(order) is not None else 0))
    return _numbered(rows)


def ledger_key_without_spark(path: str) -> str | None:
    """``ledger_key_of(spark, path)`` of a LOCAL table, without Spark: a Delta table's id read by
    delta-rs, another folder's canonical path. None when only Spark can answer (a remote path, a
    path that does not exist, a Delta table delta-rs cannot read)."""
    local = local_path(qualify(path))
    if local is None or not os.path.exists(local):
        return None
    if localdelta.has_log(local):
        found = localdelta.table_id(local)
        return None if found is None else f"delta-table:{found}"
    return canonical_path(None, local)


def local_delta_input(input_cfg) -> tuple[str, str, int] | None:
    """(path, ledger key, latest version) of the input a config names when it is a LOCAL Delta table
    read at its latest version (``input.path``, format delta, no ``input.version`` or
    ``input.timestamp``), from ONE delta-rs snapshot of its log: what ``load_input`` records for it,
    without Spark. None otherwise, or when delta-rs cannot read it (then only Spark can say)."""
    if (input_cfg.format != "delta" or getattr(input_cfg, "table", None) or input_cfg.version is not None
            or input_cfg.timestamp is not None or not input_cfg.path):
        return None
    path = qualify(input_cfg.path)
    table = localdelta.open_table(path)
    if table is None:
        return None
    try:
        return path, f"delta-table:{table.metadata().id}", int(table.version())
    except Exception:
        return None


def _numbered(rows: list[dict]) -> list[dict]:
    """Rows of runs/ with an ``attempt`` (a table older than the column: their order, from 1)."""
    for i, r in enumerate(rows):
        r.setdefault("attempt", None)
        if r["attempt"] is None:
            r["attempt"] = i + 1
    return rows


def check_output_location(spark, path: str, key: str = "output.path", delta_only: bool = False) -> None:
    """Before any charge: the output location must be a directory or creatable (not a file).

    On Spark Connect a remote URI is checked by the server (``small_file_kind``: this also shows,
    before any charge, that the server can write the small files, i.e. has dpspark's jar), except
    with ``delta_only`` (a location that holds Delta tables only, the ledger): left to the server's
    Delta there."""
    local = local_path(path)
    if local is not None:
        probe = os.path.abspath(local)
        while not os.path.exists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        if os.path.exists(local) and not os.path.isdir(local):
            raise SchemaError(f"{key}={path!r} is a file, not a directory")
        if not os.path.isdir(probe):
            raise SchemaError(f"{key}={path!r} cannot be created: {probe!r} is a file")
        if not os.access(probe, os.W_OK):
            raise SchemaError(f"{key}={path!r} is not writable ({probe!r} is read-only)")
        return
    if is_connect(spark) and delta_only:
        return
    if small_file_kind(spark, path) == "file":
        raise SchemaError(f"{key}={path!r} is a file, not a directory")
