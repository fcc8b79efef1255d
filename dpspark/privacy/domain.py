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
    #
    # The per-record map is TOTAL and BOUNDED (DESIGN.md, privacy rules): whatever a
    # record holds (any finite double, NaN, +-inf), every unit coordinate comes out
    # finite and in [-1, 1]. The rules, identical in numpy and in Spark (``unit_columns``
    # performs the same float operations in the same order, so both agree bit for bit):
    #
    # - box: clip each coordinate into [lo, hi] (+-inf goes to a bound), map affinely
    #   onto [-1, 1]; a NaN coordinate becomes unit coordinate 0 (the box's centre).
    # - ball of radius R: a NaN coordinate is read as 0 (the centre), +-inf as +-DBL_MAX;
    #   then u = x / R if ||x|| <= R, else x / ||x|| (the sphere). The norm is computed
    #   without overflow or underflow: m = max_j |x_j|, y = x / m (|y_j| <= 1, one is
    #   +-1), ||x|| = m * ||y|| with ||y|| in [1, sqrt(d)]; the test m * ||y|| > R may
    #   overflow to inf, which still compares correctly, and the sphere point is y / ||y||.
    # - finally every unit coordinate is clamped to [-1, 1] and a NaN is replaced by 0:
    #   this catches x / R rounding just past 1, a box whose hi - lo overflows, and any
    #   future slip. In unit space one record then moves a count by 1 and a coordinate
    #   sum by at most 1, whatever it holds.
    #
    # A null (Spark only) stays null: the pipelines drop such rows before mapping.

    def clip_to_unit(self, points: np.ndarray) -> np.ndarray:
        """Clip points (original units, shape (n, d)) into the domain; return unit-space points.

        Total: any float64 input (NaN, +-inf, 1e308, 5e-324) gives finite unit coordinates in [-1, 1].
        """
        x = np.asarray(points, dtype=np.float64).reshape(-1, self.dim)
        if self.is_ball:
            return _ball_to_unit(x, float(self.radius))
        lo = np.asarray(self.lower, dtype=np.float64)
        hi = np.asarray(self.upper, dtype=np.float64)
        # np.clip keeps NaN (the final clamp turns it into 0) and sends +-inf to a bound.
        x = np.clip(x, lo, hi)
        with np.errstate(over="ignore", invalid="ignore"):  # only for bounds whose hi - lo overflows
            return _clamp_unit(2.0 * (x - lo) / (hi - lo) - 1.0)

    def from_unit(self, unit_points: np.ndarray) -> np.ndarray:
        """Map unit-space points back to original units."""
        u = np.asarray(unit_points, dtype=np.float64).reshape(-1, self.dim)
        if self.is_ball:
            return u * self.radius
        lo = np.asarray(self.lower)
        hi = np.asarray(self.upper)
        return lo + (u + 1.0) * (hi - lo) / 2.0

    def clip_unit(self, unit_points: np.ndarray) -> np.ndarray:
        """Project unit-space points (e.g. noisy centroids) back into the unit-space domain.

        Same total map as ``clip_to_unit`` with R = 1 for a ball, [-1, 1] clamping for a box.
        """
        u = np.asarray(unit_points, dtype=np.float64).reshape(-1, self.dim)
        if self.is_ball:
            return _ball_to_unit(u, 1.0)
        return _clamp_unit(u)

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
        executors, one record at a time, before any aggregation. The same total map as
        ``clip_to_unit``, by the same float operations in the same order (no division by
        zero, so it is also safe under ANSI mode). A null input gives null: for a box in
        that coordinate, for a ball in every coordinate of the row.
        """
        from pyspark.sql import functions as F

        if self.is_ball:
            radius = float(self.radius)
            null_row = None
            for c in columns:
                null_row = c.isNull() if null_row is None else null_row | c.isNull()
            # NaN -> 0, +-inf -> +-DBL_MAX (a when-chain: greatest/least skip nulls and rank NaN highest).
            xs = [F.when(F.isnan(c), F.lit(0.0)).when(c > F.lit(_DBL_MAX), F.lit(_DBL_MAX))
                  .when(c < F.lit(-_DBL_MAX), F.lit(-_DBL_MAX)).otherwise(c) for c in columns]
            m = F.greatest(*[F.abs(c) for c in xs]) if len(xs) > 1 else F.abs(xs[0])
            safe_m = F.when(m > F.lit(0.0), m).otherwise(F.lit(1.0))
            ys = [c / safe_m for c in xs]
            s = ys[0] * ys[0]
            for y in ys[1:]:
                s = s + y * y
            ny = F.sqrt(s)
            outside = m * ny > F.lit(radius)
            safe_ny = F.greatest(ny, F.lit(1.0))  # = ny whenever m > 0 (then ||y|| >= 1)
            out = []
            for x, y in zip(xs, ys):
                u = F.when(outside, y / safe_ny).otherwise(x / F.lit(radius))
                out.append(F.when(null_row, F.lit(None).cast("double")).otherwise(_clamp_unit_column(u)))
            return out
        out = []
        for c, lo, hi in zip(columns, self.lower, self.upper):
            lo, hi = float(lo), float(hi)
            clipped = F.when(c < F.lit(lo), F.lit(lo)).when(c > F.lit(hi), F.lit(hi)).otherwise(c)
            unit = F.lit(2.0) * (clipped - F.lit(lo)) / F.lit(hi - lo) - F.lit(1.0)
            # NaN first: Spark ranks NaN above every number (NaN > hi is true), numpy's clip keeps
            # it NaN and the final clamp makes it 0; here it becomes 0 directly. Null stays null.
            out.append(F.when(c.isNull(), F.lit(None).cast("double")).when(F.isnan(c), F.lit(0.0))
                       .otherwise(_clamp_unit_column(unit)))
        return out


_DBL_MAX = float(np.finfo(np.float64).max)


def _clamp_unit(u: np.ndarray) -> np.ndarray:
    """Every coordinate into [-1, 1], NaN -> 0 (a new array)."""
    u = np.clip(u, -1.0, 1.0)
    u[np.isnan(u)] = 0.0
    return u


def _ball_to_unit(x: np.ndarray, radius: float) -> np.ndarray:
    """The ball map of ``clip_to_unit`` (see the comment there); the float operations of ``unit_columns``."""
    x = np.where(np.isnan(x), 0.0, np.clip(x, -_DBL_MAX, _DBL_MAX))
    if x.shape[0] == 0:
        return x.copy()
    # Overflow in m * ||y|| (-> inf, compares correctly) and in x / R (only in rows where
    # that branch is not selected) is expected; underflow to subnormals is harmless.
    with np.errstate(over="ignore", under="ignore"):
        m = np.abs(x).max(axis=1)
        safe_m = np.where(m > 0.0, m, 1.0)
        y = x / safe_m[:, None]
        s = y[:, 0] * y[:, 0]
        for j in range(1, x.shape[1]):
            s = s + y[:, j] * y[:, j]
        ny = np.sqrt(s)
        outside = m * ny > radius
        safe_ny = np.maximum(ny, 1.0)
        u = np.where(outside[:, None], y / safe_ny[:, None], x / radius)
    return _clamp_unit(u)


def _clamp_unit_column(u):
    """Spark: clamp a unit coordinate into [-1, 1] and map NaN to 0 (as ``_clamp_unit``)."""
    from pyspark.sql import functions as F

    return F.when(F.isnan(u), F.lit(0.0)).when(u > F.lit(1.0), F.lit(1.0)).when(u < F.lit(-1.0), F.lit(-1.0)).otherwise(u)
