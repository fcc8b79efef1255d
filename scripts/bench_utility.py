#!/usr/bin/env python
"""Utility benchmark: dpspark (auto and every family) vs non-private k-means and three DP peers (issues 7, 14, 51).

Methods (all k-means objective, so one cost ratio compares them all):

- ``auto``: ``dpspark.auto.AutoClustering(objective="kmeans", delta=1e-6)``, which chooses its own route
  (recorded per run); it runs only with ``--engine spark``; an ImportError etc. is recorded as a failed run;
- ``maxcover`` (its default candidates for d: ``grid_or_private`` in 2-3 dimensions, ``tree`` above),
  ``maxcover_grid``, ``maxcover_private``, ``maxcover_tree``: ``MaxCover(objective="kmeans", candidates=...)``,
  delta = 1e-6;
- ``dplloyd_<variant>`` for the four variants (allocation_nk, average_nk, average_k, allocation_k), pure eps-DP;
  these eight are the "explicit" methods of the targets table;
- ``ldp``: ``LocalDP(objective="kmeans")`` (a LOCAL guarantee: much stronger, expect worse utility);
- ``nonprivate``: scikit-learn ``KMeans`` (k-means++ init, Lloyd, best of n_init=10), the denominator
  of the cost ratio (so its ratio is 1 by definition; its NICV is the floor);
- peers, each in its own venv created by this script, run as subprocesses on .npy files, never imported:
  ``diffprivlib``: IBM diffprivlib ``KMeans(epsilon, bounds)`` (``.cache/peer-venv``, ``pip install
  diffprivlib``, older scikit-learn if needed); ``google_lsh``: Google's LSH-tree private coreset clustering
  from ``../shared/peers/google-dp-clustering/learning`` (``.cache/google-peer-venv`` with absl-py,
  dp-accounting, scikit-learn, scipy, numpy), ``private_lsh_clustering(k, Data(X, radius=sqrt(d)),
  DifferentialPrivacyParam(epsilon, delta=1e-6))`` on the data in [-1, 1]^d; ``pe_means``: PE-means (arXiv
  2606.00342, github.com/t3humphries/PE-means, from ``$PEMEANS_SRC`` or ``.cache/pe-means-src``, cloned if missing;
  ``.cache/pemeans-peer-venv`` with faiss-cpu==1.13.2 as it pins, and Google's ``clustering`` package above for
  its Data/ClusteringResult classes), ``pe_means`` with its defaults (experiments/run_ours.py) on the same data,
  radius sqrt(d), delta = 1e-6, with n KEPT PRIVATE: 1% of epsilon on a Laplace count whose rounded value (>= 1)
  replaces the true n (truncation threshold, population size L), 99% to PE-means; never its HDPE variant. A
  peer whose venv or code is missing is skipped with the reason in results.md; ``--no-peer`` skips all three,
  ``--peers`` selects some.

Defaults: every shared dataset (s1, a3, birch2, unbalance, skin_segmentation, blood_transfusion, tripadvisor_review,
electrical_grid_stability, adult, google_review_ratings, credit_card_clients), WHOLE (``--max-rows`` caps them),
``--engine spark``, epsilons 0.5, 1, 2, 5 runs per cell (median). That takes hours: split it with ``--datasets X
--append``, which adds this invocation's (dataset, method, epsilon) cells to the table already in ``--out``
(``runs.csv`` + ``datasets.json`` + ``peers.json`` + ``meta.json``) and regenerates every output from the whole
table. Outputs are also rewritten after each dataset, so an interrupted run keeps what it finished.
``--datasets`` also takes generated Gaussian mixtures for sweeps across n in 2-3 dimensions
(``bench_common.MIXTURES``: ``mix2d_n5000`` .. ``mix3d_n1000000``, 10 clusters, seeded; not in the default set).

Engines. ``spark``: every dpspark run is ``estimator.fit(spark_df)`` in one local[2] session, one cached frame per
dataset. ``numpy`` (``--quick`` default, and ``scripts/bench_ldp.py`` / ``tune_maxcover_candidates.py`` through
``fit_numpy``): the estimators' REAL driver code (parameter validation, budget split, accountant, mechanisms,
coverage loop / Lloyd iterations / LDP clients and server, solvers) on the data held in numpy, with the package's
numpy reference aggregations instead of the Spark passes (``dplloyd.core.numpy_aggregate``,
``maxcover.core.NumpySignatureProvider`` / ``core.snap_counts`` / ``passes.cell_aggregator`` on one pandas batch,
``ldp.client.randomize_batch``): the same exact aggregates as the Spark passes (the package's tests check that).

Public bounds: per-column min/max of each dataset, treated as public domain knowledge, the benchmark convention of
the DP k-means literature (bench_common.PUBLIC_BOUNDS_NOTE). The estimators receive them as their public
``Domain``; the data and all costs are in [-1, 1]^d.

Metrics: cost ratio = k-means cost of the released centers / cost of the non-private baseline; NICV = cost / N
(both on the data scaled to [-1, 1]^d). Cells: median [25th, 75th percentile].

Targets (issue 14; ``results.md`` "Targets", printed at the end, ``readme_table.md`` for the README): per dataset
auto's median at eps 1, the best explicit method and its median, both peers' medians; pass/fail of (a) auto's
excess (ratio - 1) <= half the better peer's at eps 1, (b) auto <= 1.10 x the best explicit at eps 1, (c) auto <=
the better peer at eps 0.5 and 2. diffprivlib is compared at its NOMINAL epsilon; results.md computes what it
really spends.

Noise: secure (OpenDP) noise for dpspark, unseeded peers, unless ``--seeded`` (reproducible, NOT private).

    .venv/bin/python scripts/bench_utility.py --quick --no-peer --out /tmp/u          # smoke (CI), numpy, ~5 s
    .venv/bin/python scripts/bench_utility.py --datasets blood_transfusion --reps 2 --epsilons 1 --out /tmp/u
    .venv/bin/python scripts/bench_utility.py --datasets s1 --append                 # one dataset into the table
    .venv/bin/python scripts/bench_utility.py                                         # full run (hours)
"""

from __future__ import annotations

import argparse
import contextlib
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

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402

ROOT = bc.ROOT
DEFAULT_OUT = ROOT / "bench" / "results" / "utility"
PEER_VENV = ROOT / ".cache" / "peer-venv"
EPSILONS = [0.5, 1.0, 2.0]
DELTA = 1e-6
DPLLOYD_VARIANTS = ["allocation_nk", "average_nk", "average_k", "allocation_k"]
# The explicit dpspark methods (the "best explicit" of the targets table is the lowest median among these).
MAXCOVER = "maxcover"  # the family with its default candidates for d
LLOYD_SHARE_ENV = "DPSPARK_BENCH_MAXCOVER_LLOYD_SHARE"
EXPLICIT_METHODS = [MAXCOVER, "maxcover_grid", "maxcover_private", "maxcover_tree"] + [f"dplloyd_{v}" for v in DPLLOYD_VARIANTS]
AUTO = "auto"
# auto without its evolution route (issue 51): where auto takes it, this runs the tree route auto took before, so
# the two can be measured side by side in one session; elsewhere it is auto.
AUTO_TREE = "auto_tree"
DP_METHODS = EXPLICIT_METHODS + ["ldp", AUTO, AUTO_TREE]
QUICK_METHODS = EXPLICIT_METHODS + ["ldp"]
# Targets (issue 14): at TARGET_EPS auto's excess (ratio - 1) <= TARGET_EXCESS_FRACTION x the better peer's excess,
# and auto <= TARGET_EXPLICIT_FACTOR x the best explicit method; at TARGET_SIDE_EPS auto <= the better peer.
TARGET_EPS = 1.0
TARGET_SIDE_EPS = [0.5, 2.0]
TARGET_EXCESS_FRACTION = 0.5
TARGET_EXPLICIT_FACTOR = 1.10
PEER = "diffprivlib"
GOOGLE = "google_lsh"
GOOGLE_VENV = ROOT / ".cache" / "google-peer-venv"
GOOGLE_PATH = (ROOT / ".." / "shared" / "peers" / "google-dp-clustering" / "learning").resolve()
GOOGLE_PACKAGES = ["absl-py", "dp-accounting", "scikit-learn", "scipy", "numpy"]
PEMEANS = "pe_means"
PEMEANS_VENV = ROOT / ".cache" / "pemeans-peer-venv"
PEMEANS_URL = "https://github.com/t3humphries/PE-means"
PEMEANS_SRC_ENV = "PEMEANS_SRC"  # a checkout of PEMEANS_URL; else .cache/pe-means-src (cloned if missing)
PEMEANS_CACHE = ROOT / ".cache" / "pe-means-src"
# faiss-cpu as envs/pe_means.yml pins; its `clustering` package (Data, DifferentialPrivacyParam, ClusteringResult)
# is a fork of Google's learning/clustering: Google's code at GOOGLE_PATH (same API) is used, so its deps too.
PEMEANS_PACKAGES = ["faiss-cpu==1.13.2", "numpy", "scipy", "scikit-learn", "absl-py", "dp-accounting"]
PEMEANS_COUNT_SHARE = 0.01  # share of epsilon on the Laplace-noised count that replaces the true n
PEERS = [PEER, GOOGLE, PEMEANS]
NONPRIVATE = "nonprivate"

