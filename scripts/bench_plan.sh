#!/usr/bin/env bash
# `switchyard plan` against measured step times on this machine (docs/plan.md, "On this
# machine"): calibrates the machine (plan_calibrate on NP_CAL ranks -> a hardware file),
# then trains each layout below for STEPS steps under mpirun, takes the median step time of
# metrics.jsonl after the first fifth of the steps, asks `switchyard plan --config-layout` for
# the same layout, and prints predicted against measured per layout, the median absolute
# error, and, per config and rank count, whether the planner's pick among the measured
# layouts is within 10% of the fastest measured one. Needs a quiet machine: figures from a
# shared one mean nothing. Writes $OUT/plan.json.
#
#   bash scripts/bench_plan.sh                     # every layout, 20 steps
#   STEPS=3 LAYOUTS=2 bash scripts/bench_plan.sh   # the first 2 layouts only (a smoke run)
#   HARDWARE=configs/hardware/cpu-calibrated.yaml bash scripts/bench_plan.sh  # skip calibration
#
# Then the MoE term: alltoall_perf on 4 ranks (8 experts, Zipf skews) measures how much
# slower a skewed all-to-all is than an even one (its recv_imb is the busiest rank's rows
# over the mean); `switchyard plan --skew recv_imb` predicts the same ratio for switch-tiny's
# expert-parallel time at ep 4. Both ratios are printed side by side.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
SWITCHYARD=${SWITCHYARD:-$BUILD/bin/switchyard}
CALIBRATE=${CALIBRATE:-$BUILD/bin/plan_calibrate}
ALLTOALL=${ALLTOALL:-$BUILD/bin/alltoall_perf}
OUT=${OUT:-runs/bench}
STEPS=${STEPS:-20}
NP_CAL=${NP_CAL:-2}
DATA=${DATA:-data/fortunes}
LAYOUTS=${LAYOUTS:-0}   # 0: all
PY=/usr/bin/python3

# config  ranks  overrides (--set pairs, comma-separated; "-" for none)
TABLE="
switch-tiny   1 -
switch-tiny   2 parallel.ep=2
switch-tiny   2 parallel.tp=2
switch-tiny   2 parallel.pp=2,train.grad_accum=4
switch-tiny   2 parallel.zero_stage=1
switch-tiny   4 parallel.ep=4
switch-tiny   4 parallel.tp=2,parallel.ep=2
switch-tiny   4 parallel.pp=2,parallel.ep=2,train.grad_accum=4
switch-tiny   4 parallel.cp=2,parallel.ep=2
switch-tiny   8 parallel.ep=8
switch-medium 1 -
switch-medium 2 parallel.ep=2
switch-medium 2 parallel.tp=2
switch-medium 4 parallel.tp=2,parallel.ep=2
switch-medium 4 parallel.ep=4,train.recompute=full
"

for bin in "$SWITCHYARD" "$CALIBRATE"; do
  [ -x "$bin" ] || { echo "bench_plan: $bin not found; build first" >&2; exit 1; }
done
mkdir -p "$OUT/plan"
if [ ! -f "$DATA/index.json" ]; then
  echo "bench_plan: preparing $DATA (switchyard prep)" >&2
  "$SWITCHYARD" prep --out "$DATA" >&2
fi
HARDWARE=${HARDWARE:-$OUT/plan/cpu-calibrated.yaml}
if [ ! -f "$HARDWARE" ]; then
  echo "# calibrating on $NP_CAL rank(s) -> $HARDWARE" >&2
  bash scripts/mpirun_test.sh "$NP_CAL" "$CALIBRATE" --out "$HARDWARE" >"$OUT/plan/calibrate.log" 2>&1 ||
    { echo "bench_plan: plan_calibrate failed, see $OUT/plan/calibrate.log" >&2; exit 1; }
fi

