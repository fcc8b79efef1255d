"""auto's Lloyd-step threshold (issue 26, finding 5.3): the old rule against the new one, through Spark.

A Lloyd step of auto used to move every cluster whose noisy count was >= 1; it now moves a cluster
only when its noisy count clears ``steps.lloyd.lloyd_min_count(eps_t, d)`` (LLOYD_MIN_COUNT_SDS noise
standard deviations of the count and a coordinate sum), else it keeps the previous (released) center.
This script fits ``AutoClustering`` (delta = 0: the tree + Lloyd route) with the old rule and with
each LLOYD_MIN_COUNT_SDS given (default: the shipped value) on a few public datasets, every fit
``estimator.fit(spark_df)`` on one local[2] session, seeded (the same seeds for every rule: a paired
comparison, identical up to the first step where the rules differ), and prints per rule the median
[IQR] cost ratio against non-private k-means++ (scikit-learn, best of 10), the mean of the paired
ratios against the old rule, and how often the rule held a center the old one moved.

    .venv/bin/python scripts/bench_auto_lloyd_threshold.py [--seeds 10] [--epsilon 1] [--sds 0.5 1 3]
                                                           [--datasets adult blood tripadvisor]

Seeded runs are NOT PRIVATE (a testing aid). Public domain = per-column min/max of each dataset (the
benchmark convention of ``bench_common.PUBLIC_BOUNDS_NOTE``).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402

LOADERS = {"adult": bc.load_adult, "electrical_grid": bc.load_electrical_grid, "tripadvisor": bc.load_tripadvisor,
           "google_reviews": bc.load_google_reviews, "blood": bc.load_blood_transfusion, "credit_card": bc.load_credit_card}
DEFAULT_DATASETS = ("adult", "blood", "tripadvisor")  # the ones where the rule binds at all


def rules(sds_values):
    """(name, LLOYD_MIN_COUNT_SDS) pairs, the old rule first: 0 gives max(1, 0) = 1, i.e. noisy count >= 1."""
    from dpspark.steps import lloyd

    shipped = lloyd.LLOYD_MIN_COUNT_SDS
    return [("old: noisy count >= 1", 0.0)] + [
        (f"{z:g} sd" + (" (shipped)" if z == shipped else ""), z) for z in (sds_values or [shipped])]


def fit_once(frame, x_unit, lo, hi, k, eps, seed, sds):
    """One seeded fit with LLOYD_MIN_COUNT_SDS = sds: (cost, clusters held by this threshold but not by >= 1)."""
    from dpspark.auto import AutoClustering, estimator
    from dpspark.steps import lloyd

    held = []
    real_move, real_sds = estimator.lloyd_move, lloyd.LLOYD_MIN_COUNT_SDS

    def counting_move(centers, noisy_counts, noisy_sums, min_count, domain):
        held.append(int(((noisy_counts >= 1.0) & (noisy_counts < min_count)).sum()))
        return real_move(centers, noisy_counts, noisy_sums, min_count, domain)

    estimator.lloyd_move, lloyd.LLOYD_MIN_COUNT_SDS = counting_move, sds
    try:
        est = AutoClustering(k=k, epsilon=eps, delta=0.0, domain=bc.domain(lo, hi), features=tuple(frame.columns), seed=seed)
        model = est.fit(frame)
    finally:
        estimator.lloyd_move, lloyd.LLOYD_MIN_COUNT_SDS = real_move, real_sds
    route = (model.info.get("auto") or {})
    return bc.kmeans_cost(x_unit, bc.scale_unit(model.centers, lo, hi)), sum(held), route.get("lloyd_steps")


def compare(spark, args, the_rules) -> list[list]:
    """A table row per (dataset, rule)."""
    rows = []
    for name in args.datasets:
        _, x, k = LOADERS[name]()
        lo, hi = bc.public_bounds(x)
        x_unit = bc.scale_unit(x, lo, hi)
        _, base_cost = bc.nonprivate_baseline(x_unit, k, seed=0, n_init=10)
        frame = bh.cached_frame(spark, x, [f"f{j}" for j in range(x.shape[1])], 2)
        ratios = {r: [] for r, _ in the_rules}
        held = {r: [] for r, _ in the_rules}
        steps = set()
        try:
            for seed in range(1, args.seeds + 1):
                for rule, sds in the_rules:
                    cost, n_held, n_steps = fit_once(frame, x_unit, lo, hi, k, args.epsilon, seed, sds)
                    ratios[rule].append(cost / base_cost)
                    held[rule].append(n_held)
                    steps.add(n_steps)
                print(f"  {name} seed {seed}: " + ", ".join(f"{r} {ratios[r][-1]:.3f}" for r, _ in the_rules),
                      file=sys.stderr, flush=True)
        finally:
            frame.unpersist()
        old = np.asarray(ratios[the_rules[0][0]])
        for rule, _ in the_rules:
            r = np.asarray(ratios[rule])
            paired = r / old
            rows.append([name, x.shape[0], x.shape[1], k, ",".join(str(s) for s in sorted(steps)), rule,
                         bc.fmt_med_iqr(r), f"{paired.mean():.4f}",
                         f"{int((paired > 1.01).sum())}/{int((paired < 0.99).sum())}",
                         f"{sum(h > 0 for h in held[rule])}/{len(held[rule])} ({sum(held[rule])})"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--datasets", nargs="+", default=list(DEFAULT_DATASETS), choices=sorted(LOADERS))
    ap.add_argument("--sds", nargs="*", type=float, default=None,
                    help="LLOYD_MIN_COUNT_SDS values to compare with the old rule (default: the shipped one)")
    args = ap.parse_args(argv)

    logging.disable(logging.WARNING)
    the_rules = rules(args.sds)
    t_start = time.perf_counter()
    with bh.session("dpspark-bench-auto-lloyd") as spark:
        rows = compare(spark, args, the_rules)
    print(f"auto (tree + Lloyd route, delta = 0), epsilon = {args.epsilon:g}, seeds 1-{args.seeds} (the same seeds for "
          f"every rule; seeded = NOT PRIVATE, a testing aid), every fit through Spark (local[2]); machine: "
          f"{os.cpu_count()} cores, {platform.platform()}; {time.perf_counter() - t_start:.0f} s in all.")
    print("Cost ratio = k-means cost / non-private k-means++ (scikit-learn, best of 10), data scaled to [-1, 1]^d; "
          "paired = this rule's ratio / the old rule's, same seed.")
    print(bc.PUBLIC_BOUNDS_NOTE)
    print()
    print(bh.markdown_table(
        ["dataset", "n", "d", "k", "Lloyd steps", "rule", "cost ratio, median [IQR]", "mean paired vs old",
         "seeds worse/better by > 1%", "fits where it held a center (clusters)"],
        rows, ["l", "r", "r", "r", "r", "l", "r", "r", "r", "r"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
