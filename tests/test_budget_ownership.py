"""Issue 13, defects 3, 4, 5 and 8 through `dpspark run`: a run cannot raise or bypass the cap the
ledger stores for its input, whatever the spelling of the input's path or the config's keys; a
fixed-seed run says NOT PRIVATE in the ledger; the model and the published outputs carry no
non-private operational metadata."""

from __future__ import annotations

import json
import os

import pytest

from dpspark import tables
from dpspark.cli import main
from dpspark.privacy.ledger import Ledger

from test_pipeline import make_config, points_frame


def spellings(path: str) -> list[str]:
    """Other ways to write one local table's path."""
    head, tail = os.path.split(path)
    link = head + "-link"
    os.symlink(head, link)
    return ["file://" + path + "/",
            "file:" + os.path.dirname(link) + "//" + os.path.basename(link) + "/" + tail]


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_a_run_cannot_raise_or_bypass_the_ledgers_cap(spark, tmp_path, write_delta, fmt, capsys):
    if fmt == "delta":
        path = write_delta(points_frame(30), name="people")
    else:
        path = str(tmp_path / "people")
        spark.createDataFrame(points_frame(30)).coalesce(1).write.parquet(path)
    ledger_path = str(tmp_path / "ledger")
    cfg, c = make_config(tmp_path, path, **{"input.format": fmt, "privacy.ledger": ledger_path, "seed": None,
                                           "unsafe_fixed_seed": None, "output.report": False})
    key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger_path).set_budget(key, 1.0, 0.0)
    assert main(["run", "--config", cfg, "--run-id", "first"], spark=spark) == 0
    capsys.readouterr()
    # The same table spelled otherwise (a file URI with a trailing slash; '//' and a symlinked directory).
    attempts = [["--set", f"input.path={p}"] for p in spellings(path)]
    if fmt == "delta":  # the config tricks need checking once
        attempts += [["--set", "privacy.budget.epsilon=1e9", "--set", "privacy.budget.delta=0.5"],  # a bigger cap
                     ["--set", "privacy.budget=null"]]  # no request at all
    for i, extra in enumerate(attempts):
        code = main(["run", "--config", cfg, "--run-id", f"again{i}", *extra], spark=spark)
        assert code == 3, (extra, capsys.readouterr().err)
    if fmt == "delta":  # another ledger has no cap for the table: refused too (a run cannot bring its own budget)
        assert main(["run", "--config", cfg, "--run-id", "elsewhere", "--set", f"privacy.ledger={tmp_path / 'other'}"],
                    spark=spark) == 3
    ledger = Ledger(spark, ledger_path)
    assert ledger.totals(key).spent_epsilon == pytest.approx(1.0)
    refused = [e for e in ledger.runs(key) if e["status"] == "refused"]
    assert len(refused) == len(attempts)
    runs = spark.read.format("delta").load(c["output"]["path"] + "/runs").collect()
    assert {r.input_key for r in runs} == {key}
    # (the run against another path with no ledger there is refused before its attempt begins: no row)
    assert sorted(r.status for r in runs) == ["refused"] * len(attempts) + ["succeeded"]


def test_a_seeded_run_is_recorded_not_private_everywhere(spark, tmp_path, write_delta):
    path = write_delta(points_frame(30))
    ledger_path = str(tmp_path / "ledger")
    cfg, c = make_config(tmp_path, path, **{"privacy.ledger": ledger_path})  # seed 7, unsafe_fixed_seed: true
    key = tables.ledger_key_of(spark, path)
    Ledger(spark, ledger_path).set_budget(key, 5.0, 0.0)
    assert main(["run", "--config", cfg, "--run-id", "seeded"], spark=spark) == 0
    out = c["output"]["path"]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["private"] is False and "NOT PRIVATE" in summary["privacy_note"]
    assert {r.private for r in spark.read.format("delta").load(out + "/centers").collect()} == {False}
    assert spark.read.format("delta").load(out + "/runs").first().privacy_note.startswith("NOT PRIVATE")
    assert "NOT PRIVATE" in open(os.path.join(out, "report.html"), encoding="utf-8").read()
    notes = {(e["status"], e["note"]) for e in Ledger(spark, ledger_path).runs(key)}
    assert ("charged", "NOT PRIVATE (fixed seed)") in notes and ("started", "NOT PRIVATE (fixed seed)") in notes


