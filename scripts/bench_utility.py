#!/usr/bin/env python
"""Utility benchmark of every dpspark family against a non-private baseline and a DP peer (issue 7).

Methods (all k-means objective, so one cost ratio compares them all):

- ``maxcover_grid``, ``maxcover_private``: ``MaxCover(objective="kmeans", candidates=...)``,
  delta = 1e-6 (the only (epsilon, delta) family; everything else is pure epsilon-DP);
- ``dplloyd_<variant>`` for the four variants (allocation_nk, average_nk, average_k, allocation_k);
- ``ldp``: ``LocalDP(objective="kmeans")`` (a LOCAL guarantee: much stronger, expect worse utility);
- ``nonprivate``: scikit-learn ``KMeans`` (k-means++ init, Lloyd, best of n_init=10), the denominator
  of the cost ratio (so its ratio is 1 by definition; its NICV is the floor);
- ``diffprivlib``: IBM diffprivlib ``KMeans(epsilon, bounds)`` as the peer, run in its own venv
  (``.cache/peer-venv``, created by this script with ``python3 -m venv`` + ``pip install diffprivlib``;
  it needs an older scikit-learn than the project) through a subprocess on .npy files.

Engine. The dpspark families run their REAL driver code (the estimator's own parameter
validation, budget split, accountant, mechanisms, coverage loop / Lloyd iterations / LDP clients
and server, solvers) on the data held in numpy, with the numpy reference aggregations of the
package instead of the Spark passes: ``dplloyd.core.numpy_aggregate``,
``maxcover.core.NumpySignatureProvider`` / ``core.snap_counts`` / the ``passes.cell_aggregator``
function applied to one pandas batch, and ``ldp.client.randomize_batch``. These compute the same
exact aggregates as the Spark passes (the package's tests check that). The Spark fit itself is
measured by ``scripts/bench_scale.py``; a Spark ``.fit(df)`` costs 3-40 s per run on this shared
2-core machine, which would allow ~1 dataset in the time budget instead of 6.
``--engine spark`` runs the same benchmark through ``estimator.fit(spark_df)`` (slow; for spot checks).

Public bounds: per-column min/max of each dataset, treated as public domain knowledge, the
benchmark convention of the DP k-means literature (bench_common.PUBLIC_BOUNDS_NOTE). The
estimators receive them as their public ``Domain``; the data and all costs are in [-1, 1]^d.

Metrics: cost ratio = k-means cost of the released centers / cost of the non-private baseline;
NICV = cost / N (both on the data scaled to [-1, 1]^d). Cells: median [25th, 75th percentile].

Noise: secure (OpenDP) noise for dpspark, ``random_state=None`` for the peer, unless ``--seeded``.

    .venv/bin/python scripts/bench_utility.py --quick --no-peer --out /tmp/u   # smoke (CI)
    .venv/bin/python scripts/bench_utility.py                                   # full run
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import multiprocessing
import os
import subprocess
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_common as bc  # noqa: E402

ROOT = bc.ROOT
DEFAULT_OUT = ROOT / "bench" / "results" / "utility"
PEER_VENV = ROOT / ".cache" / "peer-venv"
EPSILONS = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0]
DELTA = 1e-6
DPLLOYD_VARIANTS = ["allocation_nk", "average_nk", "average_k", "allocation_k"]
DP_METHODS = ["maxcover_grid", "maxcover_private"] + [f"dplloyd_{v}" for v in DPLLOYD_VARIANTS] + ["ldp"]
PEER = "diffprivlib"
NONPRIVATE = "nonprivate"

# Full run: datasets and the row cap (uniform subsample without replacement, fixed seed).
FULL_DATASETS = ["s1", "blood_transfusion", "tripadvisor_review", "electrical_grid_stability", "adult"]
QUICK_DATASETS = ["blood_transfusion"]
LOADERS = {f.__name__.replace("load_", ""): f for f in bc.ALL_LOADERS}
LOADER_ALIASES = {"s1": "s1", "unbalance": "unbalance", "blood_transfusion": "blood_transfusion",
                  "tripadvisor_review": "tripadvisor", "electrical_grid_stability": "electrical_grid",
                  "adult": "adult", "google_review_ratings": "google_reviews", "credit_card_clients": "credit_card",
                  "a3": "a3", "birch2": "birch2", "skin_segmentation": "skin"}

CSV_COLUMNS = ["dataset", "n", "d", "k", "method", "epsilon", "runs", "cost_ratio_median", "cost_ratio_q25",
               "cost_ratio_q75", "nicv_median", "nicv_q25", "nicv_q75", "epsilon_spent", "delta_spent", "failures"]

log = logging.getLogger("bench_utility")


# ---------------------------------------------------------------------------
# Data


def load_dataset(name: str, max_rows: int | None, seed: int = 0) -> dict:
    _, x, k = LOADERS[LOADER_ALIASES[name]]()
    n_full = x.shape[0]
    if max_rows and x.shape[0] > max_rows:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        x = x[np.sort(rng.choice(x.shape[0], size=max_rows, replace=False))]
    lo, hi = bc.public_bounds(x)
    return {"name": name, "x": x, "unit": bc.scale_unit(x, lo, hi), "lo": lo, "hi": hi, "k": k, "n_full": n_full}


def domain_of(ds):
    from dpspark.privacy.domain import Domain

    return Domain(dim=ds["x"].shape[1], lower=tuple(float(v) for v in ds["lo"]), upper=tuple(float(v) for v in ds["hi"]))


# ---------------------------------------------------------------------------
# The dpspark families on numpy (same driver code, numpy reference aggregation)


def make_estimator(method: str, ds: dict, eps: float, seed: int | None):
    from dpspark.dplloyd.estimator import DPLloyd
    from dpspark.ldp.estimator import LocalDP
    from dpspark.maxcover.estimator import MaxCover

    dom, k = domain_of(ds), ds["k"]
    feats = tuple(f"f{j}" for j in range(dom.dim))
    if method.startswith("maxcover_"):
        return MaxCover(k=k, epsilon=eps, delta=DELTA, domain=dom, features=feats, objective="kmeans",
                        candidates=method.split("_", 1)[1], seed=seed)
    if method.startswith("dplloyd_"):
        return DPLloyd(k=k, epsilon=eps, domain=dom, features=feats, variant=method.split("_", 1)[1], seed=seed)
    if method == "ldp":
        return LocalDP(k=k, epsilon=eps, domain=dom, features=feats, objective="kmeans", seed=seed)
    raise ValueError(method)


def _np_cell_aggregates(unit, columns):
    """``passes.cell_aggregates`` without Spark: the same mapInPandas function on one pandas batch."""
    import pandas as pd

    from dpspark.maxcover import passes

    def cell_aggregates(_df, _columns, sides, shifts, min_count=1, counter=None, timings=None):
        dim = len(columns)
        fn = passes.cell_aggregator(sides, shifts, columns, 1 << 16)
        parts = list(fn(iter([pd.DataFrame(unit, columns=columns)])))
        out = []
        for level in range(len(sides)):
            rows = [p for p in parts if len(p) and int(p["level"].iloc[0]) == level]
            if not rows:
                out.append((np.zeros((0, dim), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.int64)))
                continue
            pdf = pd.concat(rows)
            g = np.frombuffer(b"".join(bytes(c) for c in pdf["cell"]), dtype=np.int32).reshape(-1, dim).astype(np.int64)
            n = pdf["n"].to_numpy(dtype=np.int64)
            s = pdf[[f"s{j}" for j in range(dim)]].to_numpy(dtype=np.int64)
            keep = n >= min_count
            g, n, s = g[keep], n[keep], s[keep]
            order = np.lexsort(g.T[::-1])
            out.append((g[order], n[order], s[order]))
        if counter is not None:
            counter.add("candidate cells")
        return out

    return cell_aggregates


def fit_numpy(est, x_original: np.ndarray):
    """Run ``est``'s driver code with numpy aggregation; returns (centers original units, eps spent, delta spent, info)."""
    from dpspark.privacy.accountant import Accountant
    from dpspark.privacy.randomness import Randomness

    randomness = Randomness(est.seed)
    unit = est.domain.clip_to_unit(x_original)
    name = type(est).__name__
    if name == "DPLloyd":
        from dpspark.dplloyd import core

        params = est._validated_params()
        epsilon, delta = core.plan(est.epsilon)
        acc = Accountant(epsilon, delta, randomness.noise)
        centers_unit, _, trace = core.run_lloyd(core.numpy_aggregate(unit), est.domain, est.k, params, acc,
                                                randomness.public_rng("dplloyd"), epsilon)
        acc.finish()
        return est.domain.from_unit(centers_unit), acc.spent_epsilon, acc.spent_delta, {"reseeded": sum(trace.reseeded)}
    if name == "MaxCover":
        from dpspark.maxcover import candidates as cand_mod
        from dpspark.maxcover import core
        from dpspark.maxcover.params import budget_split
        from dpspark.tables import unit_columns

        params = est._validated_params()
        epsilon, delta = est.privacy_plan()
        budget = budget_split(epsilon, delta, params)
        acc = Accountant(epsilon, delta, randomness.noise)
        rng = randomness.public_rng("maxcover.candidates")
        if params.candidates == "private":
            columns = unit_columns(est.domain.dim)
            saved = cand_mod.passes.cell_aggregates
            cand_mod.passes.cell_aggregates = _np_cell_aggregates(unit, columns)
            try:
                cand, _ = cand_mod.private_candidates(None, columns, est.domain, params.candidate_count,
                                                      params.candidate_scales, est.k, *budget["candidates"], acc, rng)
            finally:
                cand_mod.passes.cell_aggregates = saved
        else:
            cand = cand_mod.public_candidates(params.candidates, est.domain, params.candidate_count, rng)
        ts = core.thresholds(est.domain.unit_diameter, 2, cand.shape[0], params.coverage_approx, params.n_upper)
        m = core.picks_per_threshold(est.k, params.coverage_approx)
        provider = core.NumpySignatureProvider(unit, cand, ts, 2)
        picks = core.run_coverage(provider, cand.shape[0], ts, m, acc, *budget["coverage"])
        chosen = cand[core.chosen_candidate_ids(picks)]
        noisy = core.noisy_weights(core.snap_counts(unit, chosen, 2), acc, budget["counts"][0])
        centers, _ = est._solve(params, chosen, np.maximum(noisy, 0).astype(np.float64), cand, None,
                                randomness.public_rng("maxcover.solver"))
        acc.finish()
        return centers, acc.spent_epsilon, acc.spent_delta, {"candidates": int(cand.shape[0]), "chosen": int(chosen.shape[0])}
    if name == "LocalDP":
        from dpspark.ldp import client, protocol
        from dpspark.ldp.estimator import LOCAL_LABEL, LOCAL_RULE

        params = est._validated_params()
        epsilon, delta = est.privacy_plan()
        acc = Accountant(epsilon, delta, randomness.noise)
        driver = est._driver(params, randomness)
        acc.charge(LOCAL_LABEL, epsilon, 0.0, LOCAL_RULE)
        seeds = [client.user_seed(randomness.run_key, str(i)) for i in range(unit.shape[0])]
        rounds = client.choose_round_batch(seeds, params.fractions)
        for r in (1, 2, 3):
            rp = driver.params(r)
            idx = np.flatnonzero(rounds == r)
            sub, a, y = client.randomize_batch(unit[idx], rp, [seeds[i] for i in idx])
            driver.absorb(r, rp, protocol.Histogram.from_reports(sub, a, y))
        centers_unit, _, info = driver.result(randomness.public_rng("ldp-solver"))
        acc.finish()
        return est.domain.from_unit(centers_unit), acc.spent_epsilon, acc.spent_delta, {"kept": info.get("kept")}
    raise ValueError(name)


