#!/usr/bin/env python
"""Benchmark of the maxcover family (issue 5): a benchmark script, not a test.

Utility section (default)
-------------------------
``dpspark.maxcover.estimator.MaxCover`` (both objectives, candidate modes grid and
private, optionally random and table) against

- the non-private baseline: k-means: scikit-learn ``KMeans`` (k-means++, Lloyd, best
  of n_init=10) on the scaled data; k-median: those same scikit-learn centers
  refined on the FULL data by k-median Lloyd rounds (nearest-center assignment, then
  Weiszfeld geometric-median steps per cluster), keeping the best of the start and
  every round by the sum of distances (so it is never worse than the k-means centers
  evaluated under the sum of distances);
- ``dpspark.dplloyd.estimator.DPLloyd(variant="allocation_nk")`` (k-means only) at
  the same epsilon (pure epsilon-DP; maxcover spends (epsilon, delta = 1e-6)).

on s1, a3, birch2, unbalance (../shared/datasets/clustering-data-v1/sipu) and skin
segmentation (../shared/datasets/skin-segmentation) with the reference k of the
MANIFEST (skin: no reference, k = 2), epsilon in {0.25, 0.5, 1, 2, 4}.

Everything runs through the real estimators on one local SparkSession: each dataset is
written once as a Delta table (feature columns x0..x{d-1}), read back and cached;
every ``fit(df)`` runs on that cached DataFrame. Costs are evaluated on the driver in
the unit space [-1, 1]^d of the public domain (the scaling of bench_common), with the
same objective as the run: cost ratio = cost(released centers) / cost(non-private).

Public bounds: per-column min/max of each dataset (after subsampling, if any), treated
as public domain knowledge as in the DP k-means literature (bench_common.PUBLIC_BOUNDS_NOTE);
they are the ``domain`` given to the estimators, never computed inside the DP job.

Noise: real, secure noise (``seed=None``: OpenDP noise, OS-seeded public randomness)
unless ``--seeded`` (reproducible, NOT private).

Speed section (``--speed``)
---------------------------
n = 10^6 synthetic 2-D points (15 Gaussian blobs in the public box [0, 100]^2) as a
Delta table; maxcover (grid and private, kmeans and kmedian, k = 15, epsilon = 1)
against Spark MLlib ``KMeans(k=15, maxIter=20, tol=0)`` (default k-means|| init) in the
same session: wall times, the ratio, Spark passes against the issue's r + 2 target and
the peak resident memory of the driver processes (the Python driver's VmHWM from
/proc/self/status, reset per job through /proc/self/clear_refs, plus its lifetime
``resource.getrusage(RUSAGE_SELF).ru_maxrss``; the Spark JVM's VmHWM from
/proc/<pid>/status of the java child process, reset the same way: psutil is not
installed in the venv).

    .venv/bin/python scripts/bench_maxcover.py --quick              # smoke: 2000 rows of skin, epsilon 1, 1 rep
    .venv/bin/python scripts/bench_maxcover.py                      # the utility benchmark (--reps 3)
    .venv/bin/python scripts/bench_maxcover.py --report-only        # tables and plots from utility.csv
    .venv/bin/python scripts/bench_maxcover.py --speed              # the speed section (n = 10^5 and 10^6)
    .venv/bin/python scripts/bench_maxcover.py --speed --quick      # smoke: n = 2 x 10^4, kmeans private and MLlib
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402

OUT_DIR = bc.ROOT / "bench" / "results" / "maxcover"
EPSILONS = [0.25, 0.5, 1.0, 2.0, 4.0]
DELTA = 1e-6
DATASETS = {
    "s1": bc.load_s1,
    "a3": bc.load_a3,
    "birch2": bc.load_birch2,
    "unbalance": bc.load_unbalance,
    "skin": bc.load_skin,
}
# method -> (family, objective, candidate mode)
METHODS = {
    "maxcover kmeans grid": ("maxcover", "kmeans", "grid"),
    "maxcover kmeans private": ("maxcover", "kmeans", "private"),
    "maxcover kmeans random": ("maxcover", "kmeans", "random"),
    "maxcover kmedian grid": ("maxcover", "kmedian", "grid"),
    "maxcover kmedian private": ("maxcover", "kmedian", "private"),
    "maxcover kmedian random": ("maxcover", "kmedian", "random"),
    "maxcover kmedian table": ("maxcover", "kmedian", "table"),
    "dplloyd allocation_nk": ("dplloyd", "kmeans", "-"),
}
REQUIRED_METHODS = ["maxcover kmeans grid", "maxcover kmeans private", "maxcover kmedian grid",
                    "maxcover kmedian private", "dplloyd allocation_nk"]
CSV_FIELDS = [
    "dataset", "n", "d", "k", "subsampled_from", "epsilon", "delta", "method", "family", "objective", "candidates",
    "rep", "cost", "baseline_cost", "cost_ratio", "spark_passes", "thresholds", "candidate_count",
    "picks_per_threshold", "chosen_centers", "fallback_thresholds", "max_histogram", "padded_public_points",
    "wall_s", "pass_s", "solve_s", "epsilon_spent", "delta_spent", "noise", "error", "finished_utc",
]
SPARK_CONF = bh.SPARK_CONF

log = logging.getLogger("bench_maxcover")


# --------------------------------------------------------------------------
# Costs (unit space, numpy)


def min_sq_dist(x: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nearest center index, squared distance to it) per row: explicit differences (no cancellation), chunked."""
    c = np.asarray(centers, dtype=np.float64)
    labels = np.empty(len(x), dtype=np.int64)
    d2 = np.empty(len(x))
    chunk = max(1, 2_000_000 // max(1, c.shape[0]))
    for s in range(0, len(x), chunk):
        b = x[s : s + chunk]
        dd = np.zeros((len(b), c.shape[0]))
        for j in range(x.shape[1]):
            dd += (b[:, j, None] - c[None, :, j]) ** 2
        lab = np.argmin(dd, axis=1)
        labels[s : s + chunk] = lab
        d2[s : s + chunk] = dd[np.arange(len(b)), lab]
    return labels, d2


def objective_cost(x: np.ndarray, centers: np.ndarray, objective: str) -> float:
    _, d2 = min_sq_dist(x, centers)
    return float(d2.sum()) if objective == "kmeans" else float(np.sqrt(d2).sum())


def kmedian_refine(x: np.ndarray, start: np.ndarray, rounds: int = 30, inner: int = 3) -> tuple[np.ndarray, float]:
    """Non-private k-median: Lloyd rounds with Weiszfeld steps from ``start``; the best centers seen and their cost."""
    centers = np.array(start, dtype=np.float64)
    k = centers.shape[0]
    best_c, best = centers.copy(), objective_cost(x, centers, "kmedian")
    for _ in range(rounds):
        labels, _ = min_sq_dist(x, centers)
        for _ in range(inner):
            diff = x - centers[labels]
            dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
            inv = 1.0 / np.maximum(dist, 1e-12)
            den = np.bincount(labels, weights=inv, minlength=k)
            ok = den > 0
            for j in range(x.shape[1]):
                num = np.bincount(labels, weights=inv * x[:, j], minlength=k)
                centers[ok, j] = num[ok] / den[ok]
        cost = objective_cost(x, centers, "kmedian")
        if cost < best * (1 - 1e-7):
            best_c, best = centers.copy(), cost
        else:
            break
    return best_c, best


# --------------------------------------------------------------------------
# Data preparation


def load_dataset(name: str, max_rows: int | None, seed: int):
    """(name, X (original units), k, n before subsampling or None)."""
    _, x, k = DATASETS[name]()
    full = None
    if max_rows and len(x) > max_rows:
        full = len(x)
        rng = np.random.default_rng(bh.stable_seed("subsample", name, seed))
        x = x[np.sort(rng.choice(len(x), size=max_rows, replace=False))]
    return x, k, full


def baselines(name: str, unit: np.ndarray, k: int, cache_path: Path, key: str) -> dict:
    """Non-private costs (unit space), cached in a JSON file (they take a minute on birch2)."""
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    if key in cache:
        return cache[key]
    t0 = time.perf_counter()
    km_centers, km_cost = bc.nonprivate_baseline(unit, k, seed=0, n_init=10)
    t1 = time.perf_counter()
    kmed_start = objective_cost(unit, km_centers, "kmedian")
    _, kmed_cost = kmedian_refine(unit, km_centers)
    t2 = time.perf_counter()
    out = {"kmeans": km_cost, "kmedian": min(kmed_cost, kmed_start), "kmedian_of_kmeans_centers": kmed_start,
           "kmeans_seconds": t1 - t0, "kmedian_seconds": t2 - t1}
    cache[key] = out
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True))
    log.info("%s: non-private k-means cost %.6g (%.1fs), k-median cost %.6g (k-means centers: %.6g; %.1fs)",
             name, km_cost, t1 - t0, out["kmedian"], kmed_start, t2 - t1)
    return out


