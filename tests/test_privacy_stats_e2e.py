"""Accounting blocks that check themselves (issue 13, defect 11) and statistical privacy
tests that can catch a broken mechanism (issue 13, "Statistical tests ...").

Every statistical test below estimates a privacy loss from many draws, states the
confidence at which it could fail by chance, and runs the same check on a
deliberately broken variant (half the noise, doubled weight, inverted scale, stale
counts, missing stability threshold, missing clamp) which it must catch.

- The production sampler (``OpenDPNoise``, OS randomness: it cannot be seeded) is
  tested at the scales the families really use, with enough draws that a correct
  sampler fails with probability < 1e-6.
- The end-to-end tests use the seeded ``SeededNoise`` (same distributions) and are
  reproducible.

Confidence: ``privacy_stats.Z_BOUND`` = 7 standard errors per compared quantity; with
at most ~60 quantities per test the false-failure probability is < 1e-6 (normal
approximation; the log-ratio bins hold >= 500 draws, see ``privacy_stats``).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from dpspark.dplloyd import core as lloyd_core
from dpspark.steps import lloyd as lloyd_step
from dpspark.steps.lloyd_pass import partition_aggregator
from dpspark.errors import PrivacyAccountingError
from dpspark.maxcover import candidates as cand_mod
from dpspark.maxcover import core as cov_core
from dpspark.maxcover import kernels as cov_kernels
from dpspark.maxcover import passes as cov_passes
from dpspark.privacy.accountant import Accountant
from dpspark.privacy.domain import Domain
from dpspark.privacy.fixedpoint import SCALE
from dpspark.privacy.mechanisms import (ExponentialMechanism, LaplaceMechanism, NoNoise, OpenDPNoise,
                                        SeededNoise)

from privacy_stats import (MARGIN, Z_BOUND, binned_log_ratios, discrete_laplace_epsilon, estimated_loss,
                           log_ratio, worst_excess)


class Exploding(NoNoise):
    """A noise source that must never be reached (a refused release draws no noise)."""

    def discrete_laplace(self, scale, size):
        raise AssertionError("noise drawn for a refused release")

    def gumbel_argmax(self, scores, scale):
        raise AssertionError("noise drawn for a refused release")


class HalvedLaplace(LaplaceMechanism):
    """Deliberately broken: half the noise its privacy map claims."""

    @property
    def scale_steps(self):
        return super().scale_steps / 2


class InvertedLaplace(LaplaceMechanism):
    """Deliberately broken: noise scale 1/scale (a classic parametrisation mix-up)."""

    @property
    def scale_steps(self):
        return 1.0 / super().scale_steps


class DoubledWeight(ExponentialMechanism):
    """Deliberately broken: samples ∝ exp(2 * weight * score)."""

    @property
    def weight(self):
        return 2 * super().weight


class InvertedScale(ExponentialMechanism):
    """Deliberately broken: passes the weight where the Gumbel scale 1/weight belongs."""

    def select(self, scores, noise):
        s = np.asarray(scores, dtype=np.int64)
        return noise.gumbel_argmax(s, self.weight)


# ============================================================================
# Defect 11: a block is proved for given mechanisms and a number of releases


def test_block_refuses_a_mechanism_it_was_not_proved_for():
    pick = ExponentialMechanism.with_weight(0.01)
    counts = LaplaceMechanism(0.3)
    acc = Accountant(1.0, 1e-6, Exploding())
    block = acc.block("loop", 1.0, 1e-6, "Lemma X", releases={pick: 5, counts: 1})
    refused = [
        ("exponential", ExponentialMechanism.with_weight(0.02)),  # larger epsilon
        ("exponential", ExponentialMechanism.with_weight(0.01, sensitivity=2.0)),  # other sensitivity
        ("exponential", ExponentialMechanism(0.01, monotone=False)),  # other rule, same epsilon
        ("exponential", DoubledWeight(pick.epsilon)),  # same fields, another class
        ("laplace", LaplaceMechanism(0.6)),  # larger epsilon
        ("laplace", LaplaceMechanism(0.3, sensitivity=2.0)),  # other sensitivity
    ]
    for kind, mech in refused:
        release = block.exponential if kind == "exponential" else block.laplace
        arg = np.array([3, 4]) if kind == "exponential" else np.array([3])
        with pytest.raises(PrivacyAccountingError, match="not proved for"):
            release(arg, mech)
    with pytest.raises(PrivacyAccountingError, match="not proved for"):
        block.exponential(np.array([3, 4]), counts)  # declared, but as a Laplace release
    assert block.releases == 0  # nothing counted, and Exploding shows no noise was drawn
    # A block that declares nothing releases nothing.
    empty = Accountant(1.0, 0.0, Exploding()).block("bare", 1.0, 0.0, "Lemma Y")
    with pytest.raises(PrivacyAccountingError, match="declared: none"):
        empty.laplace(np.array([1]), counts)
    # Declarations are checked before the charge.
    acc2 = Accountant(1.0, 0.0, Exploding())
    for bad in ({pick: 0}, {pick: 1.5}, {"pick": 1}, [(pick, 1)]):
        with pytest.raises(PrivacyAccountingError):
            acc2.block("bad", 1.0, 0.0, "Lemma Z", releases=bad)
    assert acc2.spent_epsilon == 0.0


def test_block_refuses_the_release_after_its_cap():
    pick = ExponentialMechanism.with_weight(0.5)
    block = Accountant(1.0, 0.0, SeededNoise(0)).block("loop", 1.0, 0.0, "Lemma X", releases={pick: 3})
    for _ in range(3):
        block.exponential(np.array([1, 2, 3]), ExponentialMechanism.with_weight(0.5))  # an equal object is fine
    assert block.releases == 3
    block.noise = Exploding()
    with pytest.raises(PrivacyAccountingError, match="release 4 .* over the 3 releases"):
        block.exponential(np.array([1, 2, 3]), pick)
    assert block.releases == 3


def _spy_accountant(*args):
    """An Accountant that records what every block declares."""

    class Spy(Accountant):
        declared: list = []

        def block(self, label, epsilon, delta, rule, releases=None):
            self.declared.append((label, releases))
            return super().block(label, epsilon, delta, rule, releases=releases)

    spy = Spy(*args)
    spy.declared = []
    return spy


def test_coverage_loop_declares_its_pick_mechanism_and_count(monkeypatch):
    cands = np.array([[-0.5], [0.0], [0.5]])
    pts = np.array([[-0.5], [0.0], [0.1], [0.5]])
    ts = [0.3, 0.6]
    eps_cov, delta = 0.5, 1e-6
    acc = _spy_accountant(eps_cov, delta, SeededNoise(1))
    picks = cov_core.run_coverage(cov_core.NumpySignatureProvider(pts, cands, ts, 1), 3, ts, 2, acc, eps_cov, delta)
    expected = ExponentialMechanism.with_weight(cov_core.coverage_epsilon(eps_cov, delta))
    assert acc.declared == [(cov_core.COVERAGE_LABEL, {expected: 2 * 2})]
    assert len(picks) == 4

    # A loop that makes one pick more than the public number is refused at that pick.
    real = cov_core.cover_from_signatures

    def one_more(signatures, counts, n_candidates, m, block, mech):
        return real(signatures, counts, n_candidates, m + 1, block, mech)

    monkeypatch.setattr(cov_core, "cover_from_signatures", one_more)
    acc = Accountant(eps_cov, delta, SeededNoise(1))
    with pytest.raises(PrivacyAccountingError, match="release 5 .* over the 4 releases"):
        cov_core.run_coverage(cov_core.NumpySignatureProvider(pts, cands, ts, 1), 3, ts, 2, acc, eps_cov, delta)


# ----------------------------------------------------------------------------
# The private candidate histogram on numpy: the executors' own function (kernels.cell_aggregator,
# what mapInPandas runs), then the driver-side group-by / filter / sort of passes.cell_aggregates.

COLS = ["u0", "u1"]


def numpy_cell_aggregates(df, columns, sides, shifts, min_count=1, counter=None, timings=None):
    dim = len(columns)
    parts = list(cov_kernels.cell_aggregator(sides, shifts, columns, 1 << 16)(iter([df])))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if len(rows):  # the Spark group-by: one row per (level, cell) (a single stream already is)
        gcols = ["level"] + [f"g{j}" for j in range(dim)]
        rows = rows.groupby(gcols, as_index=False).sum()
    return cov_passes.cells_by_level(rows, len(sides), dim, min_count)


class _Passes:
    """Stands in for ``dpspark.maxcover.passes`` inside candidates.py: the same aggregates, without Spark.

    The aggregates are exact (no noise) and the grid comes from the seeded PUBLIC rng, so
    one computation per dataset serves every run.
    """

    def __init__(self):
        self.cache = {}

    def cell_aggregates(self, df, columns, sides, shifts, min_count=1, counter=None, timings=None):
        key = (df.to_numpy().tobytes(), tuple(sides), tuple(np.concatenate(shifts)), min_count)
        if key not in self.cache:
            self.cache[key] = numpy_cell_aggregates(df, columns, sides, shifts, min_count)
        return self.cache[key]


def test_private_candidates_declare_their_two_laplace_releases(monkeypatch):
    monkeypatch.setattr(cand_mod, "passes", _Passes())
    pts = np.vstack([np.full((40, 2), 0.3), np.full((3, 2), -0.7)])
    df = pd.DataFrame(pts, columns=COLS)
    dom = Domain(dim=2, lower=(-1.0, -1.0), upper=(1.0, 1.0))
    acc = _spy_accountant(2.0, 1e-6, SeededNoise(2))
    cand, info = cand_mod.private_candidates(df, COLS, dom, 10, 2, 1, 2.0, 1e-6, acc, np.random.default_rng(0))
    assert len(acc.declared) == 2 and cand.shape[0] >= 1
    for level, (label, releases) in enumerate(acc.declared):
        side = cand_mod.scale_sides(2)[level]
        eps_l = info["scales"][level]["epsilon"]
        eps_c = eps_l * cand_mod.COUNT_SHARE
        lim = cov_kernels.offset_limit(side)
        assert releases == {
            LaplaceMechanism(epsilon=eps_c, sensitivity=1.0): 1,
            LaplaceMechanism(epsilon=eps_l - eps_c, sensitivity=2 * lim / SCALE, unit=1.0 / SCALE): 1,
        }


# ============================================================================
# The production samplers at the scales the families use


def _record_loss(mech: LaplaceMechanism, noise, n: int) -> tuple[float, float]:
    """Estimated privacy loss of ONE record for ``mech`` (and its standard error), from n releases of 0.

    One record moves the query by ``sensitivity`` value units = sensitivity/unit integer
    steps; the discrete Laplace's loss per step is 1/scale_steps (see
    ``privacy_stats.discrete_laplace_epsilon``), so the loss is steps/scale_steps = epsilon.
    """
    draws = mech.release(np.zeros(n, dtype=np.int64), noise)
    steps = mech.sensitivity / mech.unit
    est, se = discrete_laplace_epsilon(draws)
    return steps * est, steps * se


def test_opendp_laplace_at_the_families_scales_and_broken_scales_are_caught():
    """OpenDP's discrete Laplace, through ``LaplaceMechanism.release``, at:

    - maxcover's snap counts, Laplace(1/eps_cnt), eps_cnt = 0.4: scale 2.5 steps;
    - dplloyd's su counts, d = 2, eps_t = 0.1: scale 1/eps_count ~ 37;
    - dplloyd's su sums, d = 2, eps_t = 0.1: scale d * 2^20 / eps_sums ~ 3e7 fixed-point steps.

    The maximum-likelihood loss estimate from 40,000 draws has a relative standard error
    of about 0.5%; a correct sampler is off by more than 7 of them with probability
    < 1e-11 per scale. Half the noise (loss 2 eps: ~50 standard errors off) and the
    inverted scale (80 standard errors, or no noise at all: estimate inf) must be caught
    (10,000 draws each).
    """
    noise = OpenDPNoise()
    eps_count, eps_sums = lloyd_core.su_split(0.1, 2)
    for eps, sens, unit in ((0.4, 1.0, 1.0), (eps_count, 1.0, 1.0), (eps_sums, 2.0, 1.0 / SCALE)):
        est, se = _record_loss(LaplaceMechanism(eps, sens, unit), noise, 40_000)
        assert abs(est - eps) <= Z_BOUND * se, (eps, est, se)
        assert Z_BOUND * se < 0.05 * eps  # the test has power: it resolves the loss to 5%
        for broken in (HalvedLaplace(eps, sens, unit), InvertedLaplace(eps, sens, unit)):
            b_est, b_se = _record_loss(broken, noise, 10_000)
            assert abs(b_est - eps) > Z_BOUND * b_se, (type(broken).__name__, eps, b_est, b_se)


def _fitted_weight(scores: np.ndarray, picks: np.ndarray) -> tuple[float, float]:
    """Maximum-likelihood weight w of P(i) ∝ exp(w * score_i) from observed picks, and its standard error.

    The likelihood equation is E_w[score] = mean observed score (E_w increases with w);
    Fisher information n Var_w(score). A pick pattern at the top score only gives inf.
    """
    s = scores.astype(np.float64) - scores.mean()
    target = float(s[picks].mean())
    if target >= s.max():
        return math.inf, 0.0

    def mean_at(w):
        p = np.exp(w * s - (w * s).max())
        p /= p.sum()
        return float(p @ s), float(p @ s**2 - (p @ s) ** 2)

    lo, hi = -60.0 / np.ptp(s), 60.0 / np.ptp(s)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_at(mid)[0] < target else (lo, mid)
    w = (lo + hi) / 2
    return w, 1.0 / math.sqrt(picks.size * mean_at(w)[1])


def test_opendp_exponential_mechanism_at_the_coverage_scale_and_broken_scales_are_caught():
    """OpenDP's Gumbel-max through ``ExponentialMechanism.select`` at maxcover's real scale.

    Per-pick weight eps' = eps_cov / (2 ln(e/delta)) with eps_cov = 0.25, delta = 1e-6:
    eps' = 0.0084, so the Gumbel scale is 1/eps' ~ 119 (the old check used scale 1, which
    cannot tell the scale from its inverse). Scores are coverage counts 600..960 in steps
    of 120. The privacy loss of one record (scores differing by 1, monotone) is the
    weight itself, estimated by maximum likelihood from 4,000 picks (relative standard
    error ~2%); a correct sampler is off by more than 7 standard errors with
    probability < 1e-11. Doubled weight (~16 standard errors off with 1,500 picks) and
    the inverted scale (always the top score: estimate inf; 500 picks) must be caught.
    """
    noise = OpenDPNoise()
    eps_prime = cov_core.coverage_epsilon(0.25, 1e-6)
    scores = np.array([600, 720, 840, 960], dtype=np.int64)

    def picks(mech, n):
        return np.array([mech.select(scores, noise) for _ in range(n)])

    w, se = _fitted_weight(scores, picks(ExponentialMechanism.with_weight(eps_prime), 4000))
    assert abs(w - eps_prime) <= Z_BOUND * se, (w, se, eps_prime)
    assert Z_BOUND * se < 0.2 * eps_prime  # power: the weight is resolved to 20%, its double is far out
    for broken, n in ((DoubledWeight.with_weight(eps_prime), 1500), (InvertedScale.with_weight(eps_prime), 500)):
        bw, bse = _fitted_weight(scores, picks(broken, n))
        assert abs(bw - eps_prime) > Z_BOUND * bse, (type(broken).__name__, bw, bse)


# ============================================================================
# maxcover end to end: the coverage loop on neighbouring datasets

# A tiny instance (unit space, d = 1, p = 1): three candidates, one threshold (radius 0.3), m = 2
# picks. D1 adds one record x = -0.25 to D0; x lies within the threshold of candidates 0 and 1.
# (One threshold keeps the test fast: every threshold costs one histogram and its sparse updates per
# run. What crosses thresholds, the provider dropping covered points, is the same exact-count rule.)
COV_CANDS = np.array([[-0.5], [0.0], [0.5]])
COV_D0 = np.array([[-0.5], [-0.5], [0.0], [0.5], [0.5]])
COV_X = -0.25
COV_TS = [0.3]
COV_M = 2
COV_DELTA = 1e-6
COV_EPS = 2.0 * 0.95 * (1.0 - math.log(COV_DELTA))  # per-pick weight eps' = 0.95 (the proof needs <= 1)


def _coverage_outputs(points: np.ndarray, seed: int, runs: int) -> list[tuple]:
    provider = cov_core.NumpySignatureProvider(points, COV_CANDS, COV_TS, 1)
    cache: dict = {}

    def cached(i, covered):  # exact and stateless: one computation per (threshold, earlier picks)
        if (i, covered) not in cache:
            cache[(i, covered)] = provider(i, covered)
        return cache[(i, covered)]

    noise = SeededNoise(seed)
    out = []
    for _ in range(runs):
        acc = Accountant(COV_EPS, COV_DELTA, noise)
        out.append(tuple(cov_core.run_coverage(cached, COV_CANDS.shape[0], COV_TS, COV_M, acc, COV_EPS, COV_DELTA)))
    return out


def _per_pick_excess(out0: list[tuple], out1: list[tuple], eps_prime: float) -> float:
    """Worst (|estimated per-pick loss| - its bound) / se over every pick of every released prefix.

    The released output is the pick sequence. Its log-likelihood ratio between D1 and
    D0 is the sum over picks of the per-pick ratio ln P1(o_t | o_<t) / P0(o_t | o_<t).
    A pick made while x is still uncovered is the exponential mechanism with weight eps'
    on monotone counts that differ by at most 1: |per-pick loss| <= eps'. A pick made
    after x was covered sees exactly the same counts on D0 and D1 (exact updates; the
    provider drops covered points): its loss is 0. Lemma 4.1 sums exactly these terms.
    Each prefix with >= 500 draws on both sides is checked.
    """
    def prefixes(outs):
        c = Counter()
        for o in outs:
            for t in range(len(o) + 1):
                c[o[:t]] += 1
        return c

    c0, c1 = prefixes(out0), prefixes(out1)
    ratios, bounds = {}, {}
    for pre in c0:
        if not pre or c0[pre] < 500 or c1.get(pre, 0) < 500:
            continue
        parent = pre[:-1]
        if c0[pre] == c0[parent] and c1[pre] == c1[parent]:
            continue  # a forced pick (one candidate left) carries no information
        ratios[pre] = log_ratio(c1[pre], c1[parent], c0[pre], c0[parent])
        covered = any(abs(COV_X - COV_CANDS[c, 0]) <= COV_TS[i] for c, i in parent)
        bounds[pre] = 0.0 if covered else eps_prime
    return worst_excess(ratios, bounds.__getitem__), len(ratios)


def _stale_cover(signatures, counts, n_candidates, m, block, mech):
    """Deliberately broken Algorithm 1: the scores are never updated after a pick."""
    inc = cov_core.signatures_to_csr(signatures, n_candidates)
    scores = np.asarray(inc.T @ np.asarray(counts, dtype=np.int64), dtype=np.int64).reshape(-1)
    available = np.ones(n_candidates, dtype=bool)
    picks = []
    for _ in range(min(m, n_candidates)):
        idx = np.flatnonzero(available)
        v = int(idx[block.exponential(scores[idx], mech)])
        picks.append(v)
        available[v] = False
    return picks


def test_coverage_loop_end_to_end_per_pick_loss_and_broken_loops_are_caught(monkeypatch):
    """run_coverage on neighbouring datasets (D1 = D0 + x), seeded runs.

    With 6,000 runs a side every per-pick loss (``_per_pick_excess``) stays within its
    bound up to 7 standard errors (false failure < 1e-6 over the <= 9 checked picks).
    The doubled weight gives the first pick a loss ~11.6 standard errors above eps'
    (6,000 runs: missed with probability < 1e-5), and stale counts (not updated after a
    pick) give the pick after x's cover a loss ~12 standard errors above 0 (3,000 runs);
    both must be caught.
    """
    eps_prime = cov_core.coverage_epsilon(COV_EPS, COV_DELTA)
    d1 = np.vstack([COV_D0, [[COV_X]]])
    excess, checked = _per_pick_excess(_coverage_outputs(COV_D0, 1, 6000), _coverage_outputs(d1, 2, 6000), eps_prime)
    assert excess <= Z_BOUND
    assert checked >= 5  # enough picks were observed often enough for the test to mean something

    with monkeypatch.context() as mp:
        mp.setattr(cov_core, "ExponentialMechanism", DoubledWeight)
        doubled, _ = _per_pick_excess(_coverage_outputs(COV_D0, 3, 6000), _coverage_outputs(d1, 4, 6000), eps_prime)
    assert doubled > Z_BOUND
    with monkeypatch.context() as mp:
        mp.setattr(cov_core, "cover_from_signatures", _stale_cover)
        stale, _ = _per_pick_excess(_coverage_outputs(COV_D0, 5, 3000), _coverage_outputs(d1, 6, 3000), eps_prime)
    assert stale > Z_BOUND


# ============================================================================
# maxcover end to end: the private candidate histogram on neighbouring datasets

CELL_DOMAIN = Domain(dim=2, lower=(-1.0, -1.0), upper=(1.0, 1.0))
CELL_SEED = 11  # the PUBLIC rng of the generator: fixes the grid's shift
HEAVY, TARGET = (0.9, 0.9), (-0.9, -0.9)  # unit-space points: a heavy cell, and the cell x falls in


def _grid():
    shift = np.random.default_rng(CELL_SEED).uniform(0.0, 1.0, size=2)  # what private_candidates draws first
    g_heavy = cov_kernels.cell_indices(np.array([HEAVY]), 1.0, shift)[0]
    g_target = cov_kernels.cell_indices(np.array([TARGET]), 1.0, shift)[0]
    assert np.abs(g_heavy - g_target).max() >= 2  # not adjacent: a candidate identifies its cell
    return cov_kernels.cell_centers(g_target[None, :], 1.0, shift)[0]


def _target_released(n_target: int, eps: float, delta: float, seed: int, runs: int) -> np.ndarray:
    """Per run: was a candidate released in the target cell? (one scale, cell side 1, k = 1)."""
    center = _grid()
    pts = np.vstack([np.tile(HEAVY, (60, 1)), np.tile(TARGET, (n_target, 1))])
    df = pd.DataFrame(pts, columns=COLS)
    noise = SeededNoise(seed)
    out = np.empty(runs, dtype=np.int64)
    for r in range(runs):
        acc = Accountant(eps, delta, noise)
        cand, _ = cand_mod.private_candidates(df, COLS, CELL_DOMAIN, 10, 1, 1, eps, delta, acc,
                                              np.random.default_rng(CELL_SEED))
        out[r] = bool(np.any(np.abs(cand - center).max(axis=1) <= 0.5 + 1e-12))
    return out


def test_private_candidates_stability_threshold_end_to_end_and_missing_threshold_is_caught(monkeypatch):
    """The delta part of the stability histogram: a cell that only the added record makes eligible.

    eps_cand = 2 (eps_c = 1.5), delta = 0.05, one scale: threshold T = 4 for cells of
    >= 2 records. D0 has ONE record in the target cell (below MIN_CELL_COUNT: never
    listed, so never released), D1 two. (eps, delta)-DP needs
    P1[released] <= e^eps * P0[released] + delta = delta; the truth is P[2 + Z >= 4] = 0.041.
    5,000 runs on D1: standard error 0.0028, so a correct generator exceeds delta + 7 se
    with probability < 1e-11 (and 1,000 runs on D0 must release it never). Without the
    threshold (release every listed cell with noisy count >= MIN_CELL_COUNT: P = 0.82)
    or with the c = 1 threshold (T = 3: P = 0.18) it is caught by a wide margin (1,000
    runs each).
    """
    monkeypatch.setattr(cand_mod, "passes", _Passes())
    eps, delta = 2.0, 0.05

    def check(runs):
        assert _target_released(1, eps, delta, 21, 1000).sum() == 0  # a cell below MIN_CELL_COUNT: never released
        p1 = _target_released(2, eps, delta, 22, runs)
        return p1.mean(), math.sqrt(max(p1.mean() * (1 - p1.mean()), 1e-4) / runs)

    p, se = check(5000)
    assert p <= delta + Z_BOUND * se
    assert p >= delta / 4  # power: the release probability is near delta, not 0
    for broken in (lambda e, d, min_count=1: min_count, lambda e, d, min_count=1: cand_mod._threshold_one(e, d)):
        monkeypatch.setattr(cand_mod, "stability_threshold", broken)
        p, se = check(1000)
        assert p > delta + Z_BOUND * se, p


def test_private_candidates_release_loss_end_to_end_and_half_noise_is_caught(monkeypatch):
    """The epsilon part: a listed cell whose count the added record raises by one.

    eps_cand = 1 (eps_c = 0.75), delta = 0.1, one scale: T = 5. The target cell holds 4
    records in D0 and 5 in D1; the released event "a candidate in the target cell"
    (released w.p. 0.32 vs 0.68) has loss eps_c = 0.75 <= eps_level = 1. 4,000 runs a side:
    standard error ~0.025 per bin; a correct generator exceeds eps_level + 7 se with
    probability < 1e-8. With half the noise the loss is 1.5, ~15 standard errors above
    eps_level (missed with probability < 1e-12).
    """
    monkeypatch.setattr(cand_mod, "passes", _Passes())
    eps, delta = 1.0, 0.1

    def excess(runs, seed):
        ratios = binned_log_ratios(_target_released(4, eps, delta, seed, runs), _target_released(5, eps, delta, seed + 1, runs))
        assert ratios  # both bins have >= 500 draws a side
        return worst_excess(ratios, eps), max(abs(lr) for lr, _ in ratios.values())

    ex, loss = excess(4000, 31)
    assert ex <= Z_BOUND
    assert loss >= eps * cand_mod.COUNT_SHARE - 0.2  # power: the loss is really measured (true 0.75, se ~0.025)
    monkeypatch.setattr(cand_mod, "LaplaceMechanism", HalvedLaplace)
    ex, _ = excess(4000, 33)
    assert ex > Z_BOUND


# ============================================================================
# dplloyd end to end, d = 3, both noise rules, through the executors' function and the clamp

LLOYD_DOMAIN = Domain(dim=3, lower=(0.0, 0.0, 0.0), upper=(10.0, 10.0, 10.0))
LLOYD_CENTROIDS = np.array([[-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]])  # public, unit space
LLOYD_COLS = ["u0", "u1", "u2"]
EXTREME = np.array([[1e6, -1e6, 1e6]])  # far outside the box: clipped to the corner (10, 0, 10)


def _lloyd_exact(points: np.ndarray, clamp: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Exact (counts, fixed-point sums) as a Spark pass computes them: clip to unit space, then the
    very function mapInPandas runs (``partition_aggregator`` -> ``kernels.exact_aggregates``)."""
    if clamp:
        unit = LLOYD_DOMAIN.clip_to_unit(points)
    else:  # deliberately broken: the affine map without the clip
        lo, hi = np.asarray(LLOYD_DOMAIN.lower), np.asarray(LLOYD_DOMAIN.upper)
        unit = 2.0 * (points - lo) / (hi - lo) - 1.0
    run = partition_aggregator(LLOYD_CENTROIDS, LLOYD_COLS)
    (out,) = list(run(iter([pd.DataFrame(unit, columns=LLOYD_COLS)])))
    return out["count"].to_numpy(dtype=np.int64), out[[f"s{j}" for j in range(3)]].to_numpy(dtype=np.int64)


