#!/usr/bin/env python
"""Scaling benchmark (issues 7, 15): each dpspark family next to Spark MLlib KMeans, same data, same session.

Data: synthetic Gaussian mixture, k = 10 components (means uniform in [-6, 6]^d, sigma 1.5, a public
seed), clipped to the PUBLIC box [-10, 10]^d, generated on the Spark executors (``range`` ids, numpy
per Arrow batch in ``mapInPandas``) and written once per (n, d) as a Delta table; every job reads
that table.

Two modes. The default (``fit``, issue 7) times each job's ``fit`` in one local SparkSession
(``build_session(master="local[2]")``); ``--whole`` (issue 15) times whole PROCESSES, start to exit (below).

Jobs per (n, d) of the fit mode:

- ``auto``: ``AutoClustering(k=10, epsilon=1, delta=1e-6, objective="kmeans")``, the default family of
  ``dpspark run`` (d <= 3: maxcover with grid candidates; else the private tree coreset + DP Lloyd steps);
- ``maxcover``: ``MaxCover(k=10, epsilon=1, delta=1e-6, objective="kmeans")`` (its default candidates for d:
  private grid cells for d <= 3, the private LSH tree's leaves above);
- ``dplloyd``: ``DPLloyd(k=10, epsilon=1)`` (default variant allocation_nk, 12 iterations);
- ``ldp``: ``LocalDP(k=10, epsilon=1, objective="kmeans")`` (simulate mode);
- ``mllib``: ``pyspark.ml.clustering.KMeans(k=10, maxIter=20, tol=1e-4)`` (default k-means|| init) on
  ``VectorAssembler`` output of the same table, end to end (assemble + cache + fit).

Measured: wall time of the whole ``fit`` (Delta read included), Spark passes over the data
(``spark_passes`` of the ``operational`` dict maxcover's ``fit`` fills, NON-PRIVATE metadata; for the others counted from their code path: dplloyd = its
iterations, one aggregation pass each; ldp = 3 rounds; MLlib = cache pass + k-means|| init (initSteps = 2
passes + 1 cost pass) + ``summary.numIter`` Lloyd passes + 1 training-cost pass, an approximation from MLlib's
code path, marked ``~``), peak driver memory from the OS: the Python driver's peak RSS (``VmHWM`` of
/proc/self/status, reset per job through /proc/self/clear_refs, and the lifetime
``getrusage(RUSAGE_SELF).ru_maxrss``) and the JVM's ``VmHWM`` (/proc/<java pid>/status, reset the same
way), time per point. A log-log plot of wall time against n per job with the least-squares slope.

Spark passes of maxcover (and of auto's maxcover route) come with ``passes_by_kind``: r = the number of
thresholds (each read by at most one signature-histogram pass), the limit r + 1 (+ 1 with private candidates, + 1 more from 4 dimensions on: hashed cell counts first), the
thresholds whose histogram exceeded ``max_signatures`` (``fallback_thresholds``, with
``histogram_jobs`` when the fit reports them), and the largest signature histogram
(``histogram_sizes``), all NON-PRIVATE operational metadata of the fit.

``--whole``: per (n, d), the processes alternate, each family's ``dpspark run`` followed by a plain
PySpark MLlib job (``scripts/mllib_job.py``: read the Delta table, VectorAssembler,
``KMeans(k=10, maxIter=20, tol=0)``, centers written as a Delta table), each a fresh process and JVM
with the same Spark settings (master local[2], driver memory from $DPSPARK_DRIVER_MEMORY, the same
shuffle partitions). ``dpspark run --config <generated yaml> --json`` runs without a ledger
(``privacy.ledger: null``, $DPSPARK_LEDGER removed from its environment), writes centers/, runs/,
report.png and summary.json into a temporary directory. Measured: the wall time of the whole
process (start to exit); the fit alone and every top-level step, from the child's step lines on
stderr (dpspark's log; mllib_job writes the same format), with the start-up before the first step
and the exit after the last timed on the lines' arrival; dpspark's pass counts from its operator
record (``$DPSPARK_OPERATOR_LOG`` set to ``operator/`` in the job's folder, read with
``dpspark.runner.read_operator_record``); each family's ratio to the mean of the MLlib runs just before
and after it; peak RSS of the child's Python process, its JVM and the whole process tree (sampled
every 0.5 s); the cost sanity check on the released centers (summary.json, result.json). Writes
whole.csv, whole.md, whole_time_vs_n.png beside the fit mode's files (``--append`` replaces the
re-measured (n, d) cells).

    .venv/bin/python scripts/bench_scale.py --quick --out /tmp/s       # smoke: n in {2e4, 5e4}, d=2
    .venv/bin/python scripts/bench_scale.py --n 1e5 1e6 --d 2 10        # about 6 min on 2 quiet cores
    DPSPARK_DRIVER_MEMORY=12g .venv/bin/python scripts/bench_scale.py --job-timeout 600
                                                                        # n = 1e5, 1e6, 1e7; d = 2, 10: about 30 min
    .venv/bin/python scripts/bench_scale.py --n 1e7 --d 10 --append     # re-measure cells, merge into the tables

    # --whole (issue 15's targets: n in {1e6, 1e7}, d in {2, 10, 50}, every family; the default grid),
    # in pieces merged with --append (a piece re-measures whole (n, d) cells). Each cell runs 8
    # processes (4 families, 4 MLlib jobs): expect, on 2 quiet cores, about 5-10 min per cell at 1e6,
    # 30-40 min at 1e7 x 2, 1-1.5 h at 1e7 x 10, several hours at 1e7 x 50 (4 GB table, written in
    # about 5-10 min).
    .venv/bin/python scripts/bench_scale.py --whole --quick --out /tmp/w   # smoke: 2e4 x 2, auto + MLlib, 4 min
    DPSPARK_DRIVER_MEMORY=12g .venv/bin/python scripts/bench_scale.py --whole --n 1e6 --d 2 10 50 --append
    DPSPARK_DRIVER_MEMORY=12g .venv/bin/python scripts/bench_scale.py --whole --n 1e7 --d 2 --append --job-timeout 3600
    DPSPARK_DRIVER_MEMORY=12g .venv/bin/python scripts/bench_scale.py --whole --n 1e7 --d 10 --append --job-timeout 5400
    DPSPARK_DRIVER_MEMORY=12g .venv/bin/python scripts/bench_scale.py --whole --n 1e7 --d 50 --append --job-timeout 7200
    # a cell in two sessions: the second adds its families (each next to its own MLlib run) to the cell
    DPSPARK_DRIVER_MEMORY=12g .venv/bin/python scripts/bench_scale.py --whole --n 1e7 --d 50 --jobs maxcover mllib \
        --append --add-to-cells --job-timeout 3600
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402
from bench_harness import fmt as _f  # noqa: E402

ROOT = bc.ROOT
DEFAULT_OUT = ROOT / "bench" / "results" / "scale"
K = 10
EPS = 1.0
DELTA = 1e-6
BOX = 10.0
SIGMA = 1.5
JOBS = ["auto", "maxcover", "dplloyd", "ldp", "mllib"]
FAMILIES = [j for j in JOBS if j != "mllib"]
QUICK_JOBS = ["maxcover", "dplloyd", "ldp", "mllib"]  # --quick's default (tests/test_bench_quick.py expects these)
WHOLE_QUICK_JOBS = ["auto", "mllib"]
SPARK_CONF = bh.SPARK_CONF
MASTER = bh.MASTER
MLLIB_TOL = {"fit": 1e-4, "whole": 0.0}  # the fit mode's historical tol; issue 15's target job: tol = 0
CSV_COLUMNS = ["n", "d", "job", "wall_s", "spark_passes", "passes_source", "py_peak_mb", "jvm_peak_mb",
               "us_per_point", "cost_ratio_vs_true_means", "epsilon_spent", "error",
               "passes_limit", "fallback_thresholds", "max_histogram", "histogram_jobs", "route"]
WHOLE_COLUMNS = ["n", "d", "job", "seq", "wall_whole_s", "fit_s", "outside_fit_s", "mllib_whole_s", "ratio_whole",
                 "mllib_fit_s", "ratio_fit", "spark_passes", "passes_source", "passes_limit", "fallback_thresholds",
                 "max_histogram", "histogram_jobs", "route", "py_peak_mb", "jvm_peak_mb", "tree_peak_mb", "us_per_point",
                 "cost_ratio_vs_true_means", "epsilon_spent", "exit_code", "steps", "error"]
NUMERIC = {"wall_s", "py_peak_mb", "jvm_peak_mb", "us_per_point", "epsilon_spent", "wall_whole_s", "fit_s",
           "outside_fit_s", "mllib_whole_s", "ratio_whole", "mllib_fit_s", "ratio_fit", "tree_peak_mb"}
# Columns of the step breakdown: groups of TOP-LEVEL step names (dpspark's runner and CLI, mllib_job's),
# the fit of either is "FIT". A top-level step not named here goes to "other steps" (the runner's list grows).
STEP_COLUMNS = [("Spark session", ["start Spark session"]),
                ("pre-flight, ledger, runs row", ["pre-flight checks", "check the Python workers",
                                                  "write runs table (running)",
                                                  "wait for the runs table (running)",
                                                  "privacy ledger: start", "privacy ledger: earlier attempts",
                                                  "privacy ledger: charge", "privacy ledger: fit started",
                                                  "privacy ledger: end"]),
                ("read input", ["read input table (schema and version)", "check the public inputs",
                                "check that every input is in", "read input table (schema)"]),
                ("fit", ["FIT"]),
                ("write outputs", ["write centers table", "write report.png", "write runs table and summary.json"]),
                ("stop", ["stop Spark session"])]
KNOWN_STEPS = {name for _, names in STEP_COLUMNS for name in names}
# A row's columns from maxcover's operational metadata (maxcover_extras) and auto's route, blank where unknown.
EXTRAS = ("passes_limit", "fallback_thresholds", "max_histogram", "histogram_jobs", "route")

log = logging.getLogger("bench_scale")


# ---------------------------------------------------------------------------
# Data


def mixture_means(seed: int, d: int) -> np.ndarray:
    rng = np.random.default_rng([seed, d])
    return rng.uniform(-0.6 * BOX, 0.6 * BOX, size=(K, d))


def _mixture_batches(seed: int, d: int, means: np.ndarray):
    """mapInPandas function: rows of the mixture for the ids of each batch (numpy; seeded by the batch's first id)."""
    columns = [f"x{j}" for j in range(d)]

    def gen(batches):
        import pandas as pd

        for pdf in batches:
            ids = pdf["id"].to_numpy()
            if len(ids) == 0:
                continue
            rng = np.random.default_rng([seed, d, int(ids[0])])
            comp = rng.integers(0, K, size=len(ids))
            x = means[comp] + rng.standard_normal((len(ids), d)) * SIGMA
            yield pd.DataFrame(np.clip(x, -BOX, BOX), columns=columns)

    return gen


def make_table(spark, path: str, n: int, d: int, seed: int, partitions: int) -> np.ndarray:
    """Write the mixture as a Delta table of ``partitions`` files, generated on the executors (no driver data).

    ``range`` ids -> ``mapInPandas``: numpy draws each Arrow batch (component uniform, Gaussian noise,
    clipped to the box), seeded by (seed, d, the batch's first id), so a table is reproducible for a
    given partitioning. Measured at n = 2e5, d = 50 on the loaded 2-core machine: about 2x faster than
    the same mixture from Spark's ``rand``/``randn`` column expressions; the Delta write (Parquet
    encoding and the per-file column statistics) is most of the cost. The driver holds only the plan and
    the means; each executor task one batch (10^4 rows) at a time: n = 10^7, d = 50 (4 GB of doubles)
    streams through in constant memory.
    """
    means = mixture_means(seed, d)
    schema = ", ".join(f"x{j} DOUBLE" for j in range(d))
    (spark.range(0, int(n), numPartitions=partitions).mapInPandas(_mixture_batches(seed, d, means), schema)
     .write.format("delta").mode("overwrite").save(path))
    return means


def utility_sample(df, domain, n: int) -> np.ndarray:
    """Up to about 2e5 rows in the unit space (driver-side; not part of any timing)."""
    frac = min(1.0, 200_000 / max(1, n))
    pts = df.sample(fraction=frac, seed=7).toPandas().to_numpy(dtype=np.float64)
    return domain.clip_to_unit(pts)


# ---------------------------------------------------------------------------
# Pass counts (NON-PRIVATE operational metadata)


def maxcover_extras(operational: dict) -> dict:
    """r + 1 (+ the candidates' passes, the row count, the Lloyd step) as the pass limit, the fallback thresholds, the largest histogram."""
    by_kind = operational.get("passes_by_kind") or {}
    r = by_kind.get("signature histogram")
    if r is not None:  # r = the thresholds (one entry each in histogram_sizes), read in at most r passes
        r = max(int(r), len(operational.get("histogram_sizes") or []))
    sizes = [int(s) for s in operational.get("histogram_sizes") or [] if s is not None and int(s) >= 0]
    fallbacks = operational.get("fallback_thresholds") or []
    # the passes besides the thresholds' and the snap, as counted: private cells (one, or two from
    # passes.HASH_FIRST_MIN_DIM dimensions on: hashed counts first), tree (one), grid_or_private's row count
    # (one), the last DP Lloyd step (one, lloyd_share); none for a public grid
    cand_passes = sum(int(by_kind.get(kind, 0)) for kind in ("candidate cells", "candidate cell hashes", "tree", "count",
                                                             "lloyd"))
    return {"passes_limit": "" if r is None else int(r) + 1 + cand_passes,
            "fallback_thresholds": " ".join(str(v) for v in fallbacks),
            "max_histogram": max(sizes) if sizes else "",
            # jobs over a persisted oversized histogram (maxcover's fallback without data passes), if reported
            "histogram_jobs": operational.get("histogram_jobs", "")}


# ---------------------------------------------------------------------------
# Fit mode: one job in this process's session


def run_job(job: str, spark, df, domain, features, seed_base: int, tiny: bool = False, mllib_tol: float = 1e-4) -> dict:
    """centers, spark_passes, passes_source, epsilon_spent (+ passes_limit, fallback_thresholds,
    max_histogram, route where known) of one job. ``tiny`` (--quick): fewer iterations."""
    if job == "auto":
        from dpspark.auto.estimator import AutoClustering

        operational: dict = {}  # NON-PRIVATE, never on the model
        m = AutoClustering(k=K, epsilon=EPS, delta=DELTA, domain=domain, features=features,
                           objective="kmeans").fit(df, operational=operational)
        route = (m.info.get("auto") or {}).get("route", "")
        out = {"centers": m.centers, "passes": operational.get("spark_passes"), "epsilon_spent": m.epsilon_spent,
               "source": "fit(operational=...)", "route": route}
        if route == "maxcover":
            out.update(maxcover_extras(operational))
        elif operational.get("passes_by_kind"):
            out["source"] += " " + json.dumps(operational["passes_by_kind"], sort_keys=True)
        return out
    if job == "maxcover":
        from dpspark.maxcover.estimator import MaxCover

        operational = {}  # pass counts depend on the data: NON-PRIVATE, never on the model
        m = MaxCover(k=K, epsilon=EPS, delta=DELTA, domain=domain, features=features, objective="kmeans",
                     candidate_count=200 if tiny else 1000).fit(df, operational=operational)
        return {"centers": m.centers, "passes": operational.get("spark_passes"), "source": "fit(operational=...)",
                "epsilon_spent": m.epsilon_spent, **maxcover_extras(operational)}
    if job == "dplloyd":
        from dpspark.dplloyd.estimator import DPLloyd

        est = DPLloyd(k=K, epsilon=EPS, domain=domain, features=features, iterations=3 if tiny else 12)
        m = est.fit(df)
        return {"centers": m.centers, "passes": len(m.info.get("iteration_shares", [])),
                "source": "code path (1 per iteration)", "epsilon_spent": m.epsilon_spent}
    if job == "ldp":
        from dpspark.ldp.estimator import LocalDP

        m = LocalDP(k=K, epsilon=EPS, domain=domain, features=features, objective="kmeans").fit(df)
        return {"centers": m.centers, "passes": 3, "source": "code path (3 rounds)", "epsilon_spent": m.epsilon_spent}
    if job == "mllib":
        from pyspark.ml.clustering import KMeans
        from pyspark.ml.feature import VectorAssembler

        vec = VectorAssembler(inputCols=list(features), outputCol="features").transform(df).select("features").cache()
        try:
            km = KMeans(k=K, maxIter=3 if tiny else 20, tol=mllib_tol, seed=seed_base).fit(vec)
            it = km.summary.numIter
            centers = np.array([np.asarray(c) for c in km.clusterCenters()])
        finally:
            vec.unpersist()
        return {"centers": centers, "passes": f"~{1 + 3 + it + 1}", "epsilon_spent": float("nan"),
                "source": f"approx.: cache 1 + k-means|| init ~3 + {it} iterations + 1 cost"}
    raise ValueError(job)


def measure_fit(job: str, spark, jvm, df, domain, features, n: int, args) -> tuple[dict, np.ndarray | None, bh.PeakMemory]:
    """One job of the fit mode, timed, its peak memory measured: (row, released centers or None, memory)."""
    row = {"n": n, "d": domain.dim, "job": job, "error": "", "cost_ratio_vs_true_means": "", **dict.fromkeys(EXTRAS, "")}
    timer = None
    if args.job_timeout:
        timer = threading.Timer(args.job_timeout, spark.sparkContext.cancelAllJobs)
        timer.daemon = True
    out = None
    with bh.PeakMemory(jvm) as mem:
        t0 = time.perf_counter()
        if timer is not None:
            timer.start()
        try:
            out = run_job(job, spark, df, domain, features, args.seed, tiny=args.quick, mllib_tol=args.mllib_tol)
        except Exception as exc:
            row["error"] = repr(exc)[:300]
        finally:
            if timer is not None:
                timer.cancel()
        wall = time.perf_counter() - t0
    if row["error"] and args.job_timeout and wall >= args.job_timeout:
        row["error"] = f"timed out: Spark jobs cancelled after {args.job_timeout:.0f} s"
    out = out or {"centers": None, "passes": "", "source": "", "epsilon_spent": float("nan")}
    row.update(wall_s=wall, spark_passes=out["passes"], passes_source=out["source"],
               py_peak_mb=mem.py_peak_mb, jvm_peak_mb=mem.jvm_peak_mb, us_per_point=wall / n * 1e6,
               epsilon_spent=out["epsilon_spent"], **{k: out[k] for k in EXTRAS if k in out})
    return row, out["centers"], mem


# ---------------------------------------------------------------------------
# Whole mode: processes


def family_config(job: str, table: str, d: int, out_dir: str, tiny: bool = False) -> dict:
    """The ``dpspark run`` config of one family on the benchmark table: no ledger, report on."""
    algorithm = {"name": job, "objective": "kmeans", "k": K}
    delta = DELTA
    if job == "maxcover":
        algorithm.update(candidate_count=200 if tiny else 1000)  # its default candidates for d (grid_or_private / tree)
    elif job == "dplloyd":
        algorithm.update(variant="allocation_nk", iterations=3 if tiny else 12)
        delta = 0.0  # pure epsilon-DP: the family refuses a configured delta
    elif job == "ldp":
        algorithm.update(mode="simulate")
        delta = 0.0
    elif job != "auto":
        raise ValueError(job)
    return {
        "input": {"path": table, "format": "delta", "features": [f"x{j}" for j in range(d)]},
        "domain": {"lower": [-BOX] * d, "upper": [BOX] * d},
        "privacy": {"epsilon": EPS, "delta": delta, "ledger": None},
        "algorithm": algorithm,
        "output": {"path": out_dir, "report": True},
        "spark": {"master": MASTER, "app_name": f"bench-scale-{job}", "conf": dict(SPARK_CONF)},
    }


def whole_sequence(jobs: list[str], reps: int) -> list[str]:
    """Per cell: each family's process followed by an MLlib process (alternating), ``reps`` times."""
    families = [j for j in jobs if j != "mllib"]
    seq: list[str] = []
    for _ in range(reps):
        if not families:
            seq.append("mllib")
        for fam in families:
            seq.append(fam)
            if "mllib" in jobs:
                seq.append("mllib")
    return seq


def pair_with_mllib(rows: list[dict]) -> None:
    """Each family row of one cell (in run order) against the mean of the MLlib runs right before and after it."""
    for i, r in enumerate(rows):
        if r["job"] == "mllib":
            continue
        nbrs = [rows[j] for j in (i - 1, i + 1)
                if 0 <= j < len(rows) and rows[j]["job"] == "mllib" and not rows[j]["error"]]
        if not nbrs:
            continue
        r["mllib_whole_s"] = float(np.mean([b["wall_whole_s"] for b in nbrs]))
        r["ratio_whole"] = r["wall_whole_s"] / r["mllib_whole_s"] if not r["error"] else float("nan")
        fits = [b["fit_s"] for b in nbrs if np.isfinite(b.get("fit_s", float("nan")))]
        if fits and np.isfinite(r.get("fit_s", float("nan"))):
            r["mllib_fit_s"] = float(np.mean(fits))
            r["ratio_fit"] = r["fit_s"] / r["mllib_fit_s"]


def whole_job(spark, job: str, seq: int, n: int, d: int, table: str, workdir: Path, args) -> tuple[dict, np.ndarray | None]:
    """One process of the whole mode: (row, released centers in original units or None)."""
    jobdir = workdir / f"job_{seq:02d}_{job}"
    jobdir.mkdir(parents=True)
    outdir = jobdir / "out"
    row = {"n": n, "d": d, "job": job, "seq": seq, "error": "", "cost_ratio_vs_true_means": "", "steps": "",
           "fit_s": float("nan"), "outside_fit_s": float("nan"), "mllib_whole_s": float("nan"),
           "ratio_whole": float("nan"), "mllib_fit_s": float("nan"), "ratio_fit": float("nan"),
           "epsilon_spent": float("nan"), "spark_passes": "", "passes_source": "", **dict.fromkeys(EXTRAS, "")}
    if job == "mllib":
        cmd = bh.mllib_command(table, str(outdir), K, max_iter=3 if args.quick else 20, tol=args.mllib_tol,
                               seed=args.seed, fmt=args.mllib_format)
    else:
        import yaml

        cfg_path = jobdir / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(family_config(job, table, d, str(outdir), tiny=args.quick), sort_keys=False))
        cmd = bh.dpspark_command("run", "--config", cfg_path, "--json")
    operator_dir = jobdir / "operator"  # the child's operator log: its pass counts
    proc = bh.run_process(cmd, jobdir, bh.child_env(None if job == "mllib" else str(operator_dir)), args.job_timeout)
    row.update(wall_whole_s=proc["wall"], exit_code=proc["exit_code"], py_peak_mb=proc["py_peak_mb"],
               jvm_peak_mb=proc["jvm_peak_mb"], tree_peak_mb=proc["tree_peak_mb"], us_per_point=proc["wall"] / n * 1e6)
    centers = None
    if proc["timed_out"]:
        row["error"] = f"timed out: process group stopped after {args.job_timeout:.0f} s"
    elif proc["exit_code"] != 0:
        row["error"] = f"exit {proc['exit_code']}: {bh.exit_reason(proc)}"[:300]
    try:
        if job == "mllib":
            steps = bh.parse_steps(proc["stderr"], "fit")
            if "FIT" in steps:
                row["fit_s"] = steps["FIT"]
            result = json.loads((outdir / "result.json").read_text()) if not row["error"] else {}
            if result:
                it = result.get("iterations")
                row.update(spark_passes=f"~{1 + 3 + it + 1}" if it is not None else "",
                           passes_source=f"approx.: cache 1 + k-means|| init ~3 + {it} iterations + 1 cost")
                centers = np.asarray(result["centers"], dtype=np.float64)
        else:
            steps = bh.parse_steps(proc["stderr"], f"{job}: fit")
            if "FIT" in steps:
                row["fit_s"] = steps["FIT"]
            if not row["error"]:
                outcome = bh.last_json_line(proc["stdout"])
                row["epsilon_spent"] = float(outcome.get("epsilon_spent", float("nan")))
                summary = json.loads((outdir / "summary.json").read_text())
                centers = np.asarray(summary["centers"], dtype=np.float64)
                params = summary.get("parameters") or {}
                operational = bh.read_operational(spark, str(operator_dir), outcome.get("run_id"),
                                               outcome.get("attempt") or 1)
                row["route"] = params.get("chosen", "") if job == "auto" else ""
                if operational.get("spark_passes") is not None:
                    row.update(spark_passes=operational["spark_passes"], passes_source="operator record")
                    if job == "maxcover" or row["route"] == "maxcover":
                        row.update(maxcover_extras(operational))
                    elif operational.get("passes_by_kind"):
                        row["passes_source"] += " " + json.dumps(operational["passes_by_kind"], sort_keys=True)
                elif job == "dplloyd":
                    row.update(spark_passes=params.get("iterations", ""), passes_source="code path (1 per iteration)")
                elif job == "ldp":
                    row.update(spark_passes=3, passes_source="code path (3 rounds)")
        if steps:
            steps = {**steps, **bh.process_phases(row["wall_whole_s"], steps, proc.get("first_mark"), proc.get("last_mark"))}
            row["steps"] = json.dumps(steps, sort_keys=False)
        if np.isfinite(row["fit_s"]):
            row["outside_fit_s"] = row["wall_whole_s"] - row["fit_s"]
    except Exception as exc:  # a missing output is the row's error, not the benchmark's end
        row["error"] = row["error"] or f"reading the outputs: {exc!r}"[:300]
        centers = None
    if not args.keep_outputs:
        shutil.rmtree(jobdir, ignore_errors=True)
    return row, centers


