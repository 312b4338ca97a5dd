#!/usr/bin/env bash
# The README's first command: set up, prepare the default corpus, and train the tiny
# Switch-style model on the CPU, ending with the load-balance summary and the
# routing-by-language table.
#   1. scripts/setup.sh --quick: only the Debian packages the main job needs (fortunes in
#      several languages included) and only the `switchyard` target (no tests, no benchmarks;
#      the CUDA backend only when a GPU is visible or SWITCHYARD_CUDA=ON);
#   2. switchyard prep: a SentencePiece BPE tokenizer and token shards in data/fortunes
#      (skipped when data/fortunes already holds them);
#   3. switchyard train --config configs/switch-tiny.yaml: about a minute on two cores, into
#      runs/switch-tiny. Run again, it trains afresh: a previous run there is first moved
#      aside to runs/switch-tiny.<date-time> (nothing is deleted; `train` refuses to write
#      into a previous run's directory). Extra arguments go to `train`; with your own --out
#      (or --resume) nothing is moved.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --quick
bin=${SWITCHYARD_BUILD_DIR:-build}/bin
if [ ! -f data/fortunes/index.json ]; then
  "$bin/switchyard" prep --out data/fortunes --vocab 2000
fi
out=(--out runs/switch-tiny)
for arg in "$@"; do
  case "$arg" in --out|--out=*|--resume|--resume=*) out=() ;; esac
done
if [ ${#out[@]} -gt 0 ] && [ -n "$(ls -A runs/switch-tiny 2>/dev/null)" ]; then
  aside="runs/switch-tiny.$(date +%Y%m%d-%H%M%S)"
  mv runs/switch-tiny "$aside"
  echo "quickstart: moved the previous run in runs/switch-tiny to $aside"
fi
"$bin/switchyard" train --config configs/switch-tiny.yaml "${out[@]}" "$@"
