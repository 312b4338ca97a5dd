#!/usr/bin/env bash
# ThreadSanitizer run of the CUDA device code on the host model of CUDA: the
# *_emulation_test programs (tests/kernels/CMakeLists.txt) built with -fsanitize=thread into
# build-tsan/ (CPU only). The model runs a CTA's threads concurrently with real barriers,
# so a kernel that reads shared or global memory another thread of its CTA writes without a
# __syncthreads between shows as a data race: what compute-sanitizer's racecheck would
# report on a GPU. Not in CI (minutes per program on two cores). Prints one line per program
# and exits 1 if any reported a race or failed. Usage:
#   bash scripts/race_check.sh                      # every emulation test
#   bash scripts/race_check.sh norm_emulation_test  # the ones named
set -uo pipefail
cd "$(dirname "$0")/.."
programs=("$@")
if [ ${#programs[@]} -eq 0 ]; then  # one per tests/kernels/*_emulation_test.cc
  mapfile -t programs < <(cd tests/kernels && ls -- *_emulation_test.cc | sed 's/\.cc$//')
fi
dir=build-tsan
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWITCHYARD_CUDA=OFF \
  -DSWITCHYARD_MPI=OFF -DSWITCHYARD_BENCHMARKS=OFF "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  >/dev/null || exit 1
cmake --build "$dir" -j "$(nproc)" --target "${programs[@]}" || exit 1
failed=0
for p in "${programs[@]}"; do
  log="$dir/$p.tsan.log"
  start=$SECONDS
  TSAN_OPTIONS="halt_on_error=0 exitcode=66" "$dir/bin/$p" >"$log" 2>&1
  rc=$?
  races=$(grep -c 'WARNING: ThreadSanitizer' "$log")
  status=ok
  [ $rc -ne 0 ] || [ "$races" -ne 0 ] && status=FAILED failed=1
  printf '%-34s %-7s %3d s, %d race reports (%s)\n' "$p" "$status" $((SECONDS - start)) \
    "$races" "$log"
done
exit $failed
