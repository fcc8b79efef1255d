"""spark-submit entry point: the same arguments as ``dpspark run``.

    spark-submit --master "$MASTER" --packages io.delta:delta-spark_4.2_2.13:4.4.0 \
        --py-files dist/dpspark-0.1.0.zip \
        jobs/cluster.py --config conf/prod.yaml [--set KEY=VALUE ...] [--run-id ID]

``dist/dpspark-0.1.0.zip`` is the wheel under a .zip name (executors put only .zip/.egg/.jar
files from --py-files on sys.path). README "On a cluster with spark-submit" has the exact
commands ``tests/test_cluster.py`` runs on a standalone cluster.
"""

import sys

from dpspark.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