def warm_up_whole(spark, args, workdir: Path) -> None:
    """One small dpspark run and one MLlib process, not measured (JARs, Python modules in the OS cache)."""
    path = str(workdir / "warm")
    make_table(spark, path, 5000, 2, args.seed + 99, 2)
    fam = next((j for j in args.jobs if j != "mllib"), None)
    for i, job in enumerate([j for j in (fam, "mllib") if j]):
        row, _ = whole_job(spark, job, 90 + i, 5000, 2, path, workdir / "warm_jobs", args)
        if row["error"]:
            log.warning("warm-up %s failed: %s", job, row["error"])
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------
# Tables


def _read_rows(path: Path) -> list[dict]:
    rows = bh.read_csv(path, ints=("n", "d", "seq"), floats=NUMERIC)
    for r in rows:
        for key in ("error", *EXTRAS, "steps"):
            r[key] = r.get(key) or ""
    return rows


def _job_order(job: str) -> int:
    return JOBS.index(job) if job in JOBS else 99


def _merge(previous: list[dict], new: list[dict]) -> list[dict]:
    """``previous`` rows not re-measured in ``new``, then ``new``; ordered by d, n, job."""
    seen = {(r["n"], r["d"], r["job"]) for r in new}
    rows = [r for r in previous if (r["n"], r["d"], r["job"]) not in seen] + list(new)
    return sorted(rows, key=lambda r: (r["d"], r["n"], _job_order(r["job"])))


