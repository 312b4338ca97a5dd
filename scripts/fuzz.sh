#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (the parsers of configs, indexes, safetensors,
# shards, routing logs and trainer states) with clang, AddressSanitizer and UBSan into
# build-fuzz/ (CPU only), and runs each for SECONDS_EACH seconds (default 60) from a corpus
# seeded with the repository's own files. A crash, a hang or a broken property leaves its
# input in build-fuzz/crashes/<target>/ and fails the script.
# Not part of CI (its time is open-ended); tests/fuzz/README.md.
#   bash scripts/fuzz.sh                    # every target, 60 s each
#   SECONDS_EACH=600 bash scripts/fuzz.sh config_fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build-fuzz
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DSWITCHYARD_CUDA=OFF -DSWITCHYARD_TESTS=OFF -DSWITCHYARD_BENCHMARKS=OFF -DSWITCHYARD_FUZZ=ON \
  >/dev/null
all=(config_fuzz data_index_fuzz checkpoint_index_fuzz safetensors_fuzz shard_header_fuzz skew_fuzz
     trainer_state_fuzz hf_config_fuzz)
if [[ $# -gt 0 ]]; then targets=("$@"); else targets=("${all[@]}"); fi
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"

# Seeds: files of the kind each target reads, from the repository (the checkpoint and
# corpus of tests/data/checkpoint-v2 among them).
seed() {
  local target=$1 out=$dir/corpus/$1 v2=tests/data/checkpoint-v2
  mkdir -p "$out"
  case $target in
    config_fuzz) cp configs/*.yaml configs/recipes/*.yaml configs/experiments/*.yaml "$out"/ ;;
    data_index_fuzz) cp "$v2/data/index.json" "$out"/ ;;
    checkpoint_index_fuzz) cp "$v2/step-00000003/model.safetensors.index.json" "$out"/ ;;
    safetensors_fuzz) cp "$v2"/step-00000003/model-0000*.safetensors "$out"/ ;;
    shard_header_fuzz) cp "$v2/data/val-00000.bin" "$out"/ ;;
    skew_fuzz) cp configs/plan/published/*.jsonl "$out"/ ;;
    trainer_state_fuzz) cp "$v2/step-00000003/trainer_state.json" "$out"/ ;;
    hf_config_fuzz) cp tests/fuzz/seeds/*-config.json "$out"/ ;;
  esac
}
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
failed=0
for t in "${targets[@]}"; do
  seed "$t"
  mkdir -p "$dir/crashes/$t"
  echo "fuzz.sh: $t for ${SECONDS_EACH:-60} s"
  if ! "$dir/bin/$t" -max_total_time="${SECONDS_EACH:-60}" -max_len=65536 -timeout=10 \
      -rss_limit_mb=4096 -artifact_prefix="$dir/crashes/$t/" "$dir/corpus/$t" \
      >"$dir/$t.log" 2>&1; then
    echo "fuzz.sh: $t failed; its input is in $dir/crashes/$t/, the log in $dir/$t.log" >&2
    tail -30 "$dir/$t.log" >&2
    failed=1
  fi
done
exit $failed
