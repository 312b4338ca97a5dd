#!/usr/bin/env bash
# `switchyard eval` end to end: prep a tiny corpus, train a tiny MoE model a few steps with
# the CLI, then evaluate its checkpoints. The loss must be the validation loss training
# printed (and wrote to metrics.jsonl) at that step — the same batches, the same forward —
# and --json must parse with consistent routing statistics. Errors are one line on stderr
# with exit status 1 (missing or corrupt checkpoint or data), 2 (bad flags or layout) or 3
# (a router weight of 3e38 whose forward overflows: the MoE layer and statistic named).
# With an mpirun launcher (tests/dist): train under 2 ranks with ep=2 and evaluate under 2
# ranks (identical loss) and under 1 rank with --set parallel.ep=1 (the same sequences);
# docs/model_reference.py reads its per-rank files through the index.
# Usage: eval_cli_test.sh path/to/switchyard [path/to/mpirun_test.sh]
set -u
bin="$1"
mpirun_sh="${2:-}"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# py PROGRAM: runs a python3 program given as a string.
py() { python3 -c "$1"; }

# A tiny two-language corpus and its token shards.
mkdir -p "$tmp/corpus"
for i in $(seq 1 150); do
  printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg und die katze schlief im haus\n\n' "$i" >>"$tmp/corpus/de.txt"
done
"$bin" prep --out "$tmp/data" --vocab 120 --val-fraction 0.2 --seed 1 \
  "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" >"$tmp/prep.out" 2>&1 ||
  { echo "FAIL: prep: $(cat "$tmp/prep.out")"; exit 1; }

# Two MoE layers of 4 experts (top-2, GShard's random second choice, so the step keys the
# eval-mode routing too), capacity 1.0 in training and 1.5 in eval so that something drops.
cat >"$tmp/tiny.yaml" <<EOF
model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32}
moe:
  num_experts: 4
  layer_freq: 1
  top_k: 2
  d_expert: 16
  normalize_gates: true
  second_expert_policy: random
  jitter_eps: 0.01
  capacity_factor: 1.0
  eval_capacity_factor: 1.5
  z_loss_coef: 0.001
train:
  lr: 0.01
  warmup_steps: 1
  max_steps: 6
  micro_batch_size: 2
  eval_every: 3
  eval_batches: 2
  checkpoint_every: 3
data:
  dir: $tmp/data
EOF

"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/run" >"$tmp/train.out" 2>&1 ||
  { echo "FAIL: train: $(tail -5 "$tmp/train.out")"; exit 1; }
[[ -d "$tmp/run/step-00000003" && -d "$tmp/run/step-00000006" ]] ||
  { echo "FAIL: train saved no step-3/step-6 checkpoints: $(ls "$tmp/run")"; exit 1; }

# The validation loss training printed / logged after step N-1 (checkpoint step N).
printed_val() { sed -n "s/^validation after step $(($1 - 1)) | loss \([0-9.]*\) .*/\1/p" "$tmp/train.out"; }
logged_val() {
  py "import json
for line in open('$tmp/run/metrics.jsonl'):
    d = json.loads(line)
    if 'val_loss' in d and d['step'] == $(($1 - 1)): print(repr(d['val_loss']))"
}

# --- The report: the output directory means its latest (step 6).
"$bin" eval --checkpoint "$tmp/run" >"$tmp/eval.out" 2>"$tmp/eval.err"
rc=$?
[[ $rc -eq 0 ]] || fail "eval: exit status $rc ($(cat "$tmp/eval.err"))"
[[ ! -s "$tmp/eval.err" ]] || fail "eval: unexpected stderr: $(cat "$tmp/eval.err")"
grep -q "^checkpoint $tmp/run/step-00000006 (step 6," "$tmp/eval.out" ||
  fail "eval report lacks the checkpoint line: $(head -3 "$tmp/eval.out")"
got=$(sed -n 's/^validation loss \([0-9.]*\) | perplexity .*/\1/p' "$tmp/eval.out")
want=$(printed_val 6)
[[ -n "$want" && "$got" == "$want" ]] ||
  fail "eval loss '$got' != training's printed validation loss '$want' at step 5"
for layer in 0 1; do
  grep -Eq "^ +$layer +[0-9.]+% +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+% +( [0-9]+){4}$" "$tmp/eval.out" ||
    fail "eval report lacks the routing row of layer $layer: $(cat "$tmp/eval.out")"
