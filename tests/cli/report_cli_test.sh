#!/usr/bin/env bash
# `switchyard report` end to end: two short real runs (one with the aux-loss-free bias, one
# without and at capacity 2.0), the page of one run and of both overlaid, each opened in
# headless Chromium: no console message, every plot in the DOM as an SVG (the page's own
# check agrees), nothing fetched from outside; the numbers embedded in the page equal those
# recomputed from metrics.jsonl, routing.jsonl and routing_by_language.json; errors are one
# line and leave an existing report intact; runs without validation get a line saying so
# instead of an empty validation-loss plot. A control page proves console errors are seen.
# Usage: report_cli_test.sh path/to/switchyard
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
source "$(dirname "$0")/moe_run_lib.sh"
chromium=$(command -v chromium || command -v chromium-browser) ||
  { echo "FAIL: chromium is not installed (scripts/setup.sh installs it)"; exit 1; }

make_corpus "$tmp/data"
tiny_moe_config "$tmp/tiny.yaml" "$tmp/data"
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/biased" >"$tmp/train.out" 2>&1 ||
  { echo "FAIL: train: $(tail -5 "$tmp/train.out")"; exit 1; }
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/cf2" --set moe.expert_bias_rate=0 \
  --set moe.capacity_factor=2.0 >"$tmp/train2.out" 2>&1 ||
  { echo "FAIL: train cf2: $(tail -5 "$tmp/train2.out")"; exit 1; }

# open PAGE: loads the page in headless Chromium; its DOM after load goes to $tmp/dom.html,
# every console message (errors, uncaught exceptions, failed loads) to $tmp/console.txt.
open_page() {
  rm -rf "$tmp/chrome"
  "$chromium" --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chrome" \
    --enable-logging=stderr --v=0 --dump-dom "file://$1" >"$tmp/dom.html" 2>"$tmp/chrome.err"
  grep ':CONSOLE' "$tmp/chrome.err" >"$tmp/console.txt"
  [[ -s "$tmp/dom.html" ]] || fail "chromium printed no DOM for $1: $(tail -3 "$tmp/chrome.err")"
}

# The control: a console error and an uncaught exception are both caught.
printf '<html><body><script>console.error("control-error")</script><script>nope()</script></body></html>' >"$tmp/control.html"
open_page "$tmp/control.html"
grep -q control-error "$tmp/console.txt" && grep -q 'nope is not defined' "$tmp/console.txt" ||
  fail "the console capture misses errors: $(cat "$tmp/console.txt")"

