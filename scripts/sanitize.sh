#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build and run of the unit tests of the core,
# config, checkpoint, data and optimizer code, a few multi-rank tests, the CPU emulation of
# CUDA graph capture (recorded closures must not outlive what they read), the
# malformed-input suites (docs/failures.md) and the CUDA kernels' device code on the host model
# of CUDA (the *_emulation_test programs on exact-size buffers: an out-of-range read or write
# of a kernel is reported here, as compute-sanitizer's memcheck would on a GPU), into
# build-asan/ (CPU only: CUDA off). CI runs it after
# scripts/test.sh (.ci/run). Usage:
#   bash scripts/sanitize.sh            # configure, build, run the default selection
#   bash scripts/sanitize.sh -R config  # ctest arguments replace the default selection
#   bash scripts/sanitize.sh --check-selection BUILD_DIR
#                                       # only check, in an already configured build, that
#                                       # every selected test exists and its programs are
#                                       # among the targets built here (a ctest entry)
# The default selection must run exactly the tests it names: a renamed or missing test fails
# the script instead of passing silently (ctest -R matching nothing passes). Any sanitizer
# report fails the test that printed it (halt_on_error). Leak checking is off: Open MPI keeps
# allocations until exit by design.
set -euo pipefail
cd "$(dirname "$0")/.."

# The device code's emulation tests, one per tests/kernels/*_emulation_test.cc (program and
# test alike), so a new one is sanitized too.
mapfile -t emulated < <(cd tests/kernels && ls -- *_emulation_test.cc | sed 's/\.cc$//')
# The programs to build: every test below runs one of them (the cli_* scripts: switchyard).
targets=(switchyard core_test config_test checkpoint_unit_test checkpoint_plan_test
         malformed_input_test data_errors_test metrics_writer_test optimizer_test data_test
         mesh_test communicator_test checkpoint_test checkpoint_failure_test trainer_test
         head_chunk_test captured_work_test block_cache_test cuda_graphs_test
         "${emulated[@]}")
# The tests to run.
tests=(core_test config_test checkpoint_unit_test checkpoint_plan_test malformed_input_test
       data_errors_test metrics_writer_test optimizer_test data_test mesh_test
       cli_malformed_input cli_prep communicator_test_np2 checkpoint_test_np2 checkpoint_failure_test_np2 trainer_test_np2
       head_chunk_test captured_work_test block_cache_test cuda_graphs_test_np1 "${emulated[@]}")
regex="^($(IFS='|'; echo "${tests[*]}"))\$"

# Checks that the default selection names len(tests) tests of build dir $1, each of whose
# commands' programs (files under $1) is one of `targets`.
check_selection() {
  local build=$1
  ctest --test-dir "$build" --show-only=json-v1 -R "$regex" | python3 -c '
import json, os, sys
build, want, targets = sys.argv[1], sys.argv[2].split(), set(sys.argv[3].split())
tests = json.load(sys.stdin)["tests"]
names = sorted(t["name"] for t in tests)
missing = sorted(set(want) - set(names))
if missing:
    sys.exit(f"sanitize.sh: selected tests not in {build}: {missing}")
bad = []
for t in tests:
    name = t["name"]
    if "command" not in t:  # ctest leaves it out when the program does not exist
        bad.append(f"{name} runs a program not built in {build}")
    for arg in t.get("command", []):
        path = os.path.realpath(arg)
        if path.startswith(os.path.realpath(build) + os.sep) and os.path.basename(path) not in targets:
            bad.append(f"{name} runs {os.path.basename(path)}")
if bad:
    sys.exit("sanitize.sh: selection not covered by the targets: " + "; ".join(bad))
print(f"sanitize.sh: selection of {len(names)} tests, every program among the targets")
' "$build" "${tests[*]}" "${targets[*]}"
}

if [[ "${1:-}" == --check-selection ]]; then
  check_selection "$2"
  exit 0
fi

dir=build-asan
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -Og -g1: line tables for the reports' stack traces, and half the compile time of -O2 -g
# under both sanitizers (measured on trainer.cc: 14 s against 36), which is most of CI's time
# in this script.
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWITCHYARD_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" \
  -DSWITCHYARD_BENCHMARKS=OFF "${launcher[@]}" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# mpirun passes these to every rank.
export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS;UBSAN_OPTIONS"
if [[ $# -gt 0 ]]; then
  exec ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" "$@"
fi
check_selection "$dir"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" -R "$regex" | tee "$log"
ran=$(sed -n 's/.* tests\{0,1\} failed out of \([0-9][0-9]*\)$/\1/p' "$log" | tail -1)
if [[ "$ran" != "${#tests[@]}" ]]; then
  echo "sanitize.sh: ran ${ran:-no} tests, the selection names ${#tests[@]}" >&2
  exit 1
fi
