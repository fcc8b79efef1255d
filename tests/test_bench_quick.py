"""Smoke test of the benchmark scripts' --quick modes (issues 6, 7): they run end to end and write their tables.

Runs each script as a subprocess with this interpreter (the project's venv). Budget: about 90 s in total
(bench_scale --quick starts a local SparkSession; bench_utility --quick --no-peer is numpy only).

The quick modes read two real files from ``../shared/datasets`` (blood_transfusion.csv and
Skin_NonSkin.txt.gz), as CI lays it out. A clone without ``../shared`` beside it gets seeded
stand-ins of the same format instead (through ``$DPSPARK_DATASETS``), so the smoke tests still run
the scripts end to end; the benchmark figures in docs/benchmarks.md come from the real files only.
"""

from __future__ import annotations

import csv
import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
DATASETS = (ROOT / ".." / "shared" / "datasets").resolve()

UTILITY_COLUMNS = {"dataset", "n", "d", "k", "method", "epsilon", "runs", "cost_ratio_median", "cost_ratio_q25",
                   "cost_ratio_q75", "nicv_median", "nicv_q25", "nicv_q75", "epsilon_spent", "failures"}
SCALE_COLUMNS = {"n", "d", "job", "wall_s", "spark_passes", "py_peak_mb", "jvm_peak_mb", "us_per_point", "error"}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """The real benchmark data if it is beside the project, else seeded stand-ins of the same format."""
    if (DATASETS / "dp-kccm" / "blood_transfusion.csv").exists() and \
            (DATASETS / "skin-segmentation" / "Skin_NonSkin.txt.gz").exists():
        return DATASETS
    base = tmp_path_factory.mktemp("standin-datasets")
    rng = np.random.default_rng(17)
    (base / "dp-kccm").mkdir()
    groups = rng.integers(0, 4, size=748)
    frequency = rng.poisson(np.array([1, 4, 8, 16])[groups]) + 1
    blood = np.column_stack([rng.poisson(np.array([2, 10, 20, 40])[groups]), frequency, frequency * 250,
                             rng.poisson(np.array([10, 30, 50, 80])[groups]) + 2, rng.integers(0, 2, size=748)])
    lines = ['Recency (months),Frequency (times),Monetary (c.c. blood),Time (months),"target"']
    lines += [",".join(str(int(v)) for v in row) for row in blood]
    (base / "dp-kccm" / "blood_transfusion.csv").write_text("\n".join(lines) + "\n")
    (base / "skin-segmentation").mkdir()
    colours = np.array([[60, 90, 150], [200, 200, 200], [120, 60, 40]])
    labels = rng.integers(0, 3, size=20_000)
    bgr = np.clip(colours[labels] + rng.normal(0, 15, size=(20_000, 3)), 0, 255).astype(int)
    with gzip.open(base / "skin-segmentation" / "Skin_NonSkin.txt.gz", "wt") as fh:
        for row, label in zip(bgr, labels):
            fh.write(f"{row[0]}\t{row[1]}\t{row[2]}\t{1 + (label == 0)}\n")
    return base


def _run(args, timeout, datasets: Path | None = None):
    env = dict(os.environ, DPSPARK_DATASETS=str(datasets)) if datasets is not None else None
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_bench_utility_quick(tmp_path, datasets):
    _run([str(SCRIPTS / "bench_utility.py"), "--quick", "--no-peer", "--out", str(tmp_path)], timeout=120, datasets=datasets)
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
    assert "## Targets at epsilon = 1" in md and '"skipped": "--no-peer"' in md  # --no-peer skips both peers
    assert {r["method"] for r in rows}.isdisjoint({"diffprivlib", "google_lsh", "auto"})  # quick: no peers, no auto
    assert "| blood_transfusion (n=748" in (tmp_path / "readme_table.md").read_text()
    assert list(tmp_path.glob("cost_ratio_*.png"))
    # --append: a second invocation adds its cells and keeps the others; results.md covers the whole table.
    _run([str(SCRIPTS / "bench_utility.py"), "--quick", "--no-peer", "--append", "--epsilons", "1",
          "--methods", "dplloyd_allocation_nk", "--out", str(tmp_path)], timeout=120, datasets=datasets)
    _, rows2 = _rows(tmp_path / "summary.csv")
    cells = {(r["method"], r["epsilon"]) for r in rows2}
    assert {("dplloyd_allocation_nk", "0.5"), ("dplloyd_allocation_nk", "1.0"), ("dplloyd_allocation_nk", "2.0"),
            ("maxcover_grid", "0.5"), ("ldp", "2.0")} <= cells
    assert ("maxcover_grid", "1.0") not in cells
    assert (tmp_path / "results.md").read_text().count("`python scripts/bench_utility.py --quick") == 2


