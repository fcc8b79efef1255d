"""The PUBLIC domain of the data and clipping into it.

A domain comes from the config only (box bounds or an L2 ball); nothing about it
is ever computed from the data. Points outside the domain are clipped into it,
never dropped and never used to widen it.

Every algorithm works in the *unit space*: the box [lo, hi] is mapped affinely
onto [-1, 1]^d, the ball of radius R onto the unit ball (which lies inside
[-1, 1]^d). In the unit space one clipped coordinate has absolute value <= 1, so a
count and each coordinate sum have sensitivity 1 under add/remove of one record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Domain:
    dim: int
    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None
    radius: float | None = None

    @classmethod
    def from_config(cls, cfg) -> "Domain":
        return cls(dim=cfg.dim, lower=cfg.lower, upper=cfg.upper, radius=cfg.radius)

    @property
    def is_ball(self) -> bool:
        return self.radius is not None

    @property
    def unit_diameter(self) -> float:
        """Diameter of the unit-space domain: 2 sqrt(d) for a box, 2 for a ball."""
        return 2.0 if self.is_ball else 2.0 * math.sqrt(self.dim)

    # -- numpy (driver, tests, clients) ------------------------------------

    def clip_to_unit(self, points: np.ndarray) -> np.ndarray:
        """Clip points (original units, shape (n, d)) into the domain; return unit-space points."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, self.dim)
        if self.is_ball:
            u = x / self.radius
            norms = np.linalg.norm(u, axis=1, keepdims=True)
            return u / np.maximum(norms, 1.0)
        lo = np.asarray(self.lower)
        hi = np.asarray(self.upper)
        x = np.clip(x, lo, hi)
        return np.clip(2.0 * (x - lo) / (hi - lo) - 1.0, -1.0, 1.0)

    def from_unit(self, unit_points: np.ndarray) -> np.ndarray:
        """Map unit-space points back to original units."""
        u = np.asarray(unit_points, dtype=np.float64).reshape(-1, self.dim)
        if self.is_ball:
            return u * self.radius
        lo = np.asarray(self.lower)
        hi = np.asarray(self.upper)
        return lo + (u + 1.0) * (hi - lo) / 2.0

    def clip_unit(self, unit_points: np.ndarray) -> np.ndarray:
        """Project unit-space points (e.g. noisy centroids) back into the unit-space domain."""
        u = np.asarray(unit_points, dtype=np.float64).reshape(-1, self.dim)
        if self.is_ball:
            norms = np.linalg.norm(u, axis=1, keepdims=True)
            return u / np.maximum(norms, 1.0)
        return np.clip(u, -1.0, 1.0)

    def sample_unit(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Uniform public points in the unit-space domain (data-independent)."""
        if not self.is_ball:
            return rng.uniform(-1.0, 1.0, size=(size, self.dim))
        g = rng.standard_normal((size, self.dim))
        g /= np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)
        r = rng.uniform(0.0, 1.0, size=(size, 1)) ** (1.0 / self.dim)
        return g * r

    # -- Spark (executors) -------------------------------------------------

    def unit_columns(self, columns):
        """Spark Column expressions that clip the given feature columns and map them to unit space.

        ``columns`` are d double-typed Spark Columns (original units). Runs on the
        executors, one record at a time, before any aggregation.
        """
        from pyspark.sql import functions as F

        if self.is_ball:
            norm = F.sqrt(sum((c * c for c in columns), F.lit(0.0)))
            factor = F.lit(1.0) / F.greatest(norm / F.lit(self.radius), F.lit(1.0))
            return [c / F.lit(self.radius) * factor for c in columns]
        out = []
        for c, lo, hi in zip(columns, self.lower, self.upper):
            clipped = F.least(F.greatest(c, F.lit(lo)), F.lit(hi))
            unit = F.lit(2.0) * (clipped - F.lit(lo)) / F.lit(hi - lo) - F.lit(1.0)
            out.append(F.least(F.greatest(unit, F.lit(-1.0)), F.lit(1.0)))
        return out
