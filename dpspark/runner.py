"""One run of a job, from a validated config to its outputs.

    check the input's schema (metadata only)
    -> charge the ledger with the run's declared (epsilon, delta), or refuse (exit 3)
    -> fit the family's estimator (reads the data; every noisy release is charged)
    -> write centers/, report.png, runs/ and, last, summary.json

A failure after the charge leaves no centers and no summary.json: rows this run
wrote are removed, the run is recorded as failed in ``runs/`` and in the ledger,
and the charge stays.
"""

from __future__ import annotations

import importlib
import math
import os
import secrets
import tempfile
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from dpspark import __version__, tables
from dpspark.errors import BudgetRefused, DPSparkError, PrivacyAccountingError
from dpspark.privacy.ledger import Ledger
from dpspark.privacy.randomness import Randomness
from dpspark.progress import log, step

ESTIMATORS = {
    "dplloyd": "dpspark.dplloyd.estimator:DPLloyd",
    "maxcover": "dpspark.maxcover.estimator:MaxCover",
    "ldp": "dpspark.ldp.estimator:LocalDP",
}


def estimator_class(name: str):
    module, _, attr = ESTIMATORS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


@dataclass
class RunResult:
    run_id: str
    status: str
    summary: dict
    outputs: dict
    model: object = None


def output_paths(output_path: str) -> dict:
    base = output_path.rstrip("/")
    return {
        "centers": f"{base}/centers",
        "runs": f"{base}/runs",
        "summary": f"{base}/summary.json",
        "report": f"{base}/report.png",
        "report_html": f"{base}/report.html",
    }


def _now():
    return datetime.now(timezone.utc).replace(tzinfo=None)


