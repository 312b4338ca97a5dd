#!/usr/bin/env bash
# The GPU benchmark in one command, on the GPU machine, from the pack scripts/gpu_build.sh
# made (build-gpu/: no configure, no compile), in under 6 minutes (8 with the kernel profile):
#   `switchyard train` on CUDA (bf16 products, bf16 activation storage, as autocast keeps its
#   activations) beside the strong PyTorch reference
#   (benchmarks/reference/train_torch_gpu.py: SDPA flash attention, experts by
#   torch._grouped_mm, bf16 autocast, fused AdamW, torch.compile where it compiles) on the same
#   config and the same batches of the pack's fortune corpus, for
#     switch-medium at micro-batch 64, and
#     configs/gpu-d1024-e16.yaml (d 1024, 4 layers, 16 experts top-1 every other layer,
#     d_ff 4096, seq 512) at micro-batch 16 and 64, capacity 1.25 and dropless;
#   rounds alternate the sides; per side tokens/s (median of the timed steps, min-max), MFU,
#   the dropped fraction and the step-0 loss; ours' per-phase times from `--profile`'s
#   profile.json (whatever it holds); the planner's step (`switchyard plan --gpu h200`) beside
#   the measured one; with plan_calibrate_gpu in the pack, a calibration of this GPU first
#   (device kernels: GEMM, copy, attention, per-operation cost; written as gpu-calibrated.yaml)
#   and the plan with that file (`switchyard plan --gpus 1 --gpu FILE`) beside.
# Writes OUT_DIR (default gpu-bench/): gpu_bench.json, gpu_bench.txt (the table) and the logs,
# and, when $OUT is set (the device tool), copies the table, the JSON and one archive of
# everything (gpu_bench.tar.gz) there: only 8 files come back.
#
#   bash scripts/gpu_build.sh                        # here
#   run(command="bash scripts/gpu_bench.sh", carry=["build-gpu"], timeout_s=540)
#
# CASES (comma-separated names, see benchmarks/reference/gpu_bench.py), ROUNDS (2), STEPS (15
# timed steps per side per round), WARMUP (5), COMPILE (1), BUDGET_S (240: seconds from the
# start after which no case starts; the cases run in gpu_bench.py's order: the targets'
# cases and the expert-product choices first), HARDWARE (h200), CALIBRATE (1: run
# plan_calibrate_gpu when the pack has it),
# KERNELS (1: the per-kernel GPU time of KERNEL_STEPS (3) steps under ncu at the end,
# kernel_profile.txt; KERNEL_TIMEOUT 120 s; not started after KERNEL_BY_S, 330 s from the
# start), KERNEL_DETAIL (1: Nsight Compute's sections for the grouped GEMM and flash launches
# of one step, kernel_detail.txt; not started after KERNEL_DETAIL_BY_S, 420 s).
set -uo pipefail
started=$(date +%s)
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD_DIR:-build-gpu}
out_dir=${OUT_DIR:-$root/gpu-bench}
bin="$build/bin"
mkdir -p "$out_dir"

if [ -f "$build/PREBUILT" ]; then
  source scripts/gpu_libs.sh "$root" "$build"
fi
for b in switchyard train_batches; do
  [ -x "$bin/$b" ] || { echo "gpu_bench: $bin/$b not found: bash scripts/gpu_build.sh, carry $build"; exit 1; }
done
[ -z "${cuda_missing:-}" ] || { echo "gpu_bench: libraries not found: $cuda_missing"; exit 1; }
# The driver (gpu_bench.py) reads configs through docs/model_reference.py, which needs numpy.
python3 -c "import numpy" 2>/dev/null || {
  echo "gpu_bench: $(command -v python3) cannot import numpy, which the bench's driver needs ($(python3 -c 'import numpy' 2>&1 | tail -1)): put a python3 with numpy first on PATH"
  exit 1
}
# plan reads the hardware files from the source tree it was built in; point it at this copy.
export SWITCHYARD_HARDWARE_DIR="$root/configs/hardware"

