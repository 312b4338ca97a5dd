#!/usr/bin/env bash
# `switchyard upcycle` (docs/upcycling.md): dense checkpoints of two tiny models (swiglu,
# rmsnorm, rope, no biases; gelu, layernorm, learned positions, biases, tied head) become
# MoE checkpoints of step 0 in which
#  - every expert of an upcycled layer is its MLP, bit for bit, every other tensor of the
#    checkpoint is unchanged, the routers have the new shape, and no MLP tensor is left;
#  - the model computes what the dense one computes when the gates sum to 1 and nothing is
#    dropped: `switchyard eval` and docs/model_reference.py (written from docs/model.md,
#    float32 with float64 sums) each give the dense model's validation loss to 1e-6
#    relative (the two forwards differ only by the order of f32 operations and the gates'
#    f32 sum, rounding-sized, about 1e-7 relative through two or three layers);
#  - with unnormalised top-1 gates (Switch) the command says the start differs, and the
#    loss does, by more than 1e-4 relative (after 20 dense steps the MLPs matter: 2e-3);
#  - training resumes from it (the experts then differ from each other), and under ep = 2
#    `switchyard eval` gives the one-rank loss; a checkpoint trained under tp 2 upcycles on
#    one process, keeps tp 2 in its config and evaluates on 2 ranks as on one.
# And the refusals: model.* overrides, experts not shaped as the MLP, shared experts, no
# layer upcycled, an MoE layer made dense, a changed expert count, a non-empty OUT, a missing checkpoint,
# mpirun: one line each, nothing written.
# Usage: upcycle_cli_test.sh path/to/switchyard path/to/docs/model_reference.py [path/to/mpirun_test.sh]
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
reference="$2"
mpirun_sh="${3:-}"
if ! /usr/bin/python3 -c "import numpy" 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 has no numpy (scripts/setup.sh installs python3-numpy)"
  exit 77
fi

make_corpus "$tmp/data"
train_common="train: {lr: 0.01, warmup_steps: 1, max_steps: 20, micro_batch_size: 3, eval_every: 20, eval_batches: 2}
data: {dir: $tmp/data}"
declare -A dense=(
  [swiglu]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 24, norm: rmsnorm, position: rope, activation: swiglu, bias: false}"
  [gelu]="model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 3, n_heads: 2, d_ff: 32, norm: layernorm, position: learned, activation: gelu, bias: true, tie_embeddings: true}"
)
# The MoE side: swiglu every layer, 4 experts top-2; gelu every other layer (layer 1), top-1.
declare -A sets=(
  [swiglu]="--set moe.num_experts=4 --set moe.layer_freq=1 --set moe.top_k=2"
  [gelu]="--set moe.num_experts=4 --set moe.layer_freq=2 --set moe.top_k=1"
)
declare -A layers=([swiglu]="0 1" [gelu]="1")
exact="--set moe.normalize_gates=true --set moe.capacity_factor=0 --set moe.eval_capacity_factor=0"

# The validation loss of a checkpoint by the numpy reference.
ref_loss() {
  py "import sys, json, numpy as np
sys.path.insert(0, '$(dirname "$reference")')
import model_reference as ref
ck = sys.argv[1]
cfg = ref.load_config(ck + '/config.yaml')
p = ref.load_checkpoint_tensors(ck)
stream = ref.validation_stream('$tmp/data')
seq, mbs = cfg['model']['seq_len'], cfg['train']['micro_batch_size']
ce, n = 0.0, 0
for b in range(cfg['train']['eval_batches']):
    rows = np.stack([stream[w * seq:w * seq + seq + 1] for w in range(b * mbs, (b + 1) * mbs)])
    s, c = ref.forward_ce(rows[:, :-1], rows[:, 1:], p, cfg, 0, first_token=b * mbs * seq)
    ce += s; n += c
print(repr(ce / n))" "$1"
}
eval_loss() {  # CHECKPOINT [eval args]: the loss switchyard eval prints
  "$bin" eval --checkpoint "$@" --json 2>/dev/null | py "import json, sys; print(repr(json.load(sys.stdin)['loss']))"
}
rel_within() {  # A B BOUND: |A - B| / |B| <= BOUND
  py "import sys; a, b, t = map(float, sys.argv[1:]); print('ok' if abs(a - b) <= t * abs(b) else 'no %.3e' % (abs(a - b) / abs(b)))" "$@"
}

