#!/usr/bin/env bash
# `switchyard route` against the MoE layer's math: on checkpoints of two short runs (top-1
# with the aux-loss-free bias, and top-2 with normalised gates, GShard's random second
# expert and dropping by probability), the experts, gates and capacity drops route --json
# prints for a text equal those docs/model_reference.py (numpy, written from docs/model.md)
# computes for the same tokens as one routing group at eval capacity — a text longer than
# model.seq_len as one group per window. Then the listing and the errors.
# Usage: route_cli_test.sh path/to/switchyard path/to/docs/model_reference.py
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
reference="$2"

make_corpus "$tmp/data"
tiny_moe_config "$tmp/top1.yaml" "$tmp/data"
"$bin" train --config "$tmp/top1.yaml" --out "$tmp/top1" >"$tmp/train.out" 2>&1 ||
  { echo "FAIL: train top1: $(tail -5 "$tmp/train.out")"; exit 1; }
"$bin" train --config "$tmp/top1.yaml" --out "$tmp/top2" --set moe.top_k=2 --set moe.normalize_gates=true \
  --set moe.second_expert_policy=random --set moe.drop_policy=probability \
  --set moe.eval_capacity_factor=0.6 --set moe.expert_bias_rate=0 >"$tmp/train.out" 2>&1 ||
  { echo "FAIL: train top2: $(tail -5 "$tmp/train.out")"; exit 1; }

