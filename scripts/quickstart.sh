#!/usr/bin/env bash
# The README's first command: set up, prepare the default corpus, and train the tiny
# Switch-style model on the CPU, ending with the load-balance summary and the
# routing-by-language table.
#   1. scripts/setup.sh --quick: only the Debian packages the main job needs (fortunes in
#      several languages included) and only the `switchyard` target (no tests, no benchmarks;
#      the CUDA backend only when a GPU is visible or SWITCHYARD_CUDA=ON);
#   2. switchyard prep: a SentencePiece BPE tokenizer and token shards in data/fortunes
#      (skipped when data/fortunes already holds them);
#   3. switchyard train --config configs/switch-tiny.yaml: about a minute on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --quick
bin=${SWITCHYARD_BUILD_DIR:-build}/bin
if [ ! -f data/fortunes/index.json ]; then
  "$bin/switchyard" prep --out data/fortunes --vocab 2000
fi
"$bin/switchyard" train --config configs/switch-tiny.yaml --out runs/switch-tiny "$@"
