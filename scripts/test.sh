#!/usr/bin/env bash
# Run the whole test suite (sets the machine up first). .ci/run calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export DPSPARK_IVY_DIR="${DPSPARK_IVY_DIR:-$(pwd)/.cache/ivy}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
