#!/usr/bin/env python
"""The private-candidate cell pass of maxcover (issue 28): one pass (``direct``) against hash-first (``hash``).

A benchmark script, not a test. Per (n, d): the mixture table of ``bench_scale`` (k = 10 Gaussian
components in the box [-10, 10]^d, written once as a Delta table under ``--data``), read through
``tables.prepare_points`` as a fit reads it, persisted and materialized once; then
``passes.cell_aggregates`` at the 5 default scales (``candidates.scale_sides(5)``, shifts from a
seeded public rng, ``min_count = MIN_CELL_COUNT``) with ``method="direct"`` and ``method="hash"``,
alternated ``--reps`` times in one local[2] session. Each run's result is checked equal, array for
array, to the first ``direct`` result (the script exits 1 otherwise). Writes a Markdown table.

    .venv/bin/python scripts/bench_cell_pass.py --n 1e6 --d 10 50          # about 10 minutes
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as bc  # noqa: E402
import bench_harness as bh  # noqa: E402
import bench_scale as bs  # noqa: E402


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb)) and len(a) == len(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", nargs="+", type=float, default=[1e6])
    ap.add_argument("--d", nargs="+", type=int, default=[10, 50])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--data", type=Path, default=Path("/tmp/dpspark_bench_cell_pass"))
    ap.add_argument("--out", type=Path, default=bh.ROOT / "bench" / "results" / "maxcover" / "cell_pass.md")
    args = ap.parse_args(argv)
    from dpspark import tables
    from dpspark.maxcover import candidates as cand_mod
    from dpspark.maxcover import passes

    rows = []
    ok = True
    with bh.session("dpspark", testing=False) as spark:  # build_session's defaults: the web UI on
        for n in [int(v) for v in args.n]:
            for d in args.d:
                path = args.data / f"mixture_{n}_{d}"
                if not (path / "_delta_log").is_dir():
                    bs.make_table(spark, str(path), n, d, 2024, 4)
                dom = bc.domain([-bs.BOX] * d, [bs.BOX] * d)
                df = spark.read.format("delta").load(str(path))
                unit, _ = tables.prepare_points(df, tuple(f"x{j}" for j in range(d)), None, dom, "bench")
                cols = tables.unit_columns(d)
                cached = unit.persist()
                cached.count()
                sides = cand_mod.scale_sides(5)
                rng = np.random.default_rng([7, d])
                shifts = [rng.uniform(0.0, s, size=d) for s in sides]
                times: dict[str, list[float]] = {"direct": [], "hash": []}
                reference = cells = None
                for _ in range(args.reps):
                    for method in ("direct", "hash"):
                        out, secs = bh.timed(lambda: passes.cell_aggregates(
                            cached, cols, sides, shifts, min_count=cand_mod.MIN_CELL_COUNT, method=method))
                        times[method].append(secs)
                        if reference is None:
                            reference, cells = out, [len(c[1]) for c in out]
                        elif not same(reference, out):
                            ok = False
                            print(f"n={n} d={d} {method}: the result differs from the direct pass", file=sys.stderr)
                cached.unpersist()
                med = {m: statistics.median(v) for m, v in times.items()}
                rows.append((n, d, med["direct"], med["hash"], med["direct"] / med["hash"], cells,
                             " / ".join(f"{a:.1f}, {b:.1f}" for a, b in zip(times["direct"], times["hash"]))))
                print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# maxcover's private-candidate cell pass: one pass (direct) vs hash-first (hash)",
        "",
        f"Command: `python scripts/bench_cell_pass.py --n {' '.join(f'{v:g}' for v in args.n)} "
        f"--d {' '.join(map(str, args.d))} --reps {args.reps}`. Machine: {os.cpu_count()} CPUs "
        f"({platform.machine()}), Spark local[2], 4 shuffle partitions, {time.strftime('%Y-%m-%d')}. "
        "Both methods on the same persisted points (mixture table of bench_scale, through prepare_points), "
        "5 scales, min_count 2, alternated; every result equal to the first direct one, array for array.",
        "",
        bh.markdown_table(["n", "d", "direct (s, median)", "hash (s, median)", "speed-up", "cells kept per scale",
                           "runs (direct, hash)"],
                          [[f"{n:.0e}", d, f"{a:.1f}", f"{b:.1f}", f"{r:.2f}x", " ".join(map(str, cells)), runs]
                           for n, d, a, b, r, cells, runs in rows], ["r"] * 5 + ["l", "l"]),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
