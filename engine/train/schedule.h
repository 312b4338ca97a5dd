// The learning-rate schedule: linear warmup, then a decay to min_lr (train.lr_decay_style),
// then constant.
//
// For the optimizer step s = 0, 1, 2, ... (s = the number of updates already taken, i.e.
// Optimizer::step() before the update that uses it), with W = warmup_steps,
// M = max_steps and D = decay_steps:
//
//   s <  W:       lr(s) = lr * (s + 1) / W
//   W <= s < M:   lr(s) = min_lr + (lr - min_lr) * f(s), where f is
//                   cosine:   0.5 * (1 + cos(pi * (s - W) / (M - W)))
//                   linear:   1 - (s - W) / (M - W)
//                   wsd:      1 for s < M - D, then 1 - (s - (M - D)) / D
//                   constant: 1 (and lr(s) = lr for every s >= W, M included)
//   s >= M:       lr(s) = min_lr (constant: lr)
//
// Each decay starts at lr (f = 1 at its first step) and reaches min_lr at M. Megatron-LM's
// decay styles (OptimizerParamScheduler: cosine, linear, constant, and WSD with a linear
// --lr-wsd-decay-style over --lr-wsd-decay-iters = D) and torchtitan's warmup-stable-decay
// (its decay_ratio is D / (M - W)) compute the same after warmup.
//
// This is llm.c's (and nanoGPT's) schedule and Megatron-LM's cosine decay
// (OptimizerParamScheduler, decay_style="cosine", lr_decay_iters = M) after its warmup; the
// warmup differs from Megatron's lr * s / W only in not spending the first step at lr = 0
// (torchtitan makes the same "+1" adjustment): the first update uses lr / W, the last warmup
// update (s = W - 1) uses the full lr, and so does the first cosine step (s = W). W = 0: no
// warmup. M <= W: no decay phase, min_lr from step W on (W = M = 0: min_lr throughout).
#pragma once

#include <cstdint>

#include "engine/config/train_config.h"

namespace switchyard::train {

struct LrSchedule {
  float lr = 3e-4f;          // the peak learning rate
  float min_lr = 3e-5f;      // reached at max_steps and kept after it
  int64_t warmup_steps = 0;  // W
  int64_t max_steps = 1000;  // M: the end of the decay
  config::LrDecayStyle style = config::LrDecayStyle::kCosine;
  int64_t decay_steps = 0;   // D: wsd's final decay (1 <= D <= M - W)

  // The learning rate of optimizer step s >= 0 (see the file comment).
  float LrAt(int64_t s) const;
};

// The schedule of the config's train section (min_lr -1 resolved to 0.1 * lr).
LrSchedule ScheduleFor(const config::TrainConfig& train);

}  // namespace switchyard::train