done

# The out directory's `latest` file means the same checkpoint.
"$bin" eval --checkpoint "$tmp/run/latest" >"$tmp/eval_latest.out" 2>"$tmp/eval.err" ||
  fail "eval --checkpoint run/latest: exit status $? ($(cat "$tmp/eval.err"))"
# The report's second line ends with the evaluation's wall time, which may differ.
untimed() { sed -E '2s/, [0-9.]+ s$//' "$1"; }
[[ "$(untimed "$tmp/eval.out")" == "$(untimed "$tmp/eval_latest.out")" ]] ||
  fail "eval of run/latest differs from eval of run: $(diff <(untimed "$tmp/eval.out") <(untimed "$tmp/eval_latest.out"))"

# --- JSON: one object, the exact logged loss, consistent statistics. Step 3 and step 6.
for step in 3 6; do
  dir="$tmp/run/step-0000000$step"
  "$bin" eval --checkpoint "$dir" --json >"$tmp/eval$step.json" 2>"$tmp/eval.err"
  rc=$?
  [[ $rc -eq 0 ]] || { fail "eval --json step $step: exit status $rc ($(cat "$tmp/eval.err"))"; continue; }
  want=$(logged_val "$step")
  check=$(py "import json, math
lines = open('$tmp/eval$step.json').read().splitlines()
assert len(lines) == 1, 'want one line of JSON, got %d' % len(lines)
d = json.loads(lines[0])
errs = []
if d['step'] != $step: errs.append('step %r' % d['step'])
if d['checkpoint'] != '$dir': errs.append('checkpoint %r' % d['checkpoint'])
if d['world'] != 1 or d['ep'] != 1 or d['dp'] != 1: errs.append('layout')
if d['loss'] != float('$want'): errs.append('loss %r != logged val_loss $want' % d['loss'])
if abs(d['perplexity'] - math.exp(d['loss'])) > 1e-9 * d['perplexity']: errs.append('perplexity')
if d['batches'] != 2 or d['sequences'] != 4 or d['tokens'] != 64: errs.append('counts %r %r %r' % (d['batches'], d['sequences'], d['tokens']))
if d['eval_capacity_factor'] != 1.5: errs.append('eval_capacity_factor')
if [l['layer'] for l in d['moe']] != [0, 1]: errs.append('moe layers')
for l in d['moe']:
    if len(l['tokens_per_expert']) != 4 or len(l['tokens_per_expert_kept']) != 4: errs.append('E')
    if l['tokens'] != 64 or l['assignments'] != 128: errs.append('tokens %r' % l)
    if sum(l['tokens_per_expert']) != 128: errs.append('before-drop counts')
    if any(k > b for k, b in zip(l['tokens_per_expert_kept'], l['tokens_per_expert'])): errs.append('kept > assigned')
    if abs(l['dropped_frac'] - l['dropped'] / 128) > 1e-12: errs.append('dropped_frac')
    if not (0 < l['router_entropy'] <= math.log(4) + 1e-9): errs.append('entropy')
    if not (0 <= l['min_load'] <= 0.25 <= l['max_load'] <= 1): errs.append('loads')
print('; '.join(errs) if errs else 'ok')" 2>&1)
  [[ "$check" == ok ]] || fail "eval --json step $step: $check"
done

# --- --batches 0: the whole validation split (more sequences than the default 2 x 2).
"$bin" eval --checkpoint "$tmp/run" --json --batches 0 >"$tmp/all.json" 2>"$tmp/eval.err" ||
  fail "eval --batches 0: $(cat "$tmp/eval.err")"
# Every window of the validation split once (the last micro-batch padded when it is short).
windows=$(py "import json
d = json.load(open('$tmp/data/index.json'))
print(sum((t['val']['tokens'] if 'val' in t else 0) for t in d['totals'].values()))" 2>/dev/null)
windows=$(( (windows - 1) / 16 ))
py "import json; d = json.load(open('$tmp/all.json')); assert d['sequences'] == $windows and d['batches'] == ($windows + 1) // 2 and d['tokens'] == 16 * $windows, d" \
  2>/dev/null || fail "eval --batches 0 did not evaluate the $windows windows of the whole split: $(cat "$tmp/all.json")"

# --- --data: the same shards elsewhere give the same loss; the config's data.dir is not read.
cp -r "$tmp/data" "$tmp/data2"
"$bin" eval --checkpoint "$tmp/run" --json --data "$tmp/data2" >"$tmp/data2.json" 2>"$tmp/eval.err" ||
  fail "eval --data: $(cat "$tmp/eval.err")"
py "import json; a = json.load(open('$tmp/eval6.json')); b = json.load(open('$tmp/data2.json')); assert a['loss'] == b['loss'] and b['data'] == '$tmp/data2'" \
  2>/dev/null || fail "eval --data gave another loss or data path"

# --- Errors: exactly one stderr line "switchyard eval: error: ...", nothing on stdout.
expect_error() {
  local name="$1" want_rc="$2" want="$3"; shift 3
  "$bin" eval "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq $want_rc ]] || fail "$name: exit status $rc, want $want_rc ($(cat "$tmp/err"))"
  [[ ! -s "$tmp/out" ]] || fail "$name: unexpected stdout: $(head -c 300 "$tmp/out")"
  local lines
  lines=$(wc -l <"$tmp/err")
  [[ $lines -eq 1 ]] || fail "$name: $lines stderr lines, want 1: $(cat "$tmp/err")"
  grep -q '^switchyard eval: error: ' "$tmp/err" || fail "$name: bad prefix: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$name: stderr lacks '$want': $(cat "$tmp/err")"
}
expect_error "no --checkpoint" 2 "--checkpoint" --json
expect_error "unknown flag" 2 "--bogus" --checkpoint "$tmp/run" --bogus
expect_error "negative --batches" 2 "--batches=-1" --checkpoint "$tmp/run" --batches -1
expect_error "--verify with --batches" 2 "--batches needs an evaluation, not --verify" \
  --checkpoint "$tmp/run" --verify --batches 3
expect_error "--verify with --set" 2 "--set needs an evaluation, not --verify" \
  --checkpoint "$tmp/run" --verify --set parallel.ep=1
expect_error "a file" 1 "not a checkpoint directory" --checkpoint "$tmp/run/step-00000006/config.yaml"
expect_error "bad --set" 2 "unknown key 'moe.topk'" --checkpoint "$tmp/run" --set moe.topk=2
expect_error "missing checkpoint" 1 "$tmp/nope: no such checkpoint" --checkpoint "$tmp/nope"
mkdir -p "$tmp/empty"
expect_error "not a checkpoint" 1 "$tmp/empty: not a checkpoint" --checkpoint "$tmp/empty"
cp -r "$tmp/run/step-00000006" "$tmp/noconfig" && rm "$tmp/noconfig/config.yaml"
expect_error "no config.yaml" 1 "incomplete checkpoint (no config.yaml)" --checkpoint "$tmp/noconfig"
cp -r "$tmp/run/step-00000006" "$tmp/truncated"
head -c 3000 "$tmp/run/step-00000006/model.safetensors" >"$tmp/truncated/model.safetensors"
expect_error "truncated weights" 1 "model.safetensors" --checkpoint "$tmp/truncated"
cp -r "$tmp/run/step-00000006" "$tmp/badyaml" && echo "moe: {top_k: two}" >"$tmp/badyaml/config.yaml"
expect_error "corrupt config.yaml" 1 "moe.top_k: expected an integer, got 'two'" --checkpoint "$tmp/badyaml"
expect_error "missing data" 1 "$tmp/nodata" --checkpoint "$tmp/run" --data "$tmp/nodata"
# Shards cut by another tokenizer than the one of the checkpoint's data: refused, both named
# (they were scored, exit 0, a loss of other token ids).
"$bin" prep --out "$tmp/otherdata" --vocab 100 --val-fraction 0.2 "$tmp/corpus/en.txt" >/dev/null 2>&1 ||
  fail "prep with another tokenizer"
expect_error "another tokenizer" 1 \
  "--data $tmp/otherdata: its tokenizer $tmp/otherdata/tokenizer.model is not the one the checkpoint's data was cut with, $tmp/data/tokenizer.model" \
  --checkpoint "$tmp/run" --data "$tmp/otherdata"
expect_error "layout for 2 ranks" 2 "--set parallel.ep=1" --checkpoint "$tmp/run" --set parallel.ep=2
# A --set that changes the saved model's shapes: a usage error naming the override first.
expect_error "model mismatch" 2 "--set moe.num_experts=8 changes the checkpoint's model (moe.num_experts: " \
  --checkpoint "$tmp/run" --set moe.num_experts=8
grep -qF "layers.0.moe.router.weight" "$tmp/err" || fail "model mismatch: no tensor named: $(cat "$tmp/err")"
# The learning rate is no model key, and a saved min_lr of -1 follows a lower one.
"$bin" eval --checkpoint "$tmp/run" --set train.lr=1e-7 --batches 1 >/dev/null 2>"$tmp/err" ||
  fail "eval --set train.lr=1e-7: $(cat "$tmp/err")"

# --- Finite weights whose forward is not: one flipped exponent bit in a router weight
# (3e38, as a writer bug would leave it) with the checksum recomputed, so the checkpoint
# verifies. eval must stop with exit 3 (training's non-finite status) and one line naming
# the MoE layer and the statistic, not print `z inf`.
cp -r "$tmp/run/step-00000006" "$tmp/huge"
py "import json, struct, zlib
d = '$tmp/huge'
index = json.load(open(d + '/model.safetensors.index.json'))
name = 'layers.1.moe.router.weight'
f = d + '/' + index['weight_map'][name]
b = bytearray(open(f, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
t = json.loads(b[8:8 + n])[name]
assert t['dtype'] == 'F32', t
start = 8 + n + t['data_offsets'][0]
for i in range(0, t['data_offsets'][1] - t['data_offsets'][0], 4):
    b[start + i:start + i + 4] = struct.pack('<f', 3e38)
open(f, 'wb').write(b)
key = f.rsplit('/', 1)[1]
index['files'][key]['crc32'] = '%08x' % zlib.crc32(bytes(b))
json.dump(index, open(d + '/model.safetensors.index.json', 'w'))"
"$bin" checkpoint verify "$tmp/huge" >/dev/null 2>"$tmp/err" ||
  fail "the patched checkpoint does not verify (the test's patch is wrong): $(cat "$tmp/err")"
expect_error "huge router weight" 3 "step 6: MoE layer 1: " --checkpoint "$tmp/huge"
grep -Eq "MoE layer 1: (aux loss|z loss|router entropy) (nan|inf|-inf)" "$tmp/err" ||
  fail "huge router weight: the line does not name the statistic: $(cat "$tmp/err")"
expect_error "huge router weight, --json" 3 "step 6: MoE layer 1: " --checkpoint "$tmp/huge" --json

# --- Many ranks: train with ep=2 on 2 ranks; evaluate on 2 ranks and on 1.
if [[ -n "$mpirun_sh" ]]; then
  bash "$mpirun_sh" 2 "$bin" train --config "$tmp/tiny.yaml" --out "$tmp/run2" \
    --set parallel.ep=2 >"$tmp/train2.out" 2>&1 || fail "train on 2 ranks: $(tail -5 "$tmp/train2.out")"
  want=$(py "import json
v = [json.loads(l) for l in open('$tmp/run2/metrics.jsonl')]
print(repr([d['val_loss'] for d in v if 'val_loss' in d][-1]))")
  bash "$mpirun_sh" 2 "$bin" eval --checkpoint "$tmp/run2" --json >"$tmp/e2.json" 2>"$tmp/eval.err" ||
    fail "eval on 2 ranks: $(cat "$tmp/eval.err")"
  py "import json; d = json.load(open('$tmp/e2.json')); assert d['loss'] == float('$want') and d['world'] == 2 and d['ep'] == 2 and d['sequences'] == 8, d" \
    2>/dev/null || fail "eval on 2 ranks: loss or layout differs from training's ($want): $(cat "$tmp/e2.json")"
  # One rank, the same 8 sequences (4 micro-batches): equal within f32 reduction order.
  "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 --batches 4 >"$tmp/e1.json" \
    2>"$tmp/eval.err" || fail "eval of the 2-rank checkpoint on 1 rank: $(cat "$tmp/eval.err")"
  py "import json; a = json.load(open('$tmp/e2.json')); b = json.load(open('$tmp/e1.json'))
assert b['sequences'] == 8 and abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (a['loss'], b['loss'])" \
    2>"$tmp/py.err" || fail "1-rank eval differs from the 2-rank one: $(cat "$tmp/py.err")"
  # The same checkpoint evaluated through 2 pipeline stages (a layer each): the loss of one
  # rank.
  bash "$mpirun_sh" 2 "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 \
    --set parallel.pp=2 --batches 4 >"$tmp/epp.json" 2>"$tmp/eval.err" ||
    fail "eval under parallel.pp=2: $(grep -v '^\[' "$tmp/eval.err" | tail -3)"
  py "import json; a = json.load(open('$tmp/e1.json')); b = json.load(open('$tmp/epp.json'))
assert b['sequences'] == 8 and abs(a['loss'] - b['loss']) <= 1e-6 * a['loss'], (a['loss'], b['loss'])" \
    2>"$tmp/py.err" || fail "eval under parallel.pp=2 differs from one rank: $(cat "$tmp/py.err")"
  # And under context parallelism (cp 2: every sequence in 4 chunks, attention around the
  # ring, the routing groups whole over the two ranks): the loss of one rank, each sequence
  # counted once.
  bash "$mpirun_sh" 2 "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 \
    --set parallel.cp=2 --batches 4 >"$tmp/ecp.json" 2>"$tmp/eval.err" ||
    fail "eval under parallel.cp=2: $(grep -v '^\[' "$tmp/eval.err" | tail -3)"
  py "import json; a = json.load(open('$tmp/e1.json')); b = json.load(open('$tmp/ecp.json'))
assert b['sequences'] == 8 and abs(a['loss'] - b['loss']) <= 1e-5 * a['loss'], (a['loss'], b['loss'], b['sequences'])" \
    2>"$tmp/py.err" || fail "eval under parallel.cp=2 differs from one rank: $(cat "$tmp/py.err")"
  # --batches 0 is the whole split on any layout: dp 1, 2 and 4 score the same sequences
  # and the same mean over every validation token (f32 reduction order: relative 1e-6),
  # on a split whose windows are not a multiple of dp x micro_batch_size (padded).
  (( windows % 4 != 0 && windows % 8 != 0 )) ||
    fail "the test's validation split has $windows windows: a multiple of 4 or 8 tests no padding"
  for np in 1 2 4; do
    if [[ $np -eq 1 ]]; then
      "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 --batches 0 \
        >"$tmp/whole$np.json" 2>"$tmp/eval.err"
    else
      bash "$mpirun_sh" "$np" "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 \
        --batches 0 >"$tmp/whole$np.json" 2>"$tmp/eval.err"
    fi || fail "eval --batches 0 on $np ranks: $(grep -v '^\[' "$tmp/eval.err" | tail -3)"
  done
  py "import json
a = [json.load(open('$tmp/whole%d.json' % n)) for n in (1, 2, 4)]
for d, n in zip(a, (1, 2, 4)):
    assert d['dp'] == n, (n, d['dp'])
    assert d['sequences'] == $windows and d['tokens'] == 16 * $windows, (n, d['sequences'], d['tokens'])
    assert abs(d['loss'] - a[0]['loss']) <= 1e-6 * a[0]['loss'], (n, d['loss'], a[0]['loss'])" \
    2>"$tmp/py.err" || fail "eval --batches 0 differs between dp 1, 2 and 4: $(cat "$tmp/py.err")"
  # The routing statistics count the scored tokens only (not the padding rows): every MoE
  # layer routed each of the 16 x windows tokens once, top-2, and the counts before dropping
  # (keyed by the global token, not by the layout) and the router entropy are the same on
  # dp 1, 2 and 4. Dropless (eval_capacity_factor 0), the counts after dropping too (what
  # the random second-expert policy removes is keyed by the global token).
  for np in 1 2 4; do
    if [[ $np -eq 1 ]]; then
      "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 --batches 0 \
        --set moe.eval_capacity_factor=0 >"$tmp/dropless$np.json" 2>"$tmp/eval.err"
    else
      bash "$mpirun_sh" "$np" "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 \
        --batches 0 --set moe.eval_capacity_factor=0 >"$tmp/dropless$np.json" 2>"$tmp/eval.err"
    fi || fail "dropless eval --batches 0 on $np ranks: $(grep -v '^\[' "$tmp/eval.err" | tail -3)"
  done
  # Under context parallelism too (cp 2 x dp 2 on 4 ranks: each rank holds two chunks of
  # every sequence, so its rows are not a contiguous block of the routing group; micro-batches
  # of 4, so that the last one of dp rank 1 holds 2 real sequences and 2 of padding).
  bash "$mpirun_sh" 4 "$bin" eval --checkpoint "$tmp/run2" --json --set parallel.ep=1 \
    --set parallel.cp=2 --set train.micro_batch_size=4 --batches 0 \
    --set moe.eval_capacity_factor=0 >"$tmp/droplesscp.json" \
    2>"$tmp/eval.err" || fail "dropless eval --batches 0 under cp 2: $(grep -v '^\[' "$tmp/eval.err" | tail -3)"
  py "import json
a = json.load(open('$tmp/dropless1.json')); b = json.load(open('$tmp/droplesscp.json'))
assert b['dp'] == 2 and b['sequences'] == $windows, (b['dp'], b['sequences'])
for l, l1 in zip(b['moe'], a['moe']):
    assert l['tokens'] == 16 * $windows and l['tokens_per_expert'] == l1['tokens_per_expert'], (l, l1)
    assert l['tokens_per_expert_kept'] == l1['tokens_per_expert_kept'], (l, l1)
    assert abs(l['router_entropy'] - l1['router_entropy']) <= 1e-5 * l1['router_entropy'], (l, l1)" \
    2>"$tmp/py.err" || fail "eval --batches 0 under cp 2: routing statistics: $(tail -1 "$tmp/py.err")"
  py "import json
for kind in ('whole', 'dropless'):
    a = [json.load(open('$tmp/%s%d.json' % (kind, n))) for n in (1, 2, 4)]
    for d, n in zip(a, (1, 2, 4)):
        assert len(d['moe']) == 2, (kind, n, d['moe'])
        for l, l1 in zip(d['moe'], a[0]['moe']):
            assert l['tokens'] == d['tokens'] == 16 * $windows, (kind, n, l['tokens'], d['tokens'])
            assert l['assignments'] == 2 * l['tokens'] == sum(l['tokens_per_expert']), (kind, n, l)
            assert l['tokens_per_expert'] == l1['tokens_per_expert'], (kind, n, l['tokens_per_expert'], l1['tokens_per_expert'])
            assert abs(l['router_entropy'] - l1['router_entropy']) <= 1e-6 * l1['router_entropy'], (kind, n)
            if kind == 'dropless':
                assert l['tokens_per_expert_kept'] == l1['tokens_per_expert_kept'] and l['dropped'] == l1['dropped'], (kind, n, l)" \
    2>"$tmp/py.err" || fail "eval --batches 0 routing statistics: $(tail -1 "$tmp/py.err")"
  echo "--- eval --batches 0 on dp 1, 2, 4: $windows sequences, loss $(py "import json; print(json.load(open('$tmp/whole4.json'))['loss'])")"
  # Each rank wrote its own pieces; docs/model_reference.py assembles them from the index and
  # reproduces the 1-rank eval (when numpy is there).
  step_dir="$tmp/run2/$(cat "$tmp/run2/latest")"
  for f in model-00000-of-00002 model-00001-of-00002 optimizer-00000-of-00002 \
    optimizer-00001-of-00002; do
    [[ -f "$step_dir/$f.safetensors" ]] || fail "2-rank checkpoint: no $f.safetensors: $(ls "$step_dir")"
  done
  reference="$(dirname "$0")/../../docs/model_reference.py"
  numpy_python=/usr/bin/python3  # Debian's python3-numpy, as model_reference_test.sh
  [[ -x $numpy_python ]] || numpy_python=python3
  if $numpy_python -c "import numpy" 2>/dev/null; then
    $numpy_python "$reference" "$step_dir" "$tmp/data" --batches 4 >"$tmp/ref.json" 2>"$tmp/ref.err" ||
      fail "model_reference.py on the 2-rank checkpoint: $(tail -3 "$tmp/ref.err")"
    py "import json; a = json.load(open('$tmp/e1.json')); b = json.load(open('$tmp/ref.json'))
assert a['tokens'] == b['tokens'] and abs(a['loss'] - b['loss']) <= 1e-7 * a['loss'], (a, b)" \
      2>"$tmp/py.err" || fail "model_reference.py differs from eval: $(cat "$tmp/py.err")"
    echo "--- model_reference.py on the 2-rank checkpoint's pieces: $(cat "$tmp/ref.json")"
  else
    echo "--- skipped model_reference.py on the 2-rank checkpoint: no numpy"
  fi
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "eval CLI: all checks passed"
