#!/usr/bin/env bash
# `switchyard plan`: the table and the JSON (rows fastest first, the same on a second run,
# every layout valid for `switchyard mesh`), --config-layout, its peak memory equal to
# `train --dry-run`'s on a GPU, --skew from a routing log, and
# usage errors (one line on stderr, nothing on stdout, exit status 2).
# Usage: plan_cli_test.sh path/to/switchyard REPO
set -u
# shellcheck source=tests/cli/cli_test_lib.sh
source "$(dirname "$0")/cli_test_lib.sh" "$1"
repo=$2
cfg=$repo/configs/switch-tiny.yaml

"$bin" plan --config "$cfg" --gpus 8 --gpu h100 --top 4 >"$tmp/table" 2>&1 || fail "table: exit status $?"
for want in "plan: $cfg on 8 x h100 (8 per node)" "searched " "share: compute tp cp ep dp pp bubble"; do
  grep -qF -- "$want" "$tmp/table" || fail "table lacks '$want'"
done
[[ $(grep -cE '^ +[0-9]+ tp ' "$tmp/table") -eq 4 ]] || fail "table: want 4 rows: $(cat "$tmp/table")"

"$bin" plan --config "$cfg" --gpus 8 --top 6 --json >"$tmp/a.json" 2>&1 || fail "json: exit status $?"
"$bin" plan --config "$cfg" --gpus 8 --top 6 --json >"$tmp/b.json" 2>&1 || fail "json again: exit status $?"
cmp -s "$tmp/a.json" "$tmp/b.json" || fail "two runs differ"
python3 - "$tmp/a.json" >"$tmp/meshes" <<'PY' || fail "json: $(cat "$tmp/meshes")"
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["layouts"]
assert len(rows) == 6, rows
assert all(a["step_s"] <= b["step_s"] for a, b in zip(rows, rows[1:])), "not fastest first"
for r in rows:
    s = r["seconds"]
    assert abs(sum(s.values()) - r["step_s"]) <= 1e-9 * r["step_s"], r
    assert r["fits"] and r["peak_bytes"] > 0
    l = r["layout"]
    assert l["tp"] * l["cp"] * l["pp"] * l["dp"] == 8
    assert l["micro_batch_size"] * l["micro_batches"] * l["dp"] == j["global_batch"]
    print(f'--world 8 --tp {l["tp"]} --cp {l["cp"]} --pp {l["pp"]} --ep {l["ep"]} --etp {l["etp"]}')
PY
while read -r line; do
  # shellcheck disable=SC2086
  "$bin" mesh $line --json >/dev/null 2>"$tmp/err" || fail "mesh rejects a planned layout ($line): $(cat "$tmp/err")"
done <"$tmp/meshes"

"$bin" plan --config "$cfg" --gpus 2 --config-layout --set parallel.ep=2 --json >"$tmp/one.json" ||
  fail "config-layout: exit status $?"
python3 -c "
import json, sys; j = json.load(open('$tmp/one.json')); l = j['layouts'][0]['layout']
assert len(j['layouts']) == 1 and l['ep'] == 2 and l['dp'] == 2, j" || fail "config-layout: $(cat "$tmp/one.json")"

# One memory model: the planner's peak for the config's layout is what `train --dry-run` prints
# for it on a GPU, with activations kept in f32 and in bf16.
for act in fp32 bf16; do
  set_args=(--set parallel.ep=2 --set runtime.precision=bf16 --set runtime.activation_dtype=$act)
  "$bin" plan --config "$cfg" --gpus 2 --config-layout --precision bf16 "${set_args[@]}" >"$tmp/mem" 2>&1 ||
    fail "memory ($act): plan exit status $?: $(cat "$tmp/mem")"
  planned=$(grep -E '^ +1 tp ' "$tmp/mem" | grep -oE '[0-9.]+ [KMG]iB')
  "$bin" train --config "$cfg" --dry-run --world 2 "${set_args[@]}" --set runtime.device=cuda >"$tmp/dry" 2>&1 ||
    fail "memory ($act): dry-run exit status $?: $(cat "$tmp/dry")"
  dry=$(grep -oE '^peak / device \(largest rank [0-9]+\): [0-9.]+ [KMG]iB' "$tmp/dry" | grep -oE '[0-9.]+ [KMG]iB$')
  [[ -n "$planned" && "$planned" == "$dry" ]] || fail "memory ($act): plan says '$planned', the dry-run '$dry'"
  eval "peak_$act=\$planned"
