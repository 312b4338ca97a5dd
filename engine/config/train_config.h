// The `train` section of a config: the optimizer, the learning-rate schedule, gradient
// clipping and the data-parallel gradient buckets. Defaults follow Megatron-LM / nanoGPT
// GPT pre-training (AdamW, beta2 0.95, weight decay 0.1, clip 1.0, DDP's 25 MB buckets).
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/enum_names.h"
#include "engine/core/status.h"
#include "engine/model/recompute.h"

namespace switchyard::config {

enum class OptimizerKind { kAdamW, kSgd };
inline constexpr EnumName<OptimizerKind> kOptimizerKindNames[] = {
    {OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kSgd, "sgd"}};

// "adamw", "sgd"; anything else names the config key train.optimizer.
StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
const char* OptimizerKindName(OptimizerKind kind);

// train.on_nonfinite: what a step whose loss or gradient norm is not finite does.
enum class NonFiniteAction { kStop, kSkip };
inline constexpr EnumName<NonFiniteAction> kNonFiniteActionNames[] = {
    {NonFiniteAction::kStop, "stop"}, {NonFiniteAction::kSkip, "skip"}};

// train.lr_decay_style: the learning rate's shape after warmup (engine/train/schedule.h).
enum class LrDecayStyle { kCosine, kLinear, kConstant, kWsd };
inline constexpr EnumName<LrDecayStyle> kLrDecayStyleNames[] = {
    {LrDecayStyle::kCosine, "cosine"}, {LrDecayStyle::kLinear, "linear"},
    {LrDecayStyle::kConstant, "constant"}, {LrDecayStyle::kWsd, "wsd"}};

struct TrainConfig {
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // adamw | sgd
  float lr = 3e-4f;            // peak learning rate
  // Final learning rate of the cosine decay. -1 (the default) means 0.1 * lr (nanoGPT,
  // Chinchilla); ParseConfig writes the resolved value. 0 decays to zero (Megatron's and
  // torchtitan's default).
  float min_lr = -1.0f;
  int64_t warmup_steps = 0;    // linear warmup steps (schedule.h has the exact formula)
  int64_t max_steps = 1000;    // optimizer steps of the run; the decay ends here
  // After warmup (schedule.h): cosine (the default) or linear from lr down to min_lr at
  // max_steps; constant at lr; wsd (warmup-stable-decay) at lr, then linear down to min_lr
  // over the last lr_decay_steps steps before max_steps.
  LrDecayStyle lr_decay_style = LrDecayStyle::kCosine;
  int64_t lr_decay_steps = 0;  // wsd only: the final decay's length, in [1, max_steps - warmup_steps]
  float weight_decay = 0.1f;   // AdamW decoupled decay; SGD L2; only where a parameter decays
  float beta1 = 0.9f;          // AdamW
  float beta2 = 0.95f;         // AdamW
  float eps = 1e-8f;           // AdamW
  float momentum = 0.9f;       // SGD; 0 = plain SGD
  float grad_clip = 1.0f;      // max global gradient norm; 0 = no clipping
  int64_t micro_batch_size = 4;  // sequences per micro-batch (one routing group)
  int64_t grad_accum = 1;        // micro-batches per step on each data-parallel rank
  uint64_t seed = 1234;          // initial weights, data order, routing noise
  int64_t eval_every = 50;       // validation every N steps (and at the end); 0 = off
  int64_t eval_batches = 8;      // validation micro-batches per rank
  int64_t checkpoint_every = 0;  // save every N steps; 0 = only at the end (and on SIGTERM)
  float bucket_mb = 25.0f;     // data-parallel gradient bucket size in MiB (DDP bucket_cap_mb)
  // Sum the micro-batches' gradients in the canonical tree order (engine/dist/ordered_sum.h):
  // with grad_accum a power of two, dp ranks x grad_accum equal one rank with dp x grad_accum
  // micro-batches bit for bit. Costs up to log2(grad_accum) + 1 extra gradient copies and
  // the overlap of the last backward with the gradient sync, and under ZeRO 2-3 the full
  // gradients during the step. false (the default): in place, as other engines do.
  bool ordered_grad_accum = false;
  // Activation recompute (engine/model/recompute.h): none keeps every activation; selective
  // recomputes attention's core (its softmax-weighted values and logsumexp) in backward;
  // full keeps each block's input alone and re-runs the block's forward in backward.
  // Results are bit-identical; memory falls, compute rises (full: one more forward).
  model::Recompute recompute = model::Recompute::kNone;
  // The output head and its loss a chunk of this many tokens (rows) at a time
  // (engine/model/decoder.h, "Head chunking"): only one chunk's logits exist at once, and
  // backward computes each chunk's logits again (one more head forward). 0 (the default):
  // the micro-batch's logits at once, kept as their gradient until backward.
  int64_t head_chunk_tokens = 0;
  // The rows the head computes at once for a micro-batch of `rows` rows on this rank.
  int64_t head_rows(int64_t rows) const {
    return head_chunk_tokens > 0 && head_chunk_tokens < rows ? head_chunk_tokens : rows;
  }
  // What a step whose loss or global gradient norm is not finite (NaN, Inf) does
  // (docs/failures.md): stop saves nothing new and exits with code 3, the last good
  // checkpoint staying the latest; skip leaves the weights and the optimizer as they
  // were (the step's data is consumed), counts the step in metrics.jsonl, and stops as
  // stop does after max_nonfinite_skips such steps in a row.
  NonFiniteAction on_nonfinite = NonFiniteAction::kStop;
  int64_t max_nonfinite_skips = 10;  // with on_nonfinite=skip: skipped steps in a row allowed
  // The collective watchdog (engine/dist/watchdog.h): a rank whose collective has not
  // completed after this many seconds names it, its group and the ranks that have not
  // arrived, and exits with status 4. Generous by default, as NCCL's (30 min); 0 = off.
  double collective_timeout_s = 1800;

  // Names the key and the value it rejects ("train.beta2=1 must be in [0, 1)").
  Status Validate() const;
  // min_lr with -1 resolved to 0.1 * lr.
  float resolved_min_lr() const { return min_lr == -1.0f ? 0.1f * lr : min_lr; }
  int64_t bucket_bytes() const;
};

}  // namespace switchyard::config
