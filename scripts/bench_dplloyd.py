#!/usr/bin/env python
"""Utility benchmark of the dplloyd family (issue 4): a benchmark script, not a test.

Four variants x the six datasets of the cluster-merging paper (../shared/datasets/dp-kccm)
x epsilon in {0.25, 0.5, 1, 2}, k as in the paper, 12 iterations, merge_factor 3, many
repetitions. For the nk variants both merges (weighted_kmeans, nearest_pair) and for every
variant both noise rules (su, paper) are run, so that the defaults can be chosen by
measurement.

What runs is the real driver code: ``dpspark.dplloyd.core.run_lloyd`` on
``core.numpy_aggregate(unit X)``, the single-machine aggregation that computes the same exact
integer aggregates as the Spark pass (tests check that), with
``Accountant(eps, 0, OpenDPNoise())``: real, secure noise by default; ``--seeded`` uses
``SeededNoise`` instead (reproducible, NOT private: a testing aid).

Paired merges: for an nk variant, the two merges of one repetition post-process the SAME
noisy Lloyd run (the secure noise draws are recorded and replayed, and the public generator
has the same seed); merging is post-processing, so this is exactly two releases of one run.

Metrics (DESIGN.md "Measuring utility"): NICV = (1/N) sum min_j ||x - c_j||^2 on data scaled
to [-1, 1]^d, and cost ratio = k-means cost of the released centers / cost of non-private
scikit-learn KMeans (k-means++, best of n_init=10) on the same scaled data.

Public bounds: per-column min/max of each dataset, treated as public domain knowledge as in
the literature (see bench_common.PUBLIC_BOUNDS_NOTE).

    .venv/bin/python scripts/bench_dplloyd.py --quick          # smoke run: 1 dataset, epsilon 1, 1 rep
    .venv/bin/python scripts/bench_dplloyd.py --reps 20        # the full benchmark
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import secrets
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402
from dpspark.dplloyd import core  # noqa: E402
from dpspark.dplloyd.params import VARIANTS, DPLloydParams  # noqa: E402
from dpspark.privacy.accountant import Accountant  # noqa: E402
from dpspark.privacy.mechanisms import NoiseSource, OpenDPNoise, SeededNoise  # noqa: E402

VARIANT_ORDER = ["allocation_nk", "average_nk", "average_k", "allocation_k"]  # the paper's ranking, best first
EPSILONS = [0.25, 0.5, 1.0, 2.0]
NOISES = ["su", "paper"]
MERGES = ["weighted_kmeans", "nearest_pair"]
ITERATIONS = 12
MERGE_FACTOR = 3
NO_MERGE = "-"


def configs():
    """(variant, noise, merge) triples; merge is '-' for the k variants (nothing to merge)."""
    out = []
    for variant in VARIANT_ORDER:
        for noise in NOISES:
            if VARIANTS[variant][1]:
                out.extend((variant, noise, m) for m in MERGES)
            else:
                out.append((variant, noise, NO_MERGE))
    return out


class TapeNoise(NoiseSource):
    """Records the draws of a base source, then replays them (``rewind``) for a second release.

    Used only to post-process one noisy Lloyd run with two different merges: the replayed
    run releases exactly the same noisy counts and sums, so the two merges are paired.
    """

    def __init__(self, base: NoiseSource):
        self.base = base
        self.secure = base.secure
        self.description = base.description + " (recorded, replayed for the paired second merge)"
        self.tape: list[tuple[float, int, np.ndarray]] = []
        self.pos: int | None = None  # None: recording

    def rewind(self):
        self.pos = 0

    def discrete_laplace(self, scale, size):
        if self.pos is None:
            z = self.base.discrete_laplace(scale, size)
            self.tape.append((float(scale), int(size), z))
            return z
        s, n, z = self.tape[self.pos]
        if s != float(scale) or n != int(size):
            raise RuntimeError("replayed run asked for different noise than the recorded one")
        self.pos += 1
        return z

    def discrete_gaussian(self, sigma, size):
        raise NotImplementedError

    def gumbel_argmax(self, scores, scale):
        raise NotImplementedError


@functools.lru_cache(maxsize=None)
def prepared(loader_name: str):
    """(name, k, public domain, unit-space X, exact aggregate, non-private baseline cost), once per process."""
    name, x, k = getattr(bc, loader_name)()
    lo, hi = bc.public_bounds(x)  # PUBLIC for the benchmark (see bench_common)
    domain = bc.domain(lo, hi)
    unit = domain.clip_to_unit(x)
    _, base_cost = bc.nonprivate_baseline(unit, k, seed=0, n_init=10)
    return name, k, domain, unit, core.numpy_aggregate(unit), base_cost


def memoized(aggregate):
    """The same exact aggregates for the same centroids (one noisy run replayed for its second merge)."""
    cache = {}

    def agg(centroids):
        key = np.ascontiguousarray(centroids, dtype=np.float64).tobytes()
        if key not in cache:
            cache[key] = aggregate(centroids)
        return cache[key]

    return agg


def run_cell(task):
    """All configs x reps for one (dataset, epsilon). Runs in a worker process."""
    (loader_name, eps, reps, seeded, base_seed) = task
    name, k, domain, unit, exact_aggregate, base_cost = prepared(loader_name)
    base_nicv = base_cost / len(unit)
    rows = []
    secure_base = None if seeded else OpenDPNoise()
    for variant, noise, merge in configs():
        if merge == "nearest_pair":
            continue  # produced together with weighted_kmeans below (paired)
        schedule, merges = VARIANTS[variant]
        merge_list = MERGES if merges else [NO_MERGE]
        for rep in range(reps):
            key = (name, eps, variant, noise, rep)
            public_seed = bh.stable_seed(base_seed, *key) if seeded else secrets.randbits(63)
            if seeded:
                base = SeededNoise(np.random.SeedSequence([base_seed, bh.stable_seed(*key)]))
            else:
                base = secure_base
            tape = TapeNoise(base)
            aggregate = memoized(exact_aggregate)  # the replayed run asks for the same aggregates
            for i, m in enumerate(merge_list):
                if i > 0:
                    tape.rewind()
                params = DPLloydParams(variant=variant, iterations=ITERATIONS, merge_factor=MERGE_FACTOR,
                                       schedule=schedule, noise=noise,
                                       merge=m if m != NO_MERGE else "weighted_kmeans")
                acc = Accountant(eps, 0.0, tape)
                t0 = time.perf_counter()
                centers, weights, trace = core.run_lloyd(aggregate, domain, k, params, acc,
                                                         np.random.default_rng(public_seed), eps)
                seconds = time.perf_counter() - t0
                acc.finish()
                cost = bc.kmeans_cost(unit, centers)
                rows.append({
                    "dataset": name, "n": len(unit), "d": unit.shape[1], "k": k, "epsilon": eps,
                    "variant": variant, "noise": noise, "merge": m, "rep": rep,
                    "nicv": cost / len(unit), "cost_ratio": cost / base_cost, "baseline_nicv": base_nicv,
                    "epsilon_spent": acc.spent_epsilon, "n_centers": len(centers),
                    "reseeded_total": int(sum(trace.reseeded)), "seconds": seconds,
                    "noise_source": base.description, "public_seed": public_seed,
                })
    return rows


# --------------------------------------------------------------------------
# Summaries


def group(rows, keys):
    out = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def med(rows, metric):
    return bc.median_iqr([r[metric] for r in rows])[0]


def full_table(rows, datasets):
    by = group(rows, ["dataset", "epsilon", "variant", "noise", "merge"])
    base = {r["dataset"]: r["baseline_nicv"] for r in rows}
    parts = []
    for ds in datasets:
        n, d, k = next((r["n"], r["d"], r["k"]) for r in rows if r["dataset"] == ds)
        table_rows = []
        for eps in EPSILONS:
            for variant, noise, merge in configs():
                g = by.get((ds, eps, variant, noise, merge))
                if not g:
                    continue
                table_rows.append([f"{eps:g}", variant, noise, merge, len(g),
                                   bc.fmt_med_iqr([r["nicv"] for r in g]), bc.fmt_med_iqr([r["cost_ratio"] for r in g])])
        parts.append(f"### {ds} (n = {n}, d = {d}, k = {k}; non-private k-means++ NICV = {base[ds]:.4g}; "
                     f"one center at the data mean: NICV {one_center_nicv(ds):.4g})\n\n" + bh.markdown_table(
            ["epsilon", "variant", "noise", "merge", "runs", "NICV median [IQR]", "cost ratio median [IQR]"],
            table_rows, ["r", "l", "l", "l", "r", "r", "r"]))
    return "\n\n".join(parts)


@functools.lru_cache(maxsize=None)
def one_center_nicv(name: str) -> float:
    """NICV of the single center at the mean of the scaled data: what a useless k-center release scores."""
    _, x, _ = bc.LOADERS_BY_NAME[name]()
    lo, hi = bc.public_bounds(x)
    u = bc.scale_unit(x, lo, hi)
    return bc.nicv(u, u.mean(axis=0, keepdims=True))


def summary_table(rows, datasets, eps=1.0):
    by = group(rows, ["dataset", "epsilon", "variant", "noise", "merge"])
    out_rows = []
    for variant, noise, merge in configs():
        cells = []
        for ds in datasets:
            g = by.get((ds, eps, variant, noise, merge))
            cells.append(f"{med(g, 'nicv'):.3g} ({med(g, 'cost_ratio'):.2f}x)" if g else "")
        out_rows.append([variant, noise, merge, *cells])
    base = {r["dataset"]: r["baseline_nicv"] for r in rows}
    out_rows.append(["non-private k-means++", "", "", *[f"{base[ds]:.3g} (1.00x)" for ds in datasets]])
    one = {ds: one_center_nicv(ds) for ds in datasets}
    out_rows.append(["one center at the data mean (k = 1, non-private)", "", "",
                     *[f"{one[ds]:.3g} ({one[ds] / base[ds]:.2f}x)" for ds in datasets]])
    return bh.markdown_table(["variant", "noise", "merge", *datasets], out_rows, ["l", "l", "l", *["r"] * len(datasets)])


def ranking_verdict(rows, datasets, noise, merge, label):
    """Does allocation_nk < average_nk < average_k < allocation_k (median NICV) hold?"""
    by = group(rows, ["dataset", "epsilon", "variant", "noise", "merge"])
    lines = [f"Paper's ranking (allocation_nk < average_nk < average_k < allocation_k by median NICV), {label}:"]
    holds = best = total = 0
    for ds in datasets:
        cells = []
        for eps in EPSILONS:
            m = {}
            for v in VARIANT_ORDER:
                g = by.get((ds, eps, v, noise, merge if VARIANTS[v][1] else NO_MERGE))
                if g:
                    m[v] = med(g, "nicv")
            if len(m) < 4:
                continue
            order = sorted(m, key=m.get)
            ok = order == VARIANT_ORDER
            total += 1
            holds += ok
            best += order[0] == "allocation_nk"
            short = {"allocation_nk": "Ank", "average_nk": "Vnk", "average_k": "Vk", "allocation_k": "Ak"}
            cells.append(f"eps={eps:g}: {'HOLDS' if ok else 'no'} ({' < '.join(short[v] for v in order)})")
        lines.append(f"  {ds}: " + "; ".join(cells))
    lines.append(f"  => full ranking holds in {holds}/{total} (dataset, epsilon) cells; allocation_nk best in {best}/{total}."
                 "  (Ank = allocation_nk, Vnk = average_nk, Vk = average_k, Ak = allocation_k)")
    pairs = [("allocation_nk", "average_nk"), ("average_nk", "average_k"), ("average_k", "allocation_k"),
             ("allocation_nk", "average_k"), ("allocation_k", "average_k"), ("allocation_nk", "allocation_k")]
    parts = []
    for a, b in pairs:
        w = t = 0
        for ds in datasets:
            for eps in EPSILONS:
                ga = by.get((ds, eps, a, noise, merge if VARIANTS[a][1] else NO_MERGE))
                gb = by.get((ds, eps, b, noise, merge if VARIANTS[b][1] else NO_MERGE))
                if ga and gb:
                    t += 1
                    w += med(ga, "nicv") < med(gb, "nicv")
        parts.append(f"{a} < {b} in {w}/{t}")
    lines.append("  pairwise (cells where the first has the lower median NICV): " + "; ".join(parts))
    return lines


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test (ties dropped): is a win rate this far from 1/2 plausible by chance?"""
    n = wins + losses
    if n == 0:
        return float("nan")
    tail = sum(math.comb(n, i) for i in range(0, min(wins, losses) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def wins_verdict(rows):
    lines = []
    by = group(rows, ["dataset", "epsilon", "variant", "noise", "merge"])
    # Noise rules: every (dataset, epsilon, variant, merge) cell, compared on median NICV.
    wins = {"su": 0, "paper": 0, "tie": 0}
    for (ds, eps, v, noise, merge), g in by.items():
        if noise != "su":
            continue
        other = by.get((ds, eps, v, "paper", merge))
        if not other:
            continue
        a, b = med(g, "nicv"), med(other, "nicv")
        wins["su" if a < b else "paper" if b < a else "tie"] += 1
    ratios = []
    for (ds, eps, v, noise, merge), g in by.items():
        if noise == "su" and (ds, eps, v, "paper", merge) in by:
            ratios.append(med(g, "nicv") / med(by[(ds, eps, v, "paper", merge)], "nicv"))
    lines.append(f"Noise rule, wins on median NICV over (dataset, epsilon, variant, merge) cells: su {wins['su']}, "
                 f"paper {wins['paper']}, ties {wins['tie']} (sign test p = {sign_test_p(wins['su'], wins['paper']):.2g}); "
                 f"geometric mean of median NICV su / paper = {math.exp(np.mean(np.log(ratios))):.3f}.")
    # Merges: every (dataset, epsilon, nk variant, noise) cell; plus the paired per-run comparison.
    wins = {"weighted_kmeans": 0, "nearest_pair": 0, "tie": 0}
    for (ds, eps, v, noise, merge), g in by.items():
        if merge != "weighted_kmeans":
            continue
        other = by.get((ds, eps, v, noise, "nearest_pair"))
        if not other:
            continue
        a, b = med(g, "nicv"), med(other, "nicv")
        wins["weighted_kmeans" if a < b else "nearest_pair" if b < a else "tie"] += 1
    paired = group([r for r in rows if r["merge"] != NO_MERGE], ["dataset", "epsilon", "variant", "noise", "rep"])
    pw = pt = 0
    ratios = []
    for g in paired.values():
        m = {r["merge"]: r["nicv"] for r in g}
        if len(m) == 2:
            pt += 1
            pw += m["weighted_kmeans"] < m["nearest_pair"]
            ratios.append(m["nearest_pair"] / m["weighted_kmeans"])
    lines.append(f"Merge, wins on median NICV over (dataset, epsilon, nk variant, noise) cells: weighted_kmeans "
                 f"{wins['weighted_kmeans']}, nearest_pair {wins['nearest_pair']}, ties {wins['tie']} (sign test p = "
                 f"{sign_test_p(wins['weighted_kmeans'], wins['nearest_pair']):.2g}); paired runs "
                 f"(same noisy Lloyd run, two merges): weighted_kmeans better in {pw}/{pt}, median NICV ratio "
                 f"nearest_pair / weighted_kmeans = {bc.median_iqr(ratios)[0]:.3g}.")
    return lines


def plot(rows, datasets, out_dir: Path):
    plt = bh.pyplot()
    by = group(rows, ["dataset", "epsilon", "variant", "noise", "merge"])
    base = {r["dataset"]: r["baseline_nicv"] for r in rows}
    styles = {"allocation_nk": ("C0", "o"), "average_nk": ("C1", "s"), "average_k": ("C2", "^"), "allocation_k": ("C3", "v")}
    panels = [("su", "weighted_kmeans", "noise su, merge weighted_kmeans (dpspark defaults)"),
              ("paper", "nearest_pair", "noise paper, merge nearest_pair (the paper's rules)")]
    paths = []
    for ds in datasets:
        n, d, k = next((r["n"], r["d"], r["k"]) for r in rows if r["dataset"] == ds)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, (noise, merge, title) in zip(axes, panels):
            for v in VARIANT_ORDER:
                mg = merge if VARIANTS[v][1] else NO_MERGE
                pts = [(eps, bc.median_iqr([r["nicv"] for r in by[(ds, eps, v, noise, mg)]]))
                       for eps in EPSILONS if (ds, eps, v, noise, mg) in by]
                if not pts:
                    continue
                e = [p[0] for p in pts]
                color, marker = styles[v]
                ax.plot(e, [p[1][0] for p in pts], marker=marker, color=color, label=v)
                ax.fill_between(e, [p[1][1] for p in pts], [p[1][2] for p in pts], color=color, alpha=0.15)
            ax.axhline(base[ds], color="k", ls="--", lw=1, label="non-private k-means++")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(EPSILONS, [f"{e:g}" for e in EPSILONS])
            ax.set_xlabel("epsilon")
            ax.set_title(title, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("NICV (median, band = IQR)")
        axes[1].legend(fontsize=8)
        fig.suptitle(f"dplloyd on {ds} (n={n}, d={d}, k={k}, {ITERATIONS} iterations, "
                     f"{len(by.get((ds, EPSILONS[0], 'average_k', 'su', NO_MERGE), []))} runs per point)", fontsize=10)
        path = out_dir / f"nicv_{ds}.png"
        bh.save_figure(fig, path)
        paths.append(path)
    return paths


def read_runs(path):
    return bh.read_csv(path, ints=("n", "d", "k", "rep", "n_centers", "reseeded_total", "public_seed"),
                       floats=("epsilon", "nicv", "cost_ratio", "baseline_nicv", "epsilon_spent", "seconds"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20, help="repetitions per (dataset, epsilon, variant, noise) (default 20)")
    ap.add_argument("--quick", action="store_true", help="smoke run: blood_transfusion, epsilon 1, 1 rep")
    ap.add_argument("--seeded", action="store_true", help="SeededNoise (reproducible, NOT private) instead of OpenDP secure noise")
    ap.add_argument("--seed", type=int, default=20240604, help="base seed for --seeded")
    ap.add_argument("--datasets", default=None, help="comma-separated subset of dataset names")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--out", default=str(bc.ROOT / "bench" / "results" / "dplloyd"))
    ap.add_argument("--from-csv", default=None, help="no runs: rebuild the table, plots and verdict from a runs.csv")
    args = ap.parse_args(argv)
    logging.getLogger("dpspark").setLevel(logging.WARNING)

    loaders = bc.DPKCCM_LOADERS
    reps, epsilons = args.reps, EPSILONS
    if args.quick:
        loaders, reps, epsilons = [bc.load_blood_transfusion], 1, [1.0]
    if args.datasets:
        wanted = set(args.datasets.split(","))
        loaders = [L for L in bc.DPKCCM_LOADERS if L in [bc.LOADERS_BY_NAME.get(name) for name in wanted]]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = [(L.__name__, eps, reps, args.seeded, args.seed) for L in loaders for eps in epsilons]
    t0 = time.perf_counter()
    rows = []
    if args.from_csv:
        rows = read_runs(args.from_csv)
        reps = max(r["rep"] for r in rows) + 1
        args.seeded = "NOT private" in rows[0]["noise_source"]
        meta_path = Path(args.from_csv).with_name("meta.json")
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            argv = meta["command"].split()[2:]  # report the command that produced the runs
            t0 -= meta.get("wall_seconds", 0.0)
    else:
        with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else contextlib.nullcontext() as ex:
            for i, part in enumerate((ex.map if ex else map)(run_cell, tasks), 1):
                rows.extend(part)
                print(f"  [{i}/{len(tasks)}] {part[0]['dataset']} eps={part[0]['epsilon']:g}: {len(part)} runs "
                      f"({time.perf_counter() - t0:.0f}s)", flush=True)
    wall = time.perf_counter() - t0
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))

    csv_path = out_dir / "runs.csv"
    bh.write_csv(csv_path, rows)
    plots = plot(rows, datasets, out_dir)

    noise_desc = rows[0]["noise_source"]
    verdict = []
    verdict += ranking_verdict(rows, datasets, "su", "weighted_kmeans", "noise su, merge weighted_kmeans (dpspark defaults)")
    verdict += ranking_verdict(rows, datasets, "paper", "nearest_pair", "noise paper, merge nearest_pair (the paper's rules)")
    verdict += wins_verdict(rows)
    cmd = bh.command_line("bench_dplloyd.py", argv)
    header = [
        "# dplloyd utility benchmark",
        "",
        f"Command: `{cmd.strip()}`; {len(rows)} runs in {wall:.0f} s on {bh.machine_description()['nproc']} cores.",
        f"Runs per (dataset, epsilon, variant, noise, merge): {reps}. Iterations {ITERATIONS}, merge_factor {MERGE_FACTOR}.",
        f"Noise: {noise_desc}. " + ("NOT private: seeded testing noise." if args.seeded else ""),
        "Driver code: `dpspark.dplloyd.core.run_lloyd` on `core.numpy_aggregate` (the exact aggregates the Spark pass computes).",
        "For nk variants the two merges of one repetition post-process the same noisy run (paired).",
        "",
        bc.PUBLIC_BOUNDS_NOTE,
        "",
        "NICV = (1/N) sum min_j ||x - c_j||^2 on data scaled to [-1, 1]^d (lower is better). Cost ratio = k-means cost of the "
        "released centers / cost of non-private scikit-learn KMeans (k-means++, best of n_init=10) on the same data (1.0 = as good).",
        "Cells: median [25th, 75th percentile] over the runs.",
        "",
        "## Verdict",
        "",
        "```",
        *verdict,
        "```",
        "",
        "## Summary at epsilon = 1: median NICV (median cost ratio)",
        "",
        summary_table(rows, datasets, 1.0),
        "",
        "## All results",
        "",
        full_table(rows, datasets),
        "",
        "Plots: " + ", ".join(f"`{p.name}`" for p in plots) + f". Every run: `{csv_path.name}`.",
        "",
    ]
    md_path = out_dir / "results.md"
    md_path.write_text("\n".join(header))
    with open(out_dir / "meta.json", "w") as fh:
        json.dump({"command": cmd.strip(), "reps": reps, "seeded": args.seeded, "wall_seconds": wall,
                   "machine": bh.machine_description(), "datasets": datasets, "epsilons": EPSILONS,
                   "iterations": ITERATIONS, "merge_factor": MERGE_FACTOR, "public_bounds": bc.PUBLIC_BOUNDS_NOTE}, fh, indent=2)

    print()
    print("\n".join(verdict))
    print()
    print("Summary at epsilon = 1: median NICV (median cost ratio)")
    print(summary_table(rows, datasets, 1.0))
    print()
    print(bc.PUBLIC_BOUNDS_NOTE)
    print(f"Wrote {csv_path}, {md_path}, {len(plots)} plots in {out_dir} ({wall:.0f} s).")


if __name__ == "__main__":
    main()
