"""Smoke test of the benchmark scripts' --quick forms (issues 6, 7, 30): every bench command of
docs/benchmarks.md still runs end to end and writes its table (columns and rows asserted).

bench_utility and bench_ldp (numpy) run as their own subprocesses. Every other script runs in ONE
shared subprocess (``shared`` below): the numpy ones first, then one local SparkSession that the
Spark scripts share (``bench_harness.session`` reuses an active session and leaves it running), so
the JVM starts once; the whole-process forms (bench_scale --whole, bench_pipeline) start their own
children. The shared forms are tinier than --quick alone where the point is "it still runs" (one
method, one family, one pipeline case).

The quick modes read two real files from ``../shared/datasets`` (blood_transfusion.csv and
Skin_NonSkin.txt.gz), as CI lays it out. A clone without ``../shared`` beside it gets seeded
stand-ins of the same format instead (through ``$DPSPARK_DATASETS``), so the smoke tests still run
the scripts end to end; the benchmark figures in docs/benchmarks.md come from the real files only.
"""

from __future__ import annotations

import csv
import gzip
import json
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
    env = {k: v for k, v in (env or os.environ).items() if k != "DPSPARK_LEDGER"}  # the benchmarks run without one
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
    # --k: a k sweep, each k its own table row (dataset@k<K>, ordered by k), the dataset's own cells kept.
    _run([str(SCRIPTS / "bench_utility.py"), "--quick", "--no-peer", "--append", "--epsilons", "1", "--reps", "1",
          "--methods", "dplloyd_allocation_nk", "--k", "16", "2", "--out", str(tmp_path)], timeout=120, datasets=datasets)
    _, rows3 = _rows(tmp_path / "summary.csv")
    swept = [(r["dataset"], r["k"]) for r in rows3 if r["method"] == "dplloyd_allocation_nk" and "@" in r["dataset"]]
    assert swept == [("blood_transfusion@k2", "2"), ("blood_transfusion@k16", "16")]
    assert {(r["method"], r["epsilon"]) for r in rows3 if r["dataset"] == "blood_transfusion"} == cells


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


# ---------------------------------------------------------------------------
# The shared subprocess: numpy scripts, then the Spark scripts on one session

SHARED_DRIVER = r"""
import importlib, json, sys, time, traceback
plan, status_path = json.loads(sys.argv[1]), sys.argv[2]
status = {}
for name, module, argv, spark in plan:
    if spark and "session" not in status:
        from dpspark.session import build_session
        t0 = time.perf_counter()
        build_session(master="local[2]", app_name="bench-quick", testing=True, conf={"spark.sql.shuffle.partitions": "4"})
        status["session"] = {"status": "ok", "seconds": round(time.perf_counter() - t0, 1)}
    t0 = time.perf_counter()
    try:
        rc = importlib.import_module(module).main(argv)
        outcome = "ok" if rc in (0, None) else f"main returned {rc}"
    except BaseException:  # SystemExit too: report it, run the next script
        outcome = traceback.format_exc()
    status[name] = {"status": outcome, "seconds": round(time.perf_counter() - t0, 1)}
    print(f"bench-quick: {name} {status[name]['seconds']} s: {outcome[:200]}", flush=True)
    with open(status_path, "w") as fh:
        json.dump(status, fh)
"""


def _shared_plan(out: Path) -> list:
    """(name, module, argv, needs the session): each bench command of docs/benchmarks.md in its CI form."""
    return [
        ("dplloyd", "bench_dplloyd", ["--quick", "--seeded", "--out", str(out / "dplloyd")], False),
        ("tune", "tune_maxcover_candidates", ["--quick", "--out", str(out / "tune" / "tuning.md")], False),
        ("scale", "bench_scale", ["--quick", "--n", "5000", "10000", "--out", str(out / "scale")], True),
        ("dplloyd_speed", "bench_dplloyd_speed", ["--quick", "--out", str(out / "dplloyd_speed.md")], True),
        ("maxcover", "bench_maxcover", ["--quick", "--seeded", "--methods", "maxcover kmeans private",
                                        "--out", str(out / "maxcover")], True),
        ("maxcover_speed", "bench_maxcover", ["--quick", "--speed", "--candidate-count", "200",
                                              "--out", str(out / "maxcover")], True),
        ("scale_whole", "bench_scale", ["--whole", "--quick", "--jobs", "dplloyd", "--out", str(out / "whole")], True),
        ("pipeline", "bench_pipeline", ["--quick", "--no-mllib", "--cases", "no-op re-run",
                                        "--out", str(out / "pipeline")], True),
        ("utility_spark", "bench_utility", ["--quick", "--no-peer", "--engine", "spark", "--methods", "auto",
                                            "--epsilons", "1", "--reps", "1", "--out", str(out / "utility")], True),
        ("bounds", "bench_bounds", ["--quick", "--settings", "tight", "estimate", "--out", str(out / "bounds")], True),
    ]


