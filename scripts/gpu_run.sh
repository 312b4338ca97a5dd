#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU, nvcc, CMake and a C++
# compiler but no MPI and no Debian libraries (the device machine):
#   1. uses the build scripts/gpu_build.sh made on the Debian machine when build-gpu/PREBUILT
#      is there (carried; no configure, no compile: ctest's files get this machine's paths);
#      else builds for the GPU (sm_90a unless CUDA_ARCH says otherwise) without MPI, against the
#      libraries scripts/gpu_deps.sh packed into .gpu-deps/ (or the system's when absent);
#   2. runs the GPU tests (ctest -L gpu: every CUDA kernel, the MoE layer and one training
#      step against the CPU reference, checkpoints across devices), the CPU unit tests, and
#      `switchyard moe-layer` on the GPU against the CPU (f32 and bf16);
#   3. trains configs/switch-tiny.yaml on the GPU for STEPS steps (f32 and bf16 matrix
#      products, and bf16 replayed as a CUDA graph, its losses against the eager run's),
#      resumes the bf16 run's checkpoint on the CPU for a few steps, and runs the
#      GPU benchmarks (grouped GEMM vs dense cuBLAS, permute bandwidth);
#   4. prints a summary table (and writes it, the logs and the benchmark JSON to OUT_DIR).
# MEMCHECK=1 adds compute-sanitizer's memcheck of every GPU test program after the GPU
# tests; MEMCHECK=only runs just that (a second device call: it takes minutes).
# SANITIZER_TOOL=racecheck (or synccheck, initcheck) runs that tool instead of memcheck, e.g.
# MEMCHECK=only SANITIZER_TOOL=racecheck SWITCHYARD_GROUPED_WGMMA=1 for the shared-memory
# hazards of the flash and Hopper tiles, which the host model of CUDA cannot see.
# Usage: bash scripts/gpu_build.sh  (on the Debian machine; carry build-gpu)
#        bash scripts/gpu_run.sh    (on the GPU machine; OUT_DIR defaults to gpu-run/; with
#                                   $OUT set, summary.txt and gpu_run.tar.gz land there)
#   or, to compile on the GPU machine: bash scripts/gpu_deps.sh here, carry .gpu-deps.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT_DIR:-$root/gpu-run}
steps=${STEPS:-200}
arch=${CUDA_ARCH:-90a}
build=${BUILD_DIR:-build-gpu}
mkdir -p "$out"
summary=()
# With $OUT set (the device tool, which brings back 8 files), every row also copies the
# summary so far (summary.txt) and OUT_DIR's logs and JSON (gpu_run.tar.gz, no checkpoints)
# there: a run the tool's time limit stops still brings back the rows before.
publish() {
  [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] || return 0
  printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
  tar -czf "$OUT/gpu_run.tar.gz" -C "$(dirname "$out")" --exclude='step-*' --exclude='*.bin' \
    "$(basename "$out")" 2>/dev/null
  return 0
}
row() { summary+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); publish; }
# The first error line of a log, else its last line.
why() { grep -m1 -E 'error|FAILED|Failure' "$1" || tail -1 "$1"; }
# Runs a command for at most $1 seconds (a hung kernel or rank must not spend the session's
# device time); past it, says so on stderr (the caller's log) and returns 124.
limit() {
  local s=$1
  shift
  timeout --kill-after=10 "$s" "$@"
  local rc=$?
  [ $rc = 124 ] && echo "error: timed out after $s s: $*" >&2
  return $rc
}

deps="$root/.gpu-deps/root"
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DSWITCHYARD_MPI=OFF -DSWITCHYARD_CUDA=ON
            -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSWITCHYARD_BLAS=OFF)
if [ -d "$deps" ]; then
  multi="$deps/usr/lib/x86_64-linux-gnu"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr;$multi/cmake" -DCMAKE_INCLUDE_PATH="$deps/usr/include"
               -DCMAKE_LIBRARY_PATH="$multi" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include")
  export LD_LIBRARY_PATH="$multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PATH="/usr/local/cuda/bin:$PATH"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== gpu_run: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
