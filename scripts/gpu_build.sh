#!/usr/bin/env bash
# Builds the GPU check here, on the Debian machine, for a GPU machine that has the CUDA 13
# runtime libraries but no MPI and none of our Debian libraries, so that scripts/gpu_run.sh
# there only runs (no configure, no compile):
#   1. configures build-sm90a/ (the CMake tree, stays here): sm_90a (CUDA_ARCH), MPI off, the
#      built-in CPU sgemm (no OpenBLAS: 36 MiB), our sy_* libraries shared so the ~35 test
#      binaries do not each carry the CUDA kernels, cudart shared, RPATH $ORIGIN/../lib and
#      /usr/local/cuda/lib64 (no path of this machine);
#   2. builds what gpu_run.sh and gpu_bench.sh run: switchyard, every test labelled gpu (and
#      with GPU_PACK_UNIT=1 every one labelled unit, not the cli_ scripts: the CPU unit tests
#      in the pack's configuration, which no longer fit the 48 MiB with the GPU tests;
#      CI runs them), grouped_gemm_gpu_perf, permute_gpu_perf, attention_gpu_perf,
#      train_batches and plan_calibrate_gpu;
#   3. packs build-gpu/ (BUILD_DIR), the directory to carry: bin/ (stripped), lib/ (our .so
#      files and every library they need that is not glibc, libgcc_s or CUDA: abseil,
#      yaml-cpp, SentencePiece, protobuf-lite, zlib, zstd, libstdc++), the CTestTestfile.cmake
#      files with PREBUILT naming the paths they hold (gpu_run.sh rewrites them), and the
#      prepared corpus (a slice of the fortunes, GPU_CORPUS_DOCS documents per file: see below);
#   4. checks that nothing in it resolves to a Debian library outside lib/, and prints its size
#      (at most 48 MiB: the device tool carries 64 MiB with the working tree).
# Usage: bash scripts/gpu_build.sh   then carry ["build-gpu"] and run scripts/gpu_run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
arch=${CUDA_ARCH:-90a}
tree=${GPU_BUILD_TREE:-build-sm$arch}
pack=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

mkdir -p "$tree"
start=$(date +%s)
# --disable-new-dtags: DT_RPATH, which (unlike DT_RUNPATH) also finds the dependencies of the
# packed libraries (abseil's own libraries, protobuf-lite) in lib/.
cmake -S . -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DSWITCHYARD_MPI=OFF -DSWITCHYARD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSWITCHYARD_BLAS=OFF \
  -DSWITCHYARD_TESTS=ON -DSWITCHYARD_BENCHMARKS=ON -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_CUDA_RUNTIME_LIBRARY=Shared -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;/usr/local/cuda/lib64' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags \
  ${SWITCHYARD_CMAKE_ARGS:-} >"$tree/gpu_build.configure.log" 2>&1 || { tail -30 "$tree/gpu_build.configure.log"; exit 1; }

