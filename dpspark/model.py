"""The fitted model every family returns, in the shape Spark users know:
``estimator.fit(df)`` returns a ``ClusteringModel`` with the released ``centers``
and ``transform(df)`` adding a prediction column.

Everything on the model except ``transform``'s output is a released value
(noisy centers, noisy weights) or public (parameters, the privacy spent).
``transform`` labels each row of the given table with its nearest released
center: the labels are computed from the (private) rows themselves and are NOT
differentially private outputs; treat them as private data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpspark.privacy.domain import Domain


@dataclass
class ClusteringModel:
    algorithm: str
    objective: str
    centers: np.ndarray  # (k, d), original units: released
    noisy_weights: np.ndarray  # (k,): released
    epsilon_spent: float
    delta_spent: float
    charges: list[dict]
    domain: Domain
    features: tuple[str, ...]
    feature_names: list[str]
    parameters: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.centers.shape[0])

    def transform(self, df, prediction_col: str = "prediction"):
        """Add ``prediction_col``: the index of the nearest released center (in unit space).

        NOT differentially private: the labels are computed from the rows of ``df``.
        Distances by the families' per-entry rule (``dpspark.kernels.nearest_center``, ties to
        the lowest index), so a row's label depends only on that row and the centers. A row the
        fit would drop (a null, NaN or +-inf feature) gets a null prediction.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.functions import pandas_udf

        from dpspark.tables import _feature_expressions

        exprs, _ = _feature_expressions(df, self.features, self.domain.dim)
        valid = None
        for c in exprs:  # the validity test of tables.prepare_points
            ok = c.isNotNull() & ~F.isnan(c) & (F.abs(c) != F.lit(float("inf")))
            valid = ok if valid is None else valid & ok
        unit_cols = self.domain.unit_columns(exprs)
        unit_centers = self.domain.clip_to_unit(self.centers)
        dim = self.domain.dim

        @pandas_udf("int")
        def nearest(points: pd.DataFrame) -> pd.Series:
            from dpspark.kernels import nearest_center
            from dpspark.privacy.fixedpoint import sanitize_unit

            ok = points["valid"].fillna(False).to_numpy(dtype=bool)
            x = sanitize_unit(points[[f"u{j}" for j in range(dim)]].to_numpy(dtype=np.float64))
            out = pd.Series(nearest_center(x, unit_centers).astype(np.int32))
            return out.where(ok, None)

        point = F.struct(valid.alias("valid"), *[c.alias(f"u{j}") for j, c in enumerate(unit_cols)])
        return df.withColumn(prediction_col, nearest(point))

    def summary(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "objective": self.objective,
            "k": self.k,
            "epsilon_spent": self.epsilon_spent,
            "delta_spent": self.delta_spent,
            "centers": self.centers.tolist(),
            "noisy_weights": self.noisy_weights.tolist(),
        }