def _remove_kernel_clamps(monkeypatch):
    """Deliberately broken: switch off the executors' own clamp, where one exists (defence in depth)."""
    import dpspark.steps.lloyd_kernels as lloyd_kernels
    import dpspark.privacy.fixedpoint as fixedpoint

    for mod in (lloyd_kernels, fixedpoint):
        if hasattr(mod, "sanitize_fixed"):
            monkeypatch.setattr(mod, "sanitize_fixed", lambda q: np.array(q, dtype=np.int64))
        if hasattr(mod, "sanitize_unit"):
            monkeypatch.setattr(mod, "sanitize_unit", lambda u: np.array(u, dtype=np.float64))


def _orthants(exact0, sign, counts, sums, noise_rule: str, eps_t: float, seed: int, runs: int) -> np.ndarray:
    """``runs`` releases of ``noisy_update``; each labelled by the orthant of (count, sums) around D0's exact values.

    The runs are done as ONE ``noisy_update`` call on the aggregates tiled ``runs`` times
    (every cluster row gets independent noise from the same mechanism, so row r of the
    tiling is an independent run). Only the cluster x joins is labelled: the other
    cluster's release has the same distribution on both datasets.
    """
    j, n0, s0 = exact0
    k = counts.size
    acc = Accountant(eps_t, 0.0, SeededNoise(seed))
    nc, ns = lloyd_core.noisy_update(np.tile(counts, runs), np.tile(sums, (runs, 1)), eps_t, noise_rule, acc, "test")
    nc, ns = nc.reshape(runs, k)[:, j], ns.reshape(runs, k, -1)[:, j, :]
    # Bit set = the "far" side: the side D1's shift moves away from (count +1, sums +-SCALE).
    bits = [nc <= n0] + [(ns[:, i] <= s0[i] / SCALE) if sign[i] > 0 else (ns[:, i] >= s0[i] / SCALE) for i in range(3)]
    return sum(b.astype(np.int64) << i for i, b in enumerate(bits))


