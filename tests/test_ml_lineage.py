"""DPClustering with a ledger fits a DataFrame that reads ledgerInput alone (issue 26, finding 5a).

The fit is charged to ledgerInput's balance, so the DataFrame's analysed plan must be scans of that
table and transformations of them (dpspark/lineage.py). Each attack below (rows from the driver, an
RDD, spark.range, a union or join with other data, a subquery, another table, the table's files read
as parquet, a shallow clone, the change feed, cached data of unknown origin) is refused with a
ParamError on ledgerInput BEFORE anything reaches the ledger. The README pattern (Delta table ->
VectorAssembler -> DPClustering with a ledger) still fits and is charged once.
The fits use a fixed seed (unsafeFixedSeed=True): NOT PRIVATE, reproducible on purpose.
"""

from __future__ import annotations

import os
import shutil
import types

import numpy as np
import pandas as pd
import pytest

from conftest import blobs
from dpspark import lineage, tables
from dpspark.ml import DPClustering, ParamError
from dpspark.privacy.ledger import Ledger

LOWER, UPPER = [0.0, 0.0], [10.0, 10.0]
CAP = (5.0, 1e-5)


@pytest.fixture(scope="module")
def setup(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("lineage")
    points = blobs(100, [(2.0, 2.0), (8.0, 3.0), (5.0, 8.0)], 0.4, seed=5)
    pdf = pd.DataFrame({"id": np.arange(len(points)), "x": points[:, 0], "y": points[:, 1]})
    table = str(base / "points")
    spark.createDataFrame(pdf).repartition(2).write.format("delta").option(
        "delta.enableChangeDataFeed", "true").save(table)
    other = str(base / "other")
    spark.createDataFrame(pdf).repartition(2).write.format("delta").save(other)
    ledger_path = str(base / "ledger")
    key = tables.ledger_key_of(spark, table)
    Ledger(spark, ledger_path).set_budget(key, *CAP)
    df = spark.read.format("delta").load(table)
    return {"base": base, "table": table, "other": other, "ledger": ledger_path, "key": key, "df": df, "pdf": pdf}


def _estimator(setup, **extra):
    params = dict(k=3, epsilon=1.0, delta=1e-6, lower=LOWER, upper=UPPER, algorithm="maxcover", candidateCount=64,
                  seed=7, unsafeFixedSeed=True, inputCols=["x", "y"], ledgerPath=setup["ledger"],
                  ledgerInput=setup["table"])
    if "featuresCol" in extra:
        del params["inputCols"]
    params.update(extra)
    return DPClustering(**params)


def _refused_before_the_charge(spark, setup, dataset, match: str, **extra) -> str:
    """fit(dataset) raises ParamError on ledgerInput matching ``match``; the ledger is untouched."""
    ledger = Ledger(spark, setup["ledger"])
    events_before = ledger.events()
    spent_before = ledger.totals(setup["key"]).spent_epsilon
    with pytest.raises(ParamError, match=match) as info:
        _estimator(setup, **extra).fit(dataset)
    assert info.value.param == "ledgerInput"
    assert "spark.read.format('delta').load(" in str(info.value)  # says what to do
    events_after = ledger.events()
    assert len(events_after) == len(events_before)  # no started/charged/failed event
    assert not [e for e in events_after if e["status"] == "charged" and e not in events_before]
    assert ledger.totals(setup["key"]).spent_epsilon == pytest.approx(spent_before)
    return str(info.value)


def _temp_views(spark, setup, prefix: str) -> tuple[str, str]:
    pts, oth = f"{prefix}_points", f"{prefix}_other"
    setup["df"].createOrReplaceTempView(pts)
    spark.read.format("delta").load(setup["other"]).createOrReplaceTempView(oth)
    return pts, oth


# --- attacks: every one refused before the charge ------------------------------------------------


def test_create_dataframe_from_to_pandas_is_refused(spark, setup):
    # The private rows round-trip through the driver: the plan is a LocalRelation, no file at all.
    local_copy = spark.createDataFrame(setup["df"].toPandas())
    _refused_before_the_charge(spark, setup, local_copy, "rows held by the driver")


def test_local_checkpoint_is_refused(spark, setup):
    _refused_before_the_charge(spark, setup, setup["df"].localCheckpoint(), r"an RDD \(checkpoint")


def test_rdd_based_dataframe_is_refused(spark, setup):
    df = setup["df"]
    _refused_before_the_charge(spark, setup, spark.createDataFrame(df.rdd, df.schema), "an RDD")


def test_spark_range_is_refused(spark, setup):
    generated = spark.range(300).selectExpr("cast(id % 10 as double) as x", "cast(id % 7 as double) as y")
    _refused_before_the_charge(spark, setup, generated, "spark.range")


def test_union_with_local_rows_is_refused(spark, setup):
    df = setup["df"]
    extra = spark.createDataFrame(setup["pdf"].head(5))
    _refused_before_the_charge(spark, setup, df.unionByName(extra), "rows held by the driver")


def test_join_with_another_table_is_refused(spark, setup):
    other = spark.read.format("delta").load(setup["other"]).select("id", "x")
    joined = setup["df"].drop("x").join(other, "id")
    message = _refused_before_the_charge(spark, setup, joined, "the Delta table")
    assert setup["other"] in message


def test_another_table_alone_is_refused(spark, setup):
    other = spark.read.format("delta").load(setup["other"])
    _refused_before_the_charge(spark, setup, other, "table id")


def test_subqueries_are_refused_whatever_they_read(spark, setup):
    pts, oth = _temp_views(spark, setup, "lineage_sub")
    try:
        scalar = spark.sql(f"SELECT x, y + (SELECT max(y) FROM {oth}) AS y FROM {pts}")
        _refused_before_the_charge(spark, setup, scalar, "subquery")
        # Over ledgerInput itself too: a row would then depend on other rows.
        own = spark.sql(f"SELECT x, y FROM {pts} WHERE x > (SELECT avg(x) FROM {pts})")
        _refused_before_the_charge(spark, setup, own, "subquery")
    finally:
        spark.catalog.dropTempView(pts)
        spark.catalog.dropTempView(oth)


def test_delta_files_read_as_parquet_are_refused(spark, setup):
    # Old code: the files lie under ledgerInput, so it passed; parquet also reads rows Delta removed.
    _refused_before_the_charge(spark, setup, spark.read.parquet(setup["table"]), "read it as Delta")


def test_lineage_refusals_without_a_fit(spark, setup, tmp_path):
    """Leaves a fit would refuse the same way (checked directly: no fit needed)."""
    df, table = setup["df"], setup["table"]
    cases = {
        "change data feed": spark.read.format("delta").option("readChangeFeed", "true")
                                 .option("startingVersion", 0).load(table),
        "without a table": spark.sql("SELECT 1.0 AS x, 2.0 AS y"),
    }
    for match, dataset in cases.items():
        with pytest.raises(lineage.LineageError, match=match):
            lineage.check_reads_only(dataset, table)
    # A shallow clone has its own table id (its own balance) but reads the source's files.
    clone = str(tmp_path / "clone")
    spark.sql(f"CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{table}`")
    with pytest.raises(lineage.LineageError, match="outside ledgerInput's folder"):
        lineage.check_reads_only(spark.read.format("delta").load(clone), clone)
    # A Delta table read where ledgerInput is a parquet folder, and the other way round.
    parquet = str(tmp_path / "parquet")
    setup["df"].write.parquet(parquet)
    with pytest.raises(lineage.LineageError, match="ledgerInput is not a Delta table"):
        lineage.check_reads_only(df, parquet)
    with pytest.raises(lineage.LineageError, match="ParquetFileFormat files at"):
        lineage.check_reads_only(spark.read.parquet(parquet), table)
    # A copy of the table (cp -r keeps its table id) is read, not the table at ledgerInput.
    copy = str(tmp_path / "copy")
    shutil.copytree(table, copy)
    assert tables.ledger_key_of(spark, copy) == setup["key"]
    with pytest.raises(lineage.LineageError, match="ledgerInput's table is"):
        lineage.check_reads_only(spark.read.format("delta").load(copy), table)


def test_delta_scan_of_another_table_id_is_refused(spark, setup, monkeypatch):
    """The scan's table id must be ledgerInput's (the ledger key), not only its path."""
    monkeypatch.setattr(tables, "ledger_key_of", lambda *a, **k: "delta-table:00000000-not-this-table")
    with pytest.raises(lineage.LineageError, match="00000000-not-this-table"):
        lineage.check_reads_only(setup["df"], setup["table"])


def test_cached_data_of_unknown_origin_is_refused_and_a_cached_scan_is_checked(spark, setup):
    """An InMemoryRelation leaf (the plan Spark substitutes for cached data) is checked through the plan
    it caches. A user reaches such a leaf only through internals (Dataset.ofRows), as here."""
    from pyspark.sql import DataFrame

    def over_cached_data(df):
        df.cache()
        df.count()
        jds = spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(
            spark._jsparkSession, df._jdf.queryExecution().withCachedData())
        out = DataFrame(jds, spark)
        assert out._jdf.queryExecution().analyzed().getClass().getName().endswith("InMemoryRelation")
        return out

    local = spark.createDataFrame(setup["pdf"])
    scan = setup["df"].select("x", "y")
    try:
        with pytest.raises(lineage.LineageError, match="rows held by the driver"):
            lineage.check_reads_only(over_cached_data(local), setup["table"])
        lineage.check_reads_only(over_cached_data(scan), setup["table"])
    finally:
        local.unpersist()
        scan.unpersist()


def test_spark_connect_dataframe_is_refused_with_a_ledger(spark, setup):
    """No py4j plan (Spark Connect): the plan cannot be checked, so a fit with a ledger is refused."""
    connect_like = types.SimpleNamespace(sparkSession=spark)  # what lineage sees of such a DataFrame
    with pytest.raises(lineage.LineageError, match="Spark Connect"):
        lineage.check_reads_only(connect_like, setup["table"])


# --- what stays allowed -------------------------------------------------------------------------


def test_transformations_of_the_table_pass(spark, setup):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df, table = setup["df"], setup["table"]
    cached = df.select("x", "y").cache()
    pts, _ = _temp_views(spark, setup, "lineage_ok")
    try:
        allowed = [
            df,
            VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip").transform(
                df.filter("x > 1").withColumn("y", F.col("y")).sample(0.5, seed=1).repartition(3)),
            df.where(F.col("x").isNotNull() & (F.lower(F.col("x").cast("string")) != "nan")).select("x", "y"),
            df.select("x", "y").distinct().orderBy("x").limit(100),
            spark.read.format("delta").option("versionAsOf", 0).load(table),  # time travel: same table
            cached,  # df.cache() keeps the analysed plan
            spark.sql(f"WITH p AS (SELECT * FROM {pts}) SELECT x, y FROM p"),
        ]
        for dataset in allowed:
            lineage.check_reads_only(dataset, table)
        # Any spelling of ledgerInput is the same table.
        lineage.check_reads_only(df, "file://" + table + "/")
        lineage.check_reads_only(df, os.path.relpath(table))
    finally:
        cached.unpersist()
        spark.catalog.dropTempView(pts)
        spark.catalog.dropTempView("lineage_ok_other")


