"""One driver of the ledger race in tests/test_object_store.py: a separate process with its own JVM
(or, with ``--remote``, a Spark Connect client of tests/test_connect.py's server: no JVM of its own).

For each ledger given (one per round) it says it is ready (a file ``ready-<round>-<name>`` in
``--sync``), waits for ``go-<round>``, then charges epsilon 1 and prints one JSON line:
``{"round": r, "name": ..., "result": "charged" | "refused" | "error"}``.

``s3a://`` ledgers commit with dpspark's log store (the session's default). ``s3://`` names the same
bucket through the same S3A connector (``fs.s3.impl``), where Delta's own S3 store commits (its
default for that scheme): the unsafe store, in the same JVM. dpspark refuses to charge a ledger there
unless the deployment says one driver writes it, so the driver says so for those rounds only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ledgers", required=True)
    parser.add_argument("--sync", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--remote", default=None, help="a Spark Connect server (sc://...): a thin client, no JVM")
    args = parser.parse_args()

    from dpspark.errors import BudgetRefused
    from dpspark.privacy.ledger import SINGLE_WRITER_ENV, Ledger
    from dpspark.session import build_session

    conf = {"spark.hadoop.fs.s3a.endpoint": args.endpoint, "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false", "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.sql.shuffle.partitions": "1", "spark.default.parallelism": "1"}
    if args.remote:  # the server has its own store settings: tests/test_connect.py
        os.environ["DPSPARK_REMOTE"] = args.remote
        spark = build_session(app_name=f"race-{args.name}")
    else:
        spark = build_session(master="local[1]", app_name=f"race-{args.name}", conf=conf, testing=True,
                              object_store=True, small_job=True)
    ledgers = [Ledger(spark, path) for path in args.ledgers.split(",")]
    for ledger in ledgers:  # warm: the JVM, the S3 client, each ledger's snapshot
        ledger.totals(args.key)
    for round_no, ledger in enumerate(ledgers):
        open(os.path.join(args.sync, f"ready-{round_no}-{args.name}"), "w").close()
        go = os.path.join(args.sync, f"go-{round_no}")
        deadline = time.monotonic() + 600
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                print("no go signal", file=sys.stderr)
                return 1
            time.sleep(0.01)
        started = time.monotonic()
        if ledger.path.startswith("s3://"):
            os.environ[SINGLE_WRITER_ENV] = "1"
        else:
            os.environ.pop(SINGLE_WRITER_ENV, None)
        try:
            ledger.charge(args.key, f"{args.name}-{round_no}", "dplloyd", 1.0, 0.0)
            result = "charged"
        except BudgetRefused:
            result = "refused"
        except Exception as exc:  # with Delta's S3 store, a lost commit can leave a log this driver cannot read
            print(f"round {round_no}: {type(exc).__name__}: {str(exc)[:2000]}", file=sys.stderr)
            result = "error"
        print(json.dumps({"round": round_no, "name": args.name, "result": result,
                          "seconds": round(time.monotonic() - started, 2)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
