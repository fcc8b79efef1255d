#!/usr/bin/env python
"""Bounds benchmark (issue 48): what ``auto`` costs when the user does not know the data's range.

Every shared table in its ORIGINAL units (no pre-scaling), k its own, epsilon in total (bounds
included), delta 1e-6, each fit through the Spark estimators users run (``fit(df)`` in one local[2]
session), cost / non-private k-means++ (scikit-learn, best of 10, on the same original units).
Settings (``--settings``):

- ``tight``: the data's own per-column min/max as the public box. NON-PRIVATE (derived from the
  data): the reference every other setting is compared with, never a recommendation;
- ``10x``: a public box 10 times as wide as the data's range, centred on it (what a careful user who
  does not know the data writes);
- ``estimate``: ``domain: {estimate: private}`` with that 10x box as its loose public outer box
  (``dpspark.estimated_domain``; epsilon_share 0.2 (the default) of the same total epsilon);
- ``estimate_nobox``: ``domain: {estimate: private}`` with no box at all (octaves, then the tree).

Outputs in ``--out`` (default bench/results/bounds): runs.csv (one row per fit), results.md (median
cost ratio per table and setting, the ratio to ``tight``, the targets' verdicts).

    .venv/bin/python scripts/bench_bounds.py --quick --out /tmp/b          # smoke (CI): one small table
    .venv/bin/python scripts/bench_bounds.py                                # every shared table, 5 runs
    .venv/bin/python scripts/bench_bounds.py --scale 1000000 --out bench/results/bounds   # the pass's cost

``--scale N``: on an N x 10 Delta table (a Gaussian mixture), the wall time of the estimate's Spark
passes (with a public outer box: one; without: two) against one plain read of the feature columns
(a count of the rows with finite features, the cheapest pass any family makes), 3 times each,
appended to ``scale.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402

DEFAULT_OUT = bc.ROOT / "bench" / "results" / "bounds"
DATASETS = bc.SHARED_DATASETS
SETTINGS = ["tight", "10x", "estimate", "estimate_nobox"]
DELTA = 1e-6
WIDE = 10.0
COLUMNS = ["dataset", "n", "d", "k", "setting", "rep", "epsilon", "cost_ratio", "epsilon_spent", "delta_spent",
           "seconds", "error"]


def boxes(x: np.ndarray) -> dict:
    lo, hi = x.min(axis=0), x.max(axis=0)
    hi = np.where(hi > lo, hi, lo + 1.0)  # a constant column: a unit-wide box
    c, h = (lo + hi) / 2.0, (hi - lo) / 2.0
    return {"tight": (lo, hi), "wide": (c - WIDE * h, c + WIDE * h)}


def estimator(setting: str, x: np.ndarray, k: int, eps: float):
    from dpspark.auto import AutoClustering
    from dpspark.estimated_domain import DomainEstimating

    d = x.shape[1]
    feats = tuple(f"f{j}" for j in range(d))

    def build(epsilon, delta, domain):
        return AutoClustering(k=k, epsilon=epsilon, delta=delta, domain=domain, features=feats)

    b = boxes(x)
    if setting in ("tight", "10x"):
        lo, hi = b["tight" if setting == "tight" else "wide"]
        return build(eps, DELTA, bc.domain(lo, hi))
    outer = None if setting == "estimate_nobox" else tuple(tuple(map(float, v)) for v in b["wide"])
    return DomainEstimating(build, dim=d, epsilon=eps, delta=DELTA, outer=outer, features=feats)


def summarize(rows: list[dict]) -> tuple[str, list[dict]]:
    names = list(dict.fromkeys(r["dataset"] for r in rows))
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    table, verdicts = [], []
    for name in names:
        med = {}
        for s in settings:
            vals = [float(r["cost_ratio"]) for r in rows if r["dataset"] == name and r["setting"] == s and not r["error"]]
            med[s] = float(np.median(vals)) if vals else float("nan")
        first = next(r for r in rows if r["dataset"] == name)
        cells = [name, first["n"], first["d"], first["k"]]
        for s in settings:
            rel = med[s] / med["tight"] if "tight" in med and med["tight"] > 0 else float("nan")
            cells.append(f"{med[s]:.3f}" + ("" if s == "tight" else f" ({rel:.2f}x)"))
        table.append(cells)
        verdicts.append({"dataset": name, **{s: med[s] for s in settings}})
    header = ["table", "n", "d", "k"] + [f"{s}: cost (vs tight)" for s in settings]
    return bh.markdown_table(header, table), verdicts


def targets(verdicts: list[dict]) -> str:
    lines = []
    if all("estimate" in v for v in verdicts):
        rel = [v["estimate"] / v["tight"] for v in verdicts]
        lines.append(f"- estimate within 1.10x of tight on every table: {sum(r <= 1.10 for r in rel)} of {len(rel)} "
                     f"(worst {max(rel):.2f}x); median over tables {np.median(rel):.2f}x (target <= 1.05x)")
    if all("10x" in v for v in verdicts):
        rel = [v["10x"] / v["tight"] for v in verdicts]
        lines.append(f"- 10x box, no estimate, within 2x of tight: {sum(r <= 2.0 for r in rel)} of {len(rel)} "
                     f"(worst {max(rel):.2f}x)")
    return "\n".join(lines)


def scale(spark, n: int, out: Path, argv) -> None:
    import tempfile

    from pyspark.sql import functions as F

    from dpspark import tables
    from dpspark.estimated_domain import dyadic_counts, octave_counts
    from dpspark.privacy import bounds

    d = 10
    means = np.random.default_rng(48).uniform(-50, 50, (10, d))
    with tempfile.TemporaryDirectory() as tmp:
        cols = bh.mixture_table(spark, f"{tmp}/t", n, means, 5.0, 48, 8)
        df = spark.read.format("delta").load(f"{tmp}/t")
        raw, _ = tables.prepare_raw(df, tuple(cols), None, d, "bench")
        box = bc.domain([-500.0] * d, [500.0] * d)
        jobs = {"one read (count of valid rows)": lambda: raw.agg(F.count(F.lit(1))).collect(),
                "estimate, outer box (dyadic pass)": lambda: dyadic_counts(raw, box, bounds.LEVELS),
                "octave pass (no outer box: also)": lambda: octave_counts(raw, d)}
        times = {name: [] for name in jobs}
        for _ in range(3):
            for name, job in jobs.items():
                times[name].append(bh.timed(job)[1])
    read = float(np.median(times["one read (count of valid rows)"]))
    rows = [[name, f"{np.median(t):.2f}", f"{np.median(t) / read:.2f}"] for name, t in times.items()]
    md = [f"## n = {n:,}, d = {d} (`{bh.command_line('bench_bounds.py', argv)}`)", "",
          f"Machine: {bh.machine_description()}", "",
          bh.markdown_table(["Spark job", "median of 3 (s)", "x one read"], rows), ""]
    with open(out / "scale.md", "a") as fh:
        fh.write("\n".join(md) + "\n")
    print("\n".join(md))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: blood_transfusion, 1 run per setting")
    ap.add_argument("--datasets", nargs="*", default=None)
    ap.add_argument("--settings", nargs="*", default=SETTINGS, choices=SETTINGS)
    ap.add_argument("--reps", type=int, default=None, help="runs per (table, setting); default 5")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--scale", type=int, default=None, help="time the estimate's passes on an N x 10 table instead")
    args = ap.parse_args(argv)
    if args.scale:
        args.out.mkdir(parents=True, exist_ok=True)
        with bh.session("bench_bounds") as spark:
            scale(spark, args.scale, args.out, argv)
        return 0
    names = args.datasets or (["blood_transfusion"] if args.quick else DATASETS)
    reps = args.reps or (1 if args.quick else 5)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with bh.session("bench_bounds") as spark:
        for name in names:
            _, x, k = bc.LOADERS_BY_NAME[name]()
            x = np.asarray(x, dtype=np.float64)
            _, base = bc.nonprivate_baseline(x, k)
            df = bh.cached_frame(spark, x, [f"f{j}" for j in range(x.shape[1])])
            try:
                for rep in range(reps):
                    for setting in args.settings:
                        row = {"dataset": name, "n": x.shape[0], "d": x.shape[1], "k": k, "setting": setting, "rep": rep,
                               "epsilon": args.epsilon, "error": ""}
                        t = time.perf_counter()
                        try:
                            model = estimator(setting, x, k, args.epsilon).fit(df)
                            row.update(cost_ratio=float(bc.kmeans_cost(x, model.centers)) / float(base),
                                       epsilon_spent=model.epsilon_spent, delta_spent=model.delta_spent)
                        except Exception as exc:  # recorded, never hidden
                            row.update(cost_ratio="", epsilon_spent="", delta_spent="", error=f"{type(exc).__name__}: {exc}"[:200])
                        row["seconds"] = round(time.perf_counter() - t, 2)
                        rows.append(row)
                        print(name, setting, rep, row["cost_ratio"], row["error"], flush=True)
            finally:
                df.unpersist()
            bh.write_csv(args.out / "runs.csv", rows, COLUMNS)
    table, verdicts = summarize(rows)
    md = ["# Bounds benchmark: auto with a tight box, a 10x box, and the private estimate", "",
          f"`{bh.command_line('bench_bounds.py', argv)}`", "",
          f"epsilon {args.epsilon} in total (the estimate's share included), delta {DELTA}, median of {reps} run(s), "
          "whole tables in their original units, cost / non-private k-means++ (best of 10). `tight` is the data's own "
          "min/max: NON-PRIVATE, the reference only.", "", f"Machine: {bh.machine_description()}", "", table, "",
          "## Targets (issue 48)", "", targets(verdicts), ""]
    (args.out / "results.md").write_text("\n".join(md))
    print("\n".join(md))
    failed = [r for r in rows if r["error"]]
    return 1 if failed and len(failed) == len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