for name in swiglu gelu; do
  printf '%s\nmoe: {num_experts: 1, layer_freq: 100, top_k: 1, d_expert: 8}\n%s\n' \
    "${dense[$name]}" "$train_common" >"$tmp/$name.yaml"
  "$bin" train --config "$tmp/$name.yaml" --out "$tmp/$name" >"$tmp/$name.train" 2>&1 ||
    { fail "$name: dense train: $(tail -3 "$tmp/$name.train")"; continue; }
  # shellcheck disable=SC2086
  "$bin" upcycle --checkpoint "$tmp/$name" --out "$tmp/$name-moe" ${sets[$name]} $exact \
    >"$tmp/$name.up" 2>&1 || { fail "$name: upcycle: $(cat "$tmp/$name.up")"; continue; }
  grep -q "it starts computing what the checkpoint computes" "$tmp/$name.up" ||
    fail "$name: the upcycle line does not say the start is the dense model: $(cat "$tmp/$name.up")"

  check=$(py "import sys, numpy as np
sys.path.insert(0, '$(dirname "$reference")')
import model_reference as ref
a = ref.load_checkpoint_tensors('$tmp/$name/step-00000020')
b = ref.load_checkpoint_tensors('$tmp/$name-moe/step-00000000')
layers = [int(x) for x in '${layers[$name]}'.split()]
mlp = {'w1': 'w1.weight', 'w2': 'w2.weight', 'w3': 'w3.weight', 'b1': 'w1.bias', 'b2': 'w2.bias'}
errs, experts = [], 0
for i in layers:
    for e, m in mlp.items():
        src = a.get('layers.%d.mlp.%s' % (i, m))
        dst = b.get('layers.%d.moe.experts.%s' % (i, e))
        if (src is None) != (dst is None): errs.append('layer %d %s: present on one side only' % (i, e)); continue
        if src is None: continue
        if dst.shape != (4,) + src.shape: errs.append('layer %d %s shape %r' % (i, e, dst.shape)); continue
        for x in range(4):
            experts += 1
            if dst[x].tobytes() != src.tobytes(): errs.append('layer %d expert %d %s differs' % (i, x, e))
    r = b.get('layers.%d.moe.router.weight' % i)
    if r is None or r.shape != (16, 4) or not np.isfinite(r).all() or not r.any(): errs.append('layer %d router' % i)
left = [k for k in b if '.mlp.' in k and int(k.split('.')[1]) in layers]
if left: errs.append('MLP tensors left: %r' % left)
for k, v in a.items():
    if '.mlp.' in k and int(k.split('.')[1]) in layers: continue
    if k not in b or b[k].tobytes() != v.tobytes(): errs.append('%s not copied' % k)
print('; '.join(errs) if errs else 'ok %d expert tensors' % experts)" 2>&1)
  [[ "$check" == ok* ]] || fail "$name: tensors: $check"
  echo "$name: tensors $check"

  d64=$(ref_loss "$tmp/$name/step-00000020") m64=$(ref_loss "$tmp/$name-moe/step-00000000")
  r=$(rel_within "$m64" "$d64" 1e-6)
  echo "$name: model_reference.py dense $d64 upcycled $m64: $r"
  [[ $r == ok ]] || fail "$name: the reference's upcycled loss is not the dense one's: $r"
  d32=$(eval_loss "$tmp/$name") m32=$(eval_loss "$tmp/$name-moe")
  r=$(rel_within "$m32" "$d32" 1e-6)
  echo "$name: switchyard eval dense $d32 upcycled $m32: $r"
  [[ $r == ok ]] || fail "$name: switchyard eval of the upcycled model is not the dense one's: $r"
done

# Switch's unnormalised top-1 gate (< 1) scales each MLP output: the command says the start
# differs, and the loss does.
"$bin" upcycle --checkpoint "$tmp/gelu" --out "$tmp/switch" ${sets[gelu]} >"$tmp/switch.up" 2>&1 ||
  fail "switch: upcycle: $(cat "$tmp/switch.up")"
grep -q "it starts differently from the checkpoint: the top-k gates do not sum to 1" "$tmp/switch.up" &&
  grep -q "capacity drops tokens in training" "$tmp/switch.up" ||
  fail "switch: the upcycle line does not say why the start differs: $(cat "$tmp/switch.up")"
r=$(rel_within "$(eval_loss "$tmp/switch")" "$(eval_loss "$tmp/gelu")" 1e-4)
[[ $r == no* ]] || fail "switch: unnormalised gates evaluate as the dense model ($r)"

# Training resumes from the upcycled checkpoint (its config is the one saved with it), and
# the router's choices make the experts differ from each other.
"$bin" train --config "$tmp/swiglu-moe/step-00000000/config.yaml" --resume "$tmp/swiglu-moe" \
  --out "$tmp/swiglu-run" --set train.max_steps=4 >"$tmp/resume.out" 2>&1 ||
  fail "resume: $(tail -3 "$tmp/resume.out")"
check=$(py "import sys, numpy as np
sys.path.insert(0, '$(dirname "$reference")')
import model_reference as ref
b = ref.load_checkpoint_tensors('$tmp/swiglu-run/step-00000004')
w = b['layers.0.moe.experts.w1']
print('ok' if all(np.isfinite(b[k]).all() for k in b) and not np.array_equal(w[0], w[1]) else 'experts still equal or non-finite')" 2>&1)
[[ $check == ok ]] || fail "resume: $check"

if [[ -n "$mpirun_sh" ]]; then
  one=$(eval_loss "$tmp/swiglu-moe" --batches 0)
  two=$(bash "$mpirun_sh" 2 "$bin" eval --checkpoint "$tmp/swiglu-moe" --batches 0 --json \
    --set parallel.ep=2 2>/dev/null | grep '^{' | head -1 | py "import json, sys; print(repr(json.load(sys.stdin)['loss']))")
  r=$(rel_within "$two" "$one" 1e-6)
  echo "ep 2: $two, one rank: $one: $r"
  [[ $r == ok ]] || fail "eval of the upcycled checkpoint under ep 2 vs one rank: $r"
  # A checkpoint trained under tp 2 (micro-batch 3: rows split inside a sequence) upcycles
  # on one process; its config keeps tp 2, and 2 ranks evaluate it as one rank does.
  bash "$mpirun_sh" 2 "$bin" train --config "$tmp/swiglu.yaml" --out "$tmp/tp2" --set parallel.tp=2 \
    >"$tmp/tp2.train" 2>&1 || fail "tp 2 dense train: $(tail -3 "$tmp/tp2.train")"
  "$bin" upcycle --checkpoint "$tmp/tp2" --out "$tmp/tp2-moe" ${sets[swiglu]} $exact >"$tmp/tp2.up" 2>&1 ||
    fail "upcycle of a tp 2 checkpoint: $(cat "$tmp/tp2.up")"
  grep -q "^  tp: 2$" "$tmp/tp2-moe/step-00000000/config.yaml" || fail "the upcycled config lost parallel.tp=2"
  one=$(eval_loss "$tmp/tp2-moe" --set parallel.tp=1)
  two=$(bash "$mpirun_sh" 2 "$bin" eval --checkpoint "$tmp/tp2-moe" --json 2>/dev/null | grep '^{' | head -1 |
    py "import json, sys; print(repr(json.load(sys.stdin)['loss']))")
  r=$(rel_within "$two" "$one" 1e-6)
  echo "tp 2 upcycled: 2 ranks $two, one rank $one: $r"
  [[ $r == ok ]] || fail "the upcycled tp 2 checkpoint on 2 ranks vs one: $r"
  bash "$mpirun_sh" 2 "$bin" upcycle --checkpoint "$tmp/swiglu" --out "$tmp/x0" >"$tmp/np2.out" 2>&1
  grep -q "runs on one rank" "$tmp/np2.out" || fail "mpirun -np 2 upcycle: $(cat "$tmp/np2.out")"
  [[ ! -e "$tmp/x0" ]] || fail "mpirun -np 2 upcycle wrote its output"
fi

# --- Refusals: one line each, nothing written.
expect_usage_error "model key" "--set model.d_model=32: upcycling keeps the checkpoint's model section" \
  upcycle --checkpoint "$tmp/swiglu" --out "$tmp/x1" --set model.d_model=32
expect_usage_error "expert width" "moe.d_expert=8: an upcycled expert is a copy of the MLP, whose hidden width is 24" \
  upcycle --checkpoint "$tmp/swiglu" --out "$tmp/x2" --set moe.d_expert=8
expect_usage_error "expert activation" "moe.activation=gelu: an upcycled expert is a copy of the MLP, whose activation is swiglu" \
  upcycle --checkpoint "$tmp/swiglu" --out "$tmp/x2" --set moe.activation=gelu
expect_usage_error "shared experts" "moe.num_shared_experts=1: upcycling copies the MLP into the routed experts" \
  upcycle --checkpoint "$tmp/swiglu" --out "$tmp/x3" --set moe.num_shared_experts=1
expect_usage_error "no layer upcycled" "no MLP of the checkpoint becomes experts under moe.layer_freq=100 (2 layers)" \
  upcycle --checkpoint "$tmp/swiglu" --out "$tmp/x8" --set moe.num_experts=4
expect_usage_error "no checkpoint flag" "--checkpoint" upcycle --out "$tmp/x4"
err_one_line "MoE layer made dense" "layers.0 is an MoE layer in the checkpoint and dense in the new config" \
  upcycle --checkpoint "$tmp/swiglu-moe" --out "$tmp/x5" --set moe.layer_freq=2
err_one_line "expert count" "layers.0.moe.router.weight: the checkpoint's is (16, 4), the upcycled model's (16, 8)" \
  upcycle --checkpoint "$tmp/swiglu-moe" --out "$tmp/x6" --set moe.num_experts=8
err_one_line "missing checkpoint" "$tmp/nope: no such checkpoint" upcycle --checkpoint "$tmp/nope" --out "$tmp/x7"
mkdir -p "$tmp/full" && echo keep >"$tmp/full/note"
err_one_line "non-empty OUT" "exists and is not an empty directory" upcycle --checkpoint "$tmp/swiglu" --out "$tmp/full"
[[ "$(cat "$tmp/full/note")" == keep && $(ls "$tmp/full" | wc -l) -eq 1 ]] || fail "non-empty OUT was changed"
for x in x1 x2 x3 x4 x5 x6 x7 x8; do [[ ! -e "$tmp/$x" ]] || fail "a refused upcycle wrote $x"; done

[[ $failures -eq 0 ]] && echo "upcycle_cli_test: all checks passed"
exit $((failures > 0))
