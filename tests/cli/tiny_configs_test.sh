#!/usr/bin/env bash
# Every configs/*-tiny.yaml learns: on a small slice of the fortune corpus (prep'ed here),
# 40 steps of each config (warmup 5, cosine to step 40) must bring the mean loss of the last
# five steps at least 0.5 below the first step's loss, which starts near ln(vocab).
#   tiny_configs_test.sh SWITCHYARD CONFIG_DIR
# Skipped (exit 77) with the reason when Debian's fortune files are not installed.
set -uo pipefail
bin=$1
configs=$2
if [[ ! -d /usr/share/games/fortunes ]]; then
  echo "SKIPPED: /usr/share/games/fortunes is missing (bash scripts/setup.sh installs it)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
python=/usr/bin/python3
[[ -x $python ]] || python=python3

"$bin" prep --out "$tmp/data" --vocab 1000 --max-docs-per-label 400 >"$tmp/prep.log" 2>&1 ||
  { cat "$tmp/prep.log"; exit 1; }

found=0
for cfg in "$configs"/*-tiny.yaml; do
  name=$(basename "$cfg" .yaml)
  found=$((found + 1))
  if ! "$bin" train --config "$cfg" --out "$tmp/$name" --set "data.dir=$tmp/data" \
      --set train.max_steps=40 --set train.warmup_steps=5 --set train.eval_every=0 \
      >"$tmp/$name.log" 2>&1; then
    fail "$name: training failed: $(tail -3 "$tmp/$name.log")"
    continue
  fi
  if msg=$($python - "$tmp/$name/metrics.jsonl" <<'PY'
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
first, last = losses[0], sum(losses[-5:]) / 5
print(f"{len(losses)} steps, loss {first:.4f} -> {last:.4f} (mean of the last 5)")
sys.exit(0 if len(losses) == 40 and last < first - 0.5 else 1)
PY
  ); then
    echo "--- $name: $msg"
  else
    fail "$name: the loss did not fall: $msg"
  fi
done
[[ $found -ge 4 ]] || fail "expected at least 4 tiny configs in $configs, found $found"
if [[ $failures -eq 0 ]]; then
  echo "all tiny configs learn"
else
  echo "$failures tiny-config check(s) failed"
  exit 1
fi
