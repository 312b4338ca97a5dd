#!/usr/bin/env bash
# The PyTorch training references (benchmarks/reference/train_torch.py, and the GPU one
# train_torch_gpu.py, run here on the CPU with its fallbacks) are the same model as
# `switchyard train`: from the same checkpoint and batches it reproduces each step's loss of
# a Switchyard run to a relative 1e-5 over 2 steps, on switch-tiny (jitter, z-loss,
# capacity, learned positions, biases), gshard-tiny (GShard's random second expert,
# normalised gates) and mixtral-tiny (rmsnorm, rope, grouped-query attention, swiglu
# experts, dropless, untied head). And the check
# can fail: against a run trained with another aux_loss_coef it reports a mismatch.
# No timing. Needs Debian's python3-torch (scripts/setup.sh installs it); exits 77 (ctest:
# skipped) with the reason when it is missing.
# Usage: train_torch_test.sh path/to/switchyard path/to/train_batches
set -u
bin="$1"
batches_bin="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
python=/usr/bin/python3
if ! $python -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: $python cannot import torch and numpy (apt-get install python3-torch), so the PyTorch reference is not checked"
  exit 77
fi
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mkdir -p "$tmp/corpus"
for i in $(seq 1 200); do
  printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg und die katze schlief im haus\n\n' "$i" >>"$tmp/corpus/de.txt"
done
"$bin" prep --out "$tmp/data" --vocab 120 --val-fraction 0.1 --seed 1 \
  "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" >"$tmp/prep.out" 2>&1 ||
  { echo "FAIL: prep: $(cat "$tmp/prep.out")"; exit 1; }

$python "$root/benchmarks/reference/compare_train.py" --switchyard "$bin" \
  --train_batches "$batches_bin" --data "$tmp/data" --out "$tmp/out" \
  --configs "$root/configs/switch-tiny.yaml $root/configs/gshard-tiny.yaml $root/configs/mixtral-tiny.yaml" \
  --check_only --check_steps 2 --rtol 1e-5 >"$tmp/check.out" 2>&1 ||
  fail "the loss check: $(tail -12 "$tmp/check.out")"
cat "$tmp/check.out"

# The strong GPU reference (benchmarks/reference/train_torch_gpu.py: fused qkv, stacked
# experts, SDPA / grouped_mm where this torch has them, else the fallbacks it prints) is the
# same model too: from the same checkpoints and batches, the same losses.
for name in switch-tiny gshard-tiny mixtral-tiny; do
  w="$tmp/out/train_torch/$name"
  [[ -d "$w/start/step-00000001" ]] || { fail "$name: no start checkpoint"; continue; }
  if $python "$root/benchmarks/reference/train_torch_gpu.py" check --checkpoint "$w/start/step-00000001" \
       --batches "$w/batches.bin" --metrics "$w/check/metrics.jsonl" --steps 2 --rtol 1e-5 \
       >"$tmp/gpu_ref_$name.out" 2>&1; then
    echo "train_torch_gpu.py $name: $(grep -E '^ok' "$tmp/gpu_ref_$name.out")"
  else
    fail "train_torch_gpu.py $name: $(tail -5 "$tmp/gpu_ref_$name.out")"
  fi
done

# A Switchyard run of another model (aux_loss_coef 0.05, the checkpoint says 0.01) must
# not pass the check.
work="$tmp/out/train_torch/switch-tiny"
if [[ -d "$work/start/step-00000001" ]]; then
  "$bin" train --config "$root/configs/switch-tiny.yaml" --set "data.dir=$tmp/data" \
    --set train.eval_every=0 --set moe.aux_loss_coef=0.05 --resume "$work/start/step-00000001" \
    --steps 2 --out "$tmp/other" >"$tmp/other.out" 2>&1 || fail "train: $(tail -3 "$tmp/other.out")"
  $python "$root/benchmarks/reference/train_torch.py" check --checkpoint "$work/start/step-00000001" \
    --batches "$work/batches.bin" --metrics "$tmp/other/metrics.jsonl" --steps 2 --rtol 1e-5 \
    >"$tmp/mismatch.out" 2>&1
  rc=$?
  [[ $rc -eq 1 ]] && grep -q "^MISMATCH" "$tmp/mismatch.out" ||
    fail "a different model passed the check (exit $rc): $(tail -3 "$tmp/mismatch.out")"
  $python "$root/benchmarks/reference/train_torch_gpu.py" check --checkpoint "$work/start/step-00000001" \
    --batches "$work/batches.bin" --metrics "$tmp/other/metrics.jsonl" --steps 2 --rtol 1e-5 \
    >"$tmp/mismatch_gpu.out" 2>&1
  rc=$?
  [[ $rc -eq 1 ]] && grep -q "^MISMATCH" "$tmp/mismatch_gpu.out" ||
    fail "train_torch_gpu.py passed a different model (exit $rc): $(tail -3 "$tmp/mismatch_gpu.out")"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "train_torch.py reproduces switchyard train's losses"