def _summary_row(dataset, method, eps, median, runs=5, failures=0):
    return {"dataset": dataset, "method": method, "epsilon": eps, "cost_ratio_median": median, "runs": runs,
            "failures": failures}


def test_bench_utility_targets():
    """The issue-14 target verdicts of the utility benchmark, on hand-made medians."""
    sys.path.insert(0, str(SCRIPTS))
    import bench_utility as bu

    nan = float("nan")
    summary = [_summary_row("x", m, e, v) for m, e, v in [
        ("auto", 1.0, 1.09), ("maxcover_grid", 1.0, 1.05), ("dplloyd_average_k", 1.0, 1.02), ("ldp", 1.0, 1.01),
        ("maxcover_private", 1.0, nan), ("diffprivlib", 1.0, 1.30), ("google_lsh", 1.0, 1.20),
        ("auto", 0.5, 1.5), ("diffprivlib", 0.5, 1.6), ("google_lsh", 0.5, 1.4),
        ("auto", 2.0, 1.05), ("diffprivlib", 2.0, 1.1),
        ("auto", 1.0, 1.11), ("maxcover_grid", 1.0, 1.0)]]
    for r in summary[-2:]:
        r["dataset"] = "y"  # y: auto's excess 0.11 > half of the better peer's (no peer: n/a), > 1.10 x best explicit
    summary += [_summary_row("y", "google_lsh", 1.0, 1.2), _summary_row("z", "maxcover_grid", 1.0, 2.0)]
    x, y, z = bu.target_rows(summary, ["x", "y", "z"])
    # ldp is not an explicit method; the all-failed (nan) maxcover_private is not a candidate
    assert (x["best_explicit_method"], x["best_explicit"]) == ("dplloyd_average_k", 1.02)
    assert x["better_peer"] == 1.20
    assert x["a"] is True and x["b"] is True  # 0.09 <= 0.5 x 0.20; 1.09 <= 1.10 x 1.02
    assert x["c_by_eps"] == {0.5: False, 2.0: True} and x["c"] is False  # 1.5 > min(1.6, 1.4)
    assert y["a"] is False and y["b"] is False and y["c"] is None  # 0.11 > 0.10; 1.11 > 1.10 x 1.0; no side epsilons
    assert z["a"] is None and z["b"] is None and z["best_explicit_method"] == "maxcover_grid"  # no auto run
    md = bu.targets_markdown([x, y, z], summary)
    assert md.count("FAIL") == 4 and "(0.5: FAIL, 2: pass)" in md and "n/a" in md  # x: (c) and its eps 0.5; y: (a), (b)


def test_bench_scale_quick(tmp_path):
    _run([str(SCRIPTS / "bench_scale.py"), "--quick", "--out", str(tmp_path)], timeout=240)
    cols, rows = _rows(tmp_path / "scale.csv")
    assert SCALE_COLUMNS <= set(cols)
    assert {r["job"] for r in rows} == {"maxcover", "dplloyd", "ldp", "mllib"}
    assert {int(r["n"]) for r in rows} == {20_000, 50_000}
    for r in rows:
        assert r["error"] == "", r
        assert float(r["wall_s"]) > 0 and float(r["jvm_peak_mb"]) > 0 and float(r["py_peak_mb"]) > 0
        if r["job"] == "maxcover":  # from fit's operational dict (pass counts are no longer on the model)
            assert int(r["spark_passes"]) >= 2, r
    assert (tmp_path / "results.md").exists() and (tmp_path / "time_vs_n.png").exists()


def test_bench_ldp_quick(tmp_path, datasets):
    _run([str(SCRIPTS / "bench_ldp.py"), "--quick", "--out", str(tmp_path)], timeout=180, datasets=datasets)
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
