"""Spark side of the ldp family: simulated clients (mapInPandas) and ingested reports (Delta).

Simulation (``mode: simulate``): every simulated client (a person) gets a secret
seed SHA-256("dpspark-ldp-user|" run key "|" record key) (``client.user_seed``,
``client_seeds``). The record key must differ between people, also when their
records are identical: equal keys give equal seeds, and two people with equal
seeds send the SAME report, which is not epsilon-LDP for the pair (for
D = {A: x', B: x} against D' = {A: x, B: x} the probability that the two reports
are equal changes by a factor 1 / P[R(x') = r], far above e^epsilon). So:

- with ``input.privacy_unit``: the key is the person's key bytes
  (``bounding.unit_key``: a typed, injective encoding of the unit's value, so two
  people never share a key, whatever their ids hold), after contribution bounding
  (one row per person, so keys are distinct);
- without it: every row is a person, and the key is the row's unit-space point
  AND its duplicate index: the m rows with the same point are numbered 0..m-1 in
  the column ``__ldp_dup`` (``duplicate_keys``), and the executors' Python makes
  the key bytes from the point's 8 d bytes and the index's 8 bytes
  (``client.point_record_keys``: fixed length, so distinct (point, index) pairs
  give distinct keys, no hash collision involved). Rows with the same point are
  interchangeable, so which of them gets which index does not matter: the
  multiset of (key, point) pairs is a function of the multiset of points, hence
  the same under task retries, recomputation of a cached table and any
  partitioning (a retried task re-sends the same reports, and every person
  answers in the same round in all three passes). (Until issue 15 the key was the
  string "<SHA-256 of to_json(point)>#<index>" made in the JVM: the JSON formatting
  and hashing of every row was about a third of the fit at n = 10^6, d = 10.)

The run key reaches the executors inside the ``mapInPandas`` closures, never as a
literal in a query plan. Round 1's pass (``first_pass``) also sorts the records into
their rounds: its output (persisted by the estimator) holds round 1's reports and the
keyed points of rounds 2 and 3 with their round, the clients' own draw; the seeds are
never stored, every pass derives them again from the run key and the record key. The executors run the numpy client
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
import logging
from datetime import datetime, timezone

import numpy as np

from dpspark import tables
from dpspark.ldp import client
from dpspark.ldp.protocol import Histogram
from dpspark.privacy.bounding import bound_contributions
from dpspark.progress import detail, log

KEY = "__ldp_key"  # record key column (binary: bounding.unit_key) when rows are keyed by the privacy unit
DUP = "__ldp_dup"  # duplicate index column (long) when rows are keyed by their content
VALID = "__ldp_valid"  # whether every feature of the row is finite (computed once per row)
REPORT_SCHEMA = "sub INT, a LONG, y INT"


def duplicate_keys(unit_df, unit_names: list[str]):
    """One row per input row: its (unit-space) point and its duplicate index ``__ldp_dup``.

    Rows with the same point are grouped and counted, then expanded back into m rows with
    the indices 0..m-1; the record key is (point, index) (``client.point_record_keys``, made
    on the executors from these columns). Deterministic, no ordering involved: the output
    multiset depends only on the multiset of points. -0.0 is normalised to 0.0 first, so
    equal points are one group (their reports would be the same anyway).
    """
    from pyspark.sql import functions as F

    normal = [F.when(F.col(n) == 0.0, F.lit(0.0)).otherwise(F.col(n)).alias(n) for n in unit_names]
    counted = unit_df.select(*normal).groupBy(*unit_names).count()
    index = F.explode(F.sequence(F.lit(0).cast("long"), F.col("count") - 1))
    return counted.select(index.alias(DUP), *[F.col(n) for n in unit_names])


def record_keys(pdf, columns: list[str]) -> list:
    """The record keys of a batch of ``keyed_points`` rows: the ``__ldp_key`` bytes (privacy unit),
    else the (point, duplicate index) bytes of ``client.point_record_keys``."""
    return client.frame_record_keys(pdf, KEY, DUP, columns)


def keyed_points(df, features, privacy_unit, domain, run_key):
    """(DataFrame of unit-space ``_u0.._u{d-1}`` and the record key, feature names).

    The record key is the binary column ``__ldp_key`` (the person's ``bounding.unit_key``) when
    ``privacy_unit`` is set, else the point with its duplicate index ``__ldp_dup``
    (``record_keys`` reads either). Keys are distinct per person (see the module
    docstring); ``run_key`` is used only by contribution bounding (through its own
    sub-key), and only when ``privacy_unit`` is set.
    """
    from pyspark.sql import functions as F

    names = tables.check_schema(df, features, privacy_unit, domain.dim)
    exprs, _ = tables._feature_expressions(df, features, domain.dim)
    fcols = [f"__f{j}" for j in range(domain.dim)]
    unit_names = tables.unit_columns(domain.dim)
    if privacy_unit is not None:
        raw = df.select(F.col("`" + privacy_unit.replace("`", "``") + "`"), *[e.alias(c) for e, c in zip(exprs, fcols)])
        raw = bound_contributions(raw, privacy_unit, fcols, run_key, key_column=KEY)
    else:
        raw = df.select(*[e.alias(c) for e, c in zip(exprs, fcols)])
    cols = [F.col(c) for c in fcols]
    valid = None
    for c in cols:
        ok = c.isNotNull() & ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))
        valid = ok if valid is None else valid & ok
    # The row's validity is one column, computed once: written into each of the d unit expressions,
    # its 3 d tests made 3 d^2 (7,500 at d = 50; the keyed points at 10^6 x 50 took 14.4-16.0 s, now
    # 12.4-12.8 s). The unit-space projection's generated code is still over the JVM's 64 KB method
    # limit at d = 50: Spark runs that stage without whole-stage code generation.
    raw = raw.select("*", valid.alias(VALID))
    # A row with a missing, NaN or infinite feature still reports, from the public point 0 of unit
    # space (the domain's center): in the local model the number of reports is used as public, so it
    # must not depend on record values (dropping such rows would make it a statistic of them).
    unit_exprs = [F.when(F.col(VALID), e).otherwise(F.lit(0.0)).alias(n)
                  for e, n in zip(domain.unit_columns(cols), unit_names)]
    if privacy_unit is not None:
        return raw.select(F.col(KEY), *unit_exprs), names
    return duplicate_keys(raw.select(*unit_exprs), unit_names), names


client_seeds = client.client_seeds  # lives in the numpy-only client: executors import only that module


def client_runner(params, run_key: str, fractions, round_no: int, columns: list[str]):
    """The mapInPandas function: the numpy client for every record of round ``round_no``.

    The run key lives in this closure (pickled to the executors), not in the query plan.
    """

    def dp_ldp_clients(batches):
        import pandas as pd

        for pdf in batches:
            if len(pdf) == 0:
                continue
            seeds = client.client_seeds(run_key, client.frame_record_keys(pdf, KEY, DUP, columns))
            chosen = np.nonzero(client.choose_round_batch(seeds, fractions) == round_no)[0]
            if len(chosen) == 0:  # no client of this batch answers in this round
                continue
            x = pdf[columns].to_numpy(dtype=np.float64)[chosen]
            sub, a, y = client.randomize_batch(x, params, [seeds[i] for i in chosen])
            yield pd.DataFrame({"sub": sub.astype(np.int32), "a": a.astype(np.int64), "y": y.astype(np.int32)})

    return dp_ldp_clients


ROUND = "__ldp_round"


def first_pass_schema(points_df) -> str:
    """The output of ``first_pass_runner``: the round, a round-1 report, the row's key and point."""
    from pyspark.sql import types as T

    fields = [f"{ROUND} INT", REPORT_SCHEMA]
    for f in points_df.schema.fields:
        fields.append(f"{f.name} {'STRING' if isinstance(f.dataType, T.StringType) else f.dataType.simpleString().upper()}")
    return ", ".join(fields)


def first_pass_runner(params, run_key: str, fractions, columns: list[str], key_columns: list[str]):
    """The mapInPandas function of the first pass: every record draws its round; round-1 clients report.

    Per input batch it yields (1) the reports of the batch's round-1 clients (``sub, a, y``, the
    same reports as ``client_runner(params, .., 1, ..)``; key and point columns zero) and (2) the
    rows of the clients of rounds 2 and 3 unchanged, with their round (``sub, a, y`` zero). The
    round is a draw from the client's own randomness (never from its point), the same draw
    ``client_runner`` makes in its own pass. The run key lives in this closure only.
    """

    def dp_ldp_first_round(batches):
        import pandas as pd

        for pdf in batches:
            if len(pdf) == 0:
                continue
            seeds = client.client_seeds(run_key, client.frame_record_keys(pdf, KEY, DUP, columns))
            rounds = client.choose_round_batch(seeds, fractions)
            one = np.nonzero(rounds == 1)[0]
            later = np.nonzero(rounds != 1)[0]
            if len(one):
                x = pdf[columns].to_numpy(dtype=np.float64)[one]
                sub, a, y = client.randomize_batch(x, params, [seeds[i] for i in one])
                out = {ROUND: np.ones(len(one), dtype=np.int32), "sub": sub.astype(np.int32),
                       "a": a.astype(np.int64), "y": y.astype(np.int32)}
                for c in key_columns:
                    out[c] = np.full(len(one), b"", dtype=object) if c == KEY else np.zeros(len(one), dtype=np.int64)
                for c in columns:
                    out[c] = np.zeros(len(one), dtype=np.float64)
                yield pd.DataFrame(out)
            if len(later):
                rest = pdf.iloc[later]
                out = {ROUND: rounds[later].astype(np.int32), "sub": np.zeros(len(later), dtype=np.int32),
                       "a": np.zeros(len(later), dtype=np.int64), "y": np.zeros(len(later), dtype=np.int32)}
                for c in [*key_columns, *columns]:
                    out[c] = rest[c].to_numpy()
                yield pd.DataFrame(out)

    return dp_ldp_first_round


def first_pass(points_df, params, run_key: str, fractions, dim: int):
    """Round 1's pass, which also sorts every record into its round: a DataFrame to persist.

    ``round_histogram(split, 1)`` is round 1's histogram; ``round_points(split, r)`` for r = 2, 3
    are the keyed points of round r's clients, for ``simulate_round``, whose clients then all
    answer (the same draw). One pass over all the records instead of three: the later rounds'
    passes read only their own quarter of the users.
    """
    columns = tables.unit_columns(dim)
    key_columns = [c for c in points_df.columns if c not in columns]
    run = first_pass_runner(params, run_key, tuple(fractions), columns, key_columns)
    return points_df.mapInPandas(run, first_pass_schema(points_df))


def round_histogram(split_df, round_no: int) -> Histogram:
    from pyspark.sql import functions as F

    return _histogram(split_df.where(F.col(ROUND) == round_no).select("sub", "a", "y"))


def round_points(split_df, round_no: int, dim: int):
    from pyspark.sql import functions as F

    keep = [c for c in split_df.columns if c not in (ROUND, "sub", "a", "y")]
    return split_df.where(F.col(ROUND) == round_no).select(*keep)


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
    df.write.format("delta").mode("error").save(path)  # "error": Spark Connect knows no "errorifexists"
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
        # An exact count: the operator's log only in an accounted run (dpspark.progress.detail).
        detail("ldp: dropped %d malformed reports of round %d (outside the public ranges)", bad, params.round,
               level=logging.WARNING)
    good = counted.loc[counted["ok"]] if len(counted) else counted
    if len(good) == 0:
        e = np.zeros(0, dtype=np.int64)
        return Histogram(e, e, e, e)
    return Histogram.from_frame(good)
