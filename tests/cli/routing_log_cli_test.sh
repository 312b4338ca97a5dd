#!/usr/bin/env bash
# logging.routing_every: metrics.jsonl holds the per-layer scalars every step and no
# per-expert counts; routing.jsonl holds the counts (and the expert biases) at the steps
# N divides and at the last step, consistent with the scalars of the same step; the bias
# follows the update rule step by step; a resumed run appends the same lines as a straight
# one; routing_by_language.json holds the counts of the run's second half; a bad value is
# one error line. With an mpirun launcher (tests/dist): two pipeline stages (pp=2, one MoE
# layer each) and two data-parallel ranks write the same routing.jsonl and
# routing_by_language.json as one rank.
# Usage: routing_log_cli_test.sh path/to/switchyard [path/to/mpirun_test.sh]
set -u
mpirun_sh="${2:-}"
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"

make_corpus "$tmp/data"
tiny_moe_config "$tmp/tiny.yaml" "$tmp/data"
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/run" >"$tmp/train.out" 2>&1 ||
  { echo "FAIL: train: $(tail -5 "$tmp/train.out")"; exit 1; }

# --- The logged steps and their consistency with metrics.jsonl.
check=$(py "import json, math
m = {}
for line in open('$tmp/run/metrics.jsonl'):
    d = json.loads(line)
    if 'moe' in d: m[d['step']] = d
r = [json.loads(l) for l in open('$tmp/run/routing.jsonl')]
errs = []
if sorted(m) != list(range(8)): errs.append('metrics steps %r' % sorted(m))
if [d['step'] for d in r] != [0, 3, 6, 7]: errs.append('routing steps %r' % [d['step'] for d in r])
for d in m.values():
    for l in d['moe']:
        if 'tokens_per_expert' in l or 'tokens_per_expert_kept' in l: errs.append('counts in metrics.jsonl')
        for k in ('dropped_frac', 'router_entropy', 'aux', 'z', 'min_load', 'max_load', 'max_violation', 'load_cv'):
            if k not in l: errs.append('no %s' % k)
for d in r:
    s = m[d['step']]
    if d['layers'] != [0, 1]: errs.append('layers %r' % d['layers'])
    if len(d['expert_bias']) != 2: errs.append('expert_bias')
    for i, l in enumerate(s['moe']):
        b, k = d['tokens_per_expert'][i], d['tokens_per_expert_kept'][i]
        if len(b) != 4 or len(k) != 4 or len(d['expert_bias'][i]) != 4: errs.append('E')
        if sum(b) != l['assignments'] or l['assignments'] != 2 * 2 * 16: errs.append('assignments')
        if sum(b) - sum(k) != l['dropped']: errs.append('dropped')
        mean = sum(b) / 4
        if abs(l['max_violation'] - (max(b) / mean - 1)) > 1e-12: errs.append('max_violation')
        cv = math.sqrt(sum((c - mean) ** 2 for c in b) / 4) / mean
        if abs(l['load_cv'] - cv) > 1e-12: errs.append('load_cv')
        if l['max_load'] != max(k) / sum(k) or l['min_load'] != min(k) / sum(k): errs.append('loads')
if not any(l['dropped'] > 0 for d in m.values() for l in d['moe']): errs.append('nothing dropped at capacity 1.0')
print('; '.join(sorted(set(errs))) if errs else 'ok')" 2>&1)
[[ "$check" == ok ]] || fail "routing.jsonl vs metrics.jsonl: $check"

# --- routing_by_language.json: the (label, expert) counts of steps 4..7, every token labelled.
check=$(py "import json
j = json.load(open('$tmp/run/routing_by_language.json'))
m = [json.loads(l) for l in open('$tmp/run/metrics.jsonl')]
errs = []
if j['layers'] != [0, 1] or j['num_experts'] != 4: errs.append('header %r' % {k: j[k] for k in ('layers', 'num_experts')})
if sorted(j['labels']) != ['de', 'en']: errs.append('labels %r' % j['labels'])
for i in range(2):
    want = sum(d['moe'][i]['assignments'] for d in m if 'moe' in d and d['step'] >= 4)
    got = sum(sum(row) for row in j['counts'][i])
    if got != want: errs.append('layer %d: %d counted, %d assignments in steps 4..7' % (i, got, want))
    if any(len(row) != 4 for row in j['counts'][i]): errs.append('E')
print('; '.join(errs) if errs else 'ok')" 2>&1)
[[ "$check" == ok ]] || fail "routing_by_language.json: $check"

# --- Every step logged: the bias after step s is the bias after s-1 plus rate * sign(mean -
# count) of step s's counts before dropping (f32, from zero).
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/every" --set logging.routing_every=1 \
  --set train.max_steps=4 >"$tmp/every.out" 2>&1 || fail "train routing_every=1: $(tail -3 "$tmp/every.out")"
check=$(py "import json, numpy as np
r = [json.loads(l) for l in open('$tmp/every/routing.jsonl')]
errs = []
if [d['step'] for d in r] != [0, 1, 2, 3]: errs.append('steps %r' % [d['step'] for d in r])
bias = np.zeros((2, 4), np.float32)
for d in r:
    for i in range(2):
        c = np.array(d['tokens_per_expert'][i])
        bias[i] += np.float32(0.01) * np.sign(c.sum() - 4 * c).astype(np.float32)
        if not np.array_equal(np.array(d['expert_bias'][i], np.float32), bias[i]): errs.append('bias at step %d layer %d: %r != %r' % (d['step'], i, d['expert_bias'][i], bias[i].tolist()))
if not bias.any(): errs.append('the bias never moved')
# routing_by_language.json, summed over the labels (every token is labelled), holds each
# expert's assignments of steps 2 and 3 (the second half), expert by expert: its counts
# are made on the device in the step's readback, these by the routing statistics.
j = json.load(open('$tmp/every/routing_by_language.json'))
for i in range(2):
    got = np.array(j['counts'][i]).sum(axis=0)
    want = sum(np.array(d['tokens_per_expert'][i]) for d in r if d['step'] >= 2)
    if not np.array_equal(got, want): errs.append('layer %d by language %r != %r' % (i, got.tolist(), want.tolist()))
print('; '.join(errs) if errs else 'ok')" 2>&1)
[[ "$check" == ok ]] || fail "expert bias trajectory, routing by language: $check"

# --- routing_every=0: the last step alone; a run without the bias logs no expert_bias.
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/end" --set logging.routing_every=0 \
  --set moe.expert_bias_rate=0 --set train.max_steps=3 >"$tmp/end.out" 2>&1 || fail "train routing_every=0"
check=$(py "import json
r = [json.loads(l) for l in open('$tmp/end/routing.jsonl')]
print('ok' if [d['step'] for d in r] == [2] and 'expert_bias' not in r[0] else repr(r))" 2>&1)
[[ "$check" == ok ]] || fail "routing_every=0: $check"

# --- Stopped after 4 steps and resumed: the same routing.jsonl as the straight run.
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/half" --steps 4 >"$tmp/half.out" 2>&1 &&
  "$bin" train --config "$tmp/tiny.yaml" --out "$tmp/half" --resume "$tmp/half" >>"$tmp/half.out" 2>&1 ||
  fail "train --steps 4 then --resume: $(tail -3 "$tmp/half.out")"
# The first half logs its own last step (3); the straight run logs 3 too (3 divides it).
cmp -s "$tmp/half/routing.jsonl" "$tmp/run/routing.jsonl" ||
  fail "resumed routing.jsonl differs from the straight run's: $(diff "$tmp/half/routing.jsonl" "$tmp/run/routing.jsonl" | head -4)"

# --- Stopped by SIGTERM: the step it stopped after is logged too.
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/sig" --set train.max_steps=1000000 \
  --set logging.routing_every=100000 --set train.eval_every=0 >"$tmp/sig.out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [[ -f "$tmp/sig/metrics.jsonl" && $(wc -l <"$tmp/sig/metrics.jsonl") -ge 5 ]] && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
check=$(py "import json
m = [json.loads(l)['step'] for l in open('$tmp/sig/metrics.jsonl') if '\"moe\"' in l]
r = [json.loads(l)['step'] for l in open('$tmp/sig/routing.jsonl')]
print('ok' if r == [0, m[-1]] and m[-1] > 0 else 'routing steps %r, last metrics step %r' % (r, m[-1]))" 2>&1)
[[ "$check" == ok ]] || fail "SIGTERM: $check ($(tail -2 "$tmp/sig.out"))"

# --- A bad value: one line, exit 2, nothing written.
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/bad" --set logging.routing_every=-2 >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 2 ]] || fail "routing_every=-2: exit status $rc, want 2"
[[ $(wc -l <"$tmp/err") -eq 1 ]] && grep -qF "logging.routing_every=-2 must be >= 0" "$tmp/err" ||
  fail "routing_every=-2: stderr $(cat "$tmp/err")"
[[ ! -e "$tmp/bad" ]] || fail "routing_every=-2 created $tmp/bad"

# --- Under mpirun: every layout logs what one rank logs (the biases gathered over pp, the
# language counts summed over the stages and the data-parallel ranks).
if [[ -n "$mpirun_sh" ]]; then
  # pp=2 runs one rank's micro-batches through two stages; dp=2 (grad_accum 1, the same 4
  # sequences per step, each rank one micro-batch) sums the routing over the ranks.
  for layout in "parallel.pp=2" "train.grad_accum=1"; do
    tag=${layout//[.=]/-}
    bash "$mpirun_sh" 2 "$bin" train --config "$tmp/tiny.yaml" --out "$tmp/$tag" --set "$layout" \
      >"$tmp/$tag.out" 2>&1 || { fail "$layout: train: $(tail -3 "$tmp/$tag.out")"; continue; }
    for f in routing.jsonl routing_by_language.json; do
      cmp -s "$tmp/$tag/$f" "$tmp/run/$f" || fail "$layout: $f differs from one rank's: $(diff "$tmp/$tag/$f" "$tmp/run/$f" | head -4)"
    done
  done
fi

[[ $failures -eq 0 ]] && echo "routing_log_cli_test: all checks passed"
exit $((failures > 0))
