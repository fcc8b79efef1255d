#!/usr/bin/env bash
# Run the main job in local mode on a small demo Delta table (sets the machine up first).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export DPSPARK_IVY_DIR="${DPSPARK_IVY_DIR:-$(pwd)/.cache/ivy}"
rm -rf out/demo
.venv/bin/python scripts/make_demo_table.py data/demo_points
# The ledger owns each input's budget: its administrator sets the cap before any run is charged.
.venv/bin/dpspark ledger set-budget --ledger out/demo/ledger --input data/demo_points --epsilon 10 --delta 1e-5
.venv/bin/dpspark run --config conf/demo.yaml "$@"
echo
echo "demo: outputs are under $(pwd)/out/demo (centers/ and runs/ are Delta tables; open report.png)"
echo "demo: what the input has spent: .venv/bin/dpspark ledger show --ledger out/demo/ledger"
