#!/usr/bin/env bash
# `switchyard prep` beside Debian's spm_encode: MB/s per core on one generated corpus (the
# same SentencePiece model, prep on N threads vs N spm_encode processes on 1/N of the file
# each), and prep's peak memory at several input sizes. Prints the tables and writes
# $OUT/prep.json. See scripts/bench_prep.py for the method.
#
#   bash scripts/bench_prep.sh                    # 1 GB throughput; memory at 0.2, 1, 2 GB
#   THROUGHPUT=2e7 SIZES=5e6,2e7 bash scripts/bench_prep.sh     # small, a few minutes
#
# Needs about 3x the largest size in free disk under WORK (default: a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-runs/bench}
args=(--switchyard "${SWITCHYARD:-$BUILD/bin/switchyard}" --throughput-size "${THROUGHPUT:-1e9}"
      --sizes "${SIZES:-2e8,1e9,2e9}" --threads "${THREADS:-$(nproc)}" --vocab "${VOCAB:-8000}"
      --json "$OUT/prep.json")
[[ -n "${WORK:-}" ]] && args+=(--work "$WORK")
command -v spm_encode >/dev/null || { echo "bench_prep: spm_encode missing (bash scripts/setup.sh)"; exit 1; }
exec /usr/bin/python3 scripts/bench_prep.py "${args[@]}"
