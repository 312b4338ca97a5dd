#!/usr/bin/env bash
# Experiment 4 (docs/experiments/capacity.md): capacity factor and top-k (Switch
# Transformer, Fedus et al. 2021, section 2.2 and Table 1). Top-1 and top-2 (normalised
# gates) over 8 experts, each at capacity factor 1.0, 1.25, 2.0 and dropless (0); the same
# factor in training and evaluation, so the validation loss pays for what is dropped.
# Reports quality, the dropped fraction (over the run; its start-up transient, the first
# 10% of the steps, apart from the steady state, the other 90%; and the last 10%) and the
# step time, and quality against step time (quality_time.png: Switch's speed-quality view).
# The step time that view uses is measured apart, after training: each setting trains 50
# steps alone on the machine, in 3 rounds of alternating order (runner.py --time-steps,
# timing.json); the training runs' own medians (step_s) shared the machine with another run.
#
#   bash scripts/experiments/capacity.sh [--grid full|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "$exp_grid" = full ]; then
  steps=1200 seeds=3 factors=(1.0 1.25 2.0 0) baseline=top1-cf1.25 timing=(--time-steps 50 --time-rounds 3)
else
  steps=6 seeds=1 factors=(1.0 0) baseline=top1-cf1.0 timing=(--time-steps 2 --time-rounds 2)
fi
settings=()
for k in 1 2; do
  gates=$([ "$k" = 2 ] && echo " moe.normalize_gates=true" || true)
  for cf in "${factors[@]}"; do
    name="top$k-$([ "$cf" = 0 ] && echo dropless || echo "cf$cf")"
    settings+=(--setting "$name=moe.top_k=$k moe.capacity_factor=$cf moe.eval_capacity_factor=$cf$gates")
  done
done
exp_run --name capacity --title "Capacity factor and top-k" "${settings[@]}" \
  --baseline "$baseline" --default-steps "$steps" --default-seeds "$seeds" --set moe.num_experts=8 \
  --columns val_loss,delta_val_loss,perplexity,dropped_run,dropped_start,dropped_steady,dropped_end,maxvio_batch,step_alone,step_s,flops_per_token \
  "${timing[@]}" "$@"
