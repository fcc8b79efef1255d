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


def test_a_feature_whose_schema_type_is_wrong_is_a_schema_error(spark, tmp_path, capsys):
    path = str(tmp_path / "typed.parquet")
    pdf = points_frame(10).astype({"x": str})
    pq.write_table(pa.Table.from_pandas(pdf), path)
    cfg, c = make_config(tmp_path, path, **{"input.format": "parquet"})
    assert main(["run", "--config", cfg], spark=spark) == 1
    assert "feature column 'x' has type string" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(c["output"]["path"], "summary.json"))


@pytest.mark.parametrize("fmt", ["csv"])
def test_csv_missing_feature_column_names_it(spark, tmp_path, fmt):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(Exception, match="feature column 'x'"):
        tables.load_input(spark, input_cfg(str(path), fmt))
