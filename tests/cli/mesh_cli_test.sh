#!/usr/bin/env bash
# `switchyard mesh`: the JSON of Megatron-LM's 16-rank example (tp=2, pp=4), both flag
# spellings, and usage errors (one line on stderr, nothing on stdout, exit status 2).
# Usage: mesh_cli_test.sh path/to/switchyard
set -u
# shellcheck source=tests/cli/cli_test_lib.sh
source "$(dirname "$0")/cli_test_lib.sh" "$1"

expected='{"dense":{"tp":[[0,1],[2,3],[4,5],[6,7],[8,9],[10,11],[12,13],[14,15]],"cp":[[0],[1],[2],[3],[4],[5],[6],[7],[8],[9],[10],[11],[12],[13],[14],[15]],"dp":[[0,2],[1,3],[4,6],[5,7],[8,10],[9,11],[12,14],[13,15]],"pp":[[0,4,8,12],[1,5,9,13],[2,6,10,14],[3,7,11,15]]},"expert":{"etp":[[0,1],[2,3],[4,5],[6,7],[8,9],[10,11],[12,13],[14,15]],"ep":[[0],[1],[2],[3],[4],[5],[6],[7],[8],[9],[10],[11],[12],[13],[14],[15]],"edp":[[0,2],[1,3],[4,6],[5,7],[8,10],[9,11],[12,14],[13,15]],"pp":[[0,4,8,12],[1,5,9,13],[2,6,10,14],[3,7,11,15]]},"nodes":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"crosses_nodes":{"dense":{"tp":false,"cp":false,"dp":false,"pp":false},"expert":{"etp":false,"ep":false,"edp":false,"pp":false}}}'



expect_ok "json" "$expected" mesh --world 16 --tp 2 --pp 4 --json
expect_ok "json, --flag=value" "$expected" mesh --world=16 --tp=2 --pp=4 --json
expect_ok "json, flags in any order" "$expected" mesh --json --pp 4 --world 16 --tp=2
expect_ok "json, explicit defaults" "$expected" mesh --world 16 --tp 2 --pp 4 --cp 1 --ep 1 \
  --etp 2 --order tp-cp-ep-dp-pp --json

# The table names every group of both views.
"$bin" mesh --world 16 --tp 2 --pp 4 >"$tmp/table" 2>&1 || fail "table: exit status $?"
for want in "dense view" "expert view" "[0, 4, 8, 12] [1, 5, 9, 13] [2, 6, 10, 14] [3, 7, 11, 15]" \
            "[0, 2] [1, 3] [4, 6] [5, 7] [8, 10] [9, 11] [12, 14] [13, 15]" \
            "rank 5: TP(1/2) CP(0/1) DP(0/2) PP(1/4) | ETP(1/2) EP(0/1) EDP(0/2)"; do
  grep -qF -- "$want" "$tmp/table" || fail "table lacks '$want'"
done

# Nodes: the node of every rank and which groups cross nodes (2 nodes of 4 ranks).
nodes='{"dense":{"tp":[[0,1],[2,3],[4,5],[6,7]],"cp":[[0],[1],[2],[3],[4],[5],[6],[7]],"dp":[[0,2,4,6],[1,3,5,7]],"pp":[[0],[1],[2],[3],[4],[5],[6],[7]]},"expert":{"etp":[[0,1],[2,3],[4,5],[6,7]],"ep":[[0,2],[1,3],[4,6],[5,7]],"edp":[[0,4],[1,5],[2,6],[3,7]],"pp":[[0],[1],[2],[3],[4],[5],[6],[7]]},"nodes":[0,0,0,0,1,1,1,1],"crosses_nodes":{"dense":{"tp":false,"cp":false,"dp":true,"pp":false},"expert":{"etp":false,"ep":false,"edp":true,"pp":false}}}'
expect_ok "json with nodes" "$nodes" mesh --world 8 --tp 2 --ep 2 --ranks-per-node 4 --json
"$bin" mesh --world 8 --tp 2 --ep 2 --ranks-per-node 4 >"$tmp/table" 2>&1 || fail "nodes table: exit status $?"
for want in "2 nodes of 4 ranks" "  dp       4  crosses  [0, 2, 4, 6] [1, 3, 5, 7]" \
            "  tp       2  inside   [0, 1]" "EDP(1/2) | node 1"; do
  grep -qF -- "$want" "$tmp/table" || fail "nodes table lacks '$want'"
