"""Contribution bounding: at most one row per person, before anything else.

Neighbouring datasets differ by one *record*. When one person may own several
rows (``input.privacy_unit`` names the column that identifies the person), each
person keeps exactly one of their rows, chosen uniformly at random among the
person's distinct rows with randomness keyed by the run: the kept row is the one
with the smallest HMAC-SHA256(sub-key, person key | "|" | SHA-256(row content)),
where the sub-key is ``derive_key(run key, "contribution-bounding")`` (independent
of every other use of the run key).

The person key (``unit_key``) is a typed, injective byte encoding of the unit's
value, made by Spark expressions on the executors (no string cast, nothing
collected): two values get the same key exactly when they are the same person.
A string cast would merge people (two non-UTF-8 binary ids, ``["a, b"]`` and
``["a", "b"]``, the string "\\u0000null" and null) and removing one of two merged
people is a substitution, 2 epsilon. Every encoding is self-delimiting (a tag
byte, then a fixed width or a length prefix), so nesting stays injective:

- null (at any depth): the single byte 0x00, which no value's encoding starts with;
- boolean: 0x01, one byte 0/1;
- byte/short/int/long: 0x02, the value as a big-endian int64 (1 as int or long: one person);
- float/double: 0x03, the IEEE 754 binary64 bits, big-endian, of the value as a double
  (a float widens exactly), with -0.0 folded into 0.0 and every NaN into one NaN person
  (Spark's own grouping does the same; refusing NaN would need a check that fails on a
  record's value, which is itself a release, so NaN ids are one person, like null);
- decimal: 0x04, its scale (int64), then the digits of its unscaled value, length-prefixed
  (the column's scale is fixed, so 1.50 in decimal(4, 2) has one form);
- string: 0x05, its raw UTF-8 bytes, length-prefixed (binary collation only: under a
  collation such as UTF8_LCASE "A" and "a" are one value, which raw bytes would split);
- binary: 0x06, its raw bytes, length-prefixed;
- date: 0x07, days since 1970-01-01; timestamp: 0x08, microseconds since the epoch;
  timestamp_ntz: 0x09, microseconds since 1970-01-01 00:00 (no time zone involved); int64;
- array: 0x0a, its length (int64), then each element's encoding;
- struct: 0x0b, then each field's encoding, in the type's order.
Lengths are big-endian int64. Maps, intervals, variants and user-defined types are
refused (``ColumnError``, exit 2, naming ``input.privacy_unit`` and the type).

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

NULL_TAG = b"\x00"
TAG_BOOLEAN, TAG_INTEGRAL, TAG_FLOAT, TAG_DECIMAL = b"\x01", b"\x02", b"\x03", b"\x04"
TAG_STRING, TAG_BINARY, TAG_DATE, TAG_TIMESTAMP, TAG_TIMESTAMP_NTZ = b"\x05", b"\x06", b"\x07", b"\x08", b"\x09"
TAG_ARRAY, TAG_STRUCT = b"\x0a", b"\x0b"
NAN_BITS = 0x7FF8000000000000  # the one NaN person
INF_BITS = 0x7FF0000000000000


def _as_bytes(unit) -> bytes:
    if isinstance(unit, (bytes, bytearray, memoryview)):
        return bytes(unit)
    return str(unit).encode("utf-8", "surrogatepass")  # callers outside Spark; Spark passes unit_key's bytes


def row_keys(sub_key: str):
    """The keyed hash of (person key, content hash) rows, as a function of two pandas Series.

    Only the sub-key (bytes) is captured, not a hash object (those cannot be pickled).
    The person key is ``unit_key``'s bytes (a str is taken as its UTF-8 bytes); the content
    hash is 64 hex characters at the end of the message, so "person|hash" parses uniquely
    whatever the person key holds.
    """
    key = sub_key.encode()

    def dp_bounding_keys(units, contents):
        import pandas as pd

        base = hmac.new(key, digestmod=hashlib.sha256)
        out = []
        for unit, content in zip(units.tolist(), contents.tolist()):
            h = base.copy()
            h.update(_as_bytes(unit) + b"|" + str(content).encode("ascii"))
            out.append(h.hexdigest())
        return pd.Series(out, dtype=object)

    return dp_bounding_keys


def _int64(col):
    """A long Column as its 8 bytes, big-endian two's complement (hex gives 16 digits for negatives)."""
    from pyspark.sql import functions as F

    return F.unhex(F.lpad(F.hex(col.cast("long")), 16, "0"))


