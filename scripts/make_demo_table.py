"""Build the demo Delta table: 20,000 synthetic 2-D points around 5 centers in [0, 100]^2.

Generated (fixed seed), so the repo ships no data. Overwrites the table.
"""

import sys

import numpy as np
import pandas as pd

from dpspark.session import build_session


def demo_points(n: int = 20_000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    centers = np.array([[20.0, 25.0], [75.0, 20.0], [50.0, 55.0], [20.0, 80.0], [80.0, 80.0]])
    sizes = rng.multinomial(n, [0.3, 0.2, 0.2, 0.15, 0.15])
    parts = [c + rng.normal(0.0, 6.0, size=(m, 2)) for c, m in zip(centers, sizes)]
    x = np.concatenate(parts)
    return pd.DataFrame({"user_id": np.arange(n), "x": x[:, 0], "y": x[:, 1]})


def main(path: str) -> None:
    # A job of seconds with no hot loop: a small job's JVM (C1 only, no web UI) starts and ends sooner.
    spark = build_session(app_name="dpspark-demo-data", small_job=True)
    spark.createDataFrame(demo_points()).coalesce(2).write.format("delta").mode("overwrite").save(path)
    print(f"demo table written: {path} (Delta, 20000 rows, columns user_id, x, y)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/demo_points")
