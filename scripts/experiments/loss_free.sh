#!/usr/bin/env bash
# Experiment 2 (docs/experiments/loss_free.md): aux-loss-free balancing against the
# auxiliary loss as Wang et al. 2024 ran it ("Auxiliary-Loss-Free Load Balancing Strategy
# for Mixture-of-Experts": Table 2, the alpha trade-off of Fig. 2, softmax gates in App. C;
# DeepSeek-V3 section 4.5.2). Every run routes top-2 of 16 experts with normalised gates,
# dropless (balance shows only in the load), without z-loss or jitter. The auxiliary loss
# is the sequence-wise one (moe.aux_loss_scope=sequence), swept over alpha = 0 (no
# balancing), 1e-4, 1e-3, 1e-2 under softmax scores; the expert bias uses the paper's
# update for each score function: proportional (b += u e, u = 3e-4) for softmax, sign
# (b += u sign(e), u = 1e-3) for sigmoid, with the sign update under softmax beside it.
# A grad_accum 4 variant (4 micro-batches of 2 sequences per step: the same tokens per
# step, the bias following a step 4x larger than each routing group) repeats the main pair.
# Reports MaxVio on the validation sample (MaxVio_global) and per training batch, and the
# validation loss paired by seed with softmax-aux1e-3. --grid v1 is the first run's grid
# (aux 1e-3 at group scope against the sign update at u = 1e-3, 1e-4, 1e-2, both scores).
#
#   bash scripts/experiments/loss_free.sh [--grid full|v1|ci] [--out DIR] [--data DIR]
#        [--seeds N|LIST] [--steps N] [--jobs N] [--config F] [--bin PATH] [--set k=v ...]
set -euo pipefail
exp_more_grids="v1"
source "$(dirname "$0")/lib.sh"
aux="moe.aux_loss_scope=sequence moe.expert_bias_rate=0"
prop="moe.aux_loss_coef=0 moe.expert_bias_rate=0.0003 moe.expert_bias_update=proportional"
sign="moe.aux_loss_coef=0 moe.expert_bias_rate=0.001 moe.expert_bias_update=sign"
ga4="train.grad_accum=4 train.micro_batch_size=2"
if [ "$exp_grid" = full ]; then
  steps=1200 seeds=3 experts=16 alphas=(1e-4=0.0001 1e-2=0.01 0=0)  # name=moe.aux_loss_coef
elif [ "$exp_grid" = v1 ]; then
  exp_data=data/code  # the first run's corpus (vocabulary 8192)
  settings=()
  for score in softmax sigmoid; do
    settings+=(--setting "$score-aux1e-3=moe.score=$score moe.aux_loss_coef=0.001 moe.expert_bias_rate=0")
    settings+=(--setting "$score-bias1e-3=moe.score=$score moe.aux_loss_coef=0 moe.expert_bias_rate=0.001")
  done
  for score in softmax sigmoid; do
    for u in 0.0001 0.01; do
      settings+=(--setting "$score-bias$([ $u = 0.0001 ] && echo 1e-4 || echo 1e-2)=moe.score=$score moe.aux_loss_coef=0 moe.expert_bias_rate=$u")
    done
  done
  exp_run --name loss_free --title "Loss-free balancing vs auxiliary loss (v1)" "${settings[@]}" \
    --baseline softmax-aux1e-3 --default-steps 1200 --default-seeds 3 \
    --set moe.num_experts=16 --set moe.top_k=2 --set moe.normalize_gates=true \
    --set moe.capacity_factor=0 --set moe.eval_capacity_factor=0 --set moe.z_loss_coef=0 \
    --set moe.jitter_eps=0 \
    --columns val_loss,delta_val_loss,perplexity,maxvio_global,maxvio_global_max,maxvio_batch,step_s,lang_mi_bits,lang_mi_norm \
    "$@"
else
  steps=6 seeds=1 experts=4 alphas=()
  ga4="train.grad_accum=2 train.micro_batch_size=2"  # ci.yaml's micro-batch is 4
fi
# The main comparison first (aux 1e-3 against the bias under both scores), then the alpha
# sweep and the grad_accum variant, so that an interrupted experiment has the main rows.
settings=(
  --setting "softmax-aux1e-3=moe.score=softmax moe.aux_loss_coef=0.001 $aux"
  --setting "softmax-prop3e-4=moe.score=softmax $prop"
  --setting "sigmoid-aux1e-3=moe.score=sigmoid moe.aux_loss_coef=0.001 $aux"
  --setting "sigmoid-sign1e-3=moe.score=sigmoid $sign"
  --setting "softmax-sign1e-3=moe.score=softmax $sign"
)
for a in "${alphas[@]}"; do
  settings+=(--setting "softmax-aux${a%%=*}=moe.score=softmax moe.aux_loss_coef=${a#*=} $aux")
done
settings+=(--setting "ga4-softmax-aux1e-3=moe.score=softmax moe.aux_loss_coef=0.001 $aux $ga4")
settings+=(--setting "ga4-softmax-prop3e-4=moe.score=softmax $prop $ga4")
exp_run --name loss_free --title "Loss-free balancing vs auxiliary loss" "${settings[@]}" \
  --baseline softmax-aux1e-3 --default-steps "$steps" --default-seeds "$seeds" \
  --set "moe.num_experts=$experts" --set moe.top_k=2 --set moe.normalize_gates=true \
  --set moe.capacity_factor=0 --set moe.eval_capacity_factor=0 --set moe.z_loss_coef=0 \
  --set moe.jitter_eps=0 \
  --columns val_loss,delta_val_loss,perplexity,maxvio_global,maxvio_global_max,maxvio_batch,step_s,lang_mi_bits,lang_mi_norm \
  "$@"