def _merge_whole(previous: list[dict], new: list[dict], add: bool = False) -> list[dict]:
    """Whole mode: a re-measured (n, d) cell replaces every earlier row of that cell (ratios pair within a cell).

    ``add`` (``--add-to-cells``): the earlier rows stay and the new ones follow them in run order (their
    ``seq`` continues the cell's); each new family row keeps its ratio to the MLlib runs of its own
    session, paired before the merge.
    """
    if add:
        last = {}
        for r in previous:
            key = (r["n"], r["d"])
            last[key] = max(last.get(key, -1), int(r.get("seq") or 0))
        new = [dict(r, seq=last.get((r["n"], r["d"]), -1) + 1 + int(r.get("seq") or 0)) for r in new]
        rows = list(previous) + new
    else:
        cells = {(r["n"], r["d"]) for r in new}
        rows = [r for r in previous if (r["n"], r["d"]) not in cells] + list(new)
    return sorted(rows, key=lambda r: (r["d"], r["n"], int(r.get("seq") or 0)))


def fit_slope(ns, ts) -> float:
    ns, ts = np.asarray(ns, float), np.asarray(ts, float)
    ok = np.isfinite(ts) & (ts > 0)
    if ok.sum() < 2 or len(set(ns[ok])) < 2:
        return float("nan")
    return float(np.polyfit(np.log10(ns[ok]), np.log10(ts[ok]), 1)[0])


