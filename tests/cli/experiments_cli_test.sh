#!/usr/bin/env bash
# scripts/experiments/*.sh on their ci grids (a few steps of configs/experiments/ci.yaml,
# one seed, on a tiny two-language corpus): every setting of every experiment trains and is
# evaluated, summary.json holds finite numbers for every setting (the figures themselves
# are not asserted) and summary.md one row each; each run's FLOPs per token equal
# `switchyard train --dry-run`'s for its resolved config; per_seed.csv holds every run's
# own numbers (the same as summary.json's) and configs/<setting>.yaml each setting's resolved
# config; the figures each grid can make exist; publish.py copies the evidence and packs the
# runs' records (runs.tar.xz), which --restore turns back into the same summary elsewhere; the zloss grid at a diverging learning rate counts its runs as diverged
# instead of failing; a second call trains and draws nothing; a kept run trained with other
# steps, data, validation sample or base config stops the experiment before anything is
# written (another binary: one warning line); a failed training quotes the engine's error;
# a validation sample rebuilt for another corpus links that corpus; bad arguments (a --set
# of a key the runner sets among them) and a missing corpus are one line.
# EXPERIMENTS_CI_JOBS sets --jobs (default 2).
# Usage: experiments_cli_test.sh path/to/switchyard path/to/scripts/experiments
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
dir="$2"