def test_parquet_ledger_input_accepts_its_files(spark, setup, tmp_path):
    parquet = str(tmp_path / "parquet_ok")
    setup["df"].write.parquet(parquet)
    lineage.check_reads_only(spark.read.parquet(parquet), parquet)
    one_file = next(f for f in sorted(os.listdir(parquet)) if f.endswith(".parquet"))
    lineage.check_reads_only(spark.read.parquet(os.path.join(parquet, one_file)), parquet)  # a part of it


def test_readme_pattern_still_fits_and_is_charged_once(spark, setup):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    ledger = Ledger(spark, setup["ledger"])
    spent_before = ledger.totals(setup["key"]).spent_epsilon
    df = spark.read.format("delta").load(setup["table"])
    est = _estimator(setup, featuresCol="features")
    assembler = VectorAssembler(inputCols=["x", "y"], outputCol="features", handleInvalid="skip")
    model = Pipeline(stages=[assembler, est]).fit(df)
    summary = model.stages[-1].summary
    assert len(model.stages[-1].clusterCenters()) == 3
    assert ledger.totals(setup["key"]).spent_epsilon == pytest.approx(spent_before + 1.0)
    charged = [e for e in ledger.runs(setup["key"]) if e["run_id"] == summary.runId and e["status"] == "charged"]
    assert len(charged) == 1


