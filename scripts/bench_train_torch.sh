#!/usr/bin/env bash
# Training throughput, `switchyard train` beside the same model in eager PyTorch
# (benchmarks/reference/train_torch.py), one rank, same start checkpoint, same batches:
# first a loss check (the two must agree to RTOL over CHECK_STEPS steps, or nothing is
# timed), then ROUNDS alternating rounds of every thread setting of both sides; prints
# tokens/s median (min-max) per side at its best setting (named) and the ratio of the
# medians; writes $OUT/train_torch.json (every setting's runs and the check included).
#
#   bash scripts/bench_train_torch.sh                     # tiny configs + switch-medium
#   CONFIGS=configs/switch-tiny.yaml ROUNDS=5 STEPS=20 bash scripts/bench_train_torch.sh
#   CHECK_ONLY=1 bash scripts/bench_train_torch.sh        # the loss check alone
#
# CONFIGS: config files (default configs/*-tiny.yaml and configs/switch-medium.yaml).
# ROUNDS: alternating rounds. STEPS, WARMUP: timed and untimed steps of each run.
# CHECK_STEPS, RTOL: the loss check. TORCH_SETTINGS, OURS_SETTINGS: comma-separated
# setting names of benchmarks/reference/side_by_side.py (default: all; see
# scripts/bench_moe_layer.sh). DATA: token shards (default data/fortunes, made with
# `switchyard prep` when missing). Installs python3-torch with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
SWITCHYARD=${SWITCHYARD:-$BUILD/bin/switchyard}
BATCHES=${BATCHES:-$BUILD/bin/train_batches}
OUT=${OUT:-runs/bench}
DATA=${DATA:-data/fortunes}
CONFIGS=${CONFIGS:-"$(ls configs/*-tiny.yaml 2>/dev/null | tr '\n' ' ')configs/switch-medium.yaml"}
PY=/usr/bin/python3

for bin in "$SWITCHYARD" "$BATCHES"; do
  if [ ! -x "$bin" ]; then
    echo "bench_train_torch: $bin not found; build it: cmake --build $BUILD --target switchyard train_batches" >&2
    exit 1
  fi
done
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "bench_train_torch: installing python3-torch (Debian) for the reference" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y --no-install-recommends python3-torch >&2
fi
if [ ! -f "$DATA/index.json" ]; then
  echo "bench_train_torch: preparing $DATA (switchyard prep)" >&2
  "$SWITCHYARD" prep --out "$DATA" >&2
fi
mkdir -p "$OUT"
check_only=()
if [ -n "${CHECK_ONLY:-}" ]; then check_only=(--check_only); fi
exec "$PY" benchmarks/reference/compare_train.py --switchyard "$SWITCHYARD" \
  --train_batches "$BATCHES" --data "$DATA" --out "$OUT" --configs "$CONFIGS" \
  --rounds "${ROUNDS:-3}" --steps "${STEPS:-10}" --warmup "${WARMUP:-2}" \
  --check_steps "${CHECK_STEPS:-3}" --rtol "${RTOL:-1e-4}" "${check_only[@]}" \
  --torch_settings "${TORCH_SETTINGS:-all}" --ours_settings "${OURS_SETTINGS:-all}" \
  --gemm_perf "$(dirname "$SWITCHYARD")/gemm_perf"