data="$root/$build/data/fortunes"
[ -f "$data/index.json" ] || data="$root/data/fortunes"
if [ ! -f "$data/index.json" ]; then
  echo "gpu_bench: no prepared corpus in $build/data/fortunes: preparing one (switchyard prep)"
  "$bin/switchyard" prep --out "$data" --vocab 2000 >"$out_dir/prep.log" 2>&1 ||
    { echo "gpu_bench: prep failed: $(tail -2 "$out_dir/prep.log")"; exit 1; }
fi

python3 -c "import torch, numpy" 2>/dev/null ||
  echo "gpu_bench: python3 cannot import torch and numpy: the PyTorch reference will not run ($(python3 -c 'import torch, numpy' 2>&1 | tail -1))"
echo "== gpu_bench: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
calibration=()
if [ "${CALIBRATE:-1}" = 1 ] && [ -x "$bin/plan_calibrate_gpu" ]; then
  echo "== plan_calibrate_gpu (device kernels: GEMM, copy, attention, per-operation cost)"
  if timeout 90 "$bin/plan_calibrate_gpu" --out "$out_dir/gpu-calibrated.yaml" -n 10 -w 3 \
       --json "$out_dir/plan_calibrate.json" >"$out_dir/plan_calibrate.log" 2>&1; then
    calibration=(--calibration "$out_dir/gpu-calibrated.yaml")
    grep -E 'peak|bandwidth|efficiency' "$out_dir/gpu-calibrated.yaml" | head -12
  else
    echo "gpu_bench: plan_calibrate failed: $(tail -2 "$out_dir/plan_calibrate.log")"
  fi
fi

# Copies what is there so far to $OUT (the device tool), after each part: a run the tool's
# time limit kills still brings back the parts before.
publish() {
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    tar -czf "$OUT/gpu_bench.tar.gz" -C "$(dirname "$out_dir")" \
      --exclude='*.bin' --exclude='step-*' --exclude='*.ncu-rep' "$(basename "$out_dir")" 2>/dev/null
    for f in gpu_bench.txt gpu_bench.json gpu-calibrated.yaml kernel_profile.txt kernel_detail.txt; do
      [ -f "$out_dir/$f" ] && cp "$out_dir/$f" "$OUT/"
    done
  fi
  return 0
}

echo "== engine vs PyTorch reference"
python3 benchmarks/reference/gpu_bench.py --switchyard "$bin/switchyard" --train_batches "$bin/train_batches" \
  --data "$data" --out "$out_dir" --rounds "${ROUNDS:-2}" --steps "${STEPS:-15}" --warmup "${WARMUP:-5}" \
  --compile "${COMPILE:-1}" --budget_s "$(( ${BUDGET_S:-240} - ($(date +%s) - started) ))" --hardware "${HARDWARE:-h200}" \
  ${CASES:+--cases "$CASES"} "${calibration[@]}" 2>&1 | tee "$out_dir/gpu_bench.log"
rc=${PIPESTATUS[0]}
publish

# The run both Nsight Compute parts profile: the d 1024 model at micro-batch 16, dropless, the
# bench's settings, after KERNEL_SKIP (2) warm-up steps.
kskip=${KERNEL_SKIP:-2}
kernel_sets=()
for s in data.dir="$data" runtime.device=cuda runtime.precision=bf16 runtime.activation_dtype=bf16 \
         train.eval_every=0 train.eval_batches=0 train.checkpoint_every=0 train.grad_accum=1 \
         parallel.ep=1 train.micro_batch_size=16 moe.capacity_factor=0; do
  kernel_sets+=(--set "$s")
done

