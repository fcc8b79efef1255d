"""The privacy unit's key is a typed, injective encoding of its value (issue 26, finding 5b).

Until issue 26 a person was ``coalesce(cast(unit AS string), '\\u0000null')``, and distinct
people shared that string: ``["a, b"]`` and ``["a", "b"]``, ``["null"]`` and ``[null]``,
structs whose fields hold ", ", the string "\\u0000null" and null (merged into one person,
so removing one of them is a substitution: 2 epsilon), and binary ids that are not UTF-8
(each reached the keyed hash and ldp's seed derivation as the same replacement character:
their choices and their ldp reports were the same). Every collision test below fails on
that code (checked by running this file against ``git show HEAD`` of the package).

Every check is deterministic (fixed run keys); the one statistical check states its confidence.
"""

from __future__ import annotations

import hashlib
import math
import struct
from datetime import date, datetime, timezone
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from dpspark.errors import SchemaError
from dpspark.ldp import client
from dpspark.privacy import bounding
from dpspark.privacy.domain import Domain

RUN_KEY = hashlib.sha256(b"privacy-unit-keys").hexdigest()
DOMAIN = Domain(dim=1, lower=(0.0,), upper=(100.0,))


def keys_of(df, unit="u") -> list:
    """``unit_key`` of every row, in the order of the column ``i``."""
    return [r[0] for r in df.orderBy("i").select(bounding.unit_key(df, unit)).collect()]


# ----------------------------------------------------------------------------
# The pairs that the string cast merged


COLLIDING = {  # (Spark type of the unit, first id, second id): two people each
    "array with a comma": ("array<string>", ["a, b"], ["a", "b"]),
    "array with the word null": ("array<string>", ["null"], [None]),
    "struct with a comma": ("struct<a:string,b:string>", ("x, y", None), ("x", "y, null")),
    "null marker string": ("string", "\u0000null", None),
    "binary, not UTF-8": ("binary", bytearray(b"\xff"), bytearray(b"\xfe")),
}


def pair_frame(spark, case):
    dtype, first, second = COLLIDING[case]
    return spark.createDataFrame([(0, first, 10.0), (1, second, 90.0)], f"i int, u {dtype}, x double")


@pytest.mark.parametrize("case", sorted(COLLIDING))
def test_ids_that_the_string_cast_merged_are_two_people(spark, case):
    df = pair_frame(spark, case)
    first, second = keys_of(df)
    assert first != second  # old code: equal strings (for binary, both the replacement character)
    kept = bounding.bound_contributions(df, "u", ["x"], RUN_KEY).toPandas()
    assert sorted(kept["x"]) == [10.0, 90.0]  # both people keep their row


@pytest.mark.parametrize("case", sorted(COLLIDING))
def test_ids_that_the_string_cast_merged_get_two_ldp_seeds(spark, case):
    from dpspark.ldp import spark as ldp_spark

    df = pair_frame(spark, case)
    keyed = ldp_spark.keyed_points(df, ("x",), "u", DOMAIN, RUN_KEY)[0].toPandas().sort_values("_u0")
    record_keys = ldp_spark.record_keys(keyed, ["_u0"])
    assert len(record_keys) == 2
    seeds = client.client_seeds(RUN_KEY, record_keys)
    assert seeds[0] != seeds[1]  # old code: one seed, hence the same report for both people
    # The seeds come from the new key bytes (bounding.unit_key), person by person (x = 10, then 90).
    assert record_keys == keys_of(df)


def test_non_utf8_binary_ids_choose_their_rows_independently(spark):
    """128 people with ids b"\\x80" .. b"\\xff" (each cast to the same replacement character by
    the old code) own the same two rows. Their choices are independent: all 128 keep the same
    row with probability 2 * 2^-128 under independence; the old keying made them always equal."""
    rows = [(i, bytearray([0x80 + i]), x) for i in range(128) for x in (10.0, 90.0)]
    df = spark.createDataFrame(rows, "i int, u binary, x double")
    kept = bounding.bound_contributions(df, "u", ["x"], RUN_KEY).toPandas()
    assert len(kept) == 128
    assert kept["x"].nunique() == 2


