#!/usr/bin/env bash
# scripts/study_load_balance.sh on its ci grid (the default switch-tiny routing and
# dropless, a few steps on a tiny corpus): both runs train and are evaluated on the whole
# validation split in micro-batches of the config's size (8), summary.md/.json hold one row
# each with the numbers of the runs' files (the dropless run drops nothing), the report
# overlays both runs, a second call keeps the finished runs, and bad arguments are one line.
# Usage: study_cli_test.sh path/to/switchyard path/to/scripts/study_load_balance.sh
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
study="$2"

make_corpus "$tmp/data"
args=(--grid ci --steps 6 --bin "$bin" --data "$tmp/data" --out "$tmp/study"
      --set model.seq_len=16 --set train.eval_every=3 --set train.eval_batches=1 --set train.warmup_steps=1)
bash "$study" "${args[@]}" >"$tmp/study.out" 2>&1 || { echo "FAIL: study: $(tail -5 "$tmp/study.out")"; exit 1; }
for f in summary.md summary.json report.html default/routing_by_language.json dropless/routing_by_language.json \
         default/eval.json dropless/eval.json; do
  [[ -s "$tmp/study/$f" ]] || fail "the study wrote no $f"
done
check=$(py "import json, math
rows = json.load(open('$tmp/study/summary.json'))
errs = []
if [r['run'] for r in rows] != ['default', 'dropless']: errs.append('runs %r' % [r['run'] for r in rows])
for r in rows:
    steps, val = [], None
    for line in open('$tmp/study/%s/metrics.jsonl' % r['run']):
        d = json.loads(line)
        if 'moe' in d: steps.append(d)
        elif 'val_loss' in d: val = d['val_loss']
    if r['steps'] != 6 or len(steps) != 6: errs.append('steps')
    # eval --batches 0: every sequence of the split, the last micro-batch padded.
    ev = json.load(open('$tmp/study/%s/eval.json' % r['run']))
    if r['val_loss'] != ev['loss'] or ev['batches'] < 1 or not 8 * (ev['batches'] - 1) < ev['sequences'] <= 8 * ev['batches']: errs.append('val_loss %r vs eval.json %r' % (r['val_loss'], ev))
    dropped = sum(l['dropped'] for d in steps for l in d['moe']) / sum(l['assignments'] for d in steps for l in d['moe'])
    if abs(r['dropped_run'] - dropped) > 1e-12: errs.append('dropped_run')
    if abs(r['max_violation_end'] - sum(l['max_violation'] for l in steps[-1]['moe']) / len(steps[-1]['moe'])) > 1e-12: errs.append('max_violation_end')
    lang = json.load(open('$tmp/study/%s/routing_by_language.json' % r['run']))
    if not (0 <= r['lang_mi_bits'] <= 1 + 1e-9): errs.append('MI %r outside [0, log2(2 languages)]' % r['lang_mi_bits'])
rows = {r['run']: r for r in rows}
if rows['dropless']['dropped_run'] != 0: errs.append('dropless dropped')
if not rows['default']['dropped_run'] > 0: errs.append('the default (capacity 1.25) dropped nothing')
md = open('$tmp/study/summary.md').read().splitlines()
if len(md) != 4 or not md[2].startswith('| default |') or not md[3].startswith('| dropless |'): errs.append('summary.md %r' % md)
page = open('$tmp/study/report.html').read()
for pid in ('share_0_L1_before', 'share_1_L3_after', 'lang_1_L3'):
    if 'id=\"plot-%s\"' % pid not in page: errs.append('report lacks %s' % pid)
print('; '.join(errs) if errs else 'ok')" 2>&1)
[[ "$check" == ok ]] || fail "study outputs: $check"

# A second call finds both runs done and trains nothing.
bash "$study" "${args[@]}" >"$tmp/again.out" 2>&1 || fail "second study call: $(tail -3 "$tmp/again.out")"
[[ $(grep -c "already done" "$tmp/again.out") -eq 2 ]] || fail "second call retrained: $(cat "$tmp/again.out")"

# Bad arguments: one line, exit 2 (with the binary under test, so that a build directory
# other than build/ does not fail the binary check first).
for bad in "--grid huge" "--steps 0" "--bogus"; do
  bash "$study" --bin "$bin" $bad --out "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 && $(wc -l <"$tmp/err") -eq 1 ]] || fail "study $bad: exit $rc, stderr $(cat "$tmp/err")"
done
[[ ! -e "$tmp/bad" ]] || fail "a refused study created its output directory"

[[ $failures -eq 0 ]] && echo "study_cli_test: all checks passed"
exit $((failures > 0))
