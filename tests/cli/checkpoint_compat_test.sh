#!/usr/bin/env bash
# A checkpoint written by an earlier build (tests/data/checkpoint-v2, saved under ep 2 on two
# ranks) still verifies, evaluates to the loss that build printed, and resumes on one rank
# with the losses that build trained. Losses compare with a relative bound of 1e-6: they are
# O(1) sums of thousands of f32 terms, and other CPUs' BLAS kernels round in another order.
# Usage: checkpoint_compat_test.sh path/to/switchyard path/to/tests/data/checkpoint-v2
set -u
bin="$(realpath "$1")"
fixture="$(realpath "$2")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cp -r "$fixture" "$tmp/fx"   # nothing is written into the source tree
cd "$tmp/fx" || exit 1
ckpt=step-00000003

"$bin" checkpoint verify "$ckpt" >verify.out 2>&1 || fail "verify: $(cat verify.out)"
"$bin" eval --checkpoint "$ckpt" --set parallel.ep=1 --data data --json >eval.json 2>eval.err ||
  fail "eval: $(cat eval.err)"
mkdir run && cp -r "$ckpt" run/ && echo "$ckpt" >run/latest
"$bin" train --config "$ckpt/config.yaml" --resume run --steps 5 --set parallel.ep=1 \
  --set data.dir=data --out run >resume.out 2>&1 || fail "resume: $(tail -3 resume.out)"

python3 - <<'PY' || failures=$((failures + 1))
import json, sys
want = json.load(open("expected.json"))
def close(a, b):
    return abs(a - b) <= 1e-6 * abs(b)
bad = 0
got = json.load(open("eval.json"))["loss"]
if not close(got, want["eval_loss"]):
    print(f"FAIL: eval loss {got!r}, the earlier build printed {want['eval_loss']!r}"); bad += 1
rows = {str(r["step"]): r["loss"] for r in map(json.loads, open("run/metrics.jsonl"))
        if "loss" in r}
for step, loss in want["resumed_losses"].items():
    if step not in rows or not close(rows[step], loss):
        print(f"FAIL: resumed step {step}: loss {rows.get(step)!r}, expected {loss!r}"); bad += 1
print(f"eval loss {got!r}; resumed {[rows.get(s) for s in want['resumed_losses']]}")
sys.exit(1 if bad else 0)
PY
[ "$failures" = 0 ] && echo "PASS: checkpoint-v2 verifies, evaluates and resumes as written" && exit 0
exit 1
