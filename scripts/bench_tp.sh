#!/usr/bin/env bash
# Tensor-parallel training on this machine, tp = 1, 2, 4 at the same global batch
# (benchmarks/tp_comm_perf): step time, tokens/s, and the tp communicator's bytes per step
# beside the analytic volume, with sequence parallelism on and off. JSON per run under
# out/bench_tp/. Usage: bash scripts/bench_tp.sh [CONFIG] [extra tp_comm_perf flags]
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/switch-tiny.yaml}"
shift || true
bin=build/bin/tp_comm_perf
[[ -x $bin ]] || { echo "bench_tp: $bin is missing; run bash scripts/setup.sh" >&2; exit 2; }
mkdir -p out/bench_tp
for sp in on off; do
  flags=()
  [[ $sp == off ]] && flags+=(--no_sp)
  for tp in 1 2 4; do
    echo "=== tp $tp, sequence parallel $sp"
    bash scripts/mpirun_test.sh "$tp" "$bin" --config "$config" --steps 8 "${flags[@]}" \
      --json "out/bench_tp/tp${tp}_sp_${sp}.json" "$@"
  done
done
