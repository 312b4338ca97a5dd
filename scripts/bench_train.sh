#!/usr/bin/env bash
# Training throughput of every tiny config: tokens/s and model FLOP utilisation (MFU) of
# `switchyard train ... --steps N` on this machine; prints one table and writes
# $OUT/train.json.
#
#   bash scripts/bench_train.sh                     # every configs/*-tiny.yaml, 50 steps
#   STEPS=100 NP=2 bash scripts/bench_train.sh      # 2 ranks under mpirun (ep = 2)
#
# tokens/s  mean of metrics.jsonl's tokens_per_s (global batch tokens / step time) over
#           the steps after the first fifth (warm-up)
# FLOP/tok  `switchyard train --dry-run`'s training FLOPs per token: 6 x active matrix
#           parameters (head included, embedding lookups not) + attention scores
# MFU       tokens/s x FLOP/tok / peak, peak = gemm_perf's best sgemm (2048^3) per rank,
#           measured with the same ranks and threads, times NP
#
# DATA: token shards (default data/fortunes, made with `switchyard prep` when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
SWITCHYARD=${SWITCHYARD:-$BUILD/bin/switchyard}
GEMM=${GEMM:-$BUILD/bin/gemm_perf}
OUT=${OUT:-runs/bench}
STEPS=${STEPS:-50}
NP=${NP:-1}
DATA=${DATA:-data/fortunes}
CONFIGS=${CONFIGS:-$(ls configs/*-tiny.yaml 2>/dev/null || true)}
PY=/usr/bin/python3

for bin in "$SWITCHYARD" "$GEMM"; do
  if [ ! -x "$bin" ]; then
    echo "bench_train: $bin not found; build first (bash scripts/setup.sh)" >&2
    exit 1
  fi
done
if [ -z "$CONFIGS" ]; then
  echo "bench_train: no configs/*-tiny.yaml found" >&2
  exit 1
fi
launch=()
if [ "$NP" -gt 1 ]; then launch=(bash scripts/mpirun_test.sh "$NP"); fi
if [ ! -f "$DATA/index.json" ]; then
  echo "bench_train: preparing $DATA (switchyard prep)" >&2
  "$SWITCHYARD" prep --out "$DATA" >&2
fi

mkdir -p "$OUT/train"
echo "# measuring the sgemm peak ($NP rank(s))" >&2
"${launch[@]}" "$GEMM" --sizes 2048 -n 3 -w 1 --json "$OUT/train/peak.json" >&2

names=()
for cfg in $CONFIGS; do
  name=$(basename "$cfg" .yaml)
  names+=("$name")
  run="$OUT/train/$name"
  rm -rf "$run"
  sets=(--set "data.dir=$DATA")
  if [ "$NP" -gt 1 ]; then sets+=(--set "parallel.ep=$NP"); fi
  "$SWITCHYARD" train --config "$cfg" "${sets[@]}" --dry-run > "$OUT/train/$name.dryrun.txt"
  echo "# training $name for $STEPS steps on $NP rank(s)" >&2
  "${launch[@]}" "$SWITCHYARD" train --config "$cfg" "${sets[@]}" --steps "$STEPS" --out "$run" \
    > "$OUT/train/$name.log" 2>&1 || { echo "bench_train: $name failed, see $OUT/train/$name.log" >&2; exit 1; }
done

"$PY" - "$OUT" "$NP" "${names[@]}" <<'EOF'
import json, re, sys
out, np_, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
peak_rank = json.load(open(f"{out}/train/peak.json"))["peak_gflops_per_rank"] * 1e9
peak = peak_rank * np_
scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
rows = []
print(f"# training throughput, {np_} rank(s); peak {peak / 1e9:.1f} GFLOP/s "
      f"({peak_rank / 1e9:.1f} per rank, sgemm 2048^3)")
print("#        config  steps     tokens/s   FLOP/token    GFLOP/s    MFU(%)  final loss")
for name in names:
    text = open(f"{out}/train/{name}.dryrun.txt").read()
    m = re.search(r"training FLOPs / token\s+([\d.]+) ([KMGTP]?)FLOP", text)
    fpt = float(m.group(1)) * scale[m.group(2)]
    steps = [json.loads(l) for l in open(f"{out}/train/{name}/metrics.jsonl") if l.strip()]
    steps = [s for s in steps if "tokens_per_s" in s]
    kept = steps[max(1, len(steps) // 5):] or steps
    tps = sum(s["tokens_per_s"] for s in kept) / len(kept)
    flops = tps * fpt
    print(f"  {name:>12s} {len(steps):6d} {tps:12.0f} {fpt:12.4g} {flops / 1e9:10.2f} "
          f"{100 * flops / peak:9.2f} {steps[-1]['loss']:11.4f}")
    rows.append({"config": name, "steps": len(steps), "tokens_per_s": tps,
                 "flops_per_token": fpt, "achieved_flops": flops, "mfu": flops / peak,
                 "final_loss": steps[-1]["loss"]})
json.dump({"benchmark": "bench_train", "ranks": np_, "peak_flops": peak, "rows": rows},
          open(f"{out}/train.json", "w"), indent=2)
print(f"# wrote {out}/train.json")
EOF