@pytest.mark.parametrize("noise_rule", ["su", "paper"])
def test_dplloyd_end_to_end_extreme_record_and_broken_variants_are_caught(monkeypatch, noise_rule):
    """Neighbours: D0 = 60 points in the box [0, 10]^3; D1 = D0 + one record at (1e6, -1e6, 1e6).

    Clipped, the record is the corner (1, -1, 1) of the unit cube: it adds 1 to one count
    and +-1 to each of that cluster's 3 coordinate sums, the full L1 sensitivity of both
    noise rules. In the orthant where every noisy value lies on the far side of D0's
    exact value, the likelihood ratio is exactly e^{eps_t} (all four shifts at the full
    sensitivity), so the estimated loss is eps_t = 0.5 up to MARGIN. 150,000 runs a side
    put >= 3,000 draws in that orthant, so ``privacy_stats``' bound holds (false failure
    < 1e-8). Half the noise (loss 1.0) and the record NOT clipped (Domain clip and the
    executors' own clamp removed: the sums move by ~2e5) must exceed eps_t + MARGIN.
    """
    eps_t, runs = 0.5, 150_000
    rng = np.random.default_rng(5)
    d0 = np.vstack([rng.uniform(1.0, 4.0, size=(30, 3)), rng.uniform(6.0, 9.0, size=(30, 3))])
    d1 = np.vstack([d0, EXTREME])
    c0, s0 = _lloyd_exact(d0)
    c1, s1 = _lloyd_exact(d1)
    (j,) = np.flatnonzero(c1 != c0)
    sign = np.array([1, -1, 1])
    # The clip did its job: exactly one count +1 and the corner's fixed-point coordinates.
    assert c1[j] - c0[j] == 1 and np.array_equal(s1[j] - s0[j], sign * SCALE)
    for record in ([[1e308, -1e308, 1e308]], [[np.inf, -np.inf, np.inf]]):  # the same as the corner
        c, s = _lloyd_exact(np.vstack([d0, record]))
        assert np.array_equal(c, c1) and np.array_equal(s, s1)
    exact0 = (j, c0[j], s0[j])

    def loss(counts1, sums1, seed):
        a = _orthants(exact0, sign, c0, s0, noise_rule, eps_t, seed, runs)
        b = _orthants(exact0, sign, counts1, sums1, noise_rule, eps_t, seed + 1, runs)
        return estimated_loss(a, b)

    assert abs(loss(c1, s1, 1) - eps_t) <= MARGIN
    with monkeypatch.context() as mp:
        mp.setattr(lloyd_step, "LaplaceMechanism", HalvedLaplace)  # the noisy update is dpspark.steps.lloyd's
        assert loss(c1, s1, 3) > eps_t + MARGIN
    with monkeypatch.context() as mp:
        _remove_kernel_clamps(mp)
        cb, sb = _lloyd_exact(d1, clamp=False)
        assert loss(cb, sb, 5) > eps_t + MARGIN