# --- one record, one row, and nothing that can raise on a value (issue 26, finding 5 and the sweep) ----------


def test_steps_that_multiply_rows_or_can_raise_are_refused(spark, setup):
    """Between the scan and the fit only row-wise steps with total expressions: a self-union, a
    self-join or an explode gives one record the weight of several rows; a VectorAssembler in its
    default 'error' mode, arithmetic, or a UDF can raise on one record's value after the charge."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df, table = setup["df"], setup["table"]
    cases = {
        "Union": df.union(df),
        "Join": df.alias("a").join(df.alias("b"), "x"),
        "Generate": df.withColumn("x", F.explode(F.array("x", "x"))),
        "Window": df.withColumn("r", F.row_number().over(__import__("pyspark.sql.window", fromlist=["Window"])
                                                          .Window.orderBy("x"))),
        "Aggregate": df.groupBy("x").agg(F.avg("y").alias("y")),
        "ScalaUDF": VectorAssembler(inputCols=["x", "y"], outputCol="features").transform(df),
        "Multiply": df.withColumn("y", F.col("y") * 2),
        "Divide": df.withColumn("y", F.col("y") / F.col("x")),
        "MapInPandas": df.mapInPandas(lambda it: it, df.schema),
        "Sample with replacement": df.sample(withReplacement=True, fraction=2.0, seed=1),
    }
    for what, dataset in cases.items():
        with pytest.raises(lineage.LineageError, match=what):
            lineage.check_reads_only(dataset, table)


def test_a_vector_assembler_that_raises_is_refused_before_the_charge(spark, setup):
    """The fit with a ledger refuses VectorAssembler's 'error' mode before any ledger event (it would
    fail after the charge exactly when some record has a null or NaN feature)."""
    from pyspark.ml.feature import VectorAssembler

    assembled = VectorAssembler(inputCols=["x", "y"], outputCol="features").transform(setup["df"])
    _refused_before_the_charge(spark, setup, assembled, "handleInvalid='skip'", featuresCol="features")