short="the cat sat on the mat and der hund lief weit weg"
long="the cat 12 sat on the mat and the dog ran away from it; der hund 7 lief weit weg und die katze schlief im haus"
for run in top1 top2; do
  for which in short long; do
    text="${!which}"
    "$bin" route --checkpoint "$tmp/$run" --text "$text" --json >"$tmp/route.json" 2>"$tmp/err" ||
      { fail "$run $which: route: $(cat "$tmp/err")"; continue; }
    check=$(py "import json, math, sys
import numpy as np
sys.path.insert(0, '$(dirname "$reference")')
import model_reference as ref
r = json.load(open('$tmp/route.json'))
ck = r['checkpoint']
cfg = ref.load_config(ck + '/config.yaml')
p = ref.load_checkpoint_tensors(ck)
step = json.load(open(ck + '/trainer_state.json'))['step']
errs = []
if r['step'] != step: errs.append('step')
ids = np.array([t['id'] for t in r['tokens']], dtype=np.int64)
S = cfg['model']['seq_len']
k, E, cf = cfg['moe']['top_k'], cfg['moe']['num_experts'], cfg['moe']['eval_capacity_factor']
if '$which' == 'long' and len(ids) <= S: errs.append('the long text fits one window (%d tokens)' % len(ids))
drops = 0
for g, begin in enumerate(range(0, len(ids), S)):
    w = ids[begin:begin + S]
    ref.ROUTING_TRACE = []
    targets = np.concatenate([w[1:], [-1]])[None]
    ref.forward_ce(w[None], targets, p, cfg, step, 0)
    want_c = ref.expert_capacity(cf, len(w), k, E)
    if r['capacity'][g] != (want_c if want_c is not None else -1): errs.append('capacity %r != %r' % (r['capacity'][g], want_c))
    for li, (layer, idx, gates, keep) in enumerate(ref.ROUTING_TRACE):
        if r['layers'][li] != layer: errs.append('layer id')
        for t in range(len(w)):
            got = r['tokens'][begin + t]
            if got['group'] != g: errs.append('group')
            lr = got['layers'][li]
            if lr['experts'] != idx[t].tolist(): errs.append('experts of token %d layer %d: %r != %r' % (begin + t, layer, lr['experts'], idx[t].tolist()))
            if lr['dropped'] != (~keep[t]).tolist(): errs.append('drops of token %d layer %d: %r != %r' % (begin + t, layer, lr['dropped'], (~keep[t]).tolist()))
            if np.abs(np.array(lr['gates']) - gates[t]).max() > 2e-6: errs.append('gates of token %d layer %d: %r != %r' % (begin + t, layer, lr['gates'], gates[t].tolist()))
            drops += sum(lr['dropped'])
if drops == 0: errs.append('nothing dropped: the test does not exercise capacity')
print('; '.join(sorted(set(errs))[:6]) if errs else 'ok %d tokens, %d dropped' % (len(ids), drops))" 2>&1)
    echo "$run $which: $check"
    [[ "$check" == ok* ]] || fail "$run $which: route vs model_reference: $check"
  done
done

# --- --file gives the same routing as --text; the listing has a row per token.
printf '%s' "$short" >"$tmp/text.txt"
"$bin" route --checkpoint "$tmp/top1" --text "$short" --json >"$tmp/a.json" 2>&1
"$bin" route --checkpoint "$tmp/top1" --file "$tmp/text.txt" --json >"$tmp/b.json" 2>&1
cmp -s "$tmp/a.json" "$tmp/b.json" || fail "--file and --text differ"
"$bin" route --checkpoint "$tmp/top1" --text "$short" --color never >"$tmp/list.txt" 2>"$tmp/err" ||
  fail "route listing: $(cat "$tmp/err")"
n=$(py "import json; print(len(json.load(open('$tmp/a.json'))['tokens']))")
rows=$(grep -cE '^  \S.* \| e[0-9]:[0-9.]+\*? +\| e[0-9]:' "$tmp/list.txt")
[[ "$rows" == "$n" ]] || fail "listing: $rows token rows, want $n: $(cat "$tmp/list.txt")"
grep -q $'\033\[' "$tmp/list.txt" && fail "--color never printed escapes"
"$bin" route --checkpoint "$tmp/top1" --text "$short" --color always | grep -q $'\033\[' ||
  fail "--color always printed no colour"

# --- The sample in a report: each token's first expert per layer.
"$bin" report "$tmp/top1" --route "$tmp/a.json" --out "$tmp/r.html" >"$tmp/out" 2>&1 || fail "report --route: $(cat "$tmp/out")"
check=$(py "import json, re
page = open('$tmp/r.html').read()
d = json.loads(re.search(r'id=\"switchyard-data\">(.*?)</script>', page, re.S).group(1).replace('<\\\\/', '</'))
r = json.load(open('$tmp/a.json'))
errs = []
for li, layer in enumerate(r['layers']):
    h = d['plots'].get('route_L%d' % layer)
    if h is None: errs.append('no route_L%d' % layer); continue
    if h['z'] != [[t['layers'][li]['experts'][0] for t in r['tokens']]]: errs.append('experts of layer %d' % layer)
    if h['cols'] != [t['text'] for t in r['tokens']]: errs.append('tokens')
    if 'id=\"plot-route_L%d\"' % layer not in page: errs.append('no div')
print('; '.join(errs) if errs else 'ok')" 2>&1)
[[ "$check" == ok ]] || fail "report --route: $check"

# --- Errors: one line.
expect_usage_error "text and file" "exactly one of --text and --file" route --checkpoint "$tmp/top1" --text a --file "$tmp/text.txt"
expect_usage_error "neither" "exactly one of --text and --file" route --checkpoint "$tmp/top1"
expect_usage_error "color" "--color=pink is not one of" route --checkpoint "$tmp/top1" --text a --color pink
"$bin" route --checkpoint "$tmp/nope" --text a >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "$tmp/nope" "$tmp/err" || fail "missing checkpoint: $(cat "$tmp/err")"
"$bin" route --checkpoint "$tmp/top1" --file "$tmp/none.txt" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "none.txt" "$tmp/err" || fail "missing file: $(cat "$tmp/err")"
# A tokenizer other than the checkpoint's data's: --data cut by another tokenizer is refused
# (exit 1, naming both); one whose ids reach past model.vocab_size (128) is refused before
# its ids index past the embedding.
"$bin" prep --out "$tmp/big" --vocab 400 --seed 2 "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" \
  >"$tmp/prep.out" 2>&1 || fail "prep --vocab 400: $(cat "$tmp/prep.out")"
"$bin" route --checkpoint "$tmp/top1" --text "the cat" --data "$tmp/big" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "is not the one the checkpoint's data was cut with" "$tmp/err" ||
  fail "--data of another tokenizer: $(cat "$tmp/err")"
"$bin" route --checkpoint "$tmp/top1" --text "the cat" --set data.dir="$tmp/big" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "pieces, more than the model's model.vocab_size=128" "$tmp/err" ||
  fail "a tokenizer larger than the vocabulary: $(cat "$tmp/err")"

[[ $failures -eq 0 ]] && echo "route_cli_test: all checks passed"
exit $((failures > 0))
