"""Shared helpers of the benchmark scripts (not part of the dpspark package).

Loaders for the public benchmark datasets in ``../shared/datasets`` (relative to
the project root; see its MANIFEST.md), scaling to [-1, 1]^d, the utility metrics
of DESIGN.md ("Measuring utility") and median / IQR aggregation: what is measured.
How the scripts run and report (session, timing, whole processes, results tables)
is ``bench_harness``.

Public bounds. As in the DP k-means literature (MANIFEST.md), the benchmark
treats the per-column min/max of each dataset as PUBLIC domain knowledge: the
DP job receives them as its public domain, they are never computed inside the
DP job. This is a benchmark convention, not something a real deployment may do
with private data; every output of the benchmark says so.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
# $DPSPARK_DATASETS points elsewhere (the smoke tests use it when ../shared is absent).
DATASETS = Path(os.environ.get("DPSPARK_DATASETS") or ROOT / ".." / "shared" / "datasets").resolve()

PUBLIC_BOUNDS_NOTE = (
    "Public domain = per-column min/max of each dataset: the DP k-means literature treats these bounds "
    "as public domain knowledge for benchmarks (../shared/datasets/MANIFEST.md); they are given to the "
    "DP job as its public domain and are not computed inside it."
)

# --------------------------------------------------------------------------
# Loaders: each returns (name, X float64 (n, d), k_reference)


def _finite_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x[np.isfinite(x).all(axis=1)]


def load_blood_transfusion():
    df = pd.read_csv(DATASETS / "dp-kccm" / "blood_transfusion.csv")
    return "blood_transfusion", _finite_rows(df.to_numpy(dtype=np.float64)), 4  # all 5 columns (incl. class)


ADULT_COLUMNS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


def load_adult():
    df = pd.read_csv(DATASETS / "dp-kccm" / "adult.data", skipinitialspace=True)
    return "adult", _finite_rows(df[ADULT_COLUMNS].to_numpy(dtype=np.float64)), 5


def load_tripadvisor():
    df = pd.read_csv(DATASETS / "dp-kccm" / "tripadvisor_review.csv").drop(columns=["id"])
    return "tripadvisor_review", _finite_rows(df.to_numpy(dtype=np.float64)), 4


def load_electrical_grid():
    df = pd.read_csv(DATASETS / "dp-kccm" / "electrical_grid_stability.csv", sep=";")
    return "electrical_grid_stability", _finite_rows(df.to_numpy(dtype=np.float64)), 5


def load_google_reviews():
    df = pd.read_csv(DATASETS / "dp-kccm" / "google_review_ratings.csv")
    df = df.drop(columns=["id"]).loc[:, lambda f: ~f.columns.str.startswith("Unnamed")]
    if df.shape[1] != 24:
        raise ValueError(f"google_review_ratings: expected 24 category columns, got {df.shape[1]}")
    # Rows with a missing or non-numeric value (none in this copy of 5456 rows) are dropped.
    x = df.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    return "google_review_ratings", _finite_rows(x), 4


def load_credit_card():
    df = pd.read_csv(DATASETS / "dp-kccm" / "credit_card_clients.csv", sep=";")
    return "credit_card_clients", _finite_rows(df.to_numpy(dtype=np.float64)), 5


DPKCCM_LOADERS = [load_blood_transfusion, load_adult, load_tripadvisor, load_electrical_grid, load_google_reviews, load_credit_card]


def _load_sipu(name: str, k: int):
    with gzip.open(DATASETS / "clustering-data-v1" / "sipu" / f"{name}.data.gz", "rt") as fh:
        x = np.loadtxt(fh, dtype=np.float64, ndmin=2)
    return name, _finite_rows(x), k


def load_s1():
    return _load_sipu("s1", 15)


def load_a3():
    return _load_sipu("a3", 50)


def load_birch2():
    return _load_sipu("birch2", 100)


def load_unbalance():
    return _load_sipu("unbalance", 8)


def load_skin(k: int = 2):
    """UCI Skin Segmentation: B, G, R (the class column is dropped). No reference k: 2 by default."""
    with gzip.open(DATASETS / "skin-segmentation" / "Skin_NonSkin.txt.gz", "rt") as fh:
        df = pd.read_csv(fh, sep="\t", header=None, names=["B", "G", "R", "cls"])
    return "skin_segmentation", _finite_rows(df[["B", "G", "R"]].to_numpy(dtype=np.float64)), k


# Generated Gaussian mixtures for sweeps across n in 2-3 dimensions (not shared data; made here, seeded):
# MIXTURE_K clusters with centers uniform in [10, 90]^d of a [0, 100]^d box, per-cluster sd 1..6 and unequal
# weights (Dirichlet(2)); the same clusters for every n of one d, n rows drawn from them.
MIXTURE_K = 10
MIXTURE_SIZES = (5_000, 20_000, 100_000, 1_000_000)


def load_mixture(dim: int, n: int):
    shape = np.random.default_rng([2026, dim])
    centers = shape.uniform(10.0, 90.0, size=(MIXTURE_K, dim))
    sds = shape.uniform(1.0, 6.0, size=MIXTURE_K)
    weights = shape.dirichlet(np.full(MIXTURE_K, 2.0))
    draw = np.random.default_rng([2026, dim, n])
    labels = draw.choice(MIXTURE_K, size=n, p=weights)
    x = centers[labels] + draw.normal(size=(n, dim)) * sds[labels, None]
    return f"mix{dim}d_n{n}", _finite_rows(x), MIXTURE_K


MIXTURES = [f"mix{dim}d_n{n}" for dim in (2, 3) for n in MIXTURE_SIZES]

# The loaders by the name of the dataset they return (loads nothing).
LOADERS_BY_NAME = {"blood_transfusion": load_blood_transfusion, "adult": load_adult, "tripadvisor_review": load_tripadvisor,
                   "electrical_grid_stability": load_electrical_grid, "google_review_ratings": load_google_reviews,
                   "credit_card_clients": load_credit_card, "s1": load_s1, "a3": load_a3, "birch2": load_birch2,
                   "unbalance": load_unbalance, "skin_segmentation": load_skin,
                   **{f"mix{dim}d_n{n}": (lambda dim=dim, n=n: load_mixture(dim, n)) for dim in (2, 3) for n in MIXTURE_SIZES}}
# Every shared dataset, in the order of the benchmarks' tables.
SHARED_DATASETS = ["s1", "a3", "birch2", "unbalance", "skin_segmentation", "blood_transfusion", "tripadvisor_review",
                   "electrical_grid_stability", "adult", "google_review_ratings", "credit_card_clients"]


# --------------------------------------------------------------------------
# Scaling and metrics


def public_bounds(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column (min, max): the benchmark's PUBLIC domain (see PUBLIC_BOUNDS_NOTE).

    A constant column gets the bounds value +/- 0.5 so that the map to [-1, 1] is defined.
    """
    lo = x.min(axis=0).astype(np.float64)
    hi = x.max(axis=0).astype(np.float64)
    flat = hi <= lo
    lo[flat] -= 0.5
    hi[flat] += 0.5
    return lo, hi


