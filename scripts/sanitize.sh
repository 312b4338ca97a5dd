#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build and run of the unit tests, a few
# multi-rank tests and the malformed-input suites (docs/failures.md), into build-asan/
# (CPU only: CUDA off). Not part of scripts/test.sh: the instrumented build takes longer
# than CI allows on 2 cores. Usage:
#   bash scripts/sanitize.sh            # configure, build, run the default selection
#   bash scripts/sanitize.sh -R config  # ctest arguments replace the default selection
# Any sanitizer report fails the test that printed it (halt_on_error). Leak checking is
# off: Open MPI keeps allocations until exit by design.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build-asan
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWITCHYARD_CUDA=OFF \
  "${launcher[@]}" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
targets=(switchyard core_test config_test checkpoint_unit_test checkpoint_plan_test
         malformed_input_test metrics_writer_test optimizer_test data_test mesh_test
         communicator_test checkpoint_test trainer_test)
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# mpirun passes these to every rank.
export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS;UBSAN_OPTIONS"
if [[ $# -eq 0 ]]; then
  set -- -R '^(core_test|config_test|checkpoint_unit_test|checkpoint_plan_test|malformed_input_test|metrics_writer_test|optimizer_test|data_test|mesh_test|cli_malformed_input|cli_prep|communicator_test_np2|checkpoint_test_np2|trainer_test_np2)$'
fi
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" "$@"