def _series(results, d: int, job: str, key: str) -> tuple[list, list]:
    """(n values, the median of ``key`` at each) of one job at dimension d, over the rows without an error."""
    by_n: dict[int, list[float]] = {}
    for r in results:
        if r["d"] == d and r["job"] == job and not r["error"]:
            by_n.setdefault(r["n"], []).append(float(r[key]))
    ns = sorted(by_n)
    return ns, [float(np.median(by_n[n])) for n in ns]


def _plot(results, key: str, ylabel: str, path: Path) -> dict:
    plt = bh.pyplot()
    ds = sorted({r["d"] for r in results})
    fig, axes = plt.subplots(1, len(ds), figsize=(6 * len(ds), 4.5), squeeze=False)
    slopes = {}
    for ax, d in zip(axes[0], ds):
        for job in [j for j in JOBS if any(r["job"] == j for r in results)]:
            ns, ts = _series(results, d, job, key)
            if not ns:
                continue
            s = fit_slope(ns, ts)
            slopes[(d, job)] = s
            ax.plot(ns, ts, marker="o", label=f"{job} (slope {s:.2f})" if np.isfinite(s) else job)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (points)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"d = {d}, k = {K}, {MASTER}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    bh.save_figure(fig, path)
    return slopes


def _fallback_cell(r) -> str:
    text = r.get("fallback_thresholds") or "-"
    jobs = r.get("histogram_jobs")
    return text + (f" ({jobs} histogram jobs)" if jobs not in ("", None, 0, "0") else "")


