"""Benchmark of the ldp family: utility vs n and epsilon, and the measured additive-error exponent.

    .venv/bin/python scripts/bench_ldp.py                  # n = 1e4 .. 1e6, eps in {1, 2, 4}, 3 runs
    .venv/bin/python scripts/bench_ldp.py --quick          # n = 1e4 .. 1e5, 2 runs

Runs the SAME client (``dpspark.ldp.client.randomize_batch``) and server
(``dpspark.ldp.protocol.Driver``) code as the Spark job, on one machine without
Spark (the Spark job only adds the distributed aggregation of the same integer
counts), on synthetic well-separated Gaussian mixtures (k = 5 blobs, sd 3, in the
public box [0, 100]^2). Utility as in DESIGN.md: k-means cost of the released
centers on the data, divided by the non-private k-means++/Lloyd cost (best of 5);
additive error = cost - non-private cost (unit space [-1, 1]^d). The exponent is the
least-squares slope of log(median additive error) against log(n) over the n values
where the protocol found candidates (the paper promises about n^(1/2)).

Outputs in bench/results/ldp/: results.csv (every run), summary.md, error_vs_n.png.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sklearn.cluster import KMeans  # noqa: E402

from dpspark.ldp import client, protocol  # noqa: E402
from dpspark.privacy.domain import Domain  # noqa: E402

OUT = ROOT / "bench" / "results" / "ldp"
K = 5
CENTERS = np.array([[15.0, 15.0], [85.0, 20.0], [50.0, 50.0], [20.0, 85.0], [80.0, 80.0]])
DOMAIN = Domain(dim=2, lower=(0.0, 0.0), upper=(100.0, 100.0))


def mixture(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, size=n)
    return CENTERS[labels] + rng.normal(0.0, 3.0, size=(n, 2))


def cost(x: np.ndarray, centers: np.ndarray) -> float:
    total = 0.0
    for s in range(0, len(x), 1 << 16):
        b = x[s : s + (1 << 16)]
        total += float(((b[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2).min(axis=1).sum())
    return total


def run_ldp(unit: np.ndarray, eps: float, seed: int, objective: str = "kmeans"):
    settings = protocol.Settings()
    seeds = [client.user_seed(f"bench-{seed}", str(i)) for i in range(len(unit))]
    rounds = client.choose_round_batch(seeds, settings.fractions)
    driver = protocol.Driver(dim=2, k=K, objective=objective, epsilon=eps, settings=settings,
                             unit_diameter=DOMAIN.unit_diameter, lsh_rng=np.random.default_rng([seed, 1]),
                             fallback_rng=np.random.default_rng([seed, 2]), clip_unit=DOMAIN.clip_unit,
                             sample_unit=DOMAIN.sample_unit)
    for r in (1, 2, 3):
        params = driver.params(r)
        idx = np.nonzero(rounds == r)[0]
        sub, a, y = client.randomize_batch(unit[idx], params, [seeds[i] for i in idx])
        driver.absorb(r, params, protocol.Histogram.from_reports(sub, a, y))
    centers, _, info = driver.result(np.random.default_rng([seed, 3]))
    return centers, info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--summarize-only", action="store_true", help="redo summary.md and the plot from results.csv")
    args = ap.parse_args(argv)
    ns = [10_000, 30_000, 100_000] if args.quick else [10_000, 30_000, 100_000, 300_000, 1_000_000]
    runs = args.runs or (2 if args.quick else 3)
    epsilons = [1.0, 2.0, 4.0]
    OUT.mkdir(parents=True, exist_ok=True)
    if args.summarize_only:
        with open(OUT / "results.csv") as handle:
            rows = [{k: (v == "True" if k == "fallback" else float(v)) for k, v in r.items()} for r in csv.DictReader(handle)]
        ns = sorted({int(r["n"]) for r in rows})
        for r in rows:
            r["n"] = int(r["n"])
        summarize(rows, ns, epsilons)
        return 0
    rows = []
    for n in ns:
        x = mixture(n, seed=n)
        unit = DOMAIN.clip_to_unit(x)
        base = KMeans(K, n_init=5, random_state=0).fit(unit)
        base_cost = cost(unit, base.cluster_centers_)
        for eps in epsilons:
            for rep in range(runs):
                t = time.perf_counter()
                centers, info = run_ldp(unit, eps, seed=rep)
                seconds = time.perf_counter() - t
                c = cost(unit, centers)
                rows.append({"n": n, "epsilon": eps, "run": rep, "cost": c, "baseline_cost": base_cost,
                             "cost_ratio": c / base_cost, "additive_error": c - base_cost,
                             "candidates": info["candidates"], "kept": info["kept"],
                             "fallback": info["fallback_candidates"], "seconds": round(seconds, 2)})
                print(f"n={n:>8d} eps={eps:g} run={rep} ratio={c / base_cost:8.3f} cand={info['candidates']:3d} "
                      f"kept={info['kept']:3d} fallback={info['fallback_candidates']} {seconds:.1f}s", flush=True)
    with open(OUT / "results.csv", "w", newline="") as handle:
        w = csv.DictWriter(handle, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summarize(rows, ns, epsilons)
    return 0


def summarize(rows, ns, epsilons) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["# ldp benchmark: synthetic mixture (k = 5, d = 2, sd 3 in [0, 100]^2)", "",
             "Same client and server code as the Spark job, run on one machine. Cost = k-means cost in unit "
             "space; ratio to the non-private k-means++/Lloyd baseline (best of 5); additive error = cost - "
             "baseline. Median [min, max] over runs.", "",
             "| n | " + " | ".join(f"eps={e:g} ratio" for e in epsilons) + " | " + " | ".join(f"eps={e:g} add. error" for e in epsilons) + " |",
             "|---|" + "---|" * (2 * len(epsilons))]
    med = {}
    for n in ns:
        cells_r, cells_a = [], []
        for e in epsilons:
            sel = [r for r in rows if r["n"] == n and r["epsilon"] == e]
            ratio = [r["cost_ratio"] for r in sel]
            add = [r["additive_error"] for r in sel]
            med[(n, e)] = (float(np.median(add)), all(not r["fallback"] for r in sel))
            cells_r.append(f"{np.median(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}]")
            cells_a.append(f"{np.median(add):.4g}")
        lines.append(f"| {n:,} | " + " | ".join(cells_r) + " | " + " | ".join(cells_a) + " |")
    lines += ["", "Measured exponent of the additive error in n, least squares on log-log over the n where the "
              "median cost ratio is <= 1.5 (every cluster found; below that n the error is dominated by missed "
              "clusters and falls with n). The paper's bound is about n^0.5 for the total additive cost, i.e. "
              "n^-0.5 per user:", ""]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for e in epsilons:
        ratios = {n: float(np.median([r["cost_ratio"] for r in rows if r["n"] == n and r["epsilon"] == e])) for n in ns}
        pts = [(n, med[(n, e)][0]) for n in ns if med[(n, e)][1] and med[(n, e)][0] > 0 and ratios[n] <= 1.5]
        all_pts = [(n, med[(n, e)][0]) for n in ns if med[(n, e)][0] > 0]
        if all_pts:
            ax.loglog(*zip(*all_pts), "o-", label=f"eps={e:g}")
        if len(pts) >= 2:
            slope = float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])
            lines.append(f"- eps = {e:g}: exponent {slope:.2f} (total), {slope - 1:.2f} per user "
                         f"(n from {pts[0][0]:,} to {pts[-1][0]:,}, {len(pts)} points)")
        else:
            lines.append(f"- eps = {e:g}: fewer than 2 values of n with every cluster found: no fit")
    ref_n = np.array([ns[0], ns[-1]], dtype=float)
    anchor = max(v[0] for v in med.values())
    ax.loglog(ref_n, anchor * np.sqrt(ref_n / ref_n[0]), "k--", lw=0.8, label="slope 1/2 (reference)")
    ax.set_xlabel("n (users)")
    ax.set_ylabel("additive error (k-means cost - non-private cost, unit space)")
    ax.set_title("ldp: additive error vs n")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "error_vs_n.png", dpi=120)
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
