"""spark-submit entry point: the same arguments as ``dpspark run``.

    spark-submit --packages io.delta:delta-spark_4.2_2.13:4.4.0 \
        --py-files dist/dpspark-0.1.0-py3-none-any.whl \
        jobs/cluster.py --config conf/prod.yaml [--set KEY=VALUE ...] [--run-id ID]
"""

import sys

from dpspark.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