done
[[ "$peak_fp32" != "$peak_bf16" ]] || fail "memory: runtime.activation_dtype=bf16 left the planned peak at $peak_fp32"
# The config is checked on the device the plan is for: bf16 activations with runtime.precision
# auto are valid on a GPU (auto is bf16 there), though not on the CPU the config names by default.
"$bin" plan --config "$cfg" --gpus 2 --config-layout --set parallel.ep=2 \
  --set runtime.activation_dtype=bf16 >"$tmp/auto" 2>&1 || fail "precision auto: exit status $?: $(cat "$tmp/auto")"
auto=$(grep -E '^ +1 tp ' "$tmp/auto" | grep -oE '[0-9.]+ [KMG]iB')
[[ "$auto" == "$peak_bf16" ]] || fail "precision auto: peak '$auto', with bf16 named '$peak_bf16'"

# A routing log whose expert 0 takes half the tokens: ep 2 is slower than with no skew.
echo '{"step": 1, "layers": [1, 3], "tokens_per_expert": [[40,4,4,4,4,4,10,10], [10,10,10,10,10,10,10,10]]}' >"$tmp/routing.jsonl"
even=$("$bin" plan --config "$cfg" --gpus 2 --config-layout --set parallel.ep=2 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['layouts'][0]['seconds']['ep'])")
skewed=$("$bin" plan --config "$cfg" --gpus 2 --config-layout --set parallel.ep=2 --skew "$tmp/routing.jsonl" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['layouts'][0]['seconds']['ep'])")
python3 -c "assert $skewed > $even, ($skewed, $even)" || fail "skew: ep time $skewed not above $even"

# Nothing fits: exit status 1 and the layout that needs the least memory.
"$bin" plan --config "$repo/configs/mixtral-8x7b.yaml" --gpus 8 --gpu a100-40g >"$tmp/none" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "nothing fits: exit status $rc, want 1"
grep -q "^switchyard plan: error: no valid layout fits 40.00 GiB of memory per device; the smallest needs .* GiB (tp " "$tmp/none" ||
  fail "nothing fits: $(cat "$tmp/none")"

expect_usage_error "missing --gpus" "--gpus is required" plan --config "$cfg"
expect_usage_error "missing --config" "--config is required" plan --gpus 8
expect_usage_error "zero gpus" "--gpus=0 must be between 1 and 131072" plan --config "$cfg" --gpus 0
# Above 2^17 ranks: refused at once (every rank would be walked: hours, or out of memory).
expect_usage_error "too many gpus" "--gpus=2147483647 must be between 1 and 131072 (2^17" \
  plan --config "$cfg" --gpus 2147483647
expect_usage_error "zero gpus per node" "--gpus-per-node=0 must be >= 1" \
  plan --config "$cfg" --gpus 8 --gpus-per-node 0
expect_usage_error "gpus per node not dividing" \
  "--gpus-per-node=3 does not divide --gpus=8 (every node holds the same number of devices)" \
  plan --config "$cfg" --gpus 8 --gpus-per-node 3
expect_usage_error "unknown gpu" "--gpu b300: no such hardware (known in" plan --config "$cfg" --gpus 8 --gpu b300
expect_usage_error "bad skew" "--skew 0.5: the busiest rank's load over the mean must be >= 1" \
  plan --config "$cfg" --gpus 8 --skew 0.5
expect_usage_error "bad precision" "--precision fp16 is not one of bf16, fp32, fp8, fp8-cs" \
  plan --config "$cfg" --gpus 8 --precision fp16
expect_usage_error "bf16 activations, fp32 plan" "runtime.activation_dtype=bf16 needs bf16 matrix products, but the plan's precision is fp32" \
  plan --config "$cfg" --gpus 8 --precision fp32 --set runtime.precision=bf16 --set runtime.activation_dtype=bf16