# --------------------------------------------------------------------------
# Utility runs


def run_one(method: str, ds: dict, eps: float, rep: int, args) -> dict:
    from dpspark.dplloyd.estimator import DPLloyd
    from dpspark.maxcover.estimator import MaxCover

    family, objective, mode = METHODS[method]
    seed = bh.stable_seed(args.seed, ds["name"], eps, method, rep) if args.seeded else None
    row = {"dataset": ds["name"], "n": ds["n"], "d": ds["d"], "k": ds["k"], "subsampled_from": ds["full"] or "",
           "epsilon": eps, "delta": DELTA if family == "maxcover" else 0.0, "method": method, "family": family,
           "objective": objective, "candidates": mode, "rep": rep, "baseline_cost": ds["base"][objective], "error": ""}
    timings: dict = {}
    operational: dict = {}  # pass counts, fallbacks, histogram sizes: NON-PRIVATE, filled by fit, never on the model
    try:
        if family == "maxcover":
            kw = dict(k=ds["k"], epsilon=eps, delta=DELTA, domain=ds["domain"], features=ds["features"],
                      objective=objective, candidates=mode, candidate_count=args.candidate_count, seed=seed)
            if mode == "table":
                kw["candidate_table"] = ds["candidate_table"]
            est = MaxCover(**kw)
        else:
            est = DPLloyd(k=ds["k"], epsilon=eps, domain=ds["domain"], features=ds["features"],
                          variant="allocation_nk", seed=seed)
        t0 = time.perf_counter()
        model = est.fit(ds["df"], timings=timings, operational=operational)
        wall = time.perf_counter() - t0
    except Exception as exc:  # record and go on: a failing configuration is a result too
        log.error("%s %s eps=%g rep=%d failed: %s", ds["name"], method, eps, rep, exc)
        traceback.print_exc()
        row.update({"cost": math.nan, "cost_ratio": math.nan, "error": f"{type(exc).__name__}: {exc}"[:300]})
        return row
    centers_unit = ds["domain"].clip_to_unit(model.centers)
    cost = objective_cost(ds["unit"], centers_unit, objective)
    info = model.info
    row.update({
        "cost": cost, "cost_ratio": cost / ds["base"][objective], "wall_s": round(wall, 3),
        "pass_s": round(sum(v for key, v in timings.items() if "pass" in key), 3),
        "solve_s": round(sum(v for key, v in timings.items() if "solve" in key), 3),
        "epsilon_spent": model.epsilon_spent, "delta_spent": model.delta_spent,
        "noise": info.get("randomness", {}).get("noise", ""),
    })
    if family == "maxcover":
        hist = [h for h in operational.get("histogram_sizes", []) if h is not None]
        row.update({
            "spark_passes": operational["spark_passes"], "thresholds": info["thresholds"],
            "candidate_count": info["candidate_count"], "picks_per_threshold": info["picks_per_threshold"],
            "chosen_centers": info["chosen_centers"], "fallback_thresholds": len(operational["fallback_thresholds"]),
            "max_histogram": max(hist) if hist else 0,
            "padded_public_points": (info.get("private_candidates") or {}).get("padded_public_points", ""),
        })
    else:
        # dplloyd: one aggregation pass per iteration (model.parameters["iterations"]).
        row.update({"spark_passes": model.parameters.get("iterations", "")})
    return row