def run(config, spark, run_id: str | None = None, randomness: Randomness | None = None) -> RunResult:
    run_id = run_id or new_run_id()
    if not tables.RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    started = _now()
    timings: dict = {}
    paths = output_paths(tables.qualify(config.output.path))
    input_path = tables.qualify(config.input.path)
    randomness = randomness or Randomness(config.seed)
    estimator = estimator_class(config.algorithm.name).from_config(config, randomness=randomness)
    plan_eps, plan_delta = estimator.privacy_plan()
    if plan_eps > config.privacy.epsilon * (1 + 1e-12) or plan_delta > config.privacy.delta * (1 + 1e-12):
        raise PrivacyAccountingError(
            f"{config.algorithm.name} would spend epsilon={plan_eps:g}, delta={plan_delta:g}, over the configured "
            f"privacy.epsilon={config.privacy.epsilon:g}, privacy.delta={config.privacy.delta:g}"
        )
    if randomness.seed is not None:
        log.warning("seed=%s: a testing aid; this run is NOT private", randomness.seed)

    record = {
        "run_id": run_id, "status": "running", "algorithm": config.algorithm.name,
        "objective": config.algorithm.objective, "k": config.algorithm.k,
        "parameters": _json(config.to_dict()), "epsilon_spent": 0.0, "delta_spent": 0.0,
        "epsilon_configured": config.privacy.epsilon, "delta_configured": config.privacy.delta,
        "charges": "[]", "input_path": input_path, "input_format": config.input.format,
        "input_version": None, "dpspark_version": __version__, "started_at": started, "ended_at": None,
        "seed": randomness.seed, "private": randomness.private, "error": None,
    }

    with step("read input table (schema and version)", timings):
        df, version = tables.load_table(spark, input_path, config.input.format)
        tables.check_schema(df, config.input.features, config.input.privacy_unit, config.domain.dim)
    record["input_version"] = version

    # Families whose inputs arrive over time (ldp ingest mode) say here, before any charge,
    # whether the run can release; if not, nothing is charged or released (exit 1).
    ready = getattr(estimator, "check_ready", None)
    if ready is not None:
        try:
            with step("check that every input is in", timings):
                ready(spark)
        except DPSparkError as exc:
            record.update(status="awaiting", ended_at=_now(), error=str(exc)[:4000])
            tables.write_run_record(spark, paths["runs"], record)
            raise

    ledger = Ledger(spark, tables.qualify(config.privacy.ledger)) if config.privacy.ledger else None
    ledger_totals = None
    if ledger is not None:
        budget = config.privacy.budget
        try:
            with step("privacy ledger: charge", timings):
                ledger_totals = ledger.charge(
                    input_path, run_id, config.algorithm.name, plan_eps, plan_delta,
                    budget.epsilon if budget else None, budget.delta if budget else None,
                )
        except BudgetRefused as exc:
            record.update(status="refused", ended_at=_now(), error=str(exc))
            tables.write_run_record(spark, paths["runs"], record)
            raise
        # The charge is written; from here on the budget stays spent whatever happens.
        record.update(epsilon_spent=plan_eps, delta_spent=plan_delta)

    wrote_report = False
    try:
        with step(f"{config.algorithm.name}: fit", timings):
            model = estimator.fit(df, timings=timings)
        if not (math.isclose(model.epsilon_spent, plan_eps, rel_tol=1e-9, abs_tol=1e-12)
                and math.isclose(model.delta_spent, plan_delta, rel_tol=1e-9, abs_tol=1e-15)):
            raise PrivacyAccountingError(
                f"{config.algorithm.name} declared epsilon={plan_eps!r}, delta={plan_delta!r} but charged "
                f"epsilon={model.epsilon_spent!r}, delta={model.delta_spent!r}"
            )
        diagnostics = _diagnostics(spark, model, df) if config.diagnostics else None
        record.update(epsilon_spent=model.epsilon_spent, delta_spent=model.delta_spent, charges=_json(model.charges))
        with step("write centers table", timings):
            tables.write_centers(spark, paths["centers"], run_id, model.feature_names, model.centers, model.noisy_weights)
        summary = {
            "run_id": run_id, "status": "succeeded", "algorithm": config.algorithm.name,
            "objective": config.algorithm.objective, "k": config.algorithm.k,
            "epsilon_spent": model.epsilon_spent, "delta_spent": model.delta_spent,
            "epsilon_configured": config.privacy.epsilon, "delta_configured": config.privacy.delta,
            "centers": model.centers.tolist(), "noisy_weights": model.noisy_weights.tolist(),
            "feature_names": model.feature_names, "charges": model.charges,
            "parameters": model.parameters, "input": {"path": input_path, "format": config.input.format, "version": version},
            "ledger": _ledger_view(ledger_totals, plan_eps, plan_delta),
            "randomness": randomness.describe(),
            "outputs": dict(paths) if config.output.report else {k: v for k, v in paths.items() if not k.startswith("report")},
        }
        if diagnostics is not None:
            summary["non_private_diagnostics"] = {k: v for k, v in diagnostics.items() if k != "data_sample"}
        if config.output.report:
            with step("write report.png", timings):
                wrote_report = True  # from here a failure deletes report.png and report.html
                _write_report(spark, paths["report"], paths["report_html"], summary, timings, diagnostics)
        summary["timings"] = _phase_timings(timings, config.algorithm.name)
        record.update(status="succeeded", ended_at=_now())
        with step("write runs table and summary.json", timings):
            tables.write_run_record(spark, paths["runs"], record)
            tables.write_json(spark, paths["summary"], summary)
    except BaseException as exc:
        log.error("run %s failed: %s", run_id, exc)
        _cleanup(spark, paths, run_id, wrote_report)
        record.update(status="failed", ended_at=_now(), error=f"{type(exc).__name__}: {exc}"[:4000])
        try:
            tables.write_run_record(spark, paths["runs"], record)
            if ledger is not None:
                ledger.mark(input_path, run_id, "failed")
        except Exception:  # recording the failure must not hide the failure
            log.error("could not record the failure of run %s:\n%s", run_id, traceback.format_exc())
        raise
    if ledger is not None:
        ledger.mark(input_path, run_id, "succeeded")
    return RunResult(run_id=run_id, status="succeeded", summary=summary, outputs=paths, model=model)


