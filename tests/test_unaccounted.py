"""A run without a privacy ledger says that it is unaccounted (issue 29, item 3): before, it exited 0
with `private: true` and said nothing, so a user could believe the spend was recorded."""

from __future__ import annotations

import json

from dpspark.cli import main

from test_pipeline import make_config, points_frame, read_summary


def test_validate_warns_that_a_run_without_a_ledger_is_unaccounted(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    cfg, _ = make_config(tmp_path, str(tmp_path / "t"), seed=None, unsafe_fixed_seed=False)
    assert main(["validate", "--config", cfg]) == 0
    assert "privacy.ledger is not set: this run is UNACCOUNTED" in capsys.readouterr().err
    with_ledger, _ = make_config(tmp_path, str(tmp_path / "t"), **{"privacy.ledger": str(tmp_path / "ledger")},
                                 seed=None, unsafe_fixed_seed=False)
    assert main(["validate", "--config", with_ledger]) == 0
    assert "UNACCOUNTED" not in capsys.readouterr().err


def test_a_run_without_a_ledger_says_unaccounted_everywhere(spark, tmp_path, write_delta, monkeypatch, capsys):
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    path = write_delta(points_frame(30))
    cfg_path, cfg = make_config(tmp_path, path, **{"output.report": False})
    capsys.readouterr()
    assert main(["run", "--config", cfg_path, "--run-id", "free", "--json"], spark=spark) == 0
    captured = capsys.readouterr()
    assert "UNACCOUNTED" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["accounting"] == "unaccounted"
    assert read_summary(cfg)["accounting"] == "unaccounted"