# check_page PAGE RUN...: the DOM and the numbers of a report of RUN....
check_page() {
  local page="$1"; shift
  open_page "$page"
  [[ ! -s "$tmp/console.txt" ]] || fail "$page: console messages: $(head -3 "$tmp/console.txt")"
  grep -Eiq '<(link|img|iframe)[^>]* (src|href)="https?:|<script[^>]* src=' "$page" &&
    fail "$page: refers to an outside resource"
  local check
  check=$(py "import json, math, re, sys, html.parser
runs = sys.argv[1:]
page = open('$page').read()
dom = open('$tmp/dom.html').read()
data = json.loads(re.search(r'<script type=\"application/json\" id=\"switchyard-data\">(.*?)</script>', page, re.S).group(1).replace('<\\\\/', '</'))
P = data['plots']
errs = []
# Every plot: its div in the DOM after load, holding an SVG; the page's own count agrees.
class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.stack = []; self.svg_in = set(); self.divs = set()
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == 'div' and a.get('id', '').startswith('plot-'): self.divs.add(a['id'][5:]); self.stack.append(a['id'][5:])
        elif tag == 'div': self.stack.append(None)
        if tag == 'svg':
            for s in self.stack:
                if s: self.svg_in.add(s)
    def handle_endtag(self, tag):
        if tag == 'div' and self.stack: self.stack.pop()
d = Dom(); d.feed(dom)
want = {'loss', 'val_loss', 'tokens_per_s'} | {'layer_' + k for k in ('dropped_frac', 'router_entropy', 'aux', 'z', 'max_violation', 'load_cv')}
for ri, run in enumerate(runs):
    for L in (0, 1):
        want |= {'share_%d_L%d_before' % (ri, L), 'share_%d_L%d_after' % (ri, L), 'lang_%d_L%d' % (ri, L)}
        if 'biased' in run: want.add('bias_%d_L%d' % (ri, L))
if set(P) != want: errs.append('plots %r, want %r' % (sorted(set(P) ^ want), 'sym. diff.'))
missing = [p for p in want if p not in d.svg_in]
if missing: errs.append('no SVG in the DOM for %r' % sorted(missing))
m = re.search(r'data-plots-rendered=\"(\d+)\"', dom)
if not m or int(m.group(1)) != len(want): errs.append('the page counted %r plots' % (m and m.group(1)))
# The numbers.
def close(a, b): return a == b or (a is not None and b is not None and abs(a - b) <= 1e-12 * max(1.0, abs(b)))
def series(pid, label):
    for s in P[pid]['series']:
        if s['label'] == label: return s
    errs.append('%s: no series %s' % (pid, label)); return {'x': [], 'y': []}
names = data['runs']
if names != [r.rstrip('/').split('/')[-1] for r in runs]: errs.append('names %r' % names)
for ri, (run, name) in enumerate(zip(runs, names)):
    steps, val = [], []
    for line in open(run + '/metrics.jsonl'):
        j = json.loads(line)
        if 'moe' in j: steps.append(j)
        elif 'val_loss' in j: val.append(j)
    rt = [json.loads(l) for l in open(run + '/routing.jsonl')]
    lang = json.load(open(run + '/routing_by_language.json'))
    for pid, key in (('loss', 'loss'), ('tokens_per_s', 'tokens_per_s')):
        s = series(pid, name)
        if s['x'] != [j['step'] for j in steps] or s['y'] != [j[key] for j in steps]: errs.append('%s of %s' % (pid, name))
    s = series('val_loss', name)
    if s['x'] != [j['step'] for j in val] or s['y'] != [j['val_loss'] for j in val] or not val: errs.append('val_loss of %s' % name)
    for key in ('dropped_frac', 'router_entropy', 'aux', 'z', 'max_violation', 'load_cv'):
        for L in (0, 1):
            s = series('layer_' + key, '%s L%d' % (name, L))
            if s['y'] != [j['moe'][L][key] for j in steps]: errs.append('%s L%d of %s' % (key, L, name))
    for L in (0, 1):
        for what, key in (('before', 'tokens_per_expert'), ('after', 'tokens_per_expert_kept')):
            h = P['share_%d_L%d_%s' % (ri, L, what)]
            if h['cols'] != [r['step'] for r in rt]: errs.append('share steps')
            for si, r in enumerate(rt):
                c, total = r[key][L], sum(r['tokens_per_expert'][L])
                for e in range(4):
                    if not close(h['z'][e][si], c[e] / total): errs.append('share %s e%d step %d' % (what, e, r['step']))
        if 'biased' in run:
            for e in range(4):
                if series('bias_%d_L%d' % (ri, L), 'e%d' % e)['y'] != [r['expert_bias'][L][e] for r in rt]: errs.append('bias e%d' % e)
        h = P['lang_%d_L%d' % (ri, L)]
        if h['rows'] != lang['labels']: errs.append('lang rows %r' % h['rows'])
        for li, counts in enumerate(lang['counts'][L]):
            for e in range(4):
                if not close(h['z'][li][e], 100.0 * counts[e] / sum(counts)): errs.append('lang %d e%d' % (li, e))
print('; '.join(sorted(set(errs))) if errs else 'ok')" "$@" 2>&1)
  [[ "$check" == ok ]] || fail "$page: $check"
}

"$bin" report "$tmp/biased" --out "$tmp/one.html" >"$tmp/report.out" 2>&1 ||
  fail "report of one run: $(cat "$tmp/report.out")"
[[ -s "$tmp/one.html" ]] && check_page "$tmp/one.html" "$tmp/biased"
"$bin" report "$tmp/biased" "$tmp/cf2" --out "$tmp/two.html" >"$tmp/report.out" 2>&1 ||
  fail "report of two runs: $(cat "$tmp/report.out")"
[[ -s "$tmp/two.html" ]] && check_page "$tmp/two.html" "$tmp/biased" "$tmp/cf2"

# --- A run without validation (train.eval_every 0): no empty validation-loss plot but a
# line saying so; beside a run with validation, only that run's series and a line naming
# the other.
"$bin" train --config "$tmp/tiny.yaml" --out "$tmp/noval" --set train.eval_every=0 \
  >"$tmp/train3.out" 2>&1 || fail "train noval: $(tail -5 "$tmp/train3.out")"
! grep -q val_loss "$tmp/noval/metrics.jsonl" || fail "train.eval_every=0 still validated"
# check_noval PAGE NOTE SERIES...: PAGE loads cleanly, holds NOTE and the val_loss series
# SERIES (none: no val_loss plot at all).
check_noval() {
  local page="$1" note="$2"; shift 2
  open_page "$page"
  [[ ! -s "$tmp/console.txt" ]] || fail "$page: console messages: $(head -3 "$tmp/console.txt")"
  grep -qF "<p class=\"note\">$note</p>" "$page" || fail "$page: no line '$note'"
  local check
  check=$(py "import json, re, sys
page = open('$page').read(); dom = open('$tmp/dom.html').read()
P = json.loads(re.search(r'<script type=\"application/json\" id=\"switchyard-data\">(.*?)</script>', page, re.S).group(1).replace('<\\\\/', '</'))['plots']
want = sys.argv[1:]
got = [s['label'] for s in P['val_loss']['series']] if 'val_loss' in P else []
errs = []
if got != want: errs.append('val_loss series %r, want %r' % (got, want))
if ('val_loss' in P) != bool(want): errs.append('a val_loss plot with nothing to show')
m = re.search(r'data-plots-rendered=\"(\\d+)\"', dom)
if not m or int(m.group(1)) != len(P): errs.append('the page counted %r of %d plots' % (m and m.group(1), len(P)))
print('; '.join(errs) if errs else 'ok')" "$@" 2>&1)
  [[ "$check" == ok ]] || fail "$page: $check"
}
"$bin" report "$tmp/noval" --out "$tmp/noval.html" >"$tmp/report.out" 2>&1 ||
  fail "report of a run without validation: $(cat "$tmp/report.out")"
check_noval "$tmp/noval.html" "no validation in these runs (train.eval_every 0): no validation-loss plot"
"$bin" report "$tmp/biased" "$tmp/noval" --out "$tmp/mixed.html" >"$tmp/report.out" 2>&1 ||
  fail "report of runs with and without validation: $(cat "$tmp/report.out")"
check_noval "$tmp/mixed.html" "no validation in noval (train.eval_every 0)" biased

# --- Errors: one line; an existing report stays as it was.
cp "$tmp/one.html" "$tmp/keep.html"
expect_usage_error "no --out" "--out is required" report "$tmp/biased"
expect_usage_error "no run" "no RUN directory given" report --out "$tmp/keep.html"
expect_usage_error "unknown flag" "unknown flag --nope" report "$tmp/biased" --out "$tmp/keep.html" --nope
err_one_line "not a run" "$tmp/data: no metrics.jsonl" report "$tmp/biased" "$tmp/data" --out "$tmp/keep.html"
err_one_line "no directory" "does not exist" report "$tmp/biased" --out "$tmp/nodir/r.html"
mkdir -p "$tmp/broken" && head -c 40 "$tmp/biased/metrics.jsonl" >"$tmp/broken/metrics.jsonl"
err_one_line "corrupt metrics" "metrics.jsonl:1: not JSON" report "$tmp/broken" --out "$tmp/keep.html"
# Damaged inputs: one line naming the file and what is wrong, exit 1, no traceback.
mkdir -p "$tmp/badlang" && cp "$tmp/biased/metrics.jsonl" "$tmp/badlang/"
echo '{"labels":["a"],"layers":[1],"num_experts":2,"counts":[]}' >"$tmp/badlang/routing_by_language.json"
err_one_line "malformed routing_by_language.json" \
  "$tmp/badlang/routing_by_language.json: counts must hold, for each of the 1 layers, 1 labels of 2 non-negative counts" \
  report "$tmp/badlang" --out "$tmp/keep.html"
mkdir -p "$tmp/binary" && printf '\xbf\x00\xff\n' >"$tmp/binary/metrics.jsonl"
err_one_line "binary metrics.jsonl" "$tmp/binary/metrics.jsonl:1: not UTF-8 text (byte 0xbf at column 1)" \
  report "$tmp/binary" --out "$tmp/keep.html"
mkdir -p "$tmp/badstep" && echo '{"step":0,"loss":"x","moe":[]}' >"$tmp/badstep/metrics.jsonl"
err_one_line "a record of the wrong type" "$tmp/badstep/metrics.jsonl: the record of step 0: loss must be a number (or null, diverged) and tokens_per_s a number" \
  report "$tmp/badstep" --out "$tmp/keep.html"
# A diverged run: the trainer writes NaN as null (loss, the layers' scalars, val_loss, an
# expert bias). The page draws it (a gap) and its data keeps null there.
rm -rf "$tmp/diverged" && cp -r "$tmp/biased" "$tmp/diverged"
py "import json, sys
run = sys.argv[1]
lines = [json.loads(l) for l in open(run + '/metrics.jsonl')]
last = [i for i, d in enumerate(lines) if 'moe' in d][-1]
lines[last]['loss'] = None
lines[last]['moe'][0]['router_entropy'] = None
lines[[i for i, d in enumerate(lines) if 'val_loss' in d][-1]]['val_loss'] = None
open(run + '/metrics.jsonl', 'w').write(''.join(json.dumps(d) + '\\n' for d in lines))
rt = [json.loads(l) for l in open(run + '/routing.jsonl')]
rt[-1]['expert_bias'][0][0] = None
open(run + '/routing.jsonl', 'w').write(''.join(json.dumps(d) + '\\n' for d in rt))" "$tmp/diverged"
"$bin" report "$tmp/diverged" --out "$tmp/diverged.html" >"$tmp/report.out" 2>&1 ||
  fail "report of a diverged run (nulls): $(cat "$tmp/report.out")"
py "import json, re, sys
page = open(sys.argv[1]).read()
P = json.loads(re.search(r'<script type=\"application/json\" id=\"switchyard-data\">(.*?)</script>', page, re.S).group(1).replace('<\\\\/', '</'))['plots']
y = lambda pid, label: [s for s in P[pid]['series'] if s['label'] == label][0]['y']
assert y('loss', 'diverged')[-1] is None and y('loss', 'diverged')[0] is not None, y('loss', 'diverged')
assert y('layer_router_entropy', 'diverged L0')[-1] is None
assert y('val_loss', 'diverged')[-1] is None
assert y('bias_0_L0', 'e0')[-1] is None and y('bias_0_L0', 'e1')[-1] is not None" "$tmp/diverged.html" ||
  fail "the diverged run's page does not keep its nulls"
# JSON nested 1,500 deep on one line: one line naming the file and line (was a
# RecursionError traceback).
mkdir -p "$tmp/deep" && cp "$tmp/biased/metrics.jsonl" "$tmp/deep/"
py "import sys; print('{\"d\":' + '[' * 1500 + ']' * 1500 + '}')" >>"$tmp/deep/metrics.jsonl"
err_one_line "deeply nested JSON" \
  "$tmp/deep/metrics.jsonl:$(wc -l <"$tmp/deep/metrics.jsonl"): JSON nested too deeply to read" \
  report "$tmp/deep" --out "$tmp/keep.html"
# routing.jsonl counts must be finite and >= 0 (routing_by_language.json's already were).
for v in -1 NaN; do
  rm -rf "$tmp/badcount" && mkdir -p "$tmp/badcount" && cp "$tmp/biased/metrics.jsonl" "$tmp/badcount/"
  py "import json, sys
lines = open(sys.argv[1]).read().splitlines(); d = json.loads(lines[0])
d['tokens_per_expert'][0][0] = float(sys.argv[2]); lines[0] = json.dumps(d)
print('\n'.join(lines))" "$tmp/biased/routing.jsonl" "$v" >"$tmp/badcount/routing.jsonl"
  err_one_line "routing.jsonl count $v" \
    "$tmp/badcount/routing.jsonl: the record of step $(head -1 "$tmp/biased/routing.jsonl" | sed 's/{"step":\([0-9]*\).*/\1/'): tokens_per_expert must hold, for each of the 2 layers, one finite count >= 0 per expert" \
    report "$tmp/badcount" --out "$tmp/keep.html"
done
# --route: the ids the sample plot reads, checked (expert 99 of 4 was drawn; a string id or
# a file that is not an object gave matplotlib's TypeError).
py "import json
tok = lambda e: {'text': 'a', 'layers': [{'experts': [e, 0]}, {'experts': [1, 0]}]}
good = {'num_experts': 4, 'layers': [0, 1], 'tokens': [tok(2), tok(3)]}
json.dump(good, open('$tmp/route.json', 'w'))
for name, mut in (('99', lambda j: j['tokens'][1]['layers'][0].update(experts=[99])),
                  ('bool', lambda j: j['tokens'][1]['layers'][0].update(experts=[True])),
                  ('float', lambda j: j['tokens'][1]['layers'][0].update(experts=[1.0])),
                  ('e0', lambda j: j.update(num_experts=0)),
                  ('list', lambda j: j.clear())):
    j = json.loads(json.dumps(good)); mut(j)
    json.dump([1] if name == 'list' else j, open('$tmp/route_%s.json' % name, 'w'))"
for bad in 99 bool float; do
  err_one_line "--route expert $bad" \
    "$tmp/route_$bad.json: tokens[1].layers[0]: experts must be a non-empty list of expert ids, integers in [0, 4)" \
    report "$tmp/biased" --route "$tmp/route_$bad.json" --out "$tmp/keep.html"
done
err_one_line "--route num_experts 0" "$tmp/route_e0.json: num_experts must be an integer >= 1" \
  report "$tmp/biased" --route "$tmp/route_e0.json" --out "$tmp/keep.html"
err_one_line "--route not an object" "$tmp/route_list.json: not a JSON object" \
  report "$tmp/biased" --route "$tmp/route_list.json" --out "$tmp/keep.html"
"$bin" report "$tmp/biased" --route "$tmp/route.json" --out "$tmp/route.html" >"$tmp/report.out" 2>&1 &&
  grep -q 'id="plot-route_L0"' "$tmp/route.html" || fail "a good --route: $(cat "$tmp/report.out")"
# A layer of routing_by_language.json with no count at all: a line instead of a TypeError.
mkdir -p "$tmp/zerolang" && cp "$tmp/biased/metrics.jsonl" "$tmp/zerolang/"
py "import json
j = json.load(open('$tmp/biased/routing_by_language.json'))
j['counts'][0] = [[0] * j['num_experts'] for _ in j['labels']]
json.dump(j, open('$tmp/zerolang/routing_by_language.json', 'w'))"
"$bin" report "$tmp/zerolang" --out "$tmp/zerolang.html" >"$tmp/report.out" 2>&1 ||
  fail "a language table with an empty layer: $(cat "$tmp/report.out")"
grep -qF "layer 0: routing_by_language.json counts no assignment of any language" "$tmp/zerolang.html" ||
  fail "a language table with an empty layer: no line saying so"
# The interpreter: one that is not Python, or that writes nothing, is named (exit 1 with no
# line, or exit 0 with no page, before).
SWITCHYARD_PYTHON=/bin/false err_one_line "SWITCHYARD_PYTHON=/bin/false" \
  "SWITCHYARD_PYTHON=/bin/false: not a Python 3 interpreter" report "$tmp/biased" --out "$tmp/keep.html"
SWITCHYARD_PYTHON=/bin/true err_one_line "SWITCHYARD_PYTHON=/bin/true" \
  "report.py with exit status 0 but --out $tmp/new.html was not written" \
  report "$tmp/biased" --out "$tmp/new.html"
cmp -s "$tmp/one.html" "$tmp/keep.html" || fail "a failed report changed the existing file"
# --out one of the inputs: refused (exit 2), the run's files unchanged.
sum_before=$(md5sum "$tmp/biased"/*.json*)
expect_usage_error "--out is the run's metrics" "--out $tmp/biased/metrics.jsonl is an input of the report" \
  report "$tmp/biased" --out "$tmp/biased/metrics.jsonl"
expect_usage_error "--out is the run's routing table" "is an input of the report" \
  report "$tmp/biased" --out "$tmp/biased/../biased/routing_by_language.json"
expect_usage_error "--out is the run directory" "a run directory" report "$tmp/biased" --out "$tmp/biased"
# Anything inside a run directory: its `latest` or a checkpoint's config.yaml was replaced
# by the page (exit 0), and the checkpoint no longer verified.
latest_before=$(md5sum "$tmp/biased/latest" "$tmp/biased"/step-*/config.yaml)
expect_usage_error "--out is the run's latest" "--out $tmp/biased/latest is inside the run directory $tmp/biased" \
  report "$tmp/biased" --out "$tmp/biased/latest"
step_dir=$(ls -d "$tmp/biased"/step-* | tail -1)
expect_usage_error "--out is a checkpoint's config" "is inside the run directory" \
  report "$tmp/biased" --out "$step_dir/config.yaml"
expect_usage_error "--out is new inside the run" "is inside the run directory" \
  report "$tmp/cf2" "$tmp/biased" --out "$tmp/biased/../biased/report.html"
[[ "$latest_before" == "$(md5sum "$tmp/biased/latest" "$tmp/biased"/step-*/config.yaml)" ]] ||
  fail "a refused report changed the run's checkpoint files"
[[ ! -e "$tmp/biased/report.html" ]] || fail "a refused report was written inside the run"
[[ "$sum_before" == "$(md5sum "$tmp/biased"/*.json*)" ]] || fail "a refused report changed the run's files"

[[ $failures -eq 0 ]] && echo "report_cli_test: all checks passed"
exit $((failures > 0))
