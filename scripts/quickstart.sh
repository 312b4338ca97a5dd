#!/usr/bin/env bash
# The README's first command: set up, prepare the default corpus, and train the tiny
# Switch-style model on the CPU, ending with the load-balance summary and the
# routing-by-language table.
#   1. scripts/setup.sh: Debian packages (fortunes in several languages included), build;
#   2. switchyard prep: a SentencePiece BPE tokenizer and token shards in data/fortunes
#      (skipped when data/fortunes already holds them);
#   3. switchyard train --config configs/switch-tiny.yaml: about a minute on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -f data/fortunes/index.json ]; then
  build/bin/switchyard prep --out data/fortunes --vocab 2000
fi
build/bin/switchyard train --config configs/switch-tiny.yaml --out runs/switch-tiny "$@"
