#!/usr/bin/env bash
# The reference recipes at their real sizes (configs/recipes/*.yaml, docs/recipes.md): each
# dry-run (`switchyard train --config C --dry-run`, planning for plan.world ranks) must
#  - count the published parameters (within 2%);
#  - print the largest rank's peak, the device memory its authors used and the margin,
#    with margin = device - peak (to the printed 0.01 GiB) and "fits: yes" iff margin >= 0;
#  - exit 0 when the peak fits and 1 when it does not;
#  - fit the memory its authors used: every recipe says "fits: yes".
# And Mixtral 8x7B on 64 ranks of 80 GiB (configs/mixtral-8x7b.yaml): its layout fits (exit
# 0) and --search lists layouts that fit, each row's peak <= 80 GiB.
# Usage: recipes_dry_run_test.sh path/to/switchyard path/to/configs
set -u
bin="$1"
configs="$2"
failures=0
tmp="$(mktemp -d)"
trap "rm -rf $tmp" EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# GiB TEXT: "12.34 GiB" or "5.00 MiB" as GiB.
gib() { awk -v v="$1" -v u="$2" 'BEGIN { s = u == "GiB" ? 1 : u == "MiB" ? 1 / 1024 : u == "TiB" ? 1024 : 0; printf "%.4f", v * s }'; }

# recipe NAME BILLIONS
recipe() {
  local name="$1" billions="$2" out="$tmp/$1.out"
  "$bin" train --config "$configs/recipes/$name.yaml" --dry-run >"$out" 2>"$tmp/$name.err"
  local rc=$?
  local total
  total=$(awk '/parameters, total/ { v = $(NF - 1); u = $NF; print (u == "T" ? v * 1000 : u == "G" ? v : v / 1000) }' "$out")
  awk -v g="$total" -v w="$billions" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 0.02 * w) }' ||
    fail "$name: ${total}B parameters, published ${billions}B"
  local peak_line device_line
  peak_line=$(grep -a '^peak / device' "$out") device_line=$(grep -a '^  device .*fits: ' "$out")
  [[ -n $peak_line && -n $device_line ]] || { fail "$name: no fit lines: $(cat "$tmp/$name.err")"; return; }
  local peak device margin verdict
  peak=$(gib $(echo "$peak_line" | sed 's/.*): \([0-9.]*\) \([KMGT]iB\) = .*/\1 \2/'))
  device=$(gib $(echo "$device_line" | sed 's/^  device \([0-9.]*\) \([KMGT]iB\) .*/\1 \2/'))
  margin=$(echo "$device_line" | sed 's/.*margin \(-\{0,1\}\)\([0-9.]*\) \([KMGT]iB\) .*/\1 \2 \3/')
  margin=$(awk -v s="$(echo "$margin" | cut -d' ' -f1)" -v m="$(gib $(echo "$margin" | awk '{ print $(NF - 1), $NF }'))" 'BEGIN { print (s == "-" ? -m : m) }')
  verdict=$(echo "$device_line" | sed 's/.*fits: //')
  awk -v p="$peak" -v d="$device" -v m="$margin" 'BEGIN { e = d - p - m; if (e < 0) e = -e; exit !(e <= 0.011) }' ||
    fail "$name: margin $margin GiB is not device $device - peak $peak"
  local want_verdict
  want_verdict=$(awk -v m="$margin" 'BEGIN { print (m >= 0 ? "yes" : "no") }')
  [[ $verdict == "$want_verdict" ]] || fail "$name: 'fits: $verdict' with margin $margin GiB"
  [[ $verdict == yes && $rc -eq 0 || $verdict == no && $rc -eq 1 ]] || fail "$name: fits: $verdict but exit status $rc"
  [[ $verdict == yes ]] || fail "$name: does not fit the $device GiB its authors used (peak $peak GiB)"
  echo "$name: ${total}B, peak $peak GiB of $device GiB (margin $margin GiB, fits: $verdict, exit $rc)"
}
recipe bloom-176b 176
recipe codegeex-13b 13
recipe glm-130b 130
recipe opt-175b 175
recipe mt-nlg-530b 530

# Mixtral 8x7B: the shipped layout fits 64 x 80 GiB and the search lists others.
out="$tmp/mixtral.out"
"$bin" train --config "$configs/mixtral-8x7b.yaml" --dry-run --search >"$out" 2>"$tmp/mixtral.err"
rc=$?
[[ $rc -eq 0 ]] || fail "mixtral-8x7b: exit status $rc: $(cat "$tmp/mixtral.err")"
grep -q "^layout: world 64 " "$out" || fail "mixtral-8x7b: not planned for 64 ranks"
grep -q '^  device 80.00 GiB .*fits: yes$' "$out" || fail "mixtral-8x7b: its layout does not fit 80 GiB: $(grep '^  device' "$out")"
rows=$(awk '/^ +peak +margin/ { on = 1; next } on && /GiB/' "$out")
[[ -n $rows ]] || fail "mixtral-8x7b: the search lists no layout"
echo "$rows" | awk '{ if ($2 == "GiB" && $1 > 80) bad = 1 } END { exit bad }' || fail "mixtral-8x7b: a listed peak exceeds 80 GiB: $rows"
echo "mixtral-8x7b: $(echo "$rows" | wc -l) layouts listed; first: $(echo "$rows" | head -1)"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "recipes: five real-size dry-runs checked against their published memory; mixtral-8x7b fits 64 x 80 GiB"
