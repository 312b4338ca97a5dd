#!/usr/bin/env bash
# Experiment 1 (docs/experiments/moe_vs_dense.md): MoE against dense at equal FLOPs per
# token (Switch Transformer, Fedus et al. 2021, Fig. 1, Fig. 4 and Table 1).
#
# --grid full (the default; "The next run" on the page): configs/experiments/moe_vs_dense.yaml
#   on the code corpus at vocabulary 2048 (data/code-v2048), top-1 MoE in every layer,
#   dropless, constant learning rate after the warm-up, 4,096 tokens per step: 4 and 16
#   experts against dense at equal FLOPs per token (every MLP of the expert width), the
#   dense runs trained twice as long (2 x --steps), so that the same-seed speed-up (dense
#   steps to the MoE run's final loss / MoE steps) is measured up to 2x instead of censored.
# --grid pre: the short pre-sweep that sets the full grid's learning rate and checks its
#   batch: dense and 16 experts at lr 1e-3, 2e-3, 4e-3 (4,096 tokens a step, 150 steps),
#   and 16 experts at 2,048 tokens a step for 300 steps (the same tokens), one seed, each
#   run evaluated on a 64-block sample (the curves' size; the full grid's is 1,024 blocks).
# --grid gate: the gate-scale test (the page's "Why is the MoE behind?"): the full grid's
#   16-expert run again with moe.routed_scaling_factor 16 (= E: top-1 gates start near 1/E,
#   so the routed layer starts about E times smaller than the dense MLP), 3 seeds, in the
#   full grid's directory (runs/experiments/moe_vs_dense unless --out says otherwise) beside
#   its dense and 16-expert runs, which it reuses (a run with a
#   run.json is never retrained), so the Δ is paired with the same seeds' dense runs.
# --grid v1: the first two runs' grid (configs/experiments/base.yaml on data/code at
#   vocabulary 8192: dense against top-1 over 4, 8, 16, 32 experts in layers 1 and 3 and
#   top-2 over 8, capacity 1.25, cosine schedule, 1,024 tokens per step, 2000 steps).
# Reports the validation loss against steps and training FLOPs, the final loss paired by
# seed with dense (Δ, paired t with pooled variance), the trend of Δ in log2 E, and the
# same-seed speed-up (censored when the dense run never reaches the MoE run's loss).
#
#   bash scripts/experiments/moe_vs_dense.sh [--grid full|pre|gate|v1|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
exp_more_grids="pre gate v1"
source "$(dirname "$0")/lib.sh"
# --steps N sets the MoE runs' steps; the dense runs train 2N (full and ci grids).
steps_arg=""
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --steps) j=$((i + 1)); steps_arg="${!j-}" ;;
    --steps=*) steps_arg="${!i#--steps=}" ;;
  esac
done
cols=val_loss,delta_val_loss,delta_curve_end,perplexity,speedup,flops_per_token,train_flops,step_s,maxvio_global,lang_mi_bits,lang_mi_norm
mvd_config="$exp_root/configs/experiments/moe_vs_dense.yaml"
case "$exp_grid" in
  full|ci)
    if [ "$exp_grid" = full ]; then
      steps=600 seeds=3 experts=(4 16) exp_config="$mvd_config" exp_data=data/code-v2048
      trend=(--trend "top1-e4 top1-e16") moe_sets=""
    else  # ci.yaml's tiny model with the full grid's choices (a setting's overrides, since
          # a global --set would also reach dense's layer_freq)
      steps=6 seeds=1 experts=(4) trend=()
      moe_sets=" moe.layer_freq=1 moe.capacity_factor=0 moe.eval_capacity_factor=0"
      set -- --set train.min_lr=0.003 "$@"  # ci.yaml's lr: constant after the warm-up
    fi
    n=${steps_arg:-$steps}
    [[ "$n" =~ ^[0-9]+$ ]] || n=$steps  # a bad --steps is the runner's to report
    settings=(--setting "dense=moe.layer_freq=1000 train.max_steps=$((2 * n))")
    for e in "${experts[@]}"; do settings+=(--setting "top1-e$e=moe.num_experts=$e$moe_sets"); done
    exp_run --name moe_vs_dense --title "MoE vs dense at equal FLOPs per token" "${settings[@]}" \
      --baseline dense --default-steps "$steps" --default-seeds "$seeds" "${trend[@]}" \
      --columns "$cols" "$@" ;;
  pre)
    exp_config="$mvd_config" exp_data=data/code-v2048
    settings=()
    # As it was run (2026-11-29): one micro-batch of 32 sequences a step (the full grid's two
    # of 16 make the same update, but for the routing groups' size).
    one="train.micro_batch_size=32 train.grad_accum=1 train.eval_batches=16"
    for lr in 0.001 0.002 0.004; do
      settings+=(--setting "dense-lr$lr=moe.layer_freq=1000 train.lr=$lr train.min_lr=$lr $one")
      settings+=(--setting "top1-e16-lr$lr=train.lr=$lr train.min_lr=$lr $one")
    done
    # The same tokens (614,400) at half the batch: 16 sequences a step for twice the steps.
    settings+=(--setting "top1-e16-mbs16=train.lr=0.002 train.min_lr=0.002 train.micro_batch_size=16 train.grad_accum=1 train.eval_batches=32 train.max_steps=300")
    exp_run --name moe_vs_dense --title "moe_vs_dense pre-sweep: learning rate and batch" \
      "${settings[@]}" --default-steps 150 --default-seeds 1 --val-blocks 64 \
      --columns val_loss,perplexity,step_s,maxvio_batch,maxvio_global "$@" ;;
  gate)
    exp_config="$mvd_config" exp_data=data/code-v2048
    n=${steps_arg:-600}
    [[ "$n" =~ ^[0-9]+$ ]] || n=600
    exp_run --name moe_vs_dense --title "MoE vs dense: the gate-scale test" \
      --setting "dense=moe.layer_freq=1000 train.max_steps=$((2 * n))" \
      --setting "top1-e16=moe.num_experts=16" \
      --setting "top1-e16-s16=moe.num_experts=16 moe.routed_scaling_factor=16" \
      --baseline dense --default-steps 600 --default-seeds 3 --columns "$cols" \
      --out runs/experiments/moe_vs_dense "$@" ;;  # the full grid's directory (an --out given wins)
  v1)
    exp_data=data/code  # the first runs' corpus (vocabulary 8192)
    settings=(--setting "dense=moe.layer_freq=1000")  # no layer i with i % 1000 == 999
    for e in 4 8 16 32; do settings+=(--setting "top1-e$e=moe.num_experts=$e"); done
    settings+=(--setting "top2-e8=moe.num_experts=8 moe.top_k=2 moe.normalize_gates=true")
    exp_run --name moe_vs_dense --title "MoE vs dense at equal FLOPs per token (v1)" "${settings[@]}" \
      --baseline dense --default-steps 2000 --default-seeds 3 \
      --trend "top1-e4 top1-e8 top1-e16 top1-e32" \
      --columns val_loss,delta_val_loss,perplexity,speedup,flops_per_token,train_flops,step_s,dropped_run,lang_mi_bits,lang_mi_norm \
      "$@" ;;
esac
