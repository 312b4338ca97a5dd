#!/usr/bin/env bash
# scripts/experiments/*.sh on their ci grids (a few steps of configs/experiments/ci.yaml,
# one seed, on a tiny two-language corpus): every setting of every experiment trains and is
# evaluated, summary.json holds finite numbers for every setting (the figures themselves
# are not asserted) and summary.md one row each; each run's FLOPs per token equal
# `switchyard train --dry-run`'s for its resolved config; the zloss grid at a diverging
# learning rate counts its runs as diverged instead of failing; a second call trains
# nothing; bad arguments and a missing corpus are one line.
# Usage: experiments_cli_test.sh path/to/switchyard path/to/scripts/experiments
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
dir="$2"

make_corpus "$tmp/data"
common=(--grid ci --steps 4 --seeds 1 --jobs 2 --bin "$bin" --data "$tmp/data")
for exp in moe_vs_dense loss_free zloss capacity; do
  bash "$dir/$exp.sh" "${common[@]}" --out "$tmp/$exp" >"$tmp/$exp.out" 2>&1 ||
    { fail "$exp: exit $?: $(tail -5 "$tmp/$exp.out")"; continue; }
  for f in summary.md summary.json report.html val_loss_steps.png val_loss_flops.png \
           train_loss_runs.png maxvio_steps.png load_heatmaps.png; do
    [[ -s "$tmp/$exp/$f" ]] || fail "$exp wrote no $f"
  done
  check=$(py "import glob, json, math, os, subprocess, sys
s = json.load(open('$tmp/$exp/summary.json'))
errs = []
if not s['settings']: errs.append('no setting')
for st in s['settings']:
    n = st['name']
    if (st['runs'], st['ok']) != (1, 1): errs.append('%s: %d/%d runs ok' % (n, st['ok'], st['runs']))
    m = st['metrics']
    need = ['val_loss', 'perplexity', 'step_s', 'flops_per_token', 'train_flops']
    if n != 'dense': need += ['maxvio_global', 'maxvio_batch', 'dropped_run']
    for k in need:
        v = m[k]['mean']
        if v is None or not math.isfinite(v): errs.append('%s: %s = %r' % (n, k, v))
    for k, v in m.items():
        if v['mean'] is not None and not math.isfinite(v['mean']): errs.append('%s: %s not finite' % (n, k))
    r = s['runs'][n][0]
    ev = json.load(open('$tmp/$exp/%s/seed1/eval.json' % n))
    if r['val_loss'] != ev['loss'] or m['val_loss']['mean'] != ev['loss']: errs.append('%s: val_loss vs eval.json' % n)
    # moe_vs_dense trains dense twice as long as the MoE runs.
    want_steps = 8 if '$exp' == 'moe_vs_dense' and n == 'dense' else 4
    if r['steps'] != want_steps: errs.append('%s: %d steps' % (n, r['steps']))
    # The runner's FLOPs per token against the dry-run's (printed to 3 significant digits).
    cfg = sorted(glob.glob('$tmp/$exp/%s/seed1/step-*/config.yaml' % n))[-1]
    out = subprocess.run(['$bin', 'train', '--config', cfg, '--dry-run'], capture_output=True, text=True).stdout
    line = [l for l in out.splitlines() if 'training FLOPs / token' in l]
    val, unit = line[0].split()[-2:] if line else ('0', 'FLOP')
    dry = float(val) * {'FLOP': 1, 'KFLOP': 1e3, 'MFLOP': 1e6, 'GFLOP': 1e9}[unit]
    if not abs(r['flops_per_token'] - dry) <= 0.005 * dry: errs.append('%s: flops %r vs dry-run %r' % (n, r['flops_per_token'], dry))
md = open('$tmp/$exp/summary.md').read().splitlines()
rows = [l for l in md if l.startswith('| ') and not l.startswith('| setting') and not l.startswith('| ---')]
if [l.split(' | ')[0][2:] for l in rows] != [st['name'] for st in s['settings']]: errs.append('summary.md rows %r' % rows)
print('; '.join(errs) if errs else 'ok')" 2>&1)
  [[ "$check" == ok ]] || fail "$exp: $check"
done
# The settings each ci grid runs.
names=$(py "import json
for e in ['moe_vs_dense', 'loss_free', 'zloss', 'capacity']:
    print(e, ' '.join(st['name'] for st in json.load(open('$tmp/%s/summary.json' % e))['settings']))" 2>&1)
want="moe_vs_dense dense top1-e4
loss_free softmax-aux1e-3 softmax-prop3e-4 sigmoid-aux1e-3 sigmoid-sign1e-3 softmax-sign1e-3 ga4-softmax-aux1e-3 ga4-softmax-prop3e-4
zloss lr0.03-z0 lr0.03-z1e-3
capacity top1-cf1.0 top1-dropless top2-cf1.0 top2-dropless"
[[ "$names" == "$want" ]] || fail "ci grids: $names"
# The settings' choices reached the runs: moe_vs_dense's MoE in every layer, dropless, at a
# constant rate; loss_free's sequence-wise aux loss, the proportional and sign bias updates,
# and the grad_accum variant.
py "import glob, sys, yaml
def cfg(exp, n):
    return yaml.safe_load(open(sorted(glob.glob('$tmp/%s/%s/seed1/step-*/config.yaml' % (exp, n)))[-1]))
errs = []
c = cfg('moe_vs_dense', 'top1-e4')
if (c['moe']['layer_freq'], c['moe']['capacity_factor'], c['train']['min_lr']) != (1, 0, c['train']['lr']): errs.append('top1-e4 %r' % c['moe'])
if cfg('moe_vs_dense', 'dense')['moe']['layer_freq'] != 1000: errs.append('dense layer_freq')
c = cfg('loss_free', 'softmax-aux1e-3')['moe']
if (c['aux_loss_scope'], c['expert_bias_rate']) != ('sequence', 0): errs.append('aux %r' % c)
c = cfg('loss_free', 'softmax-prop3e-4')['moe']
if (c['expert_bias_update'], c['aux_loss_coef']) != ('proportional', 0) or abs(c['expert_bias_rate'] - 3e-4) > 1e-9: errs.append('prop %r' % c)
if cfg('loss_free', 'sigmoid-sign1e-3')['moe']['expert_bias_update'] != 'sign': errs.append('sign')
if cfg('loss_free', 'ga4-softmax-prop3e-4')['train']['grad_accum'] != 2: errs.append('grad_accum')
print('; '.join(errs)); sys.exit(1 if errs else 0)" >"$tmp/cfg.out" 2>&1 || fail "settings not applied: $(cat "$tmp/cfg.out")"
# The bias updates end to end (routing.jsonl logs every step's counts and the biases after
# the step's update): proportional moves b_i by u (mean - c_i) / mean with the step's
# counts (grad_accum 2: both micro-batches'), sign by u sign(mean - c_i); f32 rounding of
# |b| <= 1 is below 1e-7 a step.
py "import json, sys
def check(run, u, rule):
    recs = [json.loads(l) for l in open('$tmp/loss_free/%s/seed1/routing.jsonl' % run)]
    bad, moved = [], 0
    for a, b in zip(recs, recs[1:]):
        if b['step'] != a['step'] + 1: continue
        for l, (b0, b1, c) in enumerate(zip(a['expert_bias'], b['expert_bias'], b['tokens_per_expert'])):
            mean = sum(c) / len(c)
            for i in range(len(c)):
                want = u * (mean - c[i]) / mean if rule == 'proportional' else u * ((mean > c[i]) - (mean < c[i]))
                moved += want != 0
                if abs((b1[i] - b0[i]) - want) > 1e-6: bad.append((run, b['step'], l, i, b1[i] - b0[i], want))
    return bad, moved
errs = []
for run, u, rule in [('ga4-softmax-prop3e-4', 3e-4, 'proportional'), ('softmax-prop3e-4', 3e-4, 'proportional'),
                     ('sigmoid-sign1e-3', 1e-3, 'sign')]:
    bad, moved = check(run, u, rule)
    if bad or not moved: errs.append('%s: %d updates checked, wrong: %r' % (run, moved, bad[:3]))
print('; '.join(errs)); sys.exit(1 if errs else 0)" >"$tmp/bias.out" 2>&1 || fail "bias updates: $(cat "$tmp/bias.out")"

# Dropless drops nothing; capacity 1.0 drops something in 4 steps.
py "import json, sys
s = {st['name']: st['metrics'] for st in json.load(open('$tmp/capacity/summary.json'))['settings']}
sys.exit(0 if s['top1-dropless']['dropped_run']['mean'] == 0 and s['top1-cf1.0']['dropped_run']['mean'] > 0 else 1)" ||
  fail "capacity: dropped fractions"

# A validation sample (--val-blocks 4 of 64 tokens, smaller than the corpus's split): the
# runs train and are evaluated on it (eval.json's data), and summary.json says its size.
bash "$dir/moe_vs_dense.sh" "${common[@]}" --out "$tmp/sampled" --val-blocks 4 --val-block-tokens 64 \
  >"$tmp/sampled.out" 2>&1 || fail "val sample: exit $?: $(tail -3 "$tmp/sampled.out")"
py "import glob, json, sys
s = json.load(open('$tmp/sampled/summary.json'))
evs = [json.load(open(p)) for p in glob.glob('$tmp/sampled/*/seed1/eval.json')]
ok = s['val_sample_tokens'] == 256 and len(evs) == 2 and all(e['data'].endswith('val-sample') and 0 < e['tokens'] <= 256 for e in evs)
sys.exit(0 if ok else 1)" || fail "val sample: $(grep -o '"val_sample_tokens": [0-9a-z]*' "$tmp/sampled/summary.json")"

# A second call finds every run done.
bash "$dir/capacity.sh" "${common[@]}" --out "$tmp/capacity" >"$tmp/again.out" 2>&1 || fail "second call: $(tail -3 "$tmp/again.out")"
[[ $(grep -c "already done" "$tmp/again.out") -eq 4 ]] || fail "second call retrained: $(cat "$tmp/again.out")"

# A diverging learning rate: both runs stop on a non-finite loss (exit 3), the experiment
# finishes and counts them as diverged and unstable.
bash "$dir/zloss.sh" "${common[@]}" --out "$tmp/diverge" --set train.lr=1e4 --set train.grad_clip=0 \
  >"$tmp/diverge.out" 2>&1 || fail "zloss at lr 1e4: exit $?: $(tail -3 "$tmp/diverge.out")"
py "import json, sys
s = json.load(open('$tmp/diverge/summary.json'))['settings']
sys.exit(0 if all((st['runs'], st['ok'], st['diverged'], st['stable']) == (1, 0, 1, 0) for st in s) else 1)" ||
  fail "diverged runs not counted: $(cat "$tmp/diverge/summary.md" 2>/dev/null)"
grep -q "| lr0.03-z0 | .* | 0/1 | 0/1 | 0/1 | 1/1 |" "$tmp/diverge/summary.md" || fail "summary.md: $(cat "$tmp/diverge/summary.md")"

# Bad arguments: one line, exit 2, nothing created; a missing corpus: one line naming the
# script that builds it, exit 1.
for bad in "--grid huge" "--steps 0" "--jobs 0" "--seeds x" "--set nokey" "--bogus"; do
  bash "$dir/moe_vs_dense.sh" $bad --bin "$bin" --out "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 && $(wc -l <"$tmp/err") -eq 1 ]] || fail "$bad: exit $rc, stderr $(cat "$tmp/err")"
  grep -q "^moe_vs_dense.sh: error: " "$tmp/err" || fail "$bad: $(cat "$tmp/err")"
done
(cd "$tmp" && bash "$dir/loss_free.sh" --bin "$bin" --out "$tmp/bad" >"$tmp/out" 2>"$tmp/err")
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "data/code.*scripts/make_code_corpus.py" "$tmp/err" ||
  fail "missing corpus: exit $rc, $(cat "$tmp/err")"
[[ ! -e "$tmp/bad" ]] || fail "a refused experiment created its output directory"
bash "$dir/zloss.sh" --help >"$tmp/out" 2>&1 && grep -q -- "--jobs N" "$tmp/out" && grep -q "ST-MoE" "$tmp/out" ||
  fail "zloss.sh --help: $(cat "$tmp/out")"

[[ $failures -eq 0 ]] && echo "experiments_cli_test: all checks passed"
exit $((failures > 0))
