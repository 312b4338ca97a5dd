#!/usr/bin/env bash
# Pipeline parallelism (benchmarks/pipeline_perf) on switch-tiny with 8 micro-batches per
# step: gpipe and 1f1b at pp 2 (2 ranks), pp 4 and pp 2 x dp 2 (4 ranks). Per pipeline
# rank: the measured bubble (median, min, max over the steps) beside the schedule simulated
# with the stages' measured times and the analytic (p-1)/(m+p-1); the workspace peak beside
# the dry-run; the p2p bytes beside the analytic volume. Then the same with the shared-
# memory transport's eager limit above one activation message (128 KiB): OpenMPI moves a
# larger posted send only while its sender is inside MPI, which GPipe's runs of forwards
# (and backwards) without a recv leave idle. JSON per run under out/bench_pipeline/.
# On a 2-core machine the 4-rank runs are oversubscribed: their bubbles are mostly noise.
# Usage: bash scripts/bench_pipeline.sh [extra pipeline_perf flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/pipeline_perf
[[ -x $bin ]] || { echo "bench_pipeline: $bin is missing; run bash scripts/setup.sh" >&2; exit 2; }
mkdir -p out/bench_pipeline
for transport in default eager; do
  for np in 2 4; do
    echo "=== $np ranks, $transport sends"
    if [[ $transport == eager ]]; then
      export OMPI_MCA_btl_vader_eager_limit=200000 OMPI_MCA_btl_vader_max_send_size=200000
    fi
    bash scripts/mpirun_test.sh "$np" "$bin" --config configs/switch-tiny.yaml --steps 5 \
      --grad_accum 8 --json "out/bench_pipeline/np${np}_${transport}.json" "$@"
  done
done