def _passes_cell(r) -> str:
    p = r.get("spark_passes", "")
    limit = r.get("passes_limit", "")
    if limit in ("", None):
        return str(p)
    try:
        over = int(p) > int(limit)
    except (TypeError, ValueError):
        over = False
    return f"{p} / {limit}" + (" OVER" if over else "")


def _job_cell(r, width: int) -> str:
    return r["job"] + (f" ({r['route']})" if r.get("route") else "") + (f" (FAILED: {r['error'][:width]})" if r["error"] else "")


def _histogram_cell(r):
    return r.get("max_histogram") if r.get("max_histogram") not in ("", None) else "-"


def _head(title: str, args, elapsed: float, m: dict, machine: str, description: str) -> list[str]:
    """A report's title, commands, machine and description paragraphs (and --note)."""
    commands = "; then ".join(f"`{c}`" for c in getattr(args, "commands", [args.command]))
    return [title, "", f"Command: {commands}; total {elapsed:.0f} s (last command). Machine: {m['nproc']} CPUs "
            f"({m['cpu']}), " + machine, "", description, *(["", args.note] if args.note else []), ""]


def write_outputs(results, args, out_dir: Path, py_lifetime_mb: float, jvm_pid, elapsed: float):
    out_dir.mkdir(parents=True, exist_ok=True)
    bh.write_csv(out_dir / "scale.csv", results, CSV_COLUMNS)
    slopes = _plot(results, "wall_s", "wall time of fit (s)", out_dir / "time_vs_n.png")

    m = bh.machine_description()
    md = _head("# Scaling benchmark: dpspark families vs Spark MLlib KMeans", args, elapsed, m,
               f"{m['memory_gb']} GB, Spark master `{MASTER}`, driver memory {getattr(args, 'driver_memory', '?')}, "
               f"conf {SPARK_CONF}, one SparkSession per command. Load average {os.getloadavg()[0]:.1f} at the end "
               f"(one repetition per cell).",
               f"Data: Gaussian mixture of {K} components (means uniform in [-{0.6 * BOX:g}, {0.6 * BOX:g}]^d, sigma {SIGMA}), "
              f"public box [-{BOX:g}, {BOX:g}]^d, a Delta table of {args.partitions} files per (n, d). epsilon = {EPS:g} "
              f"(maxcover and auto delta = {DELTA:g}). Wall time = the whole fit from the Delta table (MLlib: assemble + cache + fit, "
              f"tol {args.mllib_tol:g}). "
              f"Memory: peak RSS from the OS (Python driver VmHWM, JVM VmHWM; both reset per job via clear_refs). "
              f"Python driver lifetime ru_maxrss: {py_lifetime_mb:.0f} MB. JVM pid found: {jvm_pid is not None}.")
    header = ["n", "d", "job", "wall (s)", "Spark passes (/ limit)", "fallback thresholds", "largest histogram",
              "us / point", "Python peak (MB)", "JVM peak (MB)", "cost / cost(true means)"]
    rows = [[f"{r['n']:.0e}", r["d"], _job_cell(r, 60), f"{r['wall_s']:.1f}", _passes_cell(r), _fallback_cell(r),
             _histogram_cell(r), f"{r['us_per_point']:.2f}", f"{r['py_peak_mb']:.0f}", f"{r['jvm_peak_mb']:.0f}",
             "-" if r["cost_ratio_vs_true_means"] in ("", None) else f"{float(r['cost_ratio_vs_true_means']):.3g}"]
            for r in results]
    md += [bh.markdown_table(header, rows, ["r", "r", "l", "r", "r", "l", "r", "r", "r", "r", "r"]), "",
           "Fitted slope of log10(wall time) against log10(n) (1 = linear; below 1 = fixed overheads dominate):", "",
           bh.markdown_table(["d", "job", "slope"], [[d, j, f"{s:.2f}"] for (d, j), s in sorted(slopes.items())],
                             ["r", "l", "r"]), "", "![time vs n](time_vs_n.png)", "",
           "Spark passes: maxcover (and auto) from the fit's `operational` dict (NON-PRIVATE); the limit r + 1 "
              "(+ 1 with private candidates), r = its thresholds (each read by at most one pass), `OVER` when per-pick "
              "fallback passes exceed it; dplloyd and ldp from their code paths "
              "(one aggregation pass per Lloyd iteration; one pass per LDP round); MLlib approximate (`~`, see the "
              "script's docstring). cost / cost(true means): k-means cost on a sample of up to 2e5 rows in the unit "
           "space of the public box, relative to the mixture's true means (utility sanity check, not timed)."]
    (out_dir / "results.md").write_text("\n".join(md) + "\n")
    (out_dir / "meta.json").write_text(json.dumps({"command": args.command, "commands": getattr(args, "commands", [args.command]),
                                                   "machine": m, "elapsed_s": elapsed,
                                                   "slopes": {f"d={d} {j}": s for (d, j), s in slopes.items()},
                                                   "py_lifetime_maxrss_mb": py_lifetime_mb}, indent=1))


