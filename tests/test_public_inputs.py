"""What a config calls public is what the administrator made public (issue 49).

- A candidate table is read as PUBLIC data (its rows may come out verbatim as centers): in a run
  charged to a ledger it must be declared public there (``dpspark ledger set-public``), and a table
  with a budget never is. Before, a config could name another private table of the same ledger as
  its candidates: its rows were released and its balance never charged.
- The driver-memory bounds (``max_pairs``, ``max_signatures``) have a ceiling set by the deployment
  (``$DPSPARK_MAX_PAIRS``, ``$DPSPARK_MAX_SIGNATURES``): a config or a Param may only lower them.
- auto validates the route it chooses before the charge (k > 1000, a large epsilon in 2-3 d).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from dpspark import tables
from dpspark.cli import main
from dpspark.config import validate
from dpspark.errors import ConfigError
from dpspark.privacy.ledger import Ledger

from test_pipeline import make_config, points_frame, set_budget


def _spent(spark, ledger_path, key):
    totals = Ledger(spark, ledger_path).totals(key)
    return totals.spent_epsilon, totals.spent_delta


@pytest.fixture
def lake(spark, tmp_path, write_delta):
    """An input with a budget, ANOTHER private table with a budget of its own (three distinctive
    rows), and a table nobody declared anything about; one ledger."""
    ledger = str(tmp_path / "ledger")
    points = write_delta(points_frame(60), name="points")
    secret_rows = pd.DataFrame({"x": [11.25, 47.5, 88.75], "y": [13.5, 61.25, 92.0]})
    secret = write_delta(secret_rows, name="secret", partitions=1)
    grid = np.array([[x, y] for x in range(5, 100, 10) for y in range(5, 100, 10)], dtype=float)
    plain = write_delta(pd.DataFrame(grid, columns=["x", "y"]), name="plain_grid", partitions=1)
    keys = {"points": set_budget(spark, ledger, points, delta=1e-3), "secret": set_budget(spark, ledger, secret, delta=1e-3)}
    keys["plain"] = tables.ledger_key_of(spark, plain)
    return {"ledger": ledger, "points": points, "secret": secret, "plain": plain, "keys": keys,
            "secret_rows": secret_rows.to_numpy()}


def _table_config(tmp_path, lake, candidate_table, objective="kmedian"):
    cfg, _ = make_config(tmp_path, lake["points"], **{
        "privacy.ledger": lake["ledger"], "privacy.delta": 1e-6, "seed": None, "unsafe_fixed_seed": False,
        "output.report": False, "algorithm": {"name": "maxcover", "k": 3, "objective": objective, "candidates": "table",
                                               "candidate_table": candidate_table}})
    return cfg


def test_another_private_table_as_candidates_is_refused_before_the_charge(spark, tmp_path, lake, capsys):
    """The review's attack: the other table's three rows came out as the centers and its balance
    stayed at 0. Now: exit 2 before any charge, both balances untouched, nothing released."""
    before = {name: _spent(spark, lake["ledger"], lake["keys"][name]) for name in ("points", "secret")}
    capsys.readouterr()
    code = main(["run", "--config", _table_config(tmp_path, lake, lake["secret"]), "--run-id", "attack", "--json"],
                spark=spark)
    out = capsys.readouterr()
    assert code == 2, out.err
    assert "algorithm.candidate_table" in out.err and "has a privacy budget" in out.err
    assert json.loads(out.out.strip().splitlines()[-1])["epsilon_spent"] == 0.0
    assert {name: _spent(spark, lake["ledger"], lake["keys"][name]) for name in ("points", "secret")} == before
    assert not os.path.exists(tmp_path / "out" / "summary.json")
    # set-public refuses a table with a budget: a private table is never made public by mistake
    assert main(["ledger", "set-public", "--ledger", lake["ledger"], "--table", lake["secret"]], spark=spark) == 2
    assert "has a privacy budget" in capsys.readouterr().err
    assert not Ledger(spark, lake["ledger"]).is_public(lake["keys"]["secret"])


def test_an_undeclared_table_is_refused_and_set_public_makes_the_same_run_succeed(spark, tmp_path, lake, capsys):
    cfg = _table_config(tmp_path, lake, lake["plain"])
    before = _spent(spark, lake["ledger"], lake["keys"]["points"])
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "undeclared"], spark=spark) == 2
    err = capsys.readouterr().err
    assert "is not declared public in the ledger" in err and "dpspark ledger set-public" in err
    assert _spent(spark, lake["ledger"], lake["keys"]["points"]) == before
    # the administrator declares it (another spelling of the path: one key)
    assert main(["ledger", "set-public", "--ledger", lake["ledger"], "--table", "file://" + lake["plain"] + "/",
                 "--note", "a public grid"], spark=spark) == 0
    ledger = Ledger(spark, lake["ledger"])
    assert ledger.is_public(lake["keys"]["plain"])
    assert [p["table_key"] for p in ledger.public_tables()] == [lake["keys"]["plain"]]
    capsys.readouterr()
    assert main(["ledger", "show", "--ledger", lake["ledger"]], spark=spark) == 0
    shown = capsys.readouterr().out
    assert "public tables" in shown and "set-public" in shown and "a public grid" in shown
    assert main(["run", "--config", cfg, "--run-id", "declared"], spark=spark) == 0
    assert _spent(spark, lake["ledger"], lake["keys"]["points"])[0] == pytest.approx(before[0] + 1.0)
    # a budget set later makes it private again: refused again
    set_budget(spark, lake["ledger"], lake["plain"])
    assert not Ledger(spark, lake["ledger"]).is_public(lake["keys"]["plain"])
    assert main(["run", "--config", cfg, "--run-id", "budgeted-later"], spark=spark) == 2


def test_dpclustering_refuses_an_undeclared_candidate_table_before_the_charge(spark, lake):
    from dpspark.ml import DPClustering

    df = spark.read.format("delta").load(lake["points"])
    est = DPClustering(k=3, epsilon=1.0, delta=1e-6, lower=[0.0, 0.0], upper=[100.0, 100.0], inputCols=["x", "y"],
                       algorithm="maxcover", objective="kmedian", candidates="table", candidateTable=lake["secret"],
                       ledgerPath=lake["ledger"], ledgerInput=lake["points"])
    before = {name: _spent(spark, lake["ledger"], lake["keys"][name]) for name in ("points", "secret")}
    with pytest.raises(ConfigError, match="algorithm.candidate_table"):
        est.fit(df)
    assert {name: _spent(spark, lake["ledger"], lake["keys"][name]) for name in ("points", "secret")} == before


def _maxcover_raw(**algorithm):
    return {"input": {"path": "/data/points", "features": ["x", "y"]}, "domain": {"lower": [0, 0], "upper": [1, 1]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "algorithm": {"name": "maxcover", "k": 3, **algorithm},
            "output": {"path": "/data/out"}}


@pytest.mark.parametrize("key,env,default", [("max_pairs", "DPSPARK_MAX_PAIRS", 32_000_000),
                                             ("max_signatures", "DPSPARK_MAX_SIGNATURES", 2_000_000)])
def test_driver_bounds_may_only_be_lowered_below_the_deployments_ceiling(monkeypatch, key, env, default):
    monkeypatch.delenv(env, raising=False)
    assert getattr(validate(_maxcover_raw()).algorithm.params, key) == default
    assert getattr(validate(_maxcover_raw(**{key: 1000})).algorithm.params, key) == 1000
    with pytest.raises(ConfigError, match=f"algorithm.{key}.*above the deployment's ceiling {default}"):
        validate(_maxcover_raw(**{key: default + 1}))
    monkeypatch.setenv(env, str(default * 4))  # the deployment raises it: the default follows, a config may go up to it
    assert getattr(validate(_maxcover_raw()).algorithm.params, key) == default * 4
    assert getattr(validate(_maxcover_raw(**{key: default * 2})).algorithm.params, key) == default * 2
    monkeypatch.setenv(env, "1000")  # ... or lowers it
    assert getattr(validate(_maxcover_raw()).algorithm.params, key) == 1000
    with pytest.raises(ConfigError, match=f"above the deployment's ceiling 1000"):
        validate(_maxcover_raw(**{key: 1001}))
    monkeypatch.setenv(env, "many")
    with pytest.raises(ConfigError, match=f"\\${env}"):
        validate(_maxcover_raw())


def test_the_estimator_and_the_param_cannot_raise_a_bound_either(monkeypatch):
    from dpspark.maxcover.estimator import MaxCover
    from dpspark.ml import DPClustering
    from dpspark.privacy.domain import Domain

    monkeypatch.delenv("DPSPARK_MAX_PAIRS", raising=False)
    domain = Domain(dim=2, lower=[0.0, 0.0], upper=[1.0, 1.0])
    assert MaxCover(k=3, epsilon=1.0, delta=1e-6, domain=domain)._validated_params().max_pairs == 32_000_000
    with pytest.raises(ConfigError, match="max_pairs"):
        MaxCover(k=3, epsilon=1.0, delta=1e-6, domain=domain, max_pairs=10**12)._validated_params()
    with pytest.raises(ValueError, match="max_pairs|maxPairs"):
        DPClustering(k=3, epsilon=1.0, delta=1e-6, lower=[0.0, 0.0], upper=[1.0, 1.0], algorithm="maxcover",
                     maxPairs=10**11).toConfig()


def test_a_raised_bound_in_a_ledgered_run_is_refused_before_the_charge(spark, tmp_path, write_delta, monkeypatch, capsys):
    monkeypatch.delenv("DPSPARK_MAX_PAIRS", raising=False)
    path = write_delta(points_frame(30))
    ledger = str(tmp_path / "ledger")
    key = set_budget(spark, ledger, path, delta=1e-3)
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger, "privacy.delta": 1e-6, "seed": None,
                                            "unsafe_fixed_seed": False, "algorithm": {"name": "maxcover", "k": 3}})
    assert main(["run", "--config", cfg, "--set", "algorithm.max_pairs=100000000000"], spark=spark) == 2
    assert "deployment's ceiling" in capsys.readouterr().err
    assert _spent(spark, ledger, key) == (0.0, 0.0)


@pytest.mark.parametrize("overrides,route", [({"k": 128}, "maxcover"), ({"k": 1001}, "tree_lloyd"),
                                             ({"epsilon": 100.0}, "tree_lloyd"), ({"k": 30000}, "tree_lloyd")])
def test_auto_validates_the_route_it_chooses_before_the_charge(overrides, route):
    """auto's 2-d route is maxcover; public inputs it cannot take (its coverage loop's per-pick weight
    over 1 at epsilon 100; a grid over 10^6 points at k 30000) or takes too slowly (k over 128: k = 1001
    ran 15 minutes after its charge) choose the tree route instead of a failure after the charge."""
    from dpspark.runner import estimator_class

    raw = _maxcover_raw()
    raw["algorithm"] = {"name": "auto", "k": overrides.get("k", 3)}
    raw["privacy"]["epsilon"] = overrides.get("epsilon", 1.0)
    config = validate(raw)
    estimator = estimator_class("auto").from_config(config)
    chosen, why = estimator._validated()
    assert chosen == route, why
    assert estimator.privacy_plan() == ((config.privacy.epsilon, 1e-6) if route == "maxcover"
                                        else (config.privacy.epsilon, 0.0))
    if route == "maxcover":
        estimator._maxcover(None)._validated_params()  # what the fit builds: valid before any charge


def test_a_ledger_path_with_no_ledger_is_refused_and_nothing_is_created(spark, tmp_path, write_delta, capsys):
    """A typo in privacy.ledger created a new, empty ledger there (with started and refused events),
    and the message told the administrator to set a budget THERE: a second balance for the same
    table (issue 50). A run or a fit never creates a ledger: exit 3, nothing written."""
    from dpspark.errors import BudgetRefused
    from dpspark.ml import DPClustering

    path = write_delta(points_frame(30))
    ledger = str(tmp_path / "ledger")
    set_budget(spark, ledger, path)
    typo = str(tmp_path / "ledgr")
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": typo, "seed": None, "unsafe_fixed_seed": False})
    capsys.readouterr()
    assert main(["run", "--config", cfg, "--run-id", "typo", "--json"], spark=spark) == 3
    out = capsys.readouterr()
    assert f"no ledger at {typo}" in out.err and "set-budget" in out.err and "$DPSPARK_LEDGER" in out.err
    assert json.loads(out.out.strip().splitlines()[-1])["epsilon_spent"] == 0.0
    assert not os.path.exists(typo)
    df = spark.read.format("delta").load(path)
    with pytest.raises(BudgetRefused, match="no ledger at"):
        DPClustering(k=3, epsilon=1.0, lower=[0.0, 0.0], upper=[100.0, 100.0], inputCols=["x", "y"], algorithm="dplloyd",
                     ledgerPath=typo, ledgerInput=path).fit(df)
    assert not os.path.exists(typo)
    # the real ledger still works, and holds nothing of the refused attempts
    cfg, _ = make_config(tmp_path, path, **{"privacy.ledger": ledger, "seed": None, "unsafe_fixed_seed": False})
    assert main(["run", "--config", cfg, "--run-id", "real"], spark=spark) == 0
    assert [e["run_id"] for e in Ledger(spark, ledger).runs()] == ["real"] * 4
