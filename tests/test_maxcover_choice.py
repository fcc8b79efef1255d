"""``candidates: grid_or_private``, maxcover's default in 2-3 dimensions: a released row count chooses the
public grid or the private grid cells. The release (n + discrete Laplace), its charge, the public rule and
the config and estimator checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpspark.config import validate
from dpspark.errors import ConfigError
from dpspark.maxcover.estimator import CHOICE_LABEL, MaxCover, choose_by_count
from dpspark.maxcover.params import (CHOICE_SHARE, DEFAULT_SPLIT_PRIVATE, GRID_PER_CLUSTER, PRIVATE_MIN_SIGNAL, ZOOM_SHARE,
                                     choose_candidates, default_candidates)
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import NoNoise, SeededNoise

BOX = Domain(dim=2, lower=(0.0, 0.0), upper=(1.0, 1.0))
DELTA = 1e-6


def test_the_default_is_grid_or_private_in_two_and_three_dimensions_and_tree_above():
    assert [default_candidates(d) for d in (1, 2, 3, 4, 24)] == ["grid_or_private"] * 3 + ["tree"] * 2


def test_the_rule_reads_the_released_count_epsilon_and_k_only():
    k, eps = 10, 0.5
    edge = PRIVATE_MIN_SIGNAL * k / eps  # 100,000 rows
    assert choose_candidates(edge, eps, k) == "private"
    assert choose_candidates(edge - 1, eps, k) == "grid"
    assert choose_candidates(-50.0, eps, k) == "grid"  # a negative noisy count counts as 0


def estimator(**kw):
    return MaxCover(k=4, epsilon=2.0, delta=DELTA, domain=BOX, objective="kmeans", **kw)


@pytest.mark.parametrize("rows, mode", [(100, "grid"), (10_000_000, "private")])
def test_the_count_is_charged_and_the_rest_is_the_chosen_modes_split(rows, mode):
    est = estimator()
    params = est._validated_params()
    assert params.candidates == "grid_or_private"
    acc = Accountant(2.0, DELTA, NoNoise())
    chosen, budget, info = est.resolve_candidates(params, lambda: rows, acc)
    assert chosen.candidates == mode and info["chosen"] == mode and info["noisy_rows"] == rows
    assert [c.label for c in acc.charges] == [CHOICE_LABEL]
    assert acc.charges[0].epsilon == CHOICE_SHARE * 2.0 and acc.charges[0].delta == 0.0
    rest = 2.0 * (1 - CHOICE_SHARE - (ZOOM_SHARE if mode == "grid" else 0.0))
    total_eps = math.fsum(e for e, _ in budget.values())
    total_delta = math.fsum(d for _, d in budget.values())
    assert math.isclose(total_eps, 2.0, rel_tol=1e-12) and math.isclose(total_delta, DELTA, rel_tol=1e-12)
    if mode == "grid":
        assert chosen.candidate_count == max(1000, GRID_PER_CLUSTER * 4) and budget["candidates"] == (0.0, 0.0)
        assert math.isclose(budget["coverage"][0], 0.5 * rest) and budget["coverage"][1] == DELTA
    else:
        assert math.isclose(budget["candidates"][0], DEFAULT_SPLIT_PRIVATE[0] * rest)
        assert math.isclose(budget["candidates"][1], DELTA / 2) and math.isclose(budget["coverage"][1], DELTA / 2)


def test_a_public_mode_reads_no_count():
    est = estimator(candidates="grid")
    acc = Accountant(2.0, DELTA, NoNoise())

    def no_count():
        raise AssertionError("a public mode must not count the rows")

    params, budget, info = est.resolve_candidates(est._validated_params(), no_count, acc)
    assert params.candidates == "grid" and info == {} and acc.charges == []


def test_the_count_is_noisy_at_the_stated_scale():
    """The choice must come from n + DLap(1 / (CHOICE_SHARE eps)), not from n. At eps = 1 and k = 1 the
    scale is b = 50 rows; with n = threshold - 50 the private branch is taken when the noise is >= 50:
    P = p^50 / (1 + p) with p = exp(-1 / b), 0.1858 for the discrete Laplace. 4000 seeded draws; the
    band is 5 standard deviations (two-sided, about 6e-7 to fail by chance). Using the exact count gives
    0; the whole epsilon instead of its share (scale 1) gives about 0; twice the share about 0.07."""
    k, eps = 1, 1.0
    n = int(PRIVATE_MIN_SIGNAL * k / eps) - 50
    b = 1.0 / (CHOICE_SHARE * eps)
    p = math.exp(-1.0 / b)
    expected = p**50 / (1 + p)
    draws = 4000
    noise = SeededNoise(20261204)
    params = MaxCover(k=k, epsilon=eps, delta=DELTA, domain=BOX)._validated_params()
    hits = 0
    for _ in range(draws):
        acc = Accountant(eps, DELTA, noise)
        _, _, info = choose_by_count(n, params, eps, DELTA, k, acc)
        hits += info["chosen"] == "private"
    sd = math.sqrt(expected * (1 - expected) / draws)
    assert abs(hits / draws - expected) <= 5 * sd, (hits / draws, expected)


def raw_config(**algorithm):
    return {
        "input": {"path": "data/points", "features": ["x", "y"]},
        "output": {"path": "out/x"},
        "domain": {"lower": [0, 0], "upper": [1, 1]},
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "algorithm": {"name": "maxcover", "k": 3, **algorithm},
    }


def test_the_config_default_and_its_refusals():
    assert validate(raw_config()).algorithm.params.candidates == "grid_or_private"
    assert validate(raw_config(candidate_scales=3)).algorithm.params.candidate_scales == 3  # used by its private branch
    for key, value in (("eps_split", [0.2, 0.4, 0.4]), ("eps_coverage", 0.5), ("delta_candidates", 0.3)):
        with pytest.raises(ConfigError) as err:
            validate(raw_config(**{key: value}))
        assert err.value.key == f"algorithm.{key}" and "grid_or_private" in str(err.value)
    # named modes keep their keys
    assert validate(raw_config(candidates="private", eps_split=[0.2, 0.4, 0.4])).algorithm.params.eps_candidates == 0.2


def test_the_estimator_refuses_a_split_for_grid_or_private():
    with pytest.raises(ValueError, match="grid_or_private"):
        estimator(eps_coverage=0.5)._validated_params()
    with pytest.raises(ValueError, match="grid_or_private"):
        estimator(candidates="grid_or_private", delta_candidates=0.2)._validated_params()
    assert estimator(eps_coverage=0.5, eps_counts=0.5, candidates="grid")._validated_params().eps_coverage == 0.5
    assert np.isfinite(estimator().privacy_plan()[0])


def test_a_grid_branch_too_large_to_build_is_refused_before_the_count():
    """The grid branch is built only after the count is charged: an impossible grid must be refused first."""
    wide = Domain(dim=30, lower=(0.0,) * 30, upper=(1.0,) * 30)
    est = MaxCover(k=2, epsilon=1.0, delta=DELTA, domain=wide, features=("v",), candidates="grid_or_private")
    with pytest.raises(ValueError, match="grid_or_private"):
        est._validated_params()
    raw = raw_config(candidates="grid_or_private")
    raw["input"]["features"] = [f"f{j}" for j in range(30)]
    raw["domain"] = {"lower": [0] * 30, "upper": [1] * 30}
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert err.value.key == "algorithm.candidates"