expect_usage_error "bf16 activations, fp32 plan, precision auto" "but the plan's precision is fp32" \
  plan --config "$cfg" --gpus 8 --precision fp32 --set runtime.activation_dtype=bf16
expect_usage_error "indivisible batch" "--gpus 3 is not a multiple of the config's tp*cp*pp = 2" \
  plan --config "$cfg" --gpus 3 --set parallel.tp=2
expect_usage_error "bad config key" "unknown key 'train.nope'" plan --config "$cfg" --gpus 8 --set train.nope=1
expect_usage_error "odd rope head" "model.position=rope needs an even head dim, got model.head_dim = 45" \
  plan --config "$cfg" --gpus 8 --set model.position=rope --set model.head_dim=45
printf 'name: x\ncolour: red\n' >"$tmp/bad.yaml"
expect_usage_error "bad hardware file" "$tmp/bad.yaml: unknown key 'colour'" plan --config "$cfg" --gpus 8 --gpu "$tmp/bad.yaml"
expect_usage_error "config layout invalid" "parallel.ep=3" plan --config "$cfg" --gpus 3 --config-layout --set parallel.ep=3
# A global batch given as 0 or -1 fell back to the config's; one no layout can split ended
# with exit 1, nothing on stderr and "the smallest needs 0.00 B".
expect_usage_error "zero global batch" "--global-batch=0 must be >= 1" plan --config "$cfg" --gpus 8 --global-batch 0
expect_usage_error "negative global batch" "--global-batch=-1 must be >= 1" plan --config "$cfg" --gpus 8 --global-batch -1
expect_usage_error "no layout splits the batch" \
  "no layout of 8 devices is valid for a global batch of 2147483647 sequences" \
  plan --config "$cfg" --gpus 8 --global-batch 2147483647
# A hardware file's gpus_per_node is checked as the flag is.
sed 's/^gpus_per_node: .*/gpus_per_node: 3/' "$repo/configs/hardware/h100.yaml" >"$tmp/three.yaml"
expect_usage_error "hardware file's nodes not dividing" \
  "the hardware file's gpus_per_node=3 ($tmp/three.yaml) does not divide --gpus=8" \
  plan --config "$cfg" --gpus 8 --gpu "$tmp/three.yaml"
# --skew above what any ep can reach (1e308 made the step 90x faster), and files that are
# not a routing log: one line naming the file and what is missing.
expect_usage_error "skew above the world" "--skew 1e308: the busiest expert-parallel rank's load over the mean is at most ep" \
  plan --config "$cfg" --gpus 8 --skew 1e308
echo '{"step": 1, "loss": 4.2}' >"$tmp/metrics.jsonl"
expect_usage_error "skew from metrics.jsonl" "--skew $tmp/metrics.jsonl: its last line has no tokens_per_expert" \
  plan --config "$cfg" --gpus 8 --skew "$tmp/metrics.jsonl"
: >"$tmp/empty.jsonl"
expect_usage_error "skew from an empty file" "--skew $tmp/empty.jsonl: the file is empty" \
  plan --config "$cfg" --gpus 8 --skew "$tmp/empty.jsonl"
expect_usage_error "empty skew" "--skew is empty" plan --config "$cfg" --gpus 8 --skew ""
# A log of another model (3 experts where the model has 8), and a layer that routed nothing.
echo '{"step": 1, "layers": [1], "tokens_per_expert": [[5,5,5]]}' >"$tmp/three.jsonl"
expect_usage_error "skew of another model" "--skew $tmp/three.jsonl: MoE layer 0 has 3 expert counts, but the model has moe.num_experts=8" \
  plan --config "$cfg" --gpus 2 --skew "$tmp/three.jsonl"
echo '{"step": 1, "layers": [1], "tokens_per_expert": [[0,0,0,0,0,0,0,0]]}' >"$tmp/zeros.jsonl"
expect_usage_error "skew of no tokens" "--skew $tmp/zeros.jsonl: MoE layer 0 routed no token" \
  plan --config "$cfg" --gpus 2 --skew "$tmp/zeros.jsonl"

if [[ $failures -gt 0 ]]; then
  echo "plan_cli_test: $failures failure(s)"
  exit 1
fi
echo "plan_cli_test: OK"
