"""What a new user reads (issue 50's minor list): the same --json keys on every exit path, a bounds
message that names the bounds, validate's verdict, log lines that never read as a charge that did not
happen, budgets without float noise, a release time, and a failure that says where its details are."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from dpspark.cli import main
from dpspark.errors import RunFailed
from dpspark.privacy.ledger import LedgerTotals

from test_pipeline import make_config, points_frame, read_summary, set_budget

JSON_KEYS = {"run_id", "attempt", "status", "exit_code", "epsilon_spent", "delta_spent", "input_version", "outputs",
             "error", "accounting"}


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_every_exit_path_prints_the_documented_json_keys(spark, tmp_path, write_delta, capsys):
    path = write_delta(points_frame(30))
    ledger = str(tmp_path / "ledger")
    set_budget(spark, ledger, path, epsilon=1.5)
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger, "seed": None, "unsafe_fixed_seed": False,
                                            "output.report": False})
    seen = {}
    for name, extra, code in (("config error", ["--set", "algorithm.k=0"], 2),
                              ("success", [], 0),
                              ("refused", [], 3)):
        capsys.readouterr()
        assert main(["run", "--config", cfg, "--run-id", name.replace(" ", "-"), "--json", *extra], spark=spark) == code
        outcome = _json_line(capsys.readouterr().out)
        assert set(outcome) == JSON_KEYS, (name, outcome)
        seen[name] = outcome
    assert seen["config error"]["status"] == "invalid_config" and seen["config error"]["epsilon_spent"] == 0.0
    assert seen["config error"]["accounting"] is None  # the config could not be read: nothing to say
    assert seen["refused"]["accounting"] == "ledger" and seen["refused"]["epsilon_spent"] == 0.0


def test_an_over_cap_run_never_logs_its_charge_as_done(spark, tmp_path, write_delta, capsys):
    path = write_delta(points_frame(30))
    ledger = str(tmp_path / "ledger")
    set_budget(spark, ledger, path, epsilon=0.5)
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger, "seed": None, "unsafe_fixed_seed": False})
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "over"], spark=spark) == 3
    err = capsys.readouterr().err
    assert "privacy ledger: charge stopped" in err and "privacy ledger: charge done" not in err
    assert err.index("privacy ledger: charge stopped") < err.index("BudgetRefused")


def test_validate_says_its_verdict(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DPSPARK_LEDGER", raising=False)
    cfg, _ = make_config(tmp_path, str(tmp_path / "t"))
    assert main(["validate", "--config", cfg]) == 0
    err = capsys.readouterr().err
    assert "the config is valid (dplloyd, k=3, epsilon=1, delta=0, UNACCOUNTED: no ledger)" in err
    assert "nothing was read, run or charged" in err


def test_wrong_length_bounds_name_the_bounds(tmp_path, capsys):
    cfg, _ = make_config(tmp_path, str(tmp_path / "t"), **{"input.features": ["x", "y", "z"]})
    assert main(["validate", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "config key 'domain.lower/upper'" in err and "give 3 values for each bound" in err


def test_remaining_budgets_read_as_written():
    totals = LedgerTotals(input_path="k", spent_epsilon=0.3, spent_delta=2e-6, budget_epsilon=1.0, budget_delta=1e-5,
                          guarantee="central", ledger_cap_epsilon=1.0, ledger_cap_delta=1e-5)
    shown = totals.as_dict()
    assert repr(shown["remaining_delta"]) == "8e-06" and repr(shown["remaining_epsilon"]) == "0.7"
    assert 1e-5 - 2e-6 != 8e-06  # what the rounding is for


def test_the_summary_says_when_it_was_released(spark, tmp_path, write_delta):
    path = write_delta(points_frame(30))
    cfg_path, cfg = make_config(tmp_path, path, **{"output.report": False})
    before = datetime.now(timezone.utc).replace(microsecond=0)
    assert main(["run", "--config", cfg_path, "--run-id", "when"], spark=spark) == 0
    released = datetime.fromisoformat(read_summary(cfg)["released_at"].replace("Z", "+00:00"))
    assert before <= released <= datetime.now(timezone.utc)


def test_a_failure_says_where_its_details_are(monkeypatch, tmp_path):
    monkeypatch.delenv("DPSPARK_OPERATOR_LOG", raising=False)
    assert "were not kept: $DPSPARK_OPERATOR_LOG is not set" in str(RunFailed("RuntimeError"))
    assert "Connect server's log" in str(RunFailed("RuntimeError", connect=True))
    monkeypatch.setenv("DPSPARK_OPERATOR_LOG", str(tmp_path))
    assert "details are in the attempt's operator record" in str(RunFailed("RuntimeError"))
    assert "Connect" not in str(RunFailed("RuntimeError"))


@pytest.mark.parametrize("delta,why", [(1e-6, "a noisy row count picks one")])
def test_autos_why_does_not_claim_grid_candidates(delta, why):
    from dpspark.auto.estimator import choose

    route, text = choose(2, "kmeans", delta)
    assert route == "maxcover" and why in text and "grid candidates cover" not in text
