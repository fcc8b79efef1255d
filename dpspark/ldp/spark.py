"""Spark side of the ldp family: simulated clients (mapInPandas) and ingested reports (Delta).

Simulation (``mode: simulate``): every record gets a secret seed
SHA-256("dpspark-ldp-user|" run key "|" record key) (``client.user_seed``). The
record key is the privacy unit's value when ``input.privacy_unit`` is set (after
contribution bounding, one row per person), and otherwise SHA-256 of the JSON of the
whole row (all its columns): deterministic per record, so a retried task re-sends
the same report. Two rows with identical content share a key and so send identical
reports (each report is still epsilon-LDP for its user; the duplicates are
correlated, which only costs utility). The executors run the numpy client
(``client.randomize_batch``) and Spark aggregates the reports into exact integer
counts per (sub, a, y) with a group-by; only these counts reach the driver.

Ingestion (``mode: ingest``): round parameters are Delta tables
``{protocol_path}/round={r}`` (one row: round, kind, params JSON, written_at);
reports are Delta tables ``{reports_path}/round={r}`` with integer columns
``sub, a, y`` (other columns are ignored). Reports outside the public ranges are
dropped (their number is logged).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np

from dpspark import tables
from dpspark.ldp import client
from dpspark.ldp.protocol import Histogram
from dpspark.privacy.bounding import bound_contributions
from dpspark.progress import log

KEY = "__ldp_key"
REPORT_SCHEMA = "sub INT, a LONG, y INT"


def keyed_points(df, features, privacy_unit, domain, run_key):
    """(DataFrame with the record key ``__ldp_key`` and unit-space ``_u0.._u{d-1}``, feature names)."""
    from pyspark.sql import functions as F

    names = tables.check_schema(df, features, privacy_unit, domain.dim)
    exprs, _ = tables._feature_expressions(df, features, domain.dim)
    fcols = [f"__f{j}" for j in range(domain.dim)]
    if privacy_unit is not None:
        key = F.coalesce(F.col(privacy_unit).cast("string"), F.lit("\u0000null"))
        raw = df.select(key.alias(KEY), *[e.alias(c) for e, c in zip(exprs, fcols)])
        raw = bound_contributions(raw, KEY, [KEY, *fcols], run_key)
    else:
        key = F.sha2(F.to_json(F.struct(*[F.col(c) for c in df.columns])), 256)
        raw = df.select(key.alias(KEY), *[e.alias(c) for e, c in zip(exprs, fcols)])
    cols = [F.col(c) for c in fcols]
    valid = None
    for c in cols:
        ok = c.isNotNull() & ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))
        valid = ok if valid is None else valid & ok
    unit = raw.where(valid).select(F.col(KEY), *[e.alias(n) for e, n in zip(domain.unit_columns(cols), tables.unit_columns(domain.dim))])
    return unit, names


def client_runner(params, run_key: str, fractions, round_no: int, columns: list[str]):
    """The mapInPandas function: the numpy client for every record of round ``round_no``."""

    def run(batches):
        import pandas as pd

        for pdf in batches:
            if len(pdf) == 0:
                continue
            seeds = [client.user_seed(run_key, k) for k in pdf[KEY].tolist()]
            chosen = np.nonzero(client.choose_round_batch(seeds, fractions) == round_no)[0]
            x = pdf[columns].to_numpy(dtype=np.float64)[chosen]
            sub, a, y = client.randomize_batch(x, params, [seeds[i] for i in chosen])
            yield pd.DataFrame({"sub": sub.astype(np.int32), "a": a.astype(np.int64), "y": y.astype(np.int32)})

    return run


def _histogram(reports_df) -> Histogram:
    import pandas as pd

    pdf = reports_df.groupBy("sub", "a", "y").count().toPandas()
    if len(pdf) == 0:
        pdf = pd.DataFrame({"sub": [], "a": [], "y": [], "count": []})
    return Histogram.from_frame(pdf)


def simulate_round(points_df, params, run_key: str, fractions, round_no: int, dim: int) -> Histogram:
    """One Spark pass: simulated clients of ``round_no`` report; exact counts per (sub, a, y)."""
    run = client_runner(params, run_key, tuple(fractions), round_no, tables.unit_columns(dim))
    return _histogram(points_df.mapInPandas(run, REPORT_SCHEMA))


# ----------------------------------------------------------------------------
# Ingestion


def round_path(base: str, round_no: int) -> str:
    return f"{base.rstrip('/')}/round={round_no}"


def read_round_params(spark, protocol_path: str, round_no: int):
    path = round_path(protocol_path, round_no)
    if not tables._delta_exists(spark, path):
        return None
    rows = spark.read.format("delta").load(path).collect()
    if len(rows) != 1:
        raise ValueError(f"{path} should hold exactly one row of round parameters, found {len(rows)}")
    return client.round_from_dict(json.loads(rows[0]["params"]))


def write_round_params(spark, protocol_path: str, params) -> None:
    path = round_path(protocol_path, params.round)
    row = (int(params.round), params.to_dict()["kind"], json.dumps(params.to_dict()),
           datetime.now(timezone.utc).replace(tzinfo=None))
    df = spark.createDataFrame([row], "round INT, kind STRING, params STRING, written_at TIMESTAMP").coalesce(1)
    df.write.format("delta").mode("errorifexists").save(path)
    log.info("ldp: published the parameters of round %d at %s", params.round, path)


def read_reports(spark, reports_path: str, params) -> Histogram | None:
    """The round's reports as a histogram, or None if their table does not exist yet."""
    from pyspark.sql import functions as F

    path = round_path(reports_path, params.round)
    if not tables._delta_exists(spark, path):
        return None
    df = spark.read.format("delta").load(path)
    missing = [c for c in ("sub", "a", "y") if c not in df.columns]
    if missing:
        from dpspark.errors import SchemaError

        raise SchemaError(f"reports table {path} lacks the column(s) {missing}; expected integer columns sub, a, y")
    df = df.select(F.col("sub").cast("long").alias("sub"), F.col("a").cast("long").alias("a"), F.col("y").cast("long").alias("y"))
    ok = (F.col("sub").between(0, params.subs - 1) & F.col("a").between(0, params.oracle.pool - 1)
          & F.col("y").between(0, params.oracle.g - 1))
    counted = df.groupBy("sub", "a", "y").count().withColumn("ok", F.coalesce(ok, F.lit(False))).toPandas()
    bad = int(counted.loc[~counted["ok"], "count"].sum()) if len(counted) else 0
    if bad:
        log.warning("ldp: dropped %d malformed reports of round %d (outside the public ranges)", bad, params.round)
    good = counted.loc[counted["ok"]] if len(counted) else counted
    if len(good) == 0:
        e = np.zeros(0, dtype=np.int64)
        return Histogram(e, e, e, e)
    return Histogram.from_frame(good)