def write_candidate_table(spark, path: str, domain, features, count: int):
    """The PUBLIC candidate table of the 'table' mode: the regular grid of ``core.grid_candidates`` in original units.

    Data-independent (it depends on the public domain only); with kmedian the default
    solver is then the discrete local search, centers restricted to these rows.
    """
    import pandas as pd

    from dpspark.maxcover import core

    grid = domain.from_unit(core.grid_candidates(domain.dim, count))
    spark.createDataFrame(pd.DataFrame(grid, columns=list(features))).coalesce(1).write.format("delta").mode("overwrite").save(path)
    return grid.shape[0]


def prepare_datasets(spark, names, args, workdir: Path, out_dir: Path) -> list[dict]:
    import pandas as pd

    out = []
    for name in names:
        x, k, full = load_dataset(name, args.max_rows, args.seed)
        lo, hi = bc.public_bounds(x)  # PUBLIC for the benchmark (see PUBLIC_BOUNDS_NOTE)
        domain = bc.domain(lo, hi)
        features = tuple(f"x{j}" for j in range(x.shape[1]))
        unit = domain.clip_to_unit(x)
        key = f"{name}/n={len(x)}/full={full}/seed={args.seed if full else '-'}"
        base = baselines(name, unit, k, out_dir / "baselines.json", key)
        path = str(workdir / name)
        t0 = time.perf_counter()
        spark.createDataFrame(pd.DataFrame(x, columns=list(features))).repartition(args.partitions) \
            .write.format("delta").mode("overwrite").save(path)
        df = spark.read.format("delta").load(path).cache()
        df.count()
        cand_path = str(workdir / f"{name}_candidates")
        n_cand = write_candidate_table(spark, cand_path, domain, features, args.candidate_count)
        log.info("%s: n=%d d=%d k=%d%s; Delta table + cache in %.1fs; candidate table %d rows",
                 name, len(x), x.shape[1], k, f" (subsample of {full})" if full else "", time.perf_counter() - t0, n_cand)
        out.append({"name": name, "n": len(x), "d": x.shape[1], "k": k, "full": full, "domain": domain,
                    "features": features, "unit": unit, "base": base, "df": df, "candidate_table": cand_path})
    return out


def row_key(r) -> tuple:
    return (r["dataset"], float(r["epsilon"]), r["method"], int(r["rep"]))


