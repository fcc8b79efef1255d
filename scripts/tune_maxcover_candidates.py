#!/usr/bin/env python
"""Tuning experiment for maxcover's private candidate generator: number of scales x candidate share.

    .venv/bin/python scripts/tune_maxcover_candidates.py [--reps 4] [--out bench/results/maxcover/tuning.md]
    .venv/bin/python scripts/tune_maxcover_candidates.py --quick --out /tmp/tuning.md   # smoke: blood_transfusion, 1 setting

Datasets: names from bench_utility, or ``mixture<n>`` (e.g. ``mixture1e6``: 10 Gaussian components in the
public box [-10, 10]^2, bench_scale's kind of data). For every dataset, epsilon and setting, runs ``MaxCover(objective="kmeans", candidates="private")`` with
``candidate_scales`` = L and ``eps_candidates`` = c (the rest of epsilon split evenly between the
coverage loop and the counts), through ``bench_utility.fit_numpy`` (the estimator's own driver code,
numpy aggregation; ``--engine spark``: ``fit(df)`` on Spark), seeded noise (run r uses seed 500 + r), and reports the median cost ratio to
non-private k-means++ (best of 10) in the unit space, with public min/max bounds (benchmark convention).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402
import bench_utility as bu  # noqa: E402

DATASETS = ["s1", "a3", "unbalance", "adult"]
EPSILONS = [0.5, 1.0, 2.0]
SETTINGS = [(5, 0.2), (3, 0.2), (2, 0.2), (5, 0.4), (3, 0.4), (2, 0.4)]  # (scales, candidate share); (5, 0.2) = old default


def synthetic_mixture(name: str) -> dict:
    """``mixture<n>``: bench_scale's kind of data in d = 2 (10 components, sigma 1.5, public box [-10, 10]^2)."""
    n = int(float(name[len("mixture"):]))
    rng = np.random.default_rng([2024, 2])
    means = rng.uniform(-6.0, 6.0, size=(10, 2))
    x = np.clip(means[rng.integers(0, 10, size=n)] + rng.normal(0.0, 1.5, size=(n, 2)), -10.0, 10.0)
    lo, hi = np.full(2, -10.0), np.full(2, 10.0)
    return {"name": name, "x": x, "unit": bc.scale_unit(x, lo, hi), "lo": lo, "hi": hi, "k": 10}


def run(spark, args, settings) -> tuple[list[list], dict, float]:
    """The table (a row per dataset and epsilon), the wins per setting and the seconds it took."""
    from dpspark.maxcover.estimator import MaxCover

    t0 = time.perf_counter()
    table, wins = [], {st: 0 for st in settings}
    for name in args.datasets:
        ds = synthetic_mixture(name) if name.startswith("mixture") else bu.load_dataset(name, args.max_rows)
        _, base = bc.nonprivate_baseline(ds["unit"], ds["k"], n_init=10 if len(ds["x"]) <= 200_000 else 2)
        df = None
        if spark is not None:
            df = bh.cached_frame(spark, ds["x"], [f"f{j}" for j in range(ds["x"].shape[1])], 4)
        for eps in args.epsilons:
            meds = []
            for scales, share in settings:
                ratios = []
                for r in range(args.reps):
                    est = MaxCover(k=ds["k"], epsilon=eps, delta=bu.DELTA, domain=bu.domain_of(ds),
                                   features=tuple(f"f{j}" for j in range(ds["x"].shape[1])), objective="kmeans",
                                   candidates="private", candidate_scales=scales, eps_candidates=share,
                                   eps_coverage=(1 - share) / 2, eps_counts=(1 - share) / 2, seed=500 + r)
                    centers = est.fit(df).centers if df is not None else bu.fit_numpy(est, ds["x"])[0]
                    ratios.append(bc.kmeans_cost(ds["unit"], bc.scale_unit(centers, ds["lo"], ds["hi"])) / base)
                meds.append(float(np.median(ratios)))
            wins[settings[int(np.argmin(meds))]] += 1
            table.append([f"{name} ({len(ds['x'])}, {ds['k']})", f"{eps:g}"] + [f"{m:.3g}" for m in meds])
            print(" | ".join(table[-1]), flush=True)
        if df is not None:
            df.unpersist()
    return table, wins, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--max-rows", type=int, default=10000)
    ap.add_argument("--datasets", nargs="*", default=DATASETS)
    ap.add_argument("--epsilons", nargs="*", type=float, default=EPSILONS)
    ap.add_argument("--settings", default=",".join(f"{s}:{c:g}" for s, c in SETTINGS),
                    help="comma-separated scales:share pairs, e.g. 5:0.2,3:0.4")
    ap.add_argument("--engine", choices=["numpy", "spark"], default="numpy",
                    help="spark: estimator.fit(df) on a cached DataFrame in one local[2] session (large n)")
    ap.add_argument("--out", type=Path, default=bc.ROOT / "bench" / "results" / "maxcover" / "tuning.md")
    ap.add_argument("--quick", action="store_true", help="smoke run: blood_transfusion, epsilon 1, the setting 5:0.4, 1 rep")
    args = ap.parse_args(argv)
    if args.quick:
        args.datasets, args.epsilons, args.settings, args.reps = ["blood_transfusion"], [1.0], "5:0.4", 1
    settings = [(int(a), float(b)) for a, b in (item.split(":") for item in args.settings.split(","))]

    with contextlib.ExitStack() as stack:
        spark = stack.enter_context(bh.session("dpspark-tune", conf={})) if args.engine == "spark" else None
        table, wins, seconds = run(spark, args, settings)
    lines = ["# maxcover private candidates: scales L x candidate share c", "",
             f"Command: `{bh.command_line('tune_maxcover_candidates.py', argv)}`; "
             f"{seconds:.0f} s. Median cost ratio to non-private over {args.reps} seeded runs "
             "(k-means objective, delta = 1e-6, candidate_count 1000; the rest of epsilon split evenly between "
             "coverage and counts).", "",
             bh.markdown_table(["dataset (n, k)", "eps"] + [f"L={s}, c={c:g}" for s, c in settings], table, ["l", "r"] + ["r"] * len(settings)), "",
             "Best setting per (dataset, eps): " + ", ".join(f"L={s}, c={c:g}: {w}" for (s, c), w in wins.items())]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
