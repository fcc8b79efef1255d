"""Contribution bounding: at most one row per person, before anything else.

Neighbouring datasets differ by one *record*. When one person may own several
rows (``input.privacy_unit`` names the column that identifies the person), each
person keeps exactly one of their rows, chosen uniformly at random among the
person's distinct rows with randomness keyed by the run: the kept row is the one
with the smallest HMAC-SHA256(sub-key, person | SHA-256(row content)), where the
sub-key is ``derive_key(run key, "contribution-bounding")`` (independent of every
other use of the run key).

- Deterministic per record for a given run key (a retried task keeps the same
  row) and independent of the data's partitioning.
- The key is secret, so the choice cannot be predicted; it never appears in the
  query plan (``explain()``, the Spark UI, event logs): the keyed hash runs in a
  pandas UDF whose closure holds the key, and the plan shows only its name.
- Identical rows: the person is part of the hashed message, so two persons with
  identical rows make independent choices (identical records are still
  different people). Rows of ONE person with identical content tie; they are
  interchangeable (the kept values are the same whichever wins), so the choice
  is uniform over the person's distinct rows, which is as private: the choice
  depends on that person's rows only.

Without ``privacy_unit`` every row is treated as a different person.
"""

from __future__ import annotations

import hashlib
import hmac

from dpspark.privacy.randomness import derive_key

LABEL = "contribution-bounding"


def row_keys(sub_key: str):
    """The keyed hash of (person, content hash) rows, as a function of two pandas Series.

    Only the sub-key (bytes) is captured, not a hash object (those cannot be pickled).
    The content hash is 64 hex characters at the end of the message, so
    "person|hash" parses uniquely whatever the person's value holds.
    """
    key = sub_key.encode()

    def dp_bounding_keys(units, contents):
        import pandas as pd

        base = hmac.new(key, digestmod=hashlib.sha256)
        out = []
        for unit, content in zip(units.tolist(), contents.tolist()):
            h = base.copy()
            h.update(f"{unit}|{content}".encode("utf-8", "surrogatepass"))
            out.append(h.hexdigest())
        return pd.Series(out, dtype=object)

    return dp_bounding_keys


def unit_key(df, privacy_unit: str):
    """The person's identity as a string Column: nulls form one person, and -0.0 is 0.0 (a float id
    cast to string would otherwise split one person into two)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    col = F.col(privacy_unit)
    if isinstance(df.schema[privacy_unit].dataType, (T.FloatType, T.DoubleType)):
        col = F.when(col == F.lit(0.0), F.lit(0.0).cast(df.schema[privacy_unit].dataType)).otherwise(col)
    return F.coalesce(col.cast("string"), F.lit("\u0000null"))


def bound_contributions(df, privacy_unit: str, feature_columns: list[str], run_key: str):
    """Keep one uniformly random row per value of ``privacy_unit`` (nulls form one person)."""
    from pyspark.sql import functions as F

    keys = F.pandas_udf(row_keys(derive_key(run_key, LABEL)), "string")
    unit = unit_key(df, privacy_unit)
    content = F.sha2(F.to_json(F.struct(*[F.col(c) for c in feature_columns])), 256)  # no key: public function
    chosen = (
        df.withColumn("__dp_unit", unit)
        .withColumn("__dp_key", keys(F.col("__dp_unit"), content))
        .groupBy("__dp_unit")
        .agg(F.min_by(F.struct(*[F.col(c) for c in feature_columns]), F.col("__dp_key")).alias("__dp_row"))
    )
    return chosen.select(*[F.col("__dp_row")[c].alias(c) for c in feature_columns])
