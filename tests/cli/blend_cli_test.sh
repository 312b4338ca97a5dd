#!/usr/bin/env bash
# A blend of two prep outputs (data.paths, weights 0.7 / 0.3; the second prepped with the
# first's tokenizer) trains: the routing-by-language table covers the labels of both
# datasets, and 4 steps + --resume 4 steps give exactly the losses of 8 straight steps
# (the data position is the step). A blend with another tokenizer is one error line.
# Usage: blend_cli_test.sh path/to/switchyard path/to/tests/data/train-tiny.yaml
set -u
bin="$(realpath "$1")"
tiny="$(realpath "$2")"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cd "$tmp" || exit 1

python3 - <<'PY'
import random
r = random.Random(1)
for name, words, n in [("en", ["the", "cat", "sat", "on", "mat", "dog"], 300),
                       ("de", ["der", "hund", "lief", "weg", "und"], 150),
                       ("fr", ["le", "chat", "chien", "et"], 150)]:
    with open(f"{name}.txt", "w") as f:
        for _ in range(n):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(5, 25))) + "\n\n")
PY
"$bin" prep --out a --vocab 100 en.txt >prep.log 2>&1 || fail "prep a: $(cat prep.log)"
"$bin" prep --out b --tokenizer a/tokenizer.model de.txt fr.txt >prep.log 2>&1 ||
  fail "prep b: $(cat prep.log)"
"$bin" prep --out c --vocab 90 fr.txt >prep.log 2>&1 || fail "prep c: $(cat prep.log)"
# The tiny config without its data section, then the blend's (a key set twice is refused).
awk '/^data:/ {skip = 1; next} skip && /^[^ #]/ {skip = 0} !skip' "$tiny" >blend.yaml
printf 'data: {paths: [{dir: %s/a, weight: 0.7}, {dir: %s/b, weight: 0.3}]}\n' "$tmp" "$tmp" \
  >>blend.yaml
common=(--config blend.yaml --set train.max_steps=8 --set train.grad_accum=4
        --set train.checkpoint_every=4 --set model.vocab_size=128)

"$bin" train "${common[@]}" --out straight >straight.log 2>&1 || fail "train: $(tail -3 straight.log)"
for label in de en fr; do
  grep -Eq "^  $label +[0-9.]+ " straight.log || fail "routing table lacks $label"
done
"$bin" train "${common[@]}" --out resumed --steps 4 >first.log 2>&1 || fail "first half: $(tail -3 first.log)"
"$bin" train "${common[@]}" --out resumed --resume resumed/step-00000004 >second.log 2>&1 ||
  fail "resume: $(tail -3 second.log)"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1" | sort -u; }
losses straight/metrics.jsonl >want
losses resumed/metrics.jsonl >got
[[ $(wc -l <want) -eq 8 ]] || fail "straight run logged $(wc -l <want) losses"
cmp -s want got || fail "resumed losses differ: $(diff want got | head -5)"

# Another tokenizer in the blend.
sed "s#$tmp/b#$tmp/c#" blend.yaml >mixed.yaml
"$bin" train --config mixed.yaml --set model.vocab_size=128 --out mixed >mixed.out 2>mixed.err
[[ $? -ne 0 ]] || fail "a blend of two tokenizers trained"
grep -q "$tmp/c: its tokenizer differs from $tmp/a's" mixed.err || fail "mixed: $(cat mixed.err)"
[[ $(wc -l <mixed.err) -eq 1 ]] || fail "mixed: $(cat mixed.err)"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all blend checks passed"
