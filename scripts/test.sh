#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: unit, dist (mpirun with 2, 4 and 8 ranks)
# and gpu (skipped with a printed reason where no GPU is visible).
# Pass ctest arguments through, e.g. `bash scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${SWITCHYARD_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
