#!/usr/bin/env bash
# The Hugging Face bridge: tiny Mixtral-style checkpoints (GQA with an untied head, and a
# tied one) exported with `switchyard export --format hf-mixtral` load in transformers'
# MixtralForCausalLM (4.38.2, pip-installed into a venv under the build directory that
# uses Debian's torch) and give the validation loss `switchyard eval` prints (relative
# 1e-5, fp32); `switchyard import` of the export reproduces every original tensor bit for
# bit and the same eval loss. Configs Mixtral cannot express, and bad inputs (config.json
# values, keys that change the model without a Switchyard equivalent), are one line.
# Exits 77 (skipped) with the reason when PyPI cannot be reached to install transformers.
# Usage: hf_mixtral_cli_test.sh path/to/switchyard path/to/docs/model_reference.py
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
reference="$2"
build="$(cd "$(dirname "$bin")/.." && pwd)"
venv="$build/hf-venv"
if ! "$venv/bin/python" -c "import transformers; assert transformers.__version__ == '4.38.2'" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv" >"$tmp/venv.out" 2>&1 &&
    "$venv/bin/pip" install -q transformers==4.38.2 >>"$tmp/venv.out" 2>&1
  if ! "$venv/bin/python" -c "import transformers" 2>/dev/null; then
    if ! "$venv/bin/pip" download -q --no-deps -d "$tmp/probe" six >/dev/null 2>&1; then
      echo "SKIPPED: PyPI is unreachable, so transformers 4.38.2 cannot be installed: $(tail -1 "$tmp/venv.out")"
      exit 77
    fi
    echo "FAIL: installing transformers 4.38.2 into $venv failed: $(tail -3 "$tmp/venv.out")"; exit 1
  fi
fi
"$venv/bin/python" -c "import torch" 2>/dev/null ||
  { echo "FAIL: the venv sees no torch (Debian's python3-torch; scripts/setup.sh installs it)"; exit 1; }

make_corpus "$tmp/data"
mixtral="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, norm: rmsnorm, position: rope, activation: swiglu, bias: false, tie_embeddings: false}
moe: {num_experts: 4, layer_freq: 1, top_k: 2, d_expert: 8, activation: swiglu, normalize_gates: true, capacity_factor: 0, eval_capacity_factor: 0}
train: {lr: 0.01, warmup_steps: 1, max_steps: 4, micro_batch_size: 3, eval_every: 4, eval_batches: 2}
data: {dir: $tmp/data}"
printf '%s\n' "$mixtral" >"$tmp/mixtral.yaml"

for variant in untied tied; do
  sets=()
  [[ $variant == tied ]] && sets=(--set model.tie_embeddings=true --set model.n_kv_heads=4 --set moe.top_k=1)
  "$bin" train --config "$tmp/mixtral.yaml" --out "$tmp/$variant" "${sets[@]}" >"$tmp/train.out" 2>&1 ||
    { fail "$variant: train: $(tail -3 "$tmp/train.out")"; continue; }
  "$bin" eval --checkpoint "$tmp/$variant" --json >"$tmp/$variant.eval" 2>&1 || { fail "$variant: eval"; continue; }
  "$bin" export --format hf-mixtral "$tmp/$variant" "$tmp/$variant-hf" >"$tmp/export.out" 2>&1 ||
    { fail "$variant: export: $(cat "$tmp/export.out")"; continue; }
  # Floats as their shortest text (the f32 1e-5 widened to a double is 9.99999974737875e-06).
  for kv in '"rms_norm_eps": 1e-05' '"initializer_range": 0.02' '"router_aux_loss_coef": 0.01' '"rope_theta": 10000.0'; do
    grep -qF "$kv" "$tmp/$variant-hf/config.json" || fail "$variant: config.json lacks $kv: $(cat "$tmp/$variant-hf/config.json")"
  done
  check=$("$venv/bin/python" -c "import json, sys
import numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, '$(dirname "$reference")')
import model_reference as ref
from transformers import MixtralForCausalLM
ck = '$tmp/$variant/step-00000004'
cfg = ref.load_config(ck + '/config.yaml')
m = MixtralForCausalLM.from_pretrained('$tmp/$variant-hf', torch_dtype=torch.float32)
m.eval()
stream = ref.validation_stream('$tmp/data')
seq, mbs, batches = cfg['model']['seq_len'], cfg['train']['micro_batch_size'], cfg['train']['eval_batches']
ce, n = 0.0, 0
with torch.no_grad():
    for b in range(batches):
        rows = np.stack([stream[w * seq:w * seq + seq + 1] for w in range(b * mbs, (b + 1) * mbs)]).astype(np.int64)
        logits = m(input_ids=torch.from_numpy(rows[:, :-1])).logits.double()
        ce += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(rows[:, 1:]).reshape(-1), reduction='sum').item()
        n += rows[:, 1:].size