def domain(lo, hi):
    """The public ``Domain`` (dpspark.privacy.domain) of the box [lo, hi]."""
    from dpspark.privacy.domain import Domain

    return Domain(dim=len(lo), lower=tuple(float(v) for v in lo), upper=tuple(float(v) for v in hi))


def scale_unit(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Map the box [lo, hi] onto [-1, 1]^d (clipping anything outside)."""
    return np.clip(2.0 * (np.asarray(x, dtype=np.float64) - lo) / (hi - lo) - 1.0, -1.0, 1.0)


def _min_sq_dist(x: np.ndarray, centers: np.ndarray, chunk: int = 65536) -> np.ndarray:
    c = np.asarray(centers, dtype=np.float64)
    c_sq = np.einsum("ij,ij->i", c, c)
    out = np.empty(len(x))
    for s in range(0, len(x), chunk):
        b = x[s : s + chunk]
        d = np.einsum("ij,ij->i", b, b)[:, None] - 2.0 * (b @ c.T) + c_sq[None, :]
        out[s : s + chunk] = np.maximum(d.min(axis=1), 0.0)
    return out


def kmeans_cost(x_scaled: np.ndarray, centers: np.ndarray) -> float:
    """sum_x min_j ||x - c_j||^2."""
    return float(_min_sq_dist(x_scaled, centers).sum())


def nicv(x_scaled: np.ndarray, centers: np.ndarray) -> float:
    """The cluster-merging paper's NICV: (1/N) sum_x min_j ||x - c_j||^2 on data scaled to [-1, 1]^d."""
    return kmeans_cost(x_scaled, centers) / len(x_scaled)


def nonprivate_baseline(x_scaled: np.ndarray, k: int, seed: int = 0, n_init: int = 10):
    """Non-private scikit-learn KMeans (k-means++ init, Lloyd), best of ``n_init``: (centers, cost)."""
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit(x_scaled)
    centers = km.cluster_centers_
    return centers, kmeans_cost(x_scaled, centers)


# --------------------------------------------------------------------------
# Aggregation and reporting


def median_iqr(values) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    q25, med, q75 = np.percentile(v, [25, 50, 75])
    return float(med), float(q25), float(q75)


def fmt_med_iqr(values, digits: int = 3) -> str:
    med, q25, q75 = median_iqr(values)
    return f"{med:.{digits}g} [{q25:.{digits}g}, {q75:.{digits}g}]"