def _sized(binary):
    """A binary Column prefixed with its length (int64)."""
    from pyspark.sql import functions as F

    return F.concat(_int64(F.octet_length(binary)), binary)


def _double_bits(x):
    """The IEEE 754 binary64 bits of a double Column, as a long, by exact arithmetic (Spark SQL
    has no doubleToLongBits): -0.0 gives 0.0's bits and every NaN the one ``NAN_BITS``.

    For finite a = |x| > 0: e = floor(log2 a), corrected by exact comparisons with 2^e (pow of
    2.0 to an integer is exact when representable, and log2 is off by at most one); then
    m = a * 2^(52 - e) is an integer in [2^52, 2^53) (products with powers of two are exact,
    split in two steps where 2^(52 - e) would overflow). Normal: ((e + 1023) << 52) + m - 2^52;
    subnormal (a < 2^-1022): a * 2^1074, its fraction field. The sign adds bit 63.
    """
    from pyspark.sql import functions as F

    finite = ~F.isnan(x) & (F.abs(x) != F.lit(float("inf"))) & (x != F.lit(0.0))
    a = F.when(finite, F.abs(x)).otherwise(F.lit(1.0))  # total: no log of 0, inf or NaN below
    e0 = F.floor(F.log2(a))
    e = F.when(a < F.pow(F.lit(2.0), e0), e0 - 1).when(a >= F.pow(F.lit(2.0), e0 + 1), e0 + 1).otherwise(e0)
    m = F.when(e >= 0, a * F.pow(F.lit(2.0), 52 - e)).otherwise(a * F.pow(F.lit(2.0), 537.0) * F.pow(F.lit(2.0), 52 - 537 - e))
    normal = (e + 1023) * F.lit(2**52) + m.cast("long") - F.lit(2**52)
    tiny = F.least(a, F.lit(2.0**-1022))  # so that this branch, even where unused, cannot overflow a long
    subnormal = (tiny * F.pow(F.lit(2.0), 537.0) * F.pow(F.lit(2.0), 537.0)).cast("long")
    magnitude = F.when(e >= -1022, normal).otherwise(subnormal)
    sign = F.when(x < 0, F.lit(-(2**63))).otherwise(F.lit(0))
    return (F.when(F.isnan(x), F.lit(NAN_BITS))
            .when(x == F.lit(float("inf")), F.lit(INF_BITS))
            .when(x == F.lit(float("-inf")), F.lit(INF_BITS - 2**63))
            .when(x == F.lit(0.0), F.lit(0))  # 0.0 and -0.0: one person
            .otherwise(sign + magnitude))


def _refuse(column: str, dtype, inner) -> None:
    from dpspark.errors import ColumnError

    where = "" if inner is dtype else f" (it holds {inner.simpleString()})"
    raise ColumnError("input.privacy_unit",
        f"privacy unit column {column!r} (input.privacy_unit) has type {dtype.simpleString()}{where}, which cannot "
        "identify a person: use a column of type boolean, integer, float, double, decimal, string (binary collation), "
        "binary, date, timestamp or timestamp_ntz, or an array or struct of these")


