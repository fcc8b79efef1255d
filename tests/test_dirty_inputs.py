"""Dirty values (issue 16, item 4; issue 13, defect 10): a missing, nan/NaN/n/a, non-numeric or
infinite feature value drops its row; columns that are not features are never read, so a column
Spark cannot even type (a pandas nanosecond timestamp) does not fail the run. Only a feature column
whose own schema type is wrong (Delta, Parquet) is a schema error."""

from __future__ import annotations

import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpspark import tables
from dpspark.cli import main
from dpspark.config import validate
from dpspark.privacy.domain import Domain

from test_pipeline import make_config, points_frame, read_summary

DIRTY = ["nan", "NaN", "n/a", "N/A", "abc", "", "inf", "-Infinity", "1e400", "NULL", "12,5"]


def input_cfg(path, fmt, features=("x", "y")):
    return validate({"input": {"path": path, "format": fmt, "features": list(features)},
                     "domain": {"lower": [0, 0], "upper": [100, 100]},
                     "algorithm": {"name": "dplloyd", "k": 2}, "output": {"path": "/tmp/unused"}}).input


def test_dirty_csv_cells_drop_their_rows_and_nothing_else(spark, tmp_path):
    """Each dirty cell is in its own row (x or y); the clean rows all survive, in the domain."""
    path = tmp_path / "dirty.csv"
    lines = ["id,x,y,comment"] + [f"{i},{10 + i},{20 + i},fine" for i in range(30)]
    for j, cell in enumerate(DIRTY):
        quoted = f'"{cell}"'
        lines.append(f"d{j},{quoted if j % 2 else 5},{5 if j % 2 else quoted},\"has, a comma\"")
    path.write_text("\n".join(lines) + "\n")
    table = tables.load_input(spark, input_cfg(str(path), "csv"))
    assert table.df.columns == ["x", "y"] and table.df.dtypes == [("x", "double"), ("y", "double")]
    unit, _ = tables.prepare_points(table.df, ("x", "y"), None, Domain(2, (0.0, 0.0), (100.0, 100.0)), "k")
    rows = unit.collect()
    assert len(rows) == 30  # every dirty row dropped, every clean row kept
    assert all(-1.0 <= v <= 1.0 for r in rows for v in r)


def test_a_run_on_a_dirty_csv_succeeds(spark, tmp_path):
    path = tmp_path / "people.csv"
    pdf = points_frame(40).astype({"x": str})
    pdf.loc[[0, 5, 9], "x"] = ["nan", "n/a", "oops"]
    pdf.to_csv(path, index=False)
    cfg, c = make_config(tmp_path, str(path), **{"input.format": "csv", "output.report": False})
    assert main(["run", "--config", cfg, "--run-id", "dirty"], spark=spark) == 0
    assert len(read_summary(c)["centers"]) == 3


def test_parquet_with_a_nanosecond_timestamp_column_that_is_not_a_feature(spark, tmp_path):
    path = str(tmp_path / "people.parquet")
    pdf = points_frame(30).assign(seen=pd.Timestamp("2026-11-30 12:00:00.123456789"), note="x")
    pq.write_table(pa.Table.from_pandas(pdf), path, coerce_timestamps=None, version="2.6")
    assert "timestamp[ns]" in str(pq.read_schema(path).field("seen").type)
    cfg, c = make_config(tmp_path, path, **{"input.format": "parquet", "output.report": False})
    assert main(["run", "--config", cfg, "--run-id", "nanos"], spark=spark) == 0
    assert read_summary(c)["status"] == "succeeded"


def test_a_feature_whose_schema_type_is_wrong_is_a_config_error(spark, tmp_path, capsys):
    path = str(tmp_path / "typed.parquet")
    pdf = points_frame(10).astype({"x": str})
    pq.write_table(pa.Table.from_pandas(pdf), path)
    cfg, c = make_config(tmp_path, path, **{"input.format": "parquet"})
    assert main(["run", "--config", cfg], spark=spark) == 2  # the config names a text column (exit 2)
    assert "feature column 'x' has type string" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(c["output"]["path"], "summary.json"))


@pytest.mark.parametrize("fmt", ["csv"])
def test_csv_missing_feature_column_names_it(spark, tmp_path, fmt):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(Exception, match="feature column 'x'"):
        tables.load_input(spark, input_cfg(str(path), fmt))


def where_cfg(path, fmt, where):
    return validate({"input": {"path": path, "format": fmt, "features": ["x", "y"], "where": where},
                     "domain": {"lower": [0, 0], "upper": [100, 100]},
                     "algorithm": {"name": "dplloyd", "k": 2}, "output": {"path": "/tmp/unused"}}).input


@pytest.mark.parametrize("where", [
    "raise_error(concat('x=', x)) IS NULL",  # a failure that depends on a record, quoting its value
    "assert_true(x <> 37.2) IS NULL",
    "(SELECT count(*) FROM range(3)) > 0",  # a subquery could read the input itself
    "reflect('java.lang.System', 'exit', 1) IS NULL",
])
def test_where_allows_row_filters_only(spark, tmp_path, where):
    from dpspark.errors import ConfigError

    path = str(tmp_path / "t.parquet")
    spark.createDataFrame(points_frame(5)).coalesce(1).write.parquet(path)
    with pytest.raises(ConfigError, match="input.where"):
        tables.load_input(spark, where_cfg(path, "parquet", where))


def test_where_on_a_dirty_csv_drops_rows_instead_of_failing(spark, tmp_path):
    """CSV columns are strings; a comparison with a cell that is not a number is null (row dropped),
    never a run-failing cast error that quotes the cell."""
    path = tmp_path / "t.csv"
    path.write_text("x,y,day\n10,20,1\nn/a,30,2\n40,50,2\n60,70,alice@example.com\n")
    table = tables.load_input(spark, where_cfg(str(path), "csv", "day >= 2 AND x > 5"))
    assert sorted(r.x for r in table.df.collect()) == [40.0]
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"  # the session's setting is back


def test_a_delta_table_cannot_be_read_as_parquet(spark, tmp_path, write_delta):
    from dpspark.errors import SchemaError

    path = write_delta(points_frame(5))
    with pytest.raises(SchemaError, match="is a Delta table"):
        tables.load_input(spark, input_cfg(path, "parquet"))


def test_a_person_id_of_minus_zero_is_the_same_person(spark):
    """A double privacy-unit column: -0.0 and 0.0 are one person (one row kept), as are two NaN ids."""
    pdf = pd.DataFrame({"pid": [0.0, -0.0, 0.0, float("nan"), float("nan"), 1.0],
                        "x": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0], "y": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    df = spark.createDataFrame(pdf)
    unit, _ = tables.prepare_points(df, ("x", "y"), "pid", Domain(2, (0.0, 0.0), (100.0, 100.0)), "k" * 64)
    assert unit.count() == 3