if [ -f "$build/PREBUILT" ]; then
  # Built by scripts/gpu_build.sh elsewhere: point ctest's files at this machine's paths.
  old_source=$(sed -n 's/^source=//p' "$build/PREBUILT")
  old_build=$(sed -n 's/^build=//p' "$build/PREBUILT")
  find "$build" -name CTestTestfile.cmake -exec sed -i -e "s#$old_build#$root/$build#g" \
    -e "s#$old_source#$root#g" {} +
  # A program with a source path compiled in (malformed_input_test's tiny config) finds it
  # through a link to this copy where the machine lets us make one; else it is left out.
  if [ ! -e "$old_source" ]; then
    { mkdir -p "$(dirname "$old_source")" && ln -s "$root" "$old_source"; } 2>/dev/null ||
      unit_exclude="|malformed_input_test"
  fi
  source scripts/gpu_libs.sh "$root" "$build"
  missing=$cuda_missing
  echo "== prebuilt $build (sm_$(sed -n 's/^arch=//p' "$build/PREBUILT"), built on the Debian machine)"
  if [ -n "$missing" ]; then
    row "prebuilt (no MPI)" FAILED "libraries not found: $missing"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
  row "prebuilt (sm_$(sed -n 's/^arch=//p' "$build/PREBUILT"), no MPI)" ok "$build"
else
echo "== configure + build ($build, sm_$arch)"
if cmake -S . -B "$build" "${generator[@]}" "${cmake_args[@]}" >"$out/configure.log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1; then
  row "build (sm_$arch, no MPI)" ok "$build"
else
  tail -40 "$out/configure.log" "$out/build.log" 2>/dev/null
  row "build (sm_$arch, no MPI)" FAILED "see $out/build.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
fi
bin="$build/bin"