# The test binaries gpu_run.sh runs (ctest -L gpu; ctest -L unit without the cli_ scripts):
# tests whose program is a target of ours (not built yet, ctest shows no command for them).
ninja -C "$tree" -t targets all | sed -n 's/: phony$//p' | sort -u >"$tree/gpu_build.targets"
pack_unit=${GPU_PACK_UNIT:-0}
labels=gpu
[ "$pack_unit" = 1 ] && labels='gpu|unit'
mapfile -t tests < <(ctest --test-dir "$tree" --show-only=json-v1 -L "$labels" | python3 -c '
import json, os, sys
bin_dir, targets = sys.argv[1], set(open(sys.argv[2]).read().split())
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or [t["name"]]
    name = os.path.basename(cmd[0])
    if (not t.get("command") or os.path.dirname(cmd[0]) == bin_dir) and name in targets:
        print(name)
' "$root/$tree/bin" "$tree/gpu_build.targets" | sort -u)
# train_batches: the batches scripts/gpu_bench.sh gives the PyTorch reference.
targets=(switchyard grouped_gemm_gpu_perf permute_gpu_perf attention_gpu_perf train_batches plan_calibrate_gpu "${tests[@]}")
echo "gpu_build: building ${#targets[@]} targets into $tree (sm_$arch, no MPI, -j $jobs)"
cmake --build "$tree" -j "$jobs" --target "${targets[@]}"
built=$(date +%s)

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for t in "${targets[@]}"; do cp "$tree/bin/$t" "$pack/bin/"; done
cp -P "$tree"/lib/*.so* "$pack/lib/"
# Every library the binaries need that a bare GPU machine may lack: all but glibc, libgcc_s,
# the dynamic loader and the CUDA libraries (cudart, cuBLAS: the GPU machine's own).
system='^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64|linux-vdso)\.so'
ldd "$pack"/bin/* "$pack"/lib/*.so* 2>/dev/null | awk '/=> \// {print $1, $3}' | sort -u |
while read -r name path; do
  [[ "$name" =~ $system ]] && continue
  [[ "$path" == /usr/local/cuda* || "$path" == "$root/$tree/"* || "$path" == "$root/$pack/"* ]] && continue
  [ -e "$pack/lib/$name" ] || cp -L "$path" "$pack/lib/$name"
done
# The packed libraries' own dependencies (abseil's libraries need one another).
for _ in 1 2 3; do
  ldd "$pack"/lib/*.so* 2>/dev/null | awk '/=> \// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $system || "$path" == /usr/local/cuda* || -e "$pack/lib/$name" ]] && continue
    cp -L "$path" "$pack/lib/$name"
  done
done
strip --strip-unneeded "$pack"/bin/* "$pack"/lib/*.so* 2>/dev/null || true

# ctest's files, with the absolute paths of this machine recorded in PREBUILT.
(cd "$tree" && find . -name CTestTestfile.cmake) | while read -r f; do
  mkdir -p "$pack/$(dirname "$f")" && cp "$tree/$f" "$pack/$f"
done
printf 'source=%s\nbuild=%s\narch=%s\nunit=%s\n' "$root" "$root/$tree" "$arch" "$pack_unit" \
  >"$pack/PREBUILT"
# The corpus gpu_run.sh and gpu_bench.sh train on: a slice of the fortunes (at most
# GPU_CORPUS_DOCS documents per file, vocabulary 2000), prepared once into data/fortunes-gpu
# here with the pack's own switchyard, so the pack stays well under the device tool's limit
# (the whole prepared corpus is 14 MiB). GPU_CORPUS_DOCS=0 carries data/fortunes whole.
corpus_docs=${GPU_CORPUS_DOCS:-2000}
if [ "$corpus_docs" = 0 ]; then
  corpus=data/fortunes
else
  corpus=data/fortunes-gpu
  if [ ! -f "$corpus/index.json" ] || [ "$(cat "$corpus/.docs" 2>/dev/null)" != "$corpus_docs" ]; then
    rm -rf "$corpus"
    LD_LIBRARY_PATH="$pack/lib" "$pack/bin/switchyard" prep --out "$corpus" --vocab 2000 \
      --max-docs-per-label "$corpus_docs" >"$tree/gpu_build.prep.log" 2>&1 ||
      { tail -5 "$tree/gpu_build.prep.log"; echo "gpu_build: prep of $corpus failed"; exit 1; }
    echo "$corpus_docs" >"$corpus/.docs"
  fi
fi
if [ -f "$corpus/index.json" ]; then
  mkdir -p "$pack/data/fortunes" && cp -r "$corpus"/. "$pack/data/fortunes/"
  echo "gpu_build: corpus $corpus ($(du -sm "$corpus" | cut -f1) MiB) packed as $pack/data/fortunes"
fi

# Nothing a program loads may resolve to a Debian library outside the pack (LD_LIBRARY_PATH
# cleared). The programs' DT_RPATH applies to every library they load, the packed Debian
# libraries' own dependencies included, so ldd of the programs is what a GPU machine sees
# (ldd of a packed Debian library alone would search the system instead).
bad=$(env -u LD_LIBRARY_PATH ldd "$pack"/bin/* 2>/dev/null |
      awk '/=> / {print $1, $3}' | grep -Ev "^[^ ]+ ($root/$pack/|/usr/local/cuda)" |
      grep -Ev "$system" | sort -u || true)
if [ -n "$bad" ]; then
  echo "gpu_build: resolved outside $pack/lib (or not found):"; echo "$bad"; exit 1
fi
size=$(du -sm "$pack" | cut -f1)
echo "gpu_build: built in $((built - start)) s; $pack holds ${#targets[@]} programs, $(ls "$pack/lib" | wc -l) libraries, ${size} MiB"
[ "$size" -le 48 ] || { echo "gpu_build: $pack is over 48 MiB (the device tool carries 64 MiB in all)"; exit 1; }
echo "gpu_build: carry it: run(command=\"bash scripts/gpu_run.sh\", carry=[\"$pack\"], timeout_s=540) (summary.txt and gpu_run.tar.gz come back in \$OUT)"
