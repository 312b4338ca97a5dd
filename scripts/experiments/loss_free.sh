#!/usr/bin/env bash
# Experiment 2 (docs/experiments/loss_free.md): aux-loss-free balancing against the
# auxiliary loss (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for
# Mixture-of-Experts", Table 2; DeepSeek-V3 section 4.5.3). Under softmax and under sigmoid
# router scores (moe.score): the load-balancing loss with alpha = 1e-3 and no bias, against
# the expert bias (moe.expert_bias_rate) with update rate u = 1e-3, 1e-4 and 1e-2 and no aux
# loss. Every run routes top-2 of 16 experts with normalised gates, dropless (nothing is
# dropped, so balance shows only in the load), without z-loss or jitter. Reports MaxVio on
# the whole validation split (MaxVio_global) and per training batch, and the perplexity.
#
#   bash scripts/experiments/loss_free.sh [--grid full|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "$exp_grid" = full ]; then
  steps=1200 seeds=3 experts=16 rates=(1e-3 1e-4 1e-2) scores=(softmax sigmoid)
else
  steps=6 seeds=1 experts=4 rates=(1e-3) scores=(softmax sigmoid)
fi
# The paper's comparison (aux 1e-3 against u = 1e-3) under both scores first, the other rates
# after, so that an interrupted experiment has the main rows.
settings=()
for score in "${scores[@]}"; do
  settings+=(--setting "$score-aux1e-3=moe.score=$score moe.aux_loss_coef=0.001 moe.expert_bias_rate=0")
  settings+=(--setting "$score-bias${rates[0]}=moe.score=$score moe.aux_loss_coef=0 moe.expert_bias_rate=${rates[0]}")
done
for score in "${scores[@]}"; do
  for u in "${rates[@]:1}"; do
    settings+=(--setting "$score-bias$u=moe.score=$score moe.aux_loss_coef=0 moe.expert_bias_rate=$u")
  done
done
exp_run --name loss_free --title "Loss-free balancing vs auxiliary loss" "${settings[@]}" \
  --baseline softmax-aux1e-3 --default-steps "$steps" --default-seeds "$seeds" \
  --set "moe.num_experts=$experts" --set moe.top_k=2 --set moe.normalize_gates=true \
  --set moe.capacity_factor=0 --set moe.eval_capacity_factor=0 --set moe.z_loss_coef=0 \
  --set moe.jitter_eps=0 \
  --columns val_loss,delta_val_loss,perplexity,maxvio_global,maxvio_global_max,maxvio_batch,step_s,lang_mi_bits \
  "$@"
