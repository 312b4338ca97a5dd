#!/usr/bin/env bash
# `switchyard pipeline`: the exact output of 1F1B on 2 stages with 3 micro-batches (chart,
# bubble, per-rank table), the action list and the interleaved figures of a known case,
# and usage errors (one line on stderr, nothing on stdout, exit status 2).
# Usage: pipeline_cli_test.sh path/to/switchyard
set -u
# shellcheck source=tests/cli/cli_test_lib.sh
source "$(dirname "$0")/cli_test_lib.sh" "$1"



# 1F1B, pp 2, m 3, forward 1 / backward 2: worked out by hand in
# tests/parallel/pipeline_schedule_test.cc (RenderOneFOneB).
expected_1f1b="schedule validated: every forward and backward once and in dependency order, messages matched in order, no deadlock

1f1b: pp 2, 3 micro-batches, forward 1 / backward 2 time units per stage
rank 0   |ab..AAcBB.CC|
rank 1   |.aAAbBBcCC..|
legend: a-z forward of micro-batch 0-25, A-Z its backward (letters wrap after 26), one letter per time unit, '.' idle
makespan 12 time units
bubble (idle share of the step): measured 0.2500, analytic (p-1)/(m+p-1) = 0.2500

rank  idle share  peak in flight (micro-batches)
   0      0.2500  2
   1      0.2500  1"
expect_ok "1f1b pp 2 m 3" "$expected_1f1b" pipeline --pp 2 --micro-batches 3
expect_ok "1f1b explicit" "$expected_1f1b" pipeline --schedule=1f1b --micro-batches=3 --pp 2 \
  --virtual-stages 1 --forward-cost 1 --backward-cost 2

# --actions appends each rank's list; rank 1 of 1F1B on 2 stages alternates F and B.
"$bin" pipeline --pp 2 --micro-batches 3 --actions >"$tmp/actions" 2>&1 ||
  fail "--actions: exit status $?"
for want in "rank 1 actions" "    2  backward mb 0 chunk 0" \
            "    3  send-gradient mb 0 chunk 0 to rank 0" \
            "    4  recv-gradient mb 0 chunk 0 from rank 1"; do
  grep -qF -- "$want" "$tmp/actions" || fail "--actions lacks '$want'"
done

# GPipe holds every micro-batch; interleaved pp 4, m 8, v 2 measures (p-1)/(vm+p-1) = 3/19.
"$bin" pipeline --pp 4 --micro-batches 8 --schedule gpipe >"$tmp/gpipe" 2>&1 ||
  fail "gpipe: exit status $?"
for want in "rank 0   |abcdefgh.........AABBCCDDEEFFGGHH|" "   3      0.2727  8" \
            "measured 0.2727, analytic (p-1)/(m+p-1) = 0.2727"; do
  grep -qF -- "$want" "$tmp/gpipe" || fail "gpipe lacks '$want'"
done
"$bin" pipeline --pp 4 --micro-batches 8 --schedule interleaved --virtual-stages 2 \
  >"$tmp/inter" 2>&1 || fail "interleaved: exit status $?"
for want in "makespan 57 time units" \
            "measured 0.1579, analytic (p-1)/(v(m+p-1)) = 0.1364, literature (p-1)/(vm+p-1) = 0.1579" \
            "peak in flight (micro-batch chunks)" "   0      0.1579  11" "   3      0.1579  5"; do
  grep -qF -- "$want" "$tmp/inter" || fail "interleaved lacks '$want'"
done

expect_usage_error "unknown schedule" \
  'unknown pipeline schedule "zb" (expected gpipe, 1f1b or interleaved)' \
  pipeline --pp 4 --micro-batches 8 --schedule zb
expect_usage_error "interleaved, m not a multiple of pp" \
  "the interleaved schedule needs micro-batches divisible by pp: 6 micro-batches, pp 4" \
  pipeline --pp 4 --micro-batches 6 --schedule interleaved --virtual-stages 2
expect_usage_error "interleaved without virtual stages" \
  "the interleaved schedule needs virtual stages >= 2, got 1" \
  pipeline --pp 4 --micro-batches 8 --schedule interleaved
expect_usage_error "virtual stages without interleaving" \
  "virtual stages = 2 need the interleaved schedule; the 1f1b schedule has one chunk per rank" \
  pipeline --pp 4 --micro-batches 8 --virtual-stages 2
expect_usage_error "pp 0" "pp must be >= 1, got 0" pipeline --pp 0 --micro-batches 8
expect_usage_error "no micro-batches" "micro-batches must be >= 1, got 0" \
  pipeline --pp 2 --micro-batches 0
expect_usage_error "zero cost" "--backward-cost must be in [1, 1000] time units" \
  pipeline --pp 2 --micro-batches 2 --backward-cost 0
# Costs near 2^31 once wrapped the 32-bit clock and crashed (double free); pp 30000 ran out
# of memory. The ranges are bounded, and so is the chart (16 MiB).
expect_usage_error "huge cost" \
  "--forward-cost must be in [1, 1000] time units (only the ratio of the two costs matters), got 2147483647" \
  pipeline --pp 4 --micro-batches 4 --forward-cost 2147483647 --backward-cost 2147483647
expect_usage_error "too many stages" "--pp must be at most 1024" \
  pipeline --pp 30000 --micro-batches 4
expect_usage_error "chart too large" "the chart would be 32880000 characters (8 lines of 4110000 time units)" \
  pipeline --pp 8 --micro-batches 2048 --forward-cost 1000 --backward-cost 1000
"$bin" pipeline --pp 4 --micro-batches 4 --forward-cost 1000 --backward-cost 1000 >"$tmp/out" 2>&1 &&
  grep -q "makespan 14000 time units" "$tmp/out" || fail "largest costs: $(tail -3 "$tmp/out")"
expect_usage_error "missing --pp" "--pp is required" pipeline --micro-batches 8
expect_usage_error "not an integer" '--micro-batches expects an integer, got "8x"' \
  pipeline --pp 2 --micro-batches 8x
expect_usage_error "unknown flag" "unknown flag --stages" pipeline --stages 2 --micro-batches 2

"$bin" --help >"$tmp/out" 2>&1 && grep -q "pipeline" "$tmp/out" || fail "--help lacks pipeline"
"$bin" pipeline --help >"$tmp/out" 2>&1 && grep -q -- "--micro-batches" "$tmp/out" ||
  fail "pipeline --help"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all switchyard pipeline checks passed"