# Where the GPU time of a step goes, kernel by kernel: Nsight Compute times every launch of
# KERNEL_STEPS steps of the d 1024 model (micro-batch 16, dropless; the bench's settings),
# one launch at a time, and kernel_profile.py sums them by family and by kernel
# (kernel_profile.txt / .json). The run trains KERNEL_SKIP (2) steps more first, under
# --profile --profile-skip, whose first profiled step calls cudaProfilerStart: with
# --profile-from-start off, ncu records from there, so initialisation and warm-up are left
# out. KERNELS=0 leaves it out; it is skipped when ncu is missing.
if [ "${KERNELS:-1}" = 1 ] && command -v ncu >/dev/null &&
   [ $(( $(date +%s) - started )) -lt "${KERNEL_BY_S:-330}" ]; then
  echo "== kernel profile (ncu, ${KERNEL_STEPS:-3} steps after $kskip of configs/gpu-d1024-e16.yaml, micro-batch 16, dropless)"
  kp="$out_dir/kernels"
  rm -rf "$kp" && mkdir -p "$kp"
  if timeout "${KERNEL_TIMEOUT:-120}" ncu --clock-control none --cache-control none \
       --profile-from-start off --metrics gpu__time_duration.sum -o "$kp/kernels" -f \
       "$bin/switchyard" train --config configs/gpu-d1024-e16.yaml \
       --steps $((kskip + ${KERNEL_STEPS:-3})) --profile --profile-skip "$kskip" \
       --out "$kp/run" "${kernel_sets[@]}" >"$kp/train.log" 2>&1 &&
     ncu --import "$kp/kernels.ncu-rep" --csv --page raw >"$kp/kernels.csv" 2>"$kp/import.log"; then
    python3 benchmarks/reference/kernel_profile.py "$kp/kernels.csv" --steps "${KERNEL_STEPS:-3}" \
      --json "$out_dir/kernel_profile.json" | tee "$out_dir/kernel_profile.txt"
  else
    echo "gpu_bench: the kernel profile failed: $(tail -2 "$kp/train.log")"
  fi
  rm -f "$kp/kernels.ncu-rep"
fi
publish

# Why the two hand-written kernel families run at the speed they do: Nsight Compute's detail
# sections (speed of light, occupancy, launch, warp states, scheduler, compute and memory
# workloads, and the source lines where warps stall most) for every launch of the grouped expert
# GEMMs and flash attention in one step of the same run (micro-batch 16, dropless; about 24
# launches, each replayed for its sections), as text: kernel_detail.txt, which a session without
# a GPU reads. KERNEL_DETAIL=0 leaves it out; not started after KERNEL_DETAIL_BY_S (420 s).
if [ "${KERNEL_DETAIL:-1}" = 1 ] && command -v ncu >/dev/null &&
   [ $(( $(date +%s) - started )) -lt "${KERNEL_DETAIL_BY_S:-420}" ]; then
  echo "== kernel detail (ncu sections of the grouped GEMM and flash attention launches of one step)"
  kd="$out_dir/kernel_detail"
  rm -rf "$kd" && mkdir -p "$kd"
  sections=()
  for s in SpeedOfLight Occupancy LaunchStats WarpStateStats SchedulerStats ComputeWorkloadAnalysis \
           MemoryWorkloadAnalysis SourceCounters; do sections+=(--section "$s"); done
  if timeout "${KERNEL_DETAIL_TIMEOUT:-120}" ncu --profile-from-start off "${sections[@]}" \
       -k 'regex:Grouped(Gemm|WeightGrad)Kernel|Flash(Forward|BackwardKv|BackwardQ)Kernel' \
       --launch-count "${KERNEL_DETAIL_LAUNCHES:-30}" -o "$kd/detail" -f \
       "$bin/switchyard" train --config configs/gpu-d1024-e16.yaml --steps $((kskip + 1)) \
       --profile --profile-skip "$kskip" --out "$kd/run" "${kernel_sets[@]}" >"$kd/train.log" 2>&1 &&
     ncu --import "$kd/detail.ncu-rep" --page details --print-units base \
       >"$out_dir/kernel_detail.txt" 2>"$kd/import.log"; then
    echo "gpu_bench: $(grep -c ', Context [0-9]*, Stream [0-9]*' "$out_dir/kernel_detail.txt") launches in kernel_detail.txt"
  else
    echo "gpu_bench: the kernel detail failed: $(tail -2 "$kd/train.log")"
  fi
  rm -f "$kd/detail.ncu-rep"
fi

publish
exit "$rc"
