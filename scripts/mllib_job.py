#!/usr/bin/env python
"""A plain PySpark job: Spark MLlib KMeans on a Delta table, centers written out (the baseline of issue 15).

What a Spark user writes without dpspark, run as its own process (fresh JVM), so that
``scripts/bench_scale.py --whole`` can time it start to exit next to ``dpspark run``:

    read the table -> VectorAssembler -> pyspark.ml.clustering.KMeans(k, maxIter=20, tol=0).fit
    -> the centers written as a table (Delta by default) under --out, and --out/result.json

    .venv/bin/python scripts/mllib_job.py --input /tmp/points --k 10 --out /tmp/mllib_out
    .venv/bin/python scripts/mllib_job.py --input data/demo_points --features x,y --k 5 --out /tmp/demo_mllib

Spark settings are those of ``dpspark run`` on one machine: master ``local[2]`` unless --master,
the Delta extension and catalog, the Delta JARs from the same Ivy cache (no resolution at start-up),
dpspark's local defaults (``spark.driver.memory`` from $DPSPARK_DRIVER_MEMORY, default 4g; 8 shuffle
partitions, ...), then every ``--conf KEY=VALUE``. Only these constants are taken from
``dpspark.session``; the job itself is MLlib and nothing else (it is not private: a baseline).

MLlib persists the assembled vectors itself during the fit (its input is not cached), as a user's
job would leave it. ``result.json`` holds the centers, MLlib's iteration count and training cost,
and the wall time of each step inside the process (session start, schema, fit including the read, write,
stop), also logged on stderr in dpspark's step-line format ("[mllib_job] 12:00:01 fit done in 3.20s").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

T_START = time.perf_counter()

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def spark_settings(master: str, extra: dict) -> dict:
    """The session's settings: dpspark's local ones (the same JARs, defaults and Delta configuration)."""
    from dpspark.session import DELTA_CONF, DELTA_PACKAGE, LOCAL_DEFAULTS, PLAN_CONF, cached_delta_jars, ivy_dir

    conf = {"spark.master": master, **DELTA_CONF, **PLAN_CONF}
    jars = cached_delta_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:  # not fetched yet: Ivy resolves them at start-up (slow the first time)
        conf["spark.jars.packages"] = DELTA_PACKAGE
        conf["spark.jars.ivy"] = ivy_dir()
    conf.update(LOCAL_DEFAULTS)
    conf.update(extra)
    return conf


def parse_conf(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"mllib_job: --conf expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help="the table's path")
    ap.add_argument("--input-format", default="delta", choices=("delta", "parquet"))
    ap.add_argument("--features", default=None, help="comma-separated feature columns (default: every numeric column)")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--tol", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="output directory: centers table and result.json")
    ap.add_argument("--format", default="delta", choices=("delta", "parquet", "json"),
                    help="format of the centers table under --out/centers (default delta, like dpspark's centers/)")
    ap.add_argument("--master", default=os.environ.get("DPSPARK_MASTER", "local[2]"))
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Local Python workers would run this interpreter (this job starts none: MLlib runs in the JVM).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    timings = {"python start and imports": time.perf_counter() - T_START}

    @contextlib.contextmanager
    def step(name: str):
        """dpspark's log line format ("<step> ..." then "<step> done in 1.23s"), which bench_scale times."""
        print(f"[mllib_job] {time.strftime('%H:%M:%S')} {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
        finally:
            timings[name] = time.perf_counter() - start
            print(f"[mllib_job] {time.strftime('%H:%M:%S')} {name} done in {timings[name]:.2f}s", file=sys.stderr, flush=True)

    with step("start Spark session"):
        from pyspark.ml.clustering import KMeans
        from pyspark.ml.feature import VectorAssembler
        from pyspark.sql import SparkSession
        from pyspark.sql.types import NumericType

        builder = SparkSession.builder.appName("mllib-kmeans")
        for key, value in spark_settings(args.master, parse_conf(args.conf)).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel(os.environ.get("DPSPARK_SPARK_LOG_LEVEL", "WARN"))
    try:
        with step("read input table (schema)"):
            df = spark.read.format(args.input_format).load(args.input)
            if args.features:
                features = [c.strip() for c in args.features.split(",") if c.strip()]
            else:
                features = [f.name for f in df.schema.fields if isinstance(f.dataType, NumericType)]
            vectors = VectorAssembler(inputCols=features, outputCol="features").transform(df).select("features")
        with step("fit"):  # reads the table: MLlib persists the assembled vectors for its passes
            model = KMeans(k=args.k, maxIter=args.max_iter, tol=args.tol, seed=args.seed).fit(vectors)
        with step("write centers table"):
            centers = [[float(v) for v in c] for c in model.clusterCenters()]
            summary = model.summary
            rows = [(i, *c) for i, c in enumerate(centers)]
            table = spark.createDataFrame(rows, ["cluster_id", *features]).coalesce(1)
            table.write.mode("overwrite").format(args.format).save(str(out / "centers"))
        result = {"k": args.k, "features": features, "max_iter": args.max_iter, "tol": args.tol, "seed": args.seed,
                  "iterations": int(summary.numIter), "training_cost": float(summary.trainingCost),
                  "centers": centers, "centers_path": str(out / "centers"), "format": args.format,
                  "master": args.master, "driver_memory": spark.sparkContext.getConf().get("spark.driver.memory", "?")}
    finally:
        with step("stop Spark session"):
            spark.stop()
    result["timings"] = {k: round(v, 3) for k, v in timings.items()}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"mllib_job: k={args.k}, {result['iterations']} iterations, fit {timings['fit']:.1f} s, "
          f"{time.perf_counter() - T_START:.1f} s in the process", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