make_corpus "$tmp/data"
common=(--grid ci --steps 4 --seeds 1 --jobs "${EXPERIMENTS_CI_JOBS:-2}" --bin "$bin" --data "$tmp/data")
for exp in moe_vs_dense loss_free zloss capacity; do
  bash "$dir/$exp.sh" "${common[@]}" --out "$tmp/$exp" >"$tmp/$exp.out" 2>&1 ||
    { fail "$exp: exit $?: $(tail -5 "$tmp/$exp.out")"; continue; }
  # The figures each grid makes: every one load_cumulative and quality_time; with a
  # baseline delta_steps; zloss (learning rates and z-loss coefficients differ) loss_vs_lr
  # and router_logits; loss_free (aux coefficients and expert biases differ) maxvio_frontier
  # and bias_trajectories.
  figs="val_loss_steps.png val_loss_flops.png train_loss_runs.png maxvio_steps.png load_heatmaps.png"
  figs+=" load_cumulative.png quality_time.png"
  [[ $exp == zloss ]] && figs+=" loss_vs_lr.png router_logits.png" || figs+=" delta_steps.png"
  [[ $exp == loss_free ]] && figs+=" maxvio_frontier.png bias_trajectories.png"
  for f in summary.md summary.json per_seed.csv report.html $figs; do
    [[ -s "$tmp/$exp/$f" ]] || fail "$exp wrote no $f"
  done
  for f in $figs; do
    [[ $(head -c 8 "$tmp/$exp/$f" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "$exp: $f is not a PNG"
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
# per_seed.csv: one row per run in summary.json's order, each value the run's own (every
# digit: float() gives summary.json's number back), empty where summary.json has None.
import csv, yaml
rows = list(csv.DictReader(open('$tmp/$exp/per_seed.csv')))
want = [(st['name'], r['seed']) for st in s['settings'] for r in s['runs'][st['name']]]
if [(r['setting'], int(r['seed'])) for r in rows] != want: errs.append('per_seed.csv rows %r' % rows)
for row in rows:
    run = next(r for r in s['runs'][row['setting']] if r['seed'] == int(row['seed']))
    if row['status'] != run['status']: errs.append('%s: status' % row['setting'])
    for k, v in row.items():
        if k in ('setting', 'seed', 'status') or k.startswith('speedup'): continue
        want_v = run.get(k)
        got = None if v == '' else float(v)
        if (got is None) != (want_v is None) or (got is not None and got != float(want_v)):
            errs.append('per_seed.csv %s/%s: %s = %r, summary.json %r' % (row['setting'], row['seed'], k, v, want_v))
    if '$exp' != 'zloss' and 'delta_val_loss' not in row: errs.append('per_seed.csv: no delta_val_loss')
# configs/<setting>.yaml: the run's own config.yaml under a comment header.
for st in s['settings']:
    n = st['name']
    text = open('$tmp/$exp/configs/%s.yaml' % n).read()
    cfg = sorted(glob.glob('$tmp/$exp/%s/seed1/step-*/config.yaml' % n))[-1]
    if not text.startswith('# %s: ' % n) or not text.endswith(open(cfg).read()) or yaml.safe_load(text) != yaml.safe_load(open(cfg)):
        errs.append('configs/%s.yaml' % n)
# New measures: the normalised label MI in [0, 1] on every MoE setting.
for st in s['settings']:
    v = st['metrics']['lang_mi_norm']['mean']
    if st['name'] != 'dense' and not (v is not None and 0 <= v <= 1): errs.append('%s: lang_mi_norm %r' % (st['name'], v))
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
zloss lr0.01-z0 lr0.01-z1e-3 lr0.03-z0 lr0.03-z1e-3
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

# Dropless drops nothing; capacity 1.0 drops something in 4 steps. Every step routes the
# same number of assignments, so the run's fraction is the steps' weighted mean of the
# start-up (the first of the 4 steps) and the steady state (the other 3).
py "import json, sys
s = {st['name']: st['metrics'] for st in json.load(open('$tmp/capacity/summary.json'))['settings']}
ok = s['top1-dropless']['dropped_run']['mean'] == 0 and s['top1-cf1.0']['dropped_run']['mean'] > 0
for n in ('top1-cf1.0', 'top2-cf1.0'):
    m = {k: s[n][k]['mean'] for k in ('dropped_run', 'dropped_start', 'dropped_steady')}
    ok = ok and abs(m['dropped_run'] - (m['dropped_start'] + 3 * m['dropped_steady']) / 4) < 1e-12
sys.exit(0 if ok else 1)" || fail "capacity: dropped fractions"
grep -q "dropped (steady: last 90%)" "$tmp/capacity/summary.md" || fail "capacity: no dropped_steady column"
# The timing pass (--time-steps 2 --time-rounds 2 on the ci grid): every setting timed in
# both rounds, the order rotated; the medians in summary.md's column and summary.json.
py "import json, math, sys
t = json.load(open('$tmp/capacity/timing.json'))
s = json.load(open('$tmp/capacity/summary.json'))
names = [st['name'] for st in s['settings']]
ps = t['per_setting']
ok = sorted(ps) == sorted(names) and t['rounds'] == 2 and t['steps'] == 2 and s['timing'] == t
for n in names:
    v = ps[n]
    ok = ok and len(v['rounds']) == 2 and all(math.isfinite(x) and x > 0 for x in v['rounds'])
    ok = ok and v['min'] <= v['median'] <= v['max'] and v['median'] == sum(v['rounds']) / 2
sys.exit(0 if ok else 1)" || fail "capacity: timing.json $(cat "$tmp/capacity/timing.json")"
grep -q "step alone (ms" "$tmp/capacity/summary.md" || fail "capacity: no step alone column"
grep -q "timing round 2/2 done" "$tmp/capacity.out" || fail "capacity: the timing pass did not run"

# publish.py copies summary.json (without per-step curves), summary.md, per_seed.csv,
# configs/ and the PNGs, and packs the runs' records into runs.tar.xz; no weights or logs.
/usr/bin/python3 "$dir/publish.py" "$tmp/capacity" "$tmp/pub" >"$tmp/pub.out" 2>&1 || fail "publish: $(cat "$tmp/pub.out")"
py "import glob, json, os, sys
got = sorted(os.path.relpath(p, '$tmp/pub') for p in glob.glob('$tmp/pub/**', recursive=True) if os.path.isfile(p))
want = sorted(['summary.json', 'summary.md', 'per_seed.csv', 'runs.tar.xz'] + [os.path.relpath(p, '$tmp/capacity') for p in
              glob.glob('$tmp/capacity/configs/*.yaml') + glob.glob('$tmp/capacity/*.png')])
s = json.load(open('$tmp/pub/summary.json'))
ok = got == want and 'curve_ce' not in s['runs']['top1-cf1.0'][0] and s['settings'] == json.load(open('$tmp/capacity/summary.json'))['settings']
print(got); sys.exit(0 if ok else 1)" >"$tmp/pubcheck.out" 2>&1 || fail "publish copied: $(cat "$tmp/pubcheck.out")"
grep -q "bytes in" "$tmp/pub.out" || fail "publish: no byte count: $(cat "$tmp/pub.out")"

# The runs archive carries the experiment to another machine: restored into an empty --out
# (no checkpoint weights there), every run counts as done, the timing is reused and the
# summary is the original's, number for number. Packing twice gives the same bytes.
bash "$dir/capacity.sh" "${common[@]}" --out "$tmp/restored" --restore "$tmp/pub/runs.tar.xz" \
  >"$tmp/restored.out" 2>&1 || fail "restore: $(tail -3 "$tmp/restored.out")"
grep -q "restored 4 runs from" "$tmp/restored.out" || fail "restore: $(head -3 "$tmp/restored.out")"
[[ $(grep -c "already done" "$tmp/restored.out") -eq 4 ]] || fail "restore retrained: $(cat "$tmp/restored.out")"
grep -q "timing round [0-9]" "$tmp/restored.out" && fail "restore: timed again although timing.json came with the runs: $(cat "$tmp/restored.out")"
ls "$tmp"/restored/*/seed1/step-*/*.safetensors >/dev/null 2>&1 && fail "restore: weights in the archive"
py "import json, sys
a, b = (json.load(open('$tmp/%s/summary.json' % d)) for d in ('capacity', 'restored'))
sys.exit(0 if a['settings'] == b['settings'] and a['runs'] == b['runs'] and a['timing'] == b['timing'] else 1)" ||
  fail "restore: the summary differs from the original's"
/usr/bin/python3 "$dir/runs_archive.py" pack "$tmp/restored" "$tmp/again.tar.xz" >/dev/null 2>&1 &&
  cmp -s "$tmp/again.tar.xz" "$tmp/pub/runs.tar.xz" || fail "runs_archive: packing the restored runs gave other bytes"
# Restoring again keeps what is there; a bad archive is one line, exit 1, and writes nothing;
# a kept run trained with other overrides than its setting's stops the experiment.
/usr/bin/python3 "$dir/runs_archive.py" unpack "$tmp/pub/runs.tar.xz" "$tmp/restored" >"$tmp/out" 2>&1 &&
  grep -q "0 runs restored into .*, 4 already there kept" "$tmp/out" || fail "unpack again: $(cat "$tmp/out")"
head -c 3000 "$tmp/pub/runs.tar.xz" >"$tmp/cut.tar.xz"
py "import io, tarfile
with tarfile.open('$tmp/evil.tar.xz', 'w:xz') as t:
    i = tarfile.TarInfo('../escape.json'); i.size = 2; t.addfile(i, io.BytesIO(b'{}'))"
for bad in cut evil; do
  /usr/bin/python3 "$dir/runs_archive.py" unpack "$tmp/$bad.tar.xz" "$tmp/unpacked-$bad" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 && ! -e "$tmp/unpacked-$bad" && ! -e "$tmp/escape.json" ]] ||
    fail "unpack $bad: exit $rc, $(cat "$tmp/err")"
done
# A run.json from before the record of steps, data, config and binary (the published
# archives'): its steps are checked against its checkpoint's config.yaml.
cp -r "$tmp/restored" "$tmp/oldrec"
py "import glob, json
for p in glob.glob('$tmp/oldrec/*/seed1/run.json'):
    r = json.load(open(p))
    json.dump({k: r[k] for k in ('status', 'exit', 'seed', 'setting', 'overrides', 'wall_s')}, open(p, 'w'))"
bash "$dir/capacity.sh" "${common[@]}" --steps 5 --out "$tmp/oldrec" >"$tmp/out" 2>"$tmp/err" &&
  fail "a run.json without steps: a 4-step run kept for --steps 5"
[[ $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "error: .*top1-cf1.0/seed1 was trained with other inputs than this call's: was 4 steps, now 5 (remove it" "$tmp/err" ||
  fail "old run.json, other steps: $(cat "$tmp/err")"
py "import json
p = '$tmp/restored/top1-cf1.0/seed1/run.json'; r = json.load(open(p)); r['overrides'] = ['moe.top_k=2']
json.dump(r, open(p, 'w'))"
bash "$dir/capacity.sh" "${common[@]}" --out "$tmp/restored" >"$tmp/out" 2>"$tmp/err" &&
  fail "a run trained with other overrides was kept"
grep -q "error: .*top1-cf1.0/seed1 was trained with the overrides \['moe.top_k=2'\]" "$tmp/err" ||
  fail "other overrides: $(cat "$tmp/err")"

# A validation sample (--val-blocks 4 of 64 tokens, smaller than the corpus's split): the
# runs train and are evaluated on it (eval.json's data), and summary.json says its size.
bash "$dir/moe_vs_dense.sh" "${common[@]}" --out "$tmp/sampled" --val-blocks 4 --val-block-tokens 64 \
  >"$tmp/sampled.out" 2>&1 || fail "val sample: exit $?: $(tail -3 "$tmp/sampled.out")"
py "import glob, json, sys
s = json.load(open('$tmp/sampled/summary.json'))
evs = [json.load(open(p)) for p in glob.glob('$tmp/sampled/*/seed1/eval.json')]
ok = s['val_sample_tokens'] == 256 and len(evs) == 2 and all(e['data'].endswith('val-sample') and 0 < e['tokens'] <= 256 for e in evs)
sys.exit(0 if ok else 1)" || fail "val sample: $(grep -o '"val_sample_tokens": [0-9a-z]*' "$tmp/sampled/summary.json")"

# A second call finds every run done and, its inputs unchanged, draws nothing again (the
# figures and report.html keep their bytes and times); with a figure deleted, a third call
# draws them again.
stamp() { stat -c '%n %y %s' "$tmp"/capacity/*.png "$tmp/capacity/report.html" | md5sum; }
before=$(stamp)
bash "$dir/capacity.sh" "${common[@]}" --out "$tmp/capacity" >"$tmp/again.out" 2>&1 || fail "second call: $(tail -3 "$tmp/again.out")"
grep -q "timing round [0-9]" "$tmp/again.out" && fail "second call: timed again although timing.json matched"
[[ $(grep -c "already done" "$tmp/again.out") -eq 4 ]] || fail "second call retrained: $(cat "$tmp/again.out")"
grep -q "figures and report up to date" "$tmp/again.out" && [[ $(stamp) == "$before" ]] ||
  fail "second call drew the figures again: $(tail -3 "$tmp/again.out")"
# timing.json measured by another binary (as if): the settings are timed again.
rm "$tmp/capacity/load_heatmaps.png"
py "import json
p = '$tmp/capacity/timing.json'; t = json.load(open(p)); t['binary_sha256'] = '0' * 64
json.dump(t, open(p, 'w'))"
bash "$dir/capacity.sh" "${common[@]}" --out "$tmp/capacity" >"$tmp/again.out" 2>&1 || fail "third call: $(tail -3 "$tmp/again.out")"
grep -q "timing.json was measured otherwise (binary_sha256 differ): timing again" "$tmp/again.out" &&
  grep -q "timing round 2/2 done" "$tmp/again.out" || fail "third call: timing.json of another binary reused: $(cat "$tmp/again.out")"
grep -q "figures and report up to date" "$tmp/again.out" && fail "third call kept a deleted figure missing"
[[ -s "$tmp/capacity/load_heatmaps.png" ]] || fail "third call did not draw load_heatmaps.png again"

# run.json records what defines the run beyond its overrides; a kept run that differs from
# the call in steps, data, validation sample or base config stops it with one line (exit 1)
# before anything trains or is written; another binary is one warning line, the runs kept.
py "import json, sys
r = json.load(open('$tmp/capacity/top1-cf1.0/seed1/run.json'))
sys.exit(0 if r['steps'] == 4 and r['data'] == '$tmp/data' and r['config'].endswith('ci.yaml') and r['binary'] and
         all(len(r[k]) == 64 for k in ('data_index_sha256', 'config_sha256', 'binary_sha256')) else 1)" ||
  fail "run.json: $(cat "$tmp/capacity/top1-cf1.0/seed1/run.json")"
bash "$dir/capacity.sh" "${common[@]}" --steps 5 --out "$tmp/capacity" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 && ! -s "$tmp/out" ]] &&
  grep -q "^capacity.sh: error: .*/top1-cf1.0/seed1 was trained with other inputs than this call's: was 4 steps, now 5 (remove it, or use another --out)$" "$tmp/err" ||
  fail "other steps: exit $rc, $(cat "$tmp/out" "$tmp/err")"
"$bin" prep --out "$tmp/data2" --vocab 120 --val-fraction 0.2 --seed 2 "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" \
  >"$tmp/prep2.out" 2>&1 || fail "prep data2: $(cat "$tmp/prep2.out")"
sed 's/^  lr: .*/  lr: 0.004/' "$dir/../../configs/experiments/ci.yaml" >"$tmp/ci2.yaml"
bash "$dir/moe_vs_dense.sh" "${common[@]}" --out "$tmp/sampled" --data "$tmp/data2" --config "$tmp/ci2.yaml" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] &&
  grep -q "seed1 was trained with other inputs than this call's: was data $tmp/data (index.json sha256 [0-9a-f]*), now $tmp/data2 ([0-9a-f]*); was validated on 4 blocks of 64 tokens, now the whole split; was base config .*ci.yaml (sha256 [0-9a-f]*), now $tmp/ci2.yaml" "$tmp/err" ||
  fail "other data, sample and config: exit $rc, $(cat "$tmp/err")"
grep -q "\"source\": \"$tmp/data\"" "$tmp/sampled/val-sample/sample.json" || fail "a refused call rewrote the validation sample"
cp "$bin" "$tmp/switchyard2" && printf x >>"$tmp/switchyard2"
bash "$dir/capacity.sh" "${common[@]}" --bin "$tmp/switchyard2" --out "$tmp/capacity" >"$tmp/out" 2>"$tmp/err" ||
  fail "another binary: exit $?: $(cat "$tmp/err")"
[[ $(wc -l <"$tmp/err") -eq 1 && $(grep -c "already done" "$tmp/out") -eq 4 ]] &&
  grep -q "^capacity.sh: warning: 4 kept runs (top1-cf1.0/seed1 and 3 more) were trained by another switchyard binary ($bin, sha256 [0-9a-f]*; now $tmp/switchyard2, [0-9a-f]*): kept" "$tmp/err" ||
  fail "another binary: $(cat "$tmp/err" "$tmp/out")"

# A failed training's error line quotes the engine's error, not the config dump after it.
bash "$dir/capacity.sh" "${common[@]}" --out "$tmp/failed" --set train.micro_batch_size=100000 >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] &&
  grep -q "^capacity.sh: error: training top[12]-[a-z0-9.]*/seed1 failed (exit 2; .*seed1.log): switchyard train: error: .*the validation split" "$tmp/err" ||
  fail "failed training: exit $rc, $(cat "$tmp/err")"

# A validation sample rebuilt for another corpus in the same place links that corpus's
# train shards and tokenizer, not the first one's.
py "import os, sys
sys.path.insert(0, '$dir')
import val_sample
for src in ('$tmp/data', '$tmp/data2'):
    n = val_sample.make(src, '$tmp/vs', 4, 64)
links = sorted((e.name, os.readlink(e.path)) for e in os.scandir('$tmp/vs') if e.is_symlink())
ok = n == 256 and links and all(t == os.path.join('$tmp/data2', name) for name, t in links)
print(links); sys.exit(0 if ok else 1)" >"$tmp/vs.out" 2>&1 || fail "val sample for another corpus: $(cat "$tmp/vs.out")"

# A diverging learning rate: both runs stop on a non-finite loss (exit 3), the experiment
# finishes and counts them as diverged and unstable.
bash "$dir/zloss.sh" "${common[@]}" --out "$tmp/diverge" --set train.lr=1e4 --set train.grad_clip=0 \
  >"$tmp/diverge.out" 2>&1 || fail "zloss at lr 1e4: exit $?: $(tail -3 "$tmp/diverge.out")"
py "import json, sys
s = json.load(open('$tmp/diverge/summary.json'))['settings']
sys.exit(0 if all((st['runs'], st['ok'], st['diverged'], st['stable']) == (1, 0, 1, 0) for st in s) else 1)" ||
  fail "diverged runs not counted: $(cat "$tmp/diverge/summary.md" 2>/dev/null)"
grep -q "| lr0.03-z0 | .* | 0/1 | 0/1 | 0/1 | 1/1 |" "$tmp/diverge/summary.md" || fail "summary.md: $(cat "$tmp/diverge/summary.md")"
py "import csv, sys
rows = list(csv.DictReader(open('$tmp/diverge/per_seed.csv')))
sys.exit(0 if len(rows) == 4 and all(r['status'] == 'diverged' and r['val_loss'] == '' and r['stable'] == '0' for r in rows) else 1)" ||
  fail "diverged runs in per_seed.csv: $(cat "$tmp/diverge/per_seed.csv")"

# Bad arguments: one line, exit 2, nothing created; a missing corpus: one line naming the
# script that builds it, exit 1.
for bad in "--grid huge" "--steps 0" "--jobs 0" "--seeds x" "--set nokey" "--bogus"; do
  bash "$dir/moe_vs_dense.sh" $bad --bin "$bin" --out "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 && $(wc -l <"$tmp/err") -eq 1 ]] || fail "$bad: exit $rc, stderr $(cat "$tmp/err")"
  grep -q "^moe_vs_dense.sh: error: " "$tmp/err" || fail "$bad: $(cat "$tmp/err")"
done
# The keys the runner sets for every run are refused as --set, each pointing at its flag.
for kv in train.seed=5:--seeds train.max_steps=3:--steps data.dir=x:--data data.paths=x:--data \
          model.vocab_size=9:"the prepared data's"; do
  bash "$dir/moe_vs_dense.sh" --set "${kv%%:*}" --bin "$bin" --out "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "^moe_vs_dense.sh: error: --set '${kv%%:*}': .*${kv#*:}" "$tmp/err" ||
    fail "--set ${kv%%:*}: exit $rc, stderr $(cat "$tmp/err")"
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
