"""maxcover's last DP Lloyd step (``lloyd_share``; k-means, default 0.5 with tree candidates): its charge,
its move, its defaults and refusals, and the Spark fit's accounting."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpspark.config import validate
from dpspark.dplloyd.core import numpy_aggregate
from dpspark.errors import ConfigError
from dpspark.maxcover.estimator import LLOYD_LABEL, MaxCover
from dpspark.maxcover.params import budget_split, default_lloyd_share
from dpspark.maxcover.passes import PassCounter
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.mechanisms import NoNoise

DELTA = 1e-6
CUBE = Domain(dim=4, lower=(-1.0,) * 4, upper=(1.0,) * 4)


def test_the_default_share_from_public_inputs():
    assert default_lloyd_share("kmeans", "tree") == 0.5
    assert [default_lloyd_share("kmeans", m) for m in ("grid", "private", "grid_or_private", "table", "random")] == [0.0] * 5
    assert default_lloyd_share("kmedian", "tree") == 0.0
    est = MaxCover(k=2, epsilon=1.0, delta=DELTA, domain=CUBE, features=("a", "b", "c", "d"))
    params = est._validated_params()
    assert params.candidates == "tree" and params.lloyd_share == 0.5
    budget = budget_split(1.0, DELTA, params)
    assert budget["lloyd"] == (0.5, 0.0) and math.isclose(math.fsum(e for e, _ in budget.values()), 1.0, rel_tol=1e-12)
    assert budget["candidates"][0] == 0.4 * 0.5


def test_without_noise_the_step_is_a_lloyd_step():
    """NoNoise (testing aid): the polish must move each center to the exact mean of its points and
    charge exactly eps_lloyd under its label; a step that skipped the data or charged nothing fails."""
    rng = np.random.default_rng(5)
    a = rng.normal(-0.5, 0.05, size=(400, 4))
    b = rng.normal(0.4, 0.05, size=(600, 4))
    unit = np.clip(np.vstack([a, b]), -1, 1)
    est = MaxCover(k=2, epsilon=1.0, delta=DELTA, domain=CUBE, features=("a", "b", "c", "d"))
    acc = Accountant(1.0, 0.0, NoNoise())
    start = np.array([[-0.3] * 4, [0.2] * 4])
    counter = PassCounter()
    centers, weights = est.polish(start, numpy_aggregate(unit), 0.5, acc, counter, {})
    assert np.allclose(centers, [a.mean(axis=0), b.mean(axis=0)], atol=1e-6)
    assert list(weights) == [400.0, 600.0] and counter.by_kind == {"lloyd": 1}
    assert math.isclose(acc.spent_epsilon, 0.5) and acc.spent_delta == 0
    assert all(c.label.startswith(LLOYD_LABEL) for c in acc.charges) and len(acc.charges) == 2  # counts, sums


def test_kmedian_refuses_a_lloyd_share():
    with pytest.raises(ValueError, match="k-means only"):
        MaxCover(k=2, epsilon=1.0, delta=DELTA, domain=CUBE, features=("v",), objective="kmedian", lloyd_share=0.3)._validated_params()
    with pytest.raises(ValueError, match="lloyd_share"):
        MaxCover(k=2, epsilon=1.0, delta=DELTA, domain=CUBE, features=("v",), lloyd_share=0.95)._validated_params()
    raw = {
        "input": {"path": "data/points", "features": ["a", "b", "c", "d"]}, "output": {"path": "out/x"},
        "domain": {"lower": [0] * 4, "upper": [1] * 4}, "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "algorithm": {"name": "maxcover", "k": 3, "objective": "kmedian", "lloyd_share": 0.2},
    }
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert err.value.key == "algorithm.lloyd_share"
    raw["algorithm"].update(objective="kmeans")
    assert validate(raw).algorithm.params.lloyd_share == 0.2
    del raw["algorithm"]["lloyd_share"]
    assert validate(raw).algorithm.params.lloyd_share == 0.5


def test_a_spark_fit_charges_the_step_and_the_total(spark):
    rng = np.random.default_rng(11)
    centers = np.array([[-0.6, -0.6, 0.5, 0.0], [0.6, 0.5, -0.5, 0.2]])
    pts = np.clip(centers[rng.integers(0, 2, size=3000)] + rng.normal(0, 0.05, size=(3000, 4)), -1, 1)
    df = spark.createDataFrame(pd.DataFrame(pts, columns=["a", "b", "c", "d"])).repartition(2)
    operational: dict = {}
    model = MaxCover(k=2, epsilon=2.0, delta=DELTA, domain=CUBE, features=("a", "b", "c", "d"), seed=3,
                     candidate_count=64).fit(df, operational=operational)
    lloyd = [c for c in model.charges if c["step"].startswith(LLOYD_LABEL)]
    assert len(lloyd) == 2 and math.isclose(math.fsum(c["epsilon"] for c in lloyd), 1.0) and all(c["delta"] == 0 for c in lloyd)
    assert math.isclose(model.epsilon_spent, 2.0) and math.isclose(model.delta_spent, DELTA)
    assert operational["passes_by_kind"]["lloyd"] == 1 and model.parameters["lloyd_share"] == 0.5
    # two tight blobs, 3000 points, epsilon 2: every released center sits near a blob
    dist = np.linalg.norm(model.centers[:, None, :] - centers[None, :, :], axis=2)
    assert dist.min(axis=1).max() < 0.2