done
"$bin" mesh --world 8 --tp 4 --etp 1 --ranks-per-node 2 >"$tmp/table" 2>&1 || fail "note: exit status $?"
grep -qF "note: tp=4 does not fit in a node of 2 ranks" "$tmp/table" || fail "no note on tp across nodes"
expect_usage_error "config key spelling" "unknown flag --ranks_per_node (did you mean --ranks-per-node?)" \
  mesh --world 8 --ranks_per_node 4
expect_usage_error "indivisible nodes" "world size 8 is not divisible by ranks_per_node = 3" \
  mesh --world 8 --ranks-per-node 3

expect_usage_error "indivisible world" "world size 12 is not divisible by tp*cp*pp = 2*1*8 = 16" \
  mesh --world 12 --tp 2 --pp 8
expect_usage_error "indivisible expert world" "etp*ep*pp = 1*8*1 = 8" mesh --world 12 --ep 8
expect_usage_error "bad order" 'unknown axis "xx"' mesh --world 8 --order tp-cp-xx-dp-pp
expect_usage_error "size below one" "tp must be >= 1, got 0" mesh --world 8 --tp 0
expect_usage_error "unknown flag" "unknown flag --foo" mesh --world 8 --foo 3
expect_usage_error "missing value" "--tp needs a value" mesh --world 8 --tp
expect_usage_error "missing value before flag" "--tp needs a value" mesh --world 8 --tp --pp 2
expect_usage_error "not an integer" '--tp expects an integer, got "two"' mesh --world 8 --tp two
expect_usage_error "not an integer (=)" '--pp expects an integer, got "2x"' mesh --world 8 --pp=2x
expect_usage_error "missing --world" "--world is required" mesh --tp 2
expect_usage_error "world 0" "--world=0 must be between 1 and 131072" mesh --world 0
expect_usage_error "world above 2^17" "--world=2147483647 must be between 1 and 131072 (2^17" \
  mesh --world 2147483647
expect_usage_error "world twice" "--world is given twice; give it once" mesh --world 8 --world 4
# SWITCHYARD_THREADS that the pool would ignore: refused at start-up, whatever the command.
for v in abc -1 0 2x 1000000 " 4" "4 " +4; do
  SWITCHYARD_THREADS=$v expect_usage_error "SWITCHYARD_THREADS=$v" \
    "SWITCHYARD_THREADS=$v: takes the number of compute threads, an integer from 1 to 1024" \
    mesh --world 8
done
SWITCHYARD_THREADS=2 "$bin" mesh --world 8 >/dev/null 2>&1 || fail "SWITCHYARD_THREADS=2 refused"
# SWITCHYARD_MPI other than 0 or 1: refused at start-up by every command, also those that
# never start MPI (it was ignored by mesh, prep and pipeline).
for args in "mesh --world 8" "pipeline --pp 2 --micro-batches 2" "prep --out $tmp/p" "plan --help"; do
  # shellcheck disable=SC2086
  SWITCHYARD_MPI=abc expect_usage_error "SWITCHYARD_MPI=abc $args" \
    "SWITCHYARD_MPI=abc: takes 1 (start MPI) or 0 (one rank without MPI)" $args
done
SWITCHYARD_MPI=0 "$bin" mesh --world 8 >/dev/null 2>&1 || fail "SWITCHYARD_MPI=0 refused"
expect_usage_error "value for a switch" "--json takes no value" mesh --world 8 --json=yes
expect_usage_error "unknown command" 'unknown command "bogus"' bogus
expect_usage_error "no command" "no command given"

"$bin" --help >"$tmp/out" 2>&1 && grep -q "mesh" "$tmp/out" || fail "--help does not list mesh"
"$bin" mesh --help >"$tmp/out" 2>&1 && grep -q -- "--world" "$tmp/out" || fail "mesh --help"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all switchyard mesh checks passed"
