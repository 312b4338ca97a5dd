#!/usr/bin/env bash
# Experiment 3 (docs/experiments/zloss.md): the router z-loss as a learning-rate sensitivity
# study (after ST-MoE, Zoph et al. 2022, whose Table 4 it does not reproduce: see the page).
# Final validation loss and stability against six learning rates, 0.002 (the base config's)
# to 0.1 (50x), each without the router z-loss and with z-loss 1e-3, 2 seeds, 600 steps;
# without gradient clipping and with bfloat16 matrix-product inputs (ST-MoE's instabilities
# come from bfloat16 round-off; runtime.precision=bf16 rounds the same way on the CPU), no
# router jitter. A run is unstable when training stopped on a non-finite loss (exit 3,
# counted as diverged, never a crash of the script) or its training loss spiked
# (docs/experiments/README.md, "Stability"). Reports stable runs out of N per setting, the
# quality of the runs that finished, the final loss against the learning rate
# (loss_vs_lr.png) and, per run, the router's logit size and entropy over the steps
# (router_logits.png: the z-loss / its coefficient, the mean squared logsumexp of the router
# logits; the engine logs no logit norm).
# --grid router: the mechanism injected, the router made the fast-moving part: at the base
#   rate (0.002) the routers' learning rate times 10, 30 and 100 (moe.router_lr_scale; the
#   router stays float32, MODEL.md section 2), each without and with z-loss 1e-3, 2 seeds,
#   600 steps, in zloss-router/ beside the lr study. If the z-loss is what keeps a router
#   stable, the unscaled-z runs spike or lose quality as the scale grows and the z-loss runs
#   do not.
#
#   bash scripts/experiments/zloss.sh [--grid full|router|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
exp_more_grids="router"
source "$(dirname "$0")/lib.sh"
settings=()
name=zloss title="Router z-loss: learning-rate sensitivity (bf16, no clipping)"
if [ "$exp_grid" = router ]; then
  steps=600 seeds=2
  title="Router z-loss: the routers' learning rate scaled (bf16, no clipping)"
  for r in 10 30 100; do
    settings+=(--setting "router$r-z0=moe.router_lr_scale=$r moe.z_loss_coef=0")
    settings+=(--setting "router$r-z1e-3=moe.router_lr_scale=$r moe.z_loss_coef=0.001")
  done
else
  if [ "$exp_grid" = full ]; then
    steps=600 seeds=2 lrs=(0.002 0.005 0.01 0.02 0.05 0.1)
  else
    steps=6 seeds=1 lrs=(0.01 0.03)
  fi
  for lr in "${lrs[@]}"; do
    settings+=(--setting "lr$lr-z0=train.lr=$lr moe.z_loss_coef=0")
    settings+=(--setting "lr$lr-z1e-3=train.lr=$lr moe.z_loss_coef=0.001")
  done
fi
exp_run --name "$name" --title "$title" \
  "${settings[@]}" --stability \
  --default-steps "$steps" --default-seeds "$seeds" --set moe.jitter_eps=0 \
  --set train.grad_clip=0 --set runtime.precision=bf16 \
  --columns val_loss,perplexity,maxvio_batch,step_s \
  "$@"