def utility(args, out_dir: Path, command: str):
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "utility.csv"
    existing = bh.read_csv(csv_path) if args.resume else []
    done = {row_key(r) for r in existing if not r.get("error")}
    existing = [r for r in existing if row_key(r) in done]  # failed rows are retried
    bh.write_csv(csv_path, existing, CSV_FIELDS)
    todo = [(rep, name, eps, m) for rep in range(args.reps) for name in args.datasets for eps in args.epsilons
            for m in args.methods if (name, float(eps), m, rep) not in done]
    log.info("%d runs to do (%d already in %s)", len(todo), len(done), csv_path)
    if todo:
        workdir = Path(tempfile.mkdtemp(prefix="dpspark_bench_maxcover_"))
        t_start = time.perf_counter()
        datasets: dict = {}
        with bh.session("dpspark-bench-maxcover", master=args.master) as spark:
            try:
                names = [n for n in args.datasets if any(t[1] == n for t in todo)]
                datasets.update((d["name"], d) for d in prepare_datasets(spark, names, args, workdir, out_dir))
                log.info("datasets ready in %.1fs", time.perf_counter() - t_start)
                for i, (rep, name, eps, method) in enumerate(todo):
                    ds = datasets[name]
                    row = run_one(method, ds, eps, rep, args)
                    row["finished_utc"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
                    bh.append_csv(csv_path, row, CSV_FIELDS)
                    log.info("[%d/%d %.0fs] %s eps=%g rep=%d %s: ratio %.4g, passes %s, %.1fs", i + 1, len(todo),
                             time.perf_counter() - t_start, name, eps, rep, method, row["cost_ratio"],
                             row.get("spark_passes", ""), row.get("wall_s", math.nan))
            finally:
                for d in datasets.values():
                    d["df"].unpersist()
                shutil.rmtree(workdir, ignore_errors=True)
        log.info("utility runs done in %.1fs", time.perf_counter() - t_start)
    report(out_dir, command, args)


# --------------------------------------------------------------------------
# Reports


def machine_line() -> str:
    m = bh.machine_description()
    return (f"{m['nproc']} CPUs (nproc; {m['affinity_cpus']} usable), {m['memory_gb']} GB memory, {m['cpu']}, "
            f"Python {m['python']}, {m['platform']}")


def report(out_dir: Path, command: str, args):
    rows = bh.read_csv(out_dir / "utility.csv")
    if not rows:
        log.warning("no rows in %s", out_dir / "utility.csv")
        return
    ok = [r for r in rows if not r["error"]]
    errors = [r for r in rows if r["error"]]
    ds_order = [n for n in DATASETS if any(r["dataset"] == n for r in rows)]
    m_order = [m for m in METHODS if any(r["method"] == m for r in rows)]
    e_order = sorted({float(r["epsilon"]) for r in rows})
    by = defaultdict(list)
    for r in ok:
        by[(r["dataset"], float(r["epsilon"]), r["method"])].append(r)
    meta = {}
    for r in rows:
        meta.setdefault(r["dataset"], (r["n"], r["d"], r["k"], r["subsampled_from"], bh.fnum(r["baseline_cost"]) if r["objective"] == "kmeans" else None))
    base_costs = defaultdict(dict)
    for r in rows:
        base_costs[r["dataset"]][r["objective"]] = bh.fnum(r["baseline_cost"])

    def cell(g, metric="cost_ratio", digits=3):
        return bc.fmt_med_iqr([bh.fnum(r[metric]) for r in g], digits) if g else ""

    def med(g, metric):
        return bc.median_iqr([bh.fnum(r[metric]) for r in g])[0] if g else math.nan

    lines = [
        "# maxcover utility benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_line()}. Spark master `{args.master}`, conf {SPARK_CONF}, one SparkSession for all runs. "
        f"The machine is shared with other jobs (load average at report time: {bh.load_average()}): wall times are noisy.",
        "",
        f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from `utility.csv` ({len(rows)} rows, "
        f"{len(errors)} failed runs).",
        "",
        "**Public bounds.** " + bc.PUBLIC_BOUNDS_NOTE + " They are a benchmark convention, not something a real "
        "deployment may compute from private data.",
        "",
        "**What is compared.** Every run is a real `fit(df)` of `dpspark.maxcover.estimator.MaxCover` (candidate_count "
        f"{args.candidate_count}, delta = {DELTA:g}, the default epsilon splits and solvers) or "
        "`dpspark.dplloyd.estimator.DPLloyd(variant=\"allocation_nk\")` (k-means only, pure epsilon-DP, its defaults: "
        "12 iterations) on the dataset's cached Delta table, with secure noise (seed=None) unless stated. "
        "Cost ratio = cost of the released centers on the data / non-private cost, same objective "
        "(k-means: sum of squared distances; k-median: sum of distances), both in the unit space [-1, 1]^d of the public domain. "
        "Non-private k-means: scikit-learn KMeans (k-means++, best of n_init=10). Non-private k-median: the same "
        "scikit-learn centers refined on the full data by k-median Lloyd rounds with Weiszfeld steps (best cost seen; "
        "never worse than those k-means centers under the sum of distances). The k-median baseline is a local optimum, "
        "not the optimum: a ratio slightly below 1 is possible.",
        "",
        "Candidate modes: `grid` = regular grid of about candidate_count points over the public domain; `private` = the DP "
        "candidate generator (noisy heavy cells of shifted grids at 5 scales; 20% of epsilon and half of delta), padded "
        "with public random points when fewer than k cells are released; `random` = uniform public sample of the domain; "
        "`table` = the same regular grid written as a public Delta table (`candidates=\"table\"`), which makes the k-median "
        "solver the discrete local search over the candidate rows (the paper's discrete setting); `table` is run for k-median "
        "only (with the k-means solver it is the grid mode).",
        "",
        "Spark passes: maxcover `fit(df, operational=ops)`'s `ops[\"spark_passes\"]` (r thresholds + 1 snap pass, + 1 for private candidates); dplloyd "
        "one aggregation pass per iteration. Wall time: the whole `fit` (seconds).",
        "",
    ]
    runs = defaultdict(int)
    for (_, _, m), g in by.items():
        runs[m] = max(runs[m], len(g))
    if len(set(runs.values())) > 1:
        lines += ["Runs per (dataset, epsilon): " + ", ".join(f"{m}: {runs[m]}" for m in m_order)
                  + " (methods with fewer runs were added as time allowed: their IQR is not meaningful).", ""]
    wall_total = sum(bh.fnum(r.get("wall_s")) for r in ok if not math.isnan(bh.fnum(r.get("wall_s"))))
    lines += [f"Sum of the fit wall times: {wall_total / 60:.1f} min.", "", "## Datasets", ""]
    ds_rows = []
    for ds in ds_order:
        n, d, k, full, _ = meta[ds]
        ds_rows.append([ds, n, d, k, f"uniform random subsample of {full} rows" if full else "all rows",
                        f"{base_costs[ds].get('kmeans', math.nan):.5g}", f"{base_costs[ds].get('kmedian', math.nan):.5g}"])
    lines.append(bh.markdown_table(["dataset", "n", "d", "k", "rows used", "non-private k-means cost", "non-private k-median cost"],
                                   ds_rows, ["l", "r", "r", "r", "l", "r", "r"]))
    # Compact table at epsilon = 1
    for eps_c in [1.0]:
        if eps_c not in e_order:
            continue
        lines += ["", f"## Summary at epsilon = {eps_c:g}: cost ratio median [IQR] (Spark passes, wall s)", ""]
        trows = []
        for m in m_order:
            cells = []
            for ds in ds_order:
                g = by.get((ds, eps_c, m))
                cells.append(f"{cell(g)} ({med(g, 'spark_passes'):.0f}, {med(g, 'wall_s'):.1f}s)" if g else "")
            trows.append([m, *cells])
        lines.append(bh.markdown_table(["method", *ds_order], trows, ["l", *["r"] * len(ds_order)]))
    # Per dataset
    for ds in ds_order:
        n, d, k, full, _ = meta[ds]
        lines += ["", f"## {ds} (n = {n}{f', subsample of {full}' if full else ''}, d = {d}, k = {k})", "",
                  f"![cost ratio vs epsilon]({ds}.png)", ""]
        trows = []
        for eps in e_order:
            for m in m_order:
                g = by.get((ds, eps, m))
                if not g:
                    continue
                padded = [bh.fnum(r["padded_public_points"]) for r in g]
                padded = [p for p in padded if not math.isnan(p)]
                trows.append([f"{eps:g}", m, len(g), cell(g), f"{med(g, 'spark_passes'):.0f}",
                              f"{med(g, 'candidate_count'):.0f}" if g[0]["family"] == "maxcover" else "",
                              f"{med(g, 'wall_s'):.1f}", f"{med(g, 'pass_s'):.1f}" if g[0]["family"] == "maxcover" else "",
                              f"{np.median(padded):.0f}" if padded and g[0]["candidates"] == "private" else ""])
        lines.append(bh.markdown_table(
            ["epsilon", "method", "runs", "cost ratio median [IQR]", "Spark passes", "candidates |V|", "wall s (median)",
             "of which maxcover passes s", "private: padded random candidates"],
            trows, ["r", "l", "r", "r", "r", "r", "r", "r", "r"]))
    if errors:
        lines += ["", "## Failed runs", ""]
        lines.append(bh.markdown_table(["dataset", "epsilon", "method", "rep", "error"],
                                       [[r["dataset"], r["epsilon"], r["method"], r["rep"], r["error"]] for r in errors]))
    (out_dir / "utility.md").write_text("\n".join(lines) + "\n")
    log.info("wrote %s", out_dir / "utility.md")
    plots(by, ds_order, m_order, e_order, meta, out_dir)


def plots(by, ds_order, m_order, e_order, meta, out_dir: Path):
    plt = bh.pyplot()
    colors = {"grid": "tab:blue", "private": "tab:red", "random": "tab:green", "table": "tab:purple", "-": "black"}
    for ds in ds_order:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in m_order:
            family, objective, mode = METHODS[m]
            xs, ys, lo, hi = [], [], [], []
            for eps in e_order:
                g = by.get((ds, eps, m))
                if not g:
                    continue
                md, q25, q75 = bc.median_iqr([bh.fnum(r["cost_ratio"]) for r in g])
                xs.append(eps), ys.append(md), lo.append(md - q25), hi.append(q75 - md)
            if not xs:
                continue
            style = ":" if family == "dplloyd" else ("-" if objective == "kmeans" else "--")
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, marker="o", ms=4, capsize=3, color=colors[mode], label=m)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(e_order)
        ax.set_xticklabels([f"{e:g}" for e in e_order])
        n, d, k, full, _ = meta[ds]
        ax.set_xlabel("epsilon (maxcover: delta = 1e-6)")
        ax.set_ylabel("cost ratio to non-private (same objective)")
        ax.set_title(f"{ds} (n={n}{' subsample' if full else ''}, d={d}, k={k}): median, IQR bars")
        ax.legend(fontsize=7)
        bh.save_figure(fig, out_dir / f"{ds}.png")
        log.info("wrote %s", out_dir / f"{ds}.png")


# --------------------------------------------------------------------------
# Speed section


def make_speed_table(spark, path: str, n: int, seed: int, partitions: int, k: int = 15, box: float = 100.0,
                     sigma: float = 2.5):
    """n points from 15 Gaussian blobs (means uniform in [10, 90]^2, sigma 2.5), clipped to [0, box]^2, as Delta."""
    means = np.random.default_rng(seed).uniform(0.1 * box, 0.9 * box, size=(k, 2))
    bh.mixture_table(spark, path, n, means, sigma, seed, partitions, clip=(0.0, box))
    return means


def speed(args, out_dir: Path, command: str):
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="dpspark_bench_maxcover_speed_"))
    with bh.session("dpspark-bench-maxcover-speed", master=args.master) as spark:
        jvm = bh.find_jvm(os.getpid())
        log.info("Spark driver JVM pid: %s", jvm)
        try:
            results = speed_runs(spark, jvm, args, workdir)
        finally:
            py_lifetime_mb = bh.lifetime_peak_mb()
            shutil.rmtree(workdir, ignore_errors=True)
    speed_report(results, out_dir, command, args, py_lifetime_mb, jvm)


