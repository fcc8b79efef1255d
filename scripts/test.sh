#!/usr/bin/env bash
# Run the test suite (sets the machine up first). .ci/run calls this: every test.
#   ./scripts/test.sh --quick   the quick tier, after every change: every test but the slow tier
#                               (tests/conftest.py SLOW: JVM processes of their own, README blocks,
#                               fuzzers, benchmarks), still every face once and every privacy test.
# Other arguments go to pytest (e.g. tests/test_ledger.py, -k charge).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
if [[ "${1:-}" == "--quick" ]]; then
  shift
  tier=(-m "not slow")
fi
./scripts/setup.sh
export DPSPARK_IVY_DIR="${DPSPARK_IVY_DIR:-$(pwd)/.cache/ivy}"
# Two workers (pytest-xdist), each with its own shared local SparkSession; a test file stays on one
# worker (--dist loadfile: its module fixtures, e.g. the one standalone cluster, start once). A
# serial run of the suite leaves about 40% of the 2 cores idle (small Spark jobs wait on the driver
# and on JVM starts), which the second worker uses. DPSPARK_TEST_WORKERS=0 runs it serially.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 \
  -n "${DPSPARK_TEST_WORKERS:-2}" --dist loadfile "${tier[@]}" "$@"
