"""bench_common's generated mixtures (the 2-3-d sweeps across n): seeded, named by d and n, no shared data needed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_common as bc  # noqa: E402


@pytest.mark.parametrize("name,dim,n", [("mix2d_n5000", 2, 5000), ("mix3d_n20000", 3, 20000)])
def test_mixture_is_named_seeded_and_sized(name, dim, n):
    got_name, x, k = bc.LOADERS_BY_NAME[name]()
    assert (got_name, x.shape, k) == (name, (n, dim), bc.MIXTURE_K)
    again = bc.LOADERS_BY_NAME[name]()[1]
    assert np.array_equal(x, again)  # seeded: the same table every time
    assert np.isfinite(x).all()


def test_mixtures_of_one_dim_share_their_clusters():
    # n changes the draw, not the clusters: the column means of 5e3 and 1e5 rows agree to a few units of the
    # [0, 100] box (the sd of a mean of 5000 points of spread <= 40 is under 1; 5 is > 5 sd)
    small = bc.load_mixture(2, 5_000)[1]
    large = bc.load_mixture(2, 100_000)[1]
    assert np.abs(small.mean(axis=0) - large.mean(axis=0)).max() < 5.0
    other_dim = bc.load_mixture(3, 5_000)[1]
    assert other_dim.shape[1] == 3
    assert set(bc.MIXTURES) <= set(bc.LOADERS_BY_NAME)
