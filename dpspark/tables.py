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
"""

from __future__ import annotations

import json
import os
import re
import tempfile

from dpspark.errors import SchemaError
from dpspark.privacy.bounding import bound_contributions
from dpspark.privacy.domain import Domain

UNIT_PREFIX = "_u"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def qualify(path: str) -> str:
    """An absolute form of a local path (``data/x`` and ``./data/x`` are the same table); URIs unchanged."""
    if "://" in path or path.startswith("file:"):
        return path
    return os.path.abspath(path)


def unit_columns(dim: int) -> list[str]:
    return [f"{UNIT_PREFIX}{j}" for j in range(dim)]


# ----------------------------------------------------------------------------
# Reading


def _exists(spark, path: str) -> bool:
    if "://" not in path:
        return os.path.exists(path)
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return fs.exists(hpath)


def load_table(spark, path: str, fmt: str):
    """Load a table; return (DataFrame, Delta version or None). Missing table -> SchemaError."""
    if not _exists(spark, path):
        raise SchemaError(f"input table not found: input.path={path!r} does not exist")
    if fmt == "delta":
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, path):
            raise SchemaError(f"input.path={path!r} is not a Delta table (set input.format to parquet or csv?)")
        version = DeltaTable.forPath(spark, path).history(1).select("version").first()["version"]
        df = spark.read.format("delta").option("versionAsOf", int(version)).load(path)
        return df, int(version)
    try:
        if fmt == "parquet":
            return spark.read.parquet(path), None
        return spark.read.option("header", True).option("inferSchema", True).csv(path), None
    except Exception as exc:
        raise SchemaError(f"cannot read input.path={path!r} as {fmt}: {exc}") from None


def _feature_expressions(df, features: tuple[str, ...], dim: int):
    """Per-dimension double Columns for the features, and their output names. Checks the schema."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = {f.name: f for f in df.schema.fields}
    for name in features:
        if name not in fields:
            raise SchemaError(f"feature column {name!r} (input.features) not found; the table has columns {sorted(fields)}")
    if len(features) == dim and all(isinstance(fields[n].dataType, T.NumericType) for n in features):
        return [F.col(n).cast("double") for n in features], list(features)
    if len(features) == 1:
        name = features[0]
        dtype = fields[name].dataType
        if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
            col = F.col(name)
        elif type(dtype).__name__ == "VectorUDT":
            from pyspark.ml.functions import vector_to_array

            col = vector_to_array(F.col(name))
        else:
            raise SchemaError(f"feature column {name!r} has type {dtype.simpleString()}: it must be numeric, or an array/vector of {dim} numbers")
        exprs = [F.when(F.size(col) == dim, F.get(col, j)).cast("double") for j in range(dim)]
        return exprs, [f"{name}_{j}" for j in range(dim)]
    bad = [n for n in features if not isinstance(fields[n].dataType, T.NumericType)]
    raise SchemaError(f"feature column {bad[0]!r} has type {fields[bad[0]].dataType.simpleString()}; feature columns must be numeric")


def check_schema(df, features: tuple[str, ...], privacy_unit: str | None, dim: int) -> list[str]:
    """Raise ``SchemaError`` unless the features and the privacy unit fit; return the feature names."""
    _, names = _feature_expressions(df, features, dim)
    if privacy_unit is not None and privacy_unit not in df.columns:
        raise SchemaError(f"privacy unit column {privacy_unit!r} (input.privacy_unit) not found; the table has columns {sorted(df.columns)}")
    return names


def prepare_points(df, features: tuple[str, ...], privacy_unit: str | None, domain: Domain, run_key: str):
    """Bound contributions, drop invalid rows, clip into the domain and map to unit space.

    Returns (DataFrame with the double columns ``_u0.._u{d-1}``, feature names). Lazy:
    nothing is computed until an algorithm's pass runs.
    """
    from pyspark.sql import functions as F

    names = check_schema(df, features, privacy_unit, domain.dim)
    exprs, _ = _feature_expressions(df, features, domain.dim)
    if privacy_unit is not None:
        raw = df.select(F.col(privacy_unit), *[e.alias(f"__f{j}") for j, e in enumerate(exprs)])
        raw = bound_contributions(raw, privacy_unit, [f"__f{j}" for j in range(domain.dim)], run_key)
    else:
        raw = df.select(*[e.alias(f"__f{j}") for j, e in enumerate(exprs)])
    cols = [F.col(f"__f{j}") for j in range(domain.dim)]
    valid = None
    for c in cols:
        ok = c.isNotNull() & ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))
        valid = ok if valid is None else valid & ok
    unit = raw.where(valid).select(*[e.alias(n) for e, n in zip(domain.unit_columns(cols), unit_columns(domain.dim))])
    return unit, names


# ----------------------------------------------------------------------------
# Writing


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def _local(path: str) -> str:
    return path[len("file:"):] if path.startswith("file:") else path


def write_bytes(spark, path: str, data: bytes) -> None:
    """Write a small file atomically (temp file + rename), locally or through Hadoop's FileSystem."""
    if _is_local(path):
        path = _local(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
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
    jvm = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(target, False)


def write_json(spark, path: str, payload: dict) -> None:
    write_bytes(spark, path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())


def _delta_exists(spark, path: str) -> bool:
    from delta.tables import DeltaTable

    return _exists(spark, path) and DeltaTable.isDeltaTable(spark, path)


def replace_run_rows(spark, df, path: str, run_id: str) -> None:
    """Write ``df`` (rows of one run) so that the table holds exactly these rows for ``run_id``."""
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    writer = df.write.format("delta").option("mergeSchema", "true")
    if _delta_exists(spark, path):
        writer.mode("overwrite").option("replaceWhere", f"run_id = '{run_id}'").save(path)
    else:
        writer.mode("append").save(path)


def delete_run_rows(spark, path: str, run_id: str) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if _delta_exists(spark, path):
        DeltaTable.forPath(spark, path).delete(F.col("run_id") == F.lit(run_id))


CENTERS_FIXED = ("run_id", "cluster_id", "noisy_weight")


def write_centers(spark, path: str, run_id: str, feature_names: list[str], centers, noisy_weights) -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField("run_id", T.StringType(), False), T.StructField("cluster_id", T.IntegerType(), False)]
        + [T.StructField(n, T.DoubleType(), False) for n in feature_names]
        + [T.StructField("noisy_weight", T.DoubleType(), False)]
    )
    rows = [
        (run_id, j, *[float(v) for v in center], float(w))
        for j, (center, w) in enumerate(zip(centers, noisy_weights))
    ]
    replace_run_rows(spark, spark.createDataFrame(rows, schema).coalesce(1), path, run_id)


RUNS_SCHEMA = (
    "run_id STRING, status STRING, algorithm STRING, objective STRING, k INT, parameters STRING, "
    "epsilon_spent DOUBLE, delta_spent DOUBLE, epsilon_configured DOUBLE, delta_configured DOUBLE, "
    "charges STRING, input_path STRING, input_format STRING, input_version BIGINT, dpspark_version STRING, "
    "started_at TIMESTAMP, ended_at TIMESTAMP, seed BIGINT, private BOOLEAN, error STRING"
)


def write_run_record(spark, path: str, record: dict) -> None:
    """Upsert one row of the ``runs/`` table (keyed by run id)."""
    row = tuple(record.get(name) for name in (f.split()[0] for f in RUNS_SCHEMA.split(", ")))
    df = spark.createDataFrame([row], RUNS_SCHEMA).coalesce(1)
    replace_run_rows(spark, df, path, record["run_id"])
