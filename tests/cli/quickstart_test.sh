#!/usr/bin/env bash
# The README's first command stays quick (scripts/quickstart.sh -> scripts/setup.sh --quick):
#   - it installs the main job's Debian packages and none of the test-only ones (chromium,
#     PyTorch, matplotlib, GoogleTest, Google Benchmark), while the full set (scripts/test.sh)
#     keeps them;
#   - configured as it configures a fresh build dir, the build graph holds no test or
#     benchmark target, and building its targets builds `switchyard` and the sy_* libraries it
#     links, nothing else (no CUDA object unless a GPU is visible or SWITCHYARD_CUDA=ON).
# Reads `setup.sh --print` (changes nothing), then runs the printed configure into a scratch
# dir and asks ninja for a dry run. Usage: quickstart_test.sh REPO_ROOT
set -u
root="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cd "$root" || exit 1

grep -q 'scripts/setup.sh --quick' scripts/quickstart.sh || fail "quickstart.sh does not run setup.sh --quick"

# ---- packages -------------------------------------------------------------------------------
unset SWITCHYARD_CUDA SWITCHYARD_CMAKE_ARGS
export SWITCHYARD_BUILD_DIR="$tmp/build"
bash scripts/setup.sh --quick --print >"$tmp/quick" 2>&1 || fail "setup.sh --quick --print: exit status $?"
bash scripts/setup.sh --print >"$tmp/full" 2>&1 || fail "setup.sh --print: exit status $?"
quick_pkgs=" $(sed -n 's/^packages: //p' "$tmp/quick") "
full_pkgs=" $(sed -n 's/^packages: //p' "$tmp/full") "
for p in cmake ninja-build g++ openmpi-bin libopenmpi-dev libabsl-dev libopenblas-dev \
         libyaml-cpp-dev nlohmann-json3-dev libsentencepiece-dev zlib1g-dev libzstd-dev \
         fortunes fortunes-de fortunes-es fortunes-it fortunes-br; do
  [[ "$quick_pkgs" == *" $p "* ]] || fail "quick start does not install $p"
  [[ "$full_pkgs" == *" $p "* ]] || fail "full set does not install $p"
done
for p in chromium python3-torch python3-matplotlib libgtest-dev libgmock-dev libbenchmark-dev; do
  [[ "$quick_pkgs" != *" $p "* ]] || fail "quick start installs the test-only package $p"
  [[ "$full_pkgs" == *" $p "* ]] || fail "full set lacks $p (scripts/test.sh needs it)"
done

# ---- what the quick build builds ------------------------------------------------------------
configure=$(sed -n 's/^configure: //p' "$tmp/quick")
build=$(sed -n 's/^build: //p' "$tmp/quick")
[[ "$configure" == *"-DSWITCHYARD_TESTS=OFF"* && "$configure" == *"-DSWITCHYARD_BENCHMARKS=OFF"* ]] ||
  fail "quick configure does not switch tests and benchmarks off: $configure"
[[ "$build" == *"--target switchyard "* ]] || fail "quick build is not --target switchyard: $build"
gpu=0
[ -e /dev/nvidia0 ] && gpu=1
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu=1
if [ $gpu = 0 ]; then
  [[ "$configure" == *"-DSWITCHYARD_CUDA=OFF"* ]] || fail "no GPU visible, yet the quick configure does not switch CUDA off: $configure"
else
  echo "note: a GPU is visible here, so the quick build may include the CUDA backend"
fi
[[ "$(SWITCHYARD_CUDA=ON bash scripts/setup.sh --quick --print)" == *"-DSWITCHYARD_CUDA=ON"* ]] ||
  fail "SWITCHYARD_CUDA=ON does not reach the quick configure"
# Full set: everything, CUDA whenever nvcc is found (CI compiles it).
grep -q -- "-DSWITCHYARD_TESTS=ON .*-DSWITCHYARD_CUDA=AUTO" "$tmp/full" || fail "full configure: $(grep configure: "$tmp/full")"
grep -q -- "--target" "$tmp/full" && fail "full build is limited to a target: $(grep build: "$tmp/full")"

eval "$configure" >"$tmp/configure.log" 2>&1 || { fail "quick configure failed:"; tail -20 "$tmp/configure.log"; }
if [ -f "$tmp/build/build.ninja" ]; then
  ninja -C "$tmp/build" -t targets all >"$tmp/targets" 2>&1 || fail "ninja -t targets failed"
  # No test or benchmark target is configured at all.
  if grep -Eq '^(bin/)?[a-z_]*(_test|_perf)(:| )' "$tmp/targets"; then
    fail "quick configure has test/benchmark targets: $(grep -Eo '^(bin/)?[a-z_]*(_test|_perf)' "$tmp/targets" | head -5 | tr '\n' ' ')"
  fi
  targets=$(sed -E 's/.*--target ([^ ]+).*/\1/' <<<"$build")
  ninja -C "$tmp/build" -n "$targets" >"$tmp/dry" 2>&1 || fail "ninja -n $targets failed"
  grep -q 'Linking CXX executable bin/switchyard$' "$tmp/dry" || fail "the quick build does not link bin/switchyard"
  # Every link step is switchyard or one of our sy_* static libraries; every object belongs
  # to one of them; nothing is compiled by nvcc when CUDA is off.
  while read -r line; do
    out=${line##* }
    case "$line" in
      *"Linking CXX executable bin/switchyard") ;;
      *"Linking CXX static library lib/libsy_"*.a) ;;
      *"Linking"*) fail "the quick build links $out" ;;
      *"Building CXX object"*) [[ "$out" =~ CMakeFiles/(sy_[a-z_]+|switchyard)\.dir/ ]] || fail "the quick build compiles $out" ;;
      *"Building CUDA object"*) [ $gpu = 1 ] || fail "the quick build compiles CUDA: $out" ;;
    esac
  done < <(grep -E '^\[[0-9]+/[0-9]+\] ' "$tmp/dry")
  echo "quick build: $(grep -c 'Building' "$tmp/dry") compiles, $(grep -c 'Linking' "$tmp/dry") links"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "quick start: packages and build graph as expected"