# Full run: every shared dataset, whole (--max-rows: uniform subsample without replacement, fixed seed).
FULL_DATASETS = bc.SHARED_DATASETS
QUICK_DATASETS = ["blood_transfusion"]

CSV_COLUMNS = ["dataset", "n", "d", "k", "method", "epsilon", "runs", "cost_ratio_median", "cost_ratio_q25",
               "cost_ratio_q75", "nicv_median", "nicv_q25", "nicv_q75", "epsilon_spent", "delta_spent", "failures"]


# ---------------------------------------------------------------------------
# Data


def sweep_name(name: str, k: int | None) -> str:
    """The table's name of a dataset run with another k (``--k``): ``electrical_grid_stability@k16``."""
    return name if k is None else f"{name}@k{k}"


def load_dataset(name: str, max_rows: int | None, seed: int = 0, k: int | None = None) -> dict:
    """The shared dataset ``name`` with its own k, or with ``k`` when given (a sweep: then named
    ``sweep_name(name, k)``, even where k is the dataset's own)."""
    _, x, own_k = bc.LOADERS_BY_NAME[name]()
    sweep_k = None if k is None else int(k)
    k = own_k if sweep_k is None else sweep_k
    n_full = x.shape[0]
    if max_rows and x.shape[0] > max_rows:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        x = x[np.sort(rng.choice(x.shape[0], size=max_rows, replace=False))]
    lo, hi = bc.public_bounds(x)
    return {"name": sweep_name(name, sweep_k), "x": x, "unit": bc.scale_unit(x, lo, hi), "lo": lo,
            "hi": hi, "k": k, "n_full": n_full, "source": name, "sweep_k": sweep_k}


def domain_of(ds):
    return bc.domain(ds["lo"], ds["hi"])


# ---------------------------------------------------------------------------
# The dpspark families on numpy (same driver code, numpy reference aggregation)


def make_estimator(method: str, ds: dict, eps: float, seed: int | None):
    dom, k = domain_of(ds), ds["k"]
    feats = tuple(f"f{j}" for j in range(dom.dim))
    if method in (AUTO, AUTO_TREE):
        from dpspark.auto import AutoClustering  # an ImportError is recorded as the run's failure

        cls = AutoClustering if method == AUTO else _auto_without_evolution()
        return cls(k=k, epsilon=eps, delta=DELTA, domain=dom, features=feats, objective="kmeans", seed=seed)
    from dpspark.dplloyd.estimator import DPLloyd
    from dpspark.ldp.estimator import LocalDP
    from dpspark.maxcover.estimator import MaxCover

    if method == MAXCOVER or method.startswith("maxcover_"):
        share = os.environ.get(LLOYD_SHARE_ENV)  # --maxcover-lloyd-share (set before the workers start)
        return MaxCover(k=k, epsilon=eps, delta=DELTA, domain=dom, features=feats, objective="kmeans",
                        candidates=method.split("_", 1)[1] if "_" in method else None, seed=seed,
                        lloyd_share=None if share is None else float(share))
    if method.startswith("dplloyd_"):
        return DPLloyd(k=k, epsilon=eps, domain=dom, features=feats, variant=method.split("_", 1)[1], seed=seed)
    if method == "ldp":
        return LocalDP(k=k, epsilon=eps, domain=dom, features=feats, objective="kmeans", seed=seed)
    raise ValueError(method)


def _auto_without_evolution():
    """AutoClustering whose choice never takes the evolution route (the tree route instead): AUTO_TREE."""
    from dpspark.auto import AutoClustering

    class AutoWithoutEvolution(AutoClustering):
        def _validated(self):
            route, why = super()._validated()
            if route == "evolution":
                return "tree_lloyd", "benchmark: auto with its evolution route turned off"
            return route, why

    return AutoWithoutEvolution


def _np_cell_aggregates(unit, columns):
    """``passes.cell_aggregates`` without Spark: the same mapInPandas function on one pandas batch."""
    import pandas as pd

    from dpspark.maxcover import passes

    def cell_aggregates(_df, _columns, sides, shifts, min_count=1, counter=None, timings=None):
        dim = len(columns)
        fn = passes.cell_aggregator(sides, shifts, columns, 1 << 16)
        parts = list(fn(iter([pd.DataFrame(unit, columns=columns)])))  # one stream: one row per (level, cell)
        out = passes.cells_by_level(pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(), len(sides), dim, min_count)
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
        from dpspark.tables import unit_columns

        epsilon, delta = est.privacy_plan()
        acc = Accountant(epsilon, delta, randomness.noise)
        side = cand_mod.zoom_side(est.domain.dim)
        exact_coarse = np.bincount(cand_mod.coarse_index(unit, side), minlength=side ** est.domain.dim)
        params, budget, choice = est.resolve_candidates(est._validated_params(), lambda: exact_coarse, acc)
        rng = randomness.public_rng("maxcover.candidates")
        zoom, outside = None, None
        if params.candidates == "grid" and "zoom" in budget:
            cand, zoom, outside = est.zoomed_candidates(exact_coarse, choice["noisy_rows"], params, budget, acc)
            zoom = zoom["zoom"]
        elif params.candidates == "private":
            columns = unit_columns(est.domain.dim)
            saved = cand_mod.passes.cell_aggregates
            cand_mod.passes.cell_aggregates = _np_cell_aggregates(unit, columns)
            try:
                cand, _ = cand_mod.private_candidates(None, columns, est.domain, params.candidate_count,
                                                      params.candidate_scales, est.k, *budget["candidates"], acc, rng)
            finally:
                cand_mod.passes.cell_aggregates = saved
        elif params.candidates == "tree":
            from dpspark.steps import tree

            cand, _ = cand_mod.tree_candidates(tree.numpy_tree_aggregates(unit), est.domain, params.candidate_count,
                                               est.k, budget["candidates"][0], acc, rng)
        else:
            cand = cand_mod.public_candidates(params.candidates, est.domain, params.candidate_count, rng)
        ts = core.thresholds(cand_mod.coverage_diameter(est.domain.unit_diameter, zoom), 2, cand.shape[0],
                             params.coverage_approx, params.n_upper)
        m = core.picks_per_threshold(est.k, params.coverage_approx)
        provider = core.NumpySignatureProvider(unit, cand, ts, 2)
        picks = core.run_coverage(provider, cand.shape[0], ts, m, acc, *budget["coverage"])
        chosen = cand[core.chosen_candidate_ids(picks)]
        noisy = core.noisy_weights(core.snap_counts(unit, chosen, 2), acc, budget["counts"][0])
        from dpspark.dplloyd.core import numpy_aggregate
        from dpspark.maxcover.passes import PassCounter

        centers, _ = est.solve_and_polish(params, budget, chosen, np.maximum(noisy, 0).astype(np.float64), cand, None,
                                          randomness.public_rng("maxcover.solver"), numpy_aggregate(unit), acc,
                                          PassCounter(), {}, outside=None if outside is None else
                                          outside[core.chosen_candidate_ids(picks)])
        acc.finish()
        return centers, acc.spent_epsilon, acc.spent_delta, {"candidates": int(cand.shape[0]), "chosen": int(chosen.shape[0]),
                                                             "mode": params.candidates}
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
    if name in ("AutoClustering", "AutoWithoutEvolution"):
        raise NotImplementedError("auto runs only through estimator.fit(spark_df): use --engine spark")
    raise ValueError(name)


# ---------------------------------------------------------------------------
# Workers

_DATA: dict = {}


