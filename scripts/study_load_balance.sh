#!/usr/bin/env bash
# The load-balance study (docs/load-balance.md): trains configs/switch-tiny.yaml over a grid
# of routing settings, one factor at a time around the config's defaults, then writes
#   OUT/<setting>/            each run's output (metrics.jsonl, routing.jsonl, ...) and
#                             eval.json: its final checkpoint on the whole validation split,
#                             in micro-batches of the config's size whatever the run's
#   OUT/summary.md, .json     one row per run: final validation loss, dropped fraction,
#                             maximal violation, per-language specialisation
#   OUT/report.html           `switchyard report` of every run, overlaid
#
#   bash scripts/study_load_balance.sh [--out DIR] [--steps N] [--grid full|ci]
#                                      [--config F] [--data DIR] [--bin PATH] [--set k=v ...]
#
# The full grid: aux coefficient 0, 1e-3, 1e-2 (default), 1e-1; the aux-loss-free expert
# bias (rate 1e-3, with aux 0 and with aux 1e-2); capacity factor 1.0, 1.25 (default), 2.0,
# dropless; top-1 (default) and top-2; routing group size (train.micro_batch_size, one
# group per micro-batch) 1, 2 and 8 (default) sequences of 64 tokens at the same 8
# sequences per step (grad_accum 8, 4, 1). The ci grid runs two settings (default, dropless) for a few steps. Extra --set overrides
# apply to every run (e.g. --set train.eval_every=50). Runs already complete in OUT
# (routing_by_language.json present) are kept, so an interrupted study resumes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=runs/study
steps=300
grid=full
config="$root/configs/switch-tiny.yaml"
data=""
bin="$root/build/bin/switchyard"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --grid) grid="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "study_load_balance.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$steps" in ''|*[!0-9]*|0) echo "study_load_balance.sh: error: --steps '$steps' must be a positive integer" >&2; exit 2 ;; esac
[ -x "$bin" ] || { echo "study_load_balance.sh: error: $bin is not built (bash scripts/setup.sh)" >&2; exit 1; }
[ -f "$config" ] || { echo "study_load_balance.sh: error: --config $config: no such file" >&2; exit 1; }

# name -> overrides (one factor at a time around the config's defaults).
declare -A settings
case "$grid" in
  full)
    names=(default aux0 aux1e-3 aux1e-1 bias bias+aux cf1.0 cf2.0 dropless top2 group1 group2)
    settings=(
      [default]=""
      [aux0]="moe.aux_loss_coef=0"
      [aux1e-3]="moe.aux_loss_coef=0.001"
      [aux1e-1]="moe.aux_loss_coef=0.1"
      [bias]="moe.aux_loss_coef=0 moe.expert_bias_rate=0.001"
      [bias+aux]="moe.expert_bias_rate=0.001"
      [cf1.0]="moe.capacity_factor=1.0"
      [cf2.0]="moe.capacity_factor=2.0"
      [dropless]="moe.capacity_factor=0"
      [top2]="moe.top_k=2"
      [group1]="train.micro_batch_size=1 train.grad_accum=8"
      [group2]="train.micro_batch_size=2 train.grad_accum=4"
    ) ;;
  ci)
    names=(default dropless)
    settings=([default]="" [dropless]="moe.capacity_factor=0") ;;
  *) echo "study_load_balance.sh: error: --grid '$grid' is not one of full, ci" >&2; exit 2 ;;
esac

mkdir -p "$out"
common=(--config "$config" --set "train.max_steps=$steps" --set "logging.routing_every=$(( steps >= 100 ? steps / 50 : 1 ))")
[ -n "$data" ] && common+=(--set "data.dir=$data")
# The validation loss compares runs only on the same sequences: every run is evaluated on
# the whole validation split in micro-batches of the config's micro_batch_size (the
# training runs' own validation follows their micro_batch_size).
eval_mbs=$(sed -n 's/^ *micro_batch_size: *\([0-9]*\).*/\1/p' "$config" | head -1)
eval_args=(--json --batches 0 --set "train.micro_batch_size=${eval_mbs:-4}")
[ -n "$data" ] && eval_args+=(--data "$data")
runs=()
for name in "${names[@]}"; do
  dir="$out/$name"
  runs+=("$dir")
  if [ -f "$dir/routing_by_language.json" ] && [ -f "$dir/eval.json" ]; then
    echo "study: $name already done ($dir)"
    continue
  fi
  if [ -f "$dir/routing_by_language.json" ]; then
    "$bin" eval --checkpoint "$dir" "${eval_args[@]}" >"$dir/eval.json" ||
      { echo "study_load_balance.sh: error: eval of $name failed" >&2; exit 1; }
    echo "study: $name evaluated"
    continue
  fi
  rm -rf "$dir"
  sets=()
  for kv in ${settings[$name]}; do sets+=(--set "$kv"); done
  echo "study: $name ${settings[$name]:-(defaults)}"
  start=$(date +%s)
  "$bin" train "${common[@]}" "${sets[@]}" "${extra[@]}" --out "$dir" >"$out/$name.log" 2>&1 ||
    { echo "study_load_balance.sh: error: run $name failed; see $out/$name.log" >&2; tail -3 "$out/$name.log" >&2; exit 1; }
  "$bin" eval --checkpoint "$dir" "${eval_args[@]}" >"$dir/eval.json" ||
    { echo "study_load_balance.sh: error: eval of $name failed" >&2; exit 1; }
  echo "study: $name done in $(( $(date +%s) - start )) s"
done

/usr/bin/python3 "$root/scripts/study_summary.py" --out "$out/summary" "${runs[@]}"
"$bin" report "${runs[@]}" --out "$out/report.html" --title "Switchyard load-balance study ($grid grid, $steps steps)"
echo "study: $out/summary.md, $out/report.html"