RUNNER_STEPS = ("read input table (schema and version)", "privacy ledger: charge", "write centers table",
                "write report.png", "write runs table and summary.json")


def _phase_timings(timings: dict, algorithm: str) -> dict:
    """Wall times of the run's fixed phases only, for summary.json and the report.

    Per-pass timings stay in the log: their number and names can depend on the data
    (e.g. maxcover's fallback passes), and outputs carry only released values and
    coarse operational metadata. Wall times are operational metadata, not DP releases.
    """
    names = (*RUNNER_STEPS[:2], f"{algorithm}: fit", *RUNNER_STEPS[2:])
    return {name: round(timings[name], 3) for name in names if name in timings}


def _ledger_view(totals, plan_eps, plan_delta):
    if totals is None:
        return None
    view = totals.as_dict()
    # ``totals`` was read right after this run's charge, so it includes it.
    return view


def _json(value) -> str:
    import json

    return json.dumps(value, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o))


def _cleanup(spark, paths, run_id, wrote_report):
    try:
        tables.delete_run_rows(spark, paths["centers"], run_id)
        if wrote_report:
            tables.delete_file(spark, paths["report"])
            tables.delete_file(spark, paths["report_html"])
    except Exception:
        log.error("cleanup after a failed run left something behind:\n%s", traceback.format_exc())


def _write_report(spark, path, html_path, summary, timings, diagnostics):
    from dpspark.report import build_html, write_report

    info = {
        "run_id": summary["run_id"], "algorithm": summary["algorithm"], "objective": summary["objective"],
        "k": summary["k"], "epsilon_spent": summary["epsilon_spent"], "delta_spent": summary["delta_spent"],
        "epsilon_configured": summary["epsilon_configured"], "delta_configured": summary["delta_configured"],
        "centers": summary["centers"], "noisy_weights": summary["noisy_weights"],
        "feature_names": summary["feature_names"], "charges": summary["charges"], "ledger": summary["ledger"],
        "parameters": summary["parameters"], "timings": _phase_timings(timings, summary["algorithm"]),
        "seed_note": summary["randomness"]["seed_note"], "diagnostics": diagnostics,
    }
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "report.png")
        write_report(local, info)
        with open(local, "rb") as handle:
            png = handle.read()
    tables.write_bytes(spark, path, png)
    tables.write_bytes(spark, html_path, build_html(info, png).encode("utf-8"))


def _diagnostics(spark, model, df) -> dict:
    """NON-PRIVATE diagnostics (switched on by ``diagnostics: true``): true cost and a data sample."""
    log.warning("diagnostics: true -- computing NON-PRIVATE diagnostics from the data")
    unit_df, _ = tables.prepare_points(df, model.features, None, model.domain, "diagnostics")
    cols = tables.unit_columns(model.domain.dim)
    centers = model.domain.clip_to_unit(model.centers)
    power = 2 if model.objective == "kmeans" else 1

    def cost(batches):
        import pandas as pd

        total, n = 0.0, 0
        for pdf in batches:
            x = pdf[cols].to_numpy(dtype=np.float64)
            d2 = ((x[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2).min(axis=1)
            total += float((d2 if power == 2 else np.sqrt(d2)).sum())
            n += len(x)
        yield pd.DataFrame({"cost": [total], "n": [n]})

    parts = unit_df.mapInPandas(cost, "cost DOUBLE, n LONG").toPandas()
    n = int(parts["n"].sum())
    sample = unit_df.sample(fraction=min(1.0, 2000.0 / max(n, 1)), seed=0).limit(2000).toPandas()
    return {
        "label": "NON-PRIVATE diagnostics computed from the private data",
        "true_cost_unit_space": float(parts["cost"].sum()),
        "n": n,
        "nicv": float(parts["cost"].sum()) / max(n, 1) if power == 2 else None,
        "data_sample": model.domain.from_unit(sample[cols].to_numpy()) if len(sample) else np.zeros((0, model.domain.dim)),
    }