# ----------------------------------------------------------------------------
# candidates: tree (maxcover's LSH-tree candidates): the loss of the released tree structure, end to end
# through cand_mod.tree_candidates, against the tree level epsilon the accountant CHARGED

TREE_DIM = 5
TREE_EPS_CAND = 1.0 / cand_mod.TREE_LEVELS_SHARE  # eps_tree = 1: two levels of 0.5 each, tau = 3 / 0.5 = 6


def _tree_rows(n_right: int):
    """30 rows on the left and n_right on the right of the first public hyperplane (seed 0's)."""
    from dpspark.steps import tree_kernels
    from dpspark.steps import tree
    from dpspark.privacy.fixedpoint import quantize

    w, b = tree_kernels.fixed_planes(*tree.draw_planes(np.random.default_rng(0), tree.max_depth(TREE_DIM), TREE_DIM))
    pool = np.random.default_rng(99).uniform(-1, 1, size=(4000, TREE_DIM))
    bit = (quantize(pool) @ w[0]) > b[0]
    return np.vstack([pool[~bit][:30], pool[bit][:n_right]])


def _tree_right_kept(n_right: int, runs: int, seed: int, level_eps: list) -> np.ndarray:
    from dpspark.steps import tree

    agg = tree.numpy_tree_aggregates(_tree_rows(n_right))
    dom = Domain(dim=TREE_DIM, lower=(-1.0,) * TREE_DIM, upper=(1.0,) * TREE_DIM)
    noise = SeededNoise(seed)
    out = np.empty(runs, dtype=np.int64)
    for r in range(runs):
        acc = Accountant(TREE_EPS_CAND, 0.0, noise)
        _, info = cand_mod.tree_candidates(agg, dom, 50, 1, TREE_EPS_CAND, acc, np.random.default_rng(0))
        out[r] = any(level >= 1 and (prefix >> (level - 1)) == 1 for level, prefix in info["leaf_nodes"])
        acc.finish()  # exactly eps_cand, no delta, whatever the walk did
        if r == 0:
            level_eps.extend(c["epsilon"] for c in acc.summary() if "tree level 1/" in c["step"])
    return out


