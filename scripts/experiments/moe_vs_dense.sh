#!/usr/bin/env bash
# Experiment 1 (docs/experiments/moe_vs_dense.md): MoE against dense at equal FLOPs per
# token (Switch Transformer, Fedus et al. 2021, Fig. 1 and Table 1). A dense model (no MoE
# layer; every MLP of width d_ff) against top-1 MoE with 4, 8, 16 and 32 experts whose
# experts each have the dense d_ff (so a token costs the dense FLOPs plus the router), and
# top-2 over 8 experts (twice the expert FLOPs). Reports the validation loss against steps
# and against training FLOPs, and each setting's speed-up: the dense run's steps divided by
# the steps the setting needs to reach the dense model's final validation loss.
#
#   bash scripts/experiments/moe_vs_dense.sh [--grid full|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "$exp_grid" = full ]; then
  steps=2000 seeds=3 big=(16 32)
else
  steps=6 seeds=1 big=()
fi
settings=(--setting "dense=moe.layer_freq=1000")  # no layer i with i % 1000 == 999
for e in 4 8 "${big[@]}"; do settings+=(--setting "top1-e$e=moe.num_experts=$e"); done
e2=$([ "$exp_grid" = full ] && echo 8 || echo 4)
settings+=(--setting "top2-e$e2=moe.num_experts=$e2 moe.top_k=2 moe.normalize_gates=true")
exp_run --name moe_vs_dense --title "MoE vs dense at equal FLOPs per token" "${settings[@]}" \
  --baseline dense --default-steps "$steps" --default-seeds "$seeds" \
  --columns val_loss,delta_val_loss,perplexity,speedup,flops_per_token,train_flops,step_s,dropped_run,lang_mi_bits \
  "$@"