def _step_cells(steps_json: str) -> list[str]:
    try:
        steps = json.loads(steps_json) if steps_json else {}
    except ValueError:
        steps = {}
    cells = []
    for _, names in STEP_COLUMNS:
        vals = [steps[nm] for nm in names if nm in steps]
        cells.append(_f(sum(vals)) if vals else "-")
    other = {k: v for k, v in steps.items() if k not in KNOWN_STEPS and k not in ("START", "END", "OUTSIDE")}
    cells.append(", ".join(f"{k} {v:.1f}" for k, v in other.items()) or "-")
    return [_f(steps.get("START", "")), *cells, _f(steps.get("END", "")), _f(steps.get("OUTSIDE", ""))]


def write_whole_outputs(results, args, out_dir: Path, elapsed: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    bh.write_csv(out_dir / "whole.csv", results, WHOLE_COLUMNS)
    slopes = _plot(results, "wall_whole_s", "wall time of the whole process (s)", out_dir / "whole_time_vs_n.png")
    fit_rows = [r for r in results if np.isfinite(float(r.get("fit_s", float("nan"))))]
    fit_slopes = {(d, job): fit_slope(*series) for d in sorted({r["d"] for r in fit_rows}) for job in JOBS
                  if len((series := _series(fit_rows, d, job, "fit_s"))[0]) >= 2}

    m = bh.machine_description()
    md = _head("# Whole processes: `dpspark run` of each family vs a plain PySpark MLlib KMeans job", args, elapsed, m,
               f"{m['memory_gb']} GB. Every job a fresh process and JVM: Spark master `{MASTER}`, driver memory "
               f"{os.environ.get('DPSPARK_DRIVER_MEMORY', '4g')} ($DPSPARK_DRIVER_MEMORY), conf {SPARK_CONF}. "
               f"Load average {os.getloadavg()[0]:.1f} at the end.",
               f"Per (n, d) the processes alternate: each family's `dpspark run --config <yaml> --json` (no ledger; centers/, "
              f"runs/, report.png, summary.json written to a temporary directory), then `scripts/mllib_job.py` "
              f"(read the Delta table, VectorAssembler, KMeans(k={K}, maxIter={3 if args.quick else 20}, tol={args.mllib_tol:g}), "
              f"centers written as a {args.mllib_format} table); {args.reps} round(s). Data as in results.md "
              f"({args.partitions} files per table). \"MLlib whole\" = the mean of the MLlib runs right before and after "
              f"the family's run. Where the seconds go: the top-level steps of each child's log (dpspark's runner and "
              f"command line; mllib_job logs its own steps in the same format), `start` = process start to the first "
              f"step (interpreter, imports, config), `end` = the last step done to the exit, both timed on the arrival "
              f"of the child's log lines, `between steps` = the rest. Peaks: VmHWM of the child's Python process "
              f"and of its JVM, and the summed RSS of the whole process tree, sampled every 0.5 s.")
    header = ["n", "d", "job", "whole (s)", "fit (s)", "MLlib whole (s)", "whole / MLlib whole", "fit / MLlib fit",
              "Spark passes (/ limit)", "fallback thresholds", "largest histogram", "Python peak (MB)",
              "JVM peak (MB)", "tree peak (MB)", "cost / cost(true means)"]
    rows = []
    for r in results:
        ratio = _f(r.get("ratio_whole"), "{:.2f}x")
        if r["job"] != "mllib" and np.isfinite(float(r.get("ratio_whole", float("nan")))):
            ratio += "" if float(r["ratio_whole"]) <= 1.0 else " (over 1.0)"
        family = r["job"] != "mllib"
        rows.append([f"{r['n']:.0e}", r["d"], _job_cell(r, 80), _f(r["wall_whole_s"]), _f(r.get("fit_s")),
                     _f(r.get("mllib_whole_s")) if family else "", ratio if family else "",
                     _f(r.get("ratio_fit"), "{:.2f}x") if family else "", _passes_cell(r), _fallback_cell(r),
                     _histogram_cell(r), _f(r.get("py_peak_mb"), "{:.0f}"), _f(r.get("jvm_peak_mb"), "{:.0f}"),
                     _f(r.get("tree_peak_mb"), "{:.0f}"), _f(r["cost_ratio_vs_true_means"], "{:.3g}")])
    md += [bh.markdown_table(header, rows, ["r", "r", "l"] + ["r"] * 6 + ["l"] + ["r"] * 5), "",
           "Where the seconds go (s), per process:", ""]
    step_header = (["n", "d", "job", "whole", "start (to 1st step)"] + [name for name, _ in STEP_COLUMNS]
                   + ["other steps", "end (after last step)", "between steps"])
    step_rows = [[f"{r['n']:.0e}", r["d"], r["job"], _f(r["wall_whole_s"]), *_step_cells(r.get("steps", ""))]
                 for r in results]
    keys = sorted(set(slopes) | set(fit_slopes))
    md += [bh.markdown_table(step_header, step_rows, ["r", "r", "l"] + ["r"] * (len(step_header) - 3)), "",
           "Fitted slope of log10(time) against log10(n), whole process and fit alone (target: at most 1.0):", "",
           bh.markdown_table(["d", "job", "slope (whole)", "slope (fit)"],
                             [[d, j, _f(slopes.get((d, j)), "{:.2f}"), _f(fit_slopes.get((d, j)), "{:.2f}")] for d, j in keys],
                             ["r", "l", "r", "r"]), "", "![whole process time vs n](whole_time_vs_n.png)", "",
           "Spark passes: dpspark's from the run's operator record ($DPSPARK_OPERATOR_LOG, NON-PRIVATE), the limit "
              "r + 1 (+ 1 with private candidates, + 1 more hash-first from d = 4) for maxcover and auto's maxcover route; MLlib approximate (`~`). "
           "cost / cost(true means) as in results.md (not timed)."]
    (out_dir / "whole.md").write_text("\n".join(md) + "\n")
    (out_dir / "whole_meta.json").write_text(json.dumps({
        "commands": getattr(args, "commands", [args.command]), "machine": m, "elapsed_s": elapsed,
        "driver_memory": os.environ.get("DPSPARK_DRIVER_MEMORY", "4g"),
        "slopes_whole": {f"d={d} {j}": s for (d, j), s in slopes.items()},
        "slopes_fit": {f"d={d} {j}": s for (d, j), s in fit_slopes.items()}}, indent=1))


# ---------------------------------------------------------------------------


def _progress_head(row: dict) -> str:
    return f"n={row['n']:.0e} d={row['d']} {row['job']}" + (f" {row['route']}" if row["route"] else "")


def _progress_passes(row: dict) -> str:
    extra = f" (limit {row['passes_limit']})" if row["passes_limit"] != "" else ""
    extra += f", fallback thresholds {row['fallback_thresholds']}" if row["fallback_thresholds"] else ""
    return f"{row['spark_passes']}{extra}"


def _previous(args, csv_name: str, meta_name: str):
    previous, commands = [], [args.command]
    if args.append and (args.out / csv_name).exists():
        previous = _read_rows(args.out / csv_name)
        meta_path = args.out / meta_name
        if meta_path.exists():
            old_meta = json.loads(meta_path.read_text())
            commands = list(old_meta.get("commands") or [old_meta.get("command", "?")]) + [args.command]
    return previous, commands


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke: n in {2e4, 5e4}, d = 2, one job per family, tiny "
                                                         "(with --whole: n = 2e4, d = 2, auto and MLlib)")
    ap.add_argument("--whole", action="store_true", help="time whole processes: `dpspark run` per family, alternating "
                                                         "with scripts/mllib_job.py (issue 15)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--n", nargs="*", type=float, default=None)
    ap.add_argument("--d", nargs="*", type=int, default=None)
    ap.add_argument("--jobs", nargs="*", default=None, choices=JOBS)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--reps", type=int, default=1, help="--whole: rounds per cell (each family, then MLlib)")
    ap.add_argument("--mllib-tol", type=float, default=None,
                    help=f"MLlib KMeans tol (default {MLLIB_TOL['fit']:g} in the fit mode, {MLLIB_TOL['whole']:g} with --whole)")
    ap.add_argument("--mllib-format", default="delta", choices=("delta", "parquet", "json"),
                    help="--whole: the MLlib job's centers table format")
    ap.add_argument("--bench-driver-memory", default="2g",
                    help="--whole: driver memory of this process's own session (it only writes the tables)")
    ap.add_argument("--keep-outputs", action="store_true",
                    help="--whole: keep each process's config, logs and outputs (the tables are still removed)")
    ap.add_argument("--no-utility", action="store_true", help="skip the cost sanity check")
    ap.add_argument("--note", default="", help="a sentence added to the report (e.g. what was cut)")
    ap.add_argument("--append", action="store_true",
                    help="merge with the table already in --out (fit mode: rows of the same n, d, job are replaced; "
                         "--whole: the re-measured (n, d) cells)")
    ap.add_argument("--add-to-cells", action="store_true",
                    help="--whole with --append: keep the cells' earlier rows and add the new ones after them "
                         "(a family measured in a later session, next to its own MLlib runs)")
    ap.add_argument("--job-timeout", type=float, default=None,
                    help="fit mode: cancel a job's Spark jobs after this many seconds; --whole: stop the process "
                         "(SIGTERM, SIGKILL 60 s later); the row records the timeout")
    args = ap.parse_args(argv)
    args.command = "python scripts/bench_scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    mode = "whole" if args.whole else "fit"
    if args.add_to_cells and not (args.whole and args.append):
        ap.error("--add-to-cells needs --whole and --append")
    if args.mllib_tol is None:
        args.mllib_tol = MLLIB_TOL[mode]
    if args.quick:
        args.n = args.n or ([2e4] if args.whole else [2e4, 5e4])
        args.d = args.d or [2]
        args.jobs = args.jobs or (WHOLE_QUICK_JOBS if args.whole else QUICK_JOBS)
        args.note = args.note or ("--quick: smoke run, not a measurement: dplloyd 3 iterations, MLlib maxIter 3, "
                                  "maxcover 200 candidates, no warm-up, no utility check.")
    args.n = [int(v) for v in (args.n or ([1e6, 1e7] if args.whole else [1e5, 1e6, 1e7]))]
    args.d = args.d or ([2, 10, 50] if args.whole else [2, 10])
    args.jobs = args.jobs or JOBS
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("dpspark").setLevel(logging.WARNING)
    return whole_main(args) if args.whole else fit_main(args)


