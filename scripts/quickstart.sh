#!/usr/bin/env bash
# The README's first command: set up, then run the main job. Until training lands this
# prints the 5D process mesh of a 16-rank Megatron-style layout (tp=2, pp=4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build/bin/switchyard mesh --world 16 --tp 2 --pp 4
