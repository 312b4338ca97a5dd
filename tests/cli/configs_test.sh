#!/usr/bin/env bash
# Every config in configs/ parses, validates and dry-runs (`switchyard train --dry-run`),
# and the real-size ones have their published sizes:
#   mixtral-8x7b     46.7B total, 12.9B active per token (within 1%)
#   glam-64          GLaM (1.7B/64E): 27B total (within 2%)
#   switch-base-128  7.4B with 24 layers, the decoder-only equivalent of Switch-Base-128's
#                    12 encoder + 12 decoder layers (within 3%); the config's own 12 layers
#                    hold half the experts (3.7B)
# moe-layer-example.yaml is a `switchyard moe-layer` config, not a model, and is skipped.
# Also: docs/config.md has a row for every key of engine/train/config.cc's key tables.
# A config whose layout needs more ranks than this one process (parallel.ep = 8, 16 ...)
# must fail only on the world size; it is then dry-run again with parallel.ep=1, which
# changes the memory per rank but not the counts.
# Usage: configs_test.sh path/to/switchyard path/to/configs
set -u
bin="$1"
configs="$2"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# dry_run NAME [--set ...]: the report in $tmp/NAME.out; returns non-zero on failure.
dry_run() {
  local name="$1"; shift
  local file="$configs/$name.yaml"
  "$bin" train --config "$file" --dry-run "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  if [[ $rc -ne 0 ]] && grep -q "world size 1 is not divisible by" "$tmp/$name.err"; then
    "$bin" train --config "$file" --dry-run "$@" --set parallel.ep=1 >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
  fi
  if [[ $rc -ne 0 ]]; then
    fail "$name: dry run exit status $rc: $(cat "$tmp/$name.err")"
    return 1
  fi
  grep -q "parameters, total" "$tmp/$name.out" || { fail "$name: no report: $(cat "$tmp/$name.out")"; return 1; }
}

# billions NAME "total"|"active": the count the report prints, in billions.
billions() {
  local line
  line=$(grep "parameters, $2" "$tmp/$1.out")
  awk -v l="$line" 'BEGIN {
    n = split(l, w, " "); v = w[n - 1]; u = w[n];
    s = (u == "G") ? 1 : (u == "M") ? 1e-3 : (u == "K") ? 1e-6 : (u == "T") ? 1e3 : 1e-9;
    printf "%.6f", v * s }'
}

# within NAME WHAT GOT WANT REL: |GOT - WANT| <= REL * WANT.
within() {
  awk -v g="$3" -v w="$4" -v r="$5" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= r * w) }' ||
    fail "$1: $2 is ${3}B, want ${4}B within $(awk -v r="$5" 'BEGIN { print r * 100 }')%"
}

count=0
for file in "$configs"/*.yaml; do
  name=$(basename "$file" .yaml)
  [[ "$name" == moe-layer-example ]] && continue
  count=$((count + 1))
  dry_run "$name" || continue
  echo "$name: $(billions "$name" total)B total, $(billions "$name" active)B active"
done
[[ $count -ge 7 ]] || fail "only $count model configs in $configs"

for name in mixtral-8x7b glam-64 switch-base-128; do
  [[ -f "$configs/$name.yaml" ]] || fail "$configs/$name.yaml is missing"
done
if [[ -s "$tmp/mixtral-8x7b.out" ]]; then
  within mixtral-8x7b total "$(billions mixtral-8x7b total)" 46.7 0.01
  within mixtral-8x7b active "$(billions mixtral-8x7b active)" 12.9 0.01
fi
if [[ -s "$tmp/glam-64.out" ]]; then
  within glam-64 total "$(billions glam-64 total)" 27 0.02
fi
if dry_run switch-base-128 --set model.n_layers=24; then
  within "switch-base-128 (24 layers)" total "$(billions switch-base-128 total)" 7.4 0.03
fi

# docs/config.md documents every key of the key tables in engine/train/config.cc.
root="$configs/.."
if [[ -f "$root/engine/train/config.cc" && -f "$root/docs/config.md" ]]; then
  for key in $(grep -o 'Bind[A-Za-z]*("[a-z_0-9]*"' "$root/engine/train/config.cc" | sed 's/.*("//; s/"//' | sort -u); do
    grep -q "^| \`$key\` |" "$root/docs/config.md" || fail "docs/config.md has no row for the config key '$key'"
  done
else
  fail "cannot find engine/train/config.cc and docs/config.md beside $configs"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "configs: $count model configs dry-run; published sizes match; docs/config.md lists every key"