# ----------------------------------------------------------------------------
# One person stays one person


def test_negative_zero_is_zero_and_every_nan_is_one_person(spark):
    quiet_nan = float("nan")
    other_nan = struct.unpack(">d", struct.pack(">Q", 0x7FF0000000000123))[0]  # another payload
    assert math.isnan(other_nan)
    ids = [0.0, -0.0, quiet_nan, other_nan, -quiet_nan, None, 1.0, float("inf"), float("-inf"), 5e-324]
    df = spark.createDataFrame([(i, u, float(i)) for i, u in enumerate(ids)], "i int, u double, x double")
    keys = keys_of(df)
    assert keys[0] == keys[1]  # -0.0 is 0.0
    assert keys[2] == keys[3] == keys[4]  # every NaN is the one NaN person
    assert len({keys[i] for i in (0, 2, 5, 6, 7, 8, 9)}) == 7  # all else are different people
    assert len(bounding.bound_contributions(df, "u", ["x"], RUN_KEY).collect()) == 7
    # Floats widen exactly: the same people as doubles (a Delta column widened float -> double keeps them).
    floats = spark.createDataFrame([(i, u, float(i)) for i, u in enumerate(ids[:9])], "i int, u float, x double")
    assert keys_of(floats) == keys[:9]  # (5e-324 is no float)


def test_integral_widths_are_one_person_and_types_never_meet(spark):
    """1 as int or long is one person (a widened Delta column keeps its people); 1, 1.0, "1",
    true and 1 day after the epoch are tagged apart (a column has one type, so this only
    matters inside nested values and as a check on the tags)."""
    ints = [keys_of(spark.createDataFrame([(0, 1)], f"i int, u {t}"))[0] for t in ("tinyint", "smallint", "int", "bigint")]
    assert len(set(ints)) == 1
    others = [keys_of(spark.createDataFrame([(0, v)], f"i int, u {t}"))[0]
              for t, v in (("double", 1.0), ("string", "1"), ("boolean", True), ("date", date(1970, 1, 2)),
                           ("decimal(3,0)", Decimal(1)))]
    assert len({ints[0], *others}) == 6


# ----------------------------------------------------------------------------
# The format (the module docstring's), checked against an independent encoder


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def sized(b: bytes) -> bytes:
    return i64(len(b)) + b


def test_unit_key_is_the_documented_encoding(spark):
    null = b"\x00"
    s = lambda v: b"\x05" + sized(v.encode())  # noqa: E731
    cases = {
        "boolean": [(True, b"\x01\x01"), (False, b"\x01\x00"), (None, null)],
        "bigint": [(0, b"\x02" + i64(0)), (-1, b"\x02" + i64(-1)), (2**63 - 1, b"\x02" + i64(2**63 - 1))],
        "double": [(1.5, b"\x03" + struct.pack(">d", 1.5)), (-2.0**-1074, b"\x03" + struct.pack(">d", -2.0**-1074)),
                   (float("nan"), b"\x03" + i64(bounding.NAN_BITS))],
        "decimal(6,2)": [(Decimal("-0.50"), b"\x04" + i64(2) + sized(b"-50")), (Decimal("1234.00"), b"\x04" + i64(2) + sized(b"123400")),
                         (Decimal("0.00"), b"\x04" + i64(2) + sized(b"0"))],
        "string": [("", s("")), ("é|\u0000null", s("é|\u0000null"))],
        "binary": [(bytearray(b""), b"\x06" + sized(b"")), (bytearray(b"\x00\xff"), b"\x06" + sized(b"\x00\xff"))],
        "date": [(date(1969, 12, 31), b"\x07" + i64(-1))],
        "timestamp": [(datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=timezone.utc), b"\x08" + i64(1_000_005))],
        "timestamp_ntz": [(datetime(1970, 1, 2), b"\x09" + i64(86_400_000_000))],
        "array<bigint>": [([], b"\x0a" + i64(0)), ([7, None], b"\x0a" + i64(2) + b"\x02" + i64(7) + null)],
        "array<array<string>>": [([["a"], []], b"\x0a" + i64(2) + b"\x0a" + i64(1) + s("a") + b"\x0a" + i64(0))],
        "struct<a:string,b:array<double>>": [(("a", [0.0]), b"\x0b" + s("a") + b"\x0a" + i64(1) + b"\x03" + i64(0)),
                                             ((None, None), b"\x0b" + null + null), (None, null)],
    }
    for dtype, values in cases.items():
        df = spark.createDataFrame([(i, v) for i, (v, _) in enumerate(values)], f"i int, u {dtype}")
        assert keys_of(df) == [expected for _, expected in values], dtype