def _cells(spark, args, workdir: Path):
    """Each (n, d) of the grid: (n, d, public domain, path, means) of the mixture written as a Delta table,
    removed when the caller asks for the next."""
    for d in args.d:
        domain = bc.domain([-BOX] * d, [BOX] * d)
        for n in args.n:
            path = str(workdir / f"points_{n}_{d}")
            means, seconds = bh.timed(lambda: make_table(spark, path, n, d, args.seed, args.partitions))
            print(f"bench_scale: wrote n={n:.0e} d={d} in {seconds:.1f} s", flush=True)
            yield n, d, domain, path, means
            shutil.rmtree(path, ignore_errors=True)


def fit_main(args) -> int:
    t_start = time.perf_counter()
    previous, args.commands = _previous(args, "scale.csv", "meta.json")
    workdir = Path(tempfile.mkdtemp(prefix="dpspark_bench_scale_"))
    results = []
    with bh.session("dpspark-bench-scale") as spark:
        args.driver_memory = spark.sparkContext.getConf().get("spark.driver.memory", "?")
        jvm = bh.find_jvm(os.getpid())
        try:
            # Warm-up (JIT, Python workers, Delta log, MLlib classes): not measured (skipped by --quick).
            if not args.quick:
                wpath = str(workdir / "warm")
                make_table(spark, wpath, 5000, 2, args.seed + 99, 2)
                wdf = spark.read.format("delta").load(wpath)
                wdom = bc.domain([-BOX] * 2, [BOX] * 2)
                for job in args.jobs:
                    try:
                        run_job(job, spark, wdf, wdom, ("x0", "x1"), 1, mllib_tol=args.mllib_tol)
                    except Exception as exc:  # the measured run reports it
                        log.warning("warm-up %s failed: %r", job, exc)
            for n, d, domain, path, means in _cells(spark, args, workdir):
                features = tuple(f"x{j}" for j in range(d))
                df = spark.read.format("delta").load(path)
                sample = None
                for job in args.jobs:
                    row, centers, mem = measure_fit(job, spark, jvm, df, domain, features, n, args)
                    if centers is not None and not (args.no_utility or args.quick):
                        if sample is None:
                            sample = utility_sample(df, domain, n)
                            base = bc.kmeans_cost(sample, domain.clip_to_unit(means))
                        row["cost_ratio_vs_true_means"] = bc.kmeans_cost(sample, domain.clip_to_unit(centers)) / base
                    results.append(row)
                    print(f"  {_progress_head(row)}: {row['wall_s']:.1f} s, "
                          f"passes {_progress_passes(row)}, py {mem.py_peak_mb:.0f} MB, "
                          f"jvm {mem.jvm_peak_mb:.0f} MB {row['error']}", flush=True)
                # Partial report after every (n, d): a cut-short run still leaves its tables.
                write_outputs(_merge(previous, results), args, args.out,
                              bh.lifetime_peak_mb(), jvm, time.perf_counter() - t_start)
        finally:
            py_lifetime_mb = bh.lifetime_peak_mb()
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    write_outputs(_merge(previous, results), args, args.out, py_lifetime_mb, jvm, elapsed)
    print(f"bench_scale: wrote {args.out}/results.md and scale.csv in {elapsed:.0f} s")
    return 0 if all(not r["error"] for r in results) else 1