ours = json.load(open('$tmp/$variant.eval'))
hf = ce / n
rel = abs(hf - ours['loss']) / ours['loss']
ok = n == ours['tokens'] and rel <= 1e-5
print(('ok' if ok else 'MISMATCH') + ' switchyard %.9f transformers %.9f (relative %.1e, %d tokens)' % (ours['loss'], hf, rel, n))" 2>"$tmp/hf.err")
  echo "$variant: $check"
  [[ "$check" == ok* ]] || fail "$variant: MixtralForCausalLM vs switchyard eval: $check $(tail -3 "$tmp/hf.err")"

  # Import: the same tensors, bit for bit, and the same eval loss.
  "$bin" import --format hf-mixtral "$tmp/$variant-hf" "$tmp/$variant-back" --set "data.dir=$tmp/data" \
    --set train.micro_batch_size=3 --set train.eval_batches=2 >"$tmp/import.out" 2>&1 ||
    { fail "$variant: import: $(cat "$tmp/import.out")"; continue; }
  check=$(py "import sys, numpy as np
sys.path.insert(0, '$(dirname "$reference")')
import model_reference as ref
a = ref.load_checkpoint_tensors('$tmp/$variant/step-00000004')
b = ref.load_checkpoint_tensors('$tmp/$variant-back/step-00000000')
errs = []
if sorted(a) != sorted(b): errs.append('names differ: %r' % sorted(set(a) ^ set(b)))
for k in a:
    if k in b and (a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()): errs.append(k)
print('; '.join(errs) if errs else 'ok %d tensors' % len(a))" 2>&1)
  [[ "$check" == ok* ]] || fail "$variant: import vs the original: $check"
  "$bin" eval --checkpoint "$tmp/$variant-back" --json >"$tmp/back.eval" 2>&1 || fail "$variant: eval of the import: $(cat "$tmp/back.eval")"
  same=$(py "import json; a = json.load(open('$tmp/$variant.eval')); b = json.load(open('$tmp/back.eval')); print(a['loss'] == b['loss'] and a['tokens'] == b['tokens'])")
  [[ "$same" == True ]] || fail "$variant: the imported checkpoint evaluates differently"
done

# --- What Mixtral cannot express: one line naming the key; nothing written.
tiny_moe_config "$tmp/switch.yaml" "$tmp/data"
"$bin" train --config "$tmp/switch.yaml" --out "$tmp/switch" --set train.max_steps=1 >/dev/null 2>&1
"$bin" train --config "$tmp/mixtral.yaml" --out "$tmp/biased" --set train.max_steps=1 --set moe.expert_bias_rate=0.01 >/dev/null 2>&1
"$bin" train --config "$tmp/mixtral.yaml" --out "$tmp/scaled" --set train.max_steps=1 --set moe.routed_scaling_factor=2.5 >/dev/null 2>&1
"$bin" train --config "$tmp/mixtral.yaml" --out "$tmp/sigmoid" --set train.max_steps=1 --set moe.score=sigmoid >/dev/null 2>&1
"$bin" train --config "$tmp/mixtral.yaml" --out "$tmp/grouped" --set train.max_steps=1 --set moe.route_groups=2 \
  --set moe.route_group_topk=1 >/dev/null 2>&1
err_one_line "layernorm" "model.norm=layernorm: Mixtral uses RMSNorm" export --format hf-mixtral "$tmp/switch" "$tmp/x1"
err_one_line "sigmoid scores" "moe.score=sigmoid: Mixtral's router takes a softmax" export --format hf-mixtral "$tmp/sigmoid" "$tmp/x8"
err_one_line "route groups" "moe.route_groups=2: Mixtral routes over all experts" export --format hf-mixtral "$tmp/grouped" "$tmp/x9"
[[ ! -e "$tmp/x8" && ! -e "$tmp/x9" ]] || fail "a refused export wrote its output"
err_one_line "expert bias" "moe.expert_bias_rate=0.01" export --format hf-mixtral "$tmp/biased" "$tmp/x2"
err_one_line "routed scaling" "moe.routed_scaling_factor=2.5: Mixtral does not scale its experts' output" export --format hf-mixtral "$tmp/scaled" "$tmp/x6"
[[ ! -e "$tmp/x1" && ! -e "$tmp/x2" && ! -e "$tmp/x6" ]] || fail "a refused export wrote its output"
err_one_line "non-empty OUT" "exists and is not an empty directory" export --format hf-mixtral "$tmp/untied" "$tmp/untied-hf"
expect_usage_error "format" "--format=gguf is not one of hf-mixtral" export --format gguf "$tmp/untied" "$tmp/x3"
expect_usage_error "one argument" "expected two arguments" export --format hf-mixtral "$tmp/untied"
err_one_line "no config.json" "$tmp/data/config.json" import --format hf-mixtral "$tmp/data" "$tmp/x4"
mkdir -p "$tmp/bad-hf" && cp "$tmp/untied-hf/model.safetensors" "$tmp/bad-hf/"
sed 's/"num_local_experts": 4/"num_local_experts": 5/' "$tmp/untied-hf/config.json" >"$tmp/bad-hf/config.json"
err_one_line "5 experts in config.json" "model.layers.0.block_sparse_moe.gate.weight has shape (4, 16), the config.json implies (5, 16)" import --format hf-mixtral "$tmp/bad-hf" "$tmp/x5"
# config.json's head_dim (the export writes it; newer transformers read it): a width other than
# hidden / heads imports as model.head_dim, so weights of the default width are refused by shape.
grep -q '"head_dim": 4' "$tmp/untied-hf/config.json" || fail "the export's config.json has no head_dim 4"
mkdir -p "$tmp/hd-hf" && cp "$tmp/untied-hf/model.safetensors" "$tmp/hd-hf/"
py "import json; c = json.load(open('$tmp/untied-hf/config.json')); c['head_dim'] = 8; json.dump(c, open('$tmp/hd-hf/config.json', 'w'))"
err_one_line "head_dim 8" "the config.json implies (32, 16)" import --format hf-mixtral "$tmp/hd-hf" "$tmp/x7"
grep -q "self_attn" "$tmp/err" || fail "head_dim 8: the refusal names no attention tensor: $(cat "$tmp/err")"
[[ ! -e "$tmp/x4" && ! -e "$tmp/x5" && ! -e "$tmp/x7" ]] || fail "a refused import wrote its output"
# config.json's values: one the config refuses, or a key that changes the model without a
# Switchyard equivalent, is one line naming the file and config.json's key, exit 1, nothing
# written; a --set the config refuses stays a usage error (2).
hf_case() {  # NAME WANT PYTHON-EDITING-c [--set ...]
  local name="$1" want="$2" edit="$3"; shift 3
  rm -rf "$tmp/case-hf" "$tmp/case-out"
  mkdir -p "$tmp/case-hf" && cp "$tmp/untied-hf/model.safetensors" "$tmp/case-hf/"
  py "import json; c = json.load(open('$tmp/untied-hf/config.json')); $edit
json.dump(c, open('$tmp/case-hf/config.json', 'w'))"
  err_one_line "$name" "$want" import --format hf-mixtral "$tmp/case-hf" "$tmp/case-out" "$@"
  grep -qF "import: error: $tmp/case-hf/config.json: " "$tmp/err" || fail "$name: the file is not named"
  [[ ! -e "$tmp/case-out" ]] || fail "$name: a refused import wrote its output"
}
hf_case "hidden_size 0" "hidden_size=0 must be positive" "c['hidden_size'] = 0"
hf_case "rope_theta -1" "rope_theta=-1 must be > 0" "c['rope_theta'] = -1"
hf_case "num_key_value_heads 3" "num_key_value_heads=3 does not divide num_attention_heads=4" \
  "c['num_key_value_heads'] = 3"
hf_case "max_position_embeddings 2^63-1" "max_position_embeddings=9223372036854775807 is more than 2^53" \
  "c['max_position_embeddings'] = 2**63 - 1"
hf_case "a string for a number" 'rms_norm_eps="x" is not a number' "c['rms_norm_eps'] = 'x'"
hf_case "hidden_act gelu" 'hidden_act="gelu": only silu (swiglu experts) imports' "c['hidden_act'] = 'gelu'"
hf_case "sliding_window below seq_len" "sliding_window=8 is below model.seq_len=16" "c['sliding_window'] = 8"
hf_case "rope_scaling" 'rope_scaling={"factor":4.0,"type":"yarn"} is not null' \
  "c['rope_scaling'] = {'type': 'yarn', 'factor': 4.0}"
hf_case "attention_bias" "attention_bias=true: Switchyard's Mixtral has no linear biases" "c['attention_bias'] = True"
# A value config.json's own checks pass but the model refuses: the file's fault (exit 1), not
# a --set's (there is none).
hf_case "head_dim 3" "model.position=rope needs an even head dim, got head_dim = 3" "c['head_dim'] = 3"
hf_case "mlp_bias" "mlp_bias=true: Switchyard's Mixtral has no linear biases" "c['mlp_bias'] = True"
expect_usage_error "a --set the config refuses" "train.lr=-1 must be > 0" import --format hf-mixtral \
  "$tmp/untied-hf" "$tmp/case-out" --set train.lr=-1
# A window no smaller than the sequence used changes nothing: it imports.
rm -rf "$tmp/case-hf" "$tmp/case-out"
mkdir -p "$tmp/case-hf" && cp "$tmp/untied-hf/model.safetensors" "$tmp/case-hf/"
py "import json; c = json.load(open('$tmp/untied-hf/config.json')); c['sliding_window'] = 8
json.dump(c, open('$tmp/case-hf/config.json', 'w'))"
"$bin" import --format hf-mixtral "$tmp/case-hf" "$tmp/case-out" --set model.seq_len=8 >"$tmp/out" 2>&1 ||
  fail "sliding_window 8 with model.seq_len 8: $(cat "$tmp/out")"
# A layout for the runs that load it (expert parallelism over 2 ranks): the import runs on
# one rank and saves it in config.yaml.
rm -rf "$tmp/ep-out"
"$bin" import --format hf-mixtral "$tmp/untied-hf" "$tmp/ep-out" --set parallel.ep=2 \
  >"$tmp/out" 2>&1 || fail "import --set parallel.ep=2: $(cat "$tmp/out")"
grep -q "^  ep: 2$" "$tmp/ep-out/step-00000000/config.yaml" ||
  fail "import --set parallel.ep=2: config.yaml lacks ep: 2"

[[ $failures -eq 0 ]] && echo "hf_mixtral_cli_test: all checks passed"
exit $((failures > 0))