class _HalfNoiseTreeLevels(LaplaceMechanism):
    """Broken: the tree levels get half the noise their charge pays for."""

    def release(self, exact, noise):
        if self.sensitivity == 1.0 and math.isclose(self.epsilon, 0.5):
            return LaplaceMechanism(self.epsilon * 2, self.sensitivity, self.unit).release(exact, noise)
        return super().release(exact, noise)


def test_tree_candidates_structure_loss_is_within_the_charged_level_epsilon_and_half_noise_is_caught(monkeypatch):
    """One record added on the right of the first cut of maxcover's tree candidates (k = 1, walk fixed at
    2 levels). "The right node is a leaf" is a function of the level-1 release only, whose charge is
    eps_level = 0.5 (read from the accountant): 6 vs 7 rows on the right give P(kept) 0.62 vs 0.77, a loss
    of 0.50, tight. 4,000 runs a side (se <= 0.05 per bin): a correct release exceeds eps_level + 7 se
    with probability < 1e-8; with half the noise at the levels the loss is 1.0 and is caught (8,000 runs)."""
    from dpspark.steps import tree

    monkeypatch.setattr(tree, "depth_for", lambda noisy_n, k, limit: 2)
    charged: list = []
    ratios = binned_log_ratios(_tree_right_kept(6, 4000, 1, charged), _tree_right_kept(7, 4000, 2, []))
    assert charged and math.isclose(charged[0], 0.5)
    assert len(ratios) == 2
    assert worst_excess(ratios, charged[0]) <= Z_BOUND
    assert max(abs(lr) for lr, _ in ratios.values()) >= 0.3  # power: the loss is really measured (true 0.50)
    monkeypatch.setattr(tree, "LaplaceMechanism", _HalfNoiseTreeLevels)
    broken = binned_log_ratios(_tree_right_kept(6, 8000, 3, []), _tree_right_kept(7, 8000, 4, []))
    assert worst_excess(broken, charged[0]) > Z_BOUND


