#!/usr/bin/env bash
# Packs what a GPU build needs from Debian into .gpu-deps/ (git-ignored), for a GPU machine
# that has nvcc, CMake and a C++ compiler but no apt and none of our Debian libraries:
#   .gpu-deps/root/   abseil, yaml-cpp, nlohmann-json, GoogleTest, SentencePiece, zlib, zstd (headers,
#                     CMake configs, libraries) unpacked with dpkg -x. Not OpenBLAS (36 MiB):
#                     the GPU build's CPU reference uses the built-in sgemm (SWITCHYARD_BLAS=OFF)
#   .gpu-deps/data/   the default corpus, prepared here (`switchyard prep`, vocabulary 2000)
# Run it here (Debian 12, apt-get works), then carry .gpu-deps to the GPU machine and run
# scripts/gpu_run.sh there. Safe to run again; about 35 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-deps
packages=(
  libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev
  libgtest-dev libgmock-dev libsentencepiece-dev libsentencepiece0 libprotobuf-lite32
  zlib1g-dev zlib1g libzstd-dev libzstd1
)
rm -rf "$dest/root" "$dest/debs"
mkdir -p "$dest/debs" "$dest/root"
(cd "$dest/debs" && apt-get download -q "${packages[@]}" 2>&1 | grep -v "unsandboxed" || true)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
rm -rf "$dest/debs"
rm -rf "$dest/root/usr/share/doc" "$dest/root/usr/share/man"
echo "gpu_deps: $(du -sh "$dest/root" | cut -f1) of libraries in $dest/root"

if [ ! -f "$dest/data/fortunes/index.json" ]; then
  if [ -f data/fortunes/index.json ]; then
    mkdir -p "$dest/data" && cp -r data/fortunes "$dest/data/"
  else
    [ -x build/bin/switchyard ] || bash scripts/setup.sh
    build/bin/switchyard prep --out "$dest/data/fortunes" --vocab 2000
  fi
fi
echo "gpu_deps: $(du -sh "$dest" | cut -f1) in $dest (carry it: run's carry [\".gpu-deps\"])"
