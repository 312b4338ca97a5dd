#!/usr/bin/env bash
# Sets up Switchyard on a fresh Debian 12 machine and builds it; safe to run again.
#   1. installs the Debian packages the project needs (only those missing; apt-get as root,
#      sudo otherwise);
#   2. configures and builds Release into build/ (the CUDA backend whenever nvcc is found).
# Extra CMake arguments: SWITCHYARD_CMAKE_ARGS="-DSWITCHYARD_CUDA=OFF" bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build g++ pkg-config
  openmpi-bin libopenmpi-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libyaml-cpp-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece zlib1g-dev libzstd-dev zstd
  fortunes fortunes-de fortunes-es fortunes-it fortunes-br
  python3 python3-numpy
  python3-matplotlib chromium   # switchyard report, and its test's headless browser
  python3-torch python3-venv    # the PyTorch references in benchmarks/reference; the Hugging
                                # Face bridge's test (transformers in a venv)
)
missing=()
for p in "${packages[@]}"; do
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
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SWITCHYARD_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
echo "setup: built build/bin/switchyard"
