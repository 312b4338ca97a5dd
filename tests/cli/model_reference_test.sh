#!/usr/bin/env bash
# docs/model.md is exact: docs/model_reference.py, a numpy implementation written from that
# page alone, reproduces `switchyard eval`'s validation loss (relative 1e-7) on checkpoints
# of tiny models that between them use every option of the decoder and the MoE layer:
# layernorm/rmsnorm, learned/rope, gelu/relu/swiglu, biases, GQA, heads wider than
# d_model / n_heads (model.head_dim), tied/untied head, top-1/2,
# normalised gates, GShard's random second expert, capacity dropping by position and by
# probability, dropless, shared experts and the expert bias, sigmoid scores (normalised and
# raw gates), node-limited routing (moe.route_groups), the routed scaling factor and the
# three aux-loss scopes; the
# reported aux loss (eval mode) equals the reference's too (relative 1e-6: the f32 prob
# sums against float64).
# Needs python3 with numpy; exits 77 (ctest: skipped) with the reason when it is missing.
# Usage: model_reference_test.sh path/to/switchyard path/to/docs/model_reference.py
set -u
bin="$1"
reference="$2"
python=/usr/bin/python3  # Debian's python3-numpy (scripts/setup.sh installs it)
[[ -x $python ]] || python=python3
if ! $python -c "import numpy" 2>/dev/null; then
  echo "SKIPPED: python3 with numpy is not installed (pip install numpy), so $reference is not checked"
  exit 77
fi
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mkdir -p "$tmp/corpus"
for i in $(seq 1 150); do
  printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg und die katze schlief im haus\n\n' "$i" >>"$tmp/corpus/de.txt"
done
"$bin" prep --out "$tmp/data" --vocab 120 --val-fraction 0.2 --seed 1 \
  "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" >"$tmp/prep.out" 2>&1 ||
  { echo "FAIL: prep: $(cat "$tmp/prep.out")"; exit 1; }

train_common="train: {lr: 0.01, warmup_steps: 1, max_steps: 4, micro_batch_size: 3, eval_every: 4, eval_batches: 2}
data: {dir: $tmp/data}"
# name -> model and moe sections.
declare -A models=(
  [switch]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32}
moe: {num_experts: 4, top_k: 1, d_expert: 16, capacity_factor: 1.0, eval_capacity_factor: 0.8, jitter_eps: 0.1, z_loss_coef: 0.01}"
  [gshard]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 3, n_heads: 2, d_ff: 32, activation: relu, bias: false, scaled_init: true}
moe: {num_experts: 4, layer_freq: 1, top_k: 2, d_expert: 8, activation: relu, normalize_gates: true, second_expert_policy: random, drop_policy: probability, capacity_factor: 0.5, eval_capacity_factor: 0.6}"
  [mixtral]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, norm: rmsnorm, position: rope, activation: swiglu, bias: false, tie_embeddings: false}
moe: {num_experts: 4, layer_freq: 1, top_k: 2, d_expert: 8, activation: swiglu, normalize_gates: true, capacity_factor: 0, eval_capacity_factor: 0}"
  [shared]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 1, d_ff: 24, position: rope, activation: swiglu, bias: true}
moe: {num_experts: 4, top_k: 2, d_expert: 8, activation: gelu, bias: true, num_shared_experts: 2, d_shared: 6, expert_bias_rate: 0.01, eval_capacity_factor: 1.0}"
  [deepseek]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 4, norm: rmsnorm, position: rope, activation: swiglu, bias: false}
moe: {num_experts: 8, layer_freq: 1, top_k: 3, d_expert: 8, activation: swiglu, score: sigmoid, normalize_gates: true, route_groups: 4, route_group_topk: 2, expert_bias_rate: 0.01, aux_loss_scope: sequence, aux_loss_coef: 0.1, num_shared_experts: 1, routed_scaling_factor: 2.5, capacity_factor: 0, eval_capacity_factor: 0}"
  [qwen]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, head_dim: 8, d_ff: 32, norm: rmsnorm, position: rope}
moe: {num_experts: 8, layer_freq: 1, top_k: 2, d_expert: 8, normalize_gates: true, route_groups: 2, route_group_topk: 1, aux_loss_scope: global, aux_loss_coef: 0.1, eval_capacity_factor: 1.0}"
  [sigmoid1]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32}
moe: {num_experts: 4, top_k: 1, d_expert: 16, score: sigmoid, route_groups: 4, route_group_topk: 2, eval_capacity_factor: 0.8, aux_loss_coef: 0.1}"
)
for name in switch gshard mixtral shared deepseek qwen sigmoid1; do
  printf '%s\n%s\n' "${models[$name]}" "$train_common" >"$tmp/$name.yaml"
  "$bin" train --config "$tmp/$name.yaml" --out "$tmp/$name" >"$tmp/$name.train" 2>&1 ||
    { fail "$name: train: $(tail -3 "$tmp/$name.train")"; continue; }
  "$bin" eval --checkpoint "$tmp/$name" --json >"$tmp/$name.eval" 2>&1 ||
    { fail "$name: eval: $(cat "$tmp/$name.eval")"; continue; }
  $python "$reference" "$tmp/$name/step-00000004" "$tmp/data" >"$tmp/$name.ref" 2>&1 ||
    { fail "$name: $reference: $(tail -5 "$tmp/$name.ref")"; continue; }
  result=$($python -c "import json
a = json.load(open('$tmp/$name.eval')); b = json.load(open('$tmp/$name.ref'))
ok = a['tokens'] == b['tokens'] and abs(a['loss'] - b['loss']) <= 1e-7 * a['loss']
ok = ok and abs(a['aux_loss'] - b['aux_loss']) <= 1e-6 * abs(b['aux_loss'])
print(('ok' if ok else 'MISMATCH') + ' switchyard %.9f reference %.9f (%d tokens), aux %.9g reference %.9g' % (a['loss'], b['loss'], b['tokens'], a['aux_loss'], b['aux_loss']))")
  echo "$name: $result"
  [[ "$result" == ok* ]] || fail "$name: $result"
done

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "docs/model_reference.py reproduces switchyard eval on every variant"
