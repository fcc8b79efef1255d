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
        """
        from pyspark.sql import functions as F
        from pyspark.sql.functions import pandas_udf

        from dpspark.tables import _feature_expressions

        exprs, _ = _feature_expressions(df, self.features, self.domain.dim)
        unit_cols = self.domain.unit_columns(exprs)
        unit_centers = self.domain.clip_to_unit(self.centers)
        c_sq = (unit_centers**2).sum(axis=1)

        @pandas_udf("int")
        def nearest(points: pd.DataFrame) -> pd.Series:
            x = points.to_numpy(dtype=np.float64)
            labels = np.argmin(c_sq[None, :] - 2.0 * (np.nan_to_num(x) @ unit_centers.T), axis=1)
            out = pd.Series(labels.astype(np.int32))
            return out.where(~np.isnan(x).any(axis=1), None)

        return df.withColumn(prediction_col, nearest(F.struct(*[c.alias(f"u{j}") for j, c in enumerate(unit_cols)])))

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
