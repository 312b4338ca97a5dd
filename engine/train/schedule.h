// The learning-rate schedule: linear warmup, then cosine decay to min_lr, then constant.
//
// For the optimizer step s = 0, 1, 2, ... (s = the number of updates already taken, i.e.
// Optimizer::step() before the update that uses it), with W = warmup_steps and
// M = max_steps:
//
//   s <  W:       lr(s) = lr * (s + 1) / W
//   W <= s < M:   lr(s) = min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * (s - W) / (M - W)))
//   s >= M:       lr(s) = min_lr
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
  int64_t max_steps = 1000;  // M: the end of the cosine decay

  // The learning rate of optimizer step s >= 0 (see the file comment).
  float LrAt(int64_t s) const;
};

// The schedule of the config's train section (min_lr -1 resolved to 0.1 * lr).
LrSchedule ScheduleFor(const config::TrainConfig& train);

}  // namespace switchyard::train
