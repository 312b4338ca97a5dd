#!/usr/bin/env bash
# `switchyard train --profile`: the per-phase profile is printed at the end and written to
# OUT/profile.json with every phase present, none negative, the phases at most the step
# time and phases + other equal to it, and the step time the sum of metrics.jsonl's
# step_s; the phases the model runs (attention, dense MLP, router, dispatch, experts,
# combine, optimizer, embedding/head/loss) are non-zero, so every timer is wired. Without
# --profile nothing is written; --profile with --dry-run is a usage error. Under mpirun
# (2 ranks, ep 2: real all-to-alls) when MPI is built in, with and without
# moe.overlap_chunks: the token all-to-all's time in flight is its exposed plus its hidden
# time, nothing is hidden without chunks and one rank has none. Structure only, never a speed.
# Usage: profile_cli_test.sh path/to/switchyard [path/to/scripts/mpirun_test.sh]
source "$(dirname "$0")/cli_test_lib.sh" "$1"
mpirun_script="${2:-}"
python=/usr/bin/python3
[[ -x $python ]] || python=python3

mkdir -p "$tmp/corpus"
for i in $(seq 1 120); do
  printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg und die katze schlief im haus\n\n' "$i" >>"$tmp/corpus/de.txt"
done
"$bin" prep --out "$tmp/data" --vocab 120 --val-fraction 0.2 --seed 1 \
  "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" >"$tmp/prep.out" 2>&1 ||
  { echo "FAIL: prep: $(cat "$tmp/prep.out")"; exit 1; }
cat >"$tmp/model.yaml" <<YAML
model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32}
moe: {num_experts: 4, top_k: 2, d_expert: 16, capacity_factor: 1.5}
train: {lr: 0.01, warmup_steps: 1, max_steps: 20, micro_batch_size: 4, eval_every: 2, eval_batches: 1}
data: {dir: $tmp/data}
YAML

# check_profile NAME RUN_DIR STDOUT
check_profile() {
  local name="$1" run="$2" out="$3"
  grep -q "^profile over 3 step(s)" "$out" || fail "$name: no profile table in stdout: $(tail -5 "$out")"
  local result
  result=$($python - "$run" <<'PY'
import json, sys
run = sys.argv[1]
p = json.load(open(f"{run}/profile.json"))
names = ["embedding_head_loss", "attention", "norms", "dense_mlp", "router", "dispatch",
         "experts", "combine", "communication", "optimizer", "other"]
ph = p["phases"]
problems = [f"missing {n}" for n in names if n not in ph]
problems += [f"{n} = {v} < 0" for n, v in ph.items() if v < 0]
phases = sum(v for n, v in ph.items() if n != "other")
step_s = sum(json.loads(l).get("step_s", 0) for l in open(f"{run}/metrics.jsonl") if l.strip())
if p["steps"] != 3: problems.append(f"steps {p['steps']}, want 3")
if phases > p["step_s"] * (1 + 1e-9): problems.append(f"phases {phases} > step time {p['step_s']}")
if abs(phases + ph["other"] - p["step_s"]) > 1e-6 * p["step_s"]:
    problems.append(f"phases + other {phases + ph['other']} != step time {p['step_s']}")
if abs(step_s - p["step_s"]) > 1e-6 * p["step_s"]:
    problems.append(f"step time {p['step_s']} != metrics.jsonl's {step_s}")
for n in ["embedding_head_loss", "attention", "dense_mlp", "router", "dispatch", "experts",
          "combine", "optimizer"]:
    if not ph.get(n, 0) > 0: problems.append(f"{n} never timed")
print("; ".join(problems) if problems else "ok")
PY
)
  [[ "$result" == ok ]] || fail "$name: $result"
}

"$bin" train --config "$tmp/model.yaml" --steps 3 --out "$tmp/run" --profile >"$tmp/run.out" 2>&1 ||
  fail "train --profile: $(tail -3 "$tmp/run.out")"
check_profile "one rank" "$tmp/run" "$tmp/run.out"

"$bin" train --config "$tmp/model.yaml" --steps 3 --out "$tmp/plain" >"$tmp/plain.out" 2>&1 ||
  fail "train: $(tail -3 "$tmp/plain.out")"
[[ ! -e "$tmp/plain/profile.json" ]] || fail "profile.json written without --profile"
grep -q "^profile over" "$tmp/plain.out" && fail "profile table printed without --profile"

expect_usage_error "profile with dry-run" "--profile needs training" \
  train --config "$tmp/model.yaml" --dry-run --profile

if [[ -n "$mpirun_script" ]]; then
  bash "$mpirun_script" 2 "$bin" train --config "$tmp/model.yaml" --steps 3 --out "$tmp/ep2" \
    --set parallel.ep=2 --profile >"$tmp/ep2.out" 2>&1 || fail "mpirun 2 train --profile: $(tail -3 "$tmp/ep2.out")"
  check_profile "2 ranks, ep 2" "$tmp/ep2" "$tmp/ep2.out"
  $python -c "import json,sys; p=json.load(open('$tmp/ep2/profile.json'))['phases']; sys.exit(0 if p['communication'] > 0 else 1)" ||
    fail "2 ranks: the gradient sync was never timed as communication"
  # The token all-to-alls: in flight = exposed + hidden; without chunks nothing is hidden.
  bash "$mpirun_script" 2 "$bin" train --config "$tmp/model.yaml" --steps 3 --out "$tmp/ep2c" \
    --set parallel.ep=2 --set moe.overlap_chunks=2 --profile >"$tmp/ep2c.out" 2>&1 ||
    fail "mpirun 2 train --profile with overlap chunks: $(tail -3 "$tmp/ep2c.out")"
  check_profile "2 ranks, ep 2, 2 overlap chunks" "$tmp/ep2c" "$tmp/ep2c.out"
  grep -q "^token all-to-all: .* exposed .* hidden" "$tmp/ep2c.out" ||
    fail "no token all-to-all line in the profile table"
  result=$($python - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
problems = []
for run, chunked in (("run", None), ("ep2", False), ("ep2c", True)):
    a = json.load(open(f"{tmp}/{run}/profile.json"))["all_to_all"]
    total, exposed, hidden = a["in_flight_s"], a["exposed_s"], a["hidden_s"]
    if min(total, exposed, hidden) < 0: problems.append(f"{run}: negative {a}")
    if abs(exposed + hidden - total) > 1e-9 + 1e-6 * total: problems.append(f"{run}: {a} does not add up")
    if chunked is None and total != 0: problems.append(f"one rank has token all-to-alls: {a}")
    if chunked is not None and not total > 0: problems.append(f"{run}: token all-to-alls never timed")
    if chunked is False and hidden != 0: problems.append(f"{run}: hidden without chunks: {a}")
print("; ".join(problems) if problems else "ok")
PY
)
  [[ "$result" == ok ]] || fail "all_to_all in profile.json: $result"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "switchyard train --profile: every phase present, non-negative, summing to the step time"
