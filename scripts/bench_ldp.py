#!/usr/bin/env python
"""Benchmark of the ldp family (issue 6): utility vs n and epsilon, the central algorithms at the
same epsilon, and the measured exponent of the additive error.

    .venv/bin/python scripts/bench_ldp.py                  # full run (1-2 hours on 2 cores; the central numpy passes dominate)
    .venv/bin/python scripts/bench_ldp.py --quick --out /tmp/l   # smoke: n = 2e3, 5e3; 1 run
    .venv/bin/python scripts/bench_ldp.py --summarize-only # redo summary.md and plots from results.csv

What runs: the SAME client (``dpspark.ldp.client.randomize_batch``) and server
(``dpspark.ldp.protocol.Driver``) code as the Spark job, through ``bench_utility.fit_numpy``: the
estimator's own parameters, accountant and solver, with the reports aggregated by numpy on one machine
instead of by Spark (the Spark job aggregates the same integer counts; ``bench_scale.py`` times the
Spark job itself up to n = 10^7). The central algorithms (maxcover with grid and with private
candidates, delta = 1e-6; dplloyd allocation_nk, pure DP) run the same way on the same points and the
same epsilon: they show what trusting a curator buys.

Data:

- ``synthetic``: a well-separated Gaussian mixture, k = 5 blobs (sd 3) in the public box [0, 100]^2,
  n from 10^4 to 10^7;
- the larger real datasets of ``../shared/datasets`` (skin_segmentation n = 245,057, d = 3, k = 2;
  birch2 n = 100,000, d = 2, k = 100; adult n = 32,561, d = 6, k = 5), scaled to [-1, 1]^d with the
  per-column min/max of the WHOLE file as public bounds (the literature's benchmark convention). For
  n below the file's size the rows are a fixed-seed sample without replacement; for n above it (up to
  10^6) a fixed-seed sample WITH replacement (each sampled row is one more user), marked "resampled".

Utility: k-means cost of the released centers on the same n points (unit space [-1, 1]^d),
divided by the non-private scikit-learn k-means++/Lloyd cost (best of 5; of 2 above 10^6 points);
additive error = cost - non-private cost. The exponent is the least-squares slope of log(median
additive error) against log(n) over the n where the median ratio is <= 1.5 (the protocol found every
cluster; below that, missed clusters dominate and the error FALLS with n). The paper promises an
additive error of about n^(1/2) (times polylog factors) for the total cost.

Noise: the estimators' seeded mode (numpy PCG64; statistically the same distributions as the secure
OpenDP samplers, reproducible). Seeds: run r of a cell uses seed r (ldp) and 1000 + r (central).

Outputs in ``--out`` (default bench/results/ldp/): results.csv (every run), summary.md,
error_vs_n.png (additive error vs n per dataset), ratio_vs_n.png (cost ratio, ldp vs central).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402
import bench_utility as bu  # noqa: E402

ROOT = bc.ROOT
DEFAULT_OUT = ROOT / "bench" / "results" / "ldp"
EPSILONS = [1.0, 2.0, 4.0]
CENTRAL = ["maxcover_grid", "maxcover_private", "dplloyd_allocation_nk"]
SYNTH_CENTERS = np.array([[15.0, 15.0], [85.0, 20.0], [50.0, 50.0], [20.0, 85.0], [80.0, 80.0]])
SYNTH_BOX = (np.zeros(2), np.full(2, 100.0))

# dataset -> list of n (full run)
FULL_PLAN = {
    "synthetic": [10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000],
    "skin_segmentation": [10_000, 30_000, 100_000, 245_057, 1_000_000],
    "birch2": [10_000, 30_000, 100_000, 1_000_000],
    "adult": [10_000, 32_561, 100_000, 1_000_000],
}
QUICK_PLAN = {"synthetic": [2_000, 5_000], "skin_segmentation": [5_000]}
CSV_COLUMNS = ["dataset", "n", "d", "k", "resampled", "method", "epsilon", "run", "cost_ratio", "additive_error",
               "baseline_cost", "seconds", "epsilon_spent", "delta_spent"]


def synthetic(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, n])
    labels = rng.integers(0, len(SYNTH_CENTERS), size=n)
    return SYNTH_CENTERS[labels] + rng.normal(0.0, 3.0, size=(n, 2))


_FILES: dict = {}


def dataset(name: str, n: int) -> dict:
    """{'name','x','unit','lo','hi','k','resampled'}: n points of the dataset and its public bounds."""
    if name == "synthetic":
        lo, hi = SYNTH_BOX
        x = synthetic(n, seed=7)
        k, resampled = len(SYNTH_CENTERS), False
    else:
        if name not in _FILES:
            _, full, k_ref = bc.LOADERS_BY_NAME[name]()
            _FILES[name] = (full, k_ref, *bc.public_bounds(full))  # bounds of the whole file (public convention)
        full, k, lo, hi = _FILES[name]
        rng = np.random.default_rng([n, len(name)])
        resampled = n > full.shape[0]
        if n == full.shape[0]:
            x = full
        else:
            x = full[np.sort(rng.choice(full.shape[0], size=n, replace=resampled))]
    return {"name": name, "x": x, "unit": bc.scale_unit(x, lo, hi), "lo": lo, "hi": hi, "k": k, "resampled": resampled}


def run_cell(ds: dict, method: str, eps: float, run: int, base_cost: float) -> dict:
    seed = run if method == "ldp" else 1000 + run
    t = time.perf_counter()
    est = bu.make_estimator(method, ds, eps, seed)
    centers, eps_spent, delta_spent, _ = bu.fit_numpy(est, ds["x"])
    seconds = time.perf_counter() - t
    c = bc.kmeans_cost(ds["unit"], bc.scale_unit(centers, ds["lo"], ds["hi"]))
    return {"dataset": ds["name"], "n": len(ds["x"]), "d": ds["x"].shape[1], "k": ds["k"], "resampled": ds["resampled"],
            "method": method, "epsilon": eps, "run": run, "cost_ratio": c / base_cost, "additive_error": c - base_cost,
            "baseline_cost": base_cost, "seconds": round(seconds, 2), "epsilon_spent": eps_spent,
            "delta_spent": delta_spent}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny n, one run, not a measurement")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--runs", type=int, default=None, help="runs per cell (default 3; 1 with --quick)")
    ap.add_argument("--central-max-n", type=int, default=100_000,
                    help="run the central algorithms only up to this n (their numpy passes cost n x |V| per threshold; bench_scale times them on Spark at 10^6-10^7)")
    ap.add_argument("--datasets", nargs="*", default=None, choices=sorted(FULL_PLAN))
    ap.add_argument("--summarize-only", action="store_true", help="redo summary.md and the plots from results.csv")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("dpspark").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "results.csv"
    if args.summarize_only:
        meta = json.loads((args.out / "meta.json").read_text()) if (args.out / "meta.json").exists() else {}
        summarize(read_rows(csv_path), args.out, meta)
        return 0
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    if args.datasets:
        plan = {k: v for k, v in plan.items() if k in args.datasets}
    runs = args.runs or (1 if args.quick else 3)
    t_start = time.perf_counter()
    rows: list[dict] = []
    failures = 0
    for name, ns in plan.items():
        for n in ns:
            ds = dataset(name, n)
            t0 = time.perf_counter()
            _, base_cost = bc.nonprivate_baseline(ds["unit"], ds["k"], seed=0, n_init=5 if n <= 1_000_000 else 2)
            print(f"{name} n={n:,}: baseline in {time.perf_counter() - t0:.1f} s", flush=True)
            methods = ["ldp"] + (CENTRAL if n <= args.central_max_n else [])
            for eps in EPSILONS:
                for method in methods:
                    # ldp: `runs` runs up to 10^6 users (the exponent fit needs medians), 1 above;
                    # central: `runs` up to 10^5, 1 above (their numpy passes are the slow part here).
                    cell_runs = runs if n <= (1_000_000 if method == "ldp" else 100_000) else 1
                    for run in range(cell_runs):
                        try:
                            row = run_cell(ds, method, eps, run, base_cost)
                        except Exception as exc:  # reported, and the exit code says so
                            failures += 1
                            print(f"  {method} eps={eps:g} run={run}: FAILED {exc!r}", flush=True)
                            continue
                        rows.append(row)
                        print(f"  {method:22s} eps={eps:g} run={run} ratio={row['cost_ratio']:9.3f} "
                              f"{row['seconds']:.1f}s", flush=True)
            bh.write_csv(csv_path, rows, CSV_COLUMNS)  # partial results after every (dataset, n)
    meta = {"command": bh.command_line("bench_ldp.py", argv),
            "elapsed_s": round(time.perf_counter() - t_start, 1), "machine": bh.machine_description(),
            "runs": runs, "epsilons": EPSILONS, "quick": args.quick, "failures": failures}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    summarize(rows, args.out, meta)
    return 1 if failures else 0


def read_rows(path: Path) -> list[dict]:
    rows = bh.read_csv(path, ints=("n", "d", "k", "run"), floats=("epsilon", "cost_ratio", "additive_error",
                                                               "baseline_cost", "seconds", "epsilon_spent", "delta_spent"))
    for r in rows:
        r["resampled"] = r["resampled"] == "True"
    return rows


def exponent(rows, dataset_name: str, eps: float):
    """(slope, n values used) of log(median additive error) vs log(n) where the median ratio <= 1.5."""
    pts = []
    for n in sorted({r["n"] for r in rows if r["dataset"] == dataset_name}):
        sel = [r for r in rows if r["dataset"] == dataset_name and r["n"] == n and r["method"] == "ldp" and r["epsilon"] == eps]
        if not sel:
            continue
        med_ratio = float(np.median([r["cost_ratio"] for r in sel]))
        med_add = float(np.median([r["additive_error"] for r in sel]))
        if med_ratio <= 1.5 and med_add > 0:
            pts.append((n, med_add))
    if len(pts) < 2:
        return None, [p[0] for p in pts]
    slope = float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])
    return slope, [p[0] for p in pts]


def summarize(rows: list[dict], out: Path, meta: dict) -> None:
    plt = bh.pyplot()
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    methods = ["ldp"] + [m for m in CENTRAL if any(r["method"] == m for r in rows)]
    machine = meta.get("machine", {})
    lines = ["# ldp benchmark: local model vs non-private and vs the central algorithms", "",
             f"Command: `{meta.get('command', 'python scripts/bench_ldp.py')}`; {meta.get('elapsed_s', '?')} s. "
             f"Machine: {machine.get('nproc', '?')} CPUs ({machine.get('cpu', '?')}), {machine.get('memory_gb', '?')} GB. "
             "Same client and server code as the Spark job, numpy aggregation on one machine (see the script's "
             "docstring). Cells: median cost ratio to non-private k-means++/Lloyd (best of 5) [min, max] over "
             f"{meta.get('runs', '?')} runs for ldp up to 10^6 users and for the central algorithms up to 10^5 (1 run above). Central algorithms at the same epsilon on the same points "
             "(maxcover delta = 1e-6; dplloyd pure DP). '(r)': resampled with replacement above the file's size.", ""]
    for name in datasets:
        sub = [r for r in rows if r["dataset"] == name]
        first = sub[0]
        lines += [f"## {name} (d = {first['d']}, k = {first['k']})", ""]
        ns = sorted({r["n"] for r in sub})
        header = ["n", "method"] + [f"eps = {e:g}" for e in EPSILONS]
        table = []
        for n in ns:
            resampled = any(r["resampled"] for r in sub if r["n"] == n)
            for m in methods:
                if not any(r["n"] == n and r["method"] == m for r in sub):
                    continue
                cells = [f"{n:,}" + (" (r)" if resampled else ""), m if m != "ldp" else "**ldp (local)**"]
                for e in EPSILONS:
                    cells.append(_cell([r["cost_ratio"] for r in sub if r["n"] == n and r["method"] == m and r["epsilon"] == e]))
                table.append(cells)
        lines += [bh.markdown_table(header, table, ["r", "l"] + ["r"] * len(EPSILONS)), ""]
        lines.append("Exponent of ldp's additive error in n (fit over the n where the median ratio <= 1.5):")
        for e in EPSILONS:
            slope, used = exponent(rows, name, e)
            if slope is None:
                lines.append(f"- eps = {e:g}: fewer than 2 such n ({', '.join(f'{u:,}' for u in used) or 'none'}): no fit")
            else:
                lines.append(f"- eps = {e:g}: **{slope:.2f}** (n = {', '.join(f'{u:,}' for u in used)})")
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines) + "\n")

    for kind, fname, ylabel in (("additive_error", "error_vs_n.png", "additive error (cost - non-private cost, unit space)"),
                                ("cost_ratio", "ratio_vs_n.png", "cost ratio to non-private")):
        fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.8), squeeze=False)
        for ax, name in zip(axes[0], datasets):
            sub = [r for r in rows if r["dataset"] == name]
            ns = sorted({r["n"] for r in sub})
            for m in (methods if kind == "cost_ratio" else ["ldp"]):
                for j, e in enumerate(EPSILONS):
                    pts = [(n, float(np.median([r[kind] for r in sub if r["n"] == n and r["method"] == m and r["epsilon"] == e])))
                           for n in ns if any(r["n"] == n and r["method"] == m and r["epsilon"] == e for r in sub)]
                    pts = [p for p in pts if p[1] > 0]
                    if not pts:
                        continue
                    style = "-" if m == "ldp" else ("--" if m.startswith("maxcover") else ":")
                    ax.loglog(*zip(*pts), style, marker="o", ms=3, color=f"C{j}", alpha=1.0 if m == "ldp" else 0.6,
                              label=f"{m} eps={e:g}" if (m == "ldp" or j == 1) else None)
            if kind == "additive_error" and len(ns) >= 2:
                anchor = max((r["additive_error"] for r in sub if r["method"] == "ldp"), default=1.0)
                ref = np.array([ns[0], ns[-1]], dtype=float)
                ax.loglog(ref, anchor * np.sqrt(ref / ref[-1]), "k--", lw=0.8, label="slope 1/2")
            ax.set_title(name)
            ax.set_xlabel("n (users)")
            ax.set_ylabel(ylabel, fontsize=8)
            ax.legend(fontsize=6)
        bh.save_figure(fig, out / fname)
    print("\n".join(lines))


def _cell(values) -> str:
    if not values:
        return "-"
    med = float(np.median(values))
    if len(values) == 1:
        return f"{med:.3g}"
    return f"{med:.3g} [{min(values):.3g}, {max(values):.3g}]"


if __name__ == "__main__":
    sys.exit(main())