def test_double_bits_are_exact(spark):
    """The pure-Spark doubleToLongBits equals numpy's bits on random bit patterns (every class:
    normal, subnormal, inf, NaN) and next to every power of two, where log2 rounds."""
    rng = np.random.default_rng(26)
    values = rng.integers(-(2**63), 2**63 - 1, size=3000, dtype=np.int64).view(np.float64).tolist()
    for k in range(-1074, 1024, 7):
        p = 2.0**k
        values += [p, float(np.nextafter(p, 0.0)), -float(np.nextafter(p, np.inf))]
    values += [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308,
               float("inf"), float("-inf"), float("nan")]
    df = spark.createDataFrame([(float(v),) for v in values], "x double")
    out = df.select("x", bounding._double_bits(F.col("x")).alias("bits")).toPandas()
    x = out["x"].to_numpy()
    with np.errstate(invalid="ignore"):
        expected = np.where(np.isnan(x), bounding.NAN_BITS, (x + 0.0).view(np.int64))
    assert np.array_equal(out["bits"].to_numpy(), expected)


# ----------------------------------------------------------------------------
# Contribution bounding with typed keys, and types that cannot identify a person


def test_bound_contributions_keeps_exactly_one_row_per_person(spark):
    """Person p (an id of a nested type, null included) owns p + 1 rows whose feature is
    100 p + row; exactly one row per person is kept, it is that person's, and the choice is
    the same on 1 and 3 partitions and in another row order."""
    ids = [None, ("a", [1, 2]), ("a", [12]), ("a, [1", [2]), ("", []), ("", None), (None, [None]), ("\u0000null", [])]
    rows = [(p, u, float(100 * p + r)) for p, u in enumerate(ids) for r in range(p + 1)]
    schema = "p int, u struct<s:string,n:array<bigint>>, x double"
    pdf = pd.DataFrame(rows, columns=["p", "u", "x"])

    def kept(frame):
        out = bounding.bound_contributions(frame, "u", ["p", "x"], RUN_KEY, key_column="k").toPandas()
        return out.sort_values("p").reset_index(drop=True)

    first = kept(spark.createDataFrame(rows, schema).coalesce(1))
    again = kept(spark.createDataFrame(pdf.sample(frac=1.0, random_state=1).values.tolist(), schema).repartition(3))
    assert first["p"].tolist() == list(range(len(ids)))
    assert all(100 * p <= x <= 100 * p + p for p, x in zip(first["p"], first["x"]))
    pd.testing.assert_frame_equal(first, again)
    people = spark.createDataFrame(list(enumerate(ids)), "i int, u struct<s:string,n:array<bigint>>")
    assert first["k"].tolist() == keys_of(people)  # the key_column is the person's unit_key


@pytest.mark.parametrize("dtype, named", [
    ("map<string,int>", "map<string,int>"),
    ("array<map<string,int>>", "map<string,int>"),
    ("string collate UTF8_LCASE", "string collate UTF8_LCASE"),
    ("interval day to second", "interval day to second"),
])
def test_types_that_cannot_identify_a_person_are_refused(spark, dtype, named):
    df = spark.createDataFrame([], f"u {dtype}, x double")
    with pytest.raises(SchemaError, match=r"'u' \(input\.privacy_unit\)") as err:
        bounding.check_privacy_unit(df, "u")
    assert named in str(err.value)
    with pytest.raises(SchemaError):
        bounding.bound_contributions(df, "u", ["x"], RUN_KEY)
    bounding.check_privacy_unit(df, None)  # no privacy unit: nothing to check