def speed_runs(spark, jvm, args, workdir: Path) -> list[dict]:
    """maxcover (both objectives, grid and private candidates; --quick: kmeans private) and MLlib on each n."""
    from pyspark.ml.clustering import KMeans
    from pyspark.ml.feature import VectorAssembler

    from dpspark.maxcover.estimator import MaxCover

    k, eps, box = 15, 1.0, 100.0
    domain = bc.domain([0.0, 0.0], [box, box])  # the public box
    features = ("x0", "x1")
    results = []
    configs = [(obj, mode) for obj in ("kmeans", "kmedian") for mode in ("grid", "private")]
    if args.quick:
        configs = [("kmeans", "private")]
    if not args.quick:  # warm-up on a small table: JVM JIT, Python workers, Delta log, MLlib classes
        warm = str(workdir / "warm")
        make_speed_table(spark, warm, 20_000, args.seed + 99, args.partitions)
        wdf = spark.read.format("delta").load(warm)
        MaxCover(k=k, epsilon=eps, delta=DELTA, domain=domain, features=features, objective="kmeans", candidates="grid").fit(wdf)
        wvec = VectorAssembler(inputCols=list(features), outputCol="features").transform(wdf).select("features")
        KMeans(k=k, maxIter=3, tol=0.0, seed=1).fit(wvec)
    for n in args.speed_n:
        path = str(workdir / f"points_{n}")
        t0 = time.perf_counter()
        means = make_speed_table(spark, path, n, args.seed, args.partitions)
        log.info("speed: wrote n=%d in %.1fs", n, time.perf_counter() - t0)
        df = spark.read.format("delta").load(path)
        for rep in range(args.speed_reps):
            for obj, mode in configs:
                timings: dict = {}
                operational: dict = {}  # NON-PRIVATE operational metadata filled by fit
                with bh.PeakMemory(jvm) as mem:
                    t0 = time.perf_counter()
                    model = MaxCover(k=k, epsilon=eps, delta=DELTA, domain=domain, features=features, objective=obj,
                                     candidates=mode, candidate_count=args.candidate_count).fit(
                                         df, timings=timings, operational=operational)
                    wall = time.perf_counter() - t0
                info = model.info
                hist = [h for h in operational["histogram_sizes"] if h is not None]
                res = {"n": n, "rep": rep, "job": f"maxcover {obj} {mode}", "objective": obj, "wall_s": wall,
                       "passes": operational["spark_passes"], "r": info["thresholds"], "candidates": info["candidate_count"],
                       "fallbacks": len(operational["fallback_thresholds"]), "max_hist": max(hist) if hist else 0,
                       "pass_s": sum(v for key, v in timings.items() if "pass" in key),
                       "solve_s": sum(v for key, v in timings.items() if "solve" in key),
                       "py_peak_mb": mem.py_peak_mb, "jvm_peak_mb": mem.jvm_peak_mb, "hwm_reset": [mem.py_reset, mem.jvm_reset],
                       "centers": model.centers}
                results.append(res)
                log.info("speed n=%d %s: %.1fs, %d passes (r=%d), py peak %.0f MB, JVM peak %.0f MB", n, res["job"],
                         wall, res["passes"], res["r"], mem.py_peak_mb, mem.jvm_peak_mb)
            # MLlib: end to end from the Delta table (assemble, cache, fit) and fit only on the cached vectors.
            with bh.PeakMemory(jvm) as mem:
                t0 = time.perf_counter()
                vec = VectorAssembler(inputCols=list(features), outputCol="features").transform(df).select("features").cache()
                vec.count()
                t_cache = time.perf_counter() - t0
                t1 = time.perf_counter()
                km = KMeans(k=k, maxIter=20, tol=0.0, seed=args.seed + rep).fit(vec)
                t_fit = time.perf_counter() - t1
            wall = time.perf_counter() - t0
            t2 = time.perf_counter()
            km2 = KMeans(k=k, maxIter=20, tol=0.0, seed=args.seed + rep).fit(vec)  # same seed: same iterations
            t_fit2 = time.perf_counter() - t2
            vec.unpersist()
            res = {"n": n, "rep": rep, "job": "MLlib KMeans", "objective": "kmeans", "wall_s": wall, "cache_s": t_cache,
                   "fit_s": t_fit, "fit2_s": t_fit2, "iterations": km.summary.numIter, "iterations2": km2.summary.numIter,
                   "py_peak_mb": mem.py_peak_mb, "jvm_peak_mb": mem.jvm_peak_mb, "hwm_reset": [mem.py_reset, mem.jvm_reset],
                   "centers": np.array([np.asarray(c) for c in km.clusterCenters()])}
            results.append(res)
            log.info("speed n=%d MLlib: %.1fs end to end (cache %.1fs + fit %.1fs, %d iterations); fit again %.1fs (%d it.)",
                     n, wall, t_cache, t_fit, res["iterations"], t_fit2, res["iterations2"])
        # Utility on the speed data (after the memory measurements: collects the points to the driver).
        pts = df.toPandas().to_numpy(dtype=np.float64)
        unit = domain.clip_to_unit(pts)
        base = {"kmeans": objective_cost(unit, domain.clip_to_unit(means), "kmeans"),
                "kmedian": objective_cost(unit, domain.clip_to_unit(means), "kmedian")}
        for res in results:
            if res["n"] == n:
                res["cost_ratio_true_means"] = objective_cost(unit, domain.clip_to_unit(res["centers"]), res["objective"]) / base[res["objective"]]
        del pts, unit
    return results


