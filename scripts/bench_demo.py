#!/usr/bin/env python
"""The demo's whole run next to a plain PySpark MLlib job (issue 15, "Small jobs"), in one session.

Per repetition (default 3), in rotating order (dpspark first, second or last, so that a slow drift
of the machine's load falls on every job):

(a) ``dpspark run --config conf/demo.yaml`` as ``scripts/demo.sh`` runs it, on the 20,000-row demo
    table, with a FRESH ledger and output directory: ``dpspark ledger set-budget`` first (epsilon 10,
    delta 1e-5, as the demo; its own process, timed and reported but not part of the run's time),
    then the run, timed from process start to exit;
(b) a plain PySpark script (``MLLIB_JOB`` below, written to a temporary file) in a fresh JVM that
    reads the same Delta table, assembles the features, fits
    ``pyspark.ml.clustering.KMeans(k=5, maxIter=20, tol=0)`` and writes its centers as a Delta table,
    timed from process start to exit. It starts Spark with the project's session builder
    (``dpspark.session.build_session``: the same local settings and the same Delta JARs from
    $DPSPARK_IVY_DIR, master ``local[*]`` like ``dpspark run``); nothing else of dpspark. This is
    the target's baseline: a plain script, the JVM's default options;
(c) the same MLlib script with the JVM options ``dpspark run`` chooses for a small input
    ($DPSPARK_SMALL_JOB=1: ``dpspark.session.SMALL_JOB_JAVA_OPTIONS``), to show how much of the
    ratio those options make. ``--no-small-job-baseline`` leaves it out.

Reported (``--out``, default bench/results/demo): results.md (medians, the ratio of the medians and
each repetition's ratio, target <= 1.5x; dpspark's per-step breakdown from its run record, the
timings of its operator record (``$DPSPARK_OPERATOR_LOG``), plus the two steps logged after that record is
written, and "outside the steps" = the process's wall time minus the steps: Python start, imports,
process exit), results.json with every number, and the logs of every process.

    DPSPARK_IVY_DIR=.cache/ivy .venv/bin/python scripts/bench_demo.py            # 3 repetitions
    .venv/bin/python scripts/bench_demo.py --reps 5 --out /tmp/demo_bench
    # before/after in one session: another checkout's dpspark/ (e.g. `git archive <commit> dpspark | tar -x -C /tmp/old`)
    .venv/bin/python scripts/bench_demo.py --also before=/tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_harness as bh  # noqa: E402

ROOT = bh.ROOT
PYTHON = str(ROOT / ".venv" / "bin" / "python")
DPSPARK = str(ROOT / ".venv" / "bin" / "dpspark")
CONFIG = ROOT / "conf" / "demo.yaml"
TARGET = 1.5

MLLIB_JOB = '''"""bench_demo's baseline: a plain PySpark MLlib job on a Delta table (not private)."""
import json, sys, time
t0 = time.perf_counter()
table, out = sys.argv[1], sys.argv[2]
from dpspark.session import build_session   # the same Spark settings and Delta JARs as dpspark run
from pyspark.ml.clustering import KMeans
from pyspark.ml.feature import VectorAssembler
t1 = time.perf_counter()
spark = build_session(app_name="mllib-kmeans")
t2 = time.perf_counter()
df = spark.read.format("delta").load(table)
vectors = VectorAssembler(inputCols=["x", "y"], outputCol="features").transform(df).select("features")
model = KMeans(k=5, maxIter=20, tol=0.0, seed=1).fit(vectors)
t3 = time.perf_counter()
centers = [[float(v) for v in c] for c in model.clusterCenters()]
rows = [(i, *c) for i, c in enumerate(centers)]
spark.createDataFrame(rows, ["cluster_id", "x", "y"]).coalesce(1).write.format("delta").mode("overwrite").save(out + "/centers")
t4 = time.perf_counter()
steps = {"python imports": t1 - t0, "start Spark session": t2 - t1, "read + fit": t3 - t2, "write centers": t4 - t3}
with open(out + "/result.json", "w") as handle:
    json.dump({"iterations": int(model.summary.numIter), "centers": centers,
               "timings": {k: round(v, 3) for k, v in steps.items()}}, handle)