# compute-sanitizer's memcheck over each GPU test program (death tests left out: their child
# processes re-execute the program), MEMCHECK_TIMEOUT seconds each (memcheck slows kernels
# many times; a program over it is reported as such, not as a failure).
memcheck() {
  local tool=${SANITIZER_TOOL:-memcheck}
  echo "== compute-sanitizer $tool of the GPU test programs"
  local sanitizer prog name log rc
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for prog in "$bin"/*_gpu_test; do
    name=$(basename "$prog")
    log="$out/${tool}_$name.log"
    prog=$(realpath "$prog")
    (cd "$build" && timeout "${MEMCHECK_TIMEOUT:-180}" "$sanitizer" --tool "$tool" \
       --error-exitcode 9 "$prog" --gtest_filter='-*DeathTest*') >"$log" 2>&1
    rc=$?
    case $rc in
      0) row "$tool $name" ok "$(grep -m1 'ERROR SUMMARY' "$log")" ;;
      124) row "$tool $name" timeout "over ${MEMCHECK_TIMEOUT:-180} s (see $log)" ;;
      *) row "$tool $name" FAILED "$(grep -m1 -E 'Invalid|Race|ERROR SUMMARY|FAILED' "$log")" ;;
    esac
  done
}
if [ "${MEMCHECK:-0}" = only ]; then
  memcheck
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  grep -q FAILED "$out/summary.txt" && exit 1
  exit 0
fi

echo "== GPU tests"
(cd "$build" && ctest -L gpu --output-on-failure --timeout "${GPU_TEST_TIMEOUT:-180}") \
  >"$out/gpu_tests.log" 2>&1
rc=$?
passed=$(grep -Eo "[0-9]+% tests passed(, [0-9]+ tests failed)? out of [0-9]+" "$out/gpu_tests.log" | tail -1)
total=$(grep -Eo 'out of [0-9]+' "$out/gpu_tests.log" | tail -1 | grep -Eo '[0-9]+')
skipped=$(grep -c '\*\*\*Skipped' "$out/gpu_tests.log")
result=$([ $rc = 0 ] && echo ok || echo FAILED)
[ $rc = 0 ] && [ "$skipped" = "${total:-x}" ] && result=SKIPPED  # no GPU visible
row "ctest -L gpu" "$result" "${passed:-no summary} ($skipped skipped)"
[ $rc = 0 ] || grep -E '^\[  FAILED  \]|Failure|error' "$out/gpu_tests.log" | head -30
[ "${MEMCHECK:-0}" = 1 ] && memcheck

# The grouped GEMMs' Hopper tiles (wgmma, SWITCHYARD_GROUPED_WGMMA=1; not the default until
# they have passed here): the device-sized grouped GEMM tests, the MoE layer and the training
# step against the CPU, in processes that read the switch.
echo "== GPU tests on the wgmma grouped tiles"
bin_abs=$(realpath "$bin")
# "wide:" runs the program with the 128 x 256 tiles (SWITCHYARD_GROUPED_WIDE=1) as well.
# The tiles have not run on a GPU yet: a hang (a wgmma or barrier wait that never ends) must
# not spend the session's device time, so the grouped GEMM tests (seconds when they work) stop
# after WGMMA_TEST_TIMEOUT (60) s, and once one has timed out the later wgmma runs (tests and
# benchmarks) are skipped, each saying so.
wgmma_hung=
for t in "kernels_gpu_test --gtest_filter=DeviceSized*" \
         "wide:kernels_gpu_test --gtest_filter=DeviceSized*" moe_gpu_test train_gpu_test; do
  wide=0 tag=wgmma
  case $t in wide:*) wide=1 tag=wgmma_wide t=${t#wide:} ;; esac
  name=${t%% *}
  log="$out/${tag}_$name.log"
  if [ -n "$wgmma_hung" ]; then
    row "$tag $name" skipped "$wgmma_hung"
    continue
  fi
  seconds=${GPU_TEST_TIMEOUT:-180}
  [ "$name" = kernels_gpu_test ] && seconds=${WGMMA_TEST_TIMEOUT:-60}
  (cd "$build" && SWITCHYARD_GROUPED_WGMMA=1 SWITCHYARD_GROUPED_WIDE=$wide \
     timeout --kill-after=10 "$seconds" "$bin_abs/"$t) >"$log" 2>&1
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    wgmma_hung="$tag $name timed out after $seconds s"
    row "$tag $name" FAILED "timed out after $seconds s (a hang? see $log)"
  elif grep -q "SWITCHYARD_GROUPED_WGMMA=1 ignored" "$log"; then
    row "$tag $name" FAILED "not compiled for sm_90a (see $log)"
  elif [ $rc = 0 ] && grep -q 'SKIPPED' "$log" && ! grep -q '\[  PASSED  \] [1-9]' "$log"; then
    row "$tag $name" SKIPPED "$(grep -m1 -Eo '[0-9]+ tests?, listed below' "$log") (no GPU visible)"
  elif [ $rc = 0 ]; then
    row "$tag $name" ok "$(grep -m1 -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$log")"
  else
    row "$tag $name" FAILED "$(grep -m1 -E 'Failure|FAILED|error' "$log" || tail -1 "$log")"
  fi
done

echo "== unit tests on this machine's CPU (same build)"
if [ -f "$build/PREBUILT" ] && grep -qx 'unit=0' "$build/PREBUILT"; then
  # gpu_build.sh packs the CPU unit tests only with GPU_PACK_UNIT=1 (size); CI runs them.
  row "ctest -L unit (CPU)" skipped "not packed (GPU_PACK_UNIT=1 bash scripts/gpu_build.sh packs them)"
else
  (cd "$build" && ctest -L unit -E "cli_|tiny_configs|docs_model${unit_exclude:-}" --output-on-failure \
     -j "$(nproc)" --timeout 300) >"$out/unit_tests.log" 2>&1
  rc=$?
  passed=$(grep -Eo "[0-9]+% tests passed(, [0-9]+ tests failed)? out of [0-9]+" "$out/unit_tests.log" | tail -1)
  row "ctest -L unit (CPU)" "$([ $rc = 0 ] && echo ok || echo FAILED)" "${passed:-no summary}"
fi

echo "== one MoE layer, forward + backward: GPU against CPU (switchyard moe-layer)"
ml="$out/moe-layer"
mkdir -p "$ml"
# The shapes of configs/moe-layer-example.yaml (d 8, 8 experts of 16, one shared of 16).
if python3 tests/cli/moe_layer_tool.py make --out "$ml/in.safetensors" --groups 8 --tokens 256 --d 8 \
     --experts 8 --hidden 16 --activation swiglu --bias --shared-hidden 16 --expert-bias >"$ml/log" 2>&1; then
  for precision in fp32 bf16; do
    for device in cpu cuda; do
      limit 120 "$bin/switchyard" moe-layer --config configs/moe-layer-example.yaml --input "$ml/in.safetensors" \
        --out "$ml/$device-$precision.safetensors" --set runtime.device=$device \
        --set runtime.precision=$precision >>"$ml/log" 2>&1 || echo "moe-layer $device $precision failed" >>"$ml/log"
    done
    rtol=1e-5; [ $precision = bf16 ] && rtol=2e-3  # same roundings, another summation order
    if python3 tests/cli/moe_layer_tool.py compare "$ml/cuda-$precision.safetensors" \
         "$ml/cpu-$precision.safetensors" --rtol $rtol >"$ml/compare-$precision.log" 2>&1; then
      row "moe-layer cuda vs cpu, $precision" ok "$(tail -2 "$ml/compare-$precision.log" | head -1)"
    else
      row "moe-layer cuda vs cpu, $precision" FAILED "$(grep -h -m1 -E 'error|DIFFER|FAIL' "$ml/log" "$ml/compare-$precision.log" | head -1)"
    fi
  done
else
  row "moe-layer cuda vs cpu" FAILED "moe_layer_tool.py make failed (numpy?): $(tail -1 "$ml/log")"
fi

data="$root/$build/data/fortunes"
[ -f "$data/index.json" ] || data="$root/.gpu-deps/data/fortunes"
[ -f "$data/index.json" ] || data="$root/data/fortunes"
if [ ! -f "$data/index.json" ]; then
  "$bin/switchyard" prep --out "$data" --vocab 2000 >"$out/prep.log" 2>&1 ||
    row "prep" FAILED "no prepared corpus and prep failed: see $out/prep.log"
fi

# loss at the first and last step from a metrics.jsonl
losses() { python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tps = [r.get("tokens_per_s", 0) for r in rows[len(rows) // 2:]]
print("loss %.3f -> %.3f over %d steps, %.0f tokens/s" % (rows[0]["loss"], rows[-1]["loss"], len(rows), sum(tps) / max(len(tps), 1)))
PY
}
for precision in fp32 bf16; do
  run="$out/train-$precision"
  rm -rf "$run"
  echo "== train switch-tiny on cuda, $precision, $steps steps"
  if limit "${TRAIN_TIMEOUT:-240}" "$bin/switchyard" train --config configs/switch-tiny.yaml --out "$run" \
       --set runtime.device=cuda --set runtime.precision=$precision --set data.dir="$data" \
       --set train.max_steps="$steps" --set train.eval_every="$steps" >"$out/train-$precision.log" 2>&1; then
    row "train cuda $precision" ok "$(losses "$run/metrics.jsonl")"
  else
    row "train cuda $precision" FAILED "$(why "$out/train-$precision.log")"
  fi
done

# The same bf16 run with the micro-batches replayed as a CUDA graph (runtime.cuda_graphs):
# its losses against the eager run's, step by step (the same kernels: expected equal).
run="$out/train-bf16-graphs"
rm -rf "$run"
echo "== train switch-tiny on cuda, bf16, CUDA graphs, $steps steps"
if limit "${TRAIN_TIMEOUT:-240}" "$bin/switchyard" train --config configs/switch-tiny.yaml --out "$run" \
     --set runtime.device=cuda --set runtime.precision=bf16 --set runtime.cuda_graphs=true \
     --set data.dir="$data" --set train.max_steps="$steps" --set train.eval_every="$steps" \
     >"$out/train-bf16-graphs.log" 2>&1; then
  same=$(python3 - "$out/train-bf16/metrics.jsonl" "$run/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]
eager, graphs = losses(sys.argv[1]), losses(sys.argv[2])
diff = max((abs(a - b) for a, b in zip(eager, graphs)), default=float("nan"))
print("%s; losses vs eager: %d steps, max |diff| %.3g%s" % (
    sys.argv[2], len(graphs), diff, "" if len(eager) == len(graphs) and diff == 0 else " (NOT equal)"))
PY
  )
  row "train cuda bf16 graphs" ok "$(losses "$run/metrics.jsonl"); ${same#*; }"
else
  row "train cuda bf16 graphs" FAILED "$(why "$out/train-bf16-graphs.log")"
fi

echo "== resume the GPU bf16 checkpoint on the CPU"
if limit "${TRAIN_TIMEOUT:-240}" "$bin/switchyard" train --config configs/switch-tiny.yaml --out "$out/train-bf16" --resume "$out/train-bf16" \
     --set data.dir="$data" --set train.max_steps=$((steps + 10)) --set train.eval_every=0 \
     >"$out/resume-cpu.log" 2>&1; then
  row "resume on cpu (+10 steps)" ok "$(grep -o 'resumed from .*' "$out/resume-cpu.log" | head -1)"
else
  row "resume on cpu (+10 steps)" FAILED "$(why "$out/resume-cpu.log")"
fi

echo "== benchmarks"
for b in "grouped_gemm_gpu_perf --json $out/grouped_gemm.json" "permute_gpu_perf --json $out/permute.json" \
         "attention_gpu_perf --json $out/attention.json" \
         "attention_gpu_perf --head_dim 64 --seq_lens 512,2048 --json $out/attention_hd64.json" \
         "attention_gpu_perf --head_dim 64 --seq_lens 512,2048 --bf16_inputs 1 --json $out/attention_hd64_bf16in.json" \
         "wgmma grouped_gemm_gpu_perf --json $out/grouped_gemm_wgmma.json" \
         "wgmma-wide grouped_gemm_gpu_perf --json $out/grouped_gemm_wgmma_wide.json"; do
  # A leading "wgmma" / "wgmma-wide": the expert GEMMs on the Hopper tiles, 128 x 128 / 128 x 256.
  wgmma=0 wide=0 tag=
  case ${b%% *} in
    wgmma) wgmma=1 tag=_wgmma b=${b#* } ;;
    wgmma-wide) wgmma=1 wide=1 tag=_wgmma_wide b=${b#* } ;;
  esac
  name=${b%% *}$tag
  if [ $wgmma = 1 ] && [ -n "$wgmma_hung" ]; then
    row "$name" skipped "$wgmma_hung"
    continue
  fi
  case $b in  # the attention rows' logs by their json's name
    attention_gpu_perf*hd64*) name=$(basename "${b##* }" .json) ;;
  esac
  if SWITCHYARD_GROUPED_WGMMA=$wgmma SWITCHYARD_GROUPED_WIDE=$wide limit 180 "$bin"/$b \
       >"$out/$name.log" 2>&1; then
    row "$name" ok "$(grep -iE 'ratio|of peak|summary' "$out/$name.log" | tail -1)"
  else
    row "$name" FAILED "$(why "$out/$name.log")"
  fi
done

echo
echo "== summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%-34s %-8s %s\n' "check" "result" "detail"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
grep -q FAILED "$out/summary.txt" && exit 1
exit 0