def speed_report(results, out_dir: Path, command: str, args, py_lifetime_mb: float, jvm):
    lines = [
        "# maxcover speed: maxcover vs Spark MLlib KMeans",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_line()}. Spark master `{args.master}`, conf {SPARK_CONF}, driver memory 4g, one SparkSession "
        f"for everything. The machine is shared with other jobs (load average at report time: {bh.load_average()}): "
        "absolute times are noisy.",
        "",
        f"Data: n points of 15 Gaussian blobs (sigma 2.5, means uniform in [10, 90]^2), clipped to the PUBLIC box [0, 100]^2 "
        f"(the domain given to maxcover), a Delta table of {args.partitions} files generated on Spark. k = 15, epsilon = 1, "
        f"delta = {DELTA:g}, candidate_count = {args.candidate_count}; secure noise. A warm-up fit of each job on 20 000 "
        "points runs first.",
        "",
        "- maxcover: `MaxCover(...).fit(df)` on the UNCACHED Delta table (fit caches its unit-space input itself; its first "
        "pass reads the table). Wall = the whole fit.",
        "- MLlib: `KMeans(k=15, maxIter=20, tol=0)` (default k-means|| init, initSteps=2). End to end = VectorAssembler on the "
        "Delta table, cache + count, fit; fit only = a second, identical fit (same seed) on the cached vectors. "
        "MLlib stops before maxIter if no center moves (tol=0): iterations run are listed.",
        "- Spark passes: maxcover's `fit(df, operational=ops)` `ops[\"spark_passes\"]`; the issue's target is at most r + 2 (r = number of thresholds).",
        "- Peak memory: Python driver = VmHWM of /proc/self/status, reset before each job via /proc/self/clear_refs; "
        f"JVM = VmHWM of /proc/{jvm}/status (the java child process of the Python driver; psutil is not installed), reset the "
        f"same way. Lifetime peak of the Python driver (resource.getrusage(RUSAGE_SELF).ru_maxrss, includes the final "
        f"collect of the points for the cost column): {py_lifetime_mb:.0f} MB. The Python workers (executors, children of "
        "the JVM) are not counted. JVM RSS mostly reflects heap growth up to spark.driver.memory, not live data.",
        "- cost ratio: cost of the released centers (same objective) / cost of the 15 true blob means, on all n points "
        "(not a DP output, for orientation).",
        "",
    ]
    for n in sorted({r["n"] for r in results}):
        rs = [r for r in results if r["n"] == n]
        ml = [r for r in rs if r["job"] == "MLlib KMeans"]
        ml_e2e = float(np.median([r["wall_s"] for r in ml]))
        ml_fit = float(np.median([r["fit2_s"] for r in ml]))
        rows = []
        for job in [j for j in dict.fromkeys(r["job"] for r in rs)]:
            g = [r for r in rs if r["job"] == job]
            wall = float(np.median([r["wall_s"] for r in g]))
            if job == "MLlib KMeans":
                rows.append([job, f"{wall:.1f} (cache {np.median([r['cache_s'] for r in g]):.1f} + fit "
                             f"{np.median([r['fit_s'] for r in g]):.1f}); fit only {ml_fit:.1f}",
                             "1.00", f"{wall / ml_fit:.2f}",
                             f"{g[0]['iterations']} / {g[0]['iterations2']} iterations", "", "",
                             f"{max(r['py_peak_mb'] for r in g):.0f}", f"{max(r['jvm_peak_mb'] for r in g):.0f}",
                             f"{np.median([r.get('cost_ratio_true_means', math.nan) for r in g]):.4f}"])
            else:
                passes, r_ = g[0]["passes"], g[0]["r"]
                rows.append([job, f"{wall:.1f} (passes {np.median([r['pass_s'] for r in g]):.1f}, solve "
                             f"{np.median([r['solve_s'] for r in g]):.1f})",
                             f"{wall / ml_e2e:.2f}", f"{wall / ml_fit:.2f}",
                             f"{passes} (r = {r_}, target <= {r_ + 2}: {'met' if passes <= r_ + 2 else 'MISSED'})",
                             f"{g[0]['candidates']}", f"{max(r['max_hist'] for r in g)}",
                             f"{max(r['py_peak_mb'] for r in g):.0f}", f"{max(r['jvm_peak_mb'] for r in g):.0f}",
                             f"{np.median([r.get('cost_ratio_true_means', math.nan) for r in g]):.4f}"])
        lines += [f"## n = {n:,}" + (f" ({args.speed_reps} reps, medians)" if args.speed_reps > 1 else ""), "",
                  bh.markdown_table(["job", "wall s", "ratio to MLlib end to end", "ratio to MLlib fit only",
                                     "Spark passes", "candidates |V|", "largest signature histogram",
                                     "Python driver peak RSS MB", "JVM peak RSS MB", "cost ratio to true means"],
                                    rows, ["l", "r", "r", "r", "l", "r", "r", "r", "r", "r"]), ""]
    lines += ["Raw results (JSON lines, centers omitted):", "", "```"]
    for r in results:
        lines.append(json.dumps({key: (round(v, 3) if isinstance(v, float) else v) for key, v in r.items() if key != "centers"}))
    lines += ["```", ""]
    (out_dir / "speed.md").write_text("\n".join(lines))
    log.info("wrote %s", out_dir / "speed.md")


