#!/usr/bin/env bash
# ZeRO stages 0-3 (benchmarks/zero_perf): step time, the bytes each rank holds (the
# allocator's ledger) beside the dry-run's prediction, the peak (model states + workspace)
# beside the dry-run's and the ZeRO paper's formula, and the data-parallel bytes sent beside
# the paper's volume. Gradients accumulate in place (train.ordered_grad_accum false).
#   switch-tiny widened (d_model 256, d_ff and d_expert 1024, seq_len 16, micro-batch 1)
#     at dp 4, 1 and 2 micro-batches: the issue's bounds, stage s+1 <= 0.85 / 0.90 / 0.85
#     x stage s (tests/dist/zero_memory_test.cc asserts them);
#   switch-wide (d_model 256, 16 experts of 512, micro-batch 4) at dp 8, ep 2.
# JSON per run under out/bench_zero/.
# Usage: bash scripts/bench_zero.sh [extra zero_perf flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/zero_perf
[[ -x $bin ]] || { echo "bench_zero: $bin is missing; run bash scripts/setup.sh" >&2; exit 2; }
mkdir -p out/bench_zero
widened="model.d_model=256,model.d_ff=1024,moe.d_expert=1024,model.seq_len=16"
widened+=",train.micro_batch_size=1"
for accum in 1 2; do
  echo "=== switch-tiny widened, dp 4, grad_accum $accum"
  bash scripts/mpirun_test.sh 4 "$bin" --config configs/switch-tiny.yaml --steps 2 \
    --grad_accum "$accum" --set "$widened" --json "out/bench_zero/widened_dp4_a${accum}.json" "$@"
done
wide="model.d_model=256,model.d_ff=1024,model.n_heads=8,moe.d_expert=512,moe.num_experts=16"
wide+=",train.micro_batch_size=4"
echo "=== switch-wide, dp 8 (ep 2)"
bash scripts/mpirun_test.sh 8 "$bin" --config configs/switch-tiny.yaml --steps 4 --ep 2 \
  --set "$wide" --json "out/bench_zero/switch-wide_dp8.json" "$@"
