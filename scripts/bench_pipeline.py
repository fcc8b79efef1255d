#!/usr/bin/env python
"""A daily pipeline's steady state (issue 31): what a run costs when its output path and its ledger
already hold a year of history, as whole processes next to a plain MLlib job on the same table.

Set-up, once per ``--work`` directory (reused while n, d and --days are the same; ``--rebuild`` redoes it):

- the input: bench_scale's Gaussian mixture, n x d, as a Delta table (``bench_scale.make_table``);
- the history: the input's cap set once (``dpspark ledger set-budget``'s code, a public cap far above
  what the benchmark spends), then ``--days`` daily runs written with the runner's own writers, in the
  order and with the commits a real run makes: the ``running`` row of runs/; the ledger's
  ``started`` + ``charged`` events (one commit) and ``fit_started``; centers/; the ``succeeded`` row;
  summary.json, summary/<run_id>.json and summary/<run_id>/1.json; the ledger's ``succeeded``. No fit
  runs (the history's values are placeholders): what the steady state reads is the tables' size and
  their Delta logs (commits, checkpoints), which are those of a real year.

Measured, ``--reps`` rotations, each case its own whole process (start to exit), in an order that
rotates between repetitions:

- ``new <family>``: ``dpspark run`` of a new run id, for each ``--families`` (charged: epsilon 1);
- ``no-op re-run``: ``dpspark run`` of ``day-0001``, which succeeded (nothing charged or released);
- ``refused run``: ``dpspark run`` asking for more epsilon than remains (exit 3);
- ``ledger show``: ``dpspark ledger show --input`` the table;
- ``ledger set-budget``: the same cap set again;
- ``MLlib``: ``scripts/mllib_job.py`` on the same table (k = 10, 20 iterations, tol 0), after each new run.

Every dpspark process runs with ``$DPSPARK_OPERATOR_LOG`` set, so its steps' durations are read from
its operator record (a run with a ledger does not print them). "bookkeeping" = the process's wall time
minus Spark's start, the input's read (schema and version) and the fit: the records around the release.

    .venv/bin/python scripts/bench_pipeline.py --quick --out /tmp/pipe          # smoke: 2e4 x 2, 2 days, 1 rep
    .venv/bin/python scripts/bench_pipeline.py --n 1e6 --d 10 --reps 3          # the issue's steady state
    .venv/bin/python scripts/bench_pipeline.py --n 1e6 --d 10 --families auto dplloyd maxcover ldp

Results: ``--out`` (default bench/results/pipeline): results.md (medians per case, the new runs'
ratio to MLlib, the step breakdown) and results.json (every process). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402
import bench_scale as bs  # noqa: E402  (the benchmark's table and its dpspark configs)

DEFAULT_OUT = bc.ROOT / "bench" / "results" / "pipeline"
DEFAULT_WORK = bc.ROOT / ".cache" / "bench-pipeline"
CAP = 1.0e6  # the input's cap: public, far above what a year and the benchmark spend
CAP_DELTA = 0.5  # delta cap (the families' configs ask for delta 1e-6 or 0)
REFUSED_EPSILON = 2.0e6  # asks for more than the cap: refused whatever the history spent
# Steps that are not bookkeeping: Spark's start, the input's read, the fit (named "<family>: fit").
NOT_BOOKKEEPING = ("start Spark session", "read input table (schema and version)")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=float, default=1e6)
    p.add_argument("--d", type=int, default=10)
    p.add_argument("--days", type=int, default=365, help="days of history in runs/ and the ledger")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--families", nargs="+", default=["auto"], choices=bs.FAMILIES)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--work", type=Path, default=DEFAULT_WORK, help="the table and the history (kept between runs)")
    p.add_argument("--rebuild", action="store_true", help="write the table and the history again")
    p.add_argument("--no-mllib", action="store_true", help="leave the MLlib job out")
    p.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                   help="measure only these cases (e.g. \"no-op re-run\" \"ledger show\"; default: all)")
    p.add_argument("--quick", action="store_true", help="smoke run: n 2e4, d 2, 2 days, 1 rep, auto")
    p.add_argument("--job-timeout", type=float, default=3600.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    args.command = bh.command_line("bench_pipeline.py", argv, python=".venv/bin/python")
    if args.quick:
        args.n, args.d, args.days, args.reps, args.families = 2e4, 2, 2, 1, ["auto"]
        if args.work == DEFAULT_WORK:
            args.work = args.out / "work"
    args.n = int(args.n)
    known = [case for case, _ in all_cases(args)]
    if set(args.cases or []) - set(known):
        p.error(f"unknown cases {sorted(set(args.cases) - set(known))}; known: {known}")
    return args


# ---------------------------------------------------------------------------
# Set-up: the table and a year of history


def build(args) -> dict:
    """The table, the output path and the ledger with ``args.days`` of history (reused when present)."""
    work = args.work
    marker = work / "built.json"
    want = {"n": args.n, "d": args.d, "days": args.days, "seed": args.seed, "cap": [CAP, CAP_DELTA]}
    paths = {"table": str(work / "table"), "out": str(work / "out"), "ledger": str(work / "ledger")}
    if marker.exists() and not args.rebuild and json.loads(marker.read_text()).get("built") == want:
        return {**paths, **json.loads(marker.read_text())}
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from dpspark import tables
    from dpspark.privacy.ledger import Ledger

    with bh.session("bench-pipeline-setup") as spark:
        _, table_s = bh.timed(lambda: bs.make_table(spark, paths["table"], args.n, args.d, args.seed,
                                                    partitions=max(2, args.n // 250_000)))
        key = tables.ledger_key_of(spark, paths["table"])
        ledger = Ledger(spark, tables.qualify(paths["ledger"]))
        ledger.set_budget(key, CAP, CAP_DELTA)
        _, history_s = bh.timed(lambda: write_history(spark, ledger, key, paths, args))
    info = {"built": want, "input_key": key, "table_s": round(table_s, 1), "history_s": round(history_s, 1)}
    marker.write_text(json.dumps(info))
    return {**paths, **info}


def ensure_local_cap(args, built: dict) -> None:
    """ldp's runs are charged to the input's LOCAL budget (another currency): its cap, set once in the
    work directory (a set-up step, not measured), when ldp is among the families."""
    marker = Path(args.work) / "built.json"
    info = json.loads(marker.read_text())
    if "ldp" not in args.families or info.get("local_cap"):
        return
    from dpspark.privacy.ledger import Ledger

    with bh.session("bench-pipeline-setup") as spark:
        Ledger(spark, built["ledger"]).set_budget(built["input_key"], CAP, 0.0, guarantee="local")
    marker.write_text(json.dumps({**info, "local_cap": True}))


def history_config(args, paths) -> dict:
    cfg = bs.family_config("auto", paths["table"], args.d, paths["out"])
    cfg["privacy"]["ledger"] = paths["ledger"]
    return cfg


def write_history(spark, ledger, key: str, paths: dict, args) -> None:
    """``args.days`` succeeded daily runs, written as the runner writes a run (see the module docstring)."""
    import numpy as np

    from dpspark import __version__, tables
    from dpspark.runner import attempt_summary_path, output_paths, run_summary_path

    out = output_paths(tables.qualify(paths["out"]))
    names = [f"x{j}" for j in range(args.d)]
    config_json = json.dumps(history_config(args, paths))
    start = datetime(2025, 12, 1, 2, 0, tzinfo=timezone.utc)
    for day in range(1, args.days + 1):
        run_id = f"day-{day:04d}"
        when = start + timedelta(days=day)
        record = {name: None for name in tables.RUNS_COLUMNS}
        record.update(run_id=run_id, attempt=1, status="running", algorithm="auto", objective="kmeans", k=bs.K,
                      parameters=config_json, epsilon_spent=0.0, delta_spent=0.0, epsilon_configured=bs.EPS,
                      delta_configured=bs.DELTA, charges="[]", input_path=paths["table"], input_key=key,
                      input_format="delta", input_version=0, dpspark_version=__version__, started_at=when,
                      private=True, guarantee="central", charged=False, fit_started=False)
        tables.write_run_record(spark, out["runs"], record, new=True)
        ledger.mark(key, run_id, "started", attempt=1, guarantee="central", defer=True)
        ledger.charge(key, run_id, "auto", bs.EPS, 0.0, None, None, guarantee="central", attempt=1,
                      input_seen=paths["table"], private=True, defer=True)
        ledger.mark(key, run_id, "fit_started", attempt=1, guarantee="central")
        centers = np.zeros((bs.K, args.d))
        tables.write_centers(spark, out["centers"], run_id, names, centers, np.ones(bs.K), attempt=1, new=True)
        record.update(status="succeeded", ended_at=when + timedelta(minutes=2), epsilon_spent=bs.EPS, charged=True,
                      fit_started=True)
        tables.write_run_record(spark, out["runs"], record)
        summary = {"run_id": run_id, "attempt": 1, "status": "succeeded", "placeholder": "bench_pipeline history"}
        for path in (attempt_summary_path(out, run_id, 1), run_summary_path(out, run_id), out["summary"]):
            tables.write_json(spark, path, summary)
        ledger.mark(key, run_id, "succeeded", attempt=1, guarantee="central")
        if day % 25 == 0:
            print(f"bench_pipeline: history day {day}/{args.days}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Measured processes


def cases(args) -> list[tuple[str, str | None]]:
    """(case name, family) of one repetition (those of --cases)."""
    return [(case, family) for case, family in all_cases(args) if not args.cases or case in args.cases]


def all_cases(args) -> list[tuple[str, str | None]]:
    out = [(f"new {f}", f) for f in args.families]
    out += [("no-op re-run", "auto"), ("refused run", "auto"), ("ledger show", None), ("ledger set-budget", None)]
    if not args.no_mllib:
        out += [("MLlib", None)]
    return out


def command(case: str, family: str | None, rep: int, jobdir: Path, built: dict, args) -> list[str]:
    if case == "MLlib":
        return bh.mllib_command(built["table"], str(jobdir / "mllib-out"), bs.K, seed=args.seed)
    if case == "ledger show":
        return bh.dpspark_command("ledger", "show", "--ledger", built["ledger"], "--input", built["table"])
    if case == "ledger set-budget":
        return bh.dpspark_command("ledger", "set-budget", "--ledger", built["ledger"], "--input", built["table"],
                                  "--epsilon", repr(CAP), "--delta", repr(CAP_DELTA))
    cfg = bs.family_config(family, built["table"], args.d, built["out"])
    cfg["privacy"]["ledger"] = built["ledger"]
    run_id = {"no-op re-run": "day-0001", "refused run": f"refused-{rep}"}.get(case, f"new-{family}-{rep}-{int(time.time())}")
    if case == "refused run":
        cfg["privacy"]["epsilon"] = REFUSED_EPSILON
    path = jobdir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return bh.dpspark_command("run", "--config", path, "--json", "--run-id", run_id)


def measure(case: str, family: str | None, rep: int, built: dict, args, workdir: Path) -> dict:
    jobdir = workdir / f"{rep:02d}-{case.replace(' ', '_')}"
    jobdir.mkdir(parents=True)
    operator = jobdir / "operator"
    cmd = command(case, family, rep, jobdir, built, args)
    proc = bh.run_process(cmd, jobdir, bh.child_env(None if case == "MLlib" else str(operator)), args.job_timeout)
    row = {"case": case, "rep": rep, "wall_s": round(proc["wall"], 2), "exit_code": proc["exit_code"], "steps": {}}
    outcome = bh.last_json_line(proc["stdout"])
    if outcome.get("run_id"):
        timings = bh.read_operational(None, str(operator), outcome["run_id"], outcome.get("attempt") or 1).get("timings")
        row["steps"] = {k: round(float(v), 3) for k, v in (timings or {}).items()}
        row["status"] = outcome.get("status")
    if case == "MLlib":
        steps = bh.parse_steps(proc["stderr"], "fit")
        row["steps"] = steps
        row["fit_s"] = steps.get("FIT")
    else:
        fit = next((v for k, v in row["steps"].items() if k.endswith(": fit")), 0.0)
        outside = sum(row["steps"].get(k, 0.0) for k in NOT_BOOKKEEPING) + fit
        row["fit_s"] = fit if fit else None
        row["bookkeeping_s"] = round(proc["wall"] - outside, 2) if row["steps"] else None
        row["jvm_start_s"] = row["steps"].get("start Spark session")
    expected = {"refused run": 3}.get(case, 0)
    if proc["exit_code"] != expected:
        row["error"] = f"exit {proc['exit_code']} (expected {expected}): " + (proc["stderr"].strip().splitlines() or ["?"])[-1][:300]
    return row


def top_level(step: str) -> bool:
    """A step of the runner or the command line (the fit's own passes are nested inside "<family>: fit")."""
    from dpspark.runner import RUNNING_ROW_STEP, WAIT_RUNNING_ROW_STEP

    return (step in bs.KNOWN_STEPS or step.endswith(": fit") or step in (RUNNING_ROW_STEP, WAIT_RUNNING_ROW_STEP)
            or step.startswith("privacy ledger:"))


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def write_results(rows: list[dict], built: dict, args, elapsed: float) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    mllib = median(r["wall_s"] for r in rows if r["case"] == "MLlib")
    table = []
    for case, _ in cases(args):
        mine = [r for r in rows if r["case"] == case]
        wall = median(r["wall_s"] for r in mine)
        table.append([case, len(mine), f"{wall:.1f}" if wall is not None else "",
                      f"{wall / mllib:.2f}x" if wall and mllib and case.startswith("new") else "",
                      bh.fmt(median(r.get("jvm_start_s") for r in mine), missing=""),
                      bh.fmt(median(r.get("fit_s") for r in mine), missing=""),
                      bh.fmt(median(r.get("bookkeeping_s") for r in mine), missing=""),
                      "; ".join(sorted({r["error"] for r in mine if r.get("error")}))[:200]])
    steps_rows = []
    for case, _ in cases(args):
        mine = [r for r in rows if r["case"] == case and r["steps"]]
        names = sorted({k for r in mine for k in r["steps"] if top_level(k)}, key=lambda k: -median(r["steps"].get(k) for r in mine))
        for name in names:
            steps_rows.append([case, name, bh.fmt(median(r["steps"].get(name) for r in mine), "{:.2f}", missing="")])
    machine = bh.machine_description()
    text = [f"# A daily pipeline's steady state ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
            f"Table: n = {args.n:,}, d = {args.d} (bench_scale's mixture, Delta). History: {args.days} succeeded "
            f"daily runs in runs/, centers/ and the ledger (set-up: table {built.get('table_s')} s, history "
            f"{built.get('history_s')} s). {args.reps} repetition(s), whole processes, medians (s). "
            f"Machine: {machine.get('nproc', '?')} CPUs ({machine.get('cpu', '')}), {machine.get('memory_gb', '?')} GB. Benchmark time "
            f"{elapsed / 60:.1f} min.", "",
            f"`{args.command}`", "",
            bh.markdown_table(["case", "runs", "wall", "/ MLlib", "Spark start", "fit", "bookkeeping", "errors"],
                              table, ["l", "r", "r", "r", "r", "r", "r", "l"]), "",
            "bookkeeping: the wall time minus Spark's start, the input's read (schema and version) and the fit.", "",
            "## Steps (operator records; MLlib: its own step lines)", "",
            bh.markdown_table(["case", "step", "median s"], steps_rows, ["l", "l", "r"]), ""]
    (args.out / "results.md").write_text("\n".join(text))
    (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "built": built, "machine": machine, "rows": rows}, indent=1))


def main(argv=None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    built = build(args)
    ensure_local_cap(args, built)
    workdir = args.out / "processes"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    rows = []
    order = cases(args)
    for rep in range(args.reps):
        shift = rep % len(order)
        for case, family in order[shift:] + order[:shift]:
            row = measure(case, family, rep, built, args, workdir)
            rows.append(row)
            print(f"bench_pipeline: rep {rep + 1}/{args.reps} {case}: {row['wall_s']:.1f} s"
                  + (f" (bookkeeping {row['bookkeeping_s']:.1f} s)" if row.get("bookkeeping_s") is not None else "")
                  + (f" ERROR {row['error']}" if row.get("error") else ""), file=sys.stderr, flush=True)
    write_results(rows, built, args, time.perf_counter() - started)
    print(f"bench_pipeline: results in {args.out / 'results.md'}", file=sys.stderr)
    return 0 if not any(r.get("error") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
