#!/usr/bin/env bash
# ZeRO stages 0-3 at dp = 2, 4, 8 (benchmarks/zero_perf): step time, the bytes each rank
# holds beside the dry-run's prediction, and the data-parallel bytes sent beside the ZeRO
# paper's volume. JSON per run under out/bench_zero/.
# Usage: bash scripts/bench_zero.sh [CONFIG] [extra zero_perf flags]
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/switch-tiny.yaml}"
shift || true
bin=build/bin/zero_perf
[[ -x $bin ]] || { echo "bench_zero: $bin is missing; run bash scripts/setup.sh" >&2; exit 2; }
mkdir -p out/bench_zero
name=$(basename "$config" .yaml)
for dp in 2 4 8; do
  echo "=== $name, dp $dp (ep 2)"
  bash scripts/mpirun_test.sh "$dp" "$bin" --config "$config" --steps 4 --ep 2 \
    --json "out/bench_zero/${name}_dp${dp}.json" "$@"
done
