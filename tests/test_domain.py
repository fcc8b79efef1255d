"""The public domain: clipping into a box or a ball, unit space, and its Spark form."""

import numpy as np
import pandas as pd
import pytest

from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE, dequantize, quantize


def test_box_clip_and_round_trip():
    d = Domain(2, lower=(0.0, -10.0), upper=(100.0, 10.0))
    u = d.clip_to_unit(np.array([[50.0, 0.0], [150.0, -20.0], [0.0, 10.0]]))
    assert np.allclose(u, [[0, 0], [1, -1], [-1, 1]])
    assert np.allclose(d.from_unit(u), [[50, 0], [100, -10], [0, 10]])


def test_ball_clip_projects_onto_the_ball():
    d = Domain(3, radius=2.0)
    u = d.clip_to_unit(np.array([[0.0, 0.0, 1.0], [0.0, 6.0, 8.0]]))
    assert np.allclose(u, [[0, 0, 0.5], [0, 0.6, 0.8]])
    assert np.all(np.linalg.norm(d.sample_unit(np.random.default_rng(0), 1000), axis=1) <= 1 + 1e-12)


def test_unit_space_bounds_give_sensitivity_one():
    d = Domain(4, lower=(0,) * 4, upper=(1,) * 4)
    u = d.clip_to_unit(np.random.default_rng(1).normal(0, 10, size=(1000, 4)))
    assert np.abs(u).max() <= 1.0
    q = quantize(u)
    assert np.abs(q).max() <= SCALE and np.allclose(dequantize(q), u, atol=1 / SCALE)


@pytest.mark.parametrize("domain", [Domain(2, lower=(0.0, -10.0), upper=(100.0, 10.0)), Domain(2, radius=5.0)])
def test_spark_clipping_matches_numpy(spark, domain):
    from pyspark.sql import functions as F

    x = np.random.default_rng(2).normal(0, 60, size=(300, 2))
    df = spark.createDataFrame(pd.DataFrame(x, columns=["a", "b"]))
    got = df.select(*[c.alias(f"u{j}") for j, c in enumerate(domain.unit_columns([F.col("a"), F.col("b")]))]).toPandas().to_numpy()
    assert np.allclose(got, domain.clip_to_unit(x), atol=1e-12)
