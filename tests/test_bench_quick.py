"""Smoke test of the benchmark scripts' --quick modes (issues 6, 7): they run end to end and write their tables.

Runs each script as a subprocess with this interpreter (the project's venv). Budget: about 90 s in total
(bench_scale --quick starts a local SparkSession; bench_utility --quick --no-peer is numpy only).
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
DATASETS = (ROOT / ".." / "shared" / "datasets").resolve()

UTILITY_COLUMNS = {"dataset", "n", "d", "k", "method", "epsilon", "runs", "cost_ratio_median", "cost_ratio_q25",
                   "cost_ratio_q75", "nicv_median", "nicv_q25", "nicv_q75", "epsilon_spent", "failures"}
SCALE_COLUMNS = {"n", "d", "job", "wall_s", "spark_passes", "py_peak_mb", "jvm_peak_mb", "us_per_point", "error"}


def _run(args, timeout):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_bench_utility_quick(tmp_path):
    assert (DATASETS / "dp-kccm" / "blood_transfusion.csv").exists(), f"benchmark data expected at {DATASETS}"
    _run([str(SCRIPTS / "bench_utility.py"), "--quick", "--no-peer", "--out", str(tmp_path)], timeout=120)
    cols, rows = _rows(tmp_path / "summary.csv")
    assert UTILITY_COLUMNS <= set(cols)
    methods = {r["method"] for r in rows}
    assert {"nonprivate", "maxcover_grid", "maxcover_private", "dplloyd_allocation_nk", "dplloyd_average_nk",
            "dplloyd_average_k", "dplloyd_allocation_k", "ldp"} <= methods
    for r in rows:
        assert int(r["failures"]) == 0, r
        assert float(r["cost_ratio_median"]) >= 0.99, r  # nothing beats the non-private best-of-10 by much
    md = (tmp_path / "results.md").read_text()
    assert "cost ratio" in md.lower() and "public" in md.lower()
    assert list(tmp_path.glob("cost_ratio_*.png"))


def test_bench_scale_quick(tmp_path):
    _run([str(SCRIPTS / "bench_scale.py"), "--quick", "--out", str(tmp_path)], timeout=240)
    cols, rows = _rows(tmp_path / "scale.csv")
    assert SCALE_COLUMNS <= set(cols)
    assert {r["job"] for r in rows} == {"maxcover", "dplloyd", "ldp", "mllib"}
    assert {int(r["n"]) for r in rows} == {20_000, 50_000}
    for r in rows:
        assert r["error"] == "", r
        assert float(r["wall_s"]) > 0 and float(r["jvm_peak_mb"]) > 0 and float(r["py_peak_mb"]) > 0
    assert (tmp_path / "results.md").exists() and (tmp_path / "time_vs_n.png").exists()


def test_bench_ldp_quick(tmp_path):
    _run([str(SCRIPTS / "bench_ldp.py"), "--quick", "--out", str(tmp_path)], timeout=180)
    _, rows = _rows(tmp_path / "results.csv")
    cells = {(r["dataset"], int(r["n"]), r["method"], float(r["epsilon"])) for r in rows}
    expected = {(name, n, m, e) for name, n in (("synthetic", 2_000), ("synthetic", 5_000), ("skin_segmentation", 5_000))
                for m in ("ldp", "maxcover_grid", "maxcover_private", "dplloyd_allocation_nk") for e in (1.0, 2.0, 4.0)}
    assert cells == expected
    for r in rows:  # every method spent exactly the epsilon it was given
        assert float(r["epsilon_spent"]) == float(r["epsilon"]), r
        assert float(r["cost_ratio"]) >= 0.99, r
    md = (tmp_path / "summary.md").read_text()
    assert "Exponent" in md and "ldp (local)" in md
    assert (tmp_path / "error_vs_n.png").exists() and (tmp_path / "ratio_vs_n.png").exists()