: > "$OUT/plan/rows.tsv"
i=0
while read -r cfg np sets; do
  [ -n "$cfg" ] || continue
  i=$((i + 1))
  if [ "$LAYOUTS" -gt 0 ] && [ "$i" -gt "$LAYOUTS" ]; then break; fi
  args=(--set "data.dir=$DATA" --set "train.eval_every=0" --set "logging.routing_every=0")
  if [ "$sets" != "-" ]; then
    IFS=, read -ra pairs <<< "$sets"
    for p in "${pairs[@]}"; do args+=(--set "$p"); done
  fi
  run="$OUT/plan/run$i"
  rm -rf "$run"
  launch=()
  if [ "$np" -gt 1 ]; then launch=(bash scripts/mpirun_test.sh "$np"); fi
  echo "# $cfg on $np rank(s) $sets: training $STEPS steps" >&2
  "${launch[@]}" "$SWITCHYARD" train --config "configs/$cfg.yaml" "${args[@]}" --steps "$STEPS" \
    --out "$run" < /dev/null > "$run.log" 2>&1 || { echo "bench_plan: run $i failed, see $run.log" >&2; exit 1; }
  "$SWITCHYARD" plan --config "configs/$cfg.yaml" "${args[@]}" --gpus "$np" --gpu "$HARDWARE" \
    --config-layout --json < /dev/null > "$run.plan.json"
  printf '%s\t%s\t%s\t%s\t%s\n' "$cfg" "$np" "$sets" "$run/metrics.jsonl" "$run.plan.json" >> "$OUT/plan/rows.tsv"
done <<< "$TABLE"

"$PY" - "$OUT" <<'PYEOF'
import json, statistics, sys
out = sys.argv[1]
rows = []
for line in open(f"{out}/plan/rows.tsv"):
    cfg, np_, sets, metrics, plan = line.rstrip("\n").split("\t")
    steps = [json.loads(l) for l in open(metrics) if l.strip()]
    times = [s["step_s"] for s in steps if "step_s" in s]
    kept = times[max(1, len(times) // 5):] or times
    measured = statistics.median(kept)
    predicted = json.load(open(plan))["layouts"][0]["step_s"]
    rows.append(dict(config=cfg, ranks=int(np_), layout=sets, measured=measured,
                     predicted=predicted, error=predicted / measured - 1))
print("#        config ranks  layout                                          measured(s) predicted(s)   error")
for r in rows:
    print(f"  {r['config']:>13s} {r['ranks']:5d}  {r['layout']:<46s} {r['measured']:12.4f} {r['predicted']:12.4f} {100 * r['error']:+7.1f}%")
mae = statistics.median(abs(r["error"]) for r in rows)
print(f"# median absolute error: {100 * mae:.1f}% over {len(rows)} layouts (goal <= 15%)")
groups = {}
for r in rows:
    groups.setdefault((r["config"], r["ranks"]), []).append(r)
picks = []
for (cfg, np_), g in sorted(groups.items()):
    if len(g) < 2:
        continue
    pick = min(g, key=lambda r: r["predicted"])
    best = min(g, key=lambda r: r["measured"])
    ok = pick["measured"] <= 1.10 * best["measured"]
    picks.append(ok)
    print(f"# {cfg} on {np_} ranks: planner picks '{pick['layout']}' ({pick['measured']:.4f} s measured), "
          f"fastest measured '{best['layout']}' ({best['measured']:.4f} s): {'within' if ok else 'NOT within'} 10%")
json.dump({"benchmark": "bench_plan", "rows": rows, "median_abs_error": mae,
           "picks_within_10pct": picks}, open(f"{out}/plan.json", "w"), indent=2)
print(f"# wrote {out}/plan.json")
PYEOF

# The skewed all-to-all: measured (alltoall_perf) against predicted (plan --skew).
if [ -x "$ALLTOALL" ]; then
  echo "#  zipf  recv max/mean  measured time ratio  predicted ep-time ratio"
  base=""
  for s in 0 0.5 1.0 1.5; do
    skew_args=(--experts 8)
    if [ "$s" != 0 ]; then skew_args+=(--skew "$s"); fi
    bash scripts/mpirun_test.sh 4 "$ALLTOALL" -b 256K -e 256K -n 100 -w 10 --op alltoallv \
      "${skew_args[@]}" --json "$OUT/plan/a2a_$s.json" < /dev/null > /dev/null 2>&1
    read -r time imb < <("$PY" -c "
import json, sys; j = json.load(open('$OUT/plan/a2a_$s.json'))
row = j['rows'][-1]
print(row['time'], row['recv_imb'])")
    pred=$("$SWITCHYARD" plan --config configs/switch-tiny.yaml --gpus 4 --gpu "$HARDWARE" --config-layout \
      --set parallel.ep=4 --skew "$(python3 -c "print(max(1.0, $imb))")" --json < /dev/null |
      "$PY" -c "import json, sys; print(json.load(sys.stdin)['layouts'][0]['seconds']['ep'])")
    if [ -z "$base" ]; then base=$time base_pred=$pred; fi
    "$PY" -c "print(f'  {\"$s\":>5s} {$imb:14.2f} {$time / $base:20.2f} {$pred / $base_pred:24.2f}')"
  done
fi