def _init_worker(specs):
    logging.disable(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name, max_rows, k in specs:
        ds = load_dataset(name, max_rows, k=k)
        _DATA[ds["name"]] = ds


def task_seed(*parts) -> int:
    """The seed of one run with --seeded (reproducible, NOT private)."""
    return zlib.crc32("|".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def timed_run(task, fit) -> dict:
    """The row of one run of ``task`` (dataset, method, epsilon, rep, seeded): ``fit(seed)`` returns (cost, epsilon
    spent, delta spent, info JSON), timed; an exception is the run's error."""
    name, method, eps, rep, seeded = task
    seed = task_seed(name, method, eps, rep) if seeded else None
    t0 = time.perf_counter()
    row = {"dataset": name, "method": method, "epsilon": eps, "rep": rep}
    try:
        cost, eps_spent, delta_spent, info = fit(seed)
        row.update(cost=cost, epsilon_spent=eps_spent, delta_spent=delta_spent, error="", info=info)
    except Exception as exc:  # recorded, not fatal: the table shows failures
        row.update(cost=float("nan"), epsilon_spent=float("nan"), delta_spent=float("nan"), error=repr(exc)[:300], info="")
    row["seconds"] = time.perf_counter() - t0
    return row


def run_task(task) -> dict:
    """--engine numpy: one run in a worker process."""
    ds = _DATA[task[0]]

    def fit(seed):
        centers, eps_spent, delta_spent, info = fit_numpy(make_estimator(task[1], ds, task[2], seed), ds["x"])
        return bc.kmeans_cost(ds["unit"], bc.scale_unit(centers, ds["lo"], ds["hi"])), eps_spent, delta_spent, json.dumps(info)

    return timed_run(task, fit)


class SparkEngine:
    """--engine spark: every run is ``estimator.fit(spark_df)`` in one local[2] session (started on first use)."""

    def __init__(self):
        self.spark = None
        self._session = contextlib.ExitStack()

    def run(self, ds: dict, tasks) -> list[dict]:
        if self.spark is None:
            logging.disable(logging.WARNING)
            self.spark = self._session.enter_context(bh.session("dpspark-bench-utility"))
        frame = bh.cached_frame(self.spark, ds["x"], [f"f{j}" for j in range(ds["x"].shape[1])], 2)
        try:
            return [timed_run(task, lambda seed, task=task: self._fit(ds, frame, task[1], task[2], seed)) for task in tasks]
        finally:
            frame.unpersist()

    @staticmethod
    def _fit(ds: dict, frame, method: str, eps: float, seed):
        operational: dict = {}
        model = make_estimator(method, ds, eps, seed).fit(frame, operational=operational)
        cost = bc.kmeans_cost(ds["unit"], bc.scale_unit(model.centers, ds["lo"], ds["hi"]))
        info = {"spark_passes": operational.get("spark_passes")}
        if method in (AUTO, AUTO_TREE):  # the route auto chose (its model's parameters / info)
            params = model.parameters if isinstance(model.parameters, dict) else {}
            info["chosen"] = params.get("chosen") or ((model.info or {}).get("auto") or {}).get("route")
        if isinstance(model.info, dict) and model.info.get("candidate_choice"):  # grid_or_private's choice
            info["candidates"] = model.info["candidate_choice"].get("chosen")
        return cost, model.epsilon_spent, model.delta_spent, json.dumps(info, default=str)

    def stop(self):
        self._session.close()
        self.spark = None


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
    # diffprivlib 0.6.x imports sklearn.tree._tree.DOUBLE, gone in recent scikit-learn: then pin an older one.
    return _venv_with(PEER_VENV, [(["diffprivlib"], None), (["scikit-learn<1.6"], "scikit-learn<1.6")],
                      "import diffprivlib.models, sklearn; print(diffprivlib.__version__, sklearn.__version__)", status,
                      versions=True)


def _venv_with(venv: Path, installs, check: str, status: dict, env: dict | None = None,
               versions: bool = False) -> Path | None:
    """The python of ``venv`` (created if missing) once it runs ``check`` (its output is ``status["versions"]``
    if ``versions``), trying each (packages, pin note) install in turn; None, with the error in ``status``, if none
    makes it pass."""
    py = venv / "bin" / "python"

    def ok():
        r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, env=env)
        if r.returncode == 0:
            if versions:
                status["versions"] = r.stdout.strip()
            return True
        status.setdefault("import_errors", []).append(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "?")
        return False

    try:
        if not py.exists():
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        if py.exists() and ok():
            return py
        for packages, pin in installs:
            subprocess.run([str(py), "-m", "pip", "install", "-q", *packages], check=True, capture_output=True, text=True)
            if pin:
                status["pinned"] = pin
            if ok():
                return py
    except (subprocess.CalledProcessError, OSError) as exc:
        status["install_error"] = (getattr(exc, "stderr", "") or repr(exc))[-500:]
    return None


def run_runner(py: Path, label: str, source: str, workdir: Path, spec: dict, stem: str, pythonpath: str | None = None) -> dict:
    """A peer's runner script (``source``) with the peer venv's python ``py`` on ``spec``, as
    ``<label>_runner.py <stem>.spec.json`` in ``workdir``: the JSON it writes to ``spec["out"]``."""
    runner = workdir / f"{label}_runner.py"
    runner.write_text(source)
    sp = workdir / f"{stem}.spec.json"
    sp.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([str(py), str(runner), str(sp)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{label} runner failed: {r.stderr[-800:]}")
    return json.loads(Path(spec["out"]).read_text())


def run_peer(py: Path, ds: dict, epsilons, reps: int, seeded: bool, workdir: Path) -> tuple[list[dict], dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    xp = workdir / f"{ds['name']}.npy"
    np.save(xp, ds["x"])
    tasks = [[e, r, task_seed(ds["name"], "peer", e, r) if seeded else None]
             for e in epsilons for r in range(reps)]
    spec = {"x": str(xp), "lo": ds["lo"].tolist(), "hi": ds["hi"].tolist(), "k": ds["k"], "tasks": tasks,
            "out": str(workdir / f"{ds['name']}.peer.json")}
    out = run_runner(py, "peer", PEER_RUNNER, workdir, spec, ds["name"])
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
# The second peer: Google's LSH-tree private coreset clustering, in its own venv

GOOGLE_RUNNER = r"""
import json, sys, time
import numpy as np
spec = json.load(open(sys.argv[1]))
from importlib import metadata
from clustering import clustering_algorithm, clustering_params
x = np.load(spec["x"])  # already scaled to [-1, 1]^d with the public bounds
radius = float(np.sqrt(x.shape[1]))
out = {"versions": {p: metadata.version(p) for p in ("dp-accounting", "scikit-learn", "numpy")}, "radius": radius, "runs": []}
for eps, rep, seed in spec["tasks"]:
    if seed is not None:
        np.random.seed(seed)  # the library draws from numpy's global generator (and sklearn KMeans without random_state)
    t0 = time.perf_counter()
    try:
        res = clustering_algorithm.private_lsh_clustering(
            spec["k"], clustering_params.Data(x, radius=radius),
            clustering_params.DifferentialPrivacyParam(epsilon=float(eps), delta=float(spec["delta"])))
        out["runs"].append({"epsilon": eps, "rep": rep, "centers": np.asarray(res.centers).tolist(),
                            "seconds": time.perf_counter() - t0, "error": ""})
    except Exception as exc:
        out["runs"].append({"epsilon": eps, "rep": rep, "centers": None, "seconds": time.perf_counter() - t0,
                            "error": repr(exc)[:300]})
json.dump(out, open(spec["out"], "w"))
"""


def ensure_google_venv(status: dict) -> Path | None:
    """Create .cache/google-peer-venv (absl-py, dp-accounting, scikit-learn, scipy, numpy) and check that the peer's
    code in ../shared/peers imports. None (the peer is skipped, with the reason in ``status``) if either fails."""
    if not (GOOGLE_PATH / "clustering" / "clustering_algorithm.py").exists():
        status["skipped"] = f"peer code not found at {GOOGLE_PATH} (../shared/peers missing): google_lsh not run"
        return None
    env = dict(os.environ, PYTHONPATH=str(GOOGLE_PATH))
    env.pop("VIRTUAL_ENV", None)
    return _venv_with(GOOGLE_VENV, [(GOOGLE_PACKAGES, None)], "from clustering import clustering_algorithm, clustering_params",
                      status, env=env)


def run_google_peer(py: Path, ds: dict, epsilons, reps: int, seeded: bool, workdir: Path) -> tuple[list[dict], dict]:
    """``reps`` runs per epsilon of ``private_lsh_clustering(k, Data(unit, radius=sqrt(d)), (eps, DELTA))``."""
    workdir.mkdir(parents=True, exist_ok=True)
    xp = workdir / f"{ds['name']}.unit.npy"
    np.save(xp, ds["unit"])
    tasks = [[e, r, task_seed(ds["name"], GOOGLE, e, r) if seeded else None]
             for e in epsilons for r in range(reps)]
    spec = {"x": str(xp), "k": ds["k"], "delta": DELTA, "tasks": tasks, "out": str(workdir / f"{ds['name']}.google.json")}
    out = run_runner(py, "google", GOOGLE_RUNNER, workdir, spec, f"{ds['name']}.google", pythonpath=str(GOOGLE_PATH))
    rows = []
    for run in out["runs"]:
        row = {"dataset": ds["name"], "method": GOOGLE, "epsilon": run["epsilon"], "rep": run["rep"],
               "seconds": run["seconds"], "error": run["error"], "info": ""}
        if run["centers"] is not None:
            row.update(cost=bc.kmeans_cost(ds["unit"], np.array(run["centers"], dtype=np.float64)),
                       epsilon_spent=float(run["epsilon"]), delta_spent=DELTA)
        else:
            row.update(cost=float("nan"), epsilon_spent=float("nan"), delta_spent=float("nan"))
        rows.append(row)
    return rows, out


# ---------------------------------------------------------------------------
# The third peer: PE-means (private evolution of candidate centers), in its own venv, with n kept private

PEMEANS_RUNNER = r"""
import functools, json, sys, time, types
import numpy as np
spec = json.load(open(sys.argv[1]))
from importlib import metadata
from clustering import clustering_params
import src.pe_means_main as pm
from src.helpers import PE_PARAMS
x = np.load(spec["x"])  # already scaled to [-1, 1]^d with the public bounds
n, d = x.shape
k, delta, share = int(spec["k"]), float(spec["delta"]), float(spec["count_share"])
radius = float(np.sqrt(d))  # the public box's ball, as for google_lsh
data = clustering_params.Data(x, radius=radius)
orig_threshold, orig_pack = pm.find_threshold, pm.pack_in_sphere
# pe_means computes a NON-private per-generation loss for its history only (not an output): skip that work.
pm.clustering_algorithm = types.SimpleNamespace(ClusteringResult=lambda data, centers: types.SimpleNamespace(loss=float("nan")))
out = {"versions": {p: metadata.version(p) for p in ("faiss-cpu", "scikit-learn", "numpy", "scipy")},
       "radius": radius, "pe_params": dict(PE_PARAMS), "runs": []}
for eps, rep, seed in spec["tasks"]:
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)  # None: OS entropy (unseeded)
    try:
        eps_n = share * float(eps)
        eps_pe = float(eps) - eps_n
        # n kept private: a Laplace count (sensitivity 1) with eps_n, rounded and clipped at >= 1, wherever PE-means
        # uses n (the truncation threshold's dataset_size and L = max(n / (5 k), 4)); delta fixed, not 1 / n^1.1.
        n_noisy = max(1, int(round(n + rng.laplace(0.0, 1.0 / eps_n))))
        pm.find_threshold = lambda utilitys, dataset_size, _n=n_noisy: orig_threshold(utilitys, _n)
        pm.pack_in_sphere = functools.partial(orig_pack, seed=int(rng.integers(2**31)))  # its init is unseeded as coded
        # experiments/run_ours.py: generations int(4 sqrt(d)) (x eps above eps 1), L = max(n / (5 k), 4), PE_PARAMS.
        base_gens = int(4 * np.sqrt(d))
        gens = max(int(eps_pe * base_gens), 1) if eps_pe > 1.0 else max(base_gens, 1)
        cfg = dict(PE_PARAMS, k=k, eps=eps_pe, num_gen=gens, L=int(max(n_noisy / (5 * k), 4)),
                   run_id=int(rng.integers(2**31)))
        _, centers, _ = pm.pe_means(k, data, cfg, clustering_params.DifferentialPrivacyParam(epsilon=eps_pe, delta=delta),
                                    visualize=False)
        out["runs"].append({"epsilon": eps, "rep": rep, "centers": np.asarray(centers, dtype=float).tolist(),
                            "n_noisy": n_noisy, "generations": gens, "L_final": cfg["L"],
                            "seconds": time.perf_counter() - t0, "error": ""})
    except Exception as exc:
        out["runs"].append({"epsilon": eps, "rep": rep, "centers": None, "seconds": time.perf_counter() - t0,
                            "error": repr(exc)[:300]})
json.dump(out, open(spec["out"], "w"))
"""

_pemeans_src: Path | None = None  # the checkout ensure_pemeans_venv found


def pemeans_source(status: dict) -> Path | None:
    """The PE-means checkout: $PEMEANS_SRC, else .cache/pe-means-src (``git clone PEMEANS_URL`` into it if missing).
    None, with the reason in ``status["skipped"]``, if there is none."""
    env_src = os.environ.get(PEMEANS_SRC_ENV)
    src = Path(env_src).resolve() if env_src else PEMEANS_CACHE
    if not env_src and not (src / "src" / "pe_means_main.py").exists():
        try:
            r = subprocess.run(["git", "clone", "-q", "--depth", "1", PEMEANS_URL, str(src)], capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                status["clone_error"] = r.stderr.strip()[-300:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            status["clone_error"] = repr(exc)[:300]
    if not (src / "src" / "pe_means_main.py").exists():
        status["skipped"] = (f"PE-means code not found at {src} ({'$' + PEMEANS_SRC_ENV if env_src else 'git clone ' + PEMEANS_URL + ' failed'}; "
                             f"set {PEMEANS_SRC_ENV} to a checkout): pe_means not run")
        return None
    r = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    status["source"] = str(src)
    status["commit"] = r.stdout.strip() if r.returncode == 0 else "?"
    return src


def ensure_pemeans_venv(status: dict) -> Path | None:
    """Create .cache/pemeans-peer-venv (PEMEANS_PACKAGES: faiss-cpu as PE-means pins) and check that PE-means imports
    from its checkout with Google's ``clustering`` package (the API of its dp_clustering fork). None (the peer is
    skipped, with the reason in ``status``) if any of that fails."""
    global _pemeans_src
    src = pemeans_source(status)
    if src is None:
        return None
    if not (GOOGLE_PATH / "clustering" / "clustering_params.py").exists():
        status["skipped"] = f"Google's clustering package (PE-means' Data/ClusteringResult) not found at {GOOGLE_PATH}: pe_means not run"
        return None
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{GOOGLE_PATH}")
    env.pop("VIRTUAL_ENV", None)
    py = _venv_with(PEMEANS_VENV, [(PEMEANS_PACKAGES, None)],
                    "import faiss; from clustering import clustering_params; import src.pe_means_main", status, env=env)
    _pemeans_src = src if py is not None else None
    return py


def run_pemeans_peer(py: Path, ds: dict, epsilons, reps: int, seeded: bool, workdir: Path) -> tuple[list[dict], dict]:
    """``reps`` runs per epsilon of ``pe_means`` (run_ours.py defaults) on the unit-box data, radius sqrt(d), with
    n kept private (PEMEANS_COUNT_SHARE of epsilon on a Laplace count), (1 - share) epsilon and DELTA to PE-means."""
    workdir.mkdir(parents=True, exist_ok=True)
    xp = workdir / f"{ds['name']}.unit.npy"
    np.save(xp, ds["unit"])
    tasks = [[e, r, task_seed(ds["name"], PEMEANS, e, r) if seeded else None]
             for e in epsilons for r in range(reps)]
    spec = {"x": str(xp), "k": ds["k"], "delta": DELTA, "count_share": PEMEANS_COUNT_SHARE, "tasks": tasks,
            "out": str(workdir / f"{ds['name']}.pemeans.json")}
    out = run_runner(py, "pemeans", PEMEANS_RUNNER, workdir, spec, f"{ds['name']}.pemeans",
                     pythonpath=f"{_pemeans_src}{os.pathsep}{GOOGLE_PATH}")
    rows = []
    for run in out["runs"]:
        row = {"dataset": ds["name"], "method": PEMEANS, "epsilon": run["epsilon"], "rep": run["rep"],
               "seconds": run["seconds"], "error": run["error"],
               "info": json.dumps({k: run.get(k) for k in ("n_noisy", "generations", "L_final")})}
        if run["centers"] is not None:
            row.update(cost=bc.kmeans_cost(ds["unit"], np.array(run["centers"], dtype=np.float64)),
                       epsilon_spent=float(run["epsilon"]), delta_spent=DELTA)
        else:
            row.update(cost=float("nan"), epsilon_spent=float("nan"), delta_spent=float("nan"))
        rows.append(row)
    return rows, out


# ---------------------------------------------------------------------------
# Aggregation and outputs


def summarize(runs: list[dict], datasets: list[dict]) -> list[dict]:
    """One row per (dataset, method, epsilon); ``datasets`` are the metadata dicts of ``dataset_meta``."""
    out = []
    for ds in datasets:
        name, n, d, k, base = ds["name"], ds["n"], ds["d"], ds["k"], ds["baseline"]
        out.append({"dataset": name, "n": n, "d": d, "k": k, "method": NONPRIVATE, "epsilon": "inf", "runs": 1,
                    "cost_ratio_median": 1.0, "cost_ratio_q25": 1.0, "cost_ratio_q75": 1.0,
                    "nicv_median": base / n, "nicv_q25": base / n, "nicv_q75": base / n,
                    "epsilon_spent": "", "delta_spent": "", "failures": 0})
        mine = [r for r in runs if r["dataset"] == name]
        for method in sorted({r["method"] for r in mine}, key=method_order):
            for eps in sorted({r["epsilon"] for r in mine if r["method"] == method}):
                rs = [r for r in mine if r["method"] == method and r["epsilon"] == eps]
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
    order = [NONPRIVATE, AUTO, AUTO_TREE] + EXPLICIT_METHODS + ["ldp"] + PEERS
    return order.index(m) if m in order else len(order)


def g(v, digits=3) -> str:
    try:
        return f"{float(v):.{digits}g}"
    except (TypeError, ValueError):
        return str(v)


def cell(r, metric) -> str:
    return f"{g(r[metric + '_median'])} [{g(r[metric + '_q25'])}, {g(r[metric + '_q75'])}]"


def write_plots(summary, datasets, out_dir: Path) -> list[str]:
    plt = bh.pyplot()
    files = []
    for ds in datasets:
        rows = [r for r in summary if r["dataset"] == ds["name"] and r["method"] != NONPRIVATE
                and np.isfinite(float(r["cost_ratio_median"]))]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for method in sorted({r["method"] for r in rows}, key=method_order):
            rs = sorted((r for r in rows if r["method"] == method), key=lambda r: r["epsilon"])
            e = [r["epsilon"] for r in rs]
            med = np.array([r["cost_ratio_median"] for r in rs], dtype=float)
            lo = np.array([r["cost_ratio_q25"] for r in rs], dtype=float)
            hi = np.array([r["cost_ratio_q75"] for r in rs], dtype=float)
            style = "--" if method in PEERS else ("-." if method == "ldp" else "-")
            line, = ax.plot(e, med, style, marker="o", ms=4, label=method, lw=2.5 if method == AUTO else 1.5)
            ax.fill_between(e, lo, hi, color=line.get_color(), alpha=0.12)
        ax.axhline(1.0, color="black", lw=0.8, ls=":", label="non-private (best of 10)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("cost ratio (median, IQR band)")
        ax.set_title(f"{ds['name']} (n={ds['n']}, d={ds['d']}, k={ds['k']}); public bounds = per-column min/max",
                     fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        f = out_dir / f"cost_ratio_{ds['name']}.png"
        bh.save_figure(fig, f)
        files.append(f.name)
    return files


def peer_section(peer_meta: dict, datasets: list[dict]) -> tuple[str, list[dict]]:
    """diffprivlib's real spend; ``peer_meta`` = {"status": ..., "outputs": {dataset: runner output without runs}}."""
    if not peer_meta.get("outputs"):
        return "## Peer privacy spend: diffprivlib\n\nPeer not run: " + json.dumps(peer_meta.get("status", {})) + "\n", []
    first = next(iter(peer_meta["outputs"].values()))
    lines = ["## Peer privacy spend: diffprivlib KMeans (computed from its code path)", "",
             f"Versions in `.cache/peer-venv`: {json.dumps(first['versions'])}. Source lines read at run time "
             f"(`diffprivlib/models/k_means.py`):", "", "```", *first["source_split_return"], *first["source_unpack"],
             "```", "",
        "`_split_epsilon` computes Su et al.'s split per iteration: each coordinate sum gets share 1 and the count "
        "share c = cbrt(4 d rho^2) (rho = 0.225), normalised by (d + c) so that d * 1 + c adds up to eps / T. It "
        "returns `(1 * norm, c * norm)`, but `_update_centers` unpacks it as `epsilon_0, epsilon_i` and gives "
        "epsilon_0 = 1 * norm to the COUNT (GeometricFolded, sensitivity 1) and epsilon_i = c * norm to EACH of the "
        "d coordinate SUMS (LaplaceBoundedDomain, sensitivity = bound range): the shares are swapped. With T = "
        "`_calc_iters(d, n)` update steps composed sequentially (clusters are disjoint: parallel composition), the "
        "epsilon really spent is T * norm * (1 + d c) = eps * (1 + d c) / (d + c), not eps. It equals eps only when "
        "d c + 1 = d + c, i.e. d = 1; it is below eps for small d (c < 1, d < 4.9) and ABOVE eps for d >= 5. "
        "`accountant.spend(self.epsilon, 0)` records the nominal eps.", "",
        "Columns: actual/nominal under the library's own calibration (sensitivity = bound range per "
        "coordinate); the same with add/remove-one neighbours (a sum changes by at most max(|lo|, |hi|) per "
        "coordinate, so the range calibration over-protects the sums); with replace-one neighbours (two "
        "clusters' counts change: the count part doubles).", ""]
    rows = []
    header = ["dataset", "d", "n", "c = cbrt(4 d rho^2)", "nominal eps", "T (iters)", "actual eps (calibrated)",
              "actual / nominal", "add/remove", "replace-one", "diffprivlib's accountant records"]
    table = []
    for ds in datasets:
        out = peer_meta["outputs"].get(ds["name"])
        if not out:
            continue
        d = ds["d"]
        c = float(np.cbrt(4 * d * 0.225 ** 2))
        eps_run = sorted(float(e) for e in out["budget"])
        if not eps_run:
            continue
        e1 = min(eps_run, key=lambda e: abs(math.log(e)))  # the table row: the epsilon run closest to 1
        for eps in eps_run:
            b = out["budget"][repr(eps)]
            a = peer_actual_epsilon(d, b, ds)
            rows.append({"dataset": ds["name"], "d": d, "n": ds["n"], "nominal_epsilon": eps, "iters": a["T"],
                         "count_eps_per_iter": b["split_first"], "sum_eps_per_coord_per_iter": b["split_second"],
                         "actual_epsilon_calibrated": a["calibrated"], "su_split_total": a["nominal_su"],
                         "actual_epsilon_add_remove": a["add_remove"], "actual_epsilon_replace_one": a["replace_one"],
                         "ratio_actual_to_nominal": a["calibrated"] / eps})
            if eps == e1:
                table.append([ds["name"], d, ds["n"], f"{c:.3f}", f"{eps:g}", a["T"], f"{a['calibrated']:.4g}",
                              f"{a['calibrated'] / eps:.3f}", f"{a['add_remove']:.4g}", f"{a['replace_one']:.4g}", f"{eps:g}"])
    lines += [bh.markdown_table(header, table, ["l"] + ["r"] * 10), "",
              "The ratio actual/nominal does not depend on eps or T (every eps in `peer_privacy.csv`). "
              "Formula check for other d: d=2: 0.905, d=10: 1.212, d=24: 1.623."]
    return "\n".join(lines) + "\n", rows


def google_section(google_meta: dict) -> str:
    lines = ["## Peer: Google's LSH clustering (`google_lsh`)", ""]
    outs = google_meta.get("outputs") or {}
    if not outs:
        return "\n".join(lines + ["Not run: " + json.dumps(google_meta.get("status", {})), ""]) + "\n"
    first = next(iter(outs.values()))
    lines += [
        "Code: `../shared/peers/google-dp-clustering` (`learning/clustering/` of github.com/google/differential-privacy "
        "at commit b5b0286e313b, Apache-2.0), unchanged, run as a subprocess in `.cache/google-peer-venv` "
        f"(versions {json.dumps(first.get('versions', {}))}). Call: `clustering_algorithm.private_lsh_clustering(k, "
        "Data(X, radius=sqrt(d)), DifferentialPrivacyParam(epsilon, delta=1e-6))` with its default tree and noise "
        "multiplier parameters, X = the same [-1, 1]^d scaling from the public bounds as every other method, so every "
        "point has norm <= sqrt(d) and its clipping to the radius changes nothing.", "",
        f"Privacy: (epsilon, {DELTA:g})-DP as stated. Its `PrivacyCalculator` calibrates one Gaussian release of the "
        "sums and max_depth + 1 = 21 discrete-Laplace count levels of the LSH prefix tree to the target (epsilon, "
        "delta) with dp_accounting's PLD accountant (`validate_accounting` checks it); the centers are non-private "
        "k-means++ on the private weighted coreset (post-processing). The table records epsilon_spent = epsilon and "
        f"delta_spent = {DELTA:g}. dpspark's maxcover (and auto, if it chooses so) also spend delta = {DELTA:g}; the "
        "other dpspark methods and diffprivlib are pure epsilon-DP. Randomness: numpy's global generator, seeded per "
        "run only with --seeded. Its results vary more between runs than diffprivlib's: take the medians.", ""]
    return "\n".join(lines) + "\n"


def pemeans_section(meta: dict) -> str:
    lines = ["## Peer: PE-means (`pe_means`, n kept private)", ""]
    outs = meta.get("outputs") or {}
    status = meta.get("status", {})
    if not outs:
        return "\n".join(lines + ["Not run: " + json.dumps(status), ""]) + "\n"
    first = next(iter(outs.values()))
    lines += [
        f"Code: PE-means (arXiv 2606.00342, {PEMEANS_URL}, commit {status.get('commit', '?')[:12]}), unchanged, run "
        f"from its checkout ({PEMEANS_SRC_ENV} or `.cache/pe-means-src`) as a subprocess in `.cache/pemeans-peer-venv` "
        f"(versions {json.dumps(first.get('versions', {}))}), with Google's `clustering` package (above) for the "
        "Data / DifferentialPrivacyParam classes of its dp_clustering fork. Call: `src.pe_means_main.pe_means(k, "
        "Data(X, radius=sqrt(d)), cfg, DifferentialPrivacyParam(0.99 epsilon, delta=1e-6))`, X = the same [-1, 1]^d "
        f"scaling as every other method; cfg = its defaults (`src/helpers.PE_PARAMS` {json.dumps(first.get('pe_params', {}))} "
        "and experiments/run_ours.py's schedule: int(4 sqrt(d)) generations, times epsilon above 1, L = max(n / (5 k), 4)). "
        "Its per-generation non-private loss (history only, not an output) is not computed.", "",
        f"Privacy: n KEPT PRIVATE. As published it uses the true n (truncation threshold, population size L, delta = "
        f"1 / n^1.1); here {PEMEANS_COUNT_SHARE:.0%} of epsilon goes to a Laplace count (scale 1 / ({PEMEANS_COUNT_SHARE:g} "
        f"epsilon), rounded, >= 1) that replaces n everywhere, the rest to PE-means with delta = {DELTA:g}: "
        f"(epsilon, {DELTA:g})-DP for add/remove-one neighbours (the vote histogram has L2 sensitivity 1; its Gaussian "
        "noise is calibrated over the generations by its own `get_noise_multiplier`). Caveats: with n public (as "
        "published), replace-one neighbours move two votes, L2 sensitivity sqrt(2), so its real epsilon at a nominal "
        "1 is about 1.46; its high-dimensional variant HDPE (`hdpe_means`, d > 32) adds one scalar noise draw per "
        "cluster sum and is not private as coded: it is never used here. Randomness: numpy's global generator and its "
        "sphere-packing init, seeded per run only with --seeded (the Laplace count draws from its own generator).", ""]
    return "\n".join(lines) + "\n"


def _median_at(summary, name, method, eps):
    r = next((r for r in summary if r["dataset"] == name and r["method"] == method and r["epsilon"] == eps), None)
    if r is None:
        return float("nan"), None
    return float(r["cost_ratio_median"]), r


def target_rows(summary: list[dict], names: list[str]) -> list[dict]:
    """The issue-14 targets per dataset (medians of the cost ratio; nan = not run or every run failed).

    (a) at TARGET_EPS: auto's excess (ratio - 1) <= TARGET_EXCESS_FRACTION x the better peer's excess;
    (b) at TARGET_EPS: auto <= TARGET_EXPLICIT_FACTOR x the best explicit dpspark method;
    (c) at each of TARGET_SIDE_EPS: auto <= the better peer.
    Each is True, False or None (a number missing)."""
    out = []
    for name in names:
        def med(method, eps):
            return _median_at(summary, name, method, eps)[0]

        auto = med(AUTO, TARGET_EPS)
        explicit = [(med(m, TARGET_EPS), m) for m in EXPLICIT_METHODS]
        explicit = [(v, m) for v, m in explicit if np.isfinite(v)]
        best, best_name = min(explicit) if explicit else (float("nan"), "")
        dpl, goo, pem = med(PEER, TARGET_EPS), med(GOOGLE, TARGET_EPS), med(PEMEANS, TARGET_EPS)

        def better_peer(eps):
            v = [x for x in (med(p, eps) for p in PEERS) if np.isfinite(x)]
            return min(v) if v else float("nan")

        peer1 = better_peer(TARGET_EPS)
        a = bool(auto - 1 <= TARGET_EXCESS_FRACTION * (peer1 - 1)) if np.isfinite(auto) and np.isfinite(peer1) else None
        b = bool(auto <= TARGET_EXPLICIT_FACTOR * best) if np.isfinite(auto) and np.isfinite(best) else None
        side = {}
        for e in TARGET_SIDE_EPS:
            ae, pe = med(AUTO, e), better_peer(e)
            side[e] = bool(ae <= pe) if np.isfinite(ae) and np.isfinite(pe) else None
        c = None if any(v is None for v in side.values()) else all(side.values())
        out.append({"dataset": name, "auto": auto, "maxcover": med(MAXCOVER, TARGET_EPS),
                    "best_explicit": best, "best_explicit_method": best_name,
                    "diffprivlib": dpl, "google_lsh": goo, "pe_means": pem, "better_peer": peer1, "a": a, "b": b, "c": c, "c_by_eps": side})
    return out


def _verdict(v) -> str:
    return "n/a" if v is None else ("pass" if v else "FAIL")


def targets_markdown(targets: list[dict], summary: list[dict]) -> str:
    def num(v, name=None, method=None):
        if not np.isfinite(v):
            r = _median_at(summary, name, method, TARGET_EPS)[1] if name else None
            return "failed" if r is not None and r["failures"] == r["runs"] else "-"
        return f"{v:.4g}"

    header = ["dataset", f"auto (eps={TARGET_EPS:g})", "best explicit", "diffprivlib", "google_lsh", "pe_means",
              f"(a) excess <= {TARGET_EXCESS_FRACTION:g} x better peer's",
              f"(b) <= {TARGET_EXPLICIT_FACTOR:.2f} x best explicit",
              "(c) <= better peer at eps " + ", ".join(f"{e:g}" for e in TARGET_SIDE_EPS)]
    rows = []
    for t in targets:
        c = _verdict(t["c"])
        if t["c"] is not None or any(v is not None for v in t["c_by_eps"].values()):
            c += " (" + ", ".join(f"{e:g}: {_verdict(v)}" for e, v in t["c_by_eps"].items()) + ")"
        rows.append([t["dataset"], num(t["auto"], t["dataset"], AUTO),
                     f"{num(t['best_explicit'])} ({t['best_explicit_method']})" if t["best_explicit_method"] else "-",
                     num(t["diffprivlib"], t["dataset"], PEER), num(t["google_lsh"], t["dataset"], GOOGLE),
                     num(t.get("pe_means", float("nan")), t["dataset"], PEMEANS), _verdict(t["a"]), _verdict(t["b"]), c])
    return bh.markdown_table(header, rows, ["l", "r", "r", "r", "r", "r", "l", "l", "l"])


def readme_markdown(targets: list[dict], datasets: list[dict], reps: str) -> str:
    by = {ds["name"]: ds for ds in datasets}
    rows = []
    for t in targets:
        def f(v):
            return f"{v:.3g}" if np.isfinite(v) else "-"

        ds = by[t["dataset"]]
        rows.append([f"{t['dataset']} (n={ds['n']}, d={ds['d']}, k={ds['k']})", f(t["auto"]), f(t.get("maxcover", float("nan"))),
                     f"{f(t['best_explicit'])} ({t['best_explicit_method']})" if t["best_explicit_method"] else "-",
                     f(t["diffprivlib"]), f(t["google_lsh"]), f(t.get("pe_means", float("nan")))])
    return (f"Median k-means cost ratio at epsilon = {TARGET_EPS:g} (cost of the released centers / cost of non-private "
            f"k-means++ best of 10; 1 = as good, lower is better; {reps} runs per cell; data scaled to [-1, 1]^d with "
            "public per-column bounds). diffprivlib at its nominal epsilon (it really spends a different one, see "
            "bench/results/utility/results.md); google_lsh, pe_means (n kept private: 1% of epsilon on a noisy count) and "
            "maxcover spend delta = 1e-6.\n\n"
            + bh.markdown_table(["dataset", "auto", "maxcover (default candidates)", "best explicit dpspark", "diffprivlib",
                                 "google_lsh", "pe_means"], rows, ["l", "r", "r", "r", "r", "r", "r"]) + "\n")


RUN_COLUMNS = ["dataset", "method", "epsilon", "rep", "cost", "epsilon_spent", "delta_spent", "seconds", "error", "info"]


def load_state(out_dir: Path | None) -> dict:
    """The accumulated table of an output folder (--append): runs, dataset metadata, peer notes, invocations.
    ``None``: an empty table."""
    state = {"runs": [], "datasets": {}, "peers": {p: {"status": {}, "outputs": {}} for p in PEERS},
             "invocations": []}
    if out_dir is None:
        return state
    if not (out_dir / "datasets.json").exists() or not (out_dir / "runs.csv").exists():
        if (out_dir / "runs.csv").exists():
            print(f"bench_utility: {out_dir}/runs.csv has no datasets.json beside it (older format): starting a new table",
                  flush=True)
        return state
    state["datasets"] = json.loads((out_dir / "datasets.json").read_text())
    for r in bh.read_csv(out_dir / "runs.csv", ints=("rep",),
                         floats=("epsilon", "cost", "epsilon_spent", "delta_spent", "seconds")):
        state["runs"].append({**{c: r[c] for c in RUN_COLUMNS}, "error": r["error"] or "", "info": r["info"] or ""})
    if (out_dir / "peers.json").exists():
        state["peers"].update(json.loads((out_dir / "peers.json").read_text()))
    if (out_dir / "meta.json").exists():
        state["invocations"] = json.loads((out_dir / "meta.json").read_text()).get("invocations", [])
    return state


def dataset_meta(ds: dict, baseline: float, baseline_s: float, max_rows) -> dict:
    return {"name": ds["name"], "n": int(ds["x"].shape[0]), "d": int(ds["x"].shape[1]), "k": int(ds["k"]),
            "n_full": int(ds["n_full"]), "max_rows": max_rows, "lo": ds["lo"].tolist(), "hi": ds["hi"].tolist(),
            "baseline": baseline, "baseline_seconds": baseline_s}


def ordered(names) -> list[str]:
    """The shared datasets in their order, then the others by name; a k sweep's (``@k<K>``) by k."""
    def key(n):
        source, _, k = n.partition("@k")
        rank = FULL_DATASETS.index(source) if source in FULL_DATASETS else len(FULL_DATASETS)
        return rank, source, int(k) if k.isdigit() else 0
    return sorted(names, key=key)


def write_outputs(state: dict, out_dir: Path) -> tuple[list[dict], list[dict]]:
    """Regenerate every output of ``out_dir`` from the whole accumulated ``state``; returns (summary, targets)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = state["runs"]
    datasets = [state["datasets"][n] for n in ordered(state["datasets"])]
    names = [ds["name"] for ds in datasets]
    invocations = state["invocations"]
    bh.write_csv(out_dir / "runs.csv", sorted(runs, key=lambda r: (ordered(names).index(r["dataset"]) if r["dataset"] in names
                                                                   else 99, method_order(r["method"]), r["epsilon"], r["rep"])),
                 RUN_COLUMNS)
    (out_dir / "datasets.json").write_text(json.dumps(state["datasets"], indent=1))
    (out_dir / "peers.json").write_text(json.dumps(state["peers"], indent=1, default=str))
    summary = summarize(runs, datasets)
    bh.write_csv(out_dir / "summary.csv", summary, CSV_COLUMNS)
    plots = write_plots(summary, datasets, out_dir)
    all_eps = sorted({r["epsilon"] for r in runs})
    peer_md, peer_rows = peer_section(state["peers"][PEER], datasets)
    if peer_rows:
        bh.write_csv(out_dir / "peer_privacy.csv", peer_rows)
    targets = target_rows(summary, names)
    reps = sorted({str(inv["reps"]) for inv in invocations}) or ["?"]
    (out_dir / "readme_table.md").write_text(readme_markdown(targets, datasets, "/".join(reps)))
    m = bh.machine_description()
    md = ["# Utility benchmark: dpspark (auto and every family) vs non-private k-means, diffprivlib, Google's LSH "
          "clustering and PE-means", "",
          f"{len(runs)} DP runs from {len(invocations)} invocation(s) appended into one table (`--append`):", ""]
    md += [f"- `{inv['command']}` ({inv.get('date', '')}): engine {inv['engine']}, datasets "
           f"{', '.join(inv['datasets'])}, {inv['runs']} runs in {inv['elapsed_s']:.0f} s"
           + (", SEEDED noise" if inv.get("seeded") else "") for inv in invocations]
    md += ["", f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gb']} GB, Python {m['python']}; load average at "
           f"the end {os.getloadavg()[0]:.1f} (shared machine).", "",
           bc.PUBLIC_BOUNDS_NOTE + " All costs are measured on the data scaled to [-1, 1]^d with these bounds.", "",
           "Cost ratio = k-means cost of the released centers / cost of non-private scikit-learn KMeans "
           "(k-means++, Lloyd, best of n_init=10) on the same data (1 = as good; lower is better). NICV = cost / N "
           "on [-1, 1]^d. Cells: median [25th, 75th percentile] over the repetitions.", ""]
    engines = sorted({inv["engine"] for inv in invocations})
    notes = []
    if "spark" in engines:
        notes.append("`spark`: every dpspark run is `estimator.fit(spark_df)` on a local[2] session.")
    if "numpy" in engines:
        notes.append("`numpy`: dpspark methods run their real driver code (estimator validation, budget split, "
                     "accountant, mechanisms, coverage / Lloyd / LDP rounds, solvers) with the package's numpy reference "
                     "aggregation instead of the Spark passes (identical exact aggregates); `auto` runs only on Spark.")
    seeded = any(inv.get("seeded") for inv in invocations)
    md += ["Engine: " + " ".join(notes),
           f"Noise: {'SEEDED in some invocations (reproducible, NOT private)' if seeded else 'secure (OpenDP) for dpspark; unseeded for the peers'}. "
           f"maxcover, google_lsh and pe_means: delta = {DELTA:g}; auto gets delta = {DELTA:g} and records what it spends; every "
           "other method: pure epsilon-DP. `ldp` is LOCAL DP (each user's own report is epsilon-DP): a much stronger "
           "guarantee than the central model of the others.", "",
           "Datasets (whole unless a row cap is shown; public bounds from the data used): " + "; ".join(
               f"{ds['name']} n={ds['n']}" + (f" (of {ds['n_full']}, --max-rows {ds['max_rows']})" if ds['n'] < ds['n_full'] else "")
               + f" d={ds['d']} k={ds['k']}" for ds in datasets) + "."]
    no_grid = [ds["name"] for ds in datasets
               if not any(r["dataset"] == ds["name"] and r["method"] == "maxcover_grid" for r in runs)
               and any(r["dataset"] == ds["name"] and r["method"].startswith("maxcover") for r in runs)]
    if no_grid:
        md += ["", f"maxcover_grid is not run for {', '.join(no_grid)} (d above --grid-max-dim: about 120 s per run at "
               "d = 13 on this machine)."]
    md += ["", f"## Targets at epsilon = {TARGET_EPS:g} (and {', '.join(f'{e:g}' for e in TARGET_SIDE_EPS)})", "",
           f"Median cost ratios. Best explicit = the lowest median at eps {TARGET_EPS:g} among "
           f"{', '.join(EXPLICIT_METHODS)}. Better peer = the lowest median of the peers run (diffprivlib, google_lsh, pe_means) at "
           f"that epsilon (diffprivlib at its NOMINAL epsilon: see its real spend below). (a) auto's excess (ratio - 1) "
           f"<= {TARGET_EXCESS_FRACTION:g} x the better peer's excess at eps {TARGET_EPS:g}; (b) auto <= "
           f"{TARGET_EXPLICIT_FACTOR:.2f} x the best explicit at eps {TARGET_EPS:g}; (c) auto <= the better peer at "
           f"eps {' and '.join(f'{e:g}' for e in TARGET_SIDE_EPS)}. n/a = a number is missing (not run, or failed).", "",
           targets_markdown(targets, summary), ""]
    e_sum = TARGET_EPS if TARGET_EPS in all_eps else (min(all_eps, key=lambda e: abs(math.log(e))) if all_eps else TARGET_EPS)
    md += [f"## Summary at epsilon = {e_sum:g}: median cost ratio [IQR] (median NICV)", ""]
    methods = sorted({r["method"] for r in summary}, key=method_order)
    header = ["method"] + names
    trows = []
    for method in methods:
        row = [method]
        for ds in datasets:
            r = next((r for r in summary if r["dataset"] == ds["name"] and r["method"] == method
                      and (r["epsilon"] == e_sum or (method == NONPRIVATE))), None)
            if r is None:
                row.append("-")
            elif r["failures"] == r["runs"]:
                row.append("failed")
            else:
                row.append(f"{cell(r, 'cost_ratio')} ({g(r['nicv_median'])})")
        trows.append(row)
    md += [bh.markdown_table(header, trows, ["l"] + ["r"] * len(datasets)), ""]
    for ds in datasets:
        md += [f"## {ds['name']} (n={ds['n']}, d={ds['d']}, k={ds['k']})", ""]
        if f"cost_ratio_{ds['name']}.png" in plots:
            md += [f"![cost ratio vs epsilon](cost_ratio_{ds['name']}.png)", ""]
        eps_list = sorted({r["epsilon"] for r in summary if r["dataset"] == ds["name"] and r["method"] != NONPRIVATE})
        header = ["method", "metric"] + [f"eps={e:g}" for e in eps_list] + ["s/run"]
        trows = []
        for method in methods:
            if method == NONPRIVATE:
                continue
            secs = [r["seconds"] for r in runs if r["dataset"] == ds["name"] and r["method"] == method
                    and np.isfinite(r["seconds"])]
            for metric in ("cost_ratio", "nicv"):
                row = [method, metric]
                for e in eps_list:
                    r = next((r for r in summary if r["dataset"] == ds["name"] and r["method"] == method and r["epsilon"] == e), None)
                    row.append("-" if r is None else cell(r, metric) + (f" ({r['failures']} failed)" if r["failures"] else ""))
                row.append(g(np.median(secs)) if secs and metric == "cost_ratio" else "")
                trows.append(row)
        md += [bh.markdown_table(header, trows, ["l", "l"] + ["r"] * (len(eps_list) + 1)), "",
               f"Non-private NICV: {g(ds['baseline'] / ds['n'], 4)}."]
        routes = {}
        for r in runs:
            if r["dataset"] == ds["name"] and r["method"] == AUTO and r.get("info"):
                try:
                    chosen = json.loads(r["info"]).get("chosen")
                except ValueError:
                    chosen = None
                if chosen:
                    routes.setdefault(f"eps={r['epsilon']:g}", {}).setdefault(chosen, 0)
                    routes[f"eps={r['epsilon']:g}"][chosen] += 1
        if routes:
            md.append("auto's route: " + "; ".join(f"{e}: " + ", ".join(f"{c} x{n}" for c, n in v.items())
                                                   for e, v in routes.items()) + ".")
        md.append("")
    md += [peer_md, google_section(state["peers"][GOOGLE]), pemeans_section(state["peers"][PEMEANS])]
    errors = [r for r in runs if r.get("error")]
    if errors:
        seen = {}
        for r in errors:
            seen.setdefault((r["method"], r["error"]), []).append(f"{r['dataset']}@{r['epsilon']:g}")
        md += ["## Failed runs", "", *(f"- {method}: `{err}` ({len(where)}x: {', '.join(sorted(set(where))[:6])})"
                                        for (method, err), where in seen.items()), ""]
    (out_dir / "results.md").write_text("\n".join(md) + "\n")
    (out_dir / "meta.json").write_text(json.dumps({"invocations": invocations, "machine": m}, indent=1, default=str))
    return summary, targets


# ---------------------------------------------------------------------------


def run_dpspark(ds: dict, tasks, engine: str, workers: int, spark_engine) -> list[dict]:
    if not tasks:
        return []
    if engine == "spark":
        return spark_engine.run(ds, tasks)
    # spawn, not fork: the parent ran scikit-learn (OpenMP threads); a forked child can deadlock on them.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=([(ds["source"], ds["max_rows"], ds["sweep_k"])],),
                             mp_context=ctx) as pool:
        return list(pool.map(run_task, tasks, chunksize=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: blood_transfusion capped at 2000 rows, numpy "
                    "engine, eps 0.5 and 2, 2 reps, no auto")
    ap.add_argument("--no-peer", action="store_true", help="skip every peer (diffprivlib, google_lsh, pe_means)")
    ap.add_argument("--peers", nargs="*", choices=PEERS, default=None, help=f"the peers to run (default: {' '.join(PEERS)})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--append", action="store_true", help="add to the table already in --out (runs.csv, datasets.json): "
                    "this invocation's (dataset, method, epsilon) cells replace the same cells there, everything else "
                    "is kept; results.md is regenerated from the whole table")
    ap.add_argument("--reps", type=int, default=None, help="runs per (dataset, method, epsilon); default 5")
    ap.add_argument("--datasets", nargs="*", default=None, help=f"default: {' '.join(FULL_DATASETS)}")
    ap.add_argument("--epsilons", nargs="*", type=float, default=None, help=f"default: {EPSILONS}")
    ap.add_argument("--max-rows", type=int, default=None, help="uniform subsample cap per dataset (default: whole)")
    ap.add_argument("--methods", nargs="*", default=None, help=f"dpspark methods (default: {' '.join(DP_METHODS)}; given with none: only the peers)")
    ap.add_argument("--workers", type=int, default=2, help="processes for the numpy engine")
    ap.add_argument("--grid-max-dim", type=int, default=10, help="skip maxcover_grid above this dimension")
    ap.add_argument("--engine", choices=["numpy", "spark"], default=None, help="default spark (--quick: numpy)")
    ap.add_argument("--seeded", action="store_true", help="reproducible, NOT private noise (testing aid)")
    ap.add_argument("--k", nargs="*", type=int, default=None, help="a k sweep: each dataset once per k given (its table "
                    "name then ends in @k<K>, e.g. adult@k16), instead of once with its own k")
    ap.add_argument("--maxcover-lloyd-share", type=float, default=None, help="every maxcover method's lloyd_share "
                    "(its last DP Lloyd step's share of epsilon; default: the family's, 0.5 with tree candidates, else 0); "
                    "a tuning aid: use one --out per value, the method names do not say it")
    args = ap.parse_args(argv)
    command = bh.command_line("bench_utility.py", argv)
    if args.maxcover_lloyd_share is not None:
        os.environ[LLOYD_SHARE_ENV] = repr(args.maxcover_lloyd_share)
    if args.quick:
        args.datasets = args.datasets or QUICK_DATASETS
        args.epsilons = args.epsilons or [0.5, 2.0]
        args.reps = args.reps or 2
        args.methods = args.methods or QUICK_METHODS
        args.max_rows = args.max_rows or 2000
        args.engine = args.engine or "numpy"
    args.datasets = args.datasets or FULL_DATASETS
    args.epsilons = args.epsilons or EPSILONS
    args.reps = args.reps or 5
    args.methods = DP_METHODS if args.methods is None else args.methods  # `--methods` alone: peers only
    args.engine = args.engine or "spark"
    unknown = [n for n in args.datasets if n not in bc.LOADERS_BY_NAME]
    if unknown:
        ap.error(f"unknown datasets {unknown}; known: {sorted(bc.LOADERS_BY_NAME)}")
    if args.k is not None and (not args.k or min(args.k) < 1):
        ap.error(f"--k {args.k}: give one or more integers >= 1")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    t0 = time.perf_counter()
    state = load_state(args.out if args.append else None)
    invocation = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "engine": args.engine,
                  "datasets": list(args.datasets), "methods": list(args.methods), "epsilons": list(args.epsilons),
                  "reps": args.reps, "seeded": args.seeded, "max_rows": args.max_rows, "runs": 0, "elapsed_s": 0.0}
    state["invocations"].append(invocation)
    pythons = {}
    peers = PEERS if args.peers is None else [p for p in PEERS if p in args.peers]
    for p in PEERS:
        state["peers"].setdefault(p, {"status": {}, "outputs": {}})
    if args.no_peer:
        for p in PEERS:
            state["peers"][p]["status"] = {"skipped": "--no-peer"}
    else:
        for p in PEERS:
            if p not in peers and not state["peers"][p].get("outputs"):
                state["peers"][p]["status"] = {"skipped": "not in --peers"}
        for p, ensure in ((PEER, ensure_peer_venv), (GOOGLE, ensure_google_venv), (PEMEANS, ensure_pemeans_venv)):
            if p not in peers:
                continue
            status: dict = {}
            pythons[p] = ensure(status)
            state["peers"][p]["status"] = status
            if pythons[p] is None:
                print(f"bench_utility: peer {p} skipped: " + json.dumps(status)[:500], flush=True)
    spark_engine = SparkEngine() if args.engine == "spark" else None
    print(f"bench_utility: {len(args.datasets)} datasets, methods {' '.join(args.methods)}, engine {args.engine}, "
          f"epsilons {args.epsilons}, {args.reps} reps -> {args.out}" + (" (append)" if args.append else ""), flush=True)
    try:
        for source, sweep_k in [(n, k) for n in args.datasets for k in (args.k or [None])]:
            t_ds = time.perf_counter()
            ds = load_dataset(source, args.max_rows, k=sweep_k)
            name = ds["name"]
            ds["max_rows"] = args.max_rows
            tb = time.perf_counter()
            baseline = bc.nonprivate_baseline(ds["unit"], ds["k"])[1]
            meta = dataset_meta(ds, baseline, time.perf_counter() - tb, args.max_rows)
            old = state["datasets"].get(name)
            if old and (old["n"] != meta["n"] or old.get("max_rows") != meta["max_rows"]):
                print(f"  {name}: the table held n={old['n']} (max_rows {old.get('max_rows')}); now n={meta['n']}: its "
                      "old runs are dropped", flush=True)
                state["runs"] = [r for r in state["runs"] if r["dataset"] != name]
            state["datasets"][name] = meta
            # maxcover with the public GRID in d > grid_max_dim: 1000 grid points in 13-D give 120 s per run here.
            methods = [m for m in args.methods if not (m == "maxcover_grid" and meta["d"] > args.grid_max_dim)]
            tasks = [(name, m, e, r, args.seeded) for e in args.epsilons for r in range(args.reps) for m in methods]
            tasks.sort(key=lambda t: (0 if t[1].startswith("maxcover") else 1, -t[2]))
            new = run_dpspark(ds, tasks, args.engine, args.workers, spark_engine)
            work = ROOT / ".cache" / "peer-work"
            for p, runner in ((PEER, run_peer), (GOOGLE, run_google_peer), (PEMEANS, run_pemeans_peer)):
                if pythons.get(p) is None:
                    continue
                try:
                    rows, out = runner(pythons[p], ds, args.epsilons, args.reps, args.seeded, work)
                    new.extend(rows)
                    out.pop("runs", None)
                    prev = state["peers"][p]["outputs"].get(name) or {}
                    if "budget" in out:  # diffprivlib's per-epsilon budgets of earlier invocations stay (--append)
                        out["budget"] = {**prev.get("budget", {}), **out["budget"]}
                    state["peers"][p]["outputs"][name] = out
                except Exception as exc:
                    state["peers"][p]["status"].setdefault("errors", []).append(f"{name}: {exc!r}"[:800])
            keys = {(r["dataset"], r["method"], r["epsilon"]) for r in new}
            state["runs"] = [r for r in state["runs"] if (r["dataset"], r["method"], r["epsilon"]) not in keys] + new
            invocation["runs"] += len(new)
            invocation["elapsed_s"] = time.perf_counter() - t0
            write_outputs(state, args.out)
            per = {}
            for r in new:
                per.setdefault(r["method"], []).append(r["seconds"])
            failed = sum(1 for r in new if r.get("error"))
            print(f"  {name} (n={meta['n']}, d={meta['d']}, k={meta['k']}): {len(new)} runs ({failed} failed) in "
                  f"{time.perf_counter() - t_ds:.0f} s; s/run: " +
                  ", ".join(f"{m} {np.mean(v):.2f}" for m, v in sorted(per.items(), key=lambda kv: method_order(kv[0]))),
                  flush=True)
    finally:
        if spark_engine is not None:
            spark_engine.stop()
    invocation["elapsed_s"] = time.perf_counter() - t0
    summary, targets = write_outputs(state, args.out)
    print()
    print(f"Targets (median cost ratio, whole table in {args.out}):")
    print(targets_markdown(targets, summary))
    failed = sum(1 for r in state["runs"] if r.get("error"))
    print(f"bench_utility: wrote {args.out}/results.md, summary.csv, readme_table.md ({len(state['runs'])} runs in the "
          f"table, {failed} failed; this invocation {invocation['runs']} runs in {invocation['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
