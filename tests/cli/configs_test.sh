#!/usr/bin/env bash
# Every config in configs/ parses, validates and dry-runs (`switchyard train --dry-run`),
# and the real-size ones have their published sizes:
#   mixtral-8x7b     46.7B total, 12.9B active per token (within 1%)
#   glam-64          GLaM (1.7B/64E): 27B total (within 2%)
#   switch-base-128  7.4B with 24 layers, the decoder-only equivalent of Switch-Base-128's
#                    12 encoder + 12 decoder layers (within 3%); the config's own 12 layers
#                    hold half the experts (3.7B)
# moe-layer-example.yaml is a `switchyard moe-layer` config, not a model, and is skipped.
# Pipeline parallelism (switch-tiny, 4 layers): the dry-run's pipeline section for 1F1B
# pp 2 and GPipe pp 4 — the lists checked OK, the analytic bubble (p-1)/(m+p-1), each
# stage's layers and micro-batches in flight (1F1B: pp - stage; GPipe: m), its activation
# memory = in flight x one micro-batch's, one workspace row per pipeline rank — and more
# stages than layers: exit status 2 and one line naming the setting. ZeRO 1-3 under pp 2 x dp 2:
# each pipeline rank's model states are 12/16, 10/16 and 8/16 of stage 0's.
# Also: docs/config.md has a row for every key of engine/config/config.cc's key tables.
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

# pipeline_case NAME WANT_BUBBLE "IN_FLIGHT..." [--set ...]: the dry-run's pipeline section.
pipeline_case() {
  local name="$1" bubble="$2" flights="$3"; shift 3
  local out="$tmp/pipeline_$name.out"
  if ! "$bin" train --config "$configs/switch-tiny.yaml" --dry-run "$@" >"$out" 2>"$tmp/pipeline.err"; then
    fail "pipeline $name: dry run failed: $(cat "$tmp/pipeline.err")"
    return
  fi
  grep -q "^  action lists: OK (pipeline group \[" "$out" || fail "pipeline $name: no 'action lists: OK'"
  grep -q "^  bubble (analytic, (p-1)/(m+p-1)): $bubble\$" "$out" ||
    fail "pipeline $name: bubble is not $bubble: $(grep bubble "$out")"
  # Stage rows: "stage rank layers... cost in_flight X.XX unit X.XX unit".
  local rows
  rows=$(awk '/^    stage rank/ { on = 1; next } on && /^  memory per pipeline rank/ { on = 0 } on' "$out")
  local got
  got=$(echo "$rows" | awk '{ printf "%s ", $(NF - 4) }')
  [[ "$got" == "$flights " ]] || fail "pipeline $name: in flight per stage '$got', want '$flights '"
  echo "$rows" | awk '
    function bytes(v, u) { return v * (u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1) }
    { one = bytes($(NF - 3), $(NF - 2)); all = bytes($(NF - 1), $NF)
      if (all < 0.99 * $(NF - 4) * one || all > 1.01 * $(NF - 4) * one) { print "stage " $1 ": " $0; bad = 1 } }
    END { exit bad }' >"$tmp/pipeline.bad" ||
    fail "pipeline $name: activations are not in flight x one micro-batch's: $(cat "$tmp/pipeline.bad")"
  local workspace_rows
  workspace_rows=$(awk '/^    rank +model states +peak/ { on = 1; next } on && /^ +[0-9]+ /' "$out" | wc -l)
  [[ $workspace_rows -eq $(echo "$rows" | wc -l) ]] || fail "pipeline $name: $workspace_rows workspace rows"
  echo "pipeline $name: in flight $got, bubble $bubble"
}
pipeline_case 1f1b_pp2_m4 0.2000 "2 1" --set parallel.pp=2 --set train.grad_accum=4
grep -q "^        0    0  embedding + layers 0-1 " "$tmp/pipeline_1f1b_pp2_m4.out" &&
  grep -q "^        1    1  layers 2-3 + head " "$tmp/pipeline_1f1b_pp2_m4.out" ||
  fail "pipeline 1f1b_pp2_m4: the stages are not [embedding + layers 0-1, layers 2-3 + head]"
pipeline_case gpipe_pp4_m8 0.2727 "8 8 8 8" --set parallel.pp=4 --set train.grad_accum=8 \
  --set parallel.pipeline_schedule=gpipe
# ZeRO under pipeline parallelism (world 4: pp 2 x dp 2, every parameter partitioned over
# its stage's 2 data-parallel ranks): each pipeline rank's model states are its stage's 16 P
# at zero 0, 8 P + 8 P / 2 = 12 P at zero 1, 4 P + 12 P / 2 = 10 P at zero 2, 16 P / 2 = 8 P
# at zero 3 (within 1%: the table rounds to 0.01 MiB).
zero_states() {  # zero_states STAGE: the model-state bytes of each pipeline rank
  "$bin" train --config "$configs/switch-tiny.yaml" --dry-run --world 4 --set parallel.pp=2 \
    --set train.grad_accum=4 --set parallel.zero_stage="$1" 2>&1 | awk '
    function bytes(v, u) { return v * (u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1) }
    /^    rank +model states/ { on = 1; next } on && /^ +[0-9]+ / { printf "%.0f ", bytes($2, $3) }'
}
zero0=$(zero_states 0)
[[ $(echo "$zero0" | wc -w) -eq 2 ]] || fail "zero under pp: no model states per pipeline rank: '$zero0'"
for case in "1 12" "2 10" "3 8"; do
  set -- $case
  got=$(zero_states "$1")
  awk -v a="$got" -v b="$zero0" -v k="$2" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ")
    if (n != 2) exit 1
    for (i = 1; i <= n; ++i) if (x[i] < 0.99 * y[i] * k / 16 || x[i] > 1.01 * y[i] * k / 16) exit 1
  }' || fail "zero under pp: zero $1's model states per pipeline rank are '$got', want $2/16 of zero 0's '$zero0'"
done
echo "zero under pp: model states per pipeline rank $zero0 (zero 0) -> $(zero_states 3) (zero 3)"
# More stages than layers: one line on stderr, exit status 2, no report.
"$bin" train --config "$configs/switch-tiny.yaml" --dry-run --set parallel.pp=8 \
  --set train.grad_accum=8 >"$tmp/pp8.out" 2>"$tmp/pp8.err"
rc=$?
want="switchyard train: error: 8 pipeline stages (parallel.pp x parallel.virtual_stages) for 4 layers: every stage needs at least one layer"
[[ $rc -eq 2 ]] || fail "pp 8 over 4 layers: exit status $rc, want 2"
[[ "$(cat "$tmp/pp8.err")" == "$want" ]] || fail "pp 8 over 4 layers: stderr '$(cat "$tmp/pp8.err")', want '$want'"
[[ ! -s "$tmp/pp8.out" ]] || fail "pp 8 over 4 layers: printed a report"

# docs/config.md documents every key of the key tables in engine/config/config.cc.
root="$configs/.."
if [[ -f "$root/engine/config/config.cc" && -f "$root/docs/config.md" ]]; then
  for key in $(grep -o 'Bind[A-Za-z]*("[a-z_0-9]*"' "$root/engine/config/config.cc" | sed 's/.*("//; s/"//' | sort -u); do
    grep -q "^| \`$key\` |" "$root/docs/config.md" || fail "docs/config.md has no row for the config key '$key'"
  done
else
  fail "cannot find engine/config/config.cc and docs/config.md beside $configs"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "configs: $count model configs dry-run; published sizes match; pipeline sections checked; docs/config.md lists every key"
