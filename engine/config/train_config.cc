#include "engine/config/train_config.h"

#include <cmath>

namespace switchyard::config {

StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  return ParseByName(kOptimizerKindNames, name, "train.optimizer");
}

const char* OptimizerKindName(OptimizerKind kind) { return NameOf(kOptimizerKindNames, kind); }

Status TrainConfig::Validate() const {
  for (auto [key, v] : {std::pair<const char*, int64_t>{"micro_batch_size", micro_batch_size},
                        {"grad_accum", grad_accum}}) {
    if (v < 1) return InvalidArgument("train.", key, "=", v, " must be >= 1");
  }
  for (auto [key, v] : {std::pair<const char*, int64_t>{"eval_every", eval_every},
                        {"eval_batches", eval_batches}, {"checkpoint_every", checkpoint_every}}) {
    if (v < 0) return InvalidArgument("train.", key, "=", v, " must be >= 0");
  }
  if (!(lr > 0.0f) || !std::isfinite(lr)) return InvalidArgument("train.lr=", lr, " must be > 0");
  if (min_lr != -1.0f && !(min_lr >= 0.0f && min_lr <= lr)) {
    return InvalidArgument("train.min_lr=", min_lr, " must be in [0, train.lr=", lr,
                           "] (or -1: 0.1 * lr)");
  }
  if (warmup_steps < 0) return InvalidArgument("train.warmup_steps=", warmup_steps, " must be >= 0");
  if (max_steps < 1) return InvalidArgument("train.max_steps=", max_steps, " must be >= 1");
  if (warmup_steps > max_steps) {
    return InvalidArgument("train.warmup_steps=", warmup_steps, " exceeds train.max_steps=",
                           max_steps);
  }
  if (lr_decay_style == LrDecayStyle::kWsd) {
    if (lr_decay_steps < 1 || lr_decay_steps > max_steps - warmup_steps) {
      return InvalidArgument("train.lr_decay_steps=", lr_decay_steps,
                             " must be in [1, train.max_steps - train.warmup_steps = ",
                             max_steps - warmup_steps, "] under train.lr_decay_style=wsd (the "
                             "final decay's length)");
    }
  } else if (lr_decay_steps != 0) {
    return InvalidArgument("train.lr_decay_steps=", lr_decay_steps,
                           " is read only under train.lr_decay_style=wsd (this config's is ",
                           NameOf(kLrDecayStyleNames, lr_decay_style), ")");
  }
  if (!(weight_decay >= 0.0f)) {
    return InvalidArgument("train.weight_decay=", weight_decay, " must be >= 0");
  }
  for (auto [key, v] : {std::pair<const char*, float>{"beta1", beta1}, {"beta2", beta2},
                        {"momentum", momentum}}) {
    if (!(v >= 0.0f && v < 1.0f)) return InvalidArgument("train.", key, "=", v, " must be in [0, 1)");
  }
  if (!(eps > 0.0f)) return InvalidArgument("train.eps=", eps, " must be > 0");
  if (!(grad_clip >= 0.0f)) {
    return InvalidArgument("train.grad_clip=", grad_clip, " must be >= 0 (0: no clipping)");
  }
  if (!(bucket_mb > 0.0f && bucket_mb <= 1e6f) || bucket_bytes() < 1) {
    return InvalidArgument("train.bucket_mb=", bucket_mb, " must be in (0, 1e6]");
  }
  if (!(collective_timeout_s >= 0) || !std::isfinite(collective_timeout_s)) {
    return InvalidArgument("train.collective_timeout_s=", collective_timeout_s,
                           " must be >= 0 seconds (0: no watchdog)");
  }
  if (head_chunk_tokens < 0) {
    return InvalidArgument("train.head_chunk_tokens=", head_chunk_tokens,
                           " must be >= 0 (0: the whole micro-batch at once)");
  }
  if (max_nonfinite_skips < 1) {
    return InvalidArgument("train.max_nonfinite_skips=", max_nonfinite_skips, " must be >= 1");
  }
  return OkStatus();
}

int64_t TrainConfig::bucket_bytes() const {
  return static_cast<int64_t>(std::llround(static_cast<double>(bucket_mb) * 1024.0 * 1024.0));
}

}  // namespace switchyard::config
