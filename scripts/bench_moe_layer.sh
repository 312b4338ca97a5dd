#!/usr/bin/env bash
# One MoE layer, forward + backward, ours (build/bin/moe_layer_perf, one rank) beside the
# plain-PyTorch reference (benchmarks/reference/moe_layer_torch.py) at the same shapes,
# fairly: each side runs under every thread setting its users would try, all of them in
# alternation for ROUNDS rounds (benchmarks/reference/side_by_side.py); the table gives each
# side's best setting by name with the median and min-max of its rounds, and the ratio of
# the medians. Writes $OUT/moe_layer.json (every setting's runs included).
#
#   bash scripts/bench_moe_layer.sh                       # the default shapes, 5 rounds
#   SHAPES="4096,512,1024,8,2,gelu,1.25" ROUNDS=3 ITERS=20 bash scripts/bench_moe_layer.sh
#   TORCH_SETTINGS=torch1-blas2,torch2-blas2-passive OURS_SETTINGS=blas2 bash scripts/bench_moe_layer.sh
#
# SHAPES: space-separated "tokens,d,f,E,k,activation,capacity" entries. ROUNDS: alternating
# rounds. ITERS, WARMUP: timed and untimed iterations of each run. TORCH_SETTINGS,
# OURS_SETTINGS: comma-separated names from side_by_side.py (default: all of them).
# REUSE=1 keeps the runs already in $OUT/moe_layer (continues an interrupted comparison).
# The settings:
#   torch: torch{1,2}-blas{1,2} (torch.set_num_threads x OPENBLAS_NUM_THREADS), and
#          torch2-blas{1,2}-passive (the same with OMP_WAIT_POLICY=PASSIVE)
#   ours:  blas1, blas2 (OpenBLAS threads), blas2-passive
# Installs Debian's python3-torch with apt-get when /usr/bin/python3 cannot import torch.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
OUT=${OUT:-runs/bench}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-2}
SHAPES=${SHAPES:-"2048,512,1024,8,2,gelu,1.25 2048,512,1024,8,2,swiglu,1.25 4096,256,512,16,1,gelu,1.25"}
PY=/usr/bin/python3
BIN=$BUILD/bin/moe_layer_perf

if [ ! -x "$BIN" ]; then
  echo "bench_moe_layer: $BIN not found; build it: cmake --build $BUILD --target moe_layer_perf" >&2
  exit 1
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "bench_moe_layer: installing python3-torch (Debian) for the reference" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y --no-install-recommends python3-torch >&2
fi
mkdir -p "$OUT"
exec "$PY" benchmarks/reference/compare_moe_layer.py --bin "$BIN" --out "$OUT" --shapes "$SHAPES" \
  --rounds "$ROUNDS" --iters "$ITERS" --warmup "$WARMUP" \
  --torch_settings "${TORCH_SETTINGS:-all}" --ours_settings "${OURS_SETTINGS:-all}" \
  ${REUSE:+--reuse}
