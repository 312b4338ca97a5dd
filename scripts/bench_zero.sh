#!/usr/bin/env bash
# ZeRO stages 0-3 at dp = 2, 4, 8 with ep 2 (benchmarks/zero_perf): step time, the bytes
# each rank holds beside the dry-run's prediction, and the data-parallel bytes sent beside
# the ZeRO paper's volume. Two models: switch-tiny as it is, and a wider one that still
# fits this machine at dp 8 (d_model 256, 16 experts of 512: about 6M parameters). JSON
# per run under out/bench_zero/.
# Usage: bash scripts/bench_zero.sh [extra zero_perf flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/zero_perf
[[ -x $bin ]] || { echo "bench_zero: $bin is missing; run bash scripts/setup.sh" >&2; exit 2; }
mkdir -p out/bench_zero
wide="model.d_model=256,model.d_ff=1024,model.n_heads=8,moe.d_expert=512,moe.num_experts=16"
wide+=",train.micro_batch_size=4"
for model in switch-tiny switch-wide; do
  sets=()
  [[ $model == switch-wide ]] && sets=(--set "$wide")
  for dp in 2 4 8; do
    echo "=== $model, dp $dp (ep 2)"
    bash scripts/mpirun_test.sh "$dp" "$bin" --config configs/switch-tiny.yaml --steps 4 --ep 2 \
      "${sets[@]}" --json "out/bench_zero/${model}_dp${dp}.json" "$@"
  done
done