def _encode(col, dtype, column: str, top):
    """The injective encoding of ``col`` (of Spark type ``dtype``) as a binary Column, never null."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return F.lit(NULL_TAG)
    if isinstance(dtype, T.BooleanType):
        tag, body = TAG_BOOLEAN, F.when(col, F.lit(b"\x01")).otherwise(F.lit(b"\x00"))
    elif isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        tag, body = TAG_INTEGRAL, _int64(col)
    elif isinstance(dtype, (T.FloatType, T.DoubleType)):
        tag, body = TAG_FLOAT, _int64(_double_bits(col.cast("double")))
    elif isinstance(dtype, T.DecimalType):
        # Spark's decimal-to-string is exact and plain, with exactly `scale` fraction digits:
        # without its point and leading zeros it is the unscaled value's digits.
        digits = F.regexp_replace(F.regexp_replace(col.cast("string"), r"\.", ""), r"^(-?)0+(?=[0-9])", "$1")
        tag, body = TAG_DECIMAL, F.concat(_int64(F.lit(dtype.scale)), _sized(digits.cast("binary")))
    elif isinstance(dtype, (T.StringType, T.CharType, T.VarcharType)):
        if getattr(dtype, "collation", "UTF8_BINARY") != "UTF8_BINARY":
            _refuse(column, top, dtype)
        tag, body = TAG_STRING, _sized(col.cast("binary"))  # the raw bytes, not decoded
    elif isinstance(dtype, T.BinaryType):
        tag, body = TAG_BINARY, _sized(col)
    elif isinstance(dtype, T.DateType):
        tag, body = TAG_DATE, _int64(F.unix_date(col))
    elif isinstance(dtype, T.TimestampNTZType):
        epoch = F.lit("1970-01-01 00:00:00").cast("timestamp_ntz")
        tag, body = TAG_TIMESTAMP_NTZ, _int64(F.timestamp_diff("MICROSECOND", epoch, col))
    elif isinstance(dtype, T.TimestampType):
        tag, body = TAG_TIMESTAMP, _int64(F.unix_micros(col))
    elif isinstance(dtype, T.ArrayType):
        elements = F.transform(col, lambda x: _encode(x, dtype.elementType, column, top))
        joined = F.aggregate(elements, F.lit(b""), lambda acc, b: F.concat(acc, b))
        tag, body = TAG_ARRAY, F.concat(_int64(F.size(col)), joined)
    elif isinstance(dtype, T.StructType):
        fields = [_encode(col.getField(f.name), f.dataType, column, top) for f in dtype.fields]
        tag, body = TAG_STRUCT, F.concat(F.lit(b""), *fields)
    else:  # map (no equality in Spark), interval, variant, user-defined: refused before any data is read
        _refuse(column, top, dtype)
    return F.when(col.isNull(), F.lit(NULL_TAG)).otherwise(F.concat(F.lit(tag), body))


def unit_key(df, privacy_unit: str):
    """The person's key as a binary Column: a typed, injective encoding of the unit's value (see the
    module docstring). Equal keys exactly for the same person; null is one person, -0.0 is 0.0,
    every NaN is one person. Raises ``ColumnError`` for a type that cannot identify a person."""
    from pyspark.sql import functions as F

    dtype = df.schema[privacy_unit].dataType
    return _encode(F.col("`" + privacy_unit.replace("`", "``") + "`"), dtype, privacy_unit, dtype)


def check_privacy_unit(df, privacy_unit: str | None) -> None:
    """Raise ``ColumnError`` if ``privacy_unit``'s type cannot identify a person (reads no data)."""
    if privacy_unit is not None:
        unit_key(df, privacy_unit)


def bound_contributions(df, privacy_unit: str, feature_columns: list[str], run_key: str,
                        key_column: str | None = None):
    """Keep one uniformly random row per person (value of ``privacy_unit``; nulls form one person).

    Returns the ``feature_columns`` of the kept rows and, if ``key_column`` is given, the
    person's ``unit_key`` under that name (ldp's simulated clients derive their seeds from it).
    """
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
    kept = [F.col("__dp_row")[c].alias(c) for c in feature_columns]
    if key_column is not None:
        kept = [F.col("__dp_unit").alias(key_column), *kept]
    return chosen.select(*kept)
