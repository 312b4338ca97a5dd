#!/usr/bin/env bash
# Experiment 3 (docs/experiments/zloss.md): router z-loss and stability (ST-MoE, Zoph et
# al. 2022, Table 4). At learning rates 10x and 25x the base config's, without gradient
# clipping and with bfloat16 matrix-product inputs (the paper's instabilities come from
# bfloat16 round-off; runtime.precision=bf16 rounds the same way on the CPU), top-1 runs
# without the router z-loss against runs with z-loss 1e-3, 3 seeds each. A run is unstable when
# training stopped on a non-finite loss (exit 3, counted as diverged, never a crash of the
# script) or its training loss spiked (docs/experiments/README.md, "Stability"). Reports
# stable runs out of N per setting and the quality of the runs that finished.
#
#   bash scripts/experiments/zloss.sh [--grid full|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "$exp_grid" = full ]; then
  steps=1000 seeds=3 lrs=(0.05 0.02)
else
  steps=6 seeds=1 lrs=(0.03)
fi
settings=()
for lr in "${lrs[@]}"; do
  settings+=(--setting "lr$lr-z0=train.lr=$lr moe.z_loss_coef=0")
  settings+=(--setting "lr$lr-z1e-3=train.lr=$lr moe.z_loss_coef=0.001")
done
exp_run --name zloss --title "Router z-loss and training stability" "${settings[@]}" --stability \
  --default-steps "$steps" --default-seeds "$seeds" --set moe.jitter_eps=0 \
  --set train.grad_clip=0 --set runtime.precision=bf16 \
  --columns val_loss,perplexity,maxvio_batch,step_s \
  "$@"
