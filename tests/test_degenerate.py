"""Tests for dpspark.degenerate: a collapsed release is reported honestly (issue 16, item 5). No Spark.

describe_collapse is post-processing of released values (centers, noisy weights) and public
parameters; every test here is deterministic (no randomness is involved at all).
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from dpspark.degenerate import EQUAL_TOLERANCE, TOP_SHARE, coinciding_groups, describe_collapse

HEALTHY_CENTERS = [[10.0, 10.0], [80.0, 20.0], [50.0, 90.0], [20.0, 70.0]]
HEALTHY_WEIGHTS = [3100.0, 2900.0, 3300.0, 3193.0]


def test_healthy_release_is_none():
    for algorithm in ("ldp", "maxcover", "dplloyd"):
        assert describe_collapse(HEALTHY_CENTERS, HEALTHY_WEIGHTS, 4, 100.0, algorithm, 1.0) is None
    # 90% on one center is uneven, not collapsed (the line is 95%).
    assert describe_collapse(HEALTHY_CENTERS, [900.0, 30.0, 30.0, 40.0], 4, 100.0, "maxcover", 1.0) is None
    # k = 1: one center holds all the weight by design.
    assert describe_collapse([[5.0, 5.0]], [12.0], 1, 100.0, "dplloyd", 1.0) is None
    # A negative noisy weight next to healthy ones is noise, not a collapse.
    assert describe_collapse(HEALTHY_CENTERS, [3100.0, 2900.0, -4.0, 3193.0], 4, 100.0, "dplloyd", 1.0) is None


def test_ldp_trial_four_identical_centers_all_weight_on_one():
    """The user trial: ldp at epsilon 1 on 12,493 users released 4 identical centers, all weight on one."""
    centers = [[37.25, 61.5]] * 4
    weights = [12493.0, -12.0, 0.0, -3.5]
    out = describe_collapse(centers, weights, 4, 100.0, "ldp", 1.0)
    assert out is not None
    assert out["distinct_centers"] == 1 and out["k"] == 4 and out["top_weight_share"] == 1.0
    assert "only 1 distinct center among the 4 released for k = 4" in out["message"]
    assert "100.0% of the positive noisy weight is on one center" in out["message"]
    cause = out["likely_cause"]
    assert cause.startswith("too few users for the local model at this epsilon: the LDP paper's error grows like "
                            "sqrt(n)/epsilon; about ")
    # Rough rule n_needed ~= 5000 k^2 * 4e^eps/(e^eps-1)^2 = 294,600 at k = 4, eps = 1; n_est = sum of the
    # released weights = 12,477.5: a factor of 23.6, said with two significant digits.
    assert "about 24 times more users would help" in cause and "rough estimate" in cause
    assert "about 290,000 users needed" in cause and "about 12,000 users by the released weights" in cause
    assert json.dumps(out, allow_nan=False)  # goes into summary.json as it is


def test_ldp_factor_follows_public_n_and_epsilon():
    centers, weights = [[1.0, 1.0]] * 4, [1000.0, 0.0, 0.0, 0.0]
    ratio = lambda out: float(out["likely_cause"].split("about ")[1].split(" times")[0])  # noqa: E731
    small = describe_collapse(centers, weights, 4, 10.0, "ldp", 1.0, n_hint=10_000)
    bigger = describe_collapse(centers, weights, 4, 10.0, "ldp", 1.0, n_hint=20_000)
    assert ratio(small) == 29 and ratio(bigger) == 15  # twice the users, half the factor (2 digits)
    assert "about 10,000 users" in small["likely_cause"]  # the public count, not the weights, when given
    # A larger epsilon needs fewer users: the factor falls (about 1/eps^2 for small eps).
    assert ratio(describe_collapse(centers, weights, 4, 10.0, "ldp", 2.0, n_hint=10_000)) < ratio(small) / 4
    # Enough users by the rule: the text says the cause may be the data instead.
    many = describe_collapse(centers, weights, 4, 10.0, "ldp", 1.0, n_hint=10_000_000)
    assert "times more users" not in many["likely_cause"]
    assert "fewer than k separate clusters" in many["likely_cause"]
    # No usable estimate of n (the weights sum to <= 0, no hint): no invented factor.
    none = describe_collapse(centers, [-5.0, 0.0, 0.0, 0.0], 4, 10.0, "ldp", 1.0)
    assert "no usable estimate of n" in none["likely_cause"] and "times" not in none["likely_cause"]


def test_central_families_cause():
    for algorithm in ("maxcover", "dplloyd"):
        out = describe_collapse([[1.0, 1.0]] * 3, [50.0, 1.0, 2.0], 3, 100.0, algorithm, 0.1)
        assert out["likely_cause"].startswith("epsilon too small for this k, or the domain much larger than the data")
        assert "users" not in out["likely_cause"]


def test_weight_on_one_center_alone_is_a_collapse():
    out = describe_collapse(HEALTHY_CENTERS, [1000.0, 10.0, 10.0, 10.0], 4, 100.0, "maxcover", 1.0)
    assert out["distinct_centers"] == 4 and out["top_weight_share"] == pytest.approx(1000 / 1030)
    assert "97.1% of the positive noisy weight is on one center" in out["message"]
    assert "distinct" not in out["message"]
    # Only POSITIVE weight counts: negative noise does not dilute the share.
    out = describe_collapse(HEALTHY_CENTERS, [100.0, -500.0, 2.0, 1.0], 4, 100.0, "maxcover", 1.0)
    assert out["top_weight_share"] == pytest.approx(100 / 103)
    # Exactly at the line counts as collapsed; just under does not.
    assert TOP_SHARE == 0.95
    assert describe_collapse(HEALTHY_CENTERS, [95.0, 5.0, 0.0, 0.0], 4, 100.0, "dplloyd", 1.0) is not None
    under = [94.99, 5.01, 0.0, 0.0]
    assert describe_collapse(HEALTHY_CENTERS, under, 4, 100.0, "dplloyd", 1.0) is None


def test_no_positive_weight_and_missing_rows_are_collapses():
    out = describe_collapse(HEALTHY_CENTERS, [-1.0, 0.0, -2.0, 0.0], 4, 100.0, "dplloyd", 1.0)
    assert out["top_weight_share"] == 0.0 and "no center has a positive noisy weight" in out["message"]
    out = describe_collapse(HEALTHY_CENTERS[:2], [10.0, 12.0], 4, 100.0, "maxcover", 1.0)
    assert out["distinct_centers"] == 2 and "only 2 distinct centers among the 2 released for k = 4" in out["message"]


def test_equal_means_within_a_tiny_fraction_of_the_domain_width():
    width = 200.0
    base = np.array([[10.0, -3.0], [10.0, -3.0], [60.0, 40.0]])
    weights = [100.0, 90.0, 95.0]
    # Half the tolerance (0.5e-4 of the width) apart: equal.
    close = base.copy()
    close[1] += 0.5 * EQUAL_TOLERANCE * width
    out = describe_collapse(close, weights, 3, width, "maxcover", 1.0)
    assert out["distinct_centers"] == 2
    # 1e-3 of the width apart: two centers, a healthy release.
    apart = base.copy()
    apart[1] += 1e-3 * width
    assert describe_collapse(apart, weights, 3, width, "maxcover", 1.0) is None
    # One width per coordinate (a box): the tolerance is per coordinate.
    per = base.copy()
    per[1, 1] += 1e-3  # tiny against coordinate 1's width 1000, large against coordinate 0's width 1e-3
    assert describe_collapse(per, weights, 3, [1e-3, 1000.0], "maxcover", 1.0)["distinct_centers"] == 2
    per = base.copy()
    per[1, 0] += 1e-3
    assert describe_collapse(per, weights, 3, [1e-3, 1000.0], "maxcover", 1.0) is None


def test_coinciding_groups():
    pts = np.array([[0.0, 0.0], [5.0, 5.0], [1e-12, 0.0], [5.0, 5.0 + 1e-12], [np.nan, 0.0], [np.nan, 0.0],
                    [np.inf, 1.0], [np.inf, 1.0]])
    groups = coinciding_groups(pts, 10.0)
    assert [g.tolist() for g in groups] == [[0, 2], [1, 3], [4], [5], [6], [7]]  # non-finite rows stay alone
    assert [g.tolist() for g in coinciding_groups(pts[:4], 10.0, rel_tol=1.0)] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="must be positive"):
        coinciding_groups(pts, 0.0)
    with pytest.raises(ValueError, match="must be positive"):
        coinciding_groups(pts, np.nan)
    # A box [-1e308, 1e308]: upper - lower overflows to inf; still a usable (huge) width.
    assert len(coinciding_groups(np.array([[0.0], [1e299], [-1e308]]), np.inf)) == 2  # tolerance 1.8e299
    with pytest.raises(ValueError, match="domain_width has 3 values"):
        coinciding_groups(pts, [1.0, 1.0, 1.0])


def test_inputs_are_checked_and_not_changed():
    centers = np.array(HEALTHY_CENTERS)
    weights = np.array([1000.0, 1.0, 1.0, 1.0])
    before = (centers.copy(), weights.copy())
    first = describe_collapse(centers, weights, 4, 100.0, "maxcover", 1.0)
    assert first == describe_collapse(centers, weights, 4, 100.0, "maxcover", 1.0)  # deterministic
    assert np.array_equal(centers, before[0]) and np.array_equal(weights, before[1])
    with pytest.raises(ValueError, match="noisy_weights has 3 values but centers has 4 rows"):
        describe_collapse(centers, weights[:3], 4, 100.0, "maxcover", 1.0)
    # 1-D centers given as a flat list; no rows at all.
    assert describe_collapse([1.0, 9.0], [10.0, 11.0], 2, 10.0, "dplloyd", 1.0) is None
    assert describe_collapse([], [], 2, 10.0, "dplloyd", 1.0)["distinct_centers"] == 0


def test_numpy_only():
    """Post-processing of released values: importing it pulls in neither Spark nor the report's matplotlib."""
    code = ("import sys, dpspark.degenerate; "
            "assert not any(m.split('.')[0] in ('pyspark', 'matplotlib', 'pandas') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