'''
# The runner's top-level steps, in order (old names kept so that an older checkout can be measured);
# "<algorithm>: fit" goes where FIT is. Anything else in the record is nested inside one of them.
TOP_STEPS = ["start Spark session", "pre-flight checks", "check the Python workers", "write runs table (running)",
             "read input table (schema and version)", "privacy ledger: start", "check the public inputs",
             "check that every input is in", "privacy ledger: earlier attempts", "privacy ledger: charge",
             "wait for the runs table (running)", "privacy ledger: fit started", "FIT", "write centers table", "write report.png",
             "write runs table and summary.json", "privacy ledger: end"]
OUTSIDE = "outside the steps (Python start and imports, exit)"


def _timed(cmd: list[str], log_path: Path, env: dict, timeout: float) -> tuple[float, int, str, str]:
    """One process in the project root, timed start to exit (``bench_harness.run_process``); its output in ``log_path``."""
    with tempfile.TemporaryDirectory(dir=log_path.parent) as run_dir:
        proc = bh.run_process(cmd, Path(run_dir), env, timeout, cwd=ROOT)
    log_path.write_text(f"$ {' '.join(cmd)}\n# exit {proc['exit_code']}, {proc['wall']:.2f} s\n--- stdout\n"
                        f"{proc['stdout']}\n--- stderr\n{proc['stderr']}")
    return proc["wall"], proc["exit_code"], proc["stdout"], proc["stderr"]


def run_dpspark(table: str, work: Path, logs: Path, rep: int, env: dict, timeout: float, label: str = "dpspark",
                code: str | None = None) -> dict:
    """``code``: a directory holding another checkout's ``dpspark/`` package, run instead of this tree's."""
    if code is not None:
        env = dict(env, PYTHONPATH=os.pathsep.join([code] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    name = label.replace(":", "-")  # file names without ":" (label "dpspark:before")
    out = work / f"{name}-{rep}"
    shutil.rmtree(out, ignore_errors=True)
    ledger = out / "ledger"
    setb = [DPSPARK, "ledger", "set-budget", "--ledger", str(ledger), "--input", table, "--epsilon", "10", "--delta", "1e-5"]
    load_before = bh.load_average()
    set_wall, set_code, _, _ = _timed(setb, logs / f"set-budget-{name}-{rep}.log", env, timeout)
    if set_code != 0:
        raise SystemExit(f"bench_demo: set-budget failed (exit {set_code}), see {logs}/set-budget-{name}-{rep}.log")
    cmd = [DPSPARK, "run", "--config", str(CONFIG), "--set", f"input.path={table}", "--set", f"privacy.ledger={ledger}",
           "--set", f"output.path={out}", "--json"]
    load_run = bh.load_average()
    # A run with a ledger shows no step durations on stderr (the analyst's view): they are in the
    # operator record, kept under the deployment's $DPSPARK_OPERATOR_LOG.
    env = dict(env, DPSPARK_OPERATOR_LOG=str(out / "operator"))
    wall, exit_code, stdout, stderr = _timed(cmd, logs / f"{name}-{rep}.log", env, timeout)
    outcome = bh.last_json_line(stdout)
    if exit_code != 0 or outcome.get("status") != "succeeded":
        raise SystemExit(f"bench_demo: dpspark run failed (exit {exit_code}), see {logs}/{name}-{rep}.log")
    return {"rep": rep, "job": label, "wall_s": round(wall, 3), "set_budget_s": round(set_wall, 3),
            "load_before_set_budget": load_before, "load_before": load_run, "run_id": outcome["run_id"],
            "operator_log": str(out / "operator"), "logged_steps": bh.step_durations(stderr)}


def run_mllib(table: str, work: Path, logs: Path, rep: int, env: dict, timeout: float, small_job: bool = False) -> dict:
    job = "mllib-small-job" if small_job else "mllib"
    out = work / f"{job}-{rep}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [PYTHON, str(work / "mllib_job.py"), table, str(out)]
    env = dict(env, DPSPARK_SMALL_JOB="1" if small_job else "0")
    load_run = bh.load_average()
    wall, code, _, _ = _timed(cmd, logs / f"{job}-{rep}.log", env, timeout)
    if code != 0:
        raise SystemExit(f"bench_demo: the MLlib job failed (exit {code}), see {logs}/{job}-{rep}.log")
    result = json.loads((out / "result.json").read_text())
    return {"rep": rep, "job": job, "wall_s": round(wall, 3), "load_before": load_run,
            "iterations": result.get("iterations"), "steps": result.get("timings", {})}


def read_run_records(rows: list[dict]) -> None:
    """Each dpspark run's step timings from its operator record ($DPSPARK_OPERATOR_LOG: NON-PRIVATE
    operational metadata, kept by the deployment, never under output.path)."""
    sys.path.insert(0, str(ROOT))
    from dpspark.runner import read_operator_record

    with bh.session("bench-demo-records", master=None, conf={}) as spark:
        for row in rows:
            rec = read_operator_record(spark, row["run_id"], 1, row["operator_log"])
            row["algorithm"] = rec["algorithm"]
            row["record_steps"] = rec.get("timings", {})
            row["logged_steps"] = {**bh.step_durations("\n".join(rec.get("log", []))), **row["logged_steps"]}


def breakdown(row: dict) -> dict:
    """Top-level steps of one run: the record's, then the ones logged after the record was written."""
    fit = f"{row['algorithm']}: fit"
    steps = {}
    for name, seconds in row["record_steps"].items():
        key = "FIT" if name == fit else name
        if key in TOP_STEPS:
            steps[key] = seconds
    for name, seconds in row["logged_steps"].items():  # written after the record: only in the log
        if name in TOP_STEPS and name not in steps and name != fit:
            steps[name] = seconds
    nested = {k: v for k, v in row["record_steps"].items() if k != fit and k not in TOP_STEPS}
    steps[OUTSIDE] = round(row["wall_s"] - sum(steps.values()), 3)
    return {"steps": steps, "passes": len([k for k in nested if " pass" in k]),
            "passes_s": round(sum(v for k, v in nested.items() if " pass" in k), 3)}


def steps_table(runs: list[dict], med: float, with_passes: bool = False) -> str:
    """The median and every run of each top-level step of ``runs`` (one checkout's), then the whole process."""
    details = [breakdown(r) for r in runs]
    rows = []
    for name in [n for n in TOP_STEPS + [OUTSIDE] if any(n in d["steps"] for d in details)]:
        values = [d["steps"][name] for d in details if name in d["steps"]]
        label = f"{runs[0]['algorithm']}: fit" if name == "FIT" else name
        if name == "FIT" and with_passes:
            label += f" ({details[0]['passes']} Spark passes, median {statistics.median(d['passes_s'] for d in details):.1f} s of them)"
        rows.append([label, f"{statistics.median(values):.2f}", ", ".join(f"{v:.2f}" for v in values)])
    rows.append(["**whole process**", f"**{med:.2f}**", ", ".join(f"{r['wall_s']:.2f}" for r in runs)])
    return bh.markdown_table(["step", "median (s)", "runs (s)"], rows)


def report(rows: list[dict], args, table: str, make_s: float | None) -> str:
    dp = [r for r in rows if r["job"] == "dpspark"]
    ml = [r for r in rows if r["job"] == "mllib"]
    ml1 = [r for r in rows if r["job"] == "mllib-small-job"]
    dp_med, ml_med = statistics.median(r["wall_s"] for r in dp), statistics.median(r["wall_s"] for r in ml)
    ratio = dp_med / ml_med
    per_rep = []
    for d in dp:
        m = next(r for r in ml if r["rep"] == d["rep"])
        m1 = next((r for r in ml1 if r["rep"] == d["rep"]), None)
        order = " -> ".join(r["job"] for r in rows if r["rep"] == d["rep"])
        per_rep.append([d["rep"], order, f"{d['wall_s']:.1f}", f"{m['wall_s']:.1f}", f"{d['wall_s'] / m['wall_s']:.2f}x",
                        "-" if m1 is None else f"{m1['wall_s']:.1f}", "-" if m1 is None else f"{d['wall_s'] / m1['wall_s']:.2f}x",
                        f"{d['set_budget_s']:.1f}",
                        " / ".join(f"{r['load_before']:.1f}" for r in rows if r["rep"] == d["rep"])])
    parts = [
        "# The demo's `dpspark run` next to a plain PySpark MLlib job (issue 15, small jobs)",
        "",
        f"Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {os.cpu_count()} cores by "
        f"`scripts/bench_demo.py --reps {args.reps}`: {args.reps} repetitions, processes in rotating order. Table: the "
        f"20,000-row demo table ({table}{'' if make_s is None else f', built in {make_s:.1f} s'}).",
        "",
        "- **dpspark**: `dpspark run --config conf/demo.yaml --json` (algorithm auto, k = 5, epsilon 1, delta 1e-6) "
        "with a fresh ledger and output directory; `dpspark ledger set-budget` runs first in its own process "
        "(reported, not included).",
        "- **MLlib**: a plain PySpark script (`MLLIB_JOB` in scripts/bench_demo.py: read the Delta table, "
        "VectorAssembler, `KMeans(k=5, maxIter=20, tol=0)`, centers written as a Delta table), a fresh JVM.",
        "- **MLlib, small-job JVM**: the same script with the JVM options `dpspark run` chooses for a small "
        "local input (`-XX:TieredStopAtLevel=1`, `DPSPARK_SMALL_JOB=1`): how much of the ratio those options make.",
        "- All: wall time of the whole process, start to exit; the same Spark settings and Delta JARs "
        "(`dpspark.session.build_session`, master `local[*]`).",
        "",
        bh.markdown_table(["", "median wall (s)", "runs (s)"], [
            ["dpspark run (demo)", f"{dp_med:.1f}", ", ".join(f"{r['wall_s']:.1f}" for r in dp)],
            ["MLlib KMeans job", f"{ml_med:.1f}", ", ".join(f"{r['wall_s']:.1f}" for r in ml)],
            *([["MLlib KMeans job, small-job JVM", f"{statistics.median(r['wall_s'] for r in ml1):.1f}",
                ", ".join(f"{r['wall_s']:.1f}" for r in ml1)]] if ml1 else []),
            ["ledger set-budget (not included)", f"{statistics.median(r['set_budget_s'] for r in dp):.1f}",
             ", ".join(f"{r['set_budget_s']:.1f}" for r in dp)],
        ]),
        "",
        f"**Ratio of the medians: {ratio:.2f}x** (target <= {TARGET}x: {'met' if ratio <= TARGET else 'MISSED'})"
        + (f"; against the MLlib job with the same small-job JVM options: "
           f"{dp_med / statistics.median(r['wall_s'] for r in ml1):.2f}x." if ml1 else "."),
        "",
        bh.markdown_table(["rep", "order", "dpspark (s)", "MLlib (s)", "ratio", "MLlib small-job JVM (s)", "ratio",
                   "set-budget (s)", "1-min load before each"], per_rep),
        "",
        "## Where dpspark's seconds go (median per step over the repetitions)",
        "",
        "From each run's operator record (`$DPSPARK_OPERATOR_LOG`: NON-PRIVATE operational metadata); "
        "the steps after that record is written (`write runs table and summary.json`, `privacy ledger: end`) "
        "from the run's log lines. \"Outside the steps\" is the process's wall time minus the steps: Python "
        "start, imports before the session, process exit.",
        "",
    ]
    parts.append(steps_table(dp, dp_med, with_passes=True))
    for label in sorted({r["job"] for r in rows if r["job"].startswith("dpspark:")}):
        other = [r for r in rows if r["job"] == label]
        med = statistics.median(r["wall_s"] for r in other)
        parts += ["", f"### {label} ({args.also_dirs[label]}), the same session: median {med:.1f} s "
                  f"({med / ml_med:.2f}x the MLlib job; this tree: {dp_med / med:.2f}x of it)", "",
                  "Its own record and log lines (an older runner times fewer steps: the rest is \"outside\"). "
                  "Set-budget: " + ", ".join(f"{r['set_budget_s']:.1f}" for r in other) + " s.", ""]
        parts.append(steps_table(other, med))
    mlsteps = sorted({k for r in ml for k in r["steps"]}, key=lambda k: list(ml[0]["steps"]).index(k) if k in ml[0]["steps"] else 99)
    parts += ["", "MLlib job's own steps (its result.json), median (s): "
              + ", ".join(f"{k} {statistics.median(r['steps'][k] for r in ml if k in r['steps']):.2f}" for k in mlsteps)
              + f"; KMeans iterations: {', '.join(str(r['iterations']) for r in ml)}.", ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "demo"))
    ap.add_argument("--table", default=None, help="an existing demo table (default: build one in a temporary directory)")
    ap.add_argument("--timeout", type=float, default=900.0, help="per process, seconds")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                    help="also run `dpspark run` with another checkout's dpspark/ package in DIR (repeatable)")
    ap.add_argument("--no-small-job-baseline", action="store_true",
                    help="leave out the MLlib job with dpspark's small-job JVM options")
    args = ap.parse_args(argv)
    args.also_dirs = {}
    for item in args.also:
        name, sep, code = item.partition("=")
        if not sep or not (Path(code) / "dpspark" / "__init__.py").is_file():
            raise SystemExit(f"bench_demo: --also expects NAME=DIR with DIR/dpspark/__init__.py, got {item!r}")
        args.also_dirs[f"dpspark:{name}"] = str(Path(code).resolve())
    out = Path(args.out).resolve()
    logs = out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    env = dict(os.environ)
    env.setdefault("DPSPARK_IVY_DIR", str(ROOT / ".cache" / "ivy"))
    env.pop("DPSPARK_LEDGER", None)
    env.pop("DPSPARK_SMALL_JOB", None)  # dpspark run decides from its input
    work = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    (work / "mllib_job.py").write_text(MLLIB_JOB)
    # The baseline imports dpspark.session: from $PYTHONPATH if set (e.g. an older checkout), else this tree.
    env["PYTHONPATH"] = os.pathsep.join(([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []) + [str(ROOT)])
    try:
        make_s = None
        if args.table:
            table = str(Path(args.table).resolve())
        else:
            table = str(work / "demo_points")
            make_s, code, _, _ = _timed([PYTHON, str(ROOT / "scripts" / "make_demo_table.py"), table],
                                        logs / "make_demo_table.log", env, args.timeout)
            if code != 0:
                raise SystemExit(f"bench_demo: make_demo_table.py failed, see {logs}/make_demo_table.log")
        rows = []
        for rep in range(args.reps):
            jobs = [run_dpspark, run_mllib] + ([] if args.no_small_job_baseline else
                                               [lambda *a: run_mllib(*a, small_job=True)])
            for label, code in args.also_dirs.items():
                jobs.append(lambda *a, label=label, code=code: run_dpspark(*a, label=label, code=code))
            jobs = jobs[rep % len(jobs):] + jobs[:rep % len(jobs)]  # rotate: each job first in turn
            for job in jobs:
                row = job(table, work, logs, rep, env, args.timeout)
                rows.append(row)
                print(f"bench_demo: rep {rep} {row['job']}: {row['wall_s']:.1f} s load {row['load_before']:.1f}"
                      + (f" (set-budget {row['set_budget_s']:.1f} s)" if "set_budget_s" in row else ""), flush=True)
        (out / "results.json").write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=1) + "\n")
        read_run_records([r for r in rows if r["job"].startswith("dpspark")])
        text = report(rows, args, table if args.table else "built by scripts/make_demo_table.py", make_s)
        (out / "results.md").write_text(text + "\n")
        for r in rows:
            if r["job"].startswith("dpspark"):
                r["breakdown"] = breakdown(r)
        (out / "results.json").write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=1) + "\n")
        print(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