def test_model_and_outputs_hold_no_operational_metadata(spark, tmp_path, write_delta, monkeypatch):
    """Pass counts, signature histogram sizes, fallback thresholds and wall times depend on the data:
    they go to the caller's ``operational`` dict and the operator log ($DPSPARK_OPERATOR_LOG), never
    onto the model or into runs/, summary.json or the report (without diagnostics)."""
    from dpspark.runner import read_operator_record
    from dpspark.maxcover.estimator import MaxCover
    from dpspark.privacy.domain import Domain
    from dpspark.privacy.randomness import Randomness

    path = write_delta(points_frame(30))
    df = spark.read.format("delta").load(path)
    operational, timings = {}, {}
    model = MaxCover(k=3, epsilon=1.0, delta=1e-6, domain=Domain(2, (0.0, 0.0), (100.0, 100.0)), objective="kmeans",
                     candidates="grid", candidate_count=64, randomness=Randomness(3)).fit(df, timings=timings, operational=operational)
    leaks = {"spark_passes", "histogram_jobs", "passes_by_kind", "fallback_thresholds", "histogram_sizes",
             "shrunk_at_thresholds", "thresholds_without_pass", "thresholds_from_a_group", "thresholds_read_again", "timings"}
    assert not leaks & set(model.info) and leaks - {"timings"} <= set(operational) and timings
    cfg, c = make_config(tmp_path, path, **{"algorithm": {"name": "maxcover", "k": 3, "candidates": "grid",
                                                          "candidate_count": 64}, "privacy.delta": 1e-6})
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path / "operator"))
    assert main(["run", "--config", cfg, "--run-id", "m"], spark=spark) == 0
    summary_text = open(os.path.join(c["output"]["path"], "summary.json")).read()
    assert "timings" not in summary_text and "spark_passes" not in summary_text
    html = open(os.path.join(c["output"]["path"], "report.html"), encoding="utf-8").read()
    assert "Timings" not in html
    run = spark.read.format("delta").load(c["output"]["path"] + "/runs").first()
    assert run.non_private_operational is None
    assert "spark_passes" in read_operator_record(spark, "m", 1)["operational"]


def test_the_deployment_ledger_cannot_be_switched_off_or_replaced(monkeypatch, tmp_path):
    """$DPSPARK_LEDGER (set by the deployment) is the run's ledger: a config may name it (any
    spelling) or nothing, never another ledger or null; and a config cannot load code into Spark."""
    from dpspark.config import load_config
    from dpspark.errors import ConfigError

    cfg, _ = make_config(tmp_path, str(tmp_path / "t"))
    monkeypatch.setenv("DPSPARK_LEDGER", str(tmp_path / "ledger"))
    assert load_config(cfg, ["privacy.ledger=null"]).privacy.ledger == str(tmp_path / "ledger")
    assert load_config(cfg, [f"privacy.ledger=file://{tmp_path}//ledger/"]).privacy.ledger == str(tmp_path / "ledger")
    with pytest.raises(ConfigError, match="privacy.ledger"):
        load_config(cfg, [f"privacy.ledger={tmp_path / 'mine'}"])
    monkeypatch.delenv("DPSPARK_LEDGER")
    for key in ("spark.jars", "spark.driver.extraJavaOptions", "spark.sql.extensions", "spark.executorEnv.X"):
        with pytest.raises(ConfigError, match="loads code"):
            load_config(cfg, [f"spark.conf.{key}=x"])
