"""dplloyd on Spark: every variant through the CLI, and data-independent initial centroids."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from dpspark.cli import main
from dpspark.dplloyd.estimator import DPLloyd
from dpspark.privacy.domain import Domain

from test_pipeline import make_config, points_frame


@pytest.mark.parametrize("variant, noise, merge", [
    ("average_k", "su", "weighted_kmeans"), ("allocation_k", "paper", "weighted_kmeans"),
    ("average_nk", "su", "nearest_pair"), ("allocation_nk", "paper", "weighted_kmeans"),
])
def test_every_variant_releases_k_centers_from_a_delta_table(spark, tmp_path, write_delta, variant, noise, merge):
    path = write_delta(points_frame(200))
    cfg, c = make_config(tmp_path, path, **{"algorithm.variant": variant, "algorithm.iterations": 6,
                                           "algorithm.noise": noise, "algorithm.merge": merge, "algorithm.k": 3})
    assert main(["run", "--config", cfg, "--run-id", variant], spark=spark) == 0
    with open(os.path.join(c["output"]["path"], "summary.json")) as handle:
        summary = json.load(handle)
    assert len(summary["centers"]) == 3 and summary["parameters"]["variant"] == variant
    assert abs(summary["epsilon_spent"] - 1.0) <= 1e-9 and summary["delta_spent"] == 0.0
    centers = np.array(summary["centers"])
    assert np.all((centers >= 0) & (centers <= 100))  # released centers lie in the public domain


def test_initial_centroids_are_the_same_for_two_datasets_with_one_seed(spark):
    domain = Domain(2, (0.0, 0.0), (100.0, 100.0))
    a = spark.createDataFrame(points_frame(50, seed=1))
    b = spark.createDataFrame(pd.DataFrame({"x": np.full(10, 3.0), "y": np.full(10, 97.0)}))
    fits = [DPLloyd(k=4, epsilon=1.0, domain=domain, features=("x", "y"), iterations=3, seed=11).fit(df) for df in (a, b)]
    assert fits[0].info["initial_centroids_unit"] == fits[1].info["initial_centroids_unit"]
    assert not np.allclose(fits[0].centers, fits[1].centers)