# ---------------------------------------------------------------------------
# Workers

_DATA: dict = {}


def _init_worker(specs):
    logging.disable(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name, max_rows in specs:
        _DATA[name] = load_dataset(name, max_rows)


def run_task(task) -> dict:
    name, method, eps, rep, seeded = task
    ds = _DATA[name]
    seed = (zlib.crc32(f"{name}|{method}|{eps}|{rep}".encode()) & 0x7FFFFFFF) if seeded else None
    t0 = time.perf_counter()
    row = {"dataset": name, "method": method, "epsilon": eps, "rep": rep}
    try:
        est = make_estimator(method, ds, eps, seed)
        centers, eps_spent, delta_spent, info = fit_numpy(est, ds["x"])
        cu = bc.scale_unit(centers, ds["lo"], ds["hi"])
        cost = bc.kmeans_cost(ds["unit"], cu)
        row.update(cost=cost, epsilon_spent=eps_spent, delta_spent=delta_spent, error="", info=json.dumps(info))
    except Exception as exc:  # recorded, not fatal: the table shows failures
        row.update(cost=float("nan"), epsilon_spent=float("nan"), delta_spent=float("nan"), error=repr(exc)[:300], info="")
    row["seconds"] = time.perf_counter() - t0
    return row


def run_spark_tasks(tasks, specs) -> list[dict]:
    """--engine spark: the same runs through ``estimator.fit(spark_df)`` in one local session."""
    import pandas as pd

    from dpspark.session import build_session

    _init_worker(specs)
    spark = build_session(master="local[2]", testing=True, conf={"spark.sql.shuffle.partitions": "4"})
    frames = {}
    for name, ds in _DATA.items():
        cols = [f"f{j}" for j in range(ds["x"].shape[1])]
        frames[name] = spark.createDataFrame(pd.DataFrame(ds["x"], columns=cols)).repartition(2).cache()
        frames[name].count()
    rows = []
    for name, method, eps, rep, seeded in tasks:
        ds = _DATA[name]
        seed = (zlib.crc32(f"{name}|{method}|{eps}|{rep}".encode()) & 0x7FFFFFFF) if seeded else None
        t0 = time.perf_counter()
        row = {"dataset": name, "method": method, "epsilon": eps, "rep": rep}
        try:
            model = make_estimator(method, ds, eps, seed).fit(frames[name])
            cost = bc.kmeans_cost(ds["unit"], bc.scale_unit(model.centers, ds["lo"], ds["hi"]))
            row.update(cost=cost, epsilon_spent=model.epsilon_spent, delta_spent=model.delta_spent, error="",
                       info=json.dumps({"spark_passes": model.info.get("spark_passes")}))
        except Exception as exc:
            row.update(cost=float("nan"), epsilon_spent=float("nan"), delta_spent=float("nan"), error=repr(exc)[:300], info="")
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    spark.stop()
    return rows


# ---------------------------------------------------------------------------
# The peer (diffprivlib) in its own venv

PEER_RUNNER = r'''
import json, sys, time, inspect
import numpy as np
spec = json.load(open(sys.argv[1]))
import diffprivlib, sklearn
from diffprivlib.models import KMeans
from diffprivlib.models import k_means as km_mod
x = np.load(spec["x"])
n, d = x.shape
lo, hi = np.array(spec["lo"]), np.array(spec["hi"])
out = {"versions": {"diffprivlib": diffprivlib.__version__, "sklearn": sklearn.__version__}, "runs": [], "budget": {}}
for eps in sorted({t[0] for t in spec["tasks"]}):
    m = KMeans(n_clusters=spec["k"], epsilon=eps, bounds=(lo, hi))
    iters = int(m._calc_iters(d, n))
    first, second = m._split_epsilon(d, iters)
    out["budget"][repr(eps)] = {"iters": iters, "split_first": float(first), "split_second": float(second)}
src = inspect.getsource(km_mod.KMeans._update_centers)
out["source_unpack"] = [l.strip() for l in src.splitlines() if "_split_epsilon" in l or "sensitivity=" in l]
out["source_split_return"] = [l.strip() for l in inspect.getsource(km_mod.KMeans._split_epsilon).splitlines() if "return" in l or "epsilon_0 =" in l or "epsilon_i =" in l]
for eps, rep, seed in spec["tasks"]:
    t0 = time.perf_counter()
    try:
        m = KMeans(n_clusters=spec["k"], epsilon=eps, bounds=(lo, hi), random_state=seed).fit(x)
        out["runs"].append({"epsilon": eps, "rep": rep, "centers": m.cluster_centers_.tolist(), "iters": int(m.n_iter_),
                            "seconds": time.perf_counter() - t0, "error": ""})
    except Exception as exc:
        out["runs"].append({"epsilon": eps, "rep": rep, "centers": None, "seconds": time.perf_counter() - t0, "error": repr(exc)[:300]})
json.dump(out, open(spec["out"], "w"))
'''


def ensure_peer_venv(status: dict) -> Path | None:
    """Create .cache/peer-venv with diffprivlib (and a scikit-learn it can import). None if that fails."""
    py = PEER_VENV / "bin" / "python"
    check = [str(py), "-c", "import diffprivlib.models, sklearn; print(diffprivlib.__version__, sklearn.__version__)"]

    def ok():
        r = subprocess.run(check, capture_output=True, text=True)
        if r.returncode == 0:
            status["versions"] = r.stdout.strip()
            return True
        status.setdefault("import_errors", []).append(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "?")
        return False

    try:
        if not py.exists():
            subprocess.run(["python3", "-m", "venv", str(PEER_VENV)], check=True, capture_output=True, text=True)
        if py.exists() and ok():
            return py
        subprocess.run([str(py), "-m", "pip", "install", "-q", "diffprivlib"], check=True, capture_output=True, text=True)
        if ok():
            return py
        # diffprivlib 0.6.x imports sklearn.tree._tree.DOUBLE, gone in recent scikit-learn: pin an older one.
        subprocess.run([str(py), "-m", "pip", "install", "-q", "scikit-learn<1.6"], check=True, capture_output=True, text=True)
        status["pinned"] = "scikit-learn<1.6"
        if ok():
            return py
    except (subprocess.CalledProcessError, OSError) as exc:
        status["install_error"] = (getattr(exc, "stderr", "") or repr(exc))[-500:]
    return None


def run_peer(py: Path, ds: dict, epsilons, reps: int, seeded: bool, workdir: Path) -> tuple[list[dict], dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    xp = workdir / f"{ds['name']}.npy"
    np.save(xp, ds["x"])
    runner = workdir / "peer_runner.py"
    runner.write_text(PEER_RUNNER)
    tasks = [[e, r, (zlib.crc32(f"{ds['name']}|peer|{e}|{r}".encode()) & 0x7FFFFFFF) if seeded else None]
             for e in epsilons for r in range(reps)]
    spec = {"x": str(xp), "lo": ds["lo"].tolist(), "hi": ds["hi"].tolist(), "k": ds["k"], "tasks": tasks,
            "out": str(workdir / f"{ds['name']}.peer.json")}
    sp = workdir / f"{ds['name']}.spec.json"
    sp.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run([str(py), str(runner), str(sp)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"peer runner failed: {r.stderr[-800:]}")
    out = json.loads(Path(spec["out"]).read_text())
    rows = []
    for run in out["runs"]:
        row = {"dataset": ds["name"], "method": PEER, "epsilon": run["epsilon"], "rep": run["rep"], "seconds": run["seconds"],
               "error": run["error"], "info": json.dumps({"iters": run.get("iters")})}
        if run["centers"] is not None:
            c = bc.scale_unit(np.array(run["centers"]), ds["lo"], ds["hi"])
            row["cost"] = bc.kmeans_cost(ds["unit"], c)
            budget = out["budget"][repr(run["epsilon"])]
            row["epsilon_spent"] = peer_actual_epsilon(ds["x"].shape[1], budget, ds)["calibrated"]
        else:
            row["cost"] = float("nan")
            row["epsilon_spent"] = float("nan")
        row["delta_spent"] = 0.0
        rows.append(row)
    return rows, out


def peer_actual_epsilon(d: int, budget: dict, ds: dict) -> dict:
    """The epsilon diffprivlib KMeans really spends on its code path (0.6.x, models/k_means.py).

    ``_split_epsilon`` returns ``(1 * c, cbrt(4 d rho^2) * c)`` with c = eps / T / (d + cbrt(4 d rho^2)),
    i.e. Su et al.'s split (count share cbrt(4 d rho^2), each dimension share 1); ``_update_centers``
    unpacks it as ``epsilon_0, epsilon_i`` and gives epsilon_0 (the FIRST value) to the count and
    epsilon_i (the SECOND) to each of the d coordinate sums: the shares are swapped. Per iteration the
    count (sensitivity 1, GeometricFolded) spends ``first`` and the d sums (LaplaceBoundedDomain with
    sensitivity = bound range) spend d * ``second``; T iterations compose sequentially; clusters are
    disjoint (parallel composition).
    """
    T, first, second = budget["iters"], budget["split_first"], budget["split_second"]
    calibrated = T * (first + d * second)  # the mechanisms' own calibration (sensitivity = range per coordinate)
    nominal = T * (d * first + second)  # what Su et al.'s split (= the nominal epsilon) would be
    # Add/remove-one neighbours: a coordinate sum changes by at most max(|lo|, |hi|) (here the data is given in
    # original units; the range hi - lo is the calibration), so the sums spend less.
    span = np.asarray(ds["hi"]) - np.asarray(ds["lo"])
    absmax = np.maximum(np.abs(ds["hi"]), np.abs(ds["lo"]))
    add_remove = T * (first + float(np.sum(second * np.minimum(absmax / span, 1.0))))
    # Replace-one neighbours: two clusters' counts change (2 * first); the sums change by |x_i| + |x'_i| <= 2 max|.|.
    replace = T * (2 * first + float(np.sum(second * np.minimum(2 * absmax / span, 2.0))))
    return {"T": T, "calibrated": calibrated, "nominal_su": nominal, "add_remove": add_remove, "replace_one": replace}


# ---------------------------------------------------------------------------
# Aggregation and outputs


def summarize(runs: list[dict], datasets: list[dict], baselines: dict) -> list[dict]:
    out = []
    for ds in datasets:
        name = ds["name"]
        n, d, k = ds["x"].shape[0], ds["x"].shape[1], ds["k"]
        base = baselines[name]
        out.append({"dataset": name, "n": n, "d": d, "k": k, "method": NONPRIVATE, "epsilon": "inf", "runs": 1,
                    "cost_ratio_median": 1.0, "cost_ratio_q25": 1.0, "cost_ratio_q75": 1.0,
                    "nicv_median": base / n, "nicv_q25": base / n, "nicv_q75": base / n,
                    "epsilon_spent": "", "delta_spent": "", "failures": 0})
        methods = sorted({r["method"] for r in runs if r["dataset"] == name}, key=method_order)
        for method in methods:
            for eps in sorted({r["epsilon"] for r in runs if r["dataset"] == name and r["method"] == method}):
                rs = [r for r in runs if r["dataset"] == name and r["method"] == method and r["epsilon"] == eps]
                costs = np.array([r["cost"] for r in rs], dtype=float)
                cr = bc.median_iqr(costs / base)
                nv = bc.median_iqr(costs / n)
                spent = [r["epsilon_spent"] for r in rs if np.isfinite(r.get("epsilon_spent", np.nan))]
                dspent = [r["delta_spent"] for r in rs if np.isfinite(r.get("delta_spent", np.nan))]
                out.append({"dataset": name, "n": n, "d": d, "k": k, "method": method, "epsilon": eps, "runs": len(rs),
                            "cost_ratio_median": cr[0], "cost_ratio_q25": cr[1], "cost_ratio_q75": cr[2],
                            "nicv_median": nv[0], "nicv_q25": nv[1], "nicv_q75": nv[2],
                            "epsilon_spent": max(spent) if spent else "", "delta_spent": max(dspent) if dspent else "",
                            "failures": int(np.sum(~np.isfinite(costs)))})
    return out


def method_order(m: str) -> int:
    order = [NONPRIVATE] + DP_METHODS + [PEER]
    return order.index(m) if m in order else len(order)


def g(v, digits=3) -> str:
    try:
        return f"{float(v):.{digits}g}"
    except (TypeError, ValueError):
        return str(v)


def cell(r, metric) -> str:
    return f"{g(r[metric + '_median'])} [{g(r[metric + '_q25'])}, {g(r[metric + '_q75'])}]"


def write_plots(summary, datasets, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for ds in datasets:
        rows = [r for r in summary if r["dataset"] == ds["name"] and r["method"] != NONPRIVATE]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for method in sorted({r["method"] for r in rows}, key=method_order):
            rs = sorted((r for r in rows if r["method"] == method), key=lambda r: r["epsilon"])
            e = [r["epsilon"] for r in rs]
            med = np.array([r["cost_ratio_median"] for r in rs], dtype=float)
            lo = np.array([r["cost_ratio_q25"] for r in rs], dtype=float)
            hi = np.array([r["cost_ratio_q75"] for r in rs], dtype=float)
            style = "--" if method == PEER else ("-." if method == "ldp" else "-")
            line, = ax.plot(e, med, style, marker="o", ms=4, label=method)
            ax.fill_between(e, lo, hi, color=line.get_color(), alpha=0.12)
        ax.axhline(1.0, color="black", lw=0.8, ls=":", label="non-private (best of 10)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("cost ratio (median, IQR band)")
        ax.set_title(f"{ds['name']} (n={ds['x'].shape[0]}, d={ds['x'].shape[1]}, k={ds['k']}); public bounds = per-column min/max",
                     fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        f = out_dir / f"cost_ratio_{ds['name']}.png"
        fig.savefig(f, dpi=110)
        plt.close(fig)
        files.append(f.name)
    return files


def peer_section(peer_meta: dict, datasets: list[dict], epsilons) -> tuple[str, list[dict]]:
    if not peer_meta.get("outputs"):
        return "## Peer privacy spend\n\nPeer not run: " + json.dumps(peer_meta.get("status", {})) + "\n", []
    lines = ["## Peer privacy spend: diffprivlib KMeans (computed from its code path)", ""]
    first = next(iter(peer_meta["outputs"].values()))
    lines.append(f"Versions in `.cache/peer-venv`: {json.dumps(first['versions'])}. Source lines read at run time "
                 f"(`diffprivlib/models/k_means.py`):")
    lines.append("")
    lines.append("```")
    lines.extend(first["source_split_return"] + first["source_unpack"])
    lines.append("```")
    lines.append("")
    lines.append(
        "`_split_epsilon` computes Su et al.'s split per iteration: each coordinate sum gets share 1 and the count "
        "share c = cbrt(4 d rho^2) (rho = 0.225), normalised by (d + c) so that d * 1 + c adds up to eps / T. It "
        "returns `(1 * norm, c * norm)`, but `_update_centers` unpacks it as `epsilon_0, epsilon_i` and gives "
        "epsilon_0 = 1 * norm to the COUNT (GeometricFolded, sensitivity 1) and epsilon_i = c * norm to EACH of the "
        "d coordinate SUMS (LaplaceBoundedDomain, sensitivity = bound range): the shares are swapped. With T = "
        "`_calc_iters(d, n)` update steps composed sequentially (clusters are disjoint: parallel composition), the "
        "epsilon really spent is T * norm * (1 + d c) = eps * (1 + d c) / (d + c), not eps. It equals eps only when "
        "d c + 1 = d + c, i.e. d = 1; it is below eps for small d (c < 1, d < 4.9) and ABOVE eps for d >= 5. "
        "`accountant.spend(self.epsilon, 0)` records the nominal eps.")
    lines.append("")
    lines.append("Columns: actual/nominal under the library's own calibration (sensitivity = bound range per "
                 "coordinate); the same with add/remove-one neighbours (a sum changes by at most max(|lo|, |hi|) per "
                 "coordinate, so the range calibration over-protects the sums); with replace-one neighbours (two "
                 "clusters' counts change: the count part doubles).")
    lines.append("")
    rows = []
    e1 = min(epsilons, key=lambda e: abs(math.log(e)))
    header = ["dataset", "d", "n", "c = cbrt(4 d rho^2)", f"T (iters) at eps={e1:g}", f"actual eps at eps={e1:g} (calibrated)",
              "actual / nominal", "add/remove", "replace-one", "diffprivlib's accountant records"]
    table = []
    for ds in datasets:
        out = peer_meta["outputs"].get(ds["name"])
        if not out:
            continue
        d = ds["x"].shape[1]
        c = float(np.cbrt(4 * d * 0.225 ** 2))
        for eps in epsilons:
            b = out["budget"].get(repr(float(eps)))
            if b is None:
                continue
            a = peer_actual_epsilon(d, b, ds)
            rows.append({"dataset": ds["name"], "d": d, "n": ds["x"].shape[0], "nominal_epsilon": eps, "iters": a["T"],
                         "count_eps_per_iter": b["split_first"], "sum_eps_per_coord_per_iter": b["split_second"],
                         "actual_epsilon_calibrated": a["calibrated"], "su_split_total": a["nominal_su"],
                         "actual_epsilon_add_remove": a["add_remove"], "actual_epsilon_replace_one": a["replace_one"],
                         "ratio_actual_to_nominal": a["calibrated"] / eps})
            if eps == e1:
                table.append([ds["name"], d, ds["x"].shape[0], f"{c:.3f}", a["T"], f"{a['calibrated']:.4g}",
                              f"{a['calibrated'] / eps:.3f}", f"{a['add_remove']:.4g}", f"{a['replace_one']:.4g}", f"{eps:g}"])
    lines.append(bc.markdown_table(header, table, ["l", "r", "r", "r", "r", "r", "r", "r", "r", "r"]))
    lines.append("")
    lines.append("The ratio actual/nominal does not depend on eps or T (every eps in `peer_privacy.csv`). "
                 "Formula check for other d: d=2: 0.905, d=10: 1.212, d=24: 1.623.")
    return "\n".join(lines) + "\n", rows


def write_outputs(args, runs, datasets, baselines, peer_meta, out_dir: Path, elapsed: float):
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "runs.csv", "w", newline="") as fh:
        cols = ["dataset", "method", "epsilon", "rep", "cost", "epsilon_spent", "delta_spent", "seconds", "error", "info"]
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(runs)
    summary = summarize(runs, datasets, baselines)
    with open(out_dir / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in summary:
            w.writerow({c: r[c] for c in CSV_COLUMNS})
    plots = write_plots(summary, datasets, out_dir)
    peer_md, peer_rows = peer_section(peer_meta, datasets, args.epsilons)
    if peer_rows:
        with open(out_dir / "peer_privacy.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(peer_rows[0]))
            w.writeheader()
            w.writerows(peer_rows)
    m = bc.machine_description()
    md = ["# Utility benchmark: dpspark families vs non-private k-means and diffprivlib", ""]
    md.append(f"Command: `{args.command}`. {len(runs)} DP runs in {elapsed:.0f} s. Machine: {m['nproc']} CPUs "
              f"({m['cpu']}), {m['memory_gb']} GB, Python {m['python']}; load average at the end "
              f"{os.getloadavg()[0]:.1f} (shared machine).")
    md.append("")
    md.append(bc.PUBLIC_BOUNDS_NOTE + " All costs are measured on the data scaled to [-1, 1]^d with these bounds.")
    md.append("")
    md.append("Cost ratio = k-means cost of the released centers / cost of non-private scikit-learn KMeans "
              "(k-means++, Lloyd, best of n_init=10) on the same data (1 = as good; lower is better). NICV = cost / N "
              "on [-1, 1]^d. Cells: median [25th, 75th percentile] over the repetitions.")
    md.append("")
    md.append(f"Engine: `{args.engine}`. " + (
        "dpspark methods run their real driver code (estimator validation, budget split, accountant, mechanisms, "
        "coverage / Lloyd / LDP rounds, solvers) with the package's numpy reference aggregation instead of the "
        "Spark passes (identical exact aggregates); the Spark fits are timed in `bench/results/scale/`."
        if args.engine == "numpy" else "every dpspark run is `estimator.fit(spark_df)` on a local[2] session."))
    md.append(f"Noise: {'SEEDED (reproducible, NOT private)' if args.seeded else 'secure (OpenDP) for dpspark; random_state=None for diffprivlib'}. "
              f"maxcover: delta = {DELTA:g}; every other method: pure epsilon-DP. `ldp` is LOCAL DP (each user's own "
              "report is epsilon-DP): a much stronger guarantee than the central model of the others.")
    md.append("")
    md.append("Datasets (n after subsampling; public bounds from the subsample): " + "; ".join(
        f"{ds['name']} n={ds['x'].shape[0]}" + (f" (of {ds['n_full']})" if ds['x'].shape[0] < ds['n_full'] else "")
        + f" d={ds['x'].shape[1]} k={ds['k']}" for ds in datasets) + f". Repetitions: {args.reps}. Epsilons: {args.epsilons}.")
    if args.cuts:
        md.append("")
        md.append("Cut to fit the time budget: " + args.cuts)
    md.append("")
    e_sum = min(args.epsilons, key=lambda e: abs(math.log(e)))
    md.append(f"## Summary at epsilon = {e_sum:g}: median cost ratio [IQR] (median NICV)")
    md.append("")
    methods = sorted({r["method"] for r in summary}, key=method_order)
    header = ["method"] + [ds["name"] for ds in datasets]
    trows = []
    for method in methods:
        row = [method]
        for ds in datasets:
            r = next((r for r in summary if r["dataset"] == ds["name"] and r["method"] == method
                      and (r["epsilon"] == e_sum or (method == NONPRIVATE))), None)
            row.append("-" if r is None else f"{cell(r, 'cost_ratio')} ({g(r['nicv_median'])})")
        trows.append(row)
    md.append(bc.markdown_table(header, trows, ["l"] + ["r"] * len(datasets)))
    md.append("")
    for ds in datasets:
        md.append(f"## {ds['name']} (n={ds['x'].shape[0]}, d={ds['x'].shape[1]}, k={ds['k']})")
        md.append("")
        if f"cost_ratio_{ds['name']}.png" in plots:
            md.append(f"![cost ratio vs epsilon](cost_ratio_{ds['name']}.png)")
            md.append("")
        eps_list = sorted({r["epsilon"] for r in summary if r["dataset"] == ds["name"] and r["method"] != NONPRIVATE})
        header = ["method", "metric"] + [f"eps={e:g}" for e in eps_list]
        trows = []
        for method in methods:
            if method == NONPRIVATE:
                continue
            for metric in ("cost_ratio", "nicv"):
                row = [method, metric]
                for e in eps_list:
                    r = next((r for r in summary if r["dataset"] == ds["name"] and r["method"] == method and r["epsilon"] == e), None)
                    row.append("-" if r is None else cell(r, metric) + (f" ({r['failures']} failed)" if r["failures"] else ""))
                trows.append(row)
        md.append(bc.markdown_table(header, trows, ["l", "l"] + ["r"] * len(eps_list)))
        base = next(r for r in summary if r["dataset"] == ds["name"] and r["method"] == NONPRIVATE)
        md.append("")
        md.append(f"Non-private NICV: {g(base['nicv_median'], 4)}.")
        md.append("")
    md.append(peer_md)
    errors = [r for r in runs if r.get("error")]
    if errors:
        md.append("## Failed runs")
        md.append("")
        seen = {}
        for r in errors:
            seen.setdefault((r["method"], r["error"]), []).append(f"{r['dataset']}@{r['epsilon']:g}")
        for (method, err), where in seen.items():
            md.append(f"- {method}: `{err}` ({len(where)}x: {', '.join(sorted(set(where))[:6])})")
        md.append("")
    (out_dir / "results.md").write_text("\n".join(md) + "\n")
    (out_dir / "meta.json").write_text(json.dumps({"command": args.command, "elapsed_s": elapsed, "machine": m,
                                                   "peer": peer_meta.get("status"), "engine": args.engine,
                                                   "reps": args.reps, "epsilons": args.epsilons}, indent=1, default=str))
    return summary


# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 small dataset, 2 epsilons, 2 reps")
    ap.add_argument("--no-peer", action="store_true", help="skip diffprivlib")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--datasets", nargs="*", default=None)
    ap.add_argument("--epsilons", nargs="*", type=float, default=None)
    ap.add_argument("--max-rows", type=int, default=None, help="uniform subsample cap per dataset (full run: 10000)")
    ap.add_argument("--methods", nargs="*", default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--grid-max-dim", type=int, default=10, help="skip maxcover_grid above this dimension")
    ap.add_argument("--engine", choices=["numpy", "spark"], default="numpy")
    ap.add_argument("--seeded", action="store_true", help="reproducible, NOT private noise (testing aid)")
    args = ap.parse_args(argv)
    args.command = "python scripts/bench_utility.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.quick:
        args.datasets = args.datasets or QUICK_DATASETS
        args.epsilons = args.epsilons or [0.5, 2.0]
        args.reps = args.reps or 2
        args.methods = args.methods or DP_METHODS
        args.max_rows = args.max_rows or 2000
    args.datasets = args.datasets or FULL_DATASETS
    args.epsilons = args.epsilons or EPSILONS
    args.reps = args.reps or 10
    args.methods = args.methods or DP_METHODS
    args.max_rows = args.max_rows or 10000
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    t0 = time.perf_counter()
    specs = [(n, args.max_rows) for n in args.datasets]
    datasets = [load_dataset(n, m) for n, m in specs]
    big = [ds["name"] for ds in datasets if ds["n_full"] > args.max_rows]
    args.cuts = (f"datasets above {args.max_rows} rows are uniformly subsampled to {args.max_rows} rows (fixed seed) "
                 f"before everything (bounds, baseline, DP runs): {', '.join(big) or 'none'}; the 24-dimensional "
                 f"google_review_ratings and credit_card_clients, and unbalance / a3 / birch2 / skin_segmentation, are "
                 f"not run (time); {args.reps} repetitions per cell." if not args.quick else "quick mode.")
    baselines = {ds["name"]: bc.nonprivate_baseline(ds["unit"], ds["k"])[1] for ds in datasets}
    # maxcover with the public GRID in d > 10: 1000 grid points in 13-D give 120 s per run here (huge
    # signature histograms); skipped in the benchmark (documented in the report).
    skip = {(ds["name"], "maxcover_grid") for ds in datasets if ds["x"].shape[1] > args.grid_max_dim}
    tasks = [(ds["name"], method, eps, rep, args.seeded) for ds in datasets for eps in args.epsilons
             for rep in range(args.reps) for method in args.methods if (ds["name"], method) not in skip]
    if skip:
        args.cuts += (f" maxcover_grid is not run for d > {args.grid_max_dim} ({', '.join(sorted(n for n, _ in skip))}): "
                      "about 120 s per run at d = 13 on this machine.")
    # Expensive tasks first so the pool's tail is short.
    tasks.sort(key=lambda t: (0 if t[1].startswith("maxcover") else 1, -t[2]))
    print(f"bench_utility: {len(tasks)} dpspark runs on {len(datasets)} datasets, engine {args.engine}", flush=True)
    runs: list[dict] = []
    if args.engine == "spark":
        runs = run_spark_tasks(tasks, specs)
    else:
        # spawn, not fork: the parent ran scikit-learn (OpenMP threads); a forked child can deadlock on them.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.workers, initializer=_init_worker, initargs=(specs,), mp_context=ctx) as pool:
            for i, row in enumerate(pool.map(run_task, tasks, chunksize=1), 1):
                runs.append(row)
                if i % max(1, len(tasks) // 20) == 0:
                    print(f"  {i}/{len(tasks)} runs, {time.perf_counter() - t0:.0f} s", flush=True)
    peer_meta: dict = {"status": {}}
    if not args.no_peer:
        py = ensure_peer_venv(peer_meta["status"])
        if py is None:
            print("bench_utility: peer venv unavailable: " + json.dumps(peer_meta["status"])[:500], flush=True)
        else:
            peer_meta["outputs"] = {}
            for ds in datasets:
                try:
                    rows, out = run_peer(py, ds, args.epsilons, args.reps, args.seeded, ROOT / ".cache" / "peer-work")
                    runs.extend(rows)
                    peer_meta["outputs"][ds["name"]] = out
                except Exception as exc:
                    peer_meta["status"].setdefault("errors", []).append(f"{ds['name']}: {exc!r}"[:800])
            print(f"  peer done, {time.perf_counter() - t0:.0f} s", flush=True)
    else:
        peer_meta["status"] = {"skipped": "--no-peer"}
    elapsed = time.perf_counter() - t0
    write_outputs(args, runs, datasets, baselines, peer_meta, args.out, elapsed)
    failed = sum(1 for r in runs if r.get("error"))
    print(f"bench_utility: wrote {args.out}/results.md, summary.csv ({len(runs)} runs, {failed} failed) in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