def whole_main(args) -> int:
    t_start = time.perf_counter()
    previous, args.commands = _previous(args, "whole.csv", "whole_meta.json")
    workdir = Path(tempfile.mkdtemp(prefix="dpspark_bench_scale_whole_"))
    results = []
    # This session only writes the tables and reads the children's small outputs: little memory.
    with bh.session("dpspark-bench-scale-tables", conf={**SPARK_CONF, "spark.driver.memory": args.bench_driver_memory}) as spark:
        try:
            if not args.quick:
                warm_up_whole(spark, args, workdir)
            for n, d, domain, path, means in _cells(spark, args, workdir):
                sample = base = None
                if not (args.no_utility or args.quick):
                    sample = utility_sample(spark.read.format("delta").load(path), domain, n)
                    base = bc.kmeans_cost(sample, domain.clip_to_unit(means))
                cell = []
                for seq, job in enumerate(whole_sequence(args.jobs, args.reps)):
                    row, centers = whole_job(spark, job, seq, n, d, path, workdir / f"cell_{n}_{d}", args)
                    if centers is not None and sample is not None:
                        row["cost_ratio_vs_true_means"] = bc.kmeans_cost(sample, domain.clip_to_unit(centers)) / base
                    cell.append(row)
                    print(f"  {_progress_head(row)}: whole "
                          f"{row['wall_whole_s']:.1f} s, fit {_f(row['fit_s'])} s, passes {_progress_passes(row)}, "
                          f"py {_f(row['py_peak_mb'], '{:.0f}')} MB, jvm {_f(row['jvm_peak_mb'], '{:.0f}')} MB, "
                          f"tree {_f(row['tree_peak_mb'], '{:.0f}')} MB {row['error']}", flush=True)
                pair_with_mllib(cell)
                for r in cell:
                    if r["job"] != "mllib" and np.isfinite(r["ratio_whole"]):
                        print(f"  n={n:.0e} d={d} {r['job']}: {r['ratio_whole']:.2f}x MLlib's whole process "
                              f"({r['wall_whole_s']:.1f} s vs {r['mllib_whole_s']:.1f} s)", flush=True)
                results.extend(cell)
                write_whole_outputs(_merge_whole(previous, results, args.add_to_cells), args, args.out, time.perf_counter() - t_start)
        finally:
            if args.keep_outputs:
                print(f"bench_scale: kept every process's config, logs and outputs under {workdir}", flush=True)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    write_whole_outputs(_merge_whole(previous, results, args.add_to_cells), args, args.out, elapsed)
    print(f"bench_scale: wrote {args.out}/whole.md and whole.csv in {elapsed:.0f} s")
    return 0 if all(not r["error"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
