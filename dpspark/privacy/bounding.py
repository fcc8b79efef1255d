"""Contribution bounding: at most one row per person, before anything else.

Neighbouring datasets differ by one *record*. When one person may own several
rows (``input.privacy_unit`` names the column that identifies the person), each
person keeps exactly one of their rows, chosen uniformly at random with
randomness keyed by the run: the kept row is the one with the smallest
SHA-256(run key | person | row content). The choice is deterministic per record
for a given run key (a retried task keeps the same row) and independent of the
data's partitioning, and the run key is secret, so the choice cannot be
predicted. Rows with identical content are interchangeable, so ties do not matter.

Without ``privacy_unit`` every row is treated as a different person.
"""

from __future__ import annotations


def bound_contributions(df, privacy_unit: str, feature_columns: list[str], run_key: str):
    """Keep one uniformly random row per value of ``privacy_unit`` (nulls form one person)."""
    from pyspark.sql import functions as F

    unit = F.coalesce(F.col(privacy_unit).cast("string"), F.lit("\u0000null"))
    content = F.to_json(F.struct(*[F.col(c) for c in feature_columns]))
    key = F.sha2(F.concat_ws("|", F.lit(run_key), unit, content), 256)
    chosen = (
        df.withColumn("__dp_unit", unit)
        .withColumn("__dp_key", key)
        .groupBy("__dp_unit")
        .agg(F.min_by(F.struct(*[F.col(c) for c in feature_columns]), F.col("__dp_key")).alias("__dp_row"))
    )
    return chosen.select(*[F.col("__dp_row")[c].alias(c) for c in feature_columns])