# --------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2000 rows of skin, epsilon 1, 1 rep (outputs in "
                    "quick/); with --speed: n = 2 x 10^4, maxcover kmeans private and MLlib, no warm-up")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--epsilons", nargs="+", type=float, default=EPSILONS)
    ap.add_argument("--methods", nargs="+", default=REQUIRED_METHODS, choices=list(METHODS),
                    help="default: the required ones (maxcover grid/private x kmeans/kmedian, dplloyd)")
    ap.add_argument("--all-methods", action="store_true", help="also random and table candidates")
    ap.add_argument("--max-rows", type=int, default=50_000, help="uniform subsample of bigger datasets (0: none)")
    ap.add_argument("--candidate-count", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=2, help="files of each Delta table (= input partitions)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--seed", type=int, default=7, help="subsampling (and with --seeded all randomness)")
    ap.add_argument("--seeded", action="store_true", help="seeded noise: reproducible, NOT private")
    ap.add_argument("--resume", action="store_true", help="keep the finished rows of utility.csv, run the rest")
    ap.add_argument("--report-only", action="store_true", help="rewrite utility.md and the plots from utility.csv")
    ap.add_argument("--speed", action="store_true", help="the speed section instead of the utility benchmark")
    ap.add_argument("--speed-n", nargs="+", type=int, default=[100_000, 1_000_000])
    ap.add_argument("--speed-reps", type=int, default=1)
    ap.add_argument("--out", default=str(OUT_DIR))
    ap.add_argument("--command", default=None, help="the command recorded in the reports (default: this invocation)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[bench] %(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("dpspark").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    out_dir = Path(args.out)
    if args.all_methods:
        args.methods = list(METHODS)
    if args.max_rows == 0:
        args.max_rows = None
    if args.quick:
        out_dir = out_dir / "quick"
        if args.speed:
            args.speed_n = [20_000]
        else:
            args.datasets, args.epsilons, args.reps, args.max_rows = ["skin"], [1.0], 1, 2000
    command = args.command or ".venv/bin/python scripts/bench_maxcover.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.speed:
        speed(args, out_dir, command)
    elif args.report_only:
        report(out_dir, command, args)
    else:
        utility(args, out_dir, command)


if __name__ == "__main__":
    main()