def test_tree_candidates_charge_exactly_eps_cand_and_no_delta():
    from dpspark.steps import tree

    x = np.clip(np.random.default_rng(3).normal(0.2, 0.1, size=(3000, TREE_DIM)), -1, 1)
    dom = Domain(dim=TREE_DIM, lower=(-1.0,) * TREE_DIM, upper=(1.0,) * TREE_DIM)
    for eps_cand in (0.05, 0.4, 2.0):
        acc = Accountant(eps_cand, 0.0, SeededNoise(5))
        cand, info = cand_mod.tree_candidates(tree.numpy_tree_aggregates(x), dom, 40, 3, eps_cand, acc,
                                              np.random.default_rng(1))
        acc.finish()
        assert math.isclose(acc.spent_epsilon, eps_cand, rel_tol=1e-12) and acc.spent_delta == 0.0
        steps = [c["step"] for c in acc.summary()]
        assert all(s.startswith(cand_mod.TREE_LABEL) for s in steps) and any("leaf sums" in s for s in steps)
        assert 3 <= cand.shape[0] <= 40 and cand.shape[1] == TREE_DIM and np.all(np.abs(cand) <= 1.0)
        assert len(info["leaf_nodes"]) + info["padded_public_points"] >= cand.shape[0]
    assert sum(cand_mod.tree_split(0.7)) == pytest.approx(0.7, rel=1e-15)