@pytest.fixture(scope="module")
def shared(tmp_path_factory, datasets) -> tuple[Path, dict]:
    """Run the shared subprocess once: (its output folder, each script's status and seconds)."""
    out = tmp_path_factory.mktemp("bench-quick")
    status_path = out / "status.json"
    env = {k: v for k, v in os.environ.items() if k != "DPSPARK_LEDGER"}
    env.update(DPSPARK_DATASETS=str(datasets), PYTHONPATH=os.pathsep.join([str(SCRIPTS), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", SHARED_DRIVER, json.dumps(_shared_plan(out)), str(status_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    status["_log"] = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return out, status


def _ran(shared, name: str) -> Path:
    out, status = shared
    assert status.get(name, {}).get("status") == "ok", f"{name}: {status.get(name)}\n{status['_log']}"
    return out


def test_bench_dplloyd_quick(shared):
    out = _ran(shared, "dplloyd") / "dplloyd"
    cols, rows = _rows(out / "runs.csv")
    assert {"dataset", "epsilon", "variant", "noise", "merge", "rep", "nicv", "cost_ratio", "epsilon_spent"} <= set(cols)
    assert {(r["dataset"], r["epsilon"]) for r in rows} == {("blood_transfusion", "1.0")}
    assert {r["variant"] for r in rows} == {"allocation_nk", "average_nk", "average_k", "allocation_k"}
    assert all(float(r["epsilon_spent"]) == 1.0 for r in rows)
    assert "## Verdict" in (out / "results.md").read_text()


def test_tune_maxcover_candidates_quick(shared):
    md = (_ran(shared, "tune") / "tune" / "tuning.md").read_text()
    assert "| dataset (n, k) | eps | L=5, c=0.4 |" in md and "| blood_transfusion (748, 4) | 1 |" in md


def test_bench_scale_quick(shared):
    out = _ran(shared, "scale") / "scale"
    cols, rows = _rows(out / "scale.csv")
    assert SCALE_COLUMNS <= set(cols)
    assert {r["job"] for r in rows} == {"maxcover", "dplloyd", "ldp", "mllib"}
    assert {int(r["n"]) for r in rows} == {5_000, 10_000}
    for r in rows:
        assert r["error"] == "", r
        assert float(r["wall_s"]) > 0 and float(r["jvm_peak_mb"]) > 0 and float(r["py_peak_mb"]) > 0
        if r["job"] == "maxcover":  # from fit's operational dict (pass counts are no longer on the model)
            assert int(r["spark_passes"]) >= 2, r
    assert (out / "results.md").exists() and (out / "time_vs_n.png").exists()


def test_bench_scale_whole_quick(shared):
    out = _ran(shared, "scale_whole") / "whole"
    cols, rows = _rows(out / "whole.csv")
    assert {"n", "d", "job", "wall_whole_s", "fit_s", "spark_passes", "tree_peak_mb", "exit_code", "steps", "error"} <= set(cols)
    assert [(r["job"], r["n"], r["d"]) for r in rows] == [("dplloyd", "20000", "2")]
    r = rows[0]
    assert r["error"] == "" and r["exit_code"] == "0" and r["spark_passes"] == "3", r
    assert 0 < float(r["fit_s"]) < float(r["wall_whole_s"]) and "FIT" in json.loads(r["steps"])
    assert "| n | d | job | whole (s) | fit (s) |" in (out / "whole.md").read_text()


def test_bench_dplloyd_speed_quick(shared):
    md = (_ran(shared, "dplloyd_speed") / "dplloyd_speed.md").read_text()
    assert "| job | iterations | whole fit (s) | per iteration (s) | notes |" in md
    assert "| dplloyd `DPLloyd(variant=average_k).fit(df)` | 3 |" in md and "| MLlib `KMeans(maxIter=3" in md
    assert "| pass | median (s) | min (s) | max (s) |" in md and "| mapInPandas |" in md and "| Spark SQL |" in md
    assert "Identical exact aggregates in 3/3 passes" in md


def test_bench_maxcover_quick(shared):
    out = _ran(shared, "maxcover") / "maxcover" / "quick"
    cols, rows = _rows(out / "utility.csv")
    assert {"dataset", "epsilon", "method", "rep", "cost_ratio", "spark_passes", "wall_s", "epsilon_spent", "error"} <= set(cols)
    assert [(r["dataset"], r["method"], r["epsilon"]) for r in rows] == [("skin", "maxcover kmeans private", "1.0")]
    assert rows[0]["error"] == "" and float(rows[0]["cost_ratio"]) > 0 and int(rows[0]["spark_passes"]) >= 2
    assert "| method | skin |" in (out / "utility.md").read_text()


def test_bench_maxcover_speed_quick(shared):
    md = (_ran(shared, "maxcover_speed") / "maxcover" / "quick" / "speed.md").read_text()
    assert "| job | wall s | ratio to MLlib end to end | ratio to MLlib fit only | Spark passes |" in md
    assert "| maxcover kmeans private |" in md and "| MLlib KMeans |" in md and "## n = 20,000" in md


def test_bench_pipeline_quick(shared):
    out = _ran(shared, "pipeline") / "pipeline"
    md = (out / "results.md").read_text()
    assert "| case | runs | wall | / MLlib | Spark start | fit | bookkeeping | errors |" in md
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["no-op re-run"]
    assert rows[0]["exit_code"] == 0 and not rows[0].get("error") and rows[0]["wall_s"] > 0, rows[0]
    assert "| no-op re-run | 1 |" in md


def test_bench_utility_spark_quick(shared):
    out = _ran(shared, "utility_spark") / "utility"
    cols, rows = _rows(out / "summary.csv")
    assert UTILITY_COLUMNS <= set(cols)
    auto = [r for r in rows if r["method"] == "auto"]
    assert len(auto) == 1 and auto[0]["failures"] == "0" and float(auto[0]["cost_ratio_median"]) >= 0.99, auto


def test_bench_bounds_quick(shared):
    out = _ran(shared, "bounds") / "bounds"
    cols, rows = _rows(out / "runs.csv")
    assert {"dataset", "setting", "cost_ratio", "epsilon_spent", "error"} <= set(cols)
    assert [(r["dataset"], r["setting"]) for r in rows] == [("blood_transfusion", "tight"), ("blood_transfusion", "estimate")]
    assert all(not r["error"] and float(r["cost_ratio"]) >= 0.99 and abs(float(r["epsilon_spent"]) - 1.0) < 1e-9
               for r in rows), rows
    assert "estimate: cost (vs tight)" in (out / "results.md").read_text()
