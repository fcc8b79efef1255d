"""Issue 16, item 5: a collapsed release says so. ldp at epsilon 1 on a few hundred users releases
(nearly) one point: the run succeeds and the log, summary.json and report.html say it collapsed,
with the likely cause (too few users for the local model) and a rough factor."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import yaml

from dpspark.cli import main

from conftest import blobs


def test_an_ldp_collapse_is_reported(spark, tmp_path, write_delta, capsys):
    x = blobs(100, [(20, 20), (80, 30), (50, 80), (20, 80)], 4.0, 5)
    path = write_delta(pd.DataFrame({"x": x[:, 0], "y": x[:, 1]}))
    out = tmp_path / "out"
    cfg = {"input": {"path": path, "features": ["x", "y"]}, "domain": {"lower": [0, 0], "upper": [100, 100]},
           "privacy": {"epsilon": 1.0, "delta": 0.0}, "algorithm": {"name": "ldp", "k": 4},
           "output": {"path": str(out)}, "seed": 3, "unsafe_fixed_seed": True}
    cfg_path = tmp_path / "ldp.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", str(cfg_path), "--run-id", "few-users"], spark=spark) == 0
    summary = json.loads((out / "summary.json").read_text())
    found = summary["degenerate"]
    assert found is not None and summary["status"] == "succeeded"
    centers = np.asarray(summary["centers"])
    gaps = np.abs(centers[:, None, :] - centers[None, :, :]).max(axis=2) + np.eye(4)
    assert found["distinct_centers"] < 4 and gaps.min() <= 1e-4 * 100  # two released centers coincide
    assert "users" in found["likely_cause"]
    assert "degenerate result" in capsys.readouterr().err  # the log line
    assert "DEGENERATE" in (out / "report.html").read_text(encoding="utf-8").upper()
