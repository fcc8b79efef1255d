"""Driver side of the ldp protocol (numpy): public round parameters in, estimates and centers out.

Three rounds, each user answers exactly one of them (``client.choose_round``):

1. GoodCenters: ``good_centers_round`` publishes R radii x M locality-sensitive hash
   functions; every round-1 user reports (bucket, rounded coordinate) for one
   (radius, hash, coordinate) through OLH; ``candidates_from_good_centers`` finds the
   heavy buckets of every hash function and their noisy averages: the candidates Y.
2. WeightedCenters, first histogram: round-2 users report their nearest candidate
   in Y; ``weights`` estimates each candidate's weight; ``prune`` keeps W, the
   candidates whose estimated weight clears a noise threshold.
3. Second histogram: round-3 users report their nearest candidate in W; the
   weighted instance (W, estimated weights) goes to the non-private solver
   (``finish``).

Everything here is post-processing of LDP reports (and of public randomness): it
has no privacy cost of its own. ``Driver`` holds the state between rounds so that
simulated and ingested runs share exactly the same code path. Design choices and
their reasons: ``docs/ldp-design.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpspark import solvers
from dpspark.ldp import oracle as olh
from dpspark.ldp.client import MIX_PRIME, AssignRound, GoodCentersRound
from dpspark.ldp.params import LDPParams as _P


@dataclass(frozen=True)
class Settings:
    """The server's protocol settings; the defaults are the config keys' (one place: ``LDPParams``)."""

    radii: int = _P.radii
    hashes: int = _P.hashes
    buckets: int = _P.buckets
    projection_dim: int = _P.projection_dim
    fractions: tuple[float, float, float] = _P.fractions
    heavy_z: float = _P.heavy_z
    prune_z: float = _P.prune_z
    candidates_per_hash: int | None = _P.candidates_per_hash  # None: 4 k

    def per_hash(self, k: int) -> int:
        return self.candidates_per_hash or 4 * k


@dataclass
class Histogram:
    """Aggregated reports of one round: exact integer counts of (sub, a, y)."""

    sub: np.ndarray
    a: np.ndarray
    y: np.ndarray
    count: np.ndarray

    @classmethod
    def from_frame(cls, pdf) -> "Histogram":
        return cls(*(pdf[c].to_numpy(dtype=np.int64) for c in ("sub", "a", "y", "count")))

    @classmethod
    def from_reports(cls, sub, a, y) -> "Histogram":
        keys = np.stack([np.asarray(sub, np.int64), np.asarray(a, np.int64), np.asarray(y, np.int64)], axis=1)
        if len(keys) == 0:
            e = np.zeros(0, dtype=np.int64)
            return cls(e, e, e, e)
        uniq, counts = np.unique(keys, axis=0, return_counts=True)
        return cls(uniq[:, 0], uniq[:, 1], uniq[:, 2], counts.astype(np.int64))

    def select(self, sub: int):
        mask = self.sub == sub
        return self.a[mask], self.y[mask], self.count[mask]

    @property
    def total(self) -> int:
        return int(self.count.sum())


def good_centers_round(dim: int, epsilon: float, settings: Settings, unit_diameter: float,
                       rng: np.random.Generator) -> GoodCentersRound:
    """Public, data-independent parameters of round 1 (from public randomness only)."""
    R, M = settings.radii, settings.hashes
    dp = min(dim, settings.projection_dim)
    w0 = unit_diameter / 2.0
    widths = w0 / 2.0 ** np.arange(R)
    projections = np.empty((R, M, dim, dp))
    for i in range(R):
        for m in range(M):
            q, _ = np.linalg.qr(rng.standard_normal((dim, dp)))  # orthonormal columns
            projections[i, m] = q * math.sqrt(dim / dp)  # JL scaling: E ||P^T x||^2 = ||x||^2
    shifts = rng.uniform(0.0, 1.0, size=(R, M, dp)) * widths[:, None, None]
    mixers = rng.integers(1, MIX_PRIME, size=(R, M, dp), dtype=np.int64)
    oracle = olh.OracleParams.create(epsilon, 2 * settings.buckets)
    return GoodCentersRound(oracle=oracle, dim=dim, buckets=settings.buckets, widths=widths,
                            projections=projections, shifts=shifts, mixers=mixers)


def _estimates(hist: Histogram, sub: int, params: olh.OracleParams) -> tuple[np.ndarray, int]:
    a, y, c = hist.select(sub)
    n = int(c.sum())
    if n == 0:
        return np.zeros(params.domain), 0
    return olh.estimate(olh.support_counts(a, y, c, params), n, params), n


def _estimates_many(hist: Histogram, subs, params: olh.OracleParams) -> tuple[np.ndarray, np.ndarray]:
    """``_estimates`` of several sub-protocols at once (one ``support_counts_many``): (S, D) and (S,)."""
    groups = [hist.select(s) for s in subs]
    n = np.array([int(c.sum()) for _, _, c in groups], dtype=np.int64)
    support = olh.support_counts_many(groups, params)
    est = np.zeros((len(groups), params.domain))
    for s in np.nonzero(n)[0]:
        est[s] = olh.estimate(support[s], int(n[s]), params)
    return est, n


def candidates_from_good_centers(params: GoodCentersRound, hist: Histogram, settings: Settings, k: int):
    """Heavy buckets of every (radius, hash) and the noisy averages of their points.

    For hash (i, m) with coordinate groups j = 1..d (n_j reports each):
      c_hat(u) = sum_j f_hat_j(2u) + f_hat_j(2u+1)            (bucket size, all its users)
      heavy: c_hat(u) >= heavy_z * sqrt(2 * sum_j n_j * V0)   (V0: OLH variance per user)
      y_hat(u)_j = (f_hat_j(2u+1) - f_hat_j(2u)) / (c_hat(u) n_j / n_pair), clipped to [-1, 1]
    keeping at most ``candidates_per_hash`` buckets (largest c_hat) per hash function.
    Returns (candidates (K, d), creation counts (K,), per-hash info list).
    """
    d = params.dim
    v0 = olh.background_variance(params.oracle.epsilon, params.oracle.g)
    out, counts, info = [], [], []
    est, n_all = _estimates_many(hist, range(params.subs), params.oracle)  # sub (i, m, j) = (i M + m) d + j
    for i in range(params.radii):
        for m in range(params.hashes):
            base = (i * params.hashes + m) * d
            F, n = est[base : base + d], [int(v) for v in n_all[base : base + d]]
            n_pair = sum(n)
            if n_pair == 0:
                continue
            c_hat = (F[:, 0::2] + F[:, 1::2]).sum(axis=0)
            threshold = settings.heavy_z * math.sqrt(2.0 * n_pair * v0)
            order = np.argsort(-c_hat, kind="stable")[: settings.per_hash(k)]
            heavy = order[c_hat[order] >= threshold]
            info.append({"radius": i, "hash": m, "width": float(params.widths[i]), "reports": n_pair,
                         "threshold": threshold, "heavy": int(len(heavy))})
            if len(heavy) == 0:
                continue
            share = np.asarray(n, dtype=np.float64)[:, None] / n_pair  # (d, 1)
            expected = c_hat[heavy][None, :] * share  # (d, h)
            diff = F[:, 2 * heavy + 1] - F[:, 2 * heavy]
            centers = np.clip(np.where(expected > 0, diff / np.maximum(expected, 1e-12), 0.0), -1.0, 1.0).T
            out.append(centers)
            counts.append(c_hat[heavy])
    if not out:
        return np.zeros((0, d)), np.zeros(0), info
    return np.concatenate(out), np.concatenate(counts), info


def assign_round(centers: np.ndarray, epsilon: float, round_no: int) -> AssignRound:
    centers = np.asarray(centers, dtype=np.float64)
    return AssignRound(oracle=olh.OracleParams.create(epsilon, len(centers)), centers=centers, round=round_no)


def weights(params: AssignRound, hist: Histogram) -> tuple[np.ndarray, int]:
    """Unbiased estimates of how many reporting users have each candidate as their nearest."""
    return _estimates(hist, 0, params.oracle)


def prune(params: AssignRound, w_hat: np.ndarray, n: int, settings: Settings, k: int) -> np.ndarray:
    """Indices of the candidates kept for round 3: w_hat >= prune_z * sd (at least k, largest first)."""
    sd = math.sqrt(max(n, 1) * olh.background_variance(params.oracle.epsilon, params.oracle.g))
    order = np.argsort(-w_hat, kind="stable")
    keep = order[w_hat[order] >= settings.prune_z * sd]
    if len(keep) < min(k, len(order)):
        keep = order[: min(k, len(order))]
    return np.sort(keep)


def finish(candidates: np.ndarray, w_hat: np.ndarray, objective: str, k: int, rng: np.random.Generator):
    """Post-processing: the non-private weighted solver on (candidates, max(w_hat, 0))."""
    return solvers.solve(objective, candidates, np.maximum(w_hat, 0.0), k, rng)


@dataclass
class Driver:
    """The server's state across the three rounds (identical for simulated and ingested reports)."""

    dim: int
    k: int
    objective: str
    epsilon: float
    settings: Settings
    unit_diameter: float
    lsh_rng: np.random.Generator
    fallback_rng: np.random.Generator
    clip_unit: object = None
    sample_unit: object = None
    state: dict = field(default_factory=dict)

    def params(self, round_no: int):
        """Public parameters of ``round_no`` (1 needs nothing; 2 and 3 need the previous rounds)."""
        if round_no == 1:
            return good_centers_round(self.dim, self.epsilon, self.settings, self.unit_diameter, self.lsh_rng)
        if round_no == 2:
            return assign_round(self.state["candidates"], self.epsilon, 2)
        if round_no == 3:
            return assign_round(self.state["candidates"][self.state["kept"]], self.epsilon, 3)
        raise ValueError(f"round {round_no} does not exist (1, 2, 3)")

    def absorb(self, round_no: int, params, hist: Histogram) -> None:
        """Take one round's aggregated reports."""
        self.state[f"reports_{round_no}"] = hist.total
        if round_no == 1:
            cand, created, info = candidates_from_good_centers(params, hist, self.settings, self.k)
            self.state["good_centers"] = info
            self.state["fallback"] = len(cand) == 0
            if len(cand) == 0:
                # Nothing cleared the heavy-hitter threshold: fall back to PUBLIC random points
                # (data-independent), so the later rounds still weight something.
                cand = self.sample_unit(self.fallback_rng, 8 * self.k) if self.sample_unit else \
                    self.fallback_rng.uniform(-1, 1, size=(8 * self.k, self.dim))
                created = np.zeros(len(cand))
            if self.clip_unit is not None:
                cand = self.clip_unit(cand)
            self.state["candidates"] = cand
            self.state["created"] = created
        elif round_no == 2:
            # The PUBLISHED round-2 centers are the candidates the reports answered about (in ingest
            # mode round 1 may have gained late reports since; they must not change the candidates).
            self.state["candidates"] = np.asarray(params.centers, dtype=np.float64)
            w, n = weights(params, hist)
            self.state["weights_2"] = w
            self.state["kept"] = prune(params, w, n, self.settings, self.k)
        elif round_no == 3:
            w, n = weights(params, hist)
            self.state["weights_3"] = w
            self.state["final_candidates"] = np.asarray(params.centers, dtype=np.float64)
        else:
            raise ValueError(f"round {round_no} does not exist (1, 2, 3)")

    def result(self, solver_rng: np.random.Generator):
        """(centers (k, d) in unit space, weights scaled to all reporting users, info)."""
        cand = self.state.get("final_candidates")
        if cand is None:
            cand = self.state["candidates"][self.state["kept"]]
        w3 = self.state["weights_3"]
        centers, assigned = finish(cand, w3, self.objective, self.k, solver_rng)
        if self.clip_unit is not None:
            centers = self.clip_unit(centers)
        n_all = sum(self.state.get(f"reports_{r}", 0) for r in (1, 2, 3))
        n3 = max(self.state.get("reports_3", 0), 1)
        info = {
            "candidates": int(len(self.state["candidates"])), "kept": int(len(cand)),
            "fallback_candidates": bool(self.state.get("fallback", False)),
            "reports_per_round": [int(self.state.get(f"reports_{r}", 0)) for r in (1, 2, 3)],
            "good_centers": self.state.get("good_centers", []),
        }
        return centers, np.asarray(assigned, dtype=np.float64) * (n_all / n3), info
