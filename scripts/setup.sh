#!/usr/bin/env bash
# Sets up Switchyard on a fresh Debian 12 machine and builds it; safe to run again.
#   1. installs the Debian packages (only those missing; apt-get as root, sudo otherwise);
#   2. configures and builds Release into build/ (SWITCHYARD_BUILD_DIR overrides it).
# Two sets:
#   bash scripts/setup.sh           everything (scripts/test.sh): test and report tools too
#                                   (GoogleTest, Google Benchmark, matplotlib, chromium,
#                                   PyTorch); every target, the CUDA backend whenever nvcc is found
#   bash scripts/setup.sh --quick   the main job only (scripts/quickstart.sh): compiler, CMake,
#                                   the libraries `switchyard` links and the fortune files; builds
#                                   only the `switchyard` target, tests and benchmarks not
#                                   configured, the CUDA backend only when a GPU is visible
#                                   (nvidia-smi -L, /dev/nvidia0) or SWITCHYARD_CUDA=ON is set.
#                                   An existing build dir keeps its configuration (a full build
#                                   stays full); only `switchyard` is brought up to date there.
#   --print                         prints what it would do (packages:, configure:, build:
#                                   lines) and changes nothing; tests/cli/quickstart_test.sh
#                                   reads it.
# Extra CMake arguments: SWITCHYARD_CMAKE_ARGS="-DSWITCHYARD_CUDA=OFF" bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages of a set: main (the quick start: build `switchyard`, prep, train) or
# all (main plus what the tests, benchmarks and the report need).
packages() {
  local main=(
    cmake ninja-build g++ pkg-config
    openmpi-bin libopenmpi-dev
    libabsl-dev libopenblas-dev libyaml-cpp-dev nlohmann-json3-dev
    libsentencepiece-dev zlib1g-dev libzstd-dev
    fortunes fortunes-de fortunes-es fortunes-it fortunes-br
  )
  local tests=(
    libgtest-dev libgmock-dev libbenchmark-dev
    sentencepiece zstd             # spm_encode (scripts/bench_prep.sh), zstd inputs in the tests
    python3 python3-numpy
    python3-matplotlib chromium    # switchyard report, and its test's headless browser
    python3-torch python3-venv     # the PyTorch references in benchmarks/reference; the Hugging
                                   # Face bridge's test (transformers in a venv)
  )
  case "$1" in
    main) printf '%s\n' "${main[@]}" ;;
    all) printf '%s\n' "${main[@]}" "${tests[@]}" ;;
  esac
}

# Whether this machine shows an NVIDIA GPU (not just the CUDA toolkit).
gpu_visible() {
  [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
}

quick=0 print=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --print) print=1 ;;
    *) echo "setup: unknown argument $arg (usage: setup.sh [--quick] [--print])" >&2; exit 2 ;;
  esac
done

build=${SWITCHYARD_BUILD_DIR:-build}
if [ $quick = 1 ]; then
  set_name=main
  targets=(--target switchyard)
  cuda=${SWITCHYARD_CUDA:-}
  if [ -z "$cuda" ]; then
    if gpu_visible; then cuda=AUTO; else cuda=OFF; fi
  fi
  cmake_args=(-DSWITCHYARD_TESTS=OFF -DSWITCHYARD_BENCHMARKS=OFF -DSWITCHYARD_CUDA="$cuda")
  # A build/ configured before (by scripts/test.sh, say) is built as it is: reconfiguring it
  # for the main job would drop its tests and recompile it without CUDA.
  if [ -f "$build/CMakeCache.txt" ]; then cmake_args=(); fi
else
  set_name=all
  targets=()
  cmake_args=(-DSWITCHYARD_TESTS=ON -DSWITCHYARD_BENCHMARKS=ON -DSWITCHYARD_CUDA="${SWITCHYARD_CUDA:-AUTO}")
fi
# shellcheck disable=SC2206  # word splitting of the extra arguments is intended
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" ${SWITCHYARD_CMAKE_ARGS:-})
mapfile -t wanted < <(packages $set_name)

if [ $print = 1 ]; then
  echo "packages: ${wanted[*]}"
  echo "configure: cmake -S . -B $build ${cmake_args[*]}"
  echo "build: cmake --build $build ${targets[*]} -j $(nproc)"
  exit 0
fi

missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# nvcc lives outside PATH on these machines; CMake finds it at /usr/local/cuda.
cmake -S . -B "$build" "${cmake_args[@]}"
cmake --build "$build" "${targets[@]}" -j "$(nproc)"
echo "setup: built $build/bin/switchyard"
